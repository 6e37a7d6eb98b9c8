//! The `tollgate` command. A thin main: each subcommand lives in its own module under
//! `cmd/` and returns the process exit code.

// Every command prints through `out` (a closed pipe must not panic): no print macros.
#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[macro_use]
mod out;
mod cmd;

/// Tollgate: decides, before an AI agent runs a tool, whether it may.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run SP/1.0 decision vectors (the published format) and report each result.
    Conformance(cmd::conformance::Args),
    /// Print the canonical JSON of a document, or with --hash its SHA-256.
    Canonical(cmd::canonical::Args),
    /// Write an Ed25519 audit signing key (mode 0600) and its public key.
    Keygen(cmd::keygen::Args),
    /// Verify, export and inspect signed audit logs (files, or chains in PostgreSQL).
    Audit(cmd::audit::Args),
    /// Create or migrate the PostgreSQL audit schema (idempotent).
    Migrate(cmd::migrate::Args),
    /// The board gate: check handoff-envelope record sets, compute request digests.
    Board(cmd::board::Args),
    /// Run the daemon (embedded defaults without --config).
    Serve(cmd::serve::Args),
    /// Resolve pending human (HITL) decisions over the daemon's socket.
    #[command(subcommand)]
    Hitl(cmd::hitl::Args),
    /// Start a daemon on a temporary socket, run SP/1.0 Appendix A, verify the audit log.
    Demo(cmd::demo::Args),
    /// Load generator: throughput and latency percentiles of pre_exec round trips.
    Bench(cmd::bench::Args),
    /// Soak benchmark: open sessions over time (closed by their agents or ended idle), at
    /// most a bound live, and report the daemon's memory and snapshot size as it goes.
    Soak(cmd::soak::Args),
    /// Make a test CA, a server certificate and client certificates for gRPC with mutual
    /// TLS, and the configuration that trusts them.
    Certs(cmd::certs::Args),
    /// Print a fresh control-plane operator token and its `[[operator]]` entry.
    OperatorToken(cmd::operator_token::Args),
    /// The MCP gateway: serve an MCP host on stdio, deciding every tools/call with
    /// Tollgate before forwarding it to the upstream MCP servers.
    Mcp(cmd::mcp::Args),
    /// Cedar policies on tools and arguments: check a policy set without starting anything.
    Policy(cmd::policy::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs go to standard error; RUST_LOG (default `info` for serve, `warn` otherwise).
    let default = match cli.command {
        Command::Serve(_) => "info",
        // rmcp's transport worker logs its own failures with Rust type names; the gateway
        // reports each upstream failure itself, in words (docs/mcp.md §7).
        Command::Mcp(_) => "warn,rmcp::transport::worker=off",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only for a person at a terminal: a host's log file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    let result = match cli.command {
        Command::Conformance(args) => cmd::conformance::run(&args),
        Command::Canonical(args) => cmd::canonical::run(&args),
        Command::Keygen(args) => cmd::keygen::run(&args),
        Command::OperatorToken(args) => cmd::operator_token::run(&args),
        Command::Audit(args) => cmd::audit::run(&args),
        Command::Migrate(args) => cmd::migrate::run(&args),
        Command::Board(args) => cmd::board::run(&args),
        Command::Serve(args) => cmd::serve::run(&args),
        Command::Hitl(args) => cmd::hitl::run(&args),
        Command::Demo(args) => cmd::demo::run(&args),
        Command::Bench(args) => cmd::bench::run(&args),
        Command::Soak(args) => cmd::soak::run(&args),
        Command::Certs(args) => cmd::certs::run(&args),
        Command::Mcp(args) => cmd::mcp::run(&args),
        Command::Policy(args) => cmd::policy::run(&args),
    };
    match result {
        Ok(code) => code,
        // A closed standard output ends a command quietly (see `out`).
        Err(e) if out::is_closed_pipe(&e) => ExitCode::from(out::CLOSED_PIPE_STATUS),
        Err(e) => {
            errln!("tollgate: error: {}", describe(&e));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes, `a: b: c`, each said once: the library errors already end
/// their message with their cause's, which anyhow's `{:#}` would repeat.
fn describe(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.ends_with(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}
