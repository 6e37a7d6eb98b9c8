//! State transitions, as pure functions over `&mut SessionState` (SP/1.0 §5.3).
//!
//! `decide` never mutates state; the runtime applies exactly one of these after each
//! verdict, in the same atomic step as the decision (the store's check-and-apply).

use crate::call::ToolCall;
use crate::config::{GuardConfig, Settlement};
use crate::digest::Digest;
use crate::state::{
    HumanDecision, PendingTransition, Reservation, SessionState, SessionStatus, TransitionStatus,
    UnixNanos,
};
use crate::types::{Decision, Money, Reason, ReportedCost, Verdict};

/// Apply `decision` for `call` (numbered `call_number` in its session) to `state`.
///
/// - ALLOW: count the call, record its nonce (forgetting the oldest beyond
///   `config.nonce_window`), extend or restart its repeat run, count it in the window,
///   remember it as the last call, and reserve its estimated cost so that concurrent calls
///   cannot overspend (settling the oldest reservation at its estimate beyond
///   `config.max_reservations`). A transition release (approve, modify successor) also
///   consumes the pending transition and resumes the session.
/// - DENY: trip the circuit. Budget and counters are untouched.
/// - HITL: pause the session and, unless one is already pending, record the transition
///   a human will resolve, bound to this call's nonce and params hash.
pub fn apply_decision(
    config: &GuardConfig,
    state: &mut SessionState,
    call: &ToolCall<'_>,
    decision: &Decision,
    call_number: u64,
    now: UnixNanos,
) {
    state.last_activity_ns = now;
    match decision.verdict {
        Verdict::Allow => apply_allow(config, state, call, decision, call_number, now),
        Verdict::Deny => {
            // INVARIANT (circuit-latch): set here, cleared nowhere.
            if !state.circuit_tripped {
                state.circuit_tripped = true;
                state.circuit_trip_reason = Some(decision.reason);
                state.circuit_tripped_at_ns = now;
            }
        }
        Verdict::Hitl => {
            state.status = SessionStatus::Paused;
            let held = PendingTransition {
                original_nonce: call.nonce,
                original_args_digest: call.params.canonical_digest().ok(),
                tool_name: Some(call.tool_name.to_owned()),
                requested_at_ns: now,
                call_number,
                held_reason: Some(decision.reason),
                estimated_cost: call.estimated_cost,
                ..PendingTransition::default()
            };
            if !config.parallel_holds() {
                // SP/1.0.1: one transition; a call held while it is pending is held behind.
                if state.pending.is_none() {
                    state.pending = Some(held);
                }
            } else if call.nonce.is_some() && state.transition_for_nonce(call.nonce).is_none() {
                // The extension: a new held call gets its own transition, room permitting.
                // Room is made by forgetting the oldest refused (rejected, expired) call,
                // whose re-dispatch is then a new call; calls still awaiting a human or
                // released and not yet run are never forgotten, and beyond them a call is
                // held behind (recorded nowhere; its agent dispatches it again later).
                let cap = capacity(config.max_held_calls);
                while state.transition_count() >= cap && state.drop_oldest_refused() {}
                if state.transition_count() < cap {
                    state.push_transition(held);
                }
            } else if state.pending.is_none() {
                // A nonce-less call cannot be named by its re-dispatch: like SP/1.0.1.
                state.pending = Some(held);
            }
        }
    }
}

fn apply_allow(
    config: &GuardConfig,
    state: &mut SessionState,
    call: &ToolCall<'_>,
    decision: &Decision,
    call_number: u64,
    now: UnixNanos,
) {
    let digest = call.params.canonical_digest().ok();
    if matches!(
        decision.reason,
        Reason::TransitionApprove | Reason::TransitionModifySuccessor
    ) {
        spend_release(config, state, call);
    }
    state.total_calls = state.total_calls.saturating_add(1);
    if let Some(n) = call.nonce {
        state.seen_nonces.insert(n, capacity(config.nonce_window));
    }

    let run = if state.is_repeat(call.tool_name, digest) {
        state
            .repeat_counts
            .get(call.tool_name)
            .copied()
            .unwrap_or(0)
            .saturating_add(1)
    } else {
        1
    };
    if run == 1 {
        // Only the last allowed tool's run is ever read (rule 6 needs the same tool as the
        // last call), so a new run forgets the others: the map stays one entry long.
        state.repeat_counts.clear();
    }
    set_count(&mut state.repeat_counts, call.tool_name, run);

    if config.window_enabled() {
        let window_ns = i128::from(config.window_duration_s) * 1_000_000_000;
        if i128::from(now) >= i128::from(state.window_start_ns) + window_ns {
            state.window_start_ns = now;
            state.window_counts.clear();
        }
        let c = state
            .window_counts
            .get(call.tool_name)
            .copied()
            .unwrap_or(0);
        set_count(
            &mut state.window_counts,
            call.tool_name,
            c.saturating_add(1),
        );
    }

    if state.last_tool_name.as_deref() != Some(call.tool_name) {
        state.last_tool_name = Some(call.tool_name.to_owned());
    }
    state.last_params_hash = digest;
    // A new call's error signal arrives with its own post-exec report.
    state.last_error_signal = false;

    // Reserve the estimate. INVARIANT (budget-floor): never below zero.
    let estimated = call.estimated_cost.max(Money::ZERO);
    let deducted = estimated.min(state.budget_remaining.max(Money::ZERO));
    state.budget_remaining = state.budget_remaining.saturating_sub(deducted);
    if estimated.is_positive() || config.budget_enabled() {
        state.reservations.insert(
            call_number,
            Reservation {
                estimated,
                deducted,
            },
        );
        // Bounded: beyond the cap the oldest reservation is settled at what it took (its
        // deduction stays spent, nothing is refunded) and forgotten.
        while state.reservations.len() > capacity(config.max_reservations) {
            if let Some((_, old)) = state.reservations.pop_first() {
                state.budget_spent = state.budget_spent.saturating_add(old.deducted);
            }
        }
    }
}

