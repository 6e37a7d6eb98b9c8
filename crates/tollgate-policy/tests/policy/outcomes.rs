//! What the policies make of a call: one test per rule of the crate's outcome order, the
//! number mapping end to end, and the model's fields.

use tollgate_core::labels::{Label, LabelSet, MAX_LABELS};
use tollgate_core::Money;
use tollgate_policy::args::ArgIssue;
use tollgate_policy::number::Unrepresentable;
use tollgate_policy::{Call, DefaultEffect, DenyCause, Effect};

use crate::common::{actor, eval, eval_in, json, reason, set, set_with, Session, NOW};

const PAY: &str = r#"
@id("big-payment")
forbid(principal, action == Action::"pay", resource)
  when { context.args.amount.greaterThan(decimal("100.0")) };
"#;

#[test]
fn a_fraction_is_a_decimal_never_truncated() {
    let p = set(PAY);
    assert_eq!(
        reason(&eval(&p, "pay", Some(r#"{"amount":100.50}"#))),
        "policy:big-payment"
    );
    assert_eq!(reason(&eval(&p, "pay", Some(r#"{"amount":100.0}"#))), "-");
    assert_eq!(reason(&eval(&p, "pay", Some(r#"{"amount":99.9999}"#))), "-");
    assert_eq!(
        reason(&eval(&p, "pay", Some(r#"{"amount":100.0001}"#))),
        "policy:big-payment"
    );
    // An integer is a Long: comparing it with a decimal fails, and failing refuses.
    assert_eq!(
        reason(&eval(&p, "pay", Some(r#"{"amount":150}"#))),
        "policy_error:big-payment"
    );
    // And `> 100` on a fraction fails the same way: never "false, so allowed".
    let gt = set("@id(\"gt\") forbid(principal, action == Action::\"pay\", resource) when { context.args.amount > 100 };");
    assert_eq!(
        reason(&eval(&gt, "pay", Some(r#"{"amount":100.50}"#))),
        "policy_error:gt"
    );
    assert_eq!(
        reason(&eval(&gt, "pay", Some(r#"{"amount":101}"#))),
        "policy:gt"
    );
    assert_eq!(reason(&eval(&gt, "pay", Some(r#"{"amount":100}"#))), "-");
}

#[test]
fn a_schema_makes_every_number_of_an_argument_one_type() {
    let schema = r#"action "pay" appliesTo { principal: Agent, resource: Upstream,
        context: { args: { amount: decimal, count: Long } } };"#;
    let p = set_with(&[("p.cedar", PAY)], DefaultEffect::Allow, Some(schema));
    for (args, want) in [
        (r#"{"amount":101}"#, "policy:big-payment"),
        (r#"{"amount":100}"#, "-"),
        (r#"{"amount":100.5}"#, "policy:big-payment"),
        (r#"{"amount":100.00}"#, "-"),
    ] {
        assert_eq!(reason(&eval(&p, "pay", Some(args))), want, "{args}");
    }
    let count = set_with(
        &[("p.cedar", "@id(\"many\") forbid(principal, action == Action::\"pay\", resource) when { context.args.count > 3 };")],
        DefaultEffect::Allow,
        Some(schema),
    );
    assert_eq!(
        reason(&eval(&count, "pay", Some(r#"{"count":4.0}"#))),
        "policy:many"
    );
    assert_eq!(reason(&eval(&count, "pay", Some(r#"{"count":3.0}"#))), "-");
    let o = eval(&count, "pay", Some(r#"{"count":3.5}"#));
    assert_eq!(
        o.effect,
        Effect::Deny {
            policy: count.ids().next().unwrap().clone(),
            cause: DenyCause::Unrepresentable {
                path: vec!["count".into()],
                issue: ArgIssue::Number(Unrepresentable::NotAnInteger)
            }
        }
    );
}

#[test]
fn unrepresentable_numbers_fail_closed_only_for_the_rules_that_read_them() {
    let p = set(r#"
        @id("reads-amount") forbid(principal, action == Action::"pay", resource)
          when { context.args.amount.greaterThan(decimal("100.0")) };
        @id("reads-note") forbid(principal, action == Action::"pay", resource)
          when { context.args.note == "drop tables" };
    "#);
    for args in [
        r#"{"amount":0.12345}"#,
        r#"{"amount":1e300}"#,
        r#"{"amount":123456789012345678901234567890}"#,
    ] {
        assert_eq!(
            reason(&eval(&p, "pay", Some(args))),
            "policy_unrepresentable:reads-amount",
            "{args}"
        );
    }
    // The unrepresentable value is elsewhere: the reader of `amount` is unaffected.
    assert_eq!(
        reason(&eval(
            &p,
            "pay",
            Some(r#"{"amount":5.5,"fee":0.12345,"note":"hi"}"#)
        )),
        "-"
    );
    let o = eval(&p, "pay", Some(r#"{"amount":5.5,"note":[null]}"#));
    assert_eq!(reason(&o), "policy_unrepresentable:reads-note");
}

#[test]
fn forbid_wins_and_names_the_first_matching_policy() {
    let p = set(r#"
        @id("allow-all") permit(principal, action, resource);
        @id("no-shell") forbid(principal, action == Action::"shell", resource);
        @id("no-shell-either") forbid(principal, action in [Action::"shell", Action::"exec"], resource);
    "#);
    assert_eq!(reason(&eval(&p, "shell", None)), "policy:no-shell");
    assert_eq!(reason(&eval(&p, "exec", None)), "policy:no-shell-either");
    assert_eq!(
        eval(&p, "search", None).effect,
        Effect::Permit {
            policy: p.ids().next().unwrap().clone()
        }
    );
}

#[test]
fn default_deny_refuses_what_no_permit_matches() {
    let text = r#"
        @id("tools") permit(principal, action in [Action::"search", Action::"read"], resource);
        @id("small-pay") permit(principal, action == Action::"pay", resource)
          when { context.args.amount.lessThan(decimal("10.0")) };
    "#;
    let p = set_with(&[("p.cedar", text)], DefaultEffect::Deny, None);
    assert_eq!(reason(&eval(&p, "search", None)), "-");
    assert_eq!(reason(&eval(&p, "shell", None)), "policy_default_deny");
    assert_eq!(reason(&eval(&p, "pay", Some(r#"{"amount":5.5}"#))), "-");
    assert_eq!(
        reason(&eval(&p, "pay", Some(r#"{"amount":50.5}"#))),
        "policy_default_deny"
    );
    // The same set with default allow leaves unmatched calls to the guards.
    let a = set_with(&[("p.cedar", text)], DefaultEffect::Allow, None);
    assert_eq!(eval(&a, "shell", None).effect, Effect::Pass);
    // And an empty set is no effect at all, or a denial of everything.
    let none = set_with(&[], DefaultEffect::Allow, None);
    assert_eq!(eval(&none, "shell", Some("{}")).effect, Effect::Pass);
    let deny_all = set_with(&[], DefaultEffect::Deny, None);
    assert_eq!(
        eval(&deny_all, "shell", Some("{}")).effect,
        Effect::DefaultDeny
    );
}

#[test]
fn hitl_holds_until_approved_and_a_forbid_still_wins_over_the_approval() {
    let p = set(r#"
        @id("big-pay") @hitl("payments over 100 USD need a person")
        permit(principal, action == Action::"pay", resource)
          when { context.args.amount.greaterThan(decimal("100.0")) };
        @id("sanctioned") forbid(principal, action == Action::"pay", resource)
          when { context.args.to == "sanctioned-co" };
    "#);
    let s = Session::default();
    let held = eval_in(
        &p,
        &s,
        "pay",
        Some(r#"{"amount":250.5,"to":"acme"}"#),
        false,
    );
    assert_eq!(
        held.effect,
        Effect::Hitl {
            policy: p.ids().next().unwrap().clone(),
            message: "payments over 100 USD need a person".into()
        }
    );
    let approved = eval_in(&p, &s, "pay", Some(r#"{"amount":250.5,"to":"acme"}"#), true);
    assert_eq!(reason(&approved), "-");
    assert!(matches!(approved.effect, Effect::Permit { .. }));
    let forbidden = eval_in(
        &p,
        &s,
        "pay",
        Some(r#"{"amount":250.5,"to":"sanctioned-co"}"#),
        true,
    );
    assert_eq!(reason(&forbidden), "policy:sanctioned");
    assert_eq!(
        reason(&eval_in(
            &p,
            &s,
            "pay",
            Some(r#"{"amount":5.5,"to":"acme"}"#),
            false
        )),
        "-"
    );
}

#[test]
fn labels_attach_on_permit_and_later_rules_read_them() {
    let p = set(r#"
        @id("read-customers") @label("customer-data")
        permit(principal, action == Action::"crm_read", resource);
        @id("external-mail") @hitl
        permit(principal, action == Action::"send_email", resource)
          when { context.session.labels.contains("customer-data") && !(context.args.to like "*@acme.example") };
    "#);
    let mut s = Session::default();
    assert_eq!(
        reason(&eval_in(
            &p,
            &s,
            "send_email",
            Some(r#"{"to":"x@evil.example"}"#),
            false
        )),
        "-"
    );
    let read = eval_in(&p, &s, "crm_read", Some("{}"), false);
    assert_eq!(read.labels, vec![Label::parse("customer-data").unwrap()]);
    s.labels = s.labels.with(&read.labels).unwrap();
    assert_eq!(
        reason(&eval_in(
            &p,
            &s,
            "send_email",
            Some(r#"{"to":"x@evil.example"}"#),
            false
        )),
        "policy:external-mail"
    );
    assert_eq!(
        reason(&eval_in(
            &p,
            &s,
            "send_email",
            Some(r#"{"to":"bob@acme.example"}"#),
            false
        )),
        "-"
    );
    // A label already carried is not added again.
    assert!(eval_in(&p, &s, "crm_read", Some("{}"), false)
        .labels
        .is_empty());
}

#[test]
fn a_label_past_the_bound_refuses_the_call() {
    let p = set("@id(\"tagger\") @label(\"one-more\") permit(principal, action == Action::\"t\", resource);");
    let full: Vec<Label> = (0..MAX_LABELS)
        .map(|i| Label::parse(&format!("l{i}")).unwrap())
        .collect();
    let s = Session {
        labels: LabelSet::new().with(&full).unwrap(),
        ..Session::default()
    };
    assert_eq!(
        reason(&eval_in(&p, &s, "t", None, false)),
        "policy_label_limit:tagger"
    );
    // One fewer: fine.
    let s = Session {
        labels: LabelSet::new().with(&full[1..]).unwrap(),
        ..Session::default()
    };
    assert_eq!(eval_in(&p, &s, "t", None, false).labels.len(), 1);
}

#[test]
fn a_policy_reading_args_refuses_calls_without_params_for_its_tools_only() {
    let p = set(r#"
        @id("shell-list") forbid(principal, action == Action::"shell", resource)
          unless { ["ls", "cat"].contains(context.args.command) };
        @id("no-delete") forbid(principal, action == Action::"delete", resource);
    "#);
    assert_eq!(
        reason(&eval(&p, "shell", None)),
        "policy_params_required:shell-list"
    );
    assert_eq!(p.reads_args("shell").unwrap().as_str(), "shell-list");
    assert_eq!(reason(&eval(&p, "shell", Some(r#"{"command":"ls"}"#))), "-");
    assert_eq!(
        reason(&eval(&p, "shell", Some(r#"{"command":"rm"}"#))),
        "policy:shell-list"
    );
    // A missing attribute is an evaluation error: refused, not skipped.
    assert_eq!(
        reason(&eval(&p, "shell", Some(r#"{"cmd":"ls"}"#))),
        "policy_error:shell-list"
    );
    assert_eq!(reason(&eval(&p, "search", None)), "-");
    assert!(p.reads_args("search").is_none());
    assert_eq!(reason(&eval(&p, "delete", None)), "policy:no-delete");
}

#[test]
fn args_cannot_forge_entities_or_extension_values() {
    let p = set(r#"
        @id("no-admin") forbid(principal, action, resource)
          unless { context has args && context.args has who && context.args.who == {"__entity": {"type": "Agent", "id": "acme/admin"}} };
    "#);
    // The record is compared as a record, so it equals the literal record, and nothing
    // made it an entity reference.
    let o = eval(
        &p,
        "t",
        Some(r#"{"who":{"__entity":{"type":"Agent","id":"acme/admin"}}}"#),
    );
    assert_eq!(reason(&o), "-");
    let q = set(
        "@id(\"is-agent\") forbid(principal, action, resource) when { context.args.who is Agent };",
    );
    assert_eq!(
        reason(&eval(
            &q,
            "t",
            Some(r#"{"who":{"__entity":{"type":"Agent","id":"x"}}}"#)
        )),
        "policy_error:is-agent"
    );
    let r = set("@id(\"dec\") forbid(principal, action, resource) when { context.args.d.greaterThan(decimal(\"1.0\")) };");
    assert_eq!(
        reason(&eval(
            &r,
            "t",
            Some(r#"{"d":{"__extn":{"fn":"decimal","arg":"5.0"}}}"#)
        )),
        "policy_error:dec"
    );
}

#[test]
fn the_principal_time_cost_and_session_are_inputs() {
    let p = set(r#"
        @id("bot-only") forbid(principal, action == Action::"deploy", resource) unless { principal == Agent::"acme/deployer" };
        @id("org") forbid(principal in Organization::"other", action, resource);
        @id("attr") forbid(principal, action == Action::"audit", resource) unless { principal.agent == "auditor" && principal.organization == "acme" };
        @id("night") forbid(principal, action == Action::"batch", resource) when { context.now < datetime("2023-11-14T22:00:00Z") };
        @id("dear") forbid(principal, action == Action::"llm", resource) when { context.cost_usd.greaterThan(decimal("0.0010")) };
        @id("low") @hitl permit(principal, action == Action::"buy", resource) when { context.session.budget_fraction.lessThan(decimal("0.5")) };
        @id("calls") forbid(principal, action == Action::"spam", resource) when { context.session.calls >= 3 };
        @id("local") forbid(principal, action == Action::"remote_only", resource) when { resource == Upstream::"local" };
        @id("name") forbid(principal, action, resource) when { context.tool like "danger_*" };
    "#);
    assert_eq!(reason(&eval(&p, "deploy", None)), "policy:bot-only");
    let deployer = p.actor("acme", "deployer", "local").unwrap();
    let s = Session::default();
    let call = |tool: &'static str, cost: i64, now: i64| Call {
        tool,
        args: None,
        cost: Money(cost),
        now,
        session: s.view(),
        approved: false,
    };
    assert_eq!(
        p.evaluate(&deployer, &call("deploy", 0, NOW))
            .effect
            .reason(),
        None
    );
    let other = p.actor("other", "bot", "local").unwrap();
    assert_eq!(
        p.evaluate(&other, &call("search", 0, NOW))
            .effect
            .reason()
            .unwrap(),
        "policy:org"
    );
    assert_eq!(reason(&eval(&p, "audit", None)), "policy:attr");
    let auditor = p.actor("acme", "auditor", "local").unwrap();
    assert_eq!(
        p.evaluate(&auditor, &call("audit", 0, NOW)).effect.reason(),
        None
    );
    // NOW is 2023-11-14T22:13:20Z.
    assert_eq!(reason(&eval(&p, "batch", None)), "-");
    assert_eq!(
        p.evaluate(&actor(&p), &call("batch", 0, NOW - 3_600_000_000_000))
            .effect
            .reason()
            .unwrap(),
        "policy:night"
    );
    // Cost rounds up to 0.0001: 0.00100001 USD is above 0.0010; 0.0010 exactly is not.
    assert_eq!(
        p.evaluate(&actor(&p), &call("llm", 1_000_010, NOW))
            .effect
            .reason()
            .unwrap(),
        "policy:dear"
    );
    assert_eq!(
        p.evaluate(&actor(&p), &call("llm", 1_000_000, NOW))
            .effect
            .reason(),
        None
    );
    assert_eq!(reason(&eval(&p, "buy", None)), "policy:low"); // 4 of 10 left
    assert_eq!(reason(&eval(&p, "spam", None)), "policy:calls");
    assert_eq!(reason(&eval(&p, "remote_only", None)), "policy:local");
    let remote = p.actor("acme", "bot", "github").unwrap();
    assert_eq!(
        p.evaluate(&remote, &call("remote_only", 0, NOW))
            .effect
            .reason(),
        None
    );
    assert_eq!(reason(&eval(&p, "danger_zone", None)), "policy:name");
}

#[test]
fn action_groups_from_the_schema() {
    let schema = r#"
        action "payments";
        action "pay" in ["payments"] appliesTo { principal: Agent, resource: Upstream };
        action "refund" in ["payments"] appliesTo { principal: Agent, resource: Upstream };
        action "search" appliesTo { principal: Agent, resource: Upstream };
    "#;
    let p = set_with(
        &[(
            "p.cedar",
            "@id(\"no-money\") forbid(principal, action in Action::\"payments\", resource);",
        )],
        DefaultEffect::Allow,
        Some(schema),
    );
    assert_eq!(reason(&eval(&p, "pay", None)), "policy:no-money");
    assert_eq!(reason(&eval(&p, "refund", None)), "policy:no-money");
    assert_eq!(reason(&eval(&p, "search", None)), "-");
    assert_eq!(p.named_tools(), vec!["pay", "payments", "refund"]);
}

#[test]
fn unconditional_refusals_are_known_without_a_call() {
    let p = set_with(
        &[(
            "p.cedar",
            r#"
            @id("no-shell") forbid(principal, action == Action::"shell", resource);
            @id("not-for-other") forbid(principal in Organization::"other", action == Action::"search", resource);
            @id("cond") forbid(principal, action == Action::"pay", resource) when { context.args.amount > 5 };
            @id("ok") permit(principal, action in [Action::"search", Action::"pay"], resource);
        "#,
        )],
        DefaultEffect::Deny,
        None,
    );
    let me = actor(&p);
    let other = p.actor("other", "bot", "local").unwrap();
    assert_eq!(
        p.denies_unconditionally(&me, "shell")
            .unwrap()
            .reason()
            .unwrap(),
        "policy:no-shell"
    );
    assert_eq!(p.denies_unconditionally(&me, "search"), None);
    assert_eq!(
        p.denies_unconditionally(&other, "search")
            .unwrap()
            .reason()
            .unwrap(),
        "policy:not-for-other"
    );
    assert_eq!(p.denies_unconditionally(&me, "pay"), None);
    assert_eq!(
        p.denies_unconditionally(&me, "unknown"),
        Some(Effect::DefaultDeny)
    );
}

#[test]
fn names_are_bounded() {
    let p = set("permit(principal, action, resource);");
    assert!(p.actor(&"a".repeat(257), "b", "local").is_none());
    assert!(p.actor("a", "b", &"c".repeat(256)).is_some());
    assert!(p.actor("a", "b", &"c".repeat(257)).is_none());
    // An upstream the log cannot record is no resource (a replay could not decide for it).
    for bad in ["", "up\nstream", "\u{7f}", "tab\there"] {
        assert!(p.actor("a", "b", bad).is_none(), "{bad:?}");
    }
    assert!(p.actor("a", "b", "é up-stream.v2").is_some());
    // A tool name is any string; the evaluation still gives an outcome.
    let odd = "tool \"with\" quotes\n and \u{0} nul";
    let s = Session::default();
    let call = Call {
        tool: odd,
        args: Some(&json("{}")),
        cost: Money(0),
        now: NOW,
        session: s.view(),
        approved: false,
    };
    assert!(matches!(
        p.evaluate(&actor(&p), &call).effect,
        Effect::Permit { .. }
    ));
}

#[test]
fn every_field_a_policy_names_is_there_even_when_only_tested_with_has() {
    for (test, want) in [
        ("context has now && context has cost_usd && context has tool", "policy:f"),
        ("context.session has calls && context.session has labels && context has session.budget_fraction", "policy:f"),
        ("context has session.budget_initial_usd && context has session.budget_remaining_usd", "policy:f"),
        ("context has args", "policy:f"),
        ("context has nothing_like_this", "-"),
    ] {
        let p = set(&format!("@id(\"f\") forbid(principal, action, resource) when {{ {test} }};"));
        assert_eq!(reason(&eval(&p, "t", Some("{}"))), want, "{test}");
    }
}
