//! The four changes of a session's durable state, each one audit entry, and their replay.
//!
//! A session's durable state changes only here: it is opened, a verdict is applied, a
//! post-exec report is settled, or a human decides a held call. Each function applies the
//! core's pure transition to the session, increases its version ([`Session::seq`]) by one,
//! and returns the audit record of the change: its inputs and its outcome. The live path
//! (the daemon, the in-process guard) calls these and writes the record to the audit log;
//! replay ([`replay`]) calls the *same* functions with the inputs a logged record carries
//! and requires the record they return to equal the logged one, field for field. So the
//! state is, by construction, the fold of the log, and a log that does not fold (an entry
//! out of order, an outcome that does not follow from its inputs) is caught, not absorbed.
//!
//! Budgets: for a shared (per-agent or per-organization) budget the caller loads the
//! shared amounts into `session.state` before and stores them back after, so the records
//! carry the shared budget's `budget_before`/`budget_after`.

use std::collections::HashMap;
use std::sync::Arc;

use tollgate_audit::{
    CloseReason, CloseRecord, CostStatus, DecisionRecord, PolicyNote, SessionEvent, SessionRecord,
    SettlementRecord, VerdictRecord,
};
use tollgate_core::transition::HumanDecisionRefused;
use tollgate_core::{
    apply_decision, apply_post_exec, record_human_decision, Decision, Digest, HumanDecision, Money,
    Params, Reason, ReportedCost, SessionStatus, Successor, ToolCall, UnixNanos, Verdict,
};

use crate::session::{Policy, Session, SessionMeta};

/// Open `session` (at version 0, with its starting budget already loaded): version 1.
/// The record names the policy set in force ([`Session::policy_set`], format version 6).
pub fn open(session: &mut Session, now: UnixNanos) -> SessionRecord {
    session.seq = session.seq.saturating_add(1);
    SessionRecord {
        timestamp_ns: now,
        session_id: session.meta.session_id.clone(),
        agent_id: session.meta.agent_id.clone(),
        organization_id: session.meta.organization_id.clone(),
        budget_scope: session.meta.budget_scope,
        budget_initial: session.policy.config.budget,
        budget_before: session.state.budget_remaining,
        config_digest: session.policy.digest,
        config: session.policy.json.clone(),
        session_seq: session.seq,
        // The store that writes the shared budget sets it (`set_budget_version`).
        budget_version: 0,
        policy_set: session.policy_set,
    }
}

/// Apply `decision` for `call`, numbered `call_number`, decided at `now`: the core's
/// [`apply_decision`], the session's last call number, and the record. A call that
/// releases a human-approved transition names the operator who approved it.
///
/// A nonce of 0 is no nonce, as on the wire and in the record (`nonce` 0).
pub fn verdict(
    session: &mut Session,
    call: &ToolCall<'_>,
    decision: &Decision,
    call_number: u64,
    now: UnixNanos,
) -> VerdictRecord {
    verdict_with(session, call, decision, None, call_number, now)
}

