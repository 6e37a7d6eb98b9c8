//! Rules on one envelope at a time, and the record-set rules (unique ids, one correlation,
//! one root). From handoff-envelope.md.

use std::collections::HashMap;

use crate::index::Ctx;
use crate::model::{Approval, MessageType, Party, Status, BOARD_ACTIONS};
use crate::{Finding, RuleId};

fn each(
    ctx: &Ctx<'_>,
    out: &mut Vec<Finding>,
    rule: RuleId,
    f: impl Fn(&crate::model::Envelope) -> Option<String>,
) {
    for (i, e) in ctx.env.iter().enumerate() {
        if let Some(msg) = f(e) {
            ctx.report(out, rule, Some(i), msg);
        }
    }
}

/// HO-ROOT-PARENT: parent_task_id is null exactly when hop_count is 0.
pub fn ho_root_parent(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoRootParent, |e| {
        match (e.hop_count == 0, e.parent_task_id.is_none()) {
            (true, false) => Some("hop_count is 0 but parent_task_id is not null".into()),
            (false, true) => Some(format!(
                "parent_task_id is null but hop_count is {}",
                e.hop_count
            )),
            _ => None,
        }
    });
}

/// HO-NO-SELF-ADDRESS: source and destination are different parties, by agent id or
/// principal subject (never by role).
pub fn ho_no_self_address(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoNoSelfAddress, |e| {
        e.source
            .same(&e.destination)
            .then(|| format!("source and destination are both {}", e.source.show()))
    });
}

/// HO-NO-EXECUTION: authorized_actions holds only read, analyze, recommend, challenge and
/// escalate; the board has no execute verb.
pub fn ho_no_execution(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoNoExecution, |e| {
        (e.actions & !BOARD_ACTIONS != 0)
            .then(|| "authorized_actions grants an action beyond read, analyze, recommend, challenge, escalate".into())
    });
}

fn agent_writable(a: Approval) -> bool {
    matches!(a, Approval::NotRequired | Approval::Pending)
}

/// HO-AGENT-NO-APPROVAL: an agent-sourced envelope carries approval_state not-required or
/// pending-human-review; agents never write approved or rejected.
pub fn ho_agent_no_approval(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoAgentNoApproval, |e| {
        (!e.source.is_principal() && !agent_writable(e.approval))
            .then(|| "an agent-sourced envelope carries approved or rejected".into())
    });
}

/// HO-APPROVAL-ONLY-ON-RECORD: a principal-sourced envelope that is not a decision-record
/// carries approval_state not-required or pending-human-review.
pub fn ho_approval_only_on_record(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoApprovalOnlyOnRecord, |e| {
        (e.source.is_principal()
            && e.message_type != MessageType::DecisionRecord
            && !agent_writable(e.approval))
        .then(|| {
            format!(
                "a principal's {} carries approved or rejected; only a decision-record may",
                e.message_type.as_str()
            )
        })
    });
}

/// HO-ESCALATE-TO-PRINCIPAL: an escalate, and any envelope with status escalated, is
/// addressed to a principal.
pub fn ho_escalate_to_principal(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoEscalateToPrincipal, |e| {
        ((e.message_type == MessageType::Escalate || e.status == Status::Escalated)
            && !e.destination.is_principal())
        .then(|| {
            format!(
                "an escalation is addressed to {}, not to a principal",
                e.destination.show()
            )
        })
    });
}

fn payload_rule(ctx: &Ctx<'_>, out: &mut Vec<Finding>, rule: RuleId, mt: MessageType) {
    let Some(key) = mt.payload_key() else { return };
    each(ctx, out, rule, |e| {
        (e.message_type == mt && !e.payloads.contains(&key))
            .then(|| format!("a {} carries no `{key}` payload", mt.as_str()))
    });
}

/// HO-PAYLOAD-RETURN: a return carries a verdict.
pub fn ho_payload_return(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    payload_rule(ctx, out, RuleId::HoPayloadReturn, MessageType::Return);
}

/// HO-PAYLOAD-CHALLENGE: a challenge carries a challenge payload.
pub fn ho_payload_challenge(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    payload_rule(ctx, out, RuleId::HoPayloadChallenge, MessageType::Challenge);
}

/// HO-PAYLOAD-ESCALATE: an escalate carries an escalation.
pub fn ho_payload_escalate(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    payload_rule(ctx, out, RuleId::HoPayloadEscalate, MessageType::Escalate);
}

/// HO-PAYLOAD-DECISION-REQUEST: a decision-request carries a decision_request.
pub fn ho_payload_decision_request(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    payload_rule(
        ctx,
        out,
        RuleId::HoPayloadDecisionRequest,
        MessageType::DecisionRequest,
    );
}

/// HO-PAYLOAD-DECISION-RECORD: a decision-record carries a decision_record.
pub fn ho_payload_decision_record(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    payload_rule(
        ctx,
        out,
        RuleId::HoPayloadDecisionRecord,
        MessageType::DecisionRecord,
    );
}

