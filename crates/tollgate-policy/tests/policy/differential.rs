//! Tollgate evaluates each policy's condition with Cedar's evaluator and combines the
//! results itself (docs: crate `eval`). This checks the combination against Cedar's own
//! authorizer, on random sets whose conditions hold, fail, and err (a missing attribute, a
//! type error, an overflow), over every context field Tollgate supplies.

use std::str::FromStr;

use cedar_policy::{
    Authorizer, Context, Decision, Entities, EntityUid, PolicySet, Request, RestrictedExpression,
};
use proptest::prelude::*;
use tollgate_core::labels::{Label, LabelSet};
use tollgate_core::Money;
use tollgate_policy::{Call, DefaultEffect, DenyCause, Effect, SessionView};

use crate::common::{actor, json, set_with, NOW};

const TOOLS: &[&str] = &["a", "b", "c"];

/// Conditions over what Tollgate puts in a request; some are type errors or read an
/// attribute that is not there, so they err.
const CONDITIONS: &[&str] = &[
    "context.args.n > 2",
    "context.args.n < 0",
    "context.args.n * 4611686018427387904 > 0",
    "context.args.missing > 1",
    "context.args.s > 1",
    "context.args.s like \"ab*\"",
    "context.args.d.greaterThan(decimal(\"1.5\"))",
    "context.args.tags.contains(\"x\")",
    "context.tool like \"a*\"",
    "context.cost_usd.greaterThan(decimal(\"0.5000\"))",
    "context.session.calls >= 3",
    "context.session.budget_fraction.lessThan(decimal(\"0.5\"))",
    "context.session.budget_remaining_usd.lessThan(decimal(\"4.0\"))",
    "context.session.labels.contains(\"seen\")",
    "context.now > datetime(\"2023-01-01\")",
    "principal.agent == \"bot\"",
    "principal in Organization::\"acme\"",
    "resource == Upstream::\"elsewhere\"",
];

#[derive(Debug, Clone)]
struct Rule {
    forbid: bool,
    tool: Option<usize>,
    when: Option<usize>,
    unless: Option<usize>,
    hitl: bool,
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        any::<bool>(),
        prop::option::of(0..TOOLS.len()),
        prop::option::of(0..CONDITIONS.len()),
        prop::option::of(0..CONDITIONS.len()),
        any::<bool>(),
    )
        .prop_map(|(forbid, tool, when, unless, hitl)| Rule {
            forbid,
            tool,
            when,
            unless,
            hitl: hitl && !forbid,
        })
}

fn text(rules: &[Rule], annotate: bool) -> String {
    let mut out = String::new();
    for (i, r) in rules.iter().enumerate() {
        if annotate {
            out.push_str(&format!("@id(\"r{i}\")\n"));
            if r.hitl {
                out.push_str("@hitl\n");
            }
        }
        let action = r.tool.map_or("action".to_owned(), |t| {
            format!("action == Action::\"{}\"", TOOLS[t])
        });
        out.push_str(&format!(
            "{}(principal, {action}, resource)",
            if r.forbid { "forbid" } else { "permit" }
        ));
        if let Some(c) = r.when {
            out.push_str(&format!(" when {{ {} }}", CONDITIONS[c]));
        }
        if let Some(c) = r.unless {
            out.push_str(&format!(" unless {{ {} }}", CONDITIONS[c]));
        }
        out.push_str(";\n");
    }
    out
}

fn decimal(ticks: i64) -> RestrictedExpression {
    let sign = if ticks < 0 { "-" } else { "" };
    let a = ticks.unsigned_abs();
    RestrictedExpression::new_decimal(format!("{sign}{}.{:04}", a / 10_000, a % 10_000))
}

