//! Session state: what `decide` reads and the transitions write.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::fmt;

use crate::digest::Digest;
use crate::types::{Money, Reason};

/// Nanoseconds since the Unix epoch, as stamped by the daemon (the sole time authority).
pub type UnixNanos = i64;

/// Where a session stands (SP/1.0 §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionStatus {
    /// Taking calls.
    #[default]
    Active,
    /// A HITL decision is pending.
    Paused,
    /// Ended.
    Terminated,
    /// Missed its heartbeats; calls are refused until it heartbeats again.
    Stale,
}

impl SessionStatus {
    /// The upper-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Active => "ACTIVE",
            SessionStatus::Paused => "PAUSED",
            SessionStatus::Terminated => "TERMINATED",
            SessionStatus::Stale => "STALE",
        }
    }
}

/// The human's decision on a pending transition (§3.6), after trimming and lowercasing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum HumanDecision {
    /// No human has decided yet. Resolves like `defer`: HITL, no execution.
    #[default]
    Awaiting,
    /// Release the original call, bound to its nonce and args digest.
    Approve,
    /// The original call is terminal.
    Reject,
    /// The original is superseded; only the successor may run.
    Modify,
    /// Stay pending.
    Defer,
    /// Stay pending, routed higher.
    Escalate,
    /// Nobody decided in time: the runtime expired the held call (a rejection whose
    /// terminal status is `expired`). Not a word SP/1.0 knows: [`HumanDecision::parse`]
    /// never returns it (a vector saying `expire` is an unknown decision), and a human
    /// cannot record it; only the runtime's timeout does, and the audit log says so.
    Expire,
    /// A word this implementation does not know. Never executes.
    Unknown(Box<str>),
}

impl HumanDecision {
    /// Parse a decision word, trimmed and case-insensitively. An empty word is
    /// [`HumanDecision::Awaiting`]; an unrecognized one is kept as
    /// [`HumanDecision::Unknown`] (it will DENY, never ALLOW).
    pub fn parse(text: &str) -> HumanDecision {
        let t = text.trim();
        let is = |w: &str| t.eq_ignore_ascii_case(w);
        if t.is_empty() {
            HumanDecision::Awaiting
        } else if is("approve") {
            HumanDecision::Approve
        } else if is("reject") {
            HumanDecision::Reject
        } else if is("modify") {
            HumanDecision::Modify
        } else if is("defer") {
            HumanDecision::Defer
        } else if is("escalate") {
            HumanDecision::Escalate
        } else {
            HumanDecision::Unknown(t.to_ascii_lowercase().into())
        }
    }

    /// The word.
    pub fn as_str(&self) -> &str {
        match self {
            HumanDecision::Awaiting => "",
            HumanDecision::Approve => "approve",
            HumanDecision::Reject => "reject",
            HumanDecision::Modify => "modify",
            HumanDecision::Defer => "defer",
            HumanDecision::Escalate => "escalate",
            HumanDecision::Expire => "expire",
            HumanDecision::Unknown(w) => w,
        }
    }
}

/// The status of the call a transition governs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum TransitionStatus {
    /// Not terminal: awaiting a decision or awaiting execution.
    #[default]
    Pending,
    /// Terminal: a human rejected it.
    Rejected,
    /// Terminal: a human modified it; the original can never run.
    Superseded,
    /// Terminal: the approval was used.
    Consumed,
    /// Terminal: the call ran.
    Executed,
    /// Terminal: the approval timed out.
    Expired,
    /// Terminal: the approval was withdrawn.
    Revoked,
    /// Terminal: the request was cancelled.
    Cancelled,
    /// Any other word (for example the fixtures' `consumed_on_execute`): not terminal.
    Other(Box<str>),
}

impl TransitionStatus {
    /// Parse a status word, trimmed and case-insensitively; empty is `Pending`.
    pub fn parse(text: &str) -> TransitionStatus {
        let t = text.trim();
        let is = |w: &str| t.eq_ignore_ascii_case(w);
        if t.is_empty() || is("pending") {
            TransitionStatus::Pending
        } else if is("rejected") {
            TransitionStatus::Rejected
        } else if is("superseded") {
            TransitionStatus::Superseded
        } else if is("consumed") {
            TransitionStatus::Consumed
        } else if is("executed") {
            TransitionStatus::Executed
        } else if is("expired") {
            TransitionStatus::Expired
        } else if is("revoked") {
            TransitionStatus::Revoked
        } else if is("cancelled") {
            TransitionStatus::Cancelled
        } else {
            TransitionStatus::Other(t.to_ascii_lowercase().into())
        }
    }

