//! The one composition of the SP/1.0 guards and the policies: [`decide`].
//!
//! `decide(config, policy, state, call, input, now, rng)` is a pure function of its
//! arguments, like `tollgate_core::decide`, which it calls. Where policies sit in
//! SP/1.0.1's ten ordered rules:
//!
//! | order | rule | why there |
//! |---|---|---|
//! | 1-3 | malformed input, circuit open, replayed nonce | structural: a tripped circuit or a replay is refused whatever the tool |
//! | 4 | a pending HITL transition (§3.6) | the human's decision is resolved first; **if it releases the call** (approve, modify's successor), the policies are evaluated on it as an approved call: a `forbid` (or default deny) still refuses it, `@hitl` permits count as permits |
//! | **P-deny** | a policy refuses (forbid, error, params required, unrepresentable, label bound, default deny) | a rule on the tool or its arguments outranks budget and rate state: a forbidden tool is refused as forbidden even when the budget is also gone |
//! | 5-7 | budget, repeat, extensions | the guards' own refusals |
//! | **P-hitl** | a `@hitl` permit matches | a policy's hold, before the guards' holds |
//! | 8-10 | HITL always, threshold, opaque context | |
//!
//! With no policy set (`policy: None`) the result is exactly `tollgate_core::decide`'s.
//!
//! A policy's refusal does **not** trip the session's circuit unless
//! [`Enforced::trip_on_refusal`] is set: an agent that asks for a forbidden tool is told no
//! and may go on with the others. This extends SP/1.0 §5's "after DENY" rule (every DENY
//! trips) for policy refusals only; the guards' DENYs trip as before.

use tollgate_core::labels::{Label, LabelSet};
use tollgate_core::{
    decide as guards, Decision, DenyReason, GuardConfig, Reason, SessionState, ToolCall, UnixNanos,
    Verdict,
};

use crate::{Actor, Call, Effect, Policies, SessionView};

/// A policy set as a session enforces it.
#[derive(Debug, Clone)]
pub struct Enforced {
    /// The set.
    pub policies: Policies,
    /// Whether a policy's DENY trips the session's circuit (default: no).
    pub trip_on_refusal: bool,
}

/// What the policies need beyond the guards' inputs.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The principal and resource (built from the same set: see [`Policies::actor`]).
    pub actor: &'a Actor,
    /// The call's params, when the caller sent them.
    pub args: Option<&'a tollgate_core::json::Value>,
    /// The session's flow labels.
    pub labels: &'a LabelSet,
}

/// The verdict of the guards and the policies together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Composed {
    /// ALLOW, DENY or HITL.
    pub verdict: Verdict,
    /// The guards' decision alone (SP/1.0's rules).
    pub guards: Decision,
    /// The policies' effect, when they were evaluated. When it decided the verdict its
    /// reason is the verdict's ([`Composed::reason`]).
    pub policy: Option<Effect>,
    /// Whether the policy effect decided the verdict (else the guards' reason stands).
    pub policy_decided: bool,
    /// Labels to attach to the session: only for an ALLOW.
    pub labels: Vec<Label>,
    /// Whether this DENY trips the circuit.
    pub trips: bool,
}

impl Composed {
    /// The verdict's reason string: the deciding policy's (`policy:<id>`, ...), else the
    /// guards'.
    pub fn reason(&self) -> String {
        if self.policy_decided {
            if let Some(r) = self.policy.as_ref().and_then(Effect::reason) {
                return r;
            }
        }
        self.guards.reason.as_str().to_owned()
    }

    /// The policy that decided, or (for an ALLOW) the permit that let it through.
    pub fn policy_id(&self) -> Option<&crate::PolicyId> {
        self.policy.as_ref().and_then(Effect::policy)
    }

