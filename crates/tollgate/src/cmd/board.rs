//! `tollgate board check` and `tollgate board digest`: the board gate over files.
//!
//! All rules live in `tollgate-board`; this module only reads files, formats findings and
//! picks the exit code: 0 when every file is clean, 1 when any violation was found, 2 when a
//! path (or the catalog) could not be read. An unreadable record set does not stop the run:
//! later files are still checked, and 2 wins over 1.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use tollgate_board::{Catalog, Finding};
use tollgate_core::json::{self, Value};

/// Arguments of `tollgate board`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: BoardCommand,
}

#[derive(Debug, clap::Subcommand)]
enum BoardCommand {
    /// Check record sets (`{"messages": [...]}`) and print one line per violation:
    /// `RULE-ID<TAB>path<TAB>task_id or -<TAB>message`.
    Check(CheckArgs),
    /// Print the `sha256:...` request digest of one envelope.
    Digest(DigestArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// Tab-separated lines.
    Text,
    /// One JSON object.
    Json,
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// A JSON array of {"id", "execution_tier"} replacing the built-in agent catalog.
    #[arg(long, value_name = "FILE")]
    catalog: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Record-set files.
    #[arg(required = true, value_name = "RECORD_SET.json")]
    files: Vec<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct DigestArgs {
    /// One envelope (a JSON object).
    #[arg(value_name = "ENVELOPE.json")]
    file: PathBuf,
}

/// Run `tollgate board ...`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        BoardCommand::Check(a) => check(a),
        BoardCommand::Digest(a) => digest(a),
    }
}

/// Read at most `limit + 1` bytes: enough for the library to see that an oversized file is
/// over its bound (and say so as HO-SCHEMA), without ever holding more than that in memory.
fn read_bounded(path: &std::path::Path, limit: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut out = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    std::fs::File::open(path)?.take(cap).read_to_end(&mut out)?;
    Ok(out)
}

struct Line {
    path: String,
    finding: Finding,
}

fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let catalog = match &args.catalog {
        None => Catalog::default(),
        Some(p) => {
            let bytes = read_bounded(p, tollgate_board::catalog::MAX_CATALOG_BYTES)
                .with_context(|| format!("cannot read catalog `{}`", p.display()))?;
            Catalog::from_json(&bytes)
                .with_context(|| format!("catalog `{}` is not usable", p.display()))?
        }
    };
    let mut lines = Vec::new();
    let mut unreadable = Vec::new();
    for path in &args.files {
        let shown = path.display().to_string();
        match read_bounded(path, tollgate_board::Limits::default().max_bytes) {
            Ok(bytes) => {
                let report = tollgate_board::check(&bytes, &catalog);
                lines.extend(report.findings.into_iter().map(|finding| Line {
                    path: shown.clone(),
                    finding,
                }));
            }
            Err(e) => {
                errln!("tollgate: cannot read `{shown}`: {e}");
                unreadable.push((shown, e.to_string()));
            }
        }
    }
    lines.sort_by(|a, b| {
        (
            &a.path,
            a.finding.rule.as_str(),
            &a.finding.task_id,
            &a.finding.message,
        )
            .cmp(&(
                &b.path,
                b.finding.rule.as_str(),
                &b.finding.task_id,
                &b.finding.message,
            ))
    });
    let code: u8 = if !unreadable.is_empty() {
        2
    } else if !lines.is_empty() {
        1
    } else {
        0
    };
    match args.format {
        Format::Text => {
            for l in &lines {
                outln!(
                    "{}\t{}\t{}\t{}",
                    l.finding.rule,
                    one_field(&l.path),
                    l.finding
                        .task_id
                        .as_deref()
                        .map_or("-".to_owned(), one_field),
                    one_field(&l.finding.message)
                );
            }
        }
        Format::Json => {
            let findings = lines
                .iter()
                .map(|l| {
                    object([
                        ("rule", Value::from(l.finding.rule.as_str())),
                        ("path", Value::from(l.path.as_str())),
                        (
                            "task_id",
                            l.finding
                                .task_id
                                .as_deref()
                                .map_or(Value::Null, Value::from),
                        ),
                        ("message", Value::from(l.finding.message.as_str())),
                    ])
                })
                .collect();
            let errors = unreadable
                .iter()
                .map(|(p, e)| {
                    object([
                        ("path", Value::from(p.as_str())),
                        ("error", Value::from(e.as_str())),
                    ])
                })
                .collect();
            let doc = object([
                ("findings", Value::Array(findings)),
                ("unreadable", Value::Array(errors)),
                ("exit_code", Value::from(i64::from(code))),
            ]);
            let bytes = json::to_canonical_vec(&doc)
                .map_err(|_| anyhow::anyhow!("internal: output is not canonicalizable"))?;
            outln!("{}", String::from_utf8_lossy(&bytes));
        }
    }
    Ok(ExitCode::from(code))
}

fn object<const N: usize>(fields: [(&str, Value); N]) -> Value {
    Value::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// Keep one finding on one line with exactly four tab-separated fields: control characters
/// (tab and newline included) in paths, task ids and messages are escaped.
fn one_field(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn digest(args: &DigestArgs) -> anyhow::Result<ExitCode> {
    let bytes = read_bounded(&args.file, tollgate_board::Limits::default().max_bytes)
        .with_context(|| format!("cannot read `{}`", args.file.display()))?;
    let d = tollgate_board::digest(&bytes)
        .with_context(|| format!("cannot digest `{}`", args.file.display()))?;
    outln!("{d}");
    Ok(ExitCode::SUCCESS)
}