    /// Exactly rejected, superseded, consumed, executed, expired, revoked and cancelled.
    pub const fn is_terminal(&self) -> bool {
        !matches!(self, TransitionStatus::Pending | TransitionStatus::Other(_))
    }

    /// The word.
    pub fn as_str(&self) -> &str {
        match self {
            TransitionStatus::Pending => "pending",
            TransitionStatus::Rejected => "rejected",
            TransitionStatus::Superseded => "superseded",
            TransitionStatus::Consumed => "consumed",
            TransitionStatus::Executed => "executed",
            TransitionStatus::Expired => "expired",
            TransitionStatus::Revoked => "revoked",
            TransitionStatus::Cancelled => "cancelled",
            TransitionStatus::Other(w) => w,
        }
    }
}

impl fmt::Display for TransitionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A HITL transition awaiting resolution (§3.6): a single-use capability over one
/// specific preimage, never a permission to call the tool.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PendingTransition {
    /// What the human decided, if anything yet.
    pub decision: HumanDecision,
    /// The nonce of the call that went to a human.
    pub original_nonce: Option<u64>,
    /// The canonical params hash of that call.
    pub original_args_digest: Option<Digest>,
    /// For MODIFY: the nonce of the edited call.
    pub successor_nonce: Option<u64>,
    /// For MODIFY: the canonical params hash of the edited call.
    pub successor_args_digest: Option<Digest>,
    /// The governed call's status.
    pub terminal_status: TransitionStatus,
    /// Whether this is a re-dispatch of an already-decided transition.
    pub resume_attempt: bool,
    /// The tool the original call named (for operators; not used by `decide`).
    pub tool_name: Option<String>,
    /// The held call's own call number in its session (for operators and the audit log;
    /// not used by `decide`). Zero when unknown (a transition supplied by a vector).
    pub call_number: u64,
    /// The operator who recorded the decision, once one has (for the audit record of the
    /// call it releases; not used by `decide`).
    pub operator_id: Option<String>,
    /// Why the call was held (the HITL verdict's reason), for operators; not used by
    /// `decide`. `None` for a transition supplied by a vector.
    pub held_reason: Option<Reason>,
    /// The held call's estimated cost, for operators; not used by `decide`.
    pub estimated_cost: Money,
    /// When the HITL verdict was given.
    pub requested_at_ns: UnixNanos,
}

/// Whether a call with nonce `n` re-dispatches `p`'s held call: its original (any
/// decision but a modify) or a modify's successor.
fn binds_nonce(p: &PendingTransition, n: u64) -> bool {
    p.original_nonce == Some(n)
        || (p.decision == HumanDecision::Modify && p.successor_nonce == Some(n))
}

/// A cost reserved by an ALLOW and not yet settled by a post-exec report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reservation {
    /// The call's estimated cost.
    pub estimated: Money,
    /// What was actually taken from the remaining budget (the estimate, or less when the
    /// budget had less left, as can happen after a human approval).
    pub deducted: Money,
}

/// The nonces of a session's most recent allowed calls: a bounded window, oldest first.
///
/// SP/1.0 rule 3 refuses a call whose nonce was seen. Remembering every nonce forever
/// makes a session's state (and the cost of keeping it) grow with its history, so a
/// session keeps only its last [`GuardConfig::nonce_window`](crate::GuardConfig) allowed
/// nonces. That still refuses every replay the daemon can receive: a replayed *message*
/// carries an old call number, and call numbers must increase strictly (the MAC covers
/// them), so the daemon refuses it before `decide` runs; what the window adds is refusing
/// a *re-dispatch* of a recent call under a new call number with its old nonce (a client
/// retrying an answered call), which happens within seconds, not thousands of calls.
///
/// Membership is O(1) (a hash set beside the insertion-ordered queue); equality and the
/// encoding follow the insertion order.
#[derive(Debug, Clone, Default)]
pub struct NonceWindow {
    /// Oldest first; no duplicates.
    order: VecDeque<u64>,
    /// The same nonces, for O(1) membership.
    set: HashSet<u64>,
}

impl PartialEq for NonceWindow {
    fn eq(&self, other: &Self) -> bool {
        self.order == other.order
    }
}

impl Eq for NonceWindow {}

impl NonceWindow {
    /// An empty window.
    pub fn new() -> NonceWindow {
        NonceWindow::default()
    }

    /// Whether `n` is in the window.
    pub fn contains(&self, n: &u64) -> bool {
        self.set.contains(n)
    }

    /// Record `n` as the newest nonce (a nonce already present is left where it is), then
    /// forget the oldest until at most `capacity` remain (at least one is always kept).
    /// True if `n` was new.
    pub fn insert(&mut self, n: u64, capacity: usize) -> bool {
        let new = self.set.insert(n);
        if new {
            self.order.push_back(n);
        }
        let cap = capacity.max(1);
        while self.order.len() > cap {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        new
    }

    /// How many nonces are remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The nonces, oldest first.
    pub fn iter(&self) -> std::collections::vec_deque::Iter<'_, u64> {
        self.order.iter()
    }
}

