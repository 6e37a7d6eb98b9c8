//! Replay of a recorded audit log under a candidate configuration (issue 19 part 3,
//! `tollgate policy replay`): what a changed guard configuration or policy set would have
//! decided for every call the log records.
//!
//! Two folds run side by side over the verified entries, in chain order:
//!
//! - the **recorded** fold is the store's own [`Ledger`] (the functions of [`crate::ops`]
//!   re-applied to each entry's inputs, each regenerated record compared with the logged
//!   one), so a log that verifies but does not fold is refused, not replayed;
//! - the **candidate** fold opens each session afresh under the candidate's guard
//!   configuration (per agent, as the daemon picks it) and policy set, and decides each
//!   recorded call with [`rules::decide`], the one decision path of the daemon and the
//!   library `Guard`, at the daemon's recorded time. The candidate's verdict is applied
//!   to the candidate's own session: budgets, circuit, repeat counts, holds and labels
//!   follow the candidate's decisions, not the recorded ones.
//!
//! What the recorded history says happened after a call goes on where it still can:
//!
//! - a settlement is applied to the candidate's session unless the candidate's verdict on
//!   that call differed from the recorded one (a call the candidate refused or held never
//!   ran, so it has nothing to settle; a call the candidate allowed and the daemon did not
//!   has no recorded cost: its reservation stays outstanding);
//! - a human's decision is applied when the candidate holds that call too; otherwise it is
//!   skipped (a hold the candidate adds was never put to anyone, so it stays undecided);
//! - a session's closing closes the candidate's session.
//!
//! Entries that cannot be replayed are counted, never guessed ([`Unreplayable`]); the
//! candidate's session then takes the recorded outcome, and every later verdict of that
//! session says so ([`Outcome::after_divergence`]).
//!
//! **A shared budget** (per agent, per organization) is spent by many sessions, in a fleet
//! through many daemons. The candidate decides each call with the budget the daemon saw
//! (the entry's own `budget_before`: what every other session had left of it, whichever
//! daemon served them) plus the candidate's own difference on that budget so far: the
//! difference in initial amounts, and what the candidate's verdicts and the settlements
//! it took spent more or less than the recorded ones. Under the very configuration that
//! wrote the log the difference stays 0 and every call sees exactly what the daemon saw;
//! in a single log (one chain orders every change) it is the same as folding the
//! candidate's budget on its own.
//!
//! **A fleet's chains** ([`Replay::fleet`]) are folded in the order [`merge::merge`]
//! gives (each session by its places, each shared budget by its versions); the recorded
//! fold is then each session's own ([`ops::replay`] with each entry's recorded budget
//! amounts), and a void (record kind 7) holds its session's place and changes nothing.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tollgate_audit::{
    Event, PolicyEffect, PolicyNote, RecordedParams, SessionEvent, VerdictRecord,
    MAX_RECORDED_PARAMS,
};
use tollgate_core::json::{self, Limits, Value};
use tollgate_core::{Digest, Money, Params, ToolCall, Verdict};
use tollgate_policy::compose::{self, Enforced, Input};
use tollgate_policy::{Actor, LOCAL_UPSTREAM};

use crate::ops::FoldError;
use crate::rules::{self, Rules};
use crate::session::{Budget, BudgetKey, Policy, Session, SessionMeta};
use crate::{ops, Ledger, LedgerError};

pub mod merge;
pub mod report;

/// The highest draw below 1: with it the probabilistic layer denies only at probability 1.
const DRAW_HIGH: f64 = 1.0 - f64::EPSILON / 2.0;

/// What is replayed: the guard configurations new sessions get and the policy set.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The guard every agent gets unless overridden.
    pub default_guard: Arc<Policy>,
    /// Per-agent guards (complete configurations).
    pub agent_guards: HashMap<String, Arc<Policy>>,
    /// The policy set, if any.
    pub set: Option<Arc<Enforced>>,
}

impl Candidate {
    fn guard_for(&self, agent: &str) -> Arc<Policy> {
        self.agent_guards
            .get(agent)
            .unwrap_or(&self.default_guard)
            .clone()
    }

