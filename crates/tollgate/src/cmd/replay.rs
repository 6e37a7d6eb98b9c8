//! `tollgate policy replay --config CANDIDATE.toml [--policy FILE]... [--key PUB] AUDIT...`
//! (or `--mcp mcp.toml`, a library-mode gateway's settings; `--postgres URL` for a
//! fleet's chains): what a candidate guard configuration and policy set would have decided
//! for every call a recorded audit log holds.
//!
//! The log is verified as `tollgate audit verify` verifies it (the audit crate's
//! verifier, streaming: every entry is replayed only once it passed every check) and folded
//! as the store folds it; a log that does not verify or does not fold is refused, and no
//! replay result is printed. The replay itself is `tollgate_store::replay` (the candidate's
//! sessions decided by `tollgate_store::rules::decide`, the daemon's one decision path).
//!
//! A fleet's chains in PostgreSQL (`--postgres`) are each verified whole first (one broken
//! chain refuses them all), then merged into the order each session's places and each
//! shared budget's versions give (`tollgate_store::replay::merge`) and folded.
//!
//! Output: the verdicts that flip (ALLOW→DENY, DENY→ALLOW, anything→HITL, ...), counted
//! by rule and by session, with the first `--examples` in full; apart from flips, the
//! verdicts whose reason alone changed; the entries that could not be replayed, by
//! cause. `--format json` prints the same as one JSON object.
//!
//! Exit codes: 0 nothing flips and every verdict was replayed; 1 something flips; 2 the log
//! is broken or the input is bad (configuration, policies, key, files); 3 nothing flips but
//! some verdicts could not be replayed.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use tollgate_audit::{files, keys, VerifyingKey};
use tollgate_daemon::config::DaemonConfig;
use tollgate_store::replay::merge::Chain;
use tollgate_store::replay::report::{Change, Report};
use tollgate_store::replay::{Candidate, Refused, Tick};

/// Arguments of `tollgate policy replay`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The candidate configuration (`tollgate serve`'s TOML): its guards (`[guard.*]`) and
    /// its `[policy]` are replayed.
    #[arg(
        long,
        value_name = "CANDIDATE.toml",
        required_unless_present = "mcp",
        conflicts_with = "mcp"
    )]
    config: Option<PathBuf>,
    /// Or the MCP gateway's configuration (library mode): its `[guard]` and `[policy]`
    /// are replayed, each call for the upstream its entry names (what the gateway's own
    /// log replays under).
    #[arg(long, value_name = "mcp.toml")]
    mcp: Option<PathBuf>,
    /// A policy file replacing the configuration's `[policy]` files (repeatable, in set
    /// order; `[policy]`'s default, schema and trip_on_refusal still apply; the files are
    /// replayed enforced even if `[policy]` runs in shadow mode).
    #[arg(long = "policy", value_name = "FILE.cedar")]
    policies: Vec<PathBuf>,
    /// The public key the log must be signed with (without it, the key in the first file
    /// header is trusted, and the output says so). With `--postgres`, repeatable: each
    /// chain must be signed by one of them (each daemon's `audit.pub`); without, each
    /// chain's registered key is trusted.
    #[arg(long, value_name = "PUB")]
    key: Vec<PathBuf>,
    /// How many flips (and how many reason changes) to print in full.
    #[arg(long, value_name = "N", default_value_t = 10)]
    examples: usize,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Read a fleet's chains from this PostgreSQL database (a URL or key=value string)
    /// instead of log files: every chain of the schema, verified, merged and replayed.
    #[arg(long, value_name = "URL")]
    postgres: Option<String>,
    /// The schema holding the chains.
    #[arg(long, requires = "postgres", default_value = tollgate_pg::DEFAULT_SCHEMA)]
    schema: String,
    /// PEM file of the CA that signed the server's certificate (TLS; use `sslmode=require`
    /// in the URL to refuse a plain connection).
    #[arg(long, value_name = "FILE", requires = "postgres")]
    ca: Option<PathBuf>,
    /// Log files, or directories of rotated files, in chain order.
    #[arg(
        required_unless_present = "postgres",
        conflicts_with = "postgres",
        value_name = "AUDIT"
    )]
    paths: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