impl FromIterator<u64> for NonceWindow {
    /// A window of these nonces in this order (later duplicates are dropped), unbounded:
    /// the capacity applies when the next nonce is inserted.
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> Self {
        let mut w = NonceWindow::new();
        for n in iter {
            if w.set.insert(n) {
                w.order.push_back(n);
            }
        }
        w
    }
}

impl From<BTreeSet<u64>> for NonceWindow {
    fn from(set: BTreeSet<u64>) -> Self {
        set.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a NonceWindow {
    type Item = &'a u64;
    type IntoIter = std::collections::vec_deque::Iter<'a, u64>;
    fn into_iter(self) -> Self::IntoIter {
        self.order.iter()
    }
}

/// One session's state (SP/1.0 §5.1, with exact money and the HITL transition).
///
/// INVARIANT (budget-floor): `budget_remaining >= 0` after every transition.
/// INVARIANT (circuit-latch): once `circuit_tripped` is set, no transition clears it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionState {
    /// Lifecycle status.
    pub status: SessionStatus,
    /// The budget the session started with.
    pub budget_initial: Money,
    /// What is left, net of outstanding reservations.
    pub budget_remaining: Money,
    /// What settled calls have been charged.
    pub budget_spent: Money,
    /// Reservations of allowed calls awaiting their post-exec report, by call number; at
    /// most [`GuardConfig::max_reservations`](crate::GuardConfig) (the oldest beyond that
    /// are settled at their estimate).
    pub reservations: BTreeMap<u64, Reservation>,
    /// Calls allowed so far.
    pub total_calls: u64,
    /// How many identical calls in a row, counting the first, for the last allowed call's
    /// tool (only that tool's run can be read by the repeat rule, so the transitions keep
    /// no other entry; vectors may supply several).
    pub repeat_counts: BTreeMap<String, u32>,
    /// Per tool: calls allowed in the current window.
    pub window_counts: BTreeMap<String, u32>,
    /// When the current window started; zero before the first windowed call.
    pub window_start_ns: UnixNanos,
    /// Whether a DENY has tripped the circuit.
    pub circuit_tripped: bool,
    /// The reason of the DENY that tripped it.
    pub circuit_trip_reason: Option<Reason>,
    /// When it tripped.
    pub circuit_tripped_at_ns: UnixNanos,
    /// Nonces of the most recent allowed calls (a bounded window; see [`NonceWindow`]).
    pub seen_nonces: NonceWindow,
    /// The last allowed call's tool.
    pub last_tool_name: Option<String>,
    /// The last allowed call's params hash; `None` when unknown, which the repeat rule
    /// reads as "the same" (fail closed).
    pub last_params_hash: Option<Digest>,
    /// Whether the last call's post-exec report carried an error signal.
    pub last_error_signal: bool,
    /// A HITL transition awaiting resolution: the session's oldest held call (SP/1.0's
    /// `pending_transition`).
    pub pending: Option<PendingTransition>,
    /// Tollgate's extension of SP/1.0.1 §3.6 (parallel held calls, on when
    /// [`GuardConfig::max_held_calls`](crate::GuardConfig) is above 1): the session's other
    /// held calls, each with its own transition, oldest first. Empty whenever `pending` is
    /// `None`; `pending` and these together are at most `max_held_calls` transitions.
    pub more_pending: Vec<PendingTransition>,
    /// When the session started (for `timeout_seconds`).
    pub started_at_ns: UnixNanos,
    /// The last call or heartbeat.
    pub last_activity_ns: UnixNanos,
}

impl SessionState {
    /// A fresh session with `budget` to spend, started at `now`.
    pub fn new(budget: Money, now: UnixNanos) -> SessionState {
        SessionState {
            budget_initial: budget,
            budget_remaining: budget,
            started_at_ns: now,
            last_activity_ns: now,
            ..SessionState::default()
        }
    }

    /// Every held call's transition, oldest first (`pending`, then `more_pending`).
    pub fn transitions(&self) -> impl Iterator<Item = &PendingTransition> {
        self.pending.iter().chain(self.more_pending.iter())
    }

    /// How many transitions the session holds.
    pub fn transition_count(&self) -> usize {
        usize::from(self.pending.is_some()) + self.more_pending.len()
    }

    /// The transition of held call `call_number`.
    pub fn transition_of_call(&self, call_number: u64) -> Option<&PendingTransition> {
        self.transitions().find(|p| p.call_number == call_number)
    }