    /// A candidate with the guards `default_guard` and `agent_guards` and the policy set
    /// of `settings` (a `[policy]` section), whose files `replace` replaces when it names
    /// any (`--policy`; the section's default, schema and trip setting still apply, its
    /// `mode = "shadow"` does not: the files named are replayed enforced; without a
    /// section the default is allow). The loader's warnings are returned as
    /// text; a set that does not load is an error naming every finding.
    pub fn load(
        default_guard: tollgate_core::GuardConfig,
        agent_guards: HashMap<String, tollgate_core::GuardConfig>,
        settings: Option<&tollgate_policy::files::Settings>,
        replace: &[std::path::PathBuf],
    ) -> Result<(Candidate, Vec<String>), String> {
        let mut settings = settings.cloned();
        if !replace.is_empty() {
            let mut s = settings.unwrap_or(tollgate_policy::files::Settings {
                files: Vec::new(),
                default: tollgate_policy::DefaultEffect::Allow,
                schema: None,
                trip_on_refusal: false,
                shadow: false,
            });
            s.files = replace.to_vec();
            // The files named are the candidate: replayed enforced, whatever mode the
            // configuration runs its own set in (a `@shadow` policy in them stays shadow).
            s.shadow = false;
            settings = Some(s);
        }
        let mut warnings = Vec::new();
        let set = match &settings {
            None => None,
            Some(s) => {
                let (enforced, found) =
                    tollgate_policy::files::enforced(s).map_err(|e| e.to_string())?;
                warnings.extend(found.iter().map(ToString::to_string));
                Some(Arc::new(enforced))
            }
        };
        Ok((
            Candidate {
                default_guard: Arc::new(Policy::new(default_guard)),
                agent_guards: agent_guards
                    .into_iter()
                    .map(|(a, g)| (a, Arc::new(Policy::new(g))))
                    .collect(),
                set,
            },
            warnings,
        ))
    }
}

/// How far a replay is: `done` of `total` (bytes of the log's files as they are on disk,
/// or entries of a fleet's chains), and the entries folded so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tick {
    /// Entries verified and folded so far.
    pub entries: u64,
    /// How much of `total` is done.
    pub done: u64,
    /// The whole: known before the first entry.
    pub total: u64,
}

/// How many records a log file's bytes hold (walking the length prefixes after the
/// header, without checking them: a count for a progress display, not a verification).
fn records_in(file: &[u8]) -> u64 {
    let mut off = tollgate_audit::format::HEADER_LEN;
    let mut n = 0u64;
    while let Some(prefix) = file
        .get(off..off.saturating_add(4))
        .and_then(|p| <[u8; 4]>::try_from(p).ok())
    {
        let len = usize::try_from(u32::from_be_bytes(prefix)).unwrap_or(usize::MAX);
        off = off.saturating_add(4).saturating_add(len);
        n += 1;
    }
    n
}

/// Why a log was not replayed (`tollgate policy replay` exits 2, printing no result).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The log does not verify, or does not fold: the message says where.
    #[error("BROKEN: {0}; nothing replayed")]
    Broken(String),
    /// The files cannot be read.
    #[error("{0}")]
    Io(String),
}

/// Verify the log `paths` (files, or directories of rotated files, in chain order) and
/// replay it under `candidate`, as `tollgate policy replay` does: with `trusted_key` the
/// log must be signed by it (else the first file's key is trusted, and the result says
/// so); one directory holding its writer's checkpoint is verified anchored on it (links,
/// hand-overs and the checkpoint's signature; every entry after it in full), anything
/// else with every signature. `progress` sees how far it is, in bytes of the files as they
/// are on disk (a file's share grows with its entries verified). A log that does not
/// verify or does not fold gives no report.
pub fn replay_paths(
    paths: &[std::path::PathBuf],
    trusted_key: Option<tollgate_audit::VerifyingKey>,
    candidate: Candidate,
    examples: usize,
    progress: &mut dyn FnMut(Tick),
) -> Result<(report::Report, bool), Refused> {
    let files = tollgate_audit::collect_files(paths).map_err(|e| match e {
        tollgate_audit::PathsError::Break(b) => Refused::Broken(b.to_string()),
        e @ tollgate_audit::PathsError::Io { .. } => Refused::Io(e.to_string()),
    })?;
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let total: u64 = files.iter().map(|f| size(f)).sum();
    // The bytes of the files done, and the one being verified: its size on disk, its
    // records, and how many of them were seen.
    let at = std::cell::Cell::new((0u64, 0u64, 0u64, 0u64));
    let checkpoint = match paths {
        [dir] if dir.is_dir() => tollgate_audit::read_checkpoint(dir).ok(),
        _ => None,
    };
    let opts = tollgate_audit::VerifyOptions {
        trusted_key,
        anchor_on_checkpoint: checkpoint.is_some(),
        checkpoint,
        ..tollgate_audit::VerifyOptions::default()
    };
    let mut fold = Replay::new(candidate);
    let mut report = report::Report::new(examples);
    let mut broken: Option<String> = None;
    let mut on_file = |path: &std::path::Path, bytes: &[u8]| {
        let (before, done_file, _, _) = at.get();
        at.set((
            before.saturating_add(done_file),
            size(path),
            records_in(bytes),
            0,
        ));
    };
    // The files as listed above (a directory is listed once).
    let verified = tollgate_audit::verify_paths_watched(
        &files,
        &opts,
        &mut |e| {
            if broken.is_some() {
                return;
            }
            report.entries += 1;
            let (before, file, records, seen) = at.get();
            let seen = seen.saturating_add(1);
            at.set((before, file, records, seen));
            // Every 256th entry (and the first) is shown; the end once it is reached.
            if report.entries % 256 == 1 {
                let share =
                    u128::from(file) * u128::from(seen.min(records)) / u128::from(records.max(1));
                progress(Tick {
                    entries: report.entries,
                    done: before
                        .saturating_add(u64::try_from(share).unwrap_or(u64::MAX))
                        .min(total),
                    total,
                });
            }
            match fold.fold(e.index, &e.event) {
                Err(err) => broken = Some(format!("the log does not fold: {err}")),
                Ok(None) => {}
                Ok(Some(outcome)) => {
                    if let Event::Session(SessionEvent::Verdict(v)) = &e.event {
                        report.add(None, e.index, v, outcome);
                    }
                }
            }
        },
        &mut on_file,
    );
    let summary = match verified {
        Ok(s) => s,
        Err(tollgate_audit::PathsError::Break(b)) => return Err(Refused::Broken(b.to_string())),
        Err(e @ tollgate_audit::PathsError::Io { .. }) => return Err(Refused::Io(e.to_string())),
    };
    if let Some(b) = broken {
        return Err(Refused::Broken(b));
    }
    progress(Tick {
        entries: report.entries,
        done: total,
        total,
    });
    report.skipped(fold.skipped);
    Ok((report, summary.key_trusted))
}

