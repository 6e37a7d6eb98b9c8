//! Challenge and decision-request rules (CH-*, DR-*), from decision-record.md.
//!
//! Vocabulary used below:
//! - *precedes*: a different envelope not causally after (see [`Ctx::after`]): sent at an
//!   earlier or the same second, and not a descendant.
//! - *attached*: a challenge envelope named in the request's challenge_task_ids.
//! - *open*: a challenge whose outcome is sustained or unresolved, or that declares a stop
//!   (stop reasons, or status stopped), whatever its outcome.
//! - *in force*: a request no other request supersedes.

use std::collections::HashSet;

use crate::index::Ctx;
use crate::model::{stop, DecisionClass, Envelope, Party, RequestP, Status};
use crate::{Finding, RuleId};

/// The designated challenger of a class, given the proposer; `None` when no valid one exists.
pub fn designated(class: DecisionClass, proposer: &str) -> Option<&'static str> {
    const SEC: &str = "agentic-security-review-agent";
    const ARCH: &str = "agentic-system-architecture-review-agent";
    const FIN: &str = "finance-capital-allocation-advisor-agent";
    let (first, fallback) = match class {
        DecisionClass::Architecture => (SEC, Some(ARCH)),
        DecisionClass::Security => (ARCH, Some(SEC)),
        DecisionClass::AutomationInvestment => (FIN, None),
    };
    if first == proposer {
        fallback
    } else {
        Some(first)
    }
}

/// Whether a challenge envelope is open.
pub fn is_open(c: &Envelope) -> bool {
    let outcome_open = c
        .challenge
        .as_ref()
        .is_some_and(|p| p.outcome == "sustained" || p.outcome == "unresolved");
    outcome_open || c.stop_reasons != 0 || c.status == Status::Stopped
}

fn is_hard_gate(c: &Envelope) -> bool {
    c.challenge.as_ref().is_some_and(|p| p.hard_gate)
}

/// The decision-requests, with their payloads.
pub fn requests<'a>(
    ctx: &'a Ctx<'_>,
) -> impl Iterator<Item = (usize, &'a Envelope, &'a RequestP)> + 'a {
    ctx.requests.iter().filter_map(move |&r| {
        let e = ctx.e(r)?;
        Some((r, e, e.request.as_ref()?))
    })
}

/// Attached challenges that resolve to challenge envelopes.
pub fn attached(ctx: &Ctx<'_>, p: &RequestP) -> Vec<usize> {
    let mut seen = HashSet::new();
    p.challenge_task_ids
        .iter()
        .filter_map(|id| ctx.find(id))
        .filter(|&c| ctx.e(c).is_some_and(|e| e.challenge.is_some()))
        .filter(|c| seen.insert(*c))
        .collect()
}

/// The envelope a challenge targets, when it resolves.
pub fn target(ctx: &Ctx<'_>, c: usize) -> Option<usize> {
    ctx.e(c)
        .and_then(|e| e.challenge.as_ref())
        .and_then(|p| ctx.find(&p.proposal_task_id))
}

fn targets_agent(ctx: &Ctx<'_>, c: usize, agent: &str) -> bool {
    target(ctx, c)
        .and_then(|t| ctx.e(t))
        .is_some_and(|t| t.source.is_agent(agent))
}

/// Whether a request is in force (nothing supersedes it).
pub fn in_force(ctx: &Ctx<'_>, r: usize) -> bool {
    !ctx.superseded_by.contains_key(&r)
}

/// The decision-records naming request `r`.
pub fn records_of<'a>(ctx: &'a Ctx<'_>, r: usize) -> &'a [usize] {
    ctx.records_of.get(&r).map_or(&[], Vec::as_slice)
}

/// Whether the request needs a challenge: R2 or above, any flag, or automation-investment.
pub fn challenge_required(e: &Envelope, p: &RequestP) -> bool {
    e.tier >= 2 || e.flags != 0 || p.decision_class == DecisionClass::AutomationInvestment
}

