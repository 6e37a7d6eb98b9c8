//! `decide`: the ordered rules of SP/1.0.1 §3.2, with the seed's extension layers.

use crate::call::ToolCall;
use crate::config::{GuardConfig, HitlMode};
use crate::digest::Digest;
use crate::signals::has_error_signal;
use crate::state::{HumanDecision, PendingTransition, SessionState, UnixNanos};
use crate::types::{Decision, Reason, Verdict};

/// The `rng` argument of [`decide`] from 8 random bytes: a uniform draw in [0, 1) with 53
/// bits of precision. The core draws no randomness; callers bring the bytes.
pub fn draw_from_bytes(bytes: [u8; 8]) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let x = (u64::from_le_bytes(bytes) >> 11) as f64;
    x / 9_007_199_254_740_992.0 // 2^53
}

/// Below this remaining-budget fraction (in ppm) the probabilistic layer may deny.
const PROBABILISTIC_BELOW_PPM: u32 = 200_000;

/// Decide whether `call` may run.
///
/// Pure and total: no I/O, no clock (time is `now`), no randomness (`rng` is a draw in
/// [0, 1) used only by the probabilistic layer, which is off unless configured), no
/// allocation, and a decision for every input. The rules run in this order and the first
/// that matches decides:
///
/// 1. params not canonicalizable → DENY `policy_violation:malformed_input`
/// 2. circuit tripped → DENY `circuit_open`
/// 3. nonce seen → DENY `policy_violation:duplicate_nonce`, or
///    `policy_violation:duplicate_resume_no_effect` when the pending transition is terminal
/// 4. a pending HITL transition → resolved by §3.6, whatever it returns (with
///    `max_held_calls` above 1, only the transition of the held call the call's nonce
///    names: see [`GuardConfig::max_held_calls`])
/// 5. budget on and nothing left → DENY `budget_exhausted`;
///    5b. cost above what is left → DENY `budget_overrun` (HITL when `hitl_mode` is ON_DENY)
/// 6. the same tool and params as the last call, run at the limit → DENY
///    `max_repeat_exceeded` (the limit drops by one on an error signal, with
///    `error_amplification`)
/// 7. extensions, each off unless configured: window → `window_exceeded`; session cap →
///    `global_limit`; wall-clock timeout → `timeout`; probabilistic denial below 20%
///    budget → `budget_exhausted` flagged probabilistic
/// 8. `hitl_mode` ALWAYS → HITL `hitl_all_calls`
/// 9. ON_THRESHOLD and remaining/initial ≤ threshold → HITL `budget_threshold`
/// 10. opaque context in params → HITL `fail_closed:opaque_context`
///
/// and otherwise ALLOW `within_thresholds`.
pub fn decide(
    config: &GuardConfig,
    state: &SessionState,
    call: &ToolCall<'_>,
    now: UnixNanos,
    rng: f64,
) -> Decision {
    // Rule 1: canonicalizability.
    let digest = match call.params.canonical_digest() {
        Ok(d) => d,
        Err(_) => return Decision::of(Reason::MalformedInput),
    };

    // Rule 2: circuit breaker.
    if state.circuit_tripped {
        return Decision::of(Reason::CircuitOpen);
    }

    // The transition this call answers to. SP/1.0.1: the one pending transition, whatever
    // the call. The parallel-holds extension (`max_held_calls` above 1): the transition of
    // the held call this call's nonce re-dispatches; a call naming none is a new call (a
    // nonce-less call, which cannot name one, answers to the oldest, as in SP/1.0.1).
    let transition = state.answering_transition(config.parallel_holds(), call.nonce);

    // Rule 3: anti-replay.
    if let Some(nonce) = call.nonce {
        if state.seen_nonces.contains(&nonce) {
            let terminal = transition.is_some_and(|p| p.terminal_status.is_terminal());
            return Decision::of(if terminal {
                Reason::DuplicateResumeNoEffect
            } else {
                Reason::DuplicateNonce
            });
        }
    }

    // Rule 4: the HITL transition contract.
    if let Some(pending) = transition {
        return resolve_transition(pending, call.nonce, digest);
    }

    // Rules 5 and 5b: budget.
    let remaining = state.budget_remaining.0;
    if config.budget_enabled() {
        if remaining <= 0 {
            return Decision::of(Reason::BudgetExhausted);
        }
        let cost = call.estimated_cost.0;
        if cost > 0 && cost > remaining {
            return if config.hitl_mode == HitlMode::OnDeny {
                Decision::new(Verdict::Hitl, Reason::BudgetOverrun)
            } else {
                Decision::of(Reason::BudgetOverrun)
            };
        }
    }

    // Rule 6: repeat guard.
    if config.max_repeat_calls > 0 && state.is_repeat(call.tool_name, Some(digest)) {
        let count = state
            .repeat_counts
            .get(call.tool_name)
            .copied()
            .unwrap_or(0);
        let mut limit = config.max_repeat_calls;
        if config.error_amplification
            && (state.last_error_signal || call.raw_params.is_some_and(has_error_signal))
        {
            limit = limit.saturating_sub(1).max(1);
        }
        if count >= limit {
            return Decision::of(Reason::MaxRepeatExceeded);
        }
    }

    // Rule 7: the seed's extension layers.
    if let Some(d) = extensions(config, state, call.tool_name, now, rng) {
        return d;
    }

    // Rule 8: HITL always.
    if config.hitl_mode == HitlMode::Always {
        return Decision::of(Reason::HitlAllCalls);
    }

    // Rule 9: HITL at the budget threshold.
    if config.hitl_mode == HitlMode::OnThreshold
        && config.budget_enabled()
        && fraction_at_most(state, config.hitl_budget_threshold.ppm(), true)
    {
        return Decision::of(Reason::BudgetThreshold);
    }

    // Rule 10: opaque context fails closed.
    if call.params.has_opaque_context() {
        return Decision::of(Reason::OpaqueContext);
    }

    Decision::of(Reason::WithinThresholds)
}