/// Spend the human approval `call` is released by (an approve, or a modify's successor):
/// single use, it is gone the moment it is granted, and the session resumes when nothing
/// else is held. The ALLOW of a release does this; so does a policy's refusal of a
/// released call (issue 18: the approval was used, the call refused), which changes
/// nothing else.
pub fn spend_release(config: &GuardConfig, state: &mut SessionState, call: &ToolCall<'_>) {
    if config.parallel_holds() && call.nonce.is_some() {
        state.take_transition_for_nonce(call.nonce);
    } else {
        state.pending = None;
        state.more_pending.clear();
    }
    if state.pending.is_none() {
        state.status = SessionStatus::Active;
    }
}

/// A configured bound on remembered history, as a length (at least 1).
fn capacity(n: u32) -> usize {
    usize::try_from(n.max(1)).unwrap_or(usize::MAX)
}

fn set_count(map: &mut std::collections::BTreeMap<String, u32>, key: &str, value: u32) {
    match map.get_mut(key) {
        Some(slot) => *slot = value,
        None => {
            map.insert(key.to_owned(), value);
        }
    }
}

/// What a post-exec report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// What the call was charged.
    pub charged: Money,
    /// Whether a reservation for the call existed. A report for a call with none (never
    /// allowed, already settled, or settled at its estimate when the reservations
    /// overflowed) is still charged: spend that happened is spend, whoever forgot to ask.
    pub had_reservation: bool,
    /// The reservation's estimate (zero without one).
    pub estimated: Money,
    /// Remaining budget before the report (reservation still deducted).
    pub before: Money,
    /// Remaining budget after it.
    pub after: Money,
}

/// Settle call `call_number` against its reported `actual` cost, and note whether its
/// outcome carried an error signal (for error amplification of the next repeat; the
/// caller scans the outcome, e.g. with [`has_error_signal`](crate::signals::has_error_signal)).
///
/// The charge, with `e` the reservation's estimate (zero without one):
///
/// | reported | [`Settlement::Conservative`] | [`Settlement::Actual`] |
/// |---|---|---|
/// | `Exact(a)` | max(e, a) | a |
/// | `Unreadable` (NaN, ±∞, negative) | e | e |
/// | `OverRange` (finite, ≥ ~9.2e9 USD) | all that remains | all that remains |
///
/// So a report the core cannot read never refunds. Remaining never goes below zero
/// (INVARIANT budget-floor): a charge larger than what remains takes what remains.
pub fn apply_post_exec(
    config: &GuardConfig,
    state: &mut SessionState,
    call_number: u64,
    actual: ReportedCost,
    error_signal: bool,
    now: UnixNanos,
) -> Settled {
    state.last_activity_ns = now;
    let before = state.budget_remaining;
    let reservation = state.reservations.remove(&call_number);
    let had_reservation = reservation.is_some();
    let Reservation {
        estimated,
        deducted,
    } = reservation.unwrap_or_default();
    // Give back what the reservation took, then take the charge.
    let available = before.saturating_add(deducted).max(Money::ZERO);
    let charged = match (actual, config.settlement) {
        (ReportedCost::Exact(a), Settlement::Conservative) => estimated.max(a),
        (ReportedCost::Exact(a), Settlement::Actual) => a,
        (ReportedCost::Unreadable, _) => estimated,
        (ReportedCost::OverRange, _) => available.max(estimated),
    }
    .max(Money::ZERO);
    let after = available.saturating_sub(charged).max(Money::ZERO);
    state.budget_remaining = after;
    state.budget_spent = state.budget_spent.saturating_add(charged);
    state.last_error_signal = error_signal;
    Settled {
        charged,
        had_reservation,
        estimated,
        before,
        after,
    }
}

