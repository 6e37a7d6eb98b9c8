//! Challenge and decision-request rules (CH-*, DR-*), from decision-record.md.
//!
//! Vocabulary used below:
//! - *precedes*: a different envelope not causally after (see [`Ctx::after`]): sent at an
//!   earlier or the same second, and not a descendant.
//! - *attached*: a challenge envelope (by message_type, with or without its payload) named
//!   in the request's challenge_task_ids.
//! - *open*: a challenge whose outcome is sustained or unresolved, or that declares a stop
//!   (stop reasons, or status stopped), whatever its outcome.
//! - *in force*: a request no other request supersedes.

use std::collections::{HashMap, HashSet};

use crate::index::Ctx;
use crate::model::{stop, DecisionClass, Envelope, MessageType, Party, RequestP, Status};
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

/// Every decision-request (by message_type), with or without its payload: for the rules that
/// read only the envelope's own fields.
pub fn all_requests<'a>(ctx: &'a Ctx<'_>) -> impl Iterator<Item = (usize, &'a Envelope)> + 'a {
    ctx.requests
        .iter()
        .filter_map(move |&r| Some((r, ctx.e(r)?)))
}

/// The decision-requests that carry their payload, with it: for the rules that read the
/// payload (a request without one is HO-PAYLOAD-DECISION-REQUEST's finding).
pub fn requests<'a>(
    ctx: &'a Ctx<'_>,
) -> impl Iterator<Item = (usize, &'a Envelope, &'a RequestP)> + 'a {
    ctx.requests.iter().filter_map(move |&r| {
        let e = ctx.e(r)?;
        Some((r, e, e.request.as_ref()?))
    })
}

