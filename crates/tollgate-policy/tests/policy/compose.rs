//! The composition of guards and policies: a vector for each boundary of the rule order,
//! and "no policy set, exactly the guards' verdict".

use tollgate_core::json::Value;
use tollgate_core::labels::LabelSet;
use tollgate_core::{
    apply_decision, decide as guards, record_human_decision, Decision, GuardConfig, HitlMode,
    HumanDecision, Money, Params, SessionState, ToolCall, Verdict,
};
use tollgate_policy::compose::{decide, Enforced, Input};
use tollgate_policy::{DefaultEffect, Policies};

use crate::common::{json, set_with, NOW};

const RULES: &str = r#"
@id("no-shell") forbid(principal, action == Action::"shell", resource);
@id("big-pay") @hitl permit(principal, action == Action::"pay", resource)
  when { context.args.amount.greaterThan(decimal("100.0")) };
@id("blocked-payee") forbid(principal, action == Action::"pay", resource)
  when { context.args.to == "blocked" };
"#;

fn enforced(text: &str, trip: bool) -> Enforced {
    Enforced {
        policies: set_with(&[("p.cedar", text)], DefaultEffect::Allow, None),
        trip_on_refusal: trip,
    }
}

fn budget(usd: i64) -> GuardConfig {
    GuardConfig {
        budget: Money(usd * 1_000_000_000),
        ..GuardConfig::default()
    }
}

struct Run<'a> {
    config: GuardConfig,
    policy: Option<&'a Enforced>,
    state: SessionState,
    labels: LabelSet,
}

impl Run<'_> {
    fn call(
        &mut self,
        tool: &str,
        args: &str,
        nonce: u64,
        number: u64,
    ) -> tollgate_policy::compose::Composed {
        let value: Value = json(args);
        let call = ToolCall {
            nonce: Some(nonce),
            estimated_cost: Money(1_000_000_000),
            ..ToolCall::new(tool, Params::json(&value))
        };
        let policies: Policies = self.policy.map_or_else(
            || set_with(&[], DefaultEffect::Allow, None),
            |e| e.policies.clone(),
        );
        let actor = policies.actor("acme", "bot", "local").unwrap();
        let c = decide(
            &self.config,
            self.policy,
            &self.state,
            &call,
            Input {
                actor: &actor,
                args: Some(&value),
                labels: &self.labels,
            },
            NOW,
            0.5,
        );
        // Apply as a runtime would: a DENY that does not trip changes nothing.
        if c.verdict != Verdict::Deny || c.trips {
            apply_decision(
                &self.config,
                &mut self.state,
                &call,
                &applied(&c),
                number,
                NOW,
            );
        }
        c
    }
}

/// The decision a runtime applies for `c` (what the daemon applies too).
fn applied(c: &tollgate_policy::compose::Composed) -> Decision {
    c.applied()
}

fn run(config: GuardConfig, policy: Option<&Enforced>) -> Run<'_> {
    let state = SessionState::new(config.budget, NOW);
    Run {
        config,
        policy,
        state,
        labels: LabelSet::new(),
    }
}

#[test]
fn a_forbidden_tool_in_a_tripped_session_is_circuit_open() {
    let e = enforced(RULES, false);
    let mut r = run(budget(10), Some(&e));
    r.state.circuit_tripped = true;
    let c = r.call("shell", "{}", 1, 1);
    assert_eq!(
        (c.verdict, c.reason()),
        (Verdict::Deny, "circuit_open".to_owned())
    );
    assert_eq!(
        c.policy, None,
        "the policies are not evaluated behind rules 1-3"
    );
}

#[test]
fn a_forbid_when_the_budget_is_also_exhausted_names_the_policy_and_does_not_trip() {
    let e = enforced(RULES, false);
    let mut r = run(budget(10), Some(&e));
    r.state.budget_remaining = Money(0);
    let c = r.call("shell", "{}", 1, 1);
    assert_eq!(
        (c.verdict, c.reason()),
        (Verdict::Deny, "policy:no-shell".to_owned())
    );
    assert!(!c.trips && !r.state.circuit_tripped);
    // Another tool: the guards' own refusal, which trips.
    let c = r.call("search", "{}", 2, 2);
    assert_eq!(
        (c.verdict, c.reason()),
        (Verdict::Deny, "budget_exhausted".to_owned())
    );
    assert!(c.trips && r.state.circuit_tripped);
}

