//! Stop-condition rules (STOP-*), from stop-conditions.md. Each condition is computed from
//! the envelope's own fields; the envelope that meets it must declare the reason and be
//! stopped or escalated.

use crate::canary;
use crate::index::Ctx;
use crate::model::{stop, Envelope, MessageType, Party, Status};
use crate::{Finding, RuleId};

fn condition(
    ctx: &Ctx<'_>,
    out: &mut Vec<Finding>,
    rule: RuleId,
    reason: u8,
    name: &str,
    met: impl Fn(&Envelope) -> Option<String>,
) {
    for (i, e) in ctx.env.iter().enumerate() {
        if let Some(why) = met(e) {
            if !e.stopped_for(reason) {
                ctx.report(
                    out,
                    rule,
                    Some(i),
                    format!(
                        "{why}, but it does not declare {name} with status stopped or escalated"
                    ),
                );
            }
        }
    }
}

/// STOP-DEPTH: a delegate at hop_count >= max_hops declares delegation-depth-exceeded and is
/// stopped or escalated.
pub fn stop_depth(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    condition(
        ctx,
        out,
        RuleId::StopDepth,
        stop::DEPTH,
        "delegation-depth-exceeded",
        |e| {
            (e.message_type == MessageType::Delegate && e.hop_count >= e.max_hops).then(|| {
                format!(
                    "delegate at hop_count {} of max_hops {}",
                    e.hop_count, e.max_hops
                )
            })
        },
    );
}

/// STOP-DEADLINE: an envelope sent after its own deadline declares deadline-passed and is
/// stopped or escalated.
pub fn stop_deadline(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    condition(
        ctx,
        out,
        RuleId::StopDeadline,
        stop::DEADLINE,
        "deadline-passed",
        |e| {
            (e.sent_at > e.deadline)
                .then(|| format!("sent at {} after its deadline {}", e.sent_at, e.deadline))
        },
    );
}

/// STOP-BUDGET: an exhausted budget (on a delegate spent >= limit in any dimension, on any
/// other message spent > limit) declares budget-exhausted and is stopped or escalated.
pub fn stop_budget(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    condition(
        ctx,
        out,
        RuleId::StopBudget,
        stop::BUDGET,
        "budget-exhausted",
        |e| {
            let delegate = e.message_type == MessageType::Delegate;
            let exhausted = e
                .budget
                .spent
                .iter()
                .zip(e.budget.limits.iter())
                .any(|(s, l)| if delegate { s >= l } else { s > l });
            exhausted.then(|| "the budget is exhausted".to_owned())
        },
    );
}

/// STOP-MISSING-EVIDENCE: a delegate or decision-request with blocking missing evidence
/// declares missing-evidence and is stopped or escalated.
pub fn stop_missing_evidence(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    condition(
        ctx,
        out,
        RuleId::StopMissingEvidence,
        stop::MISSING_EVIDENCE,
        "missing-evidence",
        |e| {
            (matches!(
                e.message_type,
                MessageType::Delegate | MessageType::DecisionRequest
            ) && e.blocking_gap)
                .then(|| {
                    format!(
                        "a {} lists blocking missing evidence",
                        e.message_type.as_str()
                    )
                })
        },
    );
}

/// STOP-LIVE-GUARD: a delegate whose objective opens with a mutation verb (after optional
/// urgency words) declares live-guard-intent and is stopped or escalated.
pub fn stop_live_guard(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    condition(
        ctx,
        out,
        RuleId::StopLiveGuard,
        stop::LIVE_GUARD,
        "live-guard-intent",
        |e| {
            (e.message_type == MessageType::Delegate && canary::live_guard_intent(&e.objective))
                .then(|| "the delegate's objective opens with a mutation verb".to_owned())
        },
    );
}