/// Attached challenges: entries that resolve to challenge envelopes (by message_type; one
/// without its payload is attached, and rules that need the payload skip it).
pub fn attached(ctx: &Ctx<'_>, p: &RequestP) -> Vec<usize> {
    let mut seen = HashSet::new();
    p.challenge_task_ids
        .iter()
        .filter_map(|id| ctx.find(id))
        .filter(|&c| ctx.is(c, MessageType::Challenge))
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
    for (r, e) in all_requests(ctx) {
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
/// an envelope sent by the proposer. A challenge without its payload names no target and no
/// hard_gate; it is HO-PAYLOAD-CHALLENGE's finding, not this rule's.
pub fn dr_challenge_targets_proposal(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        for c in attached(ctx, p) {
            let Some(ce) = ctx.e(c).filter(|ce| ce.challenge.is_some()) else {
                continue;
            };
            if !is_hard_gate(ce) && !targets_agent(ctx, c, &p.proposer_agent) {
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
/// the record set (by message_type: an envelope of another type carrying a challenge payload
/// is not one; a challenge without its payload is).
pub fn dr_challenge_resolves(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        for id in &p.challenge_task_ids {
            let ok = ctx
                .find(id)
                .is_some_and(|c| ctx.is(c, MessageType::Challenge));
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

/// The envelopes a request answers for: those not causally after it and, for the request in
/// force with records, also those not causally after every record that binds it. Kept as
/// "time rank <= `limit`, minus `excluded`" so that membership and counts need no rescan.
#[derive(Debug)]
pub struct Window {
    limit: u32,
    excluded: HashSet<usize>,
}

impl Window {
    /// Whether envelope `i` is in the window.
    pub fn contains(&self, ctx: &Ctx<'_>, i: usize) -> bool {
        ctx.time(i) <= self.limit && !self.excluded.contains(&i)
    }

    /// The window for request `r`. With `records_aside`, the records binding the request in
    /// force are left out (DR-RISK-CARRIED's "those records aside").
    pub fn of(ctx: &Ctx<'_>, r: usize, records_aside: bool) -> Window {
        let tr = ctx.time(r);
        let mut own: HashSet<usize> = ctx.descendants(r).into_iter().collect();
        own.insert(r);
        let bound = if in_force(ctx, r) {
            records_of(ctx, r)
        } else {
            &[]
        };
        let Some(&last) = bound.iter().max_by_key(|&&b| ctx.time(b)) else {
            let excluded = own.into_iter().filter(|&i| ctx.time(i) <= tr).collect();
            return Window {
                limit: tr,
                excluded,
            };
        };
        let tb = ctx.time(last);
        // E is outside the records' union only when every record sent no earlier than E is
        // one of E's ancestors; such an E descends from the latest record.
        let mut record_ranks: Vec<u32> = bound.iter().map(|&b| ctx.time(b)).collect();
        record_ranks.sort_unstable();
        let bound_set: HashSet<usize> = bound.iter().copied().collect();
        let mut outside: HashSet<usize> = HashSet::new();
        for e in ctx
            .descendants(last)
            .into_iter()
            .chain(std::iter::once(last))
        {
            let te = ctx.time(e);
            if te > tb {
                continue;
            }
            let no_earlier = record_ranks.len() - record_ranks.partition_point(|&x| x < te);
            let as_ancestor = ctx
                .ancestors(e)
                .filter(|a| bound_set.contains(a) && ctx.time(*a) >= te)
                .count();
            if no_earlier == as_ancestor {
                outside.insert(e);
            }
        }
        let limit = tr.max(tb);
        let mut excluded: HashSet<usize> = own
            .iter()
            .chain(outside.iter())
            .copied()
            .filter(|&e| {
                let te = ctx.time(e);
                te <= limit && (te > tr || own.contains(&e)) && (te > tb || outside.contains(&e))
            })
            .collect();
        if records_aside {
            excluded.extend(bound.iter().copied());
        }
        excluded.insert(r);
        Window { limit, excluded }
    }

    /// How many envelopes in the window have tier >= k (k < 6) or flag bit k - 6.
    fn count(&self, ctx: &Ctx<'_>, k: usize, has: impl Fn(&Envelope) -> bool) -> u32 {
        let upto = ctx
            .cumulative
            .get(self.limit as usize)
            .and_then(|row| row.get(k))
            .copied()
            .unwrap_or(0);
        let minus = self
            .excluded
            .iter()
            .filter(|&&i| ctx.time(i) <= self.limit && ctx.e(i).is_some_and(&has))
            .count();
        upto.saturating_sub(u32::try_from(minus).unwrap_or(u32::MAX))
    }

    /// The first envelope of `list` (sorted by time rank) in the window.
    fn first_in(&self, ctx: &Ctx<'_>, list: &[usize]) -> Option<usize> {
        list.iter()
            .copied()
            .take_while(|&i| ctx.time(i) <= self.limit)
            .find(|i| !self.excluded.contains(i))
    }
}

fn slice_of<'m>(m: &'m HashMap<&str, Vec<usize>>, key: &str) -> &'m [usize] {
    m.get(key).map_or(&[][..], Vec::as_slice)
}

/// Missing challenges reported one by one per request; the rest are summed up in one finding.
pub const MAX_LISTED_MISSING: usize = 50;

/// DR-CHALLENGE-COMPLETE: every challenge on the proposer's envelopes, and every HARD gate
/// in the correlation, that precedes the request is attached; for the request in force, so
/// is every such challenge not causally after every decision-record that binds it.
pub fn dr_challenge_complete(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        let have: HashSet<usize> = attached(ctx, p).into_iter().collect();
        let window = Window::of(ctx, r, false);
        let within = |list: &[usize]| list.partition_point(|&c| ctx.time(c) <= window.limit);
        let on_proposer = slice_of(&ctx.challenges_on, &p.proposer_agent);
        let hard_on_proposer = slice_of(&ctx.hard_gates_on, &p.proposer_agent);
        let lp = on_proposer.get(..within(on_proposer)).unwrap_or(&[]);
        let hg = ctx.hard_gates.get(..within(&ctx.hard_gates)).unwrap_or(&[]);
        let is_candidate = |c: usize| {
            ctx.e(c).is_some_and(|ce| {
                ce.message_type == MessageType::Challenge
                    && (is_hard_gate(ce) || targets_agent(ctx, c, &p.proposer_agent))
            })
        };
        // Owed = candidates in the window; count them without enumerating them all.
        let candidates = lp.len() + hg.len() - within(hard_on_proposer).min(hg.len());
        let excluded = window
            .excluded
            .iter()
            .filter(|&&c| ctx.time(c) <= window.limit && is_candidate(c))
            .count();
        let attached_owed = have
            .iter()
            .filter(|&&c| is_candidate(c) && window.contains(ctx, c))
            .count();
        let owed_missing = candidates.saturating_sub(excluded + attached_owed);
        let mut missing = Vec::new();
        let listed = lp.iter().chain(
            hg.iter()
                .filter(|&&c| !targets_agent(ctx, c, &p.proposer_agent)),
        );
        for &c in listed {
            if missing.len() >= MAX_LISTED_MISSING.min(owed_missing) {
                break;
            }
            if !have.contains(&c) && window.contains(ctx, c) {
                missing.push(c);
            }
        }
        let more = owed_missing.saturating_sub(missing.len());
        for c in missing {
            let Some(ce) = ctx.e(c) else { continue };
            let before_request = ctx.precedes(c, r);
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
        if more > 0 {
            ctx.report(
                out,
                RuleId::DrChallengeComplete,
                Some(r),
                format!("and {more} more owed challenges are not attached"),
            );
        }
    }
}

/// DR-RISK-CARRIED: a decision-request's tier is at least, and its flags include, those of
/// every envelope in the correlation not causally after it; for the request in force, also
/// those of every envelope not causally after every decision-record binding it (those
/// records aside).
pub fn dr_risk_carried(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, e) in all_requests(ctx) {
        let window = Window::of(ctx, r, true);
        let worst = (usize::from(e.tier) + 1..6)
            .rev()
            .find(|&k| window.count(ctx, k, |x| usize::from(x.tier) >= k) > 0);
        if let Some(k) = worst {
            let example = (k..6)
                .rev()
                .filter_map(|tier| window.first_in(ctx, ctx.by_tier.get(tier)?))
                .next()
                .and_then(|i| ctx.e(i));
            ctx.report(
                out,
                RuleId::DrRiskCarried,
                Some(r),
                format!(
                    "subject_risk_tier R{} is below R{k}{}",
                    e.tier,
                    example.map_or(String::new(), |x| format!(" of `{}`", x.task_id))
                ),
            );
        }
        let mut missing = 0u8;
        let mut example = None;
        for b in 0..6usize {
            let bit = 1u8 << b;
            if e.flags & bit != 0 {
                continue;
            }
            if window.count(ctx, 6 + b, |x| x.flags & bit != 0) > 0 {
                missing |= bit;
                if example.is_none() {
                    example = ctx.by_flag.get(b).and_then(|l| window.first_in(ctx, l));
                }
            }
        }
        if missing != 0 {
            ctx.report(
                out,
                RuleId::DrRiskCarried,
                Some(r),
                format!(
                    "materiality_flags miss {} flag(s) carried earlier{}",
                    missing.count_ones(),
                    example
                        .and_then(|i| ctx.e(i))
                        .map_or(String::new(), |x| format!(", first by `{}`", x.task_id))
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
            Some((_, se)) if se.message_type != MessageType::DecisionRequest => ctx.report(
                out,
                RuleId::DrOneRequest,
                Some(r),
                format!("supersedes_task_id `{sid}` is not a decision-request"),
            ),
            Some((s, se)) => {
                // A superseded request without its payload names no proposer to compare
                // (HO-PAYLOAD-DECISION-REQUEST's finding); it is still a decision-request.
                if se
                    .request
                    .as_ref()
                    .is_some_and(|sp| sp.proposer_agent != p.proposer_agent)
                {
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
    // Cycles: each request has at most one supersedes link, so the links form paths and
    // cycles; colour each request once (0 new, 1 on the current path, 2 done).
    let mut colour: HashMap<usize, u8> = HashMap::new();
    let link = |i: usize| {
        ctx.e(i)
            .and_then(|e| e.request.as_ref())
            .and_then(|p| p.supersedes_task_id.as_deref())
            .and_then(|s| ctx.find(s))
            .filter(|&n| ctx.e(n).is_some_and(|ne| ne.request.is_some()))
    };
    let mut in_cycle: Vec<usize> = Vec::new();
    for &start in &ctx.requests {
        let mut path = Vec::new();
        let mut cur = Some(start);
        while let Some(c) = cur {
            match colour.get(&c).copied().unwrap_or(0) {
                0 => {
                    colour.insert(c, 1);
                    path.push(c);
                    cur = link(c);
                }
                1 => {
                    // Found a cycle: the path from `c` onwards.
                    if let Some(pos) = path.iter().position(|&x| x == c) {
                        in_cycle.extend(path.get(pos..).unwrap_or(&[]));
                    }
                    break;
                }
                _ => break,
            }
        }
        for p in path {
            colour.insert(p, 2);
        }
    }
    in_cycle.sort_unstable();
    for r in in_cycle {
        ctx.report(
            out,
            RuleId::DrOneRequest,
            Some(r),
            "supersession forms a cycle".into(),
        );
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
    for (r, e) in all_requests(ctx) {
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
        let dissent: HashSet<&str> = p.dissent_ids.iter().map(String::as_str).collect();
        for c in attached(ctx, p) {
            let Some(ce) = ctx.e(c).filter(|ce| is_open(ce)) else {
                continue;
            };
            if !dissent.contains(ce.task_id.as_str()) {
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
/// approve; a conditional-approve is still blocked when an open attached challenge is a HARD
/// gate. (Over an open HARD gate DR-HARD-GATE reports the same recommendation too: the rule
/// text puts the HARD-gate clause in both rules.)
pub fn dr_no_approve_over_dissent(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (r, _, p) in requests(ctx) {
        let blocked_by: fn(&Envelope) -> bool = match p.recommended_outcome.as_str() {
            "approve" => is_open,
            "conditional-approve" => |ce| is_open(ce) && is_hard_gate(ce),
            _ => continue,
        };
        if let Some(ce) = attached(ctx, p)
            .into_iter()
            .filter_map(|c| ctx.e(c))
            .find(|ce| blocked_by(ce))
        {
            ctx.report(
                out,
                RuleId::DrNoApproveOverDissent,
                Some(r),
                format!(
                    "recommends {} over open {} `{}`",
                    p.recommended_outcome,
                    if is_hard_gate(ce) {
                        "HARD gate"
                    } else {
                        "challenge"
                    },
                    ce.task_id
                ),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ho_schema, Catalog, Limits};

    /// A deterministic pseudo-random record set: random parents (earlier envelopes), random
    /// seconds (often equal), and a mix of delegates, challenges, requests and records.
    fn synthetic(seed: u64, n: usize) -> String {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = move |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        let agent = |k: u64| {
            [
                "agentic-system-architecture-review-agent",
                "agentic-security-review-agent",
                "legal-regulatory-compliance-agent",
            ][k as usize % 3]
        };
        let mut msgs = Vec::new();
        for i in 0..n {
            let parent = if i == 0 {
                "null".to_owned()
            } else {
                format!("\"t-{:03}\"", next(i as u64))
            };
            let kind = if i == 0 { 0 } else { next(4) };
            let (mt, extra) = match kind {
                0 => ("delegate", String::new()),
                1 => (
                    "challenge",
                    format!(
                        r#","challenge":{{"proposal_task_id":"t-{:03}","round":1,"hard_gate":{},"outcome":"sustained","finding":"f"}}"#,
                        next(n as u64),
                        next(2) == 0
                    ),
                ),
                2 => (
                    "decision-request",
                    format!(
                        r#","decision_request":{{"decision_class":"architecture","proposer_agent":"{}","proposal_summary":"p","alternatives":[],"challenge_task_ids":["t-{:03}"],"dissent":[],"recommended_outcome":"reject"}}"#,
                        agent(next(3)),
                        next(n as u64)
                    ),
                ),
                _ => (
                    "decision-record",
                    format!(
                        r#","decision_record":{{"request_task_id":"t-{:03}","request_digest":"sha256:{}","outcome":"reject","decided_by":{{"kind":"principal","subject":"subject:corp:0123456789abcdef","role":"r"}},"rationale":"r","dissent_acknowledged":true}}"#,
                        next(n as u64),
                        "0".repeat(64)
                    ),
                ),
            };
            msgs.push(format!(
                r#"{{"schema_version":"1.0.0","message_type":"{mt}","task_id":"t-{i:03}","correlation_id":"c-1","parent_task_id":{parent},"hop_count":{},"max_hops":6,"sent_at":"2026-11-02T09:00:{:02}Z","source":{{"kind":"agent","id":"{}"}},"destination":{{"kind":"agent","id":"{}"}},"objective":"Assess whether this holds.","input_schema_version":"1.0.0","subject_risk_tier":"R{}","data_classification":"internal","materiality_flags":{},"authorized_actions":["read"],"do_not_do_list":["none"],"evidence_refs":[],"missing_evidence":[],"budget":{{"currency":"USD","limit_tool_calls":1,"spent_tool_calls":0,"limit_tokens":1,"spent_tokens":0,"limit_cost_minor":1,"spent_cost_minor":0}},"deadline":"2026-11-06T17:00:00Z","approval_state":"not-required","expected_output_schema":"x/1.0.0","status":"completed","stop_reasons":[],"synthetic":true{extra}}}"#,
                usize::from(i != 0),
                next(6),
                agent(next(3)),
                agent(next(3)),
                next(6),
                if next(3) == 0 { r#"["financial"]"# } else { "[]" }
            ));
        }
        format!(r#"{{"messages":[{}]}}"#, msgs.join(","))
    }

    #[test]
    fn window_matches_the_definition() {
        let catalog = Catalog::default();
        for seed in 0..40 {
            let text = synthetic(seed, 40);
            let envs = ho_schema(text.as_bytes(), Limits::default()).unwrap();
            let ctx = Ctx::new(&envs, &catalog);
            for (r, _, _) in requests(&ctx) {
                let bound = if in_force(&ctx, r) {
                    records_of(&ctx, r)
                } else {
                    &[]
                };
                for aside in [false, true] {
                    let w = Window::of(&ctx, r, aside);
                    for i in 0..envs.len() {
                        let want = i != r
                            && !(aside && bound.contains(&i))
                            && (!ctx.after(i, r) || bound.iter().any(|&b| !ctx.after(i, b)));
                        assert_eq!(
                            w.contains(&ctx, i),
                            want,
                            "seed {seed} request {r} envelope {i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn exchange_counts_match_the_definition() {
        let catalog = Catalog::default();
        for seed in 0..40 {
            let text = synthetic(seed, 40);
            let envs = ho_schema(text.as_bytes(), Limits::default()).unwrap();
            let ctx = Ctx::new(&envs, &catalog);
            for c in 0..envs.len() {
                for (from, to) in [(0u32, 1u32), (1, 0), (1, 2), (2, 1), (0, 2)] {
                    let want = (0..envs.len())
                        .filter(|&i| {
                            ctx.src[i] == from
                                && ctx.dst[i] == to
                                && crate::index::is_exchange(&envs[i])
                                && ctx.precedes(i, c)
                        })
                        .count();
                    assert_eq!(ctx.exchanges_before(from, to, c), want, "seed {seed} c {c}");
                }
            }
        }
    }

    #[test]
    fn missing_challenge_counts_match_the_definition() {
        let catalog = Catalog::default();
        let mut total = 0;
        for seed in 0..40 {
            let text = synthetic(seed, 40);
            let envs = ho_schema(text.as_bytes(), Limits::default()).unwrap();
            let ctx = Ctx::new(&envs, &catalog);
            let mut out = Vec::new();
            dr_challenge_complete(&ctx, &mut out);
            for (r, e, p) in requests(&ctx) {
                let w = Window::of(&ctx, r, false);
                let have = attached(&ctx, p);
                let want = ctx
                    .challenges
                    .iter()
                    .filter(|&&c| {
                        (is_hard_gate(&envs[c]) || targets_agent(&ctx, c, &p.proposer_agent))
                            && !have.contains(&c)
                            && w.contains(&ctx, c)
                    })
                    .count();
                let got = out
                    .iter()
                    .filter(|f| f.task_id.as_deref() == Some(e.task_id.as_str()))
                    .count();
                assert_eq!(got, want, "seed {seed} request {r}");
                total += want;
            }
        }
        assert!(total > 10, "the synthetic sets exercise the rule: {total}");
    }
}
