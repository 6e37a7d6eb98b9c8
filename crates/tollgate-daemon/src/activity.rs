//! What the audit log says lately, for operators' consoles: each live session's last calls
//! (tool, verdict, reason, cost, what was charged) and the human decisions on held calls
//! (operator, decision, tool, note, the successor of a modify), searchable.
//!
//! The audit log is the daemon's record; this is an index of its recent part, bounded and
//! in memory, fed from the log itself: the entries read from the log's tail when the daemon
//! starts (so the history survives restarts), then every entry the writer reports durable
//! (its tap). Nothing is fed that is not in the log, in the log's order. Arguments are not
//! in the log (only their hashes), and the daemon never writes them to disk: the index
//! keeps a modify's two argument documents only while this daemon knows them (in memory,
//! [`Activity::keep_change`]), so after a restart a modify shows its two digests alone.
//!
//! A fleet daemon's log is in PostgreSQL and is not tapped: its index is not
//! [`available`](Activity::available), and consoles are told so.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tollgate_audit::{Committed, Event, SessionEvent};
use tollgate_core::{Digest, HitlMode, HumanDecision, Money, PendingTransition, Reason};
use tollgate_proto::control::{ActivityCall, ActivityResponse, HistoryEntry, HistoryResponse};
use tollgate_proto::sp1::ErrorCode;
use tollgate_store::{Session, SessionStore};

use crate::service::{lock, refuse, Caller, Refusal, Service};

/// The longest history query read, in bytes.
pub const MAX_QUERY_BYTES: usize = 256;
/// The most history entries in one answer.
pub const MAX_HISTORY_ANSWER: usize = 200;

/// Decisions kept, newest last.
pub const MAX_DECISIONS: usize = 10_000;
/// Calls kept per session, newest last.
pub const CALLS_PER_SESSION: usize = 50;
/// Sessions whose calls are kept (the least recently active beyond this are forgotten).
pub const MAX_SESSIONS: usize = 2_048;
/// The most bytes of modify arguments (original and successor) kept, all told.
pub const MAX_CHANGE_BYTES: usize = 8 * 1024 * 1024;
/// The longest purpose kept, in bytes (longer ones are cut at a character boundary).
pub const MAX_PURPOSE_BYTES: usize = 256;
/// The most log entries read at start (the newest; older ones are not in the index).
pub const START_ENTRIES: u64 = 200_000;

/// One call of a session, from its verdict entry and, once reported, its settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallLine {
    /// The call's number.
    pub call_number: u64,
    /// Its tool.
    pub tool_name: String,
    /// `ALLOW`, `DENY` or `HITL`.
    pub verdict: &'static str,
    /// The reason string the agent was sent: the stable reason, or for a verdict a
    /// policy decided its policy note's (`policy:<id>`, ...).
    pub reason: String,
    /// Its estimated cost, nano-dollars.
    pub estimated_cost_nanos: i64,
    /// What it was charged once settled (`None` until its cost is reported).
    pub charged_nanos: Option<i64>,
    /// When it was decided.
    pub at_ns: i64,
    /// The operator whose decision released it.
    pub operator_id: Option<String>,
}

/// One human decision (or expiry) on a held call, from its kind-6 entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionLine {
    /// The entry's chain index.
    pub index: u64,
    /// When it was recorded.
    pub at_ns: i64,
    /// The session's organization.
    pub organization_id: String,
    /// The session's agent.
    pub agent_id: String,
    /// The session.
    pub session_id: String,
    /// The held call's number.
    pub call_number: u64,
    /// The held call's tool.
    pub tool_name: String,
    /// Who decided (`tollgate` for an expiry).
    pub operator_id: String,
    /// The decision word.
    pub decision: &'static str,
    /// The operator's note.
    pub note: String,
    /// The held call's params hash.
    pub original_args_digest: Digest,
    /// A modify's successor params hash.
    pub successor_args_digest: Option<Digest>,
}

