//! `Guard`: library mode. The same decision core, in process, with local state and an
//! optional local audit log. For a single agent without a daemon (SP/1.0 model A).
//!
//! Every change goes through the same functions the daemon uses (`tollgate_store::ops`),
//! so a local audit log records exactly what a daemon's would: the session's opening with
//! its policy, every verdict, every settlement and every human decision, and it folds
//! back into the guard's state.
//!
//! With a Cedar policy set ([`Guard::with_policies`], issue 18) every call is decided by
//! `tollgate_store::rules::decide`, the very function the daemon's service core calls:
//! the same set, session and call give the same verdict, reason (`policy:<id>`, ...),
//! flow labels and audit entries in library mode as over the socket.

use std::sync::{Arc, Mutex, PoisonError};

use tollgate_audit::{Appended, PolicySetCause, SessionEvent};
use tollgate_core::json::{self, Value};
use tollgate_core::signals::has_error_signal;
use tollgate_core::transition::HumanDecisionRefused;
use tollgate_core::{
    Decision, DenyReason, GuardConfig, HumanDecision, Money, Params, SessionState, Successor,
    ToolCall, Verdict,
};
use tollgate_policy::compose::Enforced;
use tollgate_policy::{Actor, LOCAL_UPSTREAM};
use tollgate_store::rules::{self, Rules};
use tollgate_store::{ops, Policy, Session, SessionMeta};

use crate::util::{now_ns, random_draw, random_nonce};

/// A decision for one call, with the call number to report its outcome under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The decision.
    pub decision: Decision,
    /// The call's number in this guard's session.
    pub call_number: u64,
    /// The nonce the call was checked with (re-dispatch a human-approved call with it).
    pub nonce: u64,
    /// The session's remaining budget right after this verdict was applied (read under
    /// the same lock, so another thread's call cannot come in between).
    pub budget_remaining: Money,
    /// The verdict's reason string, as the daemon sends it: the deciding policy's
    /// (`policy:<id>`, `policy_default_deny`, ...) when a policy decided, else the guards'
    /// (`allow`, `budget_exhausted`, ...).
    pub reason: String,
    /// What a person reads when a policy decided the verdict (`refused by policy
    /// `no-shell``, ...); `None` when the guards decided.
    pub policy_explanation: Option<String>,
}

impl Checked {
    /// Whether the tool may run.
    pub fn allowed(&self) -> bool {
        self.decision.verdict == Verdict::Allow
    }
}

/// What settling a call's reported cost did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    /// What the call was charged.
    pub charged: Money,
    /// Budget remaining after the settlement.
    pub remaining: Money,
    /// Whether the reported cost was unreadable (NaN, infinite or negative): it was
    /// charged as the estimate.
    pub cost_unreadable: bool,
    /// Whether the settlement is in the audit log (always true without one). False only
    /// when the log could not take it; the state is settled regardless.
    pub audited: bool,
}

/// An in-process guard over one session.
pub struct Guard {
    session: Mutex<Session>,
    /// The local audit log, and the writer's generation when the guard opened its
    /// session there.
    audit: Option<(tollgate_audit::Writer, u64)>,
    /// The policy set in force, if any.
    rules: Option<GuardRules>,
    /// What the audit log's verdicts record of the params ([`Guard::with_params`]).
    params: tollgate_audit::params::Recorder,
}

/// A guard's policy set and its session's principal in it, per upstream (the resource:
/// [`LOCAL_UPSTREAM`] for [`Guard::check`]; the MCP gateway names the tool's upstream).
/// Actors are built once per upstream (building Cedar's entities costs more than most
/// evaluations), outside the session's lock.
struct GuardRules {
    set: Arc<Enforced>,
    /// The session's organization and agent ids (the principal's).
    organization_id: String,
    agent_id: String,
    actors: Mutex<Vec<(String, Arc<Actor>)>>,
}

/// The most upstreams a guard keeps a principal for; beyond it, one is built per call.
const MAX_CACHED_ACTORS: usize = 64;

impl GuardRules {
    /// The set, with the principal for [`LOCAL_UPSTREAM`] built now when the ids allow
    /// one (else every call fails closed).
    fn new(set: Arc<Enforced>, who: &SessionMeta) -> GuardRules {
        let rules = GuardRules {
            set,
            organization_id: who.organization_id.clone(),
            agent_id: who.agent_id.clone(),
            actors: Mutex::new(Vec::new()),
        };
        let _ = rules.actor(LOCAL_UPSTREAM);
        rules
    }

