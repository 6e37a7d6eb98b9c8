//! `tollgate policy replay --config CANDIDATE.toml [--policy FILE]... [--key PUB] AUDIT...`:
//! what a candidate guard configuration and policy set would have decided for every call
//! a recorded audit log holds.
//!
//! The log is verified as `tollgate audit verify` verifies it (the audit crate's
//! verifier, streaming: every entry is replayed only once it passed every check) and folded
//! as the store folds it; a log that does not verify or does not fold is refused, and no
//! replay result is printed. The replay itself is `tollgate_store::replay` (the candidate's
//! sessions decided by `tollgate_store::rules::decide`, the daemon's one decision path).
//!
//! Output: the verdicts that flip (ALLOW→DENY, DENY→ALLOW, anything→HITL, ...), counted
//! by rule and by session, with the first `--examples` in full; apart from flips, the
//! verdicts whose reason alone changed; the entries that could not be replayed, by
//! cause. `--format json` prints the same as one JSON object.
//!
//! Exit codes: 0 nothing flips and every verdict was replayed; 1 something flips; 2 the log
//! is broken or the input is bad (configuration, policies, key, files); 3 nothing flips but
//! some verdicts could not be replayed.

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use tollgate_audit::{files, keys, Event, PathsError, SessionEvent, VerifyOptions};
use tollgate_core::json::{self, Number, Value};
use tollgate_core::Verdict;
use tollgate_daemon::config::DaemonConfig;
use tollgate_store::replay::{Candidate, Replay, Unreplayable};
use tollgate_store::Policy;

/// Arguments of `tollgate policy replay`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The candidate configuration (`tollgate serve`'s TOML): its guards (`[guard.*]`) and
    /// its `[policy]` are replayed.
    #[arg(long, value_name = "CANDIDATE.toml")]
    config: PathBuf,
    /// A policy file replacing the configuration's `[policy]` files (repeatable, in set
    /// order; `[policy]`'s default, schema and trip_on_refusal still apply).
    #[arg(long = "policy", value_name = "FILE.cedar")]
    policies: Vec<PathBuf>,
    /// The public key the log must be signed with (without it, the key in the first file
    /// header is trusted, and the output says so).
    #[arg(long, value_name = "PUB")]
    key: Option<PathBuf>,
    /// How many flips (and how many reason changes) to print in full.
    #[arg(long, value_name = "N", default_value_t = 10)]
    examples: usize,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Log files, or directories of rotated files, in chain order.
    #[arg(required = true, value_name = "AUDIT")]
    paths: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

/// One verdict whose candidate verdict or reason differs, as printed.
#[derive(Debug, Clone)]
struct Change {
    index: u64,
    timestamp_ns: i64,
    session: String,
    call_number: u64,
    tool: String,
    recorded: Verdict,
    recorded_reason: String,
    candidate: Verdict,
    candidate_reason: String,
    after_divergence: bool,
}

impl Change {
    /// The rule a flip is counted under: the candidate's reason when it refuses or holds,
    /// else the recorded reason that no longer fires.
    fn rule(&self) -> &str {
        if self.candidate == Verdict::Allow {
            &self.recorded_reason
        } else {
            &self.candidate_reason
        }
    }

    fn kind(&self) -> String {
        format!("{}->{}", self.recorded, self.candidate)
    }
}

/// What the replay found.
#[derive(Debug, Default)]
struct Report {
    entries: u64,
    verdicts: u64,
    replayed: u64,
    flips: u64,
    flips_after_divergence: u64,
    by_kind: BTreeMap<String, u64>,
    by_rule: BTreeMap<String, u64>,
    by_session: BTreeMap<String, u64>,
    flip_examples: Vec<Change>,
    reason_changes: u64,
    reason_by_change: BTreeMap<String, u64>,
    reason_examples: Vec<Change>,
    unreplayable: BTreeMap<String, u64>,
    unreplayable_policies: BTreeMap<String, u64>,
    skipped_settlements: u64,
    skipped_decisions: u64,
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
    let config = DaemonConfig::load(&args.config)
        .map_err(|e| format!("`{}`: {e}", args.config.display()))?;
    let mut settings = config.policy.clone();
    if !args.policies.is_empty() {
        let mut s = settings.unwrap_or(tollgate_policy::files::Settings {
            files: Vec::new(),
            default: tollgate_policy::DefaultEffect::Allow,
            schema: None,
            trip_on_refusal: false,
            shadow: false,
        });
        s.files.clone_from(&args.policies);
        settings = Some(s);
    }
    let set = match &settings {
        None => None,
        Some(s) => {
            let (enforced, warnings) =
                tollgate_policy::files::enforced(s).map_err(|e| e.to_string())?;
            for w in warnings {
                errln!("{w}");
            }
            Some(Arc::new(enforced))
        }
    };
    Ok(Candidate {
        default_guard: Arc::new(Policy::new(config.default_guard.clone())),
        agent_guards: config
            .agent_guards
            .iter()
            .map(|(a, g)| (a.clone(), Arc::new(Policy::new(g.clone()))))
            .collect::<HashMap<_, _>>(),
        set,
    })
}

