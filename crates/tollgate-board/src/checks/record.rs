//! Decision-record rules (DRC-*), from decision-record.md.
//!
//! A *decider's record* names no co_signs_task_id; a *co-signing record* names the decider's
//! record it co-signs.

use std::collections::HashMap;

use crate::checks::decision::{attached, in_force, is_open};
use crate::index::Ctx;
use crate::model::{Approval, Envelope, MessageType, Party, RecordP, Status};
use crate::{Finding, RuleId};

/// Every decision-record (by message_type), with or without its payload: for the rules that
/// read only the envelope's own fields.
fn all_records<'a>(ctx: &'a Ctx<'_>) -> impl Iterator<Item = (usize, &'a Envelope)> + 'a {
    ctx.records
        .iter()
        .filter_map(move |&d| Some((d, ctx.e(d)?)))
}

/// The decision-records that carry their payload, with it (a record without one is
/// HO-PAYLOAD-DECISION-RECORD's finding).
fn records<'a>(ctx: &'a Ctx<'_>) -> impl Iterator<Item = (usize, &'a Envelope, &'a RecordP)> + 'a {
    ctx.records.iter().filter_map(move |&d| {
        let e = ctx.e(d)?;
        Some((d, e, e.record.as_ref()?))
    })
}

fn deciders<'a>(ctx: &'a Ctx<'_>) -> impl Iterator<Item = (usize, &'a Envelope, &'a RecordP)> + 'a {
    records(ctx).filter(|(_, _, p)| p.co_signs_task_id.is_none())
}

/// The decision-request a record binds, when request_task_id names one. The message_type
/// decides: a decision-request without its payload is still one (and has a digest), and an
/// envelope of another type carrying a decision_request payload is not.
fn request_of<'a>(ctx: &'a Ctx<'_>, p: &RecordP) -> Option<(usize, &'a Envelope)> {
    let r = ctx.find(&p.request_task_id)?;
    let e = ctx.e(r)?;
    (e.message_type == MessageType::DecisionRequest).then_some((r, e))
}

/// DRC-PRINCIPAL-SOURCE: a decision-record is sent by a principal (with or without its
/// payload).
pub fn drc_principal_source(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (d, e) in all_records(ctx) {
        if !e.source.is_principal() {
            ctx.report(
                out,
                RuleId::DrcPrincipalSource,
                Some(d),
                format!("decision-record sent by {}", e.source.show()),
            );
        }
    }
}

/// DRC-DECIDER-IS-SENDER: decision_record.decided_by is the record's own sender, whoever
/// sent it: decided_by is always a principal, so an agent-sent record fails here as well as
/// DRC-PRINCIPAL-SOURCE.
pub fn drc_decider_is_sender(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (d, e, p) in records(ctx) {
        if !p.decided_by.same(&e.source) {
            ctx.report(
                out,
                RuleId::DrcDeciderIsSender,
                Some(d),
                format!(
                    "decided_by is {} but the record is sent by {}",
                    p.decided_by.show(),
                    e.source.show()
                ),
            );
        }
    }
}

/// DRC-REQUEST-BINDING: request_task_id resolves to a decision-request and request_digest
/// is the sha256 of its canonical JSON.
pub fn drc_request_binding(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (d, _, p) in records(ctx) {
        match request_of(ctx, p) {
            None => ctx.report(
                out,
                RuleId::DrcRequestBinding,
                Some(d),
                format!(
                    "request_task_id `{}` is not a decision-request in the record set",
                    p.request_task_id
                ),
            ),
            Some((_, r)) => {
                if r.digest.as_deref() != Some(p.request_digest.as_str()) {
                    ctx.report(
                        out,
                        RuleId::DrcRequestBinding,
                        Some(d),
                        format!(
                            "request_digest {} does not match `{}`, whose digest is {}",
                            p.request_digest,
                            r.task_id,
                            r.digest.as_deref().unwrap_or("unknown")
                        ),
                    );
                }
            }
        }
    }
}