/// Replay a fleet's chains (each already verified, whole) under `candidate`: merged into
/// one order ([`merge::merge`]) and folded ([`Replay::fleet`]). `progress` sees how many
/// of the merged entries were folded. Chains that do not merge or fold give no report.
pub fn replay_chains(
    chains: &[merge::Chain],
    candidate: Candidate,
    examples: usize,
    progress: &mut dyn FnMut(Tick),
) -> Result<report::Report, Refused> {
    let order = merge::merge(chains)
        .map_err(|e| Refused::Broken(format!("the chains do not fold: {e}")))?;
    let mut fold = Replay::fleet(candidate);
    let mut report = report::Report::new(examples);
    // Entries outside the merged order (policy sets, ...) are counted too.
    report.entries = chains.iter().map(|c| c.entries.len() as u64).sum();
    let total = order.len() as u64;
    for (n, at) in order.iter().enumerate() {
        // Every 256th entry (and the first and the last), as `replay_paths` ticks.
        let done = n as u64 + 1;
        if done % 256 == 1 || done == total {
            progress(Tick {
                entries: done,
                done,
                total,
            });
        }
        let Some(chain) = chains.get(at.chain) else {
            continue;
        };
        let Some((index, event)) = chain.entries.get(at.entry) else {
            continue;
        };
        let outcome = fold.fold(*index, event).map_err(|err| {
            Refused::Broken(format!("the chains do not fold: chain {} {err}", chain.id))
        })?;
        if let (Some(outcome), Event::Session(SessionEvent::Verdict(v))) = (outcome, event) {
            report.add(Some(&chain.id), *index, v, outcome);
        }
    }
    report.skipped(fold.skipped);
    Ok(report)
}

/// Why a recorded verdict entry could not be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreplayable {
    /// A policy of the candidate reads the call's arguments (`context.args`) and the log
    /// does not hold them ([`recorded_args`]).
    Args {
        /// The first policy that reads them.
        policy: String,
    },
    /// The candidate's verdict depends on the probabilistic layer's random draw, which
    /// the log does not hold, and the recorded outcome does not determine it.
    Draw,
}

impl Unreplayable {
    /// A short name for counts: `args` or `draw`.
    pub fn kind(&self) -> &'static str {
        match self {
            Unreplayable::Args { .. } => "args",
            Unreplayable::Draw => "draw",
        }
    }
}

/// What became of one recorded verdict entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The recorded verdict's reason string (`within_thresholds`, `policy:<id>`, ...).
    pub recorded_reason: String,
    /// The candidate's verdict and reason string, or why there is none.
    pub candidate: Result<(Verdict, String), Unreplayable>,
    /// Whether an earlier entry of the same session already differed (a flip, a changed
    /// reason) or could not be replayed: the candidate's session state was then its own,
    /// and this verdict may follow from that earlier difference.
    pub after_divergence: bool,
}

/// Entries of the recorded history the candidate's sessions did not take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Settlements of calls whose candidate verdict differed from the recorded one.
    pub settlements: u64,
    /// Human decisions on calls the candidate did not hold.
    pub decisions: u64,
}

/// A candidate's session.
#[derive(Debug)]
struct Replica {
    session: Session,
    /// The session's principal and resource in the candidate's set, per upstream (the
    /// local one first; format version 8 names others), built once each: `None` when
    /// the names are too long for one (every call then fails closed, as it did live).
    actors: Vec<(String, Option<Arc<Actor>>)>,
    /// The shared budget's key (`None`: the session's own budget).
    shared: Option<BudgetKey>,
    /// Whether an entry already differed or could not be replayed.
    diverged: bool,
    /// Calls whose candidate verdict differed from the recorded one.
    differs: HashSet<u64>,
}