#[test]
fn a_policy_refusal_trips_only_when_configured() {
    let e = enforced(RULES, true);
    let mut r = run(budget(10), Some(&e));
    let c = r.call("shell", "{}", 1, 1);
    assert_eq!(c.reason(), "policy:no-shell");
    assert!(c.trips && r.state.circuit_tripped);
    assert_eq!(r.call("search", "{}", 2, 2).reason(), "circuit_open");
    // Without the setting the agent goes on with its other tools.
    let e = enforced(RULES, false);
    let mut r = run(budget(10), Some(&e));
    assert_eq!(r.call("shell", "{}", 1, 1).reason(), "policy:no-shell");
    let c = r.call("search", "{}", 2, 2);
    assert_eq!(
        (c.verdict, c.reason()),
        (Verdict::Allow, "within_thresholds".to_owned())
    );
}

#[test]
fn the_approved_redispatch_of_a_held_call_is_allowed_but_a_forbid_still_wins() {
    let e = enforced(RULES, false);
    let mut r = run(budget(1000), Some(&e));
    let args = r#"{"amount":250.5,"to":"acme"}"#;
    let held = r.call("pay", args, 7, 1);
    assert_eq!(
        (held.verdict, held.reason()),
        (Verdict::Hitl, "policy:big-pay".to_owned())
    );
    record_human_decision(&mut r.state, None, HumanDecision::Approve, None, NOW).unwrap();
    let released = r.call("pay", args, 7, 2);
    assert_eq!(
        (released.verdict, released.reason()),
        (Verdict::Allow, "hitl_transition:approve".to_owned())
    );

    // Held again, approved, and meanwhile a forbid covers the call (a reload): refused.
    let held = r.call("pay", args, 8, 3);
    assert_eq!(held.verdict, Verdict::Hitl);
    record_human_decision(&mut r.state, None, HumanDecision::Approve, None, NOW).unwrap();
    let stricter = enforced(
        &format!(
            "{RULES}\n@id(\"emergency\") forbid(principal, action == Action::\"pay\", resource);"
        ),
        false,
    );
    r.policy = Some(&stricter);
    let refused = r.call("pay", args, 8, 4);
    assert_eq!(
        (refused.verdict, refused.reason()),
        (Verdict::Deny, "policy:emergency".to_owned())
    );
}

#[test]
fn the_guards_refusals_stand_before_a_policys_hold_and_a_policys_hold_before_theirs() {
    let e = enforced(RULES, false);
    // Cost above what is left: the guards' DENY, not the policy's HITL.
    let mut r = run(budget(1), Some(&e));
    r.state.budget_remaining = Money(500_000_000);
    let c = r.call("pay", r#"{"amount":250.5,"to":"acme"}"#, 1, 1);
    assert_eq!(
        (c.verdict, c.reason()),
        (Verdict::Deny, "budget_overrun".to_owned())
    );
    // hitl_mode ALWAYS: both hold; the policy's reason names the rule.
    let mut r = run(
        GuardConfig {
            hitl_mode: HitlMode::Always,
            ..budget(1000)
        },
        Some(&e),
    );
    let c = r.call("pay", r#"{"amount":250.5,"to":"acme"}"#, 1, 1);
    assert_eq!(
        (c.verdict, c.reason()),
        (Verdict::Hitl, "policy:big-pay".to_owned())
    );
}

#[test]
fn without_a_policy_set_the_verdict_is_the_guards_exactly() {
    // Every guard path this test reaches, with and without an empty enforced set.
    let empty = enforced("", false);
    for policy in [None, Some(&empty)] {
        for config in [
            budget(10),
            budget(0),
            GuardConfig {
                max_repeat_calls: 2,
                ..budget(100)
            },
            GuardConfig {
                hitl_mode: HitlMode::Always,
                ..budget(100)
            },
        ] {
            let mut r = run(config.clone(), policy);
            let mut shadow = SessionState::new(config.budget, NOW);
            for (i, tool) in ["a", "a", "a", "b", "b", "c"].iter().enumerate() {
                let n = i as u64 + 1;
                let value = json("{\"q\":1}");
                let call = ToolCall {
                    nonce: Some(n),
                    estimated_cost: Money(1_000_000_000),
                    ..ToolCall::new(tool, Params::json(&value))
                };
                let want = guards(&config, &shadow, &call, NOW, 0.5);
                let got = r.call(tool, "{\"q\":1}", n, n);
                assert_eq!((got.verdict, got.guards), (want.verdict, want));
                assert_eq!(got.reason(), want.reason.as_str());
                assert_eq!(got.trips, want.verdict == Verdict::Deny);
                apply_decision(&config, &mut shadow, &call, &want, n, NOW);
            }
        }
    }
}