/// [`verdict`] for a call a policy set evaluated (issue 18), with its note (format
/// version 6). What the note changes:
///
/// - a policy's DENY that does not trip (`decided`, not `tripped`) changes no state but
///   the session's last activity: no circuit trip, no nonce, no count (the agent is told
///   no and may go on with its other tools); only when it refuses a call a human's
///   approval released is that approval spent (single use);
/// - a policy's DENY that trips, and a policy's HITL, are applied like the guards' (the
///   decision's reason is [`Reason::PolicyDeny`] or [`Reason::PolicyHold`]);
/// - an ALLOW adds the note's labels to the session's (the record keeps those it
///   actually added, so a log whose labels would pass the bound does not fold).
pub fn verdict_with(
    session: &mut Session,
    call: &ToolCall<'_>,
    decision: &Decision,
    policy: Option<PolicyNote>,
    call_number: u64,
    now: UnixNanos,
) -> VerdictRecord {
    let call = &ToolCall {
        nonce: call.nonce.filter(|n| *n != 0),
        ..*call
    };
    let before = session.state.budget_remaining;
    let releases = decision.verdict == Verdict::Allow
        && matches!(
            decision.reason,
            Reason::TransitionApprove | Reason::TransitionModifySuccessor
        );
    let operator_id = if releases {
        session
            .state
            .answering_transition(session.policy.config.parallel_holds(), call.nonce)
            .and_then(|p| p.operator_id.clone())
    } else {
        None
    };
    let mut policy = policy;
    let spares = decision.verdict == Verdict::Deny
        && policy.as_ref().is_some_and(|n| n.decided && !n.tripped);
    if spares {
        // INVARIANT (policy-refusal-spares): a policy's refusal that does not trip
        // changes nothing the guards read, except that a call a human's approval released
        // spends that approval (single use; the guards' rule 4, which comes before the
        // policies, says whether it is one: a pure function of the state and the call).
        let g = tollgate_core::decide(&session.policy.config, &session.state, call, now, 1.0);
        if matches!(
            g.reason,
            Reason::TransitionApprove | Reason::TransitionModifySuccessor
        ) {
            tollgate_core::transition::spend_release(
                &session.policy.config,
                &mut session.state,
                call,
            );
        }
        session.state.last_activity_ns = now;
    } else {
        apply_decision(
            &session.policy.config,
            &mut session.state,
            call,
            decision,
            call_number,
            now,
        );
    }
    if let Some(n) = policy.as_mut() {
        let added = if decision.verdict == Verdict::Allow {
            session.labels.missing(&n.labels)
        } else {
            Vec::new()
        };
        match session.labels.with(&added) {
            Ok(labels) => {
                session.labels = labels;
                n.labels = added;
            }
            Err(_) => n.labels = Vec::new(),
        }
    }
    session.last_call_number = session.last_call_number.max(call_number);
    session.seq = session.seq.saturating_add(1);
    VerdictRecord {
        timestamp_ns: now,
        session_id: session.meta.session_id.clone(),
        agent_id: session.meta.agent_id.clone(),
        organization_id: session.meta.organization_id.clone(),
        call_number,
        tool_name: call.tool_name.to_owned(),
        params_hash: call.params.canonical_digest().unwrap_or_default(),
        verdict: decision.verdict,
        deny_reason: decision.deny_reason,
        reason: decision.reason,
        probabilistic: decision.probabilistic,
        budget_before: before,
        budget_after: session.state.budget_remaining,
        operator_id,
        estimated_cost: call.estimated_cost,
        nonce: call.nonce.unwrap_or(0),
        config_digest: Some(session.policy.digest),
        session_seq: session.seq,
        // The store that writes the shared budget sets it (`set_budget_version`).
        budget_version: 0,
        policy,
        shadow: Vec::new(),
        params: None,
        // What called which upstream, and the draw: the caller's ([`crate::rules::decide`],
        // the library guard's `check_in`).
        upstream: None,
        draw: None,
    }
}

/// Settle call `call_number` against the cost the agent reported (`reported_usd`, exactly
/// as sent), with the outcome's success flag and whether it carried an error signal.
/// See [`apply_post_exec`] for the charge: a cost the core cannot read never refunds.
pub fn settle(
    session: &mut Session,
    call_number: u64,
    reported_usd: f64,
    success: bool,
    error_signal: bool,
    now: UnixNanos,
) -> SettlementRecord {
    let reported = ReportedCost::from_usd(reported_usd);
    let settled = apply_post_exec(
        &session.policy.config,
        &mut session.state,
        call_number,
        reported,
        error_signal,
        now,
    );
    session.seq = session.seq.saturating_add(1);
    SettlementRecord {
        timestamp_ns: now,
        session_id: session.meta.session_id.clone(),
        agent_id: session.meta.agent_id.clone(),
        organization_id: session.meta.organization_id.clone(),
        call_number,
        success,
        reported_cost_bits: reported_usd.to_bits(),
        cost_status: match reported {
            ReportedCost::Exact(_) => CostStatus::Readable,
            ReportedCost::Unreadable => CostStatus::Unreadable,
            ReportedCost::OverRange => CostStatus::OverRange,
        },
        actual_cost: reported.exact().unwrap_or(Money::ZERO),
        estimated_cost: settled.estimated,
        reserved: settled.had_reservation,
        charged: settled.charged,
        budget_before: settled.before,
        budget_after: settled.after,
        error_signal,
        session_seq: session.seq,
        // The store that writes the shared budget sets it (`set_budget_version`).
        budget_version: 0,
    }
}