impl Replica {
    /// The session's principal in `set` for calls to tools of `upstream`, built once.
    fn actor(
        &mut self,
        set: &Enforced,
        upstream: &str,
        organization: &str,
        agent: &str,
    ) -> Option<Arc<Actor>> {
        if let Some((_, a)) = self.actors.iter().find(|(u, _)| u == upstream) {
            return a.clone();
        }
        let a = set
            .policies
            .actor(organization, agent, upstream)
            .map(Arc::new);
        self.actors.push((upstream.to_owned(), a.clone()));
        a
    }
}

/// A shared budget in the candidate's fold: its amounts, and how far its remaining amount
/// is from the recorded one (see the module's text).
#[derive(Debug, Clone, Copy)]
struct Shared {
    budget: Budget,
    /// The candidate's remaining amount minus the recorded one, after the last entry.
    delta: i128,
}

/// The recorded fold: one chain's [`Ledger`], or a fleet's sessions ([`Fleet`]).
#[derive(Debug)]
enum Recorded {
    Chain(Ledger),
    Fleet(Fleet),
}

impl Recorded {
    /// The recorded session `id` before its next entry, with the budget amounts the
    /// verdict `v` recorded loaded (for a fleet's sessions, whose shared budgets are not
    /// folded across chains).
    fn session(&self, id: &str, v: &VerdictRecord) -> Option<Session> {
        match self {
            Recorded::Chain(l) => l.session(id),
            Recorded::Fleet(f) => f.sessions.get(id).cloned().map(|mut s| {
                if s.meta.shared_budget_key().is_some() {
                    s.state.budget_remaining = v.budget_before;
                }
                s
            }),
        }
    }
}

/// The recorded fold of a fleet's chains, taken in [`merge::merge`]'s order: every
/// session folded on its own by [`ops::replay`] (each regenerated record compared with
/// the logged one), with a shared budget's remaining amount taken from each entry (no
/// chain holds the budget's order; the module's text says why that is enough).
#[derive(Debug, Default)]
struct Fleet {
    sessions: HashMap<String, Session>,
}

/// The remaining amount of its budget an entry records before its change, and after.
fn recorded_amounts(e: &SessionEvent) -> (Money, Money) {
    match e {
        SessionEvent::Opened(r) => (r.budget_before, r.budget_before),
        SessionEvent::Verdict(r) => (r.budget_before, r.budget_after),
        SessionEvent::Settled(r) => (r.budget_before, r.budget_after),
        SessionEvent::HumanDecision(r) => (r.budget_remaining, r.budget_remaining),
        SessionEvent::Closed(r) => (r.budget_remaining, r.budget_remaining),
    }
}

impl Fleet {
    fn fold(&mut self, event: &Event) -> Result<(), FoldError> {
        match event {
            Event::Session(SessionEvent::Opened(r)) => {
                let s = ops::reopen(&self.sessions, r, |s| {
                    if s.meta.shared_budget_key().is_some() {
                        s.state.budget_remaining = r.budget_before;
                    }
                })?;
                self.sessions.insert(r.session_id.clone(), s);
            }
            Event::Session(e) => {
                let id = e.session_id();
                let s = ops::opened(&mut self.sessions, id)?;
                if s.meta.shared_budget_key().is_some() {
                    s.state.budget_remaining = recorded_amounts(e).0;
                }
                ops::replay(s, e)?;
                if matches!(e, SessionEvent::Closed(_)) {
                    self.sessions.remove(id);
                }
            }
            // The place is held; the session is as it was before the voided change.
            Event::Void(v) => match self.sessions.get_mut(&v.session_id) {
                Some(s) => {
                    let expected = s.seq.saturating_add(1);
                    if v.session_seq != expected {
                        return Err(FoldError::OutOfOrder {
                            session: v.session_id.clone(),
                            expected,
                            found: v.session_seq,
                        });
                    }
                    s.seq = expected;
                }
                // A voided opening: the session never was.
                None if v.session_seq == 1 => {}
                None => {
                    return Err(FoldError::Session {
                        session: v.session_id.clone(),
                        what: "a void for a session that was never opened".to_owned(),
                    })
                }
            },
            Event::KeyHandover { .. } | Event::Recovery { .. } | Event::PolicySet(_) => {}
        }
        Ok(())
    }
}

/// The two folds (the recorded one and the candidate's), entry by entry.
#[derive(Debug)]
pub struct Replay {
    recorded: Recorded,
    candidate: Candidate,
    sessions: HashMap<String, Replica>,
    budgets: HashMap<BudgetKey, Shared>,
    /// What the candidate's sessions did not take of the recorded history.
    pub skipped: Skipped,
}

/// The call's arguments, when the entry records them: the one place that decides whether
/// an argument rule can be replayed. Only params recorded in full (format version 7,
/// `[audit] params = "full"`) whose canonical hash is the entry's `params_hash` are the
/// call's: redacted params are not (a rule would read the marker), params too large to
/// record are absent, and so are all params of older formats (hashes only).
pub fn recorded_args(v: &VerdictRecord) -> Option<Value> {
    let Some(RecordedParams::Full(text)) = &v.params else {
        return None;
    };
    let limits = Limits {
        max_bytes: MAX_RECORDED_PARAMS,
        ..Limits::default()
    };
    let value = json::parse(text.as_bytes(), limits).ok()?;
    (Params::json(&value).canonical_digest().ok()? == v.params_hash).then_some(value)
}