impl DecisionLine {
    /// Whether every word of `words` (lowercase) appears in the line's operator, decision,
    /// tool, note, agent, organization or session (case-insensitive).
    pub fn matches(&self, words: &[String]) -> bool {
        if words.is_empty() {
            return true;
        }
        let hay = format!(
            "{}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.operator_id,
            self.decision,
            self.tool_name,
            self.note,
            self.agent_id,
            self.organization_id,
            self.session_id
        )
        .to_lowercase();
        words.iter().all(|w| hay.contains(w.as_str()))
    }
}

#[derive(Debug, Default)]
struct SessionLog {
    calls: VecDeque<CallLine>,
    /// When it was last fed (the index's own counter), for forgetting the least recently
    /// active.
    touched: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// Entries with an index below this were fed.
    next_index: u64,
    /// While the log's tail is read at start, what the tap reports waits here.
    loading: bool,
    waiting: Vec<Committed>,
    sessions: HashMap<String, SessionLog>,
    clock: u64,
    decisions: VecDeque<DecisionLine>,
    /// A modify's arguments (original, successor) by session and held call, while known.
    changes: HashMap<(String, u64), (Option<String>, String)>,
    change_order: VecDeque<(String, u64)>,
    change_bytes: usize,
    /// Agents' stated purposes: by session (registration), and by held call (its tags).
    purposes: HashMap<String, String>,
    call_purposes: HashMap<(String, u64), String>,
}

/// The index. See the module documentation.
#[derive(Debug, Default)]
pub struct Activity {
    inner: Mutex<Inner>,
    available: AtomicBool,
}

/// `text` cut to at most `max` bytes at a character boundary, with control characters
/// dropped.
fn bounded(text: &str, max: usize) -> String {
    let mut out = String::new();
    for ch in text.chars().filter(|c| !c.is_control()) {
        if out.len() + ch.len_utf8() > max {
            break;
        }
        out.push(ch);
    }
    out
}

impl Activity {
    /// An index no entry is fed to (a fleet daemon's): not available.
    pub fn unavailable() -> Activity {
        Activity::default()
    }

    /// An index to be fed from the log: [`Activity::load`] at start, [`Activity::feed`]
    /// from the tap. Until `load` ends, what the tap reports waits.
    pub fn from_log() -> Activity {
        let a = Activity::default();
        a.available.store(true, Ordering::Relaxed);
        lock(&a.inner).loading = true;
        a
    }

    /// Whether the index is fed from the log.
    pub fn available(&self) -> bool {
        self.available.load(Ordering::Relaxed)
    }

    /// Read the newest entries of the log in `dir` (at most [`START_ENTRIES`], ending at
    /// `next_index`), then what the tap reported meanwhile. The log's structure is checked
    /// as it is read (links, indexes), not its signatures: `tollgate audit verify` does
    /// that. A log that cannot be read leaves the index with what the tap brings (logged).
    pub fn load(&self, dir: &std::path::Path, next_index: u64) {
        let from = next_index.saturating_sub(START_ENTRIES);
        let mut read = Vec::new();
        let result = tollgate_audit::read_tail(dir, from, None, &mut |e| {
            read.push((e.index, e.event.clone()));
            Ok(())
        });
        if let Err(e) = result {
            tracing::warn!(error = %e, "the console's history could not read the audit log; it starts empty");
        }
        let mut inner = lock(&self.inner);
        for (index, event) in read {
            inner.apply(index, &event);
        }
        inner.loading = false;
        let waiting = std::mem::take(&mut inner.waiting);
        for c in waiting {
            inner.apply(c.index, &c.event);
        }
    }

    /// Entries the writer reports durable, in chain order.
    pub fn feed(&self, batch: &[Committed]) {
        let mut inner = lock(&self.inner);
        if inner.loading {
            inner.waiting.extend(batch.iter().cloned());
            return;
        }
        for c in batch {
            inner.apply(c.index, &c.event);
        }
    }