/// Run `tollgate policy replay`.
pub fn run(args: &Args) -> ExitCode {
    match replay(args) {
        Ok(code) => code,
        Err(e) => {
            errln!("tollgate: {e}");
            ExitCode::from(2)
        }
    }
}

fn candidate(args: &Args) -> Result<Candidate, String> {
    let (candidate, warnings) = match (&args.config, &args.mcp) {
        (_, Some(mcp)) => tollgate_mcp::replay::load(mcp, &args.policies)?,
        (Some(path), None) => {
            let config =
                DaemonConfig::load(path).map_err(|e| format!("`{}`: {e}", path.display()))?;
            Candidate::load(
                config.default_guard.clone(),
                config.agent_guards.clone().into_iter().collect(),
                config.policy.as_ref(),
                &args.policies,
            )?
        }
        (None, None) => return Err("give --config or --mcp".into()),
    };
    for w in warnings {
        errln!("{w}");
    }
    Ok(candidate)
}

fn read_key(path: &PathBuf) -> Result<VerifyingKey, String> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read key `{}`: {e}", path.display()))
        .and_then(|t| keys::parse_public_key(&t).map_err(|e| format!("`{}`: {e}", path.display())))
}

fn replay(args: &Args) -> Result<ExitCode, String> {
    let candidate = candidate(args)?;
    let keys: Vec<VerifyingKey> = args.key.iter().map(read_key).collect::<Result<_, _>>()?;
    let mut progress = Progress::new(std::io::stderr().is_terminal());
    let started = Instant::now();
    let result = match &args.postgres {
        Some(url) => replay_pg(args, url, &keys, candidate, &mut progress)?,
        None => {
            if keys.len() > 1 {
                return Err("one --key for a log's files (several are for --postgres)".into());
            }
            progress.phase("replaying", Unit::Bytes, 0);
            match tollgate_store::replay::replay_paths(
                &args.paths,
                keys.first().copied(),
                candidate,
                args.examples,
                &mut |t| progress.tick(t),
            ) {
                Ok((report, key_trusted)) => {
                    if !key_trusted {
                        errln!("tollgate: warning: no --key given; the log's own key was trusted");
                    }
                    Ok(report)
                }
                Err(e) => Err(e),
            }
        }
    };
    progress.done();
    let report = match result {
        Ok(r) => r,
        Err(Refused::Io(e)) => return Err(e),
        Err(b @ Refused::Broken(_)) => {
            errln!("{b}");
            return Ok(ExitCode::from(2));
        }
    };
    let elapsed = started.elapsed();
    match args.format {
        Format::Text => print_text(&report),
        Format::Json => outln!("{}", report.to_json()),
    }
    errln!(
        "tollgate: verified and replayed {} entries in {:.3} s ({:.0} entries/s)",
        report.entries,
        elapsed.as_secs_f64(),
        report.entries as f64 / elapsed.as_secs_f64().max(1e-9)
    );
    Ok(ExitCode::from(report.exit_code()))
}

