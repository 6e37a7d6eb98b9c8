//! The `tollgate` command. A thin main: each subcommand lives in its own module under
//! `cmd/` and returns the process exit code.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Verify, export and inspect signed audit logs.
    Audit(cmd::audit::Args),
    /// The board gate: check handoff-envelope record sets, compute request digests.
    Board(cmd::board::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Conformance(args) => cmd::conformance::run(&args),
        Command::Canonical(args) => cmd::canonical::run(&args),
        Command::Keygen(args) => cmd::keygen::run(&args),
        Command::Audit(args) => cmd::audit::run(&args),
        Command::Board(args) => cmd::board::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tollgate: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
