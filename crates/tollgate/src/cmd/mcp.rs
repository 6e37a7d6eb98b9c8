//! `tollgate mcp`: the MCP gateway (crate `tollgate-mcp`). Speaks MCP to the host on stdin
//! and stdout; every `tools/call` is decided by Tollgate before it reaches an upstream.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `tollgate mcp`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The gateway's configuration (mcp.toml; see docs/mcp.md).
    #[arg(long)]
    pub config: PathBuf,
    /// Check the configuration, start every upstream and list what it offers, then exit
    /// (0: every upstream answered; 1: one did not).
    #[arg(long)]
    pub check: bool,
}

/// Run the gateway until the host hangs up (or, with `gateway.listen`, until SIGTERM).
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let code = tollgate_mcp::main_entry(&args.config, args.check)?;
    Ok(ExitCode::from(code))
}