/// CH-PROPOSAL-LINK: a challenge's proposal_task_id resolves to an envelope in the record set
/// that precedes the challenge, so it cannot name a later revision or the request.
pub fn ch_proposal_link(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for &c in &ctx.challenges {
        let Some(p) = ctx.e(c).and_then(|e| e.challenge.as_ref()) else {
            continue;
        };
        match ctx.find(&p.proposal_task_id) {
            None => ctx.report(
                out,
                RuleId::ChProposalLink,
                Some(c),
                format!(
                    "proposal_task_id `{}` is not in the record set",
                    p.proposal_task_id
                ),
            ),
            Some(t) if !ctx.precedes(t, c) => ctx.report(
                out,
                RuleId::ChProposalLink,
                Some(c),
                format!(
                    "proposal_task_id `{}` does not precede the challenge",
                    p.proposal_task_id
                ),
            ),
            Some(_) => {}
        }
    }
}

/// CH-ROUND-COUNTED: a challenge's round equals the number of delegates, returns and
/// challenges (not stopped) that its target's sender had sent to the challenger before it,
/// at least 1.
pub fn ch_round_counted(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for &c in &ctx.challenges {
        let Some(p) = ctx.e(c).and_then(|e| e.challenge.as_ref()) else {
            continue;
        };
        let Some(t) = target(ctx, c) else { continue };
        let (Some(&from), Some(&to)) = (ctx.src.get(t), ctx.src.get(c)) else {
            continue;
        };
        let counted = ctx.exchanges_before(from, to, c).max(1);
        if u64::try_from(counted).ok() != Some(p.round) {
            ctx.report(
                out,
                RuleId::ChRoundCounted,
                Some(c),
                format!(
                    "round is declared {} but {counted} exchanges precede it",
                    p.round
                ),
            );
        }
    }
}

/// DR-TO-PRINCIPAL: a decision-request is addressed to a principal; agents never decide.
pub fn dr_to_principal(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, e, _) in requests(ctx) {
        if !e.destination.is_principal() {
            ctx.report(
                out,
                RuleId::DrToPrincipal,
                Some(r),
                format!("decision-request addressed to {}", e.destination.show()),
            );
        }
    }
}

/// DR-PROPOSER-IS-SENDER: a decision-request is sent by the agent it names as proposer_agent.
pub fn dr_proposer_is_sender(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, e, p) in requests(ctx) {
        if !e.source.is_agent(&p.proposer_agent) {
            ctx.report(
                out,
                RuleId::DrProposerIsSender,
                Some(r),
                format!(
                    "proposer_agent `{}` is not the sender, {}",
                    p.proposer_agent,
                    e.source.show()
                ),
            );
        }
    }
}

/// DR-CHALLENGE-TARGETS-PROPOSAL: every attached challenge that is not a HARD gate points at
/// an envelope sent by the proposer.
pub fn dr_challenge_targets_proposal(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        for c in attached(ctx, p) {
            let hard = ctx.e(c).is_some_and(is_hard_gate);
            if !hard && !targets_agent(ctx, c, &p.proposer_agent) {
                ctx.report(
                    out,
                    RuleId::DrChallengeTargetsProposal,
                    Some(r),
                    format!(
                        "attached challenge `{}` does not target an envelope of proposer `{}`",
                        ctx.e(c).map_or("", |e| e.task_id.as_str()),
                        p.proposer_agent
                    ),
                );
            }
        }
    }
}

/// DR-CHALLENGE-RESOLVES: every challenge_task_ids entry resolves to a challenge envelope in
/// the record set.
pub fn dr_challenge_resolves(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        for id in &p.challenge_task_ids {
            let ok = ctx
                .find(id)
                .and_then(|c| ctx.e(c))
                .is_some_and(|e| e.challenge.is_some());
            if !ok {
                ctx.report(
                    out,
                    RuleId::DrChallengeResolves,
                    Some(r),
                    format!("challenge_task_ids entry `{id}` is not a challenge in the record set"),
                );
            }
        }
    }
}

/// DR-CHALLENGE-PRECEDES: no attached challenge was sent after the decision-request or
/// descends from it.
pub fn dr_challenge_precedes(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        for c in attached(ctx, p) {
            if ctx.after(c, r) {
                ctx.report(
                    out,
                    RuleId::DrChallengePrecedes,
                    Some(r),
                    format!(
                        "attached challenge `{}` comes after the request",
                        ctx.e(c).map_or("", |e| e.task_id.as_str())
                    ),
                );
            }
        }
    }
}