    /// The principal for calls to tools of `upstream`; `None` when a name is too long
    /// for one (the call then fails closed).
    fn actor(&self, upstream: &str) -> Option<Arc<Actor>> {
        let lock = || self.actors.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, a)) = lock().iter().find(|(u, _)| u == upstream) {
            return Some(a.clone());
        }
        let actor = Arc::new(self.set.policies.actor(
            &self.organization_id,
            &self.agent_id,
            upstream,
        )?);
        let mut actors = lock();
        if actors.len() < MAX_CACHED_ACTORS {
            actors.push((upstream.to_owned(), actor.clone()));
        }
        Some(actor)
    }
}

/// Why a policy set cannot be put in force on a guard.
#[derive(Debug, thiserror::Error)]
pub enum GuardPolicyError {
    /// The guard's organization or agent id is too long for the policies' principal
    /// (at most `tollgate_policy::model::MAX_NAME_BYTES` bytes each).
    #[error("organization and agent ids are too long for the policies' principal")]
    Names,
    /// The set's policy-set entry could not be written to the guard's audit log, so it
    /// decides nothing.
    #[error("policy set not recorded in the audit log: {0}")]
    NotRecorded(#[from] tollgate_audit::WriteError),
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

impl Default for AuditIdentity {
    fn default() -> Self {
        AuditIdentity {
            session_id: "local".into(),
            agent_id: "local".into(),
            organization_id: "local".into(),
        }
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").finish_non_exhaustive()
    }
}

fn open_session(
    config: GuardConfig,
    who: AuditIdentity,
    policy_set: Option<tollgate_core::Digest>,
) -> (Session, SessionEvent) {
    let now = now_ns();
    let policy = Arc::new(Policy::new(config));
    let meta = SessionMeta {
        session_id: who.session_id,
        agent_id: who.agent_id,
        organization_id: who.organization_id,
        budget_scope: policy.config.budget_scope,
        created_at_ns: now,
    };
    let mut session = Session::new(meta, policy, now);
    session.policy_set = policy_set;
    let record = ops::open(&mut session, now);
    (session, record.into())
}

impl Guard {
    /// A guard with a fresh session under `config`, named `local` (session, agent and
    /// organization).
    pub fn new(config: GuardConfig) -> Guard {
        Guard::new_as(config, AuditIdentity::default())
    }

    /// A guard with a fresh session under `config`, named `who`: the policies' principal
    /// is `Agent::"ORG/AGENT"` of these ids, with or without an audit log (which
    /// [`Guard::with_audit`] then opens under its own identity).
    pub fn new_as(config: GuardConfig, who: AuditIdentity) -> Guard {
        let (session, _) = open_session(config, who, None);
        Guard {
            session: Mutex::new(session),
            audit: None,
            rules: None,
            params: tollgate_audit::params::Recorder::hash_only(),
        }
    }

    /// Enforce a Cedar policy set (`tollgate_policy::files::enforced` loads one from a
    /// `[policy]` section) from the next call on: every call is then decided by the
    /// guards and the policies together, as the daemon decides it. With an audit log
    /// the set's policy-set entry (record kind 9) is written, durably, first; call
    /// [`Guard::with_audit`] after this one to have the session's opening name the set
    /// too. A guard with a set already in force has it replaced.
    pub fn with_policies(self, set: Enforced) -> Result<Guard, GuardPolicyError> {
        let set = Arc::new(set);
        let rules = GuardRules::new(set.clone(), &self.lock().meta);
        if rules.actor(LOCAL_UPSTREAM).is_none() {
            return Err(GuardPolicyError::Names);
        }
        if let Some((writer, _)) = &self.audit {
            writer
                .submit_policy_set(rules::set_record(&set, PolicySetCause::Start, now_ns()))
                .wait()?;
        } else {
            // Nothing is logged yet: the session, as the next `with_audit` opens it,
            // names the set.
            self.lock().policy_set = Some(set.policies.digest());
        }
        Ok(Guard {
            rules: Some(rules),
            ..self
        })
    }

    /// The policy set in force, if any.
    pub fn policies(&self) -> Option<&Enforced> {
        self.rules.as_ref().map(|r| &*r.set)
    }

    /// Whether the set in force refuses every call of `upstream`'s `tool` by this guard's
    /// principal, whatever the arguments and the session
    /// ([`tollgate_policy::Policies::denies_unconditionally`]: the MCP gateway leaves such
    /// tools out of `tools/list`). False without a set; true for a principal the set
    /// cannot name (every call of it is refused).
    pub fn denies_unconditionally(&self, upstream: &str, tool: &str) -> bool {
        self.rules.as_ref().is_some_and(|r| {
            r.actor(upstream).is_none_or(|actor| {
                r.set
                    .policies
                    .denies_unconditionally(&actor, tool)
                    .is_some()
            })
        })
    }

    /// Also write every change to a local audit log, durably, before returning: the
    /// session is opened anew under `who`, and its session-opened entry is written now
    /// (after the policy-set entry of the set in force, if any, which the opening names).
    /// Call before the first check.
    pub fn with_audit(
        self,
        writer: tollgate_audit::Writer,
        who: AuditIdentity,
    ) -> Result<Guard, tollgate_audit::WriteError> {
        let config = self.lock().policy.config.clone();
        let set = self.rules.as_ref().map(|r| r.set.clone());
        let (session, opened) =
            open_session(config, who, set.as_ref().map(|s| s.policies.digest()));
        // The principal is the new identity's; ids the policies cannot name (longer than
        // `tollgate_policy::model::MAX_NAME_BYTES`) fail closed on every call.
        let rules = set.map(|set| GuardRules::new(set, &session.meta));
        let generation = writer
            .generation()
            .map_err(tollgate_audit::WriteError::Failed)?;
        if let Some(r) = &rules {
            writer
                .submit_policy_set(rules::set_record(&r.set, PolicySetCause::Start, now_ns()))
                .wait()?;
        }
        writer.submit_at(opened, generation).wait()?;
        Ok(Guard {
            session: Mutex::new(session),
            audit: Some((writer, generation)),
            rules,
            params: self.params.clone(),
        })
    }

    /// What the audit log's verdicts record of each call's params, as the daemon's
    /// `[audit] params` (docs/audit-format.md, "Recorded params"): the hash only (the
    /// default), the canonical JSON, or that JSON with secrets redacted. Only with an
    /// audit log ([`Guard::with_audit`]).
    pub fn with_params(self, recorder: tollgate_audit::params::Recorder) -> Guard {
        Guard {
            params: recorder,
            ..self
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Session> {
        self.session.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Submit `event`, while the session's lock is held (so entries reach the log in the
    /// order of the changes), at the writer's generation when the guard opened: once an
    /// entry has failed and the writer recovered, the guard's state holds a change the
    /// log lost, and no later entry of this guard is written (every later call is a
    /// DENY; open a new guard). `None` without a log.
    fn submit(&self, event: SessionEvent) -> Option<tollgate_audit::Pending<Appended>> {
        self.audit
            .as_ref()
            .map(|(w, generation)| w.submit_at(event, *generation))
    }

    /// Wait until a submitted entry is durable; true without a log.
    fn audited(pending: Option<tollgate_audit::Pending<Appended>>) -> bool {
        pending.is_none_or(|p| p.wait().is_ok())
    }

    /// Decide whether `tool` may run with `params`, and apply the verdict to the session.
    /// With an audit log, the verdict is returned only once its entry is durable; if the
    /// entry cannot be written the verdict is DENY (fail closed).
    pub fn check(&self, tool: &str, params: &Value, estimated_cost: Money) -> Checked {
        self.check_in(LOCAL_UPSTREAM, tool, params, estimated_cost, None)
    }

    /// As [`Guard::check`], with the nonce given (to re-dispatch an approved call).
    pub fn check_with_nonce(
        &self,
        tool: &str,
        params: &Value,
        estimated_cost: Money,
        nonce: u64,
    ) -> Checked {
        self.check_in(LOCAL_UPSTREAM, tool, params, estimated_cost, Some(nonce))
    }

    /// As [`Guard::check_with_nonce`], for a tool of `upstream` (the policies' resource,
    /// `Upstream::"NAME"`; the MCP gateway names the upstream a tool comes from), with a
    /// fresh random nonce when `nonce` is `None` ([`Checked::nonce`] gives it). Without a
    /// policy set the upstream changes nothing.
    pub fn check_in(
        &self,
        upstream: &str,
        tool: &str,
        params: &Value,
        estimated_cost: Money,
        nonce: Option<u64>,
    ) -> Checked {
        let nonce = nonce.unwrap_or_else(random_nonce);
        let raw = {
            let s = self.lock();
            // The params' text is only read by error amplification; write it only then.
            s.policy
                .config
                .error_amplification
                .then(|| json::to_canonical_vec(params).ok())
                .flatten()
                .and_then(|b| String::from_utf8(b).ok())
        };
        // The principal, built outside the session's lock (`None` inside: a set that
        // cannot name the caller, which `rules::decide` refuses).
        let actor = self.rules.as_ref().map(|r| r.actor(upstream));
        let call = ToolCall {
            tool_name: tool,
            params: Params::json(params),
            nonce: Some(nonce),
            estimated_cost,
            raw_params: raw.as_deref(),
        };
        // The policies read the params as `context.args` when they have a canonical form
        // (as the daemon gets them: the clients send only those).
        let digest = call.params.canonical_digest().ok();
        let args = digest.is_some().then_some(params);
        // What the log records of the params, outside the lock, with that digest: kept
        // only on an entry whose params_hash is that digest.
        let recorded = if self.audit.is_some() {
            digest.and_then(|d| Some((d, self.params.record(params)?)))
        } else {
            None
        };
        let now = now_ns();
        let (decided, call_number, pending, budget_remaining) = {
            let mut s = self.lock();
            let call_number = s.last_call_number.saturating_add(1);
            let rules = self
                .rules
                .as_ref()
                .zip(actor.as_ref())
                .map(|(r, actor)| Rules {
                    set: &r.set,
                    actor: actor.as_deref(),
                });
            let out = rules::decide(&mut s, rules, &call, args, call_number, now, random_draw());
            let said = (out.decision, out.reason(), out.policy_explanation());
            let mut record = out.record;
            record.params = recorded
                .filter(|(digest, _)| *digest == record.params_hash)
                .map(|(_, p)| p);
            // Format version 8: the upstream whose tool this is (the policies' resource),
            // so a replay decides with the same resource.
            record.upstream = tollgate_audit::recorded_upstream(upstream);
            let pending = self.submit(record.into());
            (said, call_number, pending, s.state.budget_remaining)
        };
        let (decision, reason, policy_explanation) = decided;
        let decision = if Self::audited(pending) {
            decision
        } else {
            // Not audited, not allowed.
            Decision {
                verdict: Verdict::Deny,
                deny_reason: Some(DenyReason::PolicyViolation),
                ..decision
            }
        };
        Checked {
            decision,
            call_number,
            nonce,
            budget_remaining,
            reason,
            policy_explanation,
        }
    }

    /// Report a call's actual cost (in dollars, as measured) and outcome. A cost that is
    /// not a finite, non-negative number is charged as the call's estimate (never
    /// refunded); one beyond the representable range drains the budget.
    pub fn post_exec(
        &self,
        call_number: u64,
        actual_cost_usd: f64,
        error_message: Option<&str>,
    ) -> Settlement {
        let (out, pending) = {
            let mut s = self.lock();
            let record = ops::settle(
                &mut s,
                call_number,
                actual_cost_usd,
                error_message.is_none(),
                error_message.is_some_and(has_error_signal),
                now_ns(),
            );
            let out = Settlement {
                charged: record.charged,
                remaining: record.budget_after,
                cost_unreadable: record.cost_status != tollgate_audit::CostStatus::Readable,
                audited: false,
            };
            (out, self.submit(record.into()))
        };
        Settlement {
            audited: Self::audited(pending),
            ..out
        }
    }

    /// Record `operator`'s decision on the session's one undecided held call (refused when
    /// several are held: name one with [`Guard::decide_human_call`]).
    pub fn decide_human(
        &self,
        decision: HumanDecision,
        successor: Option<Successor>,
        operator: &str,
    ) -> Result<(), HumanDecisionRefused> {
        self.decide_human_call(None, decision, successor, operator, "")
            .map(|_| ())
    }

    /// Record `operator`'s decision, with their `note` (audited), on held call
    /// `call_number` (the call number its HITL verdict carried; `None`: the session's one
    /// undecided held call). Returns the decided call's number.
    pub fn decide_human_call(
        &self,
        call_number: Option<u64>,
        decision: HumanDecision,
        successor: Option<Successor>,
        operator: &str,
        note: &str,
    ) -> Result<u64, HumanDecisionRefused> {
        let (held, pending) = {
            let mut s = self.lock();
            let record = ops::human_decision(
                &mut s,
                call_number,
                decision,
                successor,
                operator,
                note,
                now_ns(),
            )?;
            (record.call_number, self.submit(record.into()))
        };
        Self::audited(pending);
        Ok(held)
    }

    /// Expire the held call nobody decided in time (the runtime's timeout, not a person's
    /// decision): recorded as a human-decision entry whose decision is `expire` and whose
    /// operator is `tollgate`, as the daemon records its own expiries. The held call, if
    /// dispatched again, is DENIED `hitl_transition:reject`.
    pub fn expire_pending(&self) -> Result<(), HumanDecisionRefused> {
        self.expire_call(None)
    }

    /// Expire held call `call_number` (`None`: the session's one undecided held call), as
    /// [`Guard::expire_pending`] does.
    pub fn expire_call(&self, call_number: Option<u64>) -> Result<(), HumanDecisionRefused> {
        let pending = {
            let mut s = self.lock();
            let record = ops::expire(&mut s, call_number, now_ns())?;
            self.submit(record.into())
        };
        Self::audited(pending);
        Ok(())
    }

    /// A copy of the session state.
    pub fn state(&self) -> SessionState {
        self.lock().state.clone()
    }

    /// A copy of the whole session (policy, version, call numbering).
    pub fn session(&self) -> Session {
        self.lock().clone()
    }
}
