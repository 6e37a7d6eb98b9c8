//! `tollgate policy check`: load a Cedar policy set exactly as the daemon would, without
//! starting anything, and print every finding. `tollgate policy reload`: ask a running
//! daemon to reload its `[policy]` set (over its socket, sealed with an organization's
//! operator secret, like `tollgate hitl`; SIGHUP does the same).
//!
//! All loading and validation lives in `tollgate-policy`; this module reads the files
//! (bounded), prints the findings (`file:line:col: error[code]: message`, then a help line)
//! and picks the exit code: 0 when the set loads (warnings allowed), 1 when it is refused,
//! 2 when a file cannot be read.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tollgate_policy::{DefaultEffect, Options, Severity, Source};

/// Arguments of `tollgate policy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Debug, clap::Subcommand)]
enum PolicyCommand {
    /// Parse and validate policy files; print each finding and, when the set loads, its
    /// size and digest.
    Check(CheckArgs),
    /// Ask the running daemon to read its `[policy]` files again (as SIGHUP does): the
    /// new set decides every session's next call; a set that does not load is refused
    /// and the one in force stays. Prints the digest now in force.
    Reload {
        #[command(flatten)]
        conn: crate::cmd::hitl::Conn,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Default {
    /// Calls no permit matches are left to the guards.
    Allow,
    /// Calls no permit matches are refused.
    Deny,
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// A Cedar schema declaring each tool's arguments (`.json` for Cedar's JSON form).
    #[arg(long, value_name = "FILE")]
    schema: Option<PathBuf>,
    /// What happens to calls that no permit matches (part of the set's digest).
    #[arg(long, value_enum, default_value_t = Default::Allow)]
    default: Default,
    /// Policy files (Cedar).
    #[arg(required = true, value_name = "FILE.cedar")]
    files: Vec<PathBuf>,
}

/// Run `tollgate policy ...`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        PolicyCommand::Check(a) => check(a),
        PolicyCommand::Reload { conn } => reload(conn),
    }
}

fn reload(conn: &crate::cmd::hitl::Conn) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = crate::cmd::hitl::connect(conn).await?;
        match client.policy_reload().await {
            Ok(r) => {
                outln!("reloaded: {} policies, digest {}", r.policies, r.digest);
                Ok(ExitCode::SUCCESS)
            }
            Err(tollgate_client::ClientError::Refused { message, .. }) => {
                errln!("tollgate: reload refused, the set in force stays:\n{message}");
                Ok(ExitCode::from(1))
            }
            Err(e) => Err(e.into()),
        }
    })
}

/// A file's text as a [`Source`], read as the daemon reads its `[policy]` files
/// ([`tollgate_daemon::policy::read_source`]: bounded, UTF-8).
pub fn read_source(path: &Path) -> anyhow::Result<Source> {
    tollgate_daemon::policy::read_source(path).map_err(|e| anyhow::anyhow!(e))
}

fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let mut unreadable = false;
    let mut sources = Vec::new();
    for path in &args.files {
        match read_source(path) {
            Ok(s) => sources.push(s),
            Err(e) => {
                errln!("tollgate: {e}");
                unreadable = true;
            }
        }
    }
    let schema = match &args.schema {
        None => None,
        Some(p) => match read_source(p) {
            Ok(s) => Some(s),
            Err(e) => {
                errln!("tollgate: {e}");
                unreadable = true;
                None
            }
        },
    };
    if unreadable {
        return Ok(ExitCode::from(2));
    }
    let options = Options {
        default: match args.default {
            Default::Allow => DefaultEffect::Allow,
            Default::Deny => DefaultEffect::Deny,
        },
        schema,
    };
    match tollgate_policy::load(&sources, &options) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                outln!("{w}");
            }
            outln!(
                "ok: {} policies, {} warnings, default {}, digest {}",
                loaded.policies.len(),
                loaded.warnings.len(),
                loaded.policies.default_effect().as_str(),
                loaded.policies.digest()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            for f in &e.findings {
                outln!("{f}");
            }
            let errors = e
                .findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .count();
            outln!(
                "refused: {errors} errors, {} warnings",
                e.findings.len() - errors
            );
            Ok(ExitCode::from(1))
        }
    }
}