/// Every chain of the schema, verified whole (one that breaks refuses them all), then
/// replayed as one fleet's history.
fn replay_pg(
    args: &Args,
    url: &str,
    keys: &[VerifyingKey],
    candidate: Candidate,
    progress: &mut Progress,
) -> Result<Result<Report, Refused>, String> {
    let settings = crate::cmd::audit::pg_settings(url, &args.schema, args.ca.as_ref());
    let mut chains: Vec<Chain> = Vec::new();
    let mut verified = 0u64;
    let reports = crate::cmd::audit::pg_runtime()
        .map_err(|e| e.to_string())?
        .block_on(async {
            let client = tollgate_pg::connect(&settings).await?;
            // The rows are the total the verification counts toward.
            let rows = tollgate_pg::count_entries(&client, &args.schema).await?;
            progress.phase("verifying", Unit::Entries, rows);
            tollgate_pg::verify(&client, &args.schema, None, keys, &mut |chain, e| {
                if chains.last().is_none_or(|c| c.id != chain) {
                    chains.push(Chain {
                        id: chain.to_owned(),
                        entries: Vec::new(),
                    });
                }
                if let Some(c) = chains.last_mut() {
                    c.entries.push((e.index, e.event.clone()));
                }
                verified += 1;
                progress.tick(Tick {
                    entries: verified,
                    done: verified,
                    total: rows,
                });
            })
            .await
        })
        .map_err(|e| e.to_string())?;
    if reports.is_empty() {
        return Err(format!(
            "no chains in schema `{}`: nothing to replay",
            args.schema
        ));
    }
    if keys.is_empty() {
        errln!("tollgate: warning: no --key given; each chain's registered key was trusted");
    }
    if let Some(b) = reports.iter().find_map(|r| r.result.as_ref().err()) {
        return Ok(Err(Refused::Broken(b.to_string())));
    }
    // (The merged order's length comes with the first tick.)
    progress.phase("replaying", Unit::Entries, 0);
    Ok(tollgate_store::replay::replay_chains(
        &chains,
        candidate,
        args.examples,
        &mut |t| progress.tick(t),
    ))
}

/// How many sessions the text form lists by their flips.
const TEXT_SESSIONS: usize = 20;

fn print_text(r: &Report) {
    let unreplayable = r.unreplayable_total();
    outln!(
        "replayed {} of {} verdicts ({} entries): {} flip(s), {} reason change(s), {} not replayable",
        r.replayed,
        r.verdicts,
        r.entries,
        r.flips,
        r.reason_changes,
        unreplayable
    );
    if r.flips > 0 {
        outln!("\nflips by kind:");
        for (k, n) in &r.by_kind {
            outln!("  {n:>8}  {k}");
        }
        outln!("flips by rule:");
        for (k, n) in &r.by_rule {
            outln!("  {n:>8}  {k}");
        }
        // The sessions with the most flips (all of them in --format json).
        let mut sessions: Vec<(&String, &u64)> = r.by_session.iter().collect();
        sessions.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        outln!("flips by session ({} sessions):", sessions.len());
        for (k, n) in sessions.iter().take(TEXT_SESSIONS) {
            outln!("  {n:>8}  {k}");
        }
        if sessions.len() > TEXT_SESSIONS {
            outln!(
                "  ... and {} more sessions (--format json lists them all)",
                sessions.len() - TEXT_SESSIONS
            );
        }
        if r.flips_after_divergence > 0 {
            outln!(
                "  ({} flip(s) came after an earlier difference in their session)",
                r.flips_after_divergence
            );
        }
        // (The report keeps at most `--examples` of each.)
        outln!("\nfirst {} flip(s):", r.flip_examples.len());
        for c in &r.flip_examples {
            print_change(c);
        }
    }
    if r.reason_changes > 0 {
        outln!("\nreason changes (same verdict):");
        for (k, n) in &r.reason_by_change {
            outln!("  {n:>8}  {k}");
        }
        outln!("first {} reason change(s):", r.reason_examples.len());
        for c in &r.reason_examples {
            print_change(c);
        }
    }
    if unreplayable > 0 {
        outln!("\nnot replayable (counted, not guessed):");
        for (k, n) in &r.unreplayable {
            let what = match k.as_str() {
                "args" => "a policy reads the call's arguments, which the log does not hold",
                "draw" => "the verdict depends on the probabilistic layer's unrecorded draw",
                _ => "",
            };
            outln!("  {n:>8}  {k}: {what}");
        }
        for (p, n) in &r.unreplayable_policies {
            outln!("  {n:>8}  args read by policy `{p}`");
        }
    }
    if r.skipped_settlements > 0 || r.skipped_decisions > 0 {
        outln!(
            "\nrecorded history the candidate's sessions did not take: {} settlement(s) of calls whose verdict flipped, {} human decision(s) on calls the candidate did not hold",
            r.skipped_settlements,
            r.skipped_decisions
        );
    }
}

