//! Parent-to-child rules: the chain links up, runs forward in time, keeps custody, and limits
//! only tighten. From handoff-envelope.md. Each check looks at (parent, child) pairs only,
//! where the child's parent_task_id resolves.

use crate::index::Ctx;
use crate::model::{Envelope, MessageType, Status};
use crate::{Finding, RuleId};

fn pairs(
    ctx: &Ctx<'_>,
    out: &mut Vec<Finding>,
    rule: RuleId,
    f: impl Fn(&Envelope, &Envelope) -> Option<String>,
) {
    for (i, child) in ctx.env.iter().enumerate() {
        if child.hop_count == 0 {
            continue;
        }
        let Some(p) = ctx.parent_of(i) else { continue };
        let Some(parent) = ctx.e(p) else { continue };
        if let Some(msg) = f(parent, child) {
            ctx.report(
                out,
                rule,
                Some(i),
                format!("{msg} (parent `{}`)", parent.task_id),
            );
        }
    }
}

/// HO-CHAIN-PARENT: a non-root envelope's parent is in the record set and its hop_count is
/// the parent's plus one; a missing parent is a violation.
pub fn ho_chain_parent(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (i, e) in ctx.env.iter().enumerate() {
        let Some(pid) = e.parent_task_id.as_deref() else {
            continue;
        };
        if e.hop_count == 0 {
            continue;
        }
        match ctx.parent_of(i).and_then(|p| ctx.e(p)) {
            None => ctx.report(
                out,
                RuleId::HoChainParent,
                Some(i),
                format!("parent `{pid}` is not in the record set"),
            ),
            Some(p) if p.hop_count.checked_add(1) != Some(e.hop_count) => ctx.report(
                out,
                RuleId::HoChainParent,
                Some(i),
                format!(
                    "hop_count is {} but parent `{pid}` has hop_count {}",
                    e.hop_count, p.hop_count
                ),
            ),
            Some(_) => {}
        }
    }
}

/// HO-CHAIN-TIME: an envelope is not sent before its parent.
pub fn ho_chain_time(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    pairs(ctx, out, RuleId::HoChainTime, |p, c| {
        (c.sent_at < p.sent_at)
            .then(|| format!("sent at {} before its parent at {}", c.sent_at, p.sent_at))
    });
}

/// HO-CHAIN-CUSTODY: an envelope is sent by its parent's destination, or by its parent's
/// sender when the parent was stopped.
pub fn ho_chain_custody(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    pairs(ctx, out, RuleId::HoChainCustody, |p, c| {
        let ok = c.source.same(&p.destination)
            || (p.status == Status::Stopped && c.source.same(&p.source));
        (!ok).then(|| {
            format!(
                "sent by {}, who was neither the parent's destination nor the sender of a stopped parent",
                c.source.show()
            )
        })
    });
}

/// HO-RETURN-TO-SENDER: a return goes to its parent's sender, or to the sender of an earlier
/// delegate in its chain that was addressed to the return's sender.
pub fn ho_return_to_sender(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    for (i, e) in ctx.env.iter().enumerate() {
        if e.message_type != MessageType::Return || e.hop_count == 0 {
            continue;
        }
        let Some(parent) = ctx.parent_of(i).and_then(|p| ctx.e(p)) else {
            continue;
        };
        if e.destination.same(&parent.source) {
            continue;
        }
        let via_delegate = ctx.ancestors(i).filter_map(|a| ctx.e(a)).any(|a| {
            a.message_type == MessageType::Delegate
                && a.destination.same(&e.source)
                && a.source.same(&e.destination)
        });
        if !via_delegate {
            ctx.report(
                out,
                RuleId::HoReturnToSender,
                Some(i),
                format!(
                    "return addressed to {}, who neither sent its parent `{}` nor delegated to {} earlier in the chain",
                    e.destination.show(),
                    parent.task_id,
                    e.source.show()
                ),
            );
        }
    }
}