/// DR-CHALLENGE-COMPLETE: every challenge on the proposer's envelopes, and every HARD gate
/// in the correlation, that precedes the request is attached; for the request in force, so
/// is every such challenge not causally after every decision-record that binds it.
pub fn dr_challenge_complete(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        let have: HashSet<usize> = attached(ctx, p).into_iter().collect();
        let bound = if in_force(ctx, r) {
            records_of(ctx, r)
        } else {
            &[]
        };
        for &c in &ctx.challenges {
            let Some(ce) = ctx.e(c) else { continue };
            let owed_kind = is_hard_gate(ce) || targets_agent(ctx, c, &p.proposer_agent);
            if !owed_kind || have.contains(&c) {
                continue;
            }
            let before_request = ctx.precedes(c, r);
            let before_decision = bound.iter().any(|&b| !ctx.after(c, b));
            if before_request || before_decision {
                ctx.report(
                    out,
                    RuleId::DrChallengeComplete,
                    Some(r),
                    format!(
                        "challenge `{}` precedes the {} but is not attached",
                        ce.task_id,
                        if before_request {
                            "request"
                        } else {
                            "decision"
                        }
                    ),
                );
            }
        }
    }
}

/// DR-RISK-CARRIED: a decision-request's tier is at least, and its flags include, those of
/// every envelope in the correlation not causally after it; for the request in force, also
/// those of every envelope not causally after every decision-record binding it (those
/// records aside).
pub fn dr_risk_carried(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, e, _) in requests(ctx) {
        let bound = if in_force(ctx, r) {
            records_of(ctx, r)
        } else {
            &[]
        };
        let mut worst: Option<usize> = None;
        let mut flags = 0u8;
        let mut flag_from: Option<usize> = None;
        for (i, other) in ctx.env.iter().enumerate() {
            if i == r || bound.contains(&i) {
                continue;
            }
            let counts = !ctx.after(i, r) || bound.iter().any(|&b| !ctx.after(i, b));
            if !counts {
                continue;
            }
            if other.tier > e.tier
                && worst
                    .and_then(|w| ctx.e(w))
                    .map_or(true, |w| other.tier > w.tier)
            {
                worst = Some(i);
            }
            if other.flags & !e.flags != 0 {
                flags |= other.flags & !e.flags;
                flag_from.get_or_insert(i);
            }
        }
        if let Some(w) = worst.and_then(|w| ctx.e(w)) {
            ctx.report(
                out,
                RuleId::DrRiskCarried,
                Some(r),
                format!(
                    "subject_risk_tier R{} is below R{} of `{}`",
                    e.tier, w.tier, w.task_id
                ),
            );
        }
        if let Some(f) = flag_from.and_then(|f| ctx.e(f)) {
            ctx.report(
                out,
                RuleId::DrRiskCarried,
                Some(r),
                format!(
                    "materiality_flags miss {} flag(s) carried earlier, first by `{}`",
                    flags.count_ones(),
                    f.task_id
                ),
            );
        }
    }
}

/// DR-ONE-REQUEST: one decision-request in force per correlation: every other supersedes a
/// decision-request from the same proposer sent no later than itself, none is superseded
/// twice, and supersession has no cycle.
pub fn dr_one_request(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    let mut originals = 0usize;
    for (r, e, p) in requests(ctx) {
        let Some(sid) = p.supersedes_task_id.as_deref() else {
            originals += 1;
            if originals > 1 {
                ctx.report(
                    out,
                    RuleId::DrOneRequest,
                    Some(r),
                    "a second decision-request that supersedes none".into(),
                );
            }
            continue;
        };
        let sup = ctx.find(sid).and_then(|s| Some((s, ctx.e(s)?)));
        match sup {
            Some((s, se)) => match se.request.as_ref() {
                None => ctx.report(
                    out,
                    RuleId::DrOneRequest,
                    Some(r),
                    format!("supersedes_task_id `{sid}` is not a decision-request"),
                ),
                Some(sp) => {
                    if sp.proposer_agent != p.proposer_agent {
                        ctx.report(
                            out,
                            RuleId::DrOneRequest,
                            Some(r),
                            format!("supersedes `{sid}` of a different proposer"),
                        );
                    }
                    if se.sent_at > e.sent_at || s == r {
                        ctx.report(
                            out,
                            RuleId::DrOneRequest,
                            Some(r),
                            format!("supersedes `{sid}`, which is not sent before it"),
                        );
                    }
                }
            },
            None => ctx.report(
                out,
                RuleId::DrOneRequest,
                Some(r),
                format!("supersedes_task_id `{sid}` is not in the record set"),
            ),
        }
    }
    let mut twice: Vec<(&usize, &Vec<usize>)> = ctx
        .superseded_by
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .collect();
    twice.sort_unstable();
    for (s, by) in twice {
        ctx.report(
            out,
            RuleId::DrOneRequest,
            Some(*s),
            format!("superseded by {} requests", by.len()),
        );
    }
    // Cycles: follow supersedes links; a walk longer than the number of requests loops.
    let limit = ctx.requests.len();
    for &r in &ctx.requests {
        let mut cur = r;
        for _ in 0..=limit {
            let next = ctx
                .e(cur)
                .and_then(|e| e.request.as_ref())
                .and_then(|p| p.supersedes_task_id.as_deref())
                .and_then(|s| ctx.find(s));
            match next {
                Some(n) if n == r => {
                    ctx.report(
                        out,
                        RuleId::DrOneRequest,
                        Some(r),
                        "supersession forms a cycle".into(),
                    );
                    break;
                }
                Some(n) => cur = n,
                None => break,
            }
        }
    }
}