    /// A modify's arguments, while this daemon knows them: the held call's (if known) and
    /// the successor's, canonical JSON.
    pub fn keep_change(
        &self,
        session_id: &str,
        call_number: u64,
        original: Option<String>,
        successor: String,
    ) {
        let mut inner = lock(&self.inner);
        let key = (session_id.to_owned(), call_number);
        let size = original.as_ref().map_or(0, String::len) + successor.len();
        if let Some((o, s)) = inner.changes.remove(&key) {
            inner.change_bytes -= o.map_or(0, |o| o.len()) + s.len();
            inner.change_order.retain(|k| *k != key);
        }
        while inner.change_bytes + size > MAX_CHANGE_BYTES {
            let Some(old) = inner.change_order.pop_front() else {
                break;
            };
            if let Some((o, s)) = inner.changes.remove(&old) {
                inner.change_bytes -= o.map_or(0, |o| o.len()) + s.len();
            }
        }
        if size > MAX_CHANGE_BYTES {
            return;
        }
        inner.change_bytes += size;
        inner.change_order.push_back(key.clone());
        inner.changes.insert(key, (original, successor));
    }

    /// A modify's arguments, when known.
    pub fn change(&self, session_id: &str, call_number: u64) -> Option<(Option<String>, String)> {
        lock(&self.inner)
            .changes
            .get(&(session_id.to_owned(), call_number))
            .cloned()
    }

    /// The purpose an agent stated when it registered `session_id` (empty: none).
    pub fn set_purpose(&self, session_id: &str, purpose: &str) {
        let p = bounded(purpose.trim(), MAX_PURPOSE_BYTES);
        let mut inner = lock(&self.inner);
        if p.is_empty() {
            inner.purposes.remove(session_id);
        } else if inner.purposes.len() < MAX_SESSIONS * 4 || inner.purposes.contains_key(session_id)
        {
            inner.purposes.insert(session_id.to_owned(), p);
        }
    }

    /// The purpose a held call's tags state.
    pub fn set_call_purpose(&self, session_id: &str, call_number: u64, purpose: &str) {
        let p = bounded(purpose.trim(), MAX_PURPOSE_BYTES);
        if p.is_empty() {
            return;
        }
        let mut inner = lock(&self.inner);
        if inner.call_purposes.len() < MAX_SESSIONS * 4 {
            inner
                .call_purposes
                .insert((session_id.to_owned(), call_number), p);
        }
    }

    /// The purpose shown with held call `call_number`: its own, else its session's.
    pub fn purpose(&self, session_id: &str, call_number: u64) -> Option<String> {
        let inner = lock(&self.inner);
        inner
            .call_purposes
            .get(&(session_id.to_owned(), call_number))
            .or_else(|| inner.purposes.get(session_id))
            .cloned()
    }

    /// The session's last `limit` calls, newest first.
    pub fn calls(&self, session_id: &str, limit: usize) -> Vec<CallLine> {
        lock(&self.inner)
            .sessions
            .get(session_id)
            .map(|s| s.calls.iter().rev().take(limit).cloned().collect())
            .unwrap_or_default()
    }

    /// Decisions of organizations `orgs` matching every word of `query`, older than
    /// `before_ns` (0: any), newest first, at most `limit`; and whether more match.
    pub fn decisions(
        &self,
        orgs: &[String],
        query: &str,
        before_ns: i64,
        limit: usize,
    ) -> (Vec<DecisionLine>, bool) {
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        let inner = lock(&self.inner);
        let mut out = Vec::new();
        let mut more = false;
        for d in inner.decisions.iter().rev() {
            if (before_ns != 0 && d.at_ns >= before_ns)
                || !orgs.contains(&d.organization_id)
                || !d.matches(&words)
            {
                continue;
            }
            if out.len() == limit {
                more = true;
                break;
            }
            out.push(d.clone());
        }
        (out, more)
    }
}