fn replay(args: &Args) -> Result<ExitCode, String> {
    let candidate = candidate(args)?;
    let trusted_key = args
        .key
        .as_ref()
        .map(|k| {
            std::fs::read_to_string(k)
                .map_err(|e| format!("cannot read key `{}`: {e}", k.display()))
                .and_then(|t| {
                    keys::parse_public_key(&t).map_err(|e| format!("`{}`: {e}", k.display()))
                })
        })
        .transpose()?;
    // One log directory with the writer's checkpoint: let the checkpoint vouch for the
    // entries it counts (docs/audit-format.md "Anchored on a checkpoint"): links, key
    // hand-overs and the checkpoint's signature are checked, and every entry after it in
    // full, as strong as checking every signature and about 25 times faster. Otherwise
    // (files, several directories, no checkpoint, an unreadable one) every signature.
    let checkpoint = match args.paths.as_slice() {
        [dir] if dir.is_dir() => tollgate_audit::read_checkpoint(dir).ok(),
        _ => None,
    };
    let opts = VerifyOptions {
        trusted_key,
        anchor_on_checkpoint: checkpoint.is_some(),
        checkpoint,
        ..VerifyOptions::default()
    };
    let mut progress = Progress::new(std::io::stderr().is_terminal());
    let mut fold = Replay::new(candidate);
    let mut report = Report::default();
    let mut broken: Option<String> = None;
    let started = Instant::now();
    let verified = tollgate_audit::verify_paths(&args.paths, &opts, &mut |e| {
        if broken.is_some() {
            return;
        }
        report.entries += 1;
        progress.tick(report.entries);
        match fold.fold(e.index, &e.event) {
            Err(err) => broken = Some(format!("the log does not fold: {err}")),
            Ok(None) => {}
            Ok(Some(outcome)) => {
                let Event::Session(SessionEvent::Verdict(v)) = &e.event else {
                    return;
                };
                report.verdicts += 1;
                match outcome.candidate {
                    Err(why) => {
                        *report
                            .unreplayable
                            .entry(why.kind().to_owned())
                            .or_default() += 1;
                        if let Unreplayable::Args { policy } = why {
                            *report.unreplayable_policies.entry(policy).or_default() += 1;
                        }
                    }
                    Ok((verdict, reason)) => {
                        report.replayed += 1;
                        if verdict == v.verdict && reason == outcome.recorded_reason {
                            return;
                        }
                        let change = Change {
                            index: e.index,
                            timestamp_ns: v.timestamp_ns,
                            session: v.session_id.clone(),
                            call_number: v.call_number,
                            tool: v.tool_name.clone(),
                            recorded: v.verdict,
                            recorded_reason: outcome.recorded_reason,
                            candidate: verdict,
                            candidate_reason: reason,
                            after_divergence: outcome.after_divergence,
                        };
                        if verdict == v.verdict {
                            report.reason_changes += 1;
                            *report
                                .reason_by_change
                                .entry(format!(
                                    "{} -> {}",
                                    change.recorded_reason, change.candidate_reason
                                ))
                                .or_default() += 1;
                            if report.reason_examples.len() < args.examples {
                                report.reason_examples.push(change);
                            }
                        } else {
                            report.flips += 1;
                            if change.after_divergence {
                                report.flips_after_divergence += 1;
                            }
                            *report.by_kind.entry(change.kind()).or_default() += 1;
                            *report.by_rule.entry(change.rule().to_owned()).or_default() += 1;
                            *report.by_session.entry(change.session.clone()).or_default() += 1;
                            if report.flip_examples.len() < args.examples {
                                report.flip_examples.push(change);
                            }
                        }
                    }
                }
            }
        }
    });
    progress.done();
    let summary = match verified {
        Ok(s) => s,
        Err(PathsError::Break(b)) => {
            errln!("BROKEN: {b}; nothing replayed");
            return Ok(ExitCode::from(2));
        }
        Err(e @ PathsError::Io { .. }) => return Err(e.to_string()),
    };
    if let Some(b) = broken {
        errln!("BROKEN: {b}; nothing replayed");
        return Ok(ExitCode::from(2));
    }
    if !summary.key_trusted {
        errln!("tollgate: warning: no --key given; the log's own key was trusted");
    }
    report.skipped_settlements = fold.skipped.settlements;
    report.skipped_decisions = fold.skipped.decisions;
    let elapsed = started.elapsed();
    let unreplayable: u64 = report.unreplayable.values().sum();
    match args.format {
        Format::Text => print_text(&report, args.examples),
        Format::Json => outln!("{}", to_json(&report, unreplayable)),
    }
    errln!(
        "tollgate: verified and replayed {} entries in {:.3} s ({:.0} entries/s)",
        report.entries,
        elapsed.as_secs_f64(),
        report.entries as f64 / elapsed.as_secs_f64().max(1e-9)
    );
    Ok(ExitCode::from(if report.flips > 0 {
        1
    } else if unreplayable > 0 {
        3
    } else {
        0
    }))
}