/// STOP-INSTRUCTION-BAIT: an objective carrying instruction-override or claimed-approval
/// phrasing declares conflicting-instructions and is stopped or escalated.
pub fn stop_instruction_bait(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    condition(
        ctx,
        out,
        RuleId::StopInstructionBait,
        stop::CONFLICTING,
        "conflicting-instructions",
        |e| {
            canary::instruction_bait(&e.objective).then(|| {
                "the objective carries instruction-override or claimed-approval phrasing".to_owned()
            })
        },
    );
}

/// STOP-ROUTING-LOOP: an agent-sourced delegate to an agent already delegated to earlier in
/// its own chain (stopped delegates do not count) declares routing-loop and is stopped or
/// escalated, unless it is the one revisit: exactly one earlier delegate to that agent, which
/// has challenged the sender's work in the chain.
pub fn stop_routing_loop(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (i, e) in ctx.env.iter().enumerate() {
        if e.message_type != MessageType::Delegate || e.source.is_principal() {
            continue;
        }
        let Party::Agent(dest) = &e.destination else {
            continue;
        };
        let mut earlier = 0usize;
        let mut challenged = false;
        for a in ctx.ancestors(i) {
            let Some(ae) = ctx.e(a) else { continue };
            if ae.message_type == MessageType::Delegate
                && ae.status != Status::Stopped
                && ae.destination.is_agent(dest)
            {
                earlier += 1;
            }
            if ae.message_type == MessageType::Challenge && ae.source.is_agent(dest) {
                let on_sender = ae
                    .challenge
                    .as_ref()
                    .and_then(|c| ctx.find(&c.proposal_task_id))
                    .and_then(|t| ctx.e(t))
                    .is_some_and(|t| t.source.same(&e.source));
                challenged |= on_sender;
            }
        }
        let revisit = earlier == 1 && challenged;
        if earlier > 0 && !revisit && !e.stopped_for(stop::ROUTING_LOOP) {
            ctx.report(
                out,
                RuleId::StopRoutingLoop,
                Some(i),
                format!(
                    "agent `{dest}` was already delegated to {earlier} time(s) in this chain, but the delegate does not declare routing-loop with status stopped or escalated"
                ),
            );
        }
    }
}

/// STOP-TERMINAL: every child of a stopped envelope is an escalate, and no decision-record
/// binds a decision-request (by message_type, with or without its payload) that declares a
/// stop reason (stopped or escalated).
pub fn stop_terminal(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (i, e) in ctx.env.iter().enumerate() {
        if e.status != Status::Stopped {
            continue;
        }
        for &c in ctx.children.get(i).map_or(&[][..], Vec::as_slice) {
            if let Some(ce) = ctx
                .e(c)
                .filter(|ce| ce.message_type != MessageType::Escalate)
            {
                ctx.report(
                    out,
                    RuleId::StopTerminal,
                    Some(c),
                    format!(
                        "a {} follows stopped `{}`; only an escalate may",
                        ce.message_type.as_str(),
                        e.task_id
                    ),
                );
            }
        }
    }
    for &d in &ctx.records {
        let Some(p) = ctx.e(d).and_then(|e| e.record.as_ref()) else {
            continue;
        };
        let stopped_request = ctx
            .find(&p.request_task_id)
            .and_then(|r| ctx.e(r))
            .filter(|r| r.message_type == MessageType::DecisionRequest && r.declares_stop());
        if let Some(r) = stopped_request {
            ctx.report(
                out,
                RuleId::StopTerminal,
                Some(d),
                format!(
                    "binds decision-request `{}`, which declares a stop",
                    r.task_id
                ),
            );
        }
    }
}

/// STOP-CHALLENGE-ROUNDS: a challenge beyond round 2 declares challenge-rounds-exceeded and
/// is stopped or escalated.
pub fn stop_challenge_rounds(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    condition(
        ctx,
        out,
        RuleId::StopChallengeRounds,
        stop::ROUNDS,
        "challenge-rounds-exceeded",
        |e| {
            e.challenge
                .as_ref()
                .filter(|c| e.message_type == MessageType::Challenge && c.round > 2)
                .map(|c| format!("a challenge in round {}", c.round))
        },
    );
}