    /// The transition of held call `call_number`, to change it.
    pub fn transition_of_call_mut(&mut self, call_number: u64) -> Option<&mut PendingTransition> {
        self.pending
            .iter_mut()
            .chain(self.more_pending.iter_mut())
            .find(|p| p.call_number == call_number)
    }

    /// The transition a call with `nonce` re-dispatches: the one held with that nonce, or
    /// the one a MODIFY gave that nonce to its successor. `None` for a call without a
    /// nonce (the extension binds held calls by nonce).
    pub fn transition_for_nonce(&self, nonce: Option<u64>) -> Option<&PendingTransition> {
        let n = nonce?;
        self.transitions().find(|p| binds_nonce(p, n))
    }

    /// The transition a call with `nonce` answers to (rule 4): with `parallel_holds`
    /// ([`GuardConfig::parallel_holds`](crate::GuardConfig::parallel_holds)) and a nonce, the
    /// held call it re-dispatches, if any; otherwise (SP/1.0.1) the one pending transition.
    pub fn answering_transition(
        &self,
        parallel_holds: bool,
        nonce: Option<u64>,
    ) -> Option<&PendingTransition> {
        if parallel_holds && nonce.is_some() {
            self.transition_for_nonce(nonce)
        } else {
            self.pending.as_ref()
        }
    }

    /// Remove the transition a call with `nonce` re-dispatches (see
    /// [`SessionState::transition_for_nonce`]), keeping the oldest remaining one in
    /// `pending`. Returns it.
    pub fn take_transition_for_nonce(&mut self, nonce: Option<u64>) -> Option<PendingTransition> {
        let n = nonce?;
        if self.pending.as_ref().is_some_and(|p| binds_nonce(p, n)) {
            let taken = self.pending.take();
            if !self.more_pending.is_empty() {
                self.pending = Some(self.more_pending.remove(0));
            }
            return taken;
        }
        let i = self.more_pending.iter().position(|p| binds_nonce(p, n))?;
        Some(self.more_pending.remove(i))
    }

    /// Add a held call's transition as the newest.
    pub fn push_transition(&mut self, p: PendingTransition) {
        if self.pending.is_none() {
            self.pending = Some(p);
        } else {
            self.more_pending.push(p);
        }
    }

    /// Remove the oldest transition whose held call can never run (rejected or expired),
    /// keeping the oldest remaining one in `pending`. True if one was removed.
    pub fn drop_oldest_refused(&mut self) -> bool {
        let refused = |p: &PendingTransition| {
            matches!(p.decision, HumanDecision::Reject | HumanDecision::Expire)
        };
        if self.pending.as_ref().is_some_and(refused) {
            self.pending = None;
            if !self.more_pending.is_empty() {
                self.pending = Some(self.more_pending.remove(0));
            }
            return true;
        }
        match self.more_pending.iter().position(refused) {
            Some(i) => {
                self.more_pending.remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether `tool` with params `digest` repeats the last allowed call. An unknown hash
    /// on either side counts as the same.
    pub fn is_repeat(&self, tool: &str, digest: Option<Digest>) -> bool {
        self.last_tool_name.as_deref() == Some(tool)
            && match (self.last_params_hash, digest) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }

    /// The repeat count `decide` sees for this call: the current run of identical calls
    /// if the call continues it, else zero. (This is the `repeat_count` of PreExecResponse.)
    pub fn repeat_count_for(&self, tool: &str, digest: Option<Digest>) -> u32 {
        if self.is_repeat(tool, digest) {
            self.repeat_counts.get(tool).copied().unwrap_or(0)
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonce_window_forgets_the_oldest() {
        let mut w = NonceWindow::new();
        for n in [5, 1, 9] {
            assert!(w.insert(n, 3));
        }
        assert!(!w.insert(1, 3), "present: not new, not moved");
        assert_eq!(w.iter().copied().collect::<Vec<_>>(), vec![5, 1, 9]);
        assert!(w.insert(7, 3));
        assert_eq!(w.iter().copied().collect::<Vec<_>>(), vec![1, 9, 7]);
        assert!(!w.contains(&5) && w.contains(&7) && w.contains(&1));
        // A capacity of zero still keeps the newest.
        assert!(w.insert(8, 0));
        assert_eq!(w.iter().copied().collect::<Vec<_>>(), vec![8]);
        assert_eq!(w.len(), 1);
        let v: NonceWindow = [3, 3, 2].into_iter().collect();
        assert_eq!(v.iter().copied().collect::<Vec<_>>(), vec![3, 2]);
        assert_ne!(
            v,
            [2, 3].into_iter().collect::<NonceWindow>(),
            "order counts"
        );
    }
}