/// The operator id an expiry is recorded under: the runtime, not a person.
pub const EXPIRY_OPERATOR: &str = "tollgate";
/// The note an expiry is recorded with.
pub const EXPIRY_NOTE: &str = "nobody decided within the HITL timeout";

/// Expire held call `call_number` (`None`: the session's one undecided call), undecided after the runtime's HITL timeout
/// ([`tollgate_core::expire_pending`]): recorded as a human-decision entry whose decision is
/// `expire` and whose operator is [`EXPIRY_OPERATOR`].
pub fn expire(
    session: &mut Session,
    call_number: Option<u64>,
    now: UnixNanos,
) -> Result<DecisionRecord, HumanDecisionRefused> {
    let call_number = tollgate_core::expire_pending(&mut session.state, call_number, now)?;
    Ok(decision_record(
        session,
        call_number,
        HumanDecision::Expire,
        None,
        EXPIRY_OPERATOR,
        EXPIRY_NOTE,
        now,
    ))
}

/// The record of a decision just applied to held call `held`'s transition.
fn decision_record(
    session: &mut Session,
    held: u64,
    decision: HumanDecision,
    successor: Option<Successor>,
    operator_id: &str,
    note: &str,
    now: UnixNanos,
) -> DecisionRecord {
    let (call_number, tool_name, original_nonce, original_args_digest) =
        match session.state.transition_of_call(held) {
            Some(p) => (
                p.call_number,
                p.tool_name.clone().unwrap_or_default(),
                p.original_nonce.unwrap_or(0),
                p.original_args_digest.unwrap_or_default(),
            ),
            // The caller applied a decision, so a transition is pending.
            None => (0, String::new(), 0, Digest::default()),
        };
    session.seq = session.seq.saturating_add(1);
    DecisionRecord {
        timestamp_ns: now,
        session_id: session.meta.session_id.clone(),
        agent_id: session.meta.agent_id.clone(),
        organization_id: session.meta.organization_id.clone(),
        call_number,
        operator_id: operator_id.to_owned(),
        decision,
        note: note.to_owned(),
        tool_name,
        original_nonce,
        original_args_digest,
        successor: successor.map(|s| (s.nonce, s.args_digest)),
        budget_remaining: session.state.budget_remaining,
        session_seq: session.seq,
    }
}

/// Record `operator_id`'s `decision` on held call `call_number` (`None`: the session's one
/// undecided call, refused when several are), with their `note`.
pub fn human_decision(
    session: &mut Session,
    call_number: Option<u64>,
    decision: HumanDecision,
    successor: Option<Successor>,
    operator_id: &str,
    note: &str,
    now: UnixNanos,
) -> Result<DecisionRecord, HumanDecisionRefused> {
    let held = record_human_decision(
        &mut session.state,
        call_number,
        decision.clone(),
        successor,
        now,
    )?;
    if let Some(p) = session.state.transition_of_call_mut(held) {
        p.operator_id = Some(operator_id.to_owned());
    }
    Ok(decision_record(
        session,
        held,
        decision,
        successor,
        operator_id,
        note,
        now,
    ))
}

/// End `session` for `reason` at `now`: its status becomes TERMINATED, for good. The store
/// that applies it ([`crate::Change::End`]) then forgets the session, and so does a fold of
/// the log; a shared budget it spent stays (it is its agent's or organization's).
pub fn close(session: &mut Session, reason: CloseReason, now: UnixNanos) -> CloseRecord {
    session.state.status = SessionStatus::Terminated;
    session.seq = session.seq.saturating_add(1);
    CloseRecord {
        timestamp_ns: now,
        session_id: session.meta.session_id.clone(),
        agent_id: session.meta.agent_id.clone(),
        organization_id: session.meta.organization_id.clone(),
        reason,
        budget_remaining: session.state.budget_remaining,
        session_seq: session.seq,
    }
}

/// Why a logged entry does not fold onto the state it follows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FoldError {
    /// The entry's session version is not the next one for its session.
    #[error("session `{session}`: entry has version {found}, expected {expected}")]
    OutOfOrder {
        /// The session.
        session: String,
        /// The version the session is at plus one.
        expected: u64,
        /// The entry's `session_seq`.
        found: u64,
    },
    /// Re-applying the entry's inputs gives a different record.
    #[error("session `{session}` version {seq}: the logged {kind} does not follow from its inputs ({what})")]
    Diverged {
        /// The session.
        session: String,
        /// The entry's version.
        seq: u64,
        /// Which kind of entry.
        kind: &'static str,
        /// The first field that differs.
        what: String,
    },
    /// The entry names a session that was never opened, or opens one twice.
    #[error("session `{session}`: {what}")]
    Session {
        /// The session.
        session: String,
        /// What is wrong.
        what: String,
    },
}