/// DRC-NOT-REQUESTER: neither the decider nor a named second approver is the principal who
/// opened the correlation (checked only when a principal opened it).
pub fn drc_not_requester(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    let Some(requester) = ctx
        .root
        .and_then(|r| ctx.e(r))
        .map(|r| &r.source)
        .filter(|s| s.is_principal())
    else {
        return;
    };
    for (d, _, p) in records(ctx) {
        for (what, who) in [
            ("decided_by", Some(&p.decided_by)),
            ("second_approver", p.second_approver.as_ref()),
        ] {
            if who.is_some_and(|w| w.same(requester)) {
                ctx.report(
                    out,
                    RuleId::DrcNotRequester,
                    Some(d),
                    format!("{what} is the requester {}", requester.show()),
                );
            }
        }
    }
}

/// DRC-DECIDER-IS-ADDRESSEE: a decider's record is decided by the principal the
/// decision-request was addressed to.
pub fn drc_decider_is_addressee(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (d, _, p) in deciders(ctx) {
        let Some((_, r)) = request_of(ctx, p) else {
            continue;
        };
        if !p.decided_by.same(&r.destination) {
            ctx.report(
                out,
                RuleId::DrcDeciderIsAddressee,
                Some(d),
                format!(
                    "decided by {} but `{}` was addressed to {}",
                    p.decided_by.show(),
                    r.task_id,
                    r.destination.show()
                ),
            );
        }
    }
}

/// DRC-AFTER-REQUEST: a decision-record is not sent before the decision-request it binds,
/// and that request does not descend from it.
pub fn drc_after_request(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (d, e, p) in records(ctx) {
        let Some((r, re)) = request_of(ctx, p) else {
            continue;
        };
        if e.sent_at < re.sent_at || ctx.descends(r, d) {
            ctx.report(
                out,
                RuleId::DrcAfterRequest,
                Some(d),
                format!("the record does not come after request `{}`", re.task_id),
            );
        }
    }
}

/// DRC-ONE-RECORD: a decision-request has at most one decider's record, and each decider's
/// record at most one co-signing record.
pub fn drc_one_record(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for &r in &ctx.requests {
        let ds: Vec<usize> = ctx
            .records_of
            .get(&r)
            .map(|v| {
                v.iter()
                    .copied()
                    .filter(|&d| {
                        ctx.e(d)
                            .and_then(|e| e.record.as_ref())
                            .is_some_and(|p| p.co_signs_task_id.is_none())
                    })
                    .collect()
            })
            .unwrap_or_default();
        for &extra in ds.iter().skip(1) {
            ctx.report(
                out,
                RuleId::DrcOneRecord,
                Some(extra),
                format!(
                    "a second decider's record on `{}`",
                    ctx.e(r).map_or("", |e| e.task_id.as_str())
                ),
            );
        }
    }
    for (d, e, _) in deciders(ctx) {
        let cosigners = ctx.cosigners.get(e.task_id.as_str()).map_or(0, Vec::len);
        if cosigners > 1 {
            ctx.report(
                out,
                RuleId::DrcOneRecord,
                Some(d),
                format!("co-signed by {cosigners} records"),
            );
        }
    }
}

/// DRC-COMPLETED: a decision-record has status completed (with or without its payload).
pub fn drc_completed(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (d, e) in all_records(ctx) {
        if e.status != Status::Completed {
            ctx.report(
                out,
                RuleId::DrcCompleted,
                Some(d),
                "a decision-record whose status is not completed".into(),
            );
        }
    }
}

/// DRC-SECOND-APPROVER: a decider's record sent at R5, or binding an R5 decision-request,
/// names a second approver distinct from the decider.
pub fn drc_second_approver(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (d, e, p) in deciders(ctx) {
        let r5 = e.tier == 5 || request_of(ctx, p).is_some_and(|(_, r)| r.tier == 5);
        if !r5 {
            continue;
        }
        match &p.second_approver {
            None => ctx.report(
                out,
                RuleId::DrcSecondApprover,
                Some(d),
                "an R5 decision names no second_approver".into(),
            ),
            Some(sa) if sa.same(&p.decided_by) => ctx.report(
                out,
                RuleId::DrcSecondApprover,
                Some(d),
                "the second_approver is the decider".into(),
            ),
            Some(_) => {}
        }
    }
}

/// DRC-CO-SIGNED: the decider's record on the request in force, when it names a second
/// approver, is co-signed by that principal's own decision-record; a record on a superseded
/// request is void and owes none.
pub fn drc_co_signed(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (d, e, p) in deciders(ctx) {
        let Some(sa) = &p.second_approver else {
            continue;
        };
        let Some((r, _)) = request_of(ctx, p) else {
            continue;
        };
        if !in_force(ctx, r) {
            continue;
        }
        let cosigned = ctx
            .cosigners
            .get(e.task_id.as_str())
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .filter_map(|&c| ctx.e(c))
            .any(|ce| ce.source.same(sa));
        if !cosigned {
            ctx.report(
                out,
                RuleId::DrcCoSigned,
                Some(d),
                format!(
                    "no co-signing record from the second approver {}",
                    sa.show()
                ),
            );
        }
    }
}