/// The recorded verdict's reason string.
pub fn recorded_reason(v: &VerdictRecord) -> String {
    v.policy
        .as_ref()
        .and_then(PolicyNote::reason)
        .unwrap_or_else(|| v.reason.as_str().to_owned())
}

impl Replay {
    /// A replay of a log (one chain) from its first entry under `candidate`.
    pub fn new(candidate: Candidate) -> Replay {
        Replay::with(Recorded::Chain(Ledger::new()), candidate)
    }

    /// A replay of a fleet's chains under `candidate`: the entries are then given in
    /// [`merge::merge`]'s order, each with its index in its own chain.
    pub fn fleet(candidate: Candidate) -> Replay {
        Replay::with(Recorded::Fleet(Fleet::default()), candidate)
    }

    fn with(recorded: Recorded, candidate: Candidate) -> Replay {
        Replay {
            recorded,
            candidate,
            sessions: HashMap::new(),
            budgets: HashMap::new(),
            skipped: Skipped::default(),
        }
    }

    /// Fold entry `index` (already verified: signature and link) into both folds. A
    /// verdict entry gives its [`Outcome`]. An entry the recorded fold refuses is an error
    /// (the log does not fold; nothing after it may be trusted).
    pub fn fold(&mut self, index: u64, event: &Event) -> Result<Option<Outcome>, LedgerError> {
        let fresh = match &self.recorded {
            Recorded::Chain(l) => index >= l.next_index,
            Recorded::Fleet(_) => true,
        };
        let outcome = match event {
            Event::Session(SessionEvent::Verdict(v)) if fresh => self.verdict(v),
            _ => None,
        };
        match &mut self.recorded {
            // The verifier checked every link; the ledger checks the order and the fold.
            Recorded::Chain(l) => l.fold(index, Digest::default(), None, event)?,
            Recorded::Fleet(f) => f
                .fold(event)
                .map_err(|source| LedgerError::Fold { index, source })?,
        }
        if let Event::Session(e) = event {
            self.follow(e);
        }
        Ok(outcome)
    }

    /// The candidate's sessions follow a non-verdict entry of the recorded history (the
    /// recorded fold took it, so its session exists).
    fn follow(&mut self, e: &SessionEvent) {
        match e {
            SessionEvent::Verdict(_) => {}
            SessionEvent::Opened(r) => {
                let policy = self.candidate.guard_for(&r.agent_id);
                // The candidate's budget scope, not the recorded one.
                let meta = SessionMeta {
                    budget_scope: policy.config.budget_scope,
                    ..ops::opened_meta(r)
                };
                let mut session = Session::new(meta, policy, r.timestamp_ns);
                let shared = session.meta.shared_budget_key();
                if let Some(k) = &shared {
                    // The first session of a budget creates it in the candidate's fold
                    // with the candidate's amount; the difference is from the recorded
                    // configuration's.
                    let initial = session.state.budget_initial;
                    let b = self.budgets.entry(k.clone()).or_insert_with(|| Shared {
                        budget: Budget::of(&session.state),
                        delta: i128::from(initial.0) - i128::from(r.budget_initial.0),
                    });
                    b.budget.remaining = plus(r.budget_before, b.delta);
                    b.budget.load_into(&mut session.state);
                }
                let actors = match &self.candidate.set {
                    None => Vec::new(),
                    Some(set) => {
                        session.policy_set = Some(set.policies.digest());
                        let local = set
                            .policies
                            .actor(&r.organization_id, &r.agent_id, LOCAL_UPSTREAM)
                            .map(Arc::new);
                        vec![(LOCAL_UPSTREAM.to_owned(), local)]
                    }
                };
                ops::open(&mut session, r.timestamp_ns);
                self.sessions.insert(
                    r.session_id.clone(),
                    Replica {
                        session,
                        actors,
                        shared,
                        diverged: false,
                        differs: HashSet::new(),
                    },
                );
            }
            SessionEvent::Settled(s) => {
                let Some(rep) = self.sessions.get_mut(&s.session_id) else {
                    return;
                };
                if rep.differs.contains(&s.call_number) {
                    self.skipped.settlements += 1;
                    with_budget(&mut self.budgets, rep, recorded_amounts(e), |_| {});
                    return;
                }
                with_budget(&mut self.budgets, rep, recorded_amounts(e), |rep| {
                    ops::settle_logged(&mut rep.session, s);
                });
            }
            SessionEvent::HumanDecision(d) => {
                let Some(rep) = self.sessions.get_mut(&d.session_id) else {
                    return;
                };
                let held = rep
                    .session
                    .state
                    .transition_of_call(d.call_number)
                    .is_some();
                let applied = held
                    && with_budget(&mut self.budgets, rep, recorded_amounts(e), |rep| {
                        ops::decide_logged(&mut rep.session, d).is_ok()
                    });
                if !applied {
                    self.skipped.decisions += 1;
                }
            }
            SessionEvent::Closed(c) => {
                if let Some(mut rep) = self.sessions.remove(&c.session_id) {
                    with_budget(&mut self.budgets, &mut rep, recorded_amounts(e), |rep| {
                        ops::close(&mut rep.session, c.reason, c.timestamp_ns);
                    });
                }
            }
        }
    }