fn print_change(c: &Change) {
    let chain = c
        .chain
        .as_ref()
        .map_or_else(String::new, |id| format!("chain {id} "));
    outln!(
        "  {chain}entry {} {} session {} call {} tool `{}`: {} ({}) -> {} ({}){}",
        c.index,
        files::rfc3339(c.timestamp_ns),
        c.session,
        c.call_number,
        c.tool,
        c.recorded,
        c.recorded_reason,
        c.candidate,
        c.candidate_reason,
        if c.after_divergence {
            " [after an earlier difference in this session]"
        } else {
            ""
        }
    );
}

/// A progress bar on standard error, only when it is a terminal: what is done of a total
/// known before the first entry (the log files' bytes on disk; a fleet's rows, then its
/// merged entries), redrawn at most every 200 ms, and always at the start of a phase and
/// at its end; the line is cleared when the replay is done.
struct Progress {
    on: bool,
    phase: &'static str,
    unit: Unit,
    last: Option<Instant>,
    shown: bool,
    ended: bool,
    tick: Tick,
}

/// What a bar counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Bytes,
    Entries,
}

/// The bar's width in characters.
const BAR: u64 = 30;

impl Progress {
    fn new(on: bool) -> Progress {
        Progress {
            on,
            phase: "replaying",
            unit: Unit::Bytes,
            last: None,
            shown: false,
            ended: false,
            tick: Tick::default(),
        }
    }

    /// A new phase, counting `unit`s toward `total`.
    fn phase(&mut self, phase: &'static str, unit: Unit, total: u64) {
        self.end_phase();
        self.phase = phase;
        self.unit = unit;
        self.last = None;
        self.ended = false;
        self.tick = Tick {
            total,
            ..Tick::default()
        };
    }

    fn tick(&mut self, t: Tick) {
        self.tick = t;
        if !self.on {
            return;
        }
        // Throttled here alone, by time: the producers tick at their own pace (every
        // entry, or every 256th).
        if self.last.is_some_and(|l| l.elapsed().as_millis() < 200) {
            return;
        }
        self.draw();
    }

    fn draw(&mut self) {
        self.last = Some(Instant::now());
        self.shown = true;
        let t = self.tick;
        let total = t.total.max(1);
        let done = t.done.min(total);
        let filled = done * BAR / total;
        let percent = done * 100 / total;
        let amount = match self.unit {
            Unit::Bytes => format!("{} of {}", bytes(done), bytes(t.total)),
            Unit::Entries => format!("{done} of {}", t.total),
        };
        errln_raw(&format!(
            "\r\x1b[2K{} [{}{}] {percent:>3}%  {amount}, {} entries",
            self.phase,
            "#".repeat(usize::try_from(filled).unwrap_or(0)),
            " ".repeat(usize::try_from(BAR - filled).unwrap_or(0)),
            t.entries
        ));
    }

    /// The phase's last state, drawn once.
    fn end_phase(&mut self) {
        if self.on && !self.ended && self.tick.entries > 0 {
            self.ended = true;
            self.draw();
        }
    }

    fn done(&mut self) {
        self.end_phase();
        if self.shown {
            errln_raw("\r\x1b[2K");
        }
    }
}

/// A byte count as a person reads it.
fn bytes(n: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let f = n as f64;
    if n >= 1 << 30 {
        format!("{:.1} GiB", f / f64::from(1u32 << 30))
    } else if n >= 1 << 20 {
        format!("{:.1} MiB", f / f64::from(1u32 << 20))
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", f / 1024.0)
    } else {
        format!("{n} B")
    }
}

fn errln_raw(text: &str) {
    crate::out::stderr(format_args!("{text}"));
}