/// HO-PAYLOAD-EXCLUSIVE: an envelope carries no payload of another message type; a delegate
/// carries none at all.
pub fn ho_payload_exclusive(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoPayloadExclusive, |e| {
        let own = e.message_type.payload_key();
        let foreign: Vec<&str> = e
            .payloads
            .iter()
            .copied()
            .filter(|k| Some(*k) != own)
            .collect();
        (!foreign.is_empty()).then(|| {
            format!(
                "a {} carries the payload `{}` of another message type",
                e.message_type.as_str(),
                foreign.join("`, `")
            )
        })
    });
}

/// HO-STOPPED-HAS-REASON: status stopped requires at least one stop reason.
pub fn ho_stopped_has_reason(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoStoppedHasReason, |e| {
        (e.status == Status::Stopped && e.stop_reasons == 0)
            .then(|| "status is stopped but stop_reasons is empty".into())
    });
}

/// HO-REASON-HAS-STATUS: any stop reason requires status stopped or escalated.
pub fn ho_reason_has_status(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoReasonHasStatus, |e| {
        (e.stop_reasons != 0 && !matches!(e.status, Status::Stopped | Status::Escalated))
            .then(|| "stop_reasons are declared but status is not stopped or escalated".into())
    });
}

/// HO-STOP-NOTE: declaring conflicting-instructions requires a stop_note.
pub fn ho_stop_note(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoStopNote, |e| {
        (e.stop_reasons & crate::model::stop::CONFLICTING != 0 && !e.has_stop_note)
            .then(|| "conflicting-instructions is declared without a stop_note".into())
    });
}

/// HO-BLOCK-AS-CHALLENGE: a return addressed to an agent never carries verdict block; an
/// agent's adverse finding on another agent's work travels as a challenge.
pub fn ho_block_as_challenge(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoBlockAsChallenge, |e| {
        (e.message_type == MessageType::Return
            && matches!(e.destination, Party::Agent(_))
            && e.verdict_outcome.as_deref() == Some("block"))
        .then(|| {
            format!(
                "a block verdict returned to {}; send it as a challenge",
                e.destination.show()
            )
        })
    });
}

/// HO-RETURN-EVIDENCE: a return whose verdict is not block cites at least one evidence_ref
/// not labelled inference and lists no blocking missing evidence.
pub fn ho_return_evidence(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoReturnEvidence, |e| {
        let outcome = e.verdict_outcome.as_deref()?;
        if e.message_type != MessageType::Return || outcome == "block" {
            return None;
        }
        if e.blocking_gap {
            return Some(format!("verdict {outcome} over blocking missing evidence"));
        }
        (!e.evidence_labels.iter().any(|l| l != "inference"))
            .then(|| format!("verdict {outcome} cites no evidence_ref other than inference"))
    });
}

/// HO-DESTINATION-TIER: every agent destination is a catalog agent whose execution tier is
/// static-review or read-only-runtime.
pub fn ho_destination_tier(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    each(ctx, out, RuleId::HoDestinationTier, |e| {
        let Party::Agent(id) = &e.destination else {
            return None;
        };
        match ctx.catalog.tier(id) {
            None => Some(format!("destination agent `{id}` is not in the catalog")),
            Some(t) if !t.dispatchable() => Some(format!(
                "destination agent `{id}` has execution tier {}; route a human to it with an escalate instead",
                t.as_str()
            )),
            Some(_) => None,
        }
    });
}

/// HO-UNIQUE-TASK-ID: task_id is unique within the record set.
pub fn ho_unique_task_id(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for e in ctx.env {
        *count.entry(e.task_id.as_str()).or_default() += 1;
    }
    let mut dups: Vec<(&str, usize)> = count.into_iter().filter(|(_, n)| *n > 1).collect();
    dups.sort_unstable();
    for (id, n) in dups {
        ctx.report(
            out,
            RuleId::HoUniqueTaskId,
            ctx.find(id),
            format!("task_id is used by {n} envelopes"),
        );
    }
}

/// HO-ONE-CORRELATION: every envelope shares one correlation_id (the root's, or the first
/// envelope's when there is no root).
pub fn ho_one_correlation(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    let Some(reference) = ctx.root.or(Some(0)).and_then(|i| ctx.e(i)) else {
        return;
    };
    let want = reference.correlation_id.as_str();
    each(ctx, out, RuleId::HoOneCorrelation, |e| {
        (e.correlation_id != want).then(|| {
            format!(
                "correlation_id `{}` differs from `{want}` (task `{}`)",
                e.correlation_id, reference.task_id
            )
        })
    });
}

/// HO-ONE-ROOT: exactly one envelope has hop_count 0.
pub fn ho_one_root(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    let roots: Vec<usize> = (0..ctx.env.len())
        .filter(|i| ctx.e(*i).is_some_and(|e| e.hop_count == 0))
        .collect();
    match roots.len() {
        0 => ctx.report(
            out,
            RuleId::HoOneRoot,
            None,
            "no envelope has hop_count 0".into(),
        ),
        1 => {}
        n => {
            for r in roots.iter().skip(1) {
                ctx.report(
                    out,
                    RuleId::HoOneRoot,
                    Some(*r),
                    format!("{n} envelopes have hop_count 0; this is not the first"),
                );
            }
        }
    }
}