/// The identity a session opening records.
pub(crate) fn opened_meta(r: &SessionRecord) -> SessionMeta {
    SessionMeta {
        session_id: r.session_id.clone(),
        agent_id: r.agent_id.clone(),
        organization_id: r.organization_id.clone(),
        budget_scope: r.budget_scope,
        created_at_ns: r.timestamp_ns,
    }
}

/// A new session from its session-opened record: metadata, policy, fresh state at the
/// record's time, version 0 (the caller joins its budget, then calls [`open`] and compares
/// with [`check_opened`]).
pub fn session_from_record(r: &SessionRecord) -> Result<Session, FoldError> {
    let bad = |what: String| FoldError::Session {
        session: r.session_id.clone(),
        what,
    };
    let policy = Policy::from_json(&r.config).map_err(bad)?;
    if policy.digest != r.config_digest {
        return Err(bad("config_digest is not the digest of config".to_owned()));
    }
    if policy.config.budget != r.budget_initial || policy.config.budget_scope != r.budget_scope {
        return Err(bad(
            "budget_initial or budget_scope disagrees with config".to_owned()
        ));
    }
    let mut s = Session::new(opened_meta(r), Arc::new(policy), r.timestamp_ns);
    s.policy_set = r.policy_set;
    Ok(s)
}

/// After [`open`] on a session rebuilt by [`session_from_record`]: the regenerated record
/// must be the logged one.
pub fn check_opened(regenerated: &SessionRecord, logged: &SessionRecord) -> Result<(), FoldError> {
    let mut regenerated = SessionEvent::Opened(regenerated.clone());
    regenerated.set_budget_version(logged.budget_version);
    same(&regenerated, &SessionEvent::Opened(logged.clone()))
}

/// The session logged opening `r` opens, for a fold whose open sessions are `sessions`
/// (which must not hold it yet): rebuilt by [`session_from_record`], given its budget by
/// `join` (the caller's shared budget loaded into its state), opened by [`open`] and
/// checked by [`check_opened`]. The caller adds it to `sessions`.
pub fn reopen(
    sessions: &HashMap<String, Session>,
    r: &SessionRecord,
    join: impl FnOnce(&mut Session),
) -> Result<Session, FoldError> {
    if sessions.contains_key(&r.session_id) {
        return Err(opened_twice(&r.session_id));
    }
    let mut s = session_from_record(r)?;
    join(&mut s);
    let regenerated = open(&mut s, r.timestamp_ns);
    check_opened(&regenerated, r)?;
    Ok(s)
}

/// Open session `id` of a fold whose open sessions are `sessions`: a logged change of a
/// session not among them is an error.
pub fn opened<'a>(
    sessions: &'a mut HashMap<String, Session>,
    id: &str,
) -> Result<&'a mut Session, FoldError> {
    sessions.get_mut(id).ok_or_else(|| FoldError::Session {
        session: id.to_owned(),
        what: "an entry for a session that was never opened".to_owned(),
    })
}

fn opened_twice(session: &str) -> FoldError {
    FoldError::Session {
        session: session.to_owned(),
        what: "opened twice".to_owned(),
    }
}