impl Inner {
    fn apply(&mut self, index: u64, event: &Event) {
        if index < self.next_index {
            return;
        }
        self.next_index = index + 1;
        let Event::Session(ev) = event else { return };
        self.clock += 1;
        let clock = self.clock;
        match ev {
            SessionEvent::Opened(_) => {}
            SessionEvent::Verdict(v) => {
                let log = self.session(&v.session_id, clock);
                if log.calls.len() == CALLS_PER_SESSION {
                    log.calls.pop_front();
                }
                log.calls.push_back(CallLine {
                    call_number: v.call_number,
                    tool_name: v.tool_name.clone(),
                    verdict: v.verdict.as_str(),
                    reason: v
                        .policy
                        .as_ref()
                        .and_then(tollgate_audit::PolicyNote::reason)
                        .unwrap_or_else(|| v.reason.as_str().to_owned()),
                    estimated_cost_nanos: v.estimated_cost.0,
                    charged_nanos: None,
                    at_ns: v.timestamp_ns,
                    operator_id: v.operator_id.clone(),
                });
            }
            SessionEvent::Settled(s) => {
                if let Some(log) = self.sessions.get_mut(&s.session_id) {
                    log.touched = clock;
                    if let Some(c) = log
                        .calls
                        .iter_mut()
                        .rev()
                        .find(|c| c.call_number == s.call_number)
                    {
                        c.charged_nanos = Some(s.charged.0);
                    }
                }
            }
            SessionEvent::HumanDecision(h) => {
                if self.decisions.len() == MAX_DECISIONS {
                    self.decisions.pop_front();
                }
                self.decisions.push_back(DecisionLine {
                    index,
                    at_ns: h.timestamp_ns,
                    organization_id: h.organization_id.clone(),
                    agent_id: h.agent_id.clone(),
                    session_id: h.session_id.clone(),
                    call_number: h.call_number,
                    tool_name: h.tool_name.clone(),
                    operator_id: h.operator_id.clone(),
                    decision: decision_word(&h.decision),
                    note: h.note.clone(),
                    original_args_digest: h.original_args_digest,
                    successor_args_digest: h.successor.map(|(_, d)| d),
                });
            }
            SessionEvent::Closed(c) => {
                self.sessions.remove(&c.session_id);
                self.purposes.remove(&c.session_id);
                self.call_purposes.retain(|(s, _), _| *s != c.session_id);
            }
        }
    }

    fn session(&mut self, id: &str, clock: u64) -> &mut SessionLog {
        if !self.sessions.contains_key(id) && self.sessions.len() >= MAX_SESSIONS {
            // Forget the least recently active tenth.
            let mut touched: Vec<u64> = self.sessions.values().map(|s| s.touched).collect();
            touched.sort_unstable();
            let cut = touched.get(MAX_SESSIONS / 10).copied().unwrap_or(u64::MAX);
            self.sessions.retain(|_, s| s.touched > cut);
        }
        let log = self.sessions.entry(id.to_owned()).or_default();
        log.touched = clock;
        log
    }
}

fn usd(m: Money) -> String {
    format!("${:.4}", m.to_usd())
}

