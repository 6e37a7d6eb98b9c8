//! `Guard`: library mode. The same decision core, in process, with local state and an
//! optional local audit log. For a single agent without a daemon (SP/1.0 model A).

use std::sync::{Mutex, PoisonError};

use tollgate_core::json::{self, Value};
use tollgate_core::{
    apply_decision, apply_post_exec, decide, record_human_decision, Decision, GuardConfig,
    HumanDecision, Money, Params, SessionState, Successor, ToolCall,
};

use crate::util::{now_ns, random_draw, random_nonce};

/// A decision for one call, with the call number to report its outcome under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// The decision.
    pub decision: Decision,
    /// The call's number in this guard's session.
    pub call_number: u64,
    /// The nonce the call was checked with (re-dispatch a human-approved call with it).
    pub nonce: u64,
}

impl Checked {
    /// Whether the tool may run.
    pub fn allowed(&self) -> bool {
        self.decision.verdict == tollgate_core::Verdict::Allow
    }
}

struct Inner {
    state: SessionState,
    next_call: u64,
}

/// An in-process guard over one session.
pub struct Guard {
    config: GuardConfig,
    inner: Mutex<Inner>,
    audit: Option<(tollgate_audit::Writer, AuditIdentity)>,
}

/// Who the local audit entries are about.
#[derive(Debug, Clone)]
pub struct AuditIdentity {
    /// Session id written to entries.
    pub session_id: String,
    /// Agent id.
    pub agent_id: String,
    /// Organization id.
    pub organization_id: String,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Guard {
    /// A guard with a fresh session under `config`.
    pub fn new(config: GuardConfig) -> Guard {
        let state = SessionState::new(config.budget, now_ns());
        Guard {
            config,
            inner: Mutex::new(Inner {
                state,
                next_call: 1,
            }),
            audit: None,
        }
    }

    /// Also write every verdict to a local audit log, durably, before returning it.
    pub fn with_audit(mut self, writer: tollgate_audit::Writer, who: AuditIdentity) -> Guard {
        self.audit = Some((writer, who));
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decide whether `tool` may run with `params`, and apply the verdict to the session.
    /// With an audit log, the verdict is returned only once its entry is durable; if the
    /// entry cannot be written the verdict is DENY (fail closed).
    pub fn check(&self, tool: &str, params: &Value, estimated_cost: Money) -> Checked {
        self.check_with_nonce(tool, params, estimated_cost, random_nonce())
    }

    /// As [`Guard::check`], with the nonce given (to re-dispatch an approved call).
    pub fn check_with_nonce(
        &self,
        tool: &str,
        params: &Value,
        estimated_cost: Money,
        nonce: u64,
    ) -> Checked {
        // The params' text is only read by error amplification; write it only then.
        let raw = self
            .config
            .error_amplification
            .then(|| json::to_canonical_vec(params).ok())
            .flatten()
            .and_then(|b| String::from_utf8(b).ok());
        let call = ToolCall {
            tool_name: tool,
            params: Params::json(params),
            nonce: Some(nonce),
            estimated_cost,
            raw_params: raw.as_deref(),
        };
        let now = now_ns();
        let (mut decision, call_number, before, after) = {
            let mut g = self.lock();
            let call_number = g.next_call;
            g.next_call += 1;
            let before = g.state.budget_remaining;
            let d = decide(&self.config, &g.state, &call, now, random_draw());
            apply_decision(&self.config, &mut g.state, &call, &d, call_number, now);
            (d, call_number, before, g.state.budget_remaining)
        };
        if let Some((writer, who)) = &self.audit {
            let record = tollgate_audit::VerdictRecord {
                timestamp_ns: now,
                session_id: who.session_id.clone(),
                agent_id: who.agent_id.clone(),
                organization_id: who.organization_id.clone(),
                call_number,
                tool_name: tool.to_owned(),
                params_hash: call.params.canonical_digest().unwrap_or_default(),
                verdict: decision.verdict,
                deny_reason: decision.deny_reason,
                reason: decision.reason,
                probabilistic: decision.probabilistic,
                budget_before: before,
                budget_after: after,
                operator_id: None,
                estimated_cost,
                nonce,
                config_digest: None,
                // Placeholder until the guard tracks session versions (format 2: >= 1).
                session_seq: 1,
            };
            if writer.append(record).is_err() {
                // Not audited, not allowed.
                decision = Decision {
                    verdict: tollgate_core::Verdict::Deny,
                    deny_reason: Some(tollgate_core::DenyReason::PolicyViolation),
                    ..decision
                };
            }
        }
        Checked {
            decision,
            call_number,
            nonce,
        }
    }

    /// Report a call's actual cost and outcome.
    pub fn post_exec(&self, call_number: u64, actual_cost: Money, error_message: Option<&str>) {
        let mut g = self.lock();
        apply_post_exec(
            &self.config,
            &mut g.state,
            call_number,
            actual_cost,
            error_message,
            now_ns(),
        );
    }

    /// Record a human's decision on the pending transition.
    pub fn decide_human(
        &self,
        decision: HumanDecision,
        successor: Option<Successor>,
    ) -> Result<(), tollgate_core::transition::HumanDecisionRefused> {
        let mut g = self.lock();
        record_human_decision(&mut g.state, decision, successor, now_ns())
    }

    /// A copy of the session state.
    pub fn state(&self) -> SessionState {
        self.lock().state.clone()
    }
}