/// HO-ATTEN-ACTIONS: authorized_actions never widen from parent to child.
pub fn ho_atten_actions(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    pairs(ctx, out, RuleId::HoAttenActions, |p, c| {
        (c.actions & !p.actions != 0).then(|| "authorized_actions widen beyond the parent's".into())
    });
}

const DIMENSIONS: [&str; 3] = ["tool_calls", "tokens", "cost_minor"];

/// HO-ATTEN-BUDGET: budget limits never increase from parent to child and the currency
/// never changes (limits are compared, not spent counters).
pub fn ho_atten_budget(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    pairs(ctx, out, RuleId::HoAttenBudget, |p, c| {
        if c.budget.currency != p.budget.currency {
            return Some(format!(
                "budget currency changes from {} to {}",
                p.budget.currency, c.budget.currency
            ));
        }
        let raised: Vec<String> = DIMENSIONS
            .iter()
            .zip(p.budget.limits.iter().zip(c.budget.limits.iter()))
            .filter(|(_, (pl, cl))| cl > pl)
            .map(|(d, (pl, cl))| format!("limit_{d} {pl} -> {cl}"))
            .collect();
        (!raised.is_empty()).then(|| format!("budget limits increase: {}", raised.join(", ")))
    });
}

/// HO-MONO-TIER: subject_risk_tier never decreases from parent to child.
pub fn ho_mono_tier(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    pairs(ctx, out, RuleId::HoMonoTier, |p, c| {
        (c.tier < p.tier)
            .then(|| format!("subject_risk_tier falls from R{} to R{}", p.tier, c.tier))
    });
}

/// HO-MONO-CLASS: data_classification never decreases from parent to child.
pub fn ho_mono_class(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    pairs(ctx, out, RuleId::HoMonoClass, |p, c| {
        (c.classification < p.classification).then(|| "data_classification decreases".into())
    });
}

/// HO-MONO-MATERIALITY: materiality_flags never lose a flag from parent to child.
pub fn ho_mono_materiality(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    pairs(ctx, out, RuleId::HoMonoMateriality, |p, c| {
        (p.flags & !c.flags != 0).then(|| "a materiality flag of the parent is dropped".into())
    });
}

/// HO-MONO-PROHIBITIONS: do_not_do_list never loses an item from parent to child.
pub fn ho_mono_prohibitions(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    pairs(ctx, out, RuleId::HoMonoProhibitions, |p, c| {
        let lost: Vec<&str> = p
            .prohibitions
            .iter()
            .filter(|item| !c.prohibitions.contains(item))
            .map(String::as_str)
            .collect();
        (!lost.is_empty()).then(|| format!("do_not_do_list drops {:?}", lost))
    });
}

/// HO-MONO-DEADLINE: the deadline never extends from parent to child.
pub fn ho_mono_deadline(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    pairs(ctx, out, RuleId::HoMonoDeadline, |p, c| {
        (c.deadline > p.deadline)
            .then(|| format!("deadline extends from {} to {}", p.deadline, c.deadline))
    });
}

/// HO-MONO-MAX-HOPS: max_hops never increases from parent to child.
pub fn ho_mono_max_hops(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    pairs(ctx, out, RuleId::HoMonoMaxHops, |p, c| {
        (c.max_hops > p.max_hops)
            .then(|| format!("max_hops rises from {} to {}", p.max_hops, c.max_hops))
    });
}

/// HO-MONO-SPENT: budget spent counters are cumulative and never decrease from parent to
/// child.
pub fn ho_mono_spent(ctx: &Ctx<'_>, out: &mut Vec<Finding>) {
    pairs(ctx, out, RuleId::HoMonoSpent, |p, c| {
        let fell: Vec<String> = DIMENSIONS
            .iter()
            .zip(p.budget.spent.iter().zip(c.budget.spent.iter()))
            .filter(|(_, (ps, cs))| cs < ps)
            .map(|(d, (ps, cs))| format!("spent_{d} {ps} -> {cs}"))
            .collect();
        (!fell.is_empty()).then(|| format!("spent counters decrease: {}", fell.join(", ")))
    });
}