impl<S: SessionStore> Service<S> {
    /// Why held call `p` of session `s` was held, in words: what the rule saw, which rule
    /// (SP/1.0 §3's numbering) and which guard setting, and where that setting is.
    pub(crate) fn held_explanation(&self, s: &Session, p: &PendingTransition) -> String {
        let g = &s.policy.config;
        let key = self
            .guard_key(&s.meta.agent_id, &s.policy.digest)
            .map_or_else(
                || {
                    "the guard this session was opened under (the configuration has changed since)"
                        .to_owned()
                },
                |k| format!("`{k}`"),
            );
        let st = &s.state;
        let pct = |ppm: u32| format!("{:.0}%", f64::from(ppm) / 10_000.0);
        match p.held_reason {
            Some(Reason::HitlAllCalls) => format!(
                "Every call of this agent waits for a human: rule 8, hitl_mode = \"{}\" in {key}.",
                g.hitl_mode.as_str()
            ),
            Some(Reason::BudgetThreshold) => {
                let left = if st.budget_initial.0 > 0 {
                    format!(
                        " ({} of {}, {:.0}%)",
                        usd(st.budget_remaining),
                        usd(st.budget_initial),
                        st.budget_remaining.0 as f64 * 100.0 / st.budget_initial.0 as f64
                    )
                } else {
                    String::new()
                };
                format!(
                    "The budget left{left} is at or below the review threshold of {}: rule 9, hitl_mode = \"{}\", hitl_budget_threshold = {} in {key}.",
                    pct(g.hitl_budget_threshold.ppm()),
                    g.hitl_mode.as_str(),
                    g.hitl_budget_threshold.to_f64()
                )
            }
            Some(Reason::BudgetOverrun) if g.hitl_mode == HitlMode::OnDeny => format!(
                "Its estimated cost ({}) is more than the budget left: instead of denying it, a human decides. Rule 5, hitl_mode = \"on_deny\" in {key}.",
                usd(p.estimated_cost)
            ),
            Some(Reason::OpaqueContext) => "Part of the call's context cannot be evaluated (an opaque value its client flagged), so no rule can judge it and it fails closed to a human: rule 10.".to_owned(),
            Some(Reason::TransitionDeferEscalate) => "It waits for a human: deferred or escalated by an operator (rule 4, the HITL transition contract).".to_owned(),
            Some(Reason::PolicyHold) => self.policy_hold_explanation(s, p),
            Some(r) => format!("Held with reason `{}` by {key}.", r.as_str()),
            None => "Why it was held was not recorded.".to_owned(),
        }
    }

    /// A policy's hold: the policy the held verdict's entry names (the activity index
    /// keeps each session's recent calls with the reason they were sent), and its `@hitl`
    /// text if the set in force still has that policy marked `@hitl`.
    fn policy_hold_explanation(&self, s: &Session, p: &PendingTransition) -> String {
        let reason = self
            .activity
            .calls(&s.meta.session_id, usize::MAX)
            .into_iter()
            .find(|c| c.call_number == p.call_number)
            .map(|c| c.reason);
        let Some(id) = reason.as_deref().and_then(|r| r.strip_prefix("policy:")) else {
            return "A `@hitl` policy of the daemon's [policy] set holds it for a human (the verdict's reason, `policy:<id>`, names the policy).".to_owned();
        };
        let text = self
            .policies()
            .and_then(|e| e.policies.hitl_message(id).map(str::to_owned))
            .filter(|t| !t.is_empty());
        match text {
            Some(t) => format!(
                "The `@hitl` policy `{id}` of the daemon's [policy] set holds it for a human: \"{t}\"."
            ),
            None => format!(
                "The `@hitl` policy `{id}` of the daemon's [policy] set holds it for a human."
            ),
        }
    }