fn root<'a>(ctx: &'a Ctx<'_>) -> Option<&'a Envelope> {
    ctx.root.and_then(|r| ctx.e(r))
}

/// DR-OWNER-FROM-ROOT: a correlation carrying a decision-request is opened by a principal
/// whose root names a decision_owner other than itself, and every decision-request addressed
/// to a principal goes to that owner.
pub fn dr_owner_from_root(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    if ctx.requests.is_empty() {
        return;
    }
    let Some(root) = root(ctx) else {
        ctx.report(
            out,
            RuleId::DrOwnerFromRoot,
            None,
            "a decision-request is present but there is no root".into(),
        );
        return;
    };
    let owner = match (&root.source, &root.decision_owner) {
        (Party::Principal { .. }, Some(owner)) if !owner.same(&root.source) => Some(owner),
        (Party::Principal { .. }, Some(_)) => {
            ctx.report(
                out,
                RuleId::DrOwnerFromRoot,
                ctx.root,
                "the root's decision_owner is the root's own sender".into(),
            );
            None
        }
        (Party::Principal { .. }, None) => {
            ctx.report(
                out,
                RuleId::DrOwnerFromRoot,
                ctx.root,
                "a decision-request is present but the root names no decision_owner".into(),
            );
            None
        }
        (Party::Agent(_), _) => {
            ctx.report(
                out,
                RuleId::DrOwnerFromRoot,
                ctx.root,
                "a decision-request is present but an agent opened the correlation".into(),
            );
            None
        }
    };
    let Some(owner) = owner else { return };
    for (r, e, _) in requests(ctx) {
        if e.destination.is_principal() && !e.destination.same(owner) {
            ctx.report(
                out,
                RuleId::DrOwnerFromRoot,
                Some(r),
                format!(
                    "addressed to {}, not the decision_owner {}",
                    e.destination.show(),
                    owner.show()
                ),
            );
        }
    }
}

/// DR-CLASS-FROM-ROOT: a decision-request's decision_class equals the one the root declared.
pub fn dr_class_from_root(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    let declared = root(ctx).and_then(|r| r.decision_class);
    for (r, _, p) in requests(ctx) {
        if declared != Some(p.decision_class) {
            ctx.report(
                out,
                RuleId::DrClassFromRoot,
                Some(r),
                format!(
                    "decision_class {} but the root declares {}",
                    p.decision_class.as_str(),
                    declared.map_or("none", DecisionClass::as_str)
                ),
            );
        }
    }
}

/// DR-CHALLENGE-REQUIRED: at R2 or above, with any materiality flag, or for
/// automation-investment, at least one challenge is attached.
pub fn dr_challenge_required(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, e, p) in requests(ctx) {
        if challenge_required(e, p) && p.challenge_task_ids.is_empty() {
            ctx.report(
                out,
                RuleId::DrChallengeRequired,
                Some(r),
                format!(
                    "a challenge is required (R{}, {} flag(s), {}) but none is attached",
                    e.tier,
                    e.flags.count_ones(),
                    p.decision_class.as_str()
                ),
            );
        }
    }
}