    /// The decision a runtime applies to the session's state for this verdict: the
    /// guards' when they decided; for a policy's DENY, `policy_deny` (deny reason
    /// `POLICY_VIOLATION`), applied only when it [trips](Composed::trips) (a refusal
    /// that does not trip changes no state); for a policy's HITL, `policy_hold`. The
    /// reason on the wire is [`Composed::reason`].
    pub fn applied(&self) -> Decision {
        if !self.policy_decided {
            return self.guards;
        }
        match self.verdict {
            Verdict::Deny => Decision {
                verdict: Verdict::Deny,
                deny_reason: Some(DenyReason::PolicyViolation),
                reason: Reason::PolicyDeny,
                probabilistic: false,
            },
            Verdict::Hitl => Decision {
                verdict: Verdict::Hitl,
                deny_reason: None,
                reason: Reason::PolicyHold,
                probabilistic: false,
            },
            Verdict::Allow => self.guards,
        }
    }

    /// The `@hitl("...")` text of the permit that held the call, if a policy held it.
    pub fn hold_message(&self) -> Option<&str> {
        match &self.policy {
            Some(Effect::Hitl { message, .. }) if self.policy_decided => Some(message),
            _ => None,
        }
    }

    fn guards_only(d: Decision) -> Composed {
        Composed {
            verdict: d.verdict,
            trips: d.verdict == Verdict::Deny,
            guards: d,
            policy: None,
            policy_decided: false,
            labels: Vec::new(),
        }
    }
}

/// Which of SP/1.0.1's rules a guard decision came from, as far as placing the policies
/// needs: 1-3 (structural), 4 (a transition), or later.
fn before_policies(reason: Reason) -> Option<bool> {
    use Reason as R;
    match reason {
        R::MalformedInput | R::CircuitOpen | R::DuplicateNonce | R::DuplicateResumeNoEffect => {
            Some(false)
        }
        R::TransitionApprove
        | R::TransitionModifySuccessor
        | R::TransitionReject
        | R::TransitionSupersededOriginal
        | R::TransitionTerminalNoEffect
        | R::TransitionNonceMismatch
        | R::TransitionDigestMismatch
        | R::TransitionUnboundAuthorization
        | R::TransitionUnknownDecision
        | R::TransitionDeferEscalate => Some(true),
        _ => None,
    }
}

/// Decide `call`: the guards, then the policies where the table above puts them.
#[allow(clippy::too_many_arguments)]
pub fn decide(
    config: &GuardConfig,
    policy: Option<&Enforced>,
    state: &SessionState,
    call: &ToolCall<'_>,
    input: Input<'_>,
    now: UnixNanos,
    rng: f64,
) -> Composed {
    let d = guards(config, state, call, now, rng);
    let Some(enforced) = policy else {
        return Composed::guards_only(d);
    };
    let transition = match before_policies(d.reason) {
        Some(false) => return Composed::guards_only(d),
        Some(true) => {
            if d.verdict != Verdict::Allow {
                return Composed::guards_only(d);
            }
            true
        }
        None => false,
    };
    let pcall = Call {
        tool: call.tool_name,
        args: input.args,
        cost: call.estimated_cost,
        now,
        session: SessionView {
            calls: state.total_calls,
            budget_initial: state.budget_initial,
            budget_remaining: state.budget_remaining,
            labels: input.labels,
        },
        approved: transition,
    };
    let outcome = enforced.policies.evaluate(input.actor, &pcall);
    let refuse = |effect: Effect| Composed {
        verdict: Verdict::Deny,
        guards: d,
        policy: Some(effect),
        policy_decided: true,
        labels: Vec::new(),
        trips: enforced.trip_on_refusal,
    };
    match outcome.effect {
        e @ (Effect::Deny { .. } | Effect::DefaultDeny) => refuse(e),
        // The guards' own refusals (rules 5-7) stand before a policy's hold.
        _ if d.verdict == Verdict::Deny => Composed {
            policy: Some(outcome.effect),
            ..Composed::guards_only(d)
        },
        e @ Effect::Hitl { .. } => Composed {
            verdict: Verdict::Hitl,
            guards: d,
            policy: Some(e),
            policy_decided: true,
            labels: Vec::new(),
            trips: false,
        },
        e @ (Effect::Pass | Effect::Permit { .. }) => Composed {
            verdict: d.verdict,
            labels: if d.verdict == Verdict::Allow {
                outcome.labels
            } else {
                Vec::new()
            },
            guards: d,
            policy: Some(e),
            policy_decided: false,
            trips: false,
        },
    }
}
