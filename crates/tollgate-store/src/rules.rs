//! One call decided under the SP/1.0 guards and, while a Cedar policy set is in force,
//! the policies (issue 18): [`decide`], the one function every path calls (the daemon's
//! service core for the socket and gRPC, the library `Guard`, and through it the Python
//! package and the MCP gateway), so the same set, session and call give the same verdict,
//! the same state change and the same audit entry everywhere.
//!
//! [`note`] turns the composition's result into the verdict entry's policy note (audit
//! format version 6), from which a replay folds the session's labels and knows that a
//! policy's DENY did not trip; [`set_record`] is the policy-set entry (record kind 9)
//! written when a set comes into force; [`explain`] is what a person reads.

use tollgate_audit::{
    PolicyEffect, PolicyNote, PolicySetCause, PolicySetRecord, ShadowNote, VerdictRecord,
};
use tollgate_core::json::Value;
use tollgate_core::{Decision, Digest, Params, ToolCall, UnixNanos, Verdict};
use tollgate_policy::compose::{self, Composed, Enforced, Input};
use tollgate_policy::{Actor, DefaultEffect, DenyCause, Effect};

use crate::{ops, Session};

/// The set in force and the session's principal and resource in it
/// ([`tollgate_policy::Policies::actor`], built once per session and set, outside any
/// lock: building Cedar's entities costs more than most evaluations).
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// The set.
    pub set: &'a Enforced,
    /// Who calls, and where the tool lives; `None` when the ids are too long for a
    /// principal ([`tollgate_policy::model::MAX_NAME_BYTES`]): [`decide`] then refuses
    /// the call as malformed input, never deciding it by the guards alone.
    pub actor: Option<&'a Actor>,
}

/// What [`decide`] did.
#[derive(Debug, Clone)]
pub struct Decided {
    /// The decision applied to the session (for a policy's verdict, its reason is
    /// `PolicyDeny` or `PolicyHold`; [`Decided::reason`] names the policy).
    pub decision: Decision,
    /// The verdict entry (with its policy note while a set is in force).
    pub record: VerdictRecord,
    /// A `@hitl("message")` permit's message, when one held the call.
    pub hold_message: Option<String>,
}

impl Decided {
    /// The verdict's reason string: the deciding policy's (`policy:<id>`, ...), else the
    /// guards' (`allow`, `budget_exhausted`, ...).
    pub fn reason(&self) -> String {
        self.policy_reason()
            .unwrap_or_else(|| self.decision.reason.as_str().to_owned())
    }

    /// The deciding policy's reason string, when a policy decided the verdict.
    pub fn policy_reason(&self) -> Option<String> {
        self.record.policy.as_ref().and_then(PolicyNote::reason)
    }

    /// What a person reads for a verdict a policy decided ([`explain`]); `None` when the
    /// guards decided.
    pub fn policy_explanation(&self) -> Option<String> {
        self.record
            .policy
            .as_ref()
            .filter(|n| n.decided)
            .map(|n| explain(n, self.hold_message.as_deref()))
    }
}

/// Decide `call` (numbered `call_number`, at `now`, with the random draw `rng`) for
/// `session`, apply the verdict ([`ops::verdict_with`]) and return it with its record.
/// `rules`: the policy set in force (`None`: the guards alone, exactly
/// `tollgate_core::decide`). `args`: the call's params, when the policies may read them
/// (a call without them whose tool a policy reads the arguments of is refused).
pub fn decide(
    session: &mut Session,
    rules: Option<Rules<'_>>,
    call: &ToolCall<'_>,
    args: Option<&Value>,
    call_number: u64,
    now: UnixNanos,
    rng: f64,
) -> Decided {
    // INVARIANT (policy-fail-closed): while a set is in force every call is decided with
    // it; a caller the set cannot name gets the guards' malformed-input DENY (unreadable
    // params), whoever calls this.
    let unnamed;
    let call = match rules {
        Some(Rules { actor: None, .. }) => {
            unnamed = ToolCall {
                params: Params::unreadable(),
                ..*call
            };
            &unnamed
        }
        _ => call,
    };
    let mut shadow = Vec::new();
    let (decision, note, hold_message) = match rules.and_then(|r| r.actor.map(|a| (r.set, a))) {
        Some((set, actor)) => {
            let input = Input {
                actor,
                args,
                labels: &session.labels,
            };
            let config = &session.policy.config;
            let c = compose::decide(config, Some(set), &session.state, call, input, now, rng);
            // INVARIANT (shadow-never-enforced): a shadow candidate's verdict goes into
            // the record only; the decision applied is the enforced set's, `c`.
            shadow = set
                .policies
                .shadows()
                .iter()
                .map(|s| {
                    let would = if s.applies_to(call.tool_name) {
                        let candidate = Enforced {
                            policies: s.policies().clone(),
                            trip_on_refusal: set.trip_on_refusal,
                        };
                        compose::decide(
                            config,
                            Some(&candidate),
                            &session.state,
                            call,
                            input,
                            now,
                            rng,
                        )
                    } else {
                        c.clone()
                    };
                    shadow_note(s.name(), &would)
                })
                .collect();
            let note = note(&c, set.policies.digest());
            (c.applied(), Some(note), c.hold_message().map(str::to_owned))
        }
        None => (
            tollgate_core::decide(&session.policy.config, &session.state, call, now, rng),
            None,
            None,
        ),
    };
    let mut record = ops::verdict_with(session, call, &decision, note, call_number, now);
    record.shadow = shadow;
    // Format version 8: the draw, wherever the probabilistic layer may read one (the
    // session's guard has it on), so a replay under any candidate decides with it.
    if session.policy.config.probabilistic_deny {
        record.draw = tollgate_audit::Draw::new(rng);
    }
    Decided {
        decision,
        record,
        hold_message,
    }
}

