//! Property tests: forbid beats permit; no policy, no effect; labels only grow, bounded.

use proptest::prelude::*;
use tollgate_core::labels::{Label, LabelSet, MAX_LABELS};
use tollgate_core::Money;
use tollgate_policy::{Call, DefaultEffect, Effect};

use crate::common::{actor, json, set_with, Session, NOW};

const TOOLS: &[&str] = &["a", "b", "c"];

/// One random policy: effect, tool scope, an optional condition on `args.n`, `@hitl`,
/// `@label`.
#[derive(Debug, Clone)]
struct Rule {
    forbid: bool,
    tool: Option<usize>,
    threshold: Option<i64>,
    hitl: bool,
    label: Option<usize>,
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        any::<bool>(),
        prop::option::of(0..TOOLS.len()),
        prop::option::of(-2i64..4),
        any::<bool>(),
        prop::option::of(0usize..40),
    )
        .prop_map(|(forbid, tool, threshold, hitl, label)| Rule {
            forbid,
            tool,
            threshold,
            hitl: hitl && !forbid,
            label: label.filter(|_| !forbid),
        })
}

fn text(rules: &[Rule]) -> String {
    let mut out = String::new();
    for (i, r) in rules.iter().enumerate() {
        out.push_str(&format!("@id(\"r{i}\")\n"));
        if r.hitl {
            out.push_str("@hitl\n");
        }
        if let Some(l) = r.label {
            out.push_str(&format!("@label(\"l{l}\")\n"));
        }
        let action = r.tool.map_or("action".to_owned(), |t| {
            format!("action == Action::\"{}\"", TOOLS[t])
        });
        out.push_str(&format!(
            "{}(principal, {action}, resource)",
            if r.forbid { "forbid" } else { "permit" }
        ));
        if let Some(t) = r.threshold {
            out.push_str(&format!(" when {{ context.args.n > {t} }}"));
        }
        out.push_str(";\n");
    }
    out
}

fn call_outcome(
    p: &tollgate_policy::Policies,
    s: &Session,
    tool: &str,
    n: i64,
    approved: bool,
) -> tollgate_policy::Outcome {
    let args = json(&format!("{{\"n\":{n}}}"));
    let call = Call {
        tool,
        args: Some(&args),
        cost: Money(0),
        now: NOW,
        session: s.view(),
        approved,
    };
    p.evaluate(&actor(p), &call)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Whatever permits (held, labelled, conditional) a set has, a matching forbid makes
    /// the call a DENY naming a forbid, approved or not, with either default.
    #[test]
    fn forbid_beats_permit(mut rules in prop::collection::vec(rule(), 0..12), tool in 0..TOOLS.len(),
                           n in -3i64..6, approved: bool, deny: bool, at in 0usize..12) {
        let forbid = Rule { forbid: true, tool: Some(tool), threshold: None, hitl: false, label: None };
        let at = at.min(rules.len());
        rules.insert(at, forbid);
        let default = if deny { DefaultEffect::Deny } else { DefaultEffect::Allow };
        let p = set_with(&[("p.cedar", &text(&rules))], default, None);
        let o = call_outcome(&p, &Session::default(), TOOLS[tool], n, approved);
        let Effect::Deny { policy, .. } = &o.effect else { panic!("{o:?} for\n{}", text(&rules)) };
        let i: usize = policy.as_str()[1..].parse().unwrap();
        prop_assert!(rules[i].forbid, "{policy} is not a forbid");
        prop_assert!(o.labels.is_empty());
    }

    /// An empty set with default allow has no effect on any call.
    #[test]
    fn no_policy_means_no_effect(tool in "[a-z_]{1,12}", args in "[a-z]{0,4}", approved: bool, calls in 0u64..100) {
        let p = set_with(&[], DefaultEffect::Allow, None);
        let params = json(&format!("{{\"k\":\"{args}\"}}"));
        let s = Session { calls, ..Session::default() };
        for a in [None, Some(&params)] {
            let call = Call { tool: &tool, args: a, cost: Money(5), now: NOW, session: s.view(), approved };
            let o = p.evaluate(&actor(&p), &call);
            prop_assert_eq!(o.effect, Effect::Pass);
            prop_assert!(o.labels.is_empty());
        }
    }

    /// Over a session of random calls, labels only grow, never pass the bound, and an
    /// outcome only offers labels the session lacks; the same call in the same session
    /// always gives the same outcome.
    #[test]
    fn labels_only_grow_and_are_bounded(rules in prop::collection::vec(rule(), 1..16),
                                        calls in prop::collection::vec((0..TOOLS.len(), -3i64..6), 1..40),
                                        prefilled in 0..=MAX_LABELS) {
        let p = set_with(&[("p.cedar", &text(&rules))], DefaultEffect::Allow, None);
        // Start near the bound (labels no rule adds), so the bound is reached.
        let start: Vec<Label> = (0..prefilled).map(|i| Label::parse(&format!("k{i}")).unwrap()).collect();
        let mut s = Session { labels: LabelSet::new().with(&start).unwrap(), ..Session::default() };
        for (tool, n) in calls {
            let o = call_outcome(&p, &s, TOOLS[tool], n, false);
            prop_assert_eq!(&o, &call_outcome(&p, &s, TOOLS[tool], n, false));
            for l in &o.labels {
                prop_assert!(!s.labels.contains(l.as_str()));
            }
            if matches!(o.effect, Effect::Pass | Effect::Permit { .. }) {
                let before = s.labels.clone();
                s.labels = s.labels.with(&o.labels).expect("an offered label set fits the bound");
                prop_assert!(before.iter().all(|l| s.labels.contains(l.as_str())));
            } else {
                prop_assert!(o.labels.is_empty());
            }
            prop_assert!(s.labels.len() <= MAX_LABELS);
        }
    }
}