    /// The candidate's verdict on a recorded call, applied to its session. `None` when the
    /// session is unknown (the recorded fold then refuses the entry).
    fn verdict(&mut self, v: &VerdictRecord) -> Option<Outcome> {
        let set = self.candidate.set.as_deref();
        let recorded = &self.recorded;
        let rep = self.sessions.get_mut(&v.session_id)?;
        let amounts = (v.budget_before, v.budget_after);
        Some(with_budget(&mut self.budgets, rep, amounts, |rep| {
            Replica::verdict(rep, set, v, |id| recorded.session(id, v))
        }))
    }
}

impl Replica {
    /// The candidate's verdict on `v`, applied to this session (its shared budget already
    /// loaded).
    fn verdict(
        rep: &mut Replica,
        set: Option<&Enforced>,
        v: &VerdictRecord,
        recorded_state: impl FnOnce(&str) -> Option<Session>,
    ) -> Outcome {
        let recorded_reason = recorded_reason(v);
        let after_divergence = rep.diverged;
        let call = ops::recorded_call(v);
        let args = recorded_args(v);
        let now = v.timestamp_ns;
        // The resource the call was decided for: its upstream (format version 8), else
        // the local one.
        let actor = set.and_then(|set| {
            rep.actor(
                set,
                v.upstream.as_deref().unwrap_or(LOCAL_UPSTREAM),
                &v.organization_id,
                &v.agent_id,
            )
        });
        let probed = replayable(
            rep,
            set,
            actor.as_deref(),
            v,
            &call,
            args.as_ref(),
            recorded_state,
        );
        let candidate = match probed {
            Ok(rng) => {
                let rules = set.map(|set| Rules {
                    set,
                    actor: actor.as_deref(),
                });
                let d = rules::decide(
                    &mut rep.session,
                    rules,
                    &call,
                    args.as_ref(),
                    v.call_number,
                    now,
                    rng,
                );
                let verdict = d.decision.verdict;
                let reason = d.reason();
                if verdict != v.verdict {
                    rep.differs.insert(v.call_number);
                }
                if verdict != v.verdict || reason != recorded_reason {
                    rep.diverged = true;
                }
                Ok((verdict, reason))
            }
            Err(why) => {
                // Not guessed: the candidate's session takes what the daemon did.
                ops::verdict_with(
                    &mut rep.session,
                    &call,
                    &ops::recorded_decision(v),
                    v.policy.clone(),
                    v.call_number,
                    now,
                );
                rep.diverged = true;
                Err(why)
            }
        };
        Outcome {
            recorded_reason,
            candidate,
            after_divergence,
        }
    }
}

/// Whether the candidate can decide `call` from what the log holds, and with which draw.
/// Pure probes ([`compose::decide`], [`tollgate_core::decide`]) on the candidate's state;
/// the decision itself is then [`rules::decide`]'s.
fn replayable(
    rep: &Replica,
    set: Option<&Enforced>,
    actor: Option<&Actor>,
    v: &VerdictRecord,
    call: &ToolCall<'_>,
    args: Option<&Value>,
    recorded_state: impl FnOnce(&str) -> Option<Session>,
) -> Result<f64, Unreplayable> {
    let s = &rep.session;
    let config = &s.policy.config;
    let probe = |rng: f64| {
        set.zip(actor).map(|(set, actor)| {
            compose::decide(
                config,
                Some(set),
                &s.state,
                call,
                Input {
                    actor,
                    args,
                    labels: &s.labels,
                },
                v.timestamp_ns,
                rng,
            )
        })
    };
    // Arguments: a policy that reads them, and none recorded. When the daemon itself
    // refused the call for want of them, it had none either: replayed exactly.
    if args.is_none() {
        let lacked = v
            .policy
            .as_ref()
            .is_some_and(|n| n.decided && n.effect == PolicyEffect::ParamsRequired);
        if let Some(policy) = set.and_then(|set| set.policies.reads_args(call.tool_name)) {
            if !lacked {
                let needs = probe(DRAW_HIGH).is_some_and(|c| {
                    matches!(
                        c.policy,
                        Some(tollgate_policy::Effect::Deny {
                            cause: tollgate_policy::DenyCause::ParamsRequired,
                            ..
                        })
                    )
                });
                if needs {
                    return Err(Unreplayable::Args {
                        policy: policy.to_string(),
                    });
                }
            }
        }
    }
    // The draw the daemon decided with, when the entry records it (format version 8,
    // a guard with the probabilistic layer on): every candidate decides with it.
    if let Some(d) = v.draw {
        return Ok(d.value());
    }
    // Else: the probabilistic layer denies when the draw is below a probability, so the
    // verdict is the same for every draw exactly when it is at both ends. A guard without
    // the layer never reads the draw.
    if !config.probabilistic_deny {
        return Ok(DRAW_HIGH);
    }
    let low = tollgate_core::decide(config, &s.state, call, v.timestamp_ns, 0.0);
    let high = tollgate_core::decide(config, &s.state, call, v.timestamp_ns, DRAW_HIGH);
    if low == high {
        return Ok(DRAW_HIGH);
    }
    // The recorded outcome fixes the draw when the candidate's guards are the recorded
    // ones on the same state, and the guards (not a policy) decided the recorded verdict:
    // the layer fired (`probabilistic`) or it did not.
    let policy_decided = v.policy.as_ref().is_some_and(|n| n.decided);
    if !policy_decided {
        if let Some(mut r) = recorded_state(&v.session_id) {
            // The spent amount is not an input of the decision (and a fleet's recorded
            // fold does not fold a shared budget's).
            r.state.budget_spent = s.state.budget_spent;
            if r.policy.digest == s.policy.digest && r.state == s.state {
                return Ok(if v.probabilistic { 0.0 } else { DRAW_HIGH });
            }
        }
    }
    // Else only when the policies decide the same whatever the draw.
    match (probe(0.0), probe(DRAW_HIGH)) {
        (Some(a), Some(b)) if a.verdict == b.verdict && a.reason() == b.reason() => Ok(DRAW_HIGH),
        _ => Err(Unreplayable::Draw),
    }
}