/// How many sessions the text form lists by their flips.
const TEXT_SESSIONS: usize = 20;

fn print_text(r: &Report, examples: usize) {
    let unreplayable: u64 = r.unreplayable.values().sum();
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
        outln!("\nfirst {} flip(s):", r.flip_examples.len().min(examples));
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
    outln!(
        "  entry {} {} session {} call {} tool `{}`: {} ({}) -> {} ({}){}",
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

fn uint(n: u64) -> Value {
    Value::Number(Number::Int(i128::from(n)))
}

fn counts(m: &BTreeMap<String, u64>) -> Value {
    Value::Object(m.iter().map(|(k, n)| (k.clone(), uint(*n))).collect())
}

fn change_json(c: &Change) -> Value {
    let mut m = BTreeMap::new();
    m.insert("index".to_owned(), uint(c.index));
    m.insert(
        "timestamp_ns".to_owned(),
        Value::Number(Number::Int(i128::from(c.timestamp_ns))),
    );
    m.insert(
        "time".to_owned(),
        Value::from(files::rfc3339(c.timestamp_ns).as_str()),
    );
    m.insert("session_id".to_owned(), Value::from(c.session.as_str()));
    m.insert("call_number".to_owned(), uint(c.call_number));
    m.insert("tool_name".to_owned(), Value::from(c.tool.as_str()));
    m.insert(
        "recorded".to_owned(),
        Value::from(c.recorded.to_string().as_str()),
    );
    m.insert(
        "recorded_reason".to_owned(),
        Value::from(c.recorded_reason.as_str()),
    );
    m.insert(
        "candidate".to_owned(),
        Value::from(c.candidate.to_string().as_str()),
    );
    m.insert(
        "candidate_reason".to_owned(),
        Value::from(c.candidate_reason.as_str()),
    );
    m.insert(
        "after_divergence".to_owned(),
        Value::Bool(c.after_divergence),
    );
    Value::Object(m)
}

fn to_json(r: &Report, unreplayable: u64) -> String {
    let mut m = BTreeMap::new();
    m.insert("entries".to_owned(), uint(r.entries));
    m.insert("verdicts".to_owned(), uint(r.verdicts));
    m.insert("replayed".to_owned(), uint(r.replayed));
    m.insert("flips".to_owned(), uint(r.flips));
    m.insert(
        "flips_after_divergence".to_owned(),
        uint(r.flips_after_divergence),
    );
    m.insert("flips_by_kind".to_owned(), counts(&r.by_kind));
    m.insert("flips_by_rule".to_owned(), counts(&r.by_rule));
    m.insert("flips_by_session".to_owned(), counts(&r.by_session));
    m.insert(
        "flip_examples".to_owned(),
        Value::Array(r.flip_examples.iter().map(change_json).collect()),
    );
    m.insert("reason_changes".to_owned(), uint(r.reason_changes));
    m.insert(
        "reason_changes_by_change".to_owned(),
        counts(&r.reason_by_change),
    );
    m.insert(
        "reason_examples".to_owned(),
        Value::Array(r.reason_examples.iter().map(change_json).collect()),
    );
    m.insert("unreplayable".to_owned(), uint(unreplayable));
    m.insert("unreplayable_by_cause".to_owned(), counts(&r.unreplayable));
    m.insert(
        "unreplayable_by_policy".to_owned(),
        counts(&r.unreplayable_policies),
    );
    m.insert(
        "skipped_settlements".to_owned(),
        uint(r.skipped_settlements),
    );
    m.insert("skipped_decisions".to_owned(), uint(r.skipped_decisions));
    let mut out = Vec::new();
    // Counts and strings only: the canonical writer cannot fail.
    let _ = json::write_canonical(&Value::Object(m), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// A progress line on standard error, only when it is a terminal.
struct Progress {
    on: bool,
    last: Instant,
    shown: bool,
}

impl Progress {
    fn new(on: bool) -> Progress {
        Progress {
            on,
            last: Instant::now(),
            shown: false,
        }
    }

    fn tick(&mut self, entries: u64) {
        if !self.on || !entries.is_multiple_of(4096) || self.last.elapsed().as_millis() < 200 {
            return;
        }
        self.last = Instant::now();
        self.shown = true;
        errln_raw(&format!(
            "\rreplaying: {entries} entries verified and replayed"
        ));
    }

    fn done(&mut self) {
        if self.shown {
            errln_raw("\r\x1b[2K");
        }
    }
}

fn errln_raw(text: &str) {
    crate::out::stderr(format_args!("{text}"));
}
