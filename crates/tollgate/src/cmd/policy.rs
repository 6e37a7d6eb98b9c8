//! `tollgate policy check`: load a Cedar policy set exactly as the daemon would, without
//! starting anything, and print every finding. `tollgate policy reload`: ask a running
//! daemon to reload its `[policy]` set (over its socket, sealed with an organization's
//! operator secret, like `tollgate hitl`; SIGHUP does the same).
//!
//! All loading and validation lives in `tollgate-policy`; this module reads the files
//! (bounded), prints the findings (`file:line:col: error[code]: message`, then a help line)
//! and picks the exit code: 0 when the set loads (warnings allowed), 1 when it is refused,
//! 2 when a file cannot be read.
//!
//! `--tools FILE` (MCP tool definitions as JSON) and `--mcp mcp.toml` (the gateway's
//! upstreams, started, listed and stopped: `tollgate_mcp::policy_check`) also check the
//! policies against the tools' own input schemas (`tollgate_policy::derive`): an unknown
//! tool, an unknown argument or a type mismatch is an error, a policy that can never
//! match a warning. A tools file that cannot be used, or an upstream that cannot be
//! listed, is exit 2.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tollgate_policy::{derive, DefaultEffect, Options, Severity, Source};

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
    /// Replay a recorded audit log under a candidate configuration and policy set: print
    /// the verdicts that would flip (exit 1), or exit 0 when none would; 3 when some
    /// verdicts could not be replayed, 2 for a broken log or bad input.
    Replay(crate::cmd::replay::Args),
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
    /// What happens to calls that no permit matches (part of the set's digest; default
    /// allow, or with `--mcp` and no files, `[policy]`'s).
    #[arg(long, value_enum)]
    default: Option<Default>,
    /// MCP tool definitions (JSON: the `tools` array of a tools/list result, or an object
    /// with one): check the policies against the tools' input schemas. Repeatable.
    #[arg(long, value_name = "FILE.json")]
    tools: Vec<PathBuf>,
    /// The MCP gateway's configuration: start its upstreams, list their tools, and check
    /// the policies (the files given, or else its `[policy]`) against them.
    #[arg(long, value_name = "mcp.toml")]
    mcp: Option<PathBuf>,
    /// Policy files (Cedar); optional with `--mcp` when mcp.toml has `[policy]`.
    #[arg(required_unless_present = "mcp", value_name = "FILE.cedar")]
    files: Vec<PathBuf>,
}

fn effect(d: Default) -> DefaultEffect {
    match d {
        Default::Allow => DefaultEffect::Allow,
        Default::Deny => DefaultEffect::Deny,
    }
}

/// A tools file, read bounded (at most [`derive::MAX_TOOLS_BYTES`] + 1 bytes, so the
/// parser reports one too large) and parsed; every refusal names the file.
fn read_tools(path: &Path) -> Result<Vec<derive::ToolDef>, String> {
    use std::io::Read as _;
    let limit = u64::try_from(derive::MAX_TOOLS_BYTES).unwrap_or(u64::MAX);
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limit.saturating_add(1)).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| format!("`{}` is not UTF-8 text: {e}", path.display()))?;
    derive::parse_tools(&Source::new(path.display().to_string(), text)).map_err(|f| f.to_string())
}

/// Run `tollgate policy ...`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        PolicyCommand::Check(a) => check(a),
        PolicyCommand::Reload { conn } => reload(conn),
        PolicyCommand::Replay(a) => Ok(crate::cmd::replay::run(a)),
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
    let mut tools = Vec::new();
    for path in &args.tools {
        match read_tools(path) {
            Ok(t) => tools.extend(t),
            Err(e) => {
                errln!("tollgate: {e}");
                return Ok(ExitCode::from(2));
            }
        }
    }
    if let Some(config) = &args.mcp {
        let outcome = tollgate_mcp::policy_check::run(&tollgate_mcp::policy_check::Request {
            config: config.clone(),
            files: args.files.clone(),
            default: args.default.map(effect),
            schema: args.schema.clone(),
            extra_tools: tools,
        });
        out!("{}", outcome.stdout);
        if !outcome.stderr.is_empty() {
            errln!("{}", outcome.stderr.trim_end());
        }
        return Ok(ExitCode::from(outcome.code));
    }
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
        default: args.default.map(effect).unwrap_or_default(),
        schema,
    };
    if !args.tools.is_empty() {
        let report = derive::check(&sources, &options, &tools);
        let names: Vec<String> = args.tools.iter().map(|p| p.display().to_string()).collect();
        let (text, code) = derive::render(&report, &names.join(", "));
        out!("{text}");
        return Ok(ExitCode::from(code));
    }
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