/// Why a human decision cannot be recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HumanDecisionRefused {
    /// The session has no pending transition.
    #[error("the session has no pending HITL transition")]
    NothingPending,
    /// The named call is not held (never held, already released, or forgotten).
    #[error("call {0} is not held")]
    NotHeld(u64),
    /// Several calls await a decision and none was named.
    #[error("{0} held calls await a decision: name the call to decide")]
    WhichCall(usize),
    /// The pending transition already has a final decision (approve, reject, modify).
    #[error("the pending transition was already decided (`{0}`)")]
    AlreadyDecided(String),
    /// MODIFY needs the successor call's nonce and params hash.
    #[error("modify needs the successor's nonce and params hash")]
    ModifyWithoutSuccessor,
    /// Only approve, reject, modify, defer and escalate can be recorded.
    #[error("`{0}` is not a decision a human can record")]
    NotADecision(String),
}

/// Whether nobody has decided `p` for good yet (awaiting, deferred or escalated).
pub fn is_undecided(p: &PendingTransition) -> bool {
    matches!(
        p.decision,
        HumanDecision::Awaiting | HumanDecision::Defer | HumanDecision::Escalate
    )
}

/// The transition of held call `call_number`, or with `None` the session's one undecided
/// transition (refused when several are), if nobody has decided it for good yet (awaiting,
/// deferred or escalated).
fn undecided(
    state: &mut SessionState,
    call_number: Option<u64>,
) -> Result<&mut PendingTransition, HumanDecisionRefused> {
    let pending = match call_number {
        Some(n) => state
            .transition_of_call_mut(n)
            .ok_or(HumanDecisionRefused::NotHeld(n))?,
        None => {
            let open = state.transitions().filter(|p| is_undecided(p)).count();
            if open > 1 {
                return Err(HumanDecisionRefused::WhichCall(open));
            }
            let only = state.transitions().position(is_undecided);
            match only {
                Some(i) => state
                    .pending
                    .iter_mut()
                    .chain(state.more_pending.iter_mut())
                    .nth(i)
                    .ok_or(HumanDecisionRefused::NothingPending)?,
                // Nothing undecided: the oldest, so a final decision is named as such.
                None => state
                    .pending
                    .as_mut()
                    .ok_or(HumanDecisionRefused::NothingPending)?,
            }
        }
    };
    if !matches!(
        pending.decision,
        HumanDecision::Awaiting | HumanDecision::Defer | HumanDecision::Escalate
    ) {
        return Err(HumanDecisionRefused::AlreadyDecided(
            pending.decision.as_str().to_owned(),
        ));
    }
    Ok(pending)
}

/// The successor a MODIFY authorizes instead of the original.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Successor {
    /// Its nonce.
    pub nonce: u64,
    /// Its canonical params hash.
    pub args_digest: Digest,
}

/// Record a human's decision on held call `call_number`'s transition (with `None`: on the
/// session's one undecided transition, refused when several are). Awaiting, deferred and
/// escalated transitions can be decided; a final decision cannot be changed. Returns the
/// decided call's number.
pub fn record_human_decision(
    state: &mut SessionState,
    call_number: Option<u64>,
    decision: HumanDecision,
    successor: Option<Successor>,
    now: UnixNanos,
) -> Result<u64, HumanDecisionRefused> {
    let pending = undecided(state, call_number)?;
    let decided = pending.call_number;
    match &decision {
        HumanDecision::Approve | HumanDecision::Defer | HumanDecision::Escalate => {
            pending.terminal_status = TransitionStatus::Pending;
        }
        HumanDecision::Reject => pending.terminal_status = TransitionStatus::Rejected,
        HumanDecision::Modify => {
            let s = successor.ok_or(HumanDecisionRefused::ModifyWithoutSuccessor)?;
            pending.successor_nonce = Some(s.nonce);
            pending.successor_args_digest = Some(s.args_digest);
            pending.terminal_status = TransitionStatus::Superseded;
        }
        HumanDecision::Awaiting | HumanDecision::Expire | HumanDecision::Unknown(_) => {
            return Err(HumanDecisionRefused::NotADecision(
                decision.as_str().to_owned(),
            ))
        }
    }
    pending.decision = decision;
    state.last_activity_ns = now;
    Ok(decided)
}

/// Expire held call `call_number` (with `None`: the session's one undecided call): nobody decided it (awaiting, deferred or escalated) in
/// time. The transition becomes a rejection whose terminal status is `expired`: the held
/// call, if dispatched again, is DENIED `hitl_transition:reject`. A transition a human
/// already approved, rejected or modified is not expired.
pub fn expire_pending(
    state: &mut SessionState,
    call_number: Option<u64>,
    now: UnixNanos,
) -> Result<u64, HumanDecisionRefused> {
    let pending = undecided(state, call_number)?;
    pending.decision = HumanDecision::Expire;
    pending.terminal_status = TransitionStatus::Expired;
    let expired = pending.call_number;
    state.last_activity_ns = now;
    Ok(expired)
}
