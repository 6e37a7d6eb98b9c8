//! `tollgate audit ...`: verify, checkpoint, export, rotate-key.
//!
//! Exit codes: 0 the log is whole, 1 a break was found (a corrupt `.zst` archive is a
//! break), 2 usage or I/O error.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use tollgate_audit::export::{self, Filter};
use tollgate_audit::{
    files, keys, Checkpoint, FsyncPolicy, PathsError, SigningKey, VerifyOptions, VerifyingKey,
    Writer, WriterConfig,
};
use tollgate_core::Verdict;

/// Arguments of `tollgate audit`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Sub,
}

#[derive(Debug, clap::Subcommand)]
enum Sub {
    /// Check every signature and link; print the first break. Exit 0 only when whole.
    Verify(VerifyArgs),
    /// Print the latest signed checkpoint of a log directory.
    Checkpoint(CheckpointArgs),
    /// Export verified entries as JSON Lines or CSV.
    Export(ExportArgs),
    /// Hand the log over to a new signing key (the daemon must not be running).
    RotateKey(RotateKeyArgs),
    /// Test helper: append generated entries to a log.
    #[command(hide = true)]
    DemoWrite(DemoWriteArgs),
}

#[derive(Debug, clap::Args)]
struct VerifyArgs {
    /// The public key the log must be signed with (without it, the key in the first file
    /// header is trusted, and the output says so).
    #[arg(long)]
    key: Option<PathBuf>,
    /// A checkpoint saved earlier: the log must reach it and agree with it.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Accept a log whose first files were retired (it does not start at file 0).
    #[arg(long)]
    allow_head_gap: bool,
    #[command(flatten)]
    pg: PgArgs,
    /// Log files, or directories of rotated files.
    #[arg(required_unless_present = "postgres", conflicts_with = "postgres")]
    paths: Vec<PathBuf>,
}

/// Where chains in PostgreSQL are read (instead of log files).
#[derive(Debug, Clone, clap::Args)]
struct PgArgs {
    /// Read the chains from this PostgreSQL database (a URL or key=value string)
    /// instead of log files. `--key` then names the key the chains must be signed with;
    /// without it, each chain's key registered in the database is trusted.
    #[arg(long, value_name = "URL", conflicts_with_all = ["checkpoint", "allow_head_gap"])]
    postgres: Option<String>,
    /// The schema holding the chains.
    #[arg(long, requires = "postgres", default_value = tollgate_pg::DEFAULT_SCHEMA)]
    schema: String,
    /// Only this chain (default: every chain in the schema).
    #[arg(long, requires = "postgres")]
    chain: Option<String>,
    /// PEM file of the CA that signed the server's certificate (TLS; use `sslmode=require`
    /// in the URL to refuse a plain connection).
    #[arg(long, value_name = "FILE", requires = "postgres")]
    ca: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct CheckpointArgs {
    /// Check the checkpoint's signature with this public key.
    #[arg(long)]
    key: Option<PathBuf>,
    /// A log directory (or a checkpoint file).
    path: PathBuf,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Format {
    Jsonl,
    Csv,
}

#[derive(Debug, clap::Args)]
struct ExportArgs {
    /// Output format.
    #[arg(long, value_enum)]
    format: Format,
    /// Only this session.
    #[arg(long)]
    session: Option<String>,
    /// Only entries at or after this time (RFC 3339 UTC, YYYY-MM-DD, or ns since epoch).
    #[arg(long)]
    since: Option<String>,
    /// Only entries before this time.
    #[arg(long)]
    until: Option<String>,
    /// Only this verdict (ALLOW, DENY or HITL).
    #[arg(long)]
    verdict: Option<String>,
    /// The public key the log must be signed with.
    #[arg(long)]
    key: Option<PathBuf>,
    /// A checkpoint the log must agree with.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Accept a log whose first files were retired.
    #[arg(long)]
    allow_head_gap: bool,
    #[command(flatten)]
    pg: PgArgs,
    /// Log files, or directories of rotated files.
    #[arg(required_unless_present = "postgres", conflicts_with = "postgres")]
    paths: Vec<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct RotateKeyArgs {
    /// The log directory.
    #[arg(long)]
    dir: PathBuf,
    /// The current signing key.
    #[arg(long)]
    key: PathBuf,
    /// The new signing key.
    #[arg(long)]
    new_key: PathBuf,
}

#[derive(Debug, clap::Args)]
struct DemoWriteArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    key: PathBuf,
    /// Entries to append (ignored with --forever).
    #[arg(long, default_value_t = 10)]
    count: u64,
    /// Append until killed.
    #[arg(long)]
    forever: bool,
    #[arg(long, default_value = "batch")]
    fsync: String,
    #[arg(long)]
    rotate_bytes: Option<u64>,
    /// Submit this many entries before waiting for them (large batches, large writes).
    #[arg(long, default_value_t = 1)]
    pipeline: u64,
    /// Timestamp of the first entry (ns); entries are 1 ms apart.
    #[arg(long, default_value_t = 1_796_040_000_000_000_000)]
    start_ns: i64,
}

/// Run `tollgate audit`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        Sub::Verify(a) => verify(a),
        Sub::Checkpoint(a) => checkpoint(a),
        Sub::Export(a) => export(a),
        Sub::RotateKey(a) => rotate_key(a),
        Sub::DemoWrite(a) => demo_write(a),
    }
}