/// What Cedar's authorizer says, in Tollgate's terms (the combination Tollgate
/// documents: the first satisfied forbid, else the first policy that erred, else the
/// default if no permit holds, else the first held permit unless approved, else the first
/// permit).
#[allow(clippy::too_many_arguments)]
fn reference(
    rules: &[Rule],
    tool: &str,
    n: i64,
    s: &str,
    d_ticks: i64,
    cost_ticks: i64,
    session: &SessionView<'_>,
    approved: bool,
    default: DefaultEffect,
) -> Effect {
    let set = PolicySet::from_str(&text(rules, false)).unwrap();
    let uid = |t: &str, id: &str| EntityUid::from_str(&format!("{t}::{id:?}")).unwrap();
    let entities = Entities::from_json_str(
        r#"[{"uid":{"type":"Agent","id":"acme/bot"},"attrs":{"organization":"acme","agent":"bot"},
             "parents":[{"type":"Organization","id":"acme"}]},
            {"uid":{"type":"Organization","id":"acme"},"attrs":{},"parents":[]},
            {"uid":{"type":"Upstream","id":"local"},"attrs":{},"parents":[]}]"#,
        None,
    )
    .unwrap();
    let fraction = {
        let r = i128::from(session.budget_remaining.0.max(0)) * 10_000;
        i64::try_from((r / i128::from(session.budget_initial.0)).clamp(0, 10_000)).unwrap()
    };
    let labels = session
        .labels
        .iter()
        .map(|l| RestrictedExpression::new_string(l.as_str().to_owned()));
    let context = Context::from_pairs([
        (
            "tool".to_owned(),
            RestrictedExpression::new_string(tool.to_owned()),
        ),
        ("cost_usd".to_owned(), decimal(cost_ticks)),
        (
            "now".to_owned(),
            RestrictedExpression::new_datetime("2023-11-14T22:13:20.000Z"),
        ),
        (
            "session".to_owned(),
            RestrictedExpression::new_record([
                (
                    "calls".to_owned(),
                    RestrictedExpression::new_long(i64::try_from(session.calls).unwrap()),
                ),
                (
                    "budget_initial_usd".to_owned(),
                    decimal(session.budget_initial.0 / 100_000),
                ),
                (
                    "budget_remaining_usd".to_owned(),
                    decimal(session.budget_remaining.0 / 100_000),
                ),
                ("budget_fraction".to_owned(), decimal(fraction)),
                ("labels".to_owned(), RestrictedExpression::new_set(labels)),
            ])
            .unwrap(),
        ),
        (
            "args".to_owned(),
            RestrictedExpression::new_record([
                ("n".to_owned(), RestrictedExpression::new_long(n)),
                (
                    "s".to_owned(),
                    RestrictedExpression::new_string(s.to_owned()),
                ),
                ("d".to_owned(), decimal(d_ticks)),
                (
                    "tags".to_owned(),
                    RestrictedExpression::new_set([
                        RestrictedExpression::new_string("x".to_owned()),
                        RestrictedExpression::new_long(1),
                    ]),
                ),
            ])
            .unwrap(),
        ),
    ])
    .unwrap();
    let request = Request::new(
        uid("Agent", "acme/bot"),
        uid("Action", tool),
        uid("Upstream", "local"),
        context,
        None,
    )
    .unwrap();
    let response = Authorizer::new().is_authorized(&request, &set, &entities);
    // Cedar names the policies of a parsed text policy0, policy1, ...
    let index = |id: &cedar_policy::PolicyId| -> usize {
        id.to_string()["policy".len()..].parse().unwrap()
    };
    let named = |i: usize| tollgate_policy::PolicyId::parse(&format!("r{i}")).unwrap();
    let reasons: Vec<usize> = response.diagnostics().reason().map(index).collect();
    if response.decision() == Decision::Deny {
        if let Some(&i) = reasons.iter().min() {
            return Effect::Deny {
                policy: named(i),
                cause: DenyCause::Forbid,
            };
        }
    }
    let erred = response.diagnostics().errors().map(|e| match e {
        cedar_policy::AuthorizationError::PolicyEvaluationError(e) => index(e.policy_id()),
    });
    if let Some(i) = erred.min() {
        return Effect::Deny {
            policy: named(i),
            cause: DenyCause::Error(String::new()),
        };
    }
    if response.decision() == Decision::Deny {
        return match default {
            DefaultEffect::Allow => Effect::Pass,
            DefaultEffect::Deny => Effect::DefaultDeny,
        };
    }
    let mut permits = reasons;
    permits.sort_unstable();
    if !approved {
        if let Some(&i) = permits.iter().find(|&&i| rules[i].hitl) {
            return Effect::Hitl {
                policy: named(i),
                message: String::new(),
            };
        }
    }
    Effect::Permit {
        policy: named(permits[0]),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Tollgate's outcome is the one Cedar's authorizer gives, for every random set.
    #[test]
    fn evaluation_agrees_with_cedars_authorizer(
        rules in prop::collection::vec(rule(), 0..14),
        tool in 0..TOOLS.len(),
        n in prop_oneof![Just(i64::MAX), Just(i64::MIN), -3i64..6],
        s in "(ab|x)[a-z]{0,3}",
        d_ticks in -30_000i64..30_000,
        cost_ticks in 0i64..10_000,
        calls in 0u64..6,
        remaining_ticks in 0i64..100_000,
        seen: bool,
        approved: bool,
        deny: bool,
    ) {
        let default = if deny { DefaultEffect::Deny } else { DefaultEffect::Allow };
        let p = set_with(&[("p.cedar", &text(&rules, true))], default, None);
        let labels = if seen {
            LabelSet::new().with(&[Label::parse("seen").unwrap()]).unwrap()
        } else {
            LabelSet::new()
        };
        let session = SessionView {
            calls,
            budget_initial: Money(10_000_000_000),
            budget_remaining: Money(remaining_ticks * 100_000),
            labels: &labels,
        };
        let sign = if d_ticks < 0 { "-" } else { "" };
        let d = format!("{sign}{}.{:04}", d_ticks.unsigned_abs() / 10_000, d_ticks.unsigned_abs() % 10_000);
        let args = json(&format!(
            r#"{{"n": {n}, "s": "{s}", "d": {d}, "tags": ["x", 1]}}"#
        ));
        let call = Call {
            tool: TOOLS[tool],
            args: Some(&args),
            cost: Money(cost_ticks * 100_000),
            now: NOW,
            session,
            approved,
        };
        let mut ours = p.evaluate(&actor(&p), &call).effect;
        // The reference does not carry texts: compare the rest.
        match &mut ours {
            Effect::Deny { cause: DenyCause::Error(t), .. } => t.clear(),
            Effect::Hitl { message, .. } => message.clear(),
            _ => {}
        }
        let theirs = reference(&rules, TOOLS[tool], n, &s, d_ticks, cost_ticks, &session, approved, default);
        prop_assert_eq!(ours, theirs, "for\n{}", text(&rules, true));
    }
}