/// Replay one logged change (a verdict, settlement or human decision) onto `session`,
/// which holds everything up to the version before it (shared budget loaded). Session
/// openings are replayed by the caller ([`session_from_record`], [`open`]).
pub fn replay(session: &mut Session, event: &SessionEvent) -> Result<(), FoldError> {
    let expected = session.seq.saturating_add(1);
    if event.session_seq() != expected || event.session_id() != session.meta.session_id {
        return Err(FoldError::OutOfOrder {
            session: event.session_id().to_owned(),
            expected,
            found: event.session_seq(),
        });
    }
    let mut regenerated = match event {
        SessionEvent::Opened(r) => return Err(opened_twice(&r.session_id)),
        SessionEvent::Verdict(v) => {
            let call = recorded_call(v);
            let decision = recorded_decision(v);
            let mut r = verdict_with(
                session,
                &call,
                &decision,
                v.policy.clone(),
                v.call_number,
                v.timestamp_ns,
            );
            // Format version 7: what the shadow candidates would have done and what was
            // recorded of the params change no state; they are inputs of the entry.
            r.shadow.clone_from(&v.shadow);
            r.params.clone_from(&v.params);
            // Format version 8: the upstream called and the draw the decision was made
            // with are inputs of the entry too.
            r.upstream.clone_from(&v.upstream);
            r.draw = v.draw;
            SessionEvent::Verdict(r)
        }
        SessionEvent::Settled(s) => SessionEvent::Settled(settle_logged(session, s)),
        SessionEvent::HumanDecision(d) => {
            let r = decide_logged(session, d).map_err(|e| FoldError::Diverged {
                session: d.session_id.clone(),
                seq: d.session_seq,
                kind: "human decision",
                what: e.to_string(),
            })?;
            SessionEvent::HumanDecision(r)
        }
        SessionEvent::Closed(c) => SessionEvent::Closed(close(session, c.reason, c.timestamp_ns)),
    };
    // The shared budget's version comes from the store that wrote the budget, not from
    // the session's state: an input of the entry, like its time.
    regenerated.set_budget_version(event.budget_version());
    same(&regenerated, event)
}

/// [`settle`] with the inputs logged settlement `s` carries.
pub fn settle_logged(session: &mut Session, s: &SettlementRecord) -> SettlementRecord {
    settle(
        session,
        s.call_number,
        f64::from_bits(s.reported_cost_bits),
        s.success,
        s.error_signal,
        s.timestamp_ns,
    )
}

/// [`expire`] or [`human_decision`], as logged human decision `d` says, with the inputs it
/// carries.
pub fn decide_logged(
    session: &mut Session,
    d: &DecisionRecord,
) -> Result<DecisionRecord, HumanDecisionRefused> {
    let successor = d
        .successor
        .map(|(nonce, args_digest)| Successor { nonce, args_digest });
    // The record names the held call it decided.
    let held = Some(d.call_number);
    if d.decision == HumanDecision::Expire {
        expire(session, held, d.timestamp_ns)
    } else {
        human_decision(
            session,
            held,
            d.decision.clone(),
            successor,
            &d.operator_id,
            &d.note,
            d.timestamp_ns,
        )
    }
}

fn kind_name(e: &SessionEvent) -> &'static str {
    match e {
        SessionEvent::Opened(_) => "session opening",
        SessionEvent::Verdict(_) => "verdict",
        SessionEvent::Settled(_) => "settlement",
        SessionEvent::HumanDecision(_) => "human decision",
        SessionEvent::Closed(_) => "session closing",
    }
}

fn same(regenerated: &SessionEvent, logged: &SessionEvent) -> Result<(), FoldError> {
    if regenerated == logged {
        return Ok(());
    }
    // Name what differs by comparing the debug forms field by field (a cold path).
    let a = format!("{regenerated:?}");
    let b = format!("{logged:?}");
    let what = a
        .split(", ")
        .zip(b.split(", "))
        .find(|(x, y)| x != y)
        .map_or_else(
            || "records differ".to_owned(),
            |(x, y)| format!("replayed {x}, logged {y}"),
        );
    Err(FoldError::Diverged {
        session: logged.session_id().to_owned(),
        seq: logged.session_seq(),
        kind: kind_name(logged),
        what,
    })
}

/// The call a verdict entry records (its params by their hash; a `malformed_input` DENY's
/// as unreadable), as a replay re-decides it.
pub(crate) fn recorded_call(v: &VerdictRecord) -> ToolCall<'_> {
    let params = if v.verdict == Verdict::Deny && v.reason == Reason::MalformedInput {
        Params::unreadable()
    } else {
        Params::digest(v.params_hash)
    };
    ToolCall {
        tool_name: &v.tool_name,
        params,
        nonce: (v.nonce != 0).then_some(v.nonce),
        estimated_cost: v.estimated_cost,
        raw_params: None,
    }
}

/// The decision a verdict entry records.
pub(crate) fn recorded_decision(v: &VerdictRecord) -> Decision {
    Decision {
        verdict: v.verdict,
        deny_reason: v.deny_reason,
        reason: v.reason,
        probabilistic: v.probabilistic,
    }
}