/// DRC-CO-SIGN-BINDING: a co-signing record names a decider's record on the same request
/// with the same digest and outcome, comes from that record's second approver, descends
/// from it in the parent chain, and names no second approver itself.
pub fn drc_co_sign_binding(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (c, ce, cp) in records(ctx) {
        let Some(target) = cp.co_signs_task_id.as_deref() else {
            continue;
        };
        let mut problems: Vec<String> = Vec::new();
        let decider = ctx
            .find(target)
            .filter(|&d| ctx.is(d, MessageType::DecisionRecord))
            .and_then(|d| Some((d, ctx.e(d)?)))
            .and_then(|(d, de)| Some((d, de.record.as_ref()?)))
            .filter(|(_, dp)| dp.co_signs_task_id.is_none());
        match decider {
            None => problems.push(format!(
                "co_signs_task_id `{target}` is not a decider's record"
            )),
            Some((d, dp)) => {
                if dp.request_task_id != cp.request_task_id {
                    problems.push("a different request_task_id".into());
                }
                if dp.request_digest != cp.request_digest {
                    problems.push("a different request_digest".into());
                }
                if dp.outcome != cp.outcome {
                    problems.push(format!(
                        "outcome {} differs from {}",
                        cp.outcome, dp.outcome
                    ));
                }
                let from_second = dp
                    .second_approver
                    .as_ref()
                    .is_some_and(|sa: &Party| sa.same(&ce.source));
                if !from_second {
                    problems.push("not sent by the decider's second_approver".into());
                }
                if !ctx.descends(c, d) {
                    problems.push("does not descend from the decider's record".into());
                }
            }
        }
        if cp.second_approver.is_some() {
            problems.push("names a second_approver of its own".into());
        }
        if !problems.is_empty() {
            ctx.report(
                out,
                RuleId::DrcCoSignBinding,
                Some(c),
                format!("co-signature of `{target}`: {}", problems.join("; ")),
            );
        }
    }
}

/// DRC-HARD-GATE-ACCEPTANCE: approving (approve or conditional-approve) a request with any
/// attached HARD-gate challenge open requires risk_acceptance_ref on the decider's record.
pub fn drc_hard_gate_acceptance(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    // The open HARD gate of each request, looked up once per request.
    let mut gate_of: HashMap<usize, Option<&Envelope>> = HashMap::new();
    for (d, _, p) in deciders(ctx) {
        if !matches!(p.outcome.as_str(), "approve" | "conditional-approve") || p.has_risk_acceptance
        {
            continue;
        }
        let Some((r, rp)) = request_of(ctx, p).and_then(|(r, re)| Some((r, re.request.as_ref()?)))
        else {
            continue;
        };
        let gate = *gate_of.entry(r).or_insert_with(|| {
            attached(ctx, rp)
                .into_iter()
                .filter_map(|c| ctx.e(c))
                .find(|ce| is_open(ce) && ce.challenge.as_ref().is_some_and(|c| c.hard_gate))
        });
        if let Some(g) = gate {
            ctx.report(
                out,
                RuleId::DrcHardGateAcceptance,
                Some(d),
                format!(
                    "approves over open HARD gate `{}` without risk_acceptance_ref",
                    g.task_id
                ),
            );
        }
    }
}

/// DRC-APPROVAL-STATE: approval_state is approved for approve and conditional-approve, and
/// rejected for reject and redesign.
pub fn drc_approval_state(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (d, e, p) in records(ctx) {
        let want = match p.outcome.as_str() {
            "approve" | "conditional-approve" => Approval::Approved,
            _ => Approval::Rejected,
        };
        if e.approval != want {
            ctx.report(
                out,
                RuleId::DrcApprovalState,
                Some(d),
                format!(
                    "outcome {} needs approval_state {}",
                    p.outcome,
                    if want == Approval::Approved {
                        "approved"
                    } else {
                        "rejected"
                    }
                ),
            );
        }
    }
}
