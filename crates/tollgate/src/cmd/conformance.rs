//! `tollgate conformance FILE...`

use std::process::ExitCode;

/// Arguments of `tollgate conformance`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Vector files in the published SP/1.0 format.
    #[arg(required = true)]
    pub files: Vec<std::path::PathBuf>,
}

/// Run the vectors.
pub fn run(_args: &Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not implemented yet")
}