/// DR-DESIGNATED-CHALLENGER: when a challenge is required, the designated challenger for the
/// class sent an attached challenge of the proposer's own envelopes that completed, or that
/// stopped only because the round cap was reached.
pub fn dr_designated_challenger(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, e, p) in requests(ctx) {
        if !challenge_required(e, p) {
            continue;
        }
        let Some(who) = designated(p.decision_class, &p.proposer_agent) else {
            ctx.report(
                out,
                RuleId::DrDesignatedChallenger,
                Some(r),
                format!(
                    "proposer `{}` is the only designated challenger of {}; a different proposer is needed",
                    p.proposer_agent,
                    p.decision_class.as_str()
                ),
            );
            continue;
        };
        let counts = attached(ctx, p).into_iter().any(|c| {
            ctx.e(c).is_some_and(|ce| {
                let ran = (ce.status == Status::Completed && ce.stop_reasons == 0)
                    || (ce.stop_reasons == stop::ROUNDS
                        && matches!(ce.status, Status::Stopped | Status::Escalated));
                ce.source.is_agent(who) && ran && targets_agent(ctx, c, &p.proposer_agent)
            })
        });
        if !counts {
            ctx.report(
                out,
                RuleId::DrDesignatedChallenger,
                Some(r),
                format!("no attached challenge by the designated challenger `{who}` on the proposer's envelopes ran to completion or to the round cap"),
            );
        }
    }
}

/// DR-PROPOSER-NOT-CHALLENGER: no attached challenge was raised by the proposer.
pub fn dr_proposer_not_challenger(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        for c in attached(ctx, p) {
            if let Some(ce) = ctx.e(c).filter(|ce| ce.source.is_agent(&p.proposer_agent)) {
                ctx.report(
                    out,
                    RuleId::DrProposerNotChallenger,
                    Some(r),
                    format!(
                        "attached challenge `{}` was raised by the proposer",
                        ce.task_id
                    ),
                );
            }
        }
    }
}

/// DR-ALTERNATIVES: when a challenge is required, at least one alternative is recorded.
pub fn dr_alternatives(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, e, p) in requests(ctx) {
        if challenge_required(e, p) && p.alternatives == 0 {
            ctx.report(
                out,
                RuleId::DrAlternatives,
                Some(r),
                "a challenge is required but no alternative is recorded".into(),
            );
        }
    }
}

/// DR-UNRESOLVED-DISSENT: every attached open challenge has a dissent entry, even when the
/// challenger later withdrew.
pub fn dr_unresolved_dissent(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        for c in attached(ctx, p) {
            let Some(ce) = ctx.e(c).filter(|ce| is_open(ce)) else {
                continue;
            };
            if !p.dissent_ids.contains(&ce.task_id) {
                ctx.report(
                    out,
                    RuleId::DrUnresolvedDissent,
                    Some(r),
                    format!("open challenge `{}` has no dissent entry", ce.task_id),
                );
            }
        }
    }
}

/// DR-NO-APPROVE-OVER-DISSENT: with any attached challenge open, recommended_outcome is not
/// approve. (The stricter bar for an open HARD gate is DR-HARD-GATE.)
pub fn dr_no_approve_over_dissent(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        if p.recommended_outcome != "approve" {
            continue;
        }
        if let Some(ce) = attached(ctx, p)
            .into_iter()
            .filter_map(|c| ctx.e(c))
            .find(|ce| is_open(ce))
        {
            ctx.report(
                out,
                RuleId::DrNoApproveOverDissent,
                Some(r),
                format!("recommends approve over open challenge `{}`", ce.task_id),
            );
        }
    }
}

/// DR-HARD-GATE: with any attached HARD-gate challenge open, recommended_outcome is reject,
/// redesign or escalate.
pub fn dr_hard_gate(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        if matches!(
            p.recommended_outcome.as_str(),
            "reject" | "redesign" | "escalate"
        ) {
            continue;
        }
        if let Some(ce) = attached(ctx, p)
            .into_iter()
            .filter_map(|c| ctx.e(c))
            .find(|ce| is_open(ce) && is_hard_gate(ce))
        {
            ctx.report(
                out,
                RuleId::DrHardGate,
                Some(r),
                format!(
                    "recommends {} over open HARD gate `{}`",
                    p.recommended_outcome, ce.task_id
                ),
            );
        }
    }
}

/// DR-VALUE-CASE-REQUIRED: an automation-investment decision-request carries a value_case.
pub fn dr_value_case_required(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        if p.decision_class == DecisionClass::AutomationInvestment && !p.has_value_case {
            ctx.report(
                out,
                RuleId::DrValueCaseRequired,
                Some(r),
                "an automation-investment request carries no value_case".into(),
            );
        }
    }
}