    /// `history`: the decisions on the caller's organizations' held calls, as the audit
    /// log records them, newest first: those matching every word of `query` and older than
    /// `before_ns` (0: any), at most `limit` (0 or over [`MAX_HISTORY_ANSWER`]: that).
    pub fn history(
        &self,
        caller: &Caller,
        query: &str,
        before_ns: i64,
        limit: usize,
    ) -> Result<HistoryResponse, Refusal> {
        let Caller::Operator { organizations, .. } = caller else {
            return Err(refuse(
                ErrorCode::AuthenticationFailed,
                "message authentication failed",
            ));
        };
        if query.len() > MAX_QUERY_BYTES {
            return Err(refuse(
                ErrorCode::InvalidRequest,
                format!("query over {MAX_QUERY_BYTES} bytes"),
            ));
        }
        let limit = match limit {
            0 => MAX_HISTORY_ANSWER,
            n => n.min(MAX_HISTORY_ANSWER),
        };
        let (lines, more) = self
            .activity
            .decisions(organizations, query, before_ns, limit);
        let entries = lines
            .into_iter()
            .map(|d| {
                let change = (d.decision == "modify")
                    .then(|| self.activity.change(&d.session_id, d.call_number))
                    .flatten();
                let (params_json, successor_params_json) = match change {
                    Some((o, s)) => (o.unwrap_or_default(), s),
                    None => (String::new(), String::new()),
                };
                HistoryEntry {
                    organization_id: d.organization_id,
                    agent_id: d.agent_id,
                    session_id: d.session_id,
                    call_number: d.call_number,
                    tool_name: d.tool_name,
                    operator_id: d.operator_id,
                    decision: d.decision.to_owned(),
                    note: d.note,
                    at_ns: d.at_ns,
                    original_args_digest: d.original_args_digest.0.to_vec(),
                    successor_args_digest: d
                        .successor_args_digest
                        .map(|x| x.0.to_vec())
                        .unwrap_or_default(),
                    params_json,
                    successor_params_json,
                    audit_index: d.index,
                }
            })
            .collect();
        Ok(HistoryResponse {
            entries,
            more,
            available: self.activity.available(),
        })
    }

    /// `activity`: session `session_id`'s last calls (at most `limit`; 0 or over
    /// [`CALLS_PER_SESSION`]: that), newest first, and its agent's stated purpose, for an
    /// operator of its organization.
    pub async fn session_activity(
        &self,
        caller: &Caller,
        session_id: &str,
        limit: usize,
    ) -> Result<ActivityResponse, Refusal> {
        self.operated_session(caller, session_id).await?;
        let limit = match limit {
            0 => CALLS_PER_SESSION,
            n => n.min(CALLS_PER_SESSION),
        };
        let calls = self
            .activity
            .calls(session_id, limit)
            .into_iter()
            .map(|c| ActivityCall {
                call_number: c.call_number,
                tool_name: c.tool_name,
                verdict: c.verdict.to_owned(),
                reason: c.reason,
                estimated_cost_nanos: c.estimated_cost_nanos,
                settled: c.charged_nanos.is_some(),
                charged_nanos: c.charged_nanos.unwrap_or(0),
                at_ns: c.at_ns,
                operator_id: c.operator_id.unwrap_or_default(),
            })
            .collect();
        Ok(ActivityResponse {
            session_id: session_id.to_owned(),
            calls,
            purpose: self.activity.purpose(session_id, 0).unwrap_or_default(),
            available: self.activity.available(),
        })
    }
}

fn decision_word(d: &HumanDecision) -> &'static str {
    match d {
        HumanDecision::Approve => "approve",
        HumanDecision::Reject => "reject",
        HumanDecision::Modify => "modify",
        HumanDecision::Defer => "defer",
        HumanDecision::Escalate => "escalate",
        HumanDecision::Expire => "expire",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purposes_are_bounded_and_plain() {
        let long = "é".repeat(300);
        assert!(bounded(&long, MAX_PURPOSE_BYTES).len() <= MAX_PURPOSE_BYTES);
        assert_eq!(bounded("a\u{1b}[31mb\nc", 64), "a[31mbc");
    }

    #[test]
    fn changes_are_bounded_in_bytes() {
        let a = Activity::from_log();
        let big = "x".repeat(MAX_CHANGE_BYTES / 3);
        for n in 0..10 {
            a.keep_change("s", n, Some(big.clone()), big.clone());
        }
        assert!(lock(&a.inner).change_bytes <= MAX_CHANGE_BYTES);
        assert!(a.change("s", 9).is_some());
        assert!(a.change("s", 0).is_none());
        a.keep_change("s", 99, None, "y".repeat(MAX_CHANGE_BYTES + 1));
        assert!(a.change("s", 99).is_none());
    }
}
