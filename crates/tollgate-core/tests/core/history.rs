//! Bounded history (the nonce window, the reservation cap, one repeat run), settlement of
//! costs the core cannot read, and the held call's number in a pending transition.

use proptest::prelude::*;
use tollgate_core::{
    apply_post_exec, decide, GuardConfig, HitlMode, Money, Reason, ReportedCost, SessionState,
    Settlement, Verdict,
};

use crate::support::{call, params, step, usd};

#[test]
fn a_nonce_is_refused_while_in_the_window_and_forgotten_after() {
    let config = GuardConfig {
        nonce_window: 3,
        ..GuardConfig::default()
    };
    let mut s = SessionState::new(Money::ZERO, 0);
    for (i, tool) in ["a", "b", "c"].iter().enumerate() {
        let p = params(&format!(r#"{{"i":{i}}}"#));
        let d = step(
            &config,
            &mut s,
            &call(tool, &p, 10 + i as u64, Money::ZERO),
            1,
            0,
        );
        assert_eq!(d.verdict, Verdict::Allow);
    }
    let p = params(r#"{"x":1}"#);
    // Nonce 10 is still in the window: a replay.
    let replay = call("z", &p, 10, Money::ZERO);
    assert_eq!(
        decide(&config, &s, &replay, 0, 1.0).reason,
        Reason::DuplicateNonce
    );
    // One more allowed call pushes 10 out.
    step(&config, &mut s, &call("d", &p, 13, Money::ZERO), 4, 0);
    assert_eq!(s.seen_nonces.len(), 3);
    assert!(!s.seen_nonces.contains(&10));
    assert_eq!(
        decide(&config, &s, &replay, 0, 1.0).reason,
        Reason::WithinThresholds
    );
}

#[test]
fn history_stays_bounded_over_many_calls() {
    let config = GuardConfig {
        budget: usd(1000.0),
        nonce_window: 64,
        max_reservations: 16,
        ..GuardConfig::default()
    };
    let mut s = SessionState::new(config.budget, 0);
    for n in 1..=10_000u64 {
        let p = params(&format!(r#"{{"n":{}}}"#, n % 7));
        let tool = ["search", "fetch", "read"][(n % 3) as usize];
        let d = step(&config, &mut s, &call(tool, &p, n, usd(0.001)), n, 0);
        assert_eq!(d.verdict, Verdict::Allow, "call {n}");
    }
    assert_eq!(s.total_calls, 10_000);
    assert_eq!(s.seen_nonces.len(), 64);
    assert_eq!(s.reservations.len(), 16);
    assert_eq!(s.repeat_counts.len(), 1);
    // What the forgotten reservations reserved stays spent: nothing was refunded.
    assert_eq!(s.budget_remaining, usd(1000.0 - 10.0));
    assert_eq!(s.budget_spent, usd(0.001 * (10_000.0 - 16.0)));
    // A late report for a forgotten call is charged in full (never refunded).
    let settled = apply_post_exec(
        &config,
        &mut s,
        1,
        ReportedCost::Exact(usd(0.001)),
        false,
        0,
    );
    assert!(!settled.had_reservation);
    assert_eq!(settled.charged, usd(0.001));
}

#[test]
fn reported_costs_are_classified() {
    use ReportedCost::*;
    assert_eq!(ReportedCost::from_usd(0.25), Exact(usd(0.25)));
    assert_eq!(ReportedCost::from_usd(0.0), Exact(Money::ZERO));
    assert_eq!(ReportedCost::from_usd(-0.0), Exact(Money::ZERO));
    // The sign is read before rounding (issue 15 §4): a negative amount too small to
    // round to a nano-dollar is still negative, never a free call.
    for bad in [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.01,
        -1e300,
        -4e-10,
        -1e-12,
        -f64::MIN_POSITIVE,
    ] {
        assert_eq!(ReportedCost::from_usd(bad), Unreadable, "{bad}");
    }
    for big in [9.3e9, 1e300, f64::MAX] {
        assert_eq!(ReportedCost::from_usd(big), OverRange, "{big}");
    }
}

/// One call allowed at `estimate` under `policy`, then settled with `reported`: (charged,
/// remaining after).
fn settle(policy: Settlement, estimate: f64, reported: f64) -> (Money, Money) {
    let config = GuardConfig {
        budget: usd(1.0),
        settlement: policy,
        ..GuardConfig::default()
    };
    let mut s = SessionState::new(config.budget, 0);
    let p = params("{}");
    let d = step(&config, &mut s, &call("t", &p, 1, usd(estimate)), 1, 0);
    assert_eq!(d.verdict, Verdict::Allow);
    let r = apply_post_exec(
        &config,
        &mut s,
        1,
        ReportedCost::from_usd(reported),
        false,
        0,
    );
    assert_eq!(r.after, s.budget_remaining);
    (r.charged, s.budget_remaining)
}

#[test]
fn unreadable_costs_never_refund_and_over_range_costs_saturate() {
    for policy in [Settlement::Conservative, Settlement::Actual] {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -5.0] {
            // Charged as the estimate: the reservation stays spent.
            assert_eq!(
                settle(policy, 0.2, bad),
                (usd(0.2), usd(0.8)),
                "{policy:?} {bad}"
            );
        }
        // Finite but beyond the nano-dollar range: everything that remains is charged.
        assert_eq!(
            settle(policy, 0.2, 1e12),
            (usd(1.0), Money::ZERO),
            "{policy:?}"
        );
    }
    // Readable costs keep their policies.
    assert_eq!(
        settle(Settlement::Actual, 0.2, 0.05),
        (usd(0.05), usd(0.95))
    );
    assert_eq!(
        settle(Settlement::Conservative, 0.2, 0.05),
        (usd(0.2), usd(0.8))
    );
}

#[test]
fn a_held_call_keeps_its_own_call_number() {
    let config = GuardConfig {
        hitl_mode: HitlMode::Always,
        ..GuardConfig::default()
    };
    let mut s = SessionState::new(Money::ZERO, 0);
    let p = params("{}");
    let d = step(&config, &mut s, &call("t", &p, 5, Money::ZERO), 1, 0);
    assert_eq!(d.verdict, Verdict::Hitl);
    assert_eq!(s.pending.as_ref().map(|p| p.call_number), Some(1));
    // A second HITL while one is pending keeps the first call's number.
    step(&config, &mut s, &call("t", &p, 6, Money::ZERO), 2, 0);
    assert_eq!(s.pending.as_ref().map(|p| p.call_number), Some(1));
}

fn any_report() -> impl Strategy<Value = f64> {
    prop_oneof![
        (0.0f64..2.0),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        (-1e6f64..-1e-6),
        (9.3e9f64..1e300),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Whatever is reported, under either policy: remaining never goes below zero, a
    /// report the core cannot read never leaves more budget than the estimate did (no
    /// refund), and the charge is never below the estimate for such a report.
    #[test]
    fn settlement_keeps_the_floor_and_never_refunds_unreadable_input(
        actual_policy in any::<bool>(),
        budget in 0.0f64..2.0,
        estimates in proptest::collection::vec(0.0f64..0.5, 1..6),
        reports in proptest::collection::vec((any_report(), 0usize..6), 0..8),
    ) {
        let config = GuardConfig {
            budget: usd(budget),
            settlement: if actual_policy { Settlement::Actual } else { Settlement::Conservative },
            ..GuardConfig::default()
        };
        let mut s = SessionState::new(config.budget, 0);
        let p = params("{}");
        for (i, e) in estimates.iter().enumerate() {
            let n = i as u64 + 1;
            let tool = if n.is_multiple_of(2) { "a" } else { "b" };
            step(&config, &mut s, &call(tool, &p, n, usd(*e)), n, 0);
            prop_assert!(s.budget_remaining >= Money::ZERO);
        }
        for (reported, which) in reports {
            let n = which as u64 + 1;
            let reserved = s.reservations.get(&n).copied();
            let before = s.budget_remaining;
            let r = apply_post_exec(&config, &mut s, n, ReportedCost::from_usd(reported), false, 0);
            prop_assert!(s.budget_remaining >= Money::ZERO);
            if ReportedCost::from_usd(reported).exact().is_none() {
                // No refund: remaining is at most what it was before the report.
                prop_assert!(s.budget_remaining <= before, "{reported}: {before:?} -> {:?}", s.budget_remaining);
                if let Some(res) = reserved {
                    prop_assert!(r.charged >= res.estimated);
                }
            }
        }
    }
}

#[test]
fn an_undecided_held_call_expires_into_a_rejection() {
    use tollgate_core::{expire_pending, record_human_decision, HumanDecision, TransitionStatus};
    let config = GuardConfig {
        hitl_mode: HitlMode::Always,
        ..GuardConfig::default()
    };
    let mut s = SessionState::new(Money::ZERO, 0);
    let p = params(r#"{"to":"x"}"#);
    let held = call("pay", &p, 5, Money::ZERO);
    assert_eq!(step(&config, &mut s, &held, 1, 0).verdict, Verdict::Hitl);
    record_human_decision(&mut s, HumanDecision::Defer, None, 1).unwrap();
    expire_pending(&mut s, 2).unwrap();
    let t = s.pending.clone().unwrap();
    assert_eq!(
        (t.decision, t.terminal_status),
        (HumanDecision::Expire, TransitionStatus::Expired)
    );
    // The held call, dispatched again, is refused; nothing can decide it any more.
    assert_eq!(
        decide(&config, &s, &held, 3, 1.0).reason,
        Reason::TransitionReject
    );
    assert!(record_human_decision(&mut s, HumanDecision::Approve, None, 4).is_err());
    assert!(expire_pending(&mut s, 4).is_err());
    // `expire` is not a word SP/1.0 knows: a vector or a human saying it is unknown.
    assert!(matches!(
        HumanDecision::parse("expire"),
        HumanDecision::Unknown(_)
    ));
}

#[test]
fn a_decided_held_call_does_not_expire() {
    use tollgate_core::{expire_pending, record_human_decision, HumanDecision};
    let config = GuardConfig {
        hitl_mode: HitlMode::Always,
        ..GuardConfig::default()
    };
    let mut s = SessionState::new(Money::ZERO, 0);
    let p = params("{}");
    step(&config, &mut s, &call("pay", &p, 5, Money::ZERO), 1, 0);
    record_human_decision(&mut s, HumanDecision::Approve, None, 1).unwrap();
    assert!(expire_pending(&mut s, 2).is_err());
    let mut empty = SessionState::new(Money::ZERO, 0);
    assert!(expire_pending(&mut empty, 2).is_err());
}