/// The policy-set entry (record kind 9) of `set`, written at `now` for `cause`.
pub fn set_record(set: &Enforced, cause: PolicySetCause, now: i64) -> PolicySetRecord {
    PolicySetRecord {
        timestamp_ns: now,
        digest: set.policies.digest(),
        policies: u32::try_from(set.policies.len()).unwrap_or(u32::MAX),
        default_deny: set.policies.default_effect() == DefaultEffect::Deny,
        trip_on_refusal: set.trip_on_refusal,
        cause,
        shadow_policies: u32::try_from(set.policies.shadow_len()).unwrap_or(u32::MAX),
        shadow_set: set.policies.is_shadow_set(),
    }
}

/// The shadow note of candidate `name` whose composition gave `would`.
pub fn shadow_note(name: &str, would: &Composed) -> ShadowNote {
    ShadowNote {
        name: name.to_owned(),
        verdict: would.verdict,
        reason: would.reason(),
        policy_id: would.policy_id().map(ToString::to_string),
    }
}

/// The verdict entry's policy note for what `c` decided under the set of digest `set`.
/// Its [`PolicyNote::reason`] is `c.reason()` whenever the policy decided (tested).
pub fn note(c: &Composed, set: Digest) -> PolicyNote {
    let (effect, policy_id) = match &c.policy {
        None => (PolicyEffect::NotEvaluated, None),
        Some(e) => (
            match e {
                Effect::Pass => PolicyEffect::Pass,
                Effect::Permit { .. } => PolicyEffect::Permit,
                Effect::Hitl { .. } => PolicyEffect::Hitl,
                Effect::DefaultDeny => PolicyEffect::DefaultDeny,
                Effect::Deny { cause, .. } => match cause {
                    DenyCause::Forbid => PolicyEffect::Forbid,
                    DenyCause::ParamsRequired => PolicyEffect::ParamsRequired,
                    DenyCause::Unrepresentable { .. } => PolicyEffect::Unrepresentable,
                    DenyCause::Error(_) => PolicyEffect::Error,
                    DenyCause::LabelLimit => PolicyEffect::LabelLimit,
                },
            },
            e.policy().map(ToString::to_string),
        ),
    };
    PolicyNote {
        set_digest: set,
        effect,
        policy_id,
        decided: c.policy_decided,
        tripped: c.policy_decided && c.verdict == Verdict::Deny && c.trips,
        labels: c.labels.clone(),
    }
}

/// What a person reads for a verdict a policy decided (the reason string names the
/// policy too); empty when no policy decided it.
pub fn explain(c: &PolicyNote, hold_message: Option<&str>) -> String {
    let id = c.policy_id.as_deref().unwrap_or_default();
    match c.effect {
        PolicyEffect::Forbid => format!("refused by policy `{id}`"),
        PolicyEffect::Hitl => match hold_message {
            Some(m) if !m.is_empty() => format!("policy `{id}` holds this call for a human: {m}"),
            _ => format!("policy `{id}` holds this call for a human"),
        },
        PolicyEffect::Error => format!("policy `{id}` failed to evaluate; the call is refused"),
        PolicyEffect::ParamsRequired => {
            format!("policy `{id}` reads the call's arguments, and none were sent (tool_params)")
        }
        PolicyEffect::Unrepresentable => {
            format!("policy `{id}` reads an argument that has no exact Cedar value")
        }
        PolicyEffect::LabelLimit => {
            format!(
                "allowing this call would give the session more than {} flow labels (policy `{id}`)",
                tollgate_core::labels::MAX_LABELS
            )
        }
        PolicyEffect::DefaultDeny => "no policy permits this call (default deny)".to_owned(),
        PolicyEffect::Pass | PolicyEffect::Permit | PolicyEffect::NotEvaluated => String::new(),
    }
}