/// `recorded` plus the candidate's difference `delta`, at least 0 (within the order a
/// fleet's chains give, the candidate's own fold never goes below 0).
fn plus(recorded: Money, delta: i128) -> Money {
    let v = (i128::from(recorded.0) + delta).clamp(0, i128::from(i64::MAX));
    Money(i64::try_from(v).unwrap_or(i64::MAX))
}

/// Run `f` on `rep` for a recorded entry that found the budget at `before` and left it at
/// `after` ([`recorded_amounts`]), with its shared budget loaded as the candidate has it
/// there (the recorded amount plus the candidate's difference), and store the budget and
/// the difference back.
fn with_budget<R>(
    budgets: &mut HashMap<BudgetKey, Shared>,
    rep: &mut Replica,
    (before, after): (Money, Money),
    f: impl FnOnce(&mut Replica) -> R,
) -> R {
    if let Some(b) = rep.shared.as_ref().and_then(|k| budgets.get_mut(k)) {
        b.budget.remaining = plus(before, b.delta);
        b.budget.load_into(&mut rep.session.state);
    }
    let r = f(rep);
    if let Some(b) = rep.shared.as_ref().and_then(|k| budgets.get_mut(k)) {
        b.budget = Budget::of(&rep.session.state);
        b.delta = i128::from(b.budget.remaining.0) - i128::from(after.0);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{BudgetScope, GuardConfig, Money, Ratio};

    fn guard(jitter_ppm: u32) -> GuardConfig {
        GuardConfig {
            budget: Money(1_000_000_000),
            probabilistic_deny: true,
            deny_jitter_ratio: Ratio::from_ppm(jitter_ppm),
            ..GuardConfig::default()
        }
    }

    /// A session under `guard(500_000)`: a large call, then two small ones below 20% of
    /// the budget, decided with the draws 0.9 (the layer does not fire) and 0.1 (it does);
    /// each verdict records its draw (format version 8).
    fn log() -> Vec<Event> {
        let policy = Arc::new(Policy::new(guard(500_000)));
        let meta = SessionMeta {
            session_id: "s".into(),
            agent_id: "a".into(),
            organization_id: "o".into(),
            budget_scope: BudgetScope::PerSession,
            created_at_ns: 1,
        };
        let mut s = Session::new(meta, policy, 1);
        let mut out = vec![Event::Session(ops::open(&mut s, 1).into())];
        for (n, (cost, rng)) in [(850_000_000, 0.5), (10_000_000, 0.9), (10_000_000, 0.1)]
            .into_iter()
            .enumerate()
        {
            let n = n as u64 + 1;
            let call = ToolCall {
                tool_name: "t",
                params: Params::digest(Digest([n as u8; 32])),
                nonce: None,
                estimated_cost: Money(cost),
                raw_params: None,
            };
            let d = rules::decide(&mut s, None, &call, None, n, 10 + n as i64, rng);
            out.push(Event::Session(d.record.into()));
        }
        out
    }

    /// The same log as an older version wrote it: no draw recorded.
    fn log_without_draws() -> Vec<Event> {
        let mut events = log();
        for e in &mut events {
            if let Event::Session(SessionEvent::Verdict(v)) = e {
                assert!(v.draw.is_some(), "the guard has the layer on: {v:?}");
                v.draw = None;
            }
        }
        events
    }

    fn replay_of(events: &[Event], jitter_ppm: u32) -> Vec<Outcome> {
        let mut r = Replay::new(Candidate {
            default_guard: Arc::new(Policy::new(guard(jitter_ppm))),
            agent_guards: HashMap::new(),
            set: None,
        });
        events
            .iter()
            .enumerate()
            .filter_map(|(i, e)| r.fold(i as u64, e).unwrap())
            .collect()
    }

    fn replay(jitter_ppm: u32) -> Vec<Outcome> {
        replay_of(&log_without_draws(), jitter_ppm)
    }

    /// With the draws recorded (format version 8), a candidate with other guards decides
    /// with the very draws: the 0.1 draw fires under a jitter of 0.6 too, and the 0.9 one
    /// does not; under a jitter of 0.05 neither fires (a DENY->ALLOW flip), all replayed.
    #[test]
    fn recorded_draws_replay_every_candidate_deterministically() {
        let verdicts = |jitter| -> Vec<Verdict> {
            replay_of(&log(), jitter)
                .into_iter()
                .map(|o| o.candidate.unwrap().0)
                .collect()
        };
        assert_eq!(
            verdicts(600_000),
            [Verdict::Allow, Verdict::Allow, Verdict::Deny]
        );
        assert_eq!(
            verdicts(50_000),
            [Verdict::Allow, Verdict::Allow, Verdict::Allow]
        );
        // A log without them: the same candidates cannot be replayed.
        assert_eq!(replay(600_000)[2].candidate, Err(Unreplayable::Draw));
    }

    /// A fleet's void holds its session's place and changes nothing: the session's next
    /// entry folds after it, and every verdict replays as recorded.
    #[test]
    fn a_void_holds_its_place_in_a_fleet_fold() {
        let mut events = log();
        // Entry 3 (the session's place 3) never committed: a void holds it, and the
        // later entry's place moves up by one.
        let Event::Session(SessionEvent::Verdict(mut last)) = events.pop().unwrap() else {
            panic!()
        };
        let void = Event::Void(tollgate_audit::VoidRecord {
            timestamp_ns: last.timestamp_ns,
            session_id: "s".into(),
            session_seq: last.session_seq,
            chain_id: "c".into(),
            reason: tollgate_audit::VoidRecord::UNCONFIRMED_AT_SETTLE.into(),
            budget_version: 0,
            budget_before: Money::ZERO,
            budget_after: Money::ZERO,
            revert_version: 0,
        });
        last.session_seq += 1;
        events.push(void);
        events.push(Event::Session(SessionEvent::Verdict(last)));
        let mut r = Replay::fleet(Candidate {
            default_guard: Arc::new(Policy::new(guard(500_000))),
            agent_guards: HashMap::new(),
            set: None,
        });
        let outcomes: Vec<Outcome> = events
            .iter()
            .enumerate()
            .filter_map(|(i, e)| r.fold(i as u64, e).unwrap())
            .collect();
        assert_eq!(outcomes.len(), 3);
        assert!(
            outcomes
                .iter()
                .all(|o| o.candidate.as_ref().is_ok_and(|c| c.1 == o.recorded_reason)),
            "{outcomes:?}"
        );
        // The same entries without the void do not fold (place 4 after place 2).
        let mut r = Replay::fleet(Candidate {
            default_guard: Arc::new(Policy::new(guard(500_000))),
            agent_guards: HashMap::new(),
            set: None,
        });
        let folded: Result<Vec<_>, _> = events
            .iter()
            .filter(|e| !matches!(e, Event::Void(_)))
            .enumerate()
            .map(|(i, e)| r.fold(i as u64, e))
            .collect();
        assert!(folded.is_err());
    }

    #[test]
    fn the_recorded_outcome_fixes_an_unrecorded_draw_only_for_the_same_guards_on_the_same_state() {
        let recorded: Vec<_> = log_without_draws()
            .into_iter()
            .filter_map(|e| match e {
                Event::Session(SessionEvent::Verdict(v)) => Some((v.verdict, v.probabilistic)),
                _ => None,
            })
            .collect();
        assert_eq!(
            recorded,
            [
                (Verdict::Allow, false),
                (Verdict::Allow, false),
                (Verdict::Deny, true)
            ],
            "the log has a draw that did not fire and one that did"
        );
        // The same guards: both draw-dependent verdicts are replayed, as recorded.
        let same = replay(500_000);
        assert!(same.iter().all(|o| o.candidate.is_ok()), "{same:?}");
        let verdicts: Vec<Verdict> = same
            .iter()
            .map(|o| o.candidate.as_ref().unwrap().0)
            .collect();
        assert_eq!(verdicts, [Verdict::Allow, Verdict::Allow, Verdict::Deny]);
        // Other guards: the draw is not known, so neither is the verdict: counted.
        let other = replay(600_000);
        assert!(other[0].candidate.is_ok(), "{other:?}");
        assert_eq!(other[1].candidate, Err(Unreplayable::Draw));
        assert_eq!(other[2].candidate, Err(Unreplayable::Draw));
        assert!(other[2].after_divergence);
    }
}