/// Whether remaining / initial is at most (or, with `inclusive` false, below) `ppm`
/// parts per million, compared exactly by cross-multiplying. With no initial budget to
/// divide by, the fraction reads as zero: nothing left (fail closed).
fn fraction_at_most(state: &SessionState, ppm: u32, inclusive: bool) -> bool {
    let initial = i128::from(state.budget_initial.0);
    if initial <= 0 {
        return true;
    }
    let lhs = i128::from(state.budget_remaining.0) * 1_000_000;
    let rhs = i128::from(ppm) * initial;
    if inclusive {
        lhs <= rhs
    } else {
        lhs < rhs
    }
}

/// remaining / initial as a float in [0, 1] (zero with no initial budget).
fn fraction(state: &SessionState) -> f64 {
    let initial = state.budget_initial.0;
    if initial <= 0 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss)]
    let f = state.budget_remaining.0 as f64 / initial as f64;
    f.clamp(0.0, 1.0)
}

fn extensions(
    config: &GuardConfig,
    state: &SessionState,
    tool: &str,
    now: UnixNanos,
    rng: f64,
) -> Option<Decision> {
    if config.window_enabled() {
        let window_ns = i128::from(config.window_duration_s) * 1_000_000_000;
        let expired = i128::from(now) >= i128::from(state.window_start_ns) + window_ns;
        let count = if expired {
            0
        } else {
            state.window_counts.get(tool).copied().unwrap_or(0)
        };
        if count >= config.window_max_calls {
            return Some(Decision::of(Reason::WindowExceeded));
        }
    }
    if config.max_total_calls > 0 && state.total_calls >= config.max_total_calls {
        return Some(Decision::of(Reason::GlobalLimit));
    }
    if config.timeout_seconds > 0 {
        let elapsed = i128::from(now) - i128::from(state.started_at_ns);
        if elapsed >= i128::from(config.timeout_seconds) * 1_000_000_000 {
            return Some(Decision::of(Reason::Timeout));
        }
    }
    if config.probabilistic_deny
        && config.budget_enabled()
        && fraction_at_most(state, PROBABILISTIC_BELOW_PPM, false)
    {
        let probability = config.deny_jitter_ratio.to_f64() * (1.0 - fraction(state));
        if rng < probability {
            let mut d = Decision::of(Reason::BudgetExhausted);
            d.probabilistic = true;
            return Some(d);
        }
    }
    None
}

/// §3.6, step by step. `nonce` and `digest` are the call's.
fn resolve_transition(p: &PendingTransition, nonce: Option<u64>, digest: Digest) -> Decision {
    // 1. Unknown decisions never execute.
    if matches!(p.decision, HumanDecision::Unknown(_)) {
        return Decision::of(Reason::TransitionUnknownDecision);
    }
    // 2. A resume of a terminal transition has no effect.
    if p.resume_attempt && p.terminal_status.is_terminal() {
        return Decision::of(Reason::DuplicateResumeNoEffect);
    }
    // 3. Reject denies; defer, escalate and "no decision yet" stay with the human.
    let (auth_nonce, auth_digest, ok_reason) = match p.decision {
        // An expiry is a rejection by the clock.
        HumanDecision::Reject | HumanDecision::Expire => {
            return Decision::of(Reason::TransitionReject)
        }
        HumanDecision::Defer | HumanDecision::Escalate | HumanDecision::Awaiting => {
            return Decision::of(Reason::TransitionDeferEscalate)
        }
        // 4. Modify authorizes only the successor; the original is superseded.
        HumanDecision::Modify => {
            if nonce.is_some() && nonce == p.original_nonce {
                return Decision::of(Reason::TransitionSupersededOriginal);
            }
            // The terminal status of a modify describes the superseded original, not the
            // successor, so it bars nothing here (§3.6 step 4 bars only an approve). This
            // opens no second use of the successor: its release clears the pending
            // transition (`apply_decision`), and the released call's nonce is recorded, so a
            // replay is refused by rule 3 before this step is reached.
            (
                p.successor_nonce,
                p.successor_args_digest,
                Reason::TransitionModifySuccessor,
            )
        }
        // 4. Approve authorizes the original, once: a terminal status (consumed, expired,
        // revoked, ...) means that one use is gone.
        HumanDecision::Approve => {
            if p.terminal_status.is_terminal() {
                return Decision::of(Reason::TransitionTerminalNoEffect);
            }
            (
                p.original_nonce,
                p.original_args_digest,
                Reason::TransitionApprove,
            )
        }
        HumanDecision::Unknown(_) => return Decision::of(Reason::TransitionUnknownDecision),
    };
    // 5. A blank cheque is refused.
    if auth_nonce.is_none() && auth_digest.is_none() {
        return Decision::of(Reason::TransitionUnboundAuthorization);
    }
    // 6. Every bound field must match.
    if auth_nonce.is_some() && auth_nonce != nonce {
        return Decision::of(Reason::TransitionNonceMismatch);
    }
    if auth_digest.is_some_and(|d| d != digest) {
        return Decision::of(Reason::TransitionDigestMismatch);
    }
    Decision::of(ok_reason)
}

#[cfg(test)]
mod tests {
    use super::draw_from_bytes;

    #[test]
    fn draws_span_the_unit_interval() {
        assert_eq!(draw_from_bytes([0; 8]), 0.0);
        let top = draw_from_bytes([0xff; 8]);
        assert!(top < 1.0 && top > 0.999_999_999);
        assert_eq!(draw_from_bytes((1u64 << 63).to_le_bytes()), 0.5);
    }
}