fn read_public_key(path: &Path) -> anyhow::Result<VerifyingKey> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read key `{}`", path.display()))?;
    keys::parse_public_key(&text).with_context(|| format!("`{}`", path.display()))
}

fn read_secret_key(path: &Path) -> anyhow::Result<SigningKey> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read key `{}`", path.display()))?;
    keys::parse_secret_key(&text).with_context(|| format!("`{}`", path.display()))
}

fn options(
    key: Option<&PathBuf>,
    checkpoint: Option<&PathBuf>,
    allow_head_gap: bool,
) -> anyhow::Result<VerifyOptions> {
    Ok(VerifyOptions {
        trusted_key: key.map(|k| read_public_key(k)).transpose()?,
        checkpoint: checkpoint
            .map(|c| tollgate_audit::read_checkpoint(c))
            .transpose()?,
        allow_head_gap,
        check_signatures: true,
        // `audit verify` checks every signature, checkpoint or not.
        anchor_on_checkpoint: false,
    })
}

fn verify(a: &VerifyArgs) -> anyhow::Result<ExitCode> {
    if let Some(url) = &a.pg.postgres {
        return verify_pg(url, &a.pg, a.key.as_ref());
    }
    let opts = options(a.key.as_ref(), a.checkpoint.as_ref(), a.allow_head_gap)?;
    match tollgate_audit::verify_paths(&a.paths, &opts, &mut |_| {}) {
        Ok(s) => {
            let trust = if s.key_trusted {
                "trusted"
            } else {
                "NOT CHECKED: no --key given, the key in the log was taken on trust"
            };
            outln!(
                "ok: {} entries (index {}..{}) in {} file(s), whole",
                s.entries,
                s.first_index,
                s.next_index,
                s.files
            );
            outln!("key: {} ({trust})", s.key_id);
            outln!("last hash: {}", s.last_hash);
            if opts.checkpoint.is_some() {
                outln!("checkpoint: matched");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(PathsError::Break(b)) => {
            outln!("BROKEN: {b}");
            Ok(ExitCode::from(1))
        }
        Err(e @ PathsError::Io { .. }) => Err(e.into()),
    }
}

fn checkpoint(a: &CheckpointArgs) -> anyhow::Result<ExitCode> {
    let cp: Checkpoint = tollgate_audit::read_checkpoint(&a.path)?;
    if let Some(k) = &a.key {
        let key = read_public_key(k)?;
        if !cp.verify_with(&key) {
            outln!("BROKEN: checkpoint signature does not verify with the given key");
            return Ok(ExitCode::from(1));
        }
    }
    out!("{}", cp.to_text());
    Ok(ExitCode::SUCCESS)
}

fn export(a: &ExportArgs) -> anyhow::Result<ExitCode> {
    let time = |t: &Option<String>, what: &str| -> anyhow::Result<Option<i64>> {
        t.as_ref()
            .map(|s| {
                files::parse_time(s).with_context(|| {
                    format!("--{what} `{s}` is not a time (RFC 3339 UTC, YYYY-MM-DD or ns)")
                })
            })
            .transpose()
    };
    let filter = Filter {
        session: a.session.clone(),
        since_ns: time(&a.since, "since")?,
        until_ns: time(&a.until, "until")?,
        verdict: a
            .verdict
            .as_ref()
            .map(|v| v.parse::<Verdict>())
            .transpose()?,
    };
    let mut rows = Vec::new();
    let mut row = |chain: Option<&str>, e: &tollgate_audit::AuditEntry| {
        if filter.matches(e) {
            rows.push(match a.format {
                Format::Jsonl => export::to_json_line(e, chain),
                Format::Csv => export::to_csv_row(e, chain),
            });
        }
    };
    if let Some(url) = &a.pg.postgres {
        let key = a.key.as_ref().map(|k| read_public_key(k)).transpose()?;
        let reports = pg_reports(url, &a.pg, key, &mut |chain, e| row(Some(chain), e))?;
        if key.is_none() {
            errln!("tollgate: warning: no --key given; each chain's registered key was trusted");
        }
        if let Some(b) = reports.iter().find_map(|r| r.result.as_ref().err()) {
            errln!("BROKEN: {b}; nothing exported");
            return Ok(ExitCode::from(1));
        }
        return write_rows(a.format, rows);
    }
    let opts = options(a.key.as_ref(), a.checkpoint.as_ref(), a.allow_head_gap)?;
    let r = tollgate_audit::verify_paths(&a.paths, &opts, &mut |e| row(None, e));
    match r {
        Ok(s) => {
            if !s.key_trusted {
                errln!("tollgate: warning: no --key given; the log's own key was trusted");
            }
        }
        Err(PathsError::Break(b)) => {
            errln!("BROKEN: {b}; nothing exported");
            return Ok(ExitCode::from(1));
        }
        Err(e @ PathsError::Io { .. }) => return Err(e.into()),
    }
    write_rows(a.format, rows)
}

fn write_rows(format: Format, rows: Vec<String>) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if matches!(format, Format::Csv) {
        writeln!(out, "{}", export::csv_header())?;
    }
    for row in rows {
        writeln!(out, "{row}")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// A runtime for one command's PostgreSQL calls.
pub(crate) fn pg_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub(crate) fn pg_settings(
    url: &str,
    schema: &str,
    ca: Option<&PathBuf>,
) -> tollgate_pg::PgSettings {
    let mut s = tollgate_pg::PgSettings::new(url).with_schema(schema);
    s.ca_file = ca.cloned();
    s
}

/// Verify the chains `pg` names, showing each verified entry (with its chain id) to
/// `visit`. No chain at all is an error (nothing was verified).
fn pg_reports(
    url: &str,
    pg: &PgArgs,
    key: Option<VerifyingKey>,
    visit: &mut dyn FnMut(&str, &tollgate_audit::AuditEntry),
) -> anyhow::Result<Vec<tollgate_pg::ChainReport>> {
    let settings = pg_settings(url, &pg.schema, pg.ca.as_ref());
    let keys: Vec<VerifyingKey> = key.into_iter().collect();
    let reports = pg_runtime()?.block_on(async {
        let client = tollgate_pg::connect(&settings).await?;
        tollgate_pg::verify(&client, &pg.schema, pg.chain.as_deref(), &keys, visit).await
    })?;
    if reports.is_empty() {
        anyhow::bail!("no chains in schema `{}`: nothing to verify", pg.schema);
    }
    Ok(reports)
}

fn verify_pg(url: &str, pg: &PgArgs, key: Option<&PathBuf>) -> anyhow::Result<ExitCode> {
    let key = key.map(|k| read_public_key(k)).transpose()?;
    let reports = pg_reports(url, pg, key, &mut |_, _| {})?;
    let trust = if key.is_some() {
        "trusted"
    } else {
        "NOT CHECKED: no --key given, the key registered for the chain was taken on trust"
    };
    let mut broken = false;
    for r in &reports {
        match &r.result {
            Ok(s) => {
                outln!(
                    "chain {}: ok: {} entries (index {}..{}), whole",
                    r.chain_id,
                    s.entries,
                    s.first_index,
                    s.next_index
                );
                outln!("  key: {} ({trust})", s.key_id);
                outln!("  last hash: {}", s.last_hash);
            }
            Err(b) => {
                broken = true;
                outln!("BROKEN: {b}");
            }
        }
    }
    Ok(if broken {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn rotate_key(a: &RotateKeyArgs) -> anyhow::Result<ExitCode> {
    let old = read_secret_key(&a.key)?;
    let new = read_secret_key(&a.new_key)?;
    let new_id = keys::key_id(&new.verifying_key());
    let (w, report) = Writer::open(WriterConfig::new(&a.dir), old)?;
    report_recovery(&report);
    let h = w.rotate_key(new).wait()?;
    w.shutdown()?;
    outln!(
        "hand-over entry {} names key {new_id}; the log is now signed by it",
        h.index
    );
    Ok(ExitCode::SUCCESS)
}

fn report_recovery(report: &tollgate_audit::OpenReport) {
    if let Some(v) = report.upgraded_from {
        errln!(
            "tollgate: the log's last file is format version {v}; continuing in a new version-{} file `{}`",
            tollgate_audit::format::FORMAT_VERSION,
            report.file.display()
        );
    }
    if let Some(r) = &report.recovered {
        errln!(
            "tollgate: recovered a torn tail: {} bytes at offset {} of `{}` moved to `{}` (recorded as entry {})",
            r.length,
            r.offset,
            r.file.display(),
            r.moved_to.display(),
            r.entry_index
        );
    }
}

fn demo_write(a: &DemoWriteArgs) -> anyhow::Result<ExitCode> {
    use tollgate_core::{DenyReason, Money, Reason};
    let key = read_secret_key(&a.key)?;
    let mut cfg = WriterConfig::new(&a.dir);
    cfg.fsync = a.fsync.parse::<FsyncPolicy>().map_err(anyhow::Error::msg)?;
    if let Some(b) = a.rotate_bytes {
        cfg.rotate_bytes = b;
    }
    cfg.rotate_daily = false;
    let (w, report) = Writer::open(cfg, key)?;
    report_recovery(&report);
    let start = report.next_index;
    let mut i = start;
    let mut pending = Vec::new();
    loop {
        if !a.forever && i >= start.saturating_add(a.count) {
            break;
        }
        let deny = i % 4 == 3;
        let offset = i64::try_from(i)
            .unwrap_or(i64::MAX)
            .saturating_mul(1_000_000);
        let rec = tollgate_audit::VerdictRecord {
            timestamp_ns: a.start_ns.saturating_add(offset),
            session_id: format!("s{}", i % 3),
            agent_id: "demo-agent".into(),
            organization_id: "demo-org".into(),
            call_number: i,
            tool_name: if deny {
                "send_email".into()
            } else {
                "search".into()
            },
            params_hash: tollgate_audit::format::sha256(&i.to_be_bytes()),
            verdict: if deny { Verdict::Deny } else { Verdict::Allow },
            deny_reason: deny.then_some(DenyReason::MaxRepeatExceeded),
            reason: if deny {
                Reason::MaxRepeatExceeded
            } else {
                Reason::WithinThresholds
            },
            probabilistic: false,
            budget_before: Money(1_000_000_000),
            budget_after: Money(999_000_000),
            operator_id: None,
            estimated_cost: Money(1_000_000),
            nonce: i,
            config_digest: None,
            // Each demo session's version: s0, s1, s2 take turns.
            session_seq: i / 3 + 1,
            budget_version: 0,
            policy: None,
            shadow: Vec::new(),
            params: None,
            upstream: None,
            draw: None,
        };
        pending.push(w.submit(rec));
        if pending.len() as u64 >= a.pipeline.max(1) {
            for p in pending.drain(..) {
                p.wait()?;
            }
        }
        i = i.saturating_add(1);
    }
    for p in pending.drain(..) {
        p.wait()?;
    }
    w.shutdown()?;
    outln!(
        "appended {} entries; next index {i}",
        i.saturating_sub(start)
    );
    Ok(ExitCode::SUCCESS)
}
