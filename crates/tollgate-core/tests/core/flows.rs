//! Multi-step flows through decide and the transitions.

use tollgate_core::signals::has_error_signal;
use tollgate_core::transition::HumanDecisionRefused;
use tollgate_core::{
    apply_post_exec, decide, record_human_decision, GuardConfig, HitlMode, HumanDecision, Money,
    Params, PendingTransition, Reason, ReportedCost, SessionState, SessionStatus, Settlement,
    Successor, ToolCall, TransitionStatus, Verdict,
};

use crate::support::{call, params, step, usd};

/// SP/1.0 Appendix A: budget 0.50, max_repeat 3, web_search at 0.002 each, actual 0.0015.
#[test]
fn appendix_a_flow() {
    let config = GuardConfig {
        budget: usd(0.50),
        max_repeat_calls: 3,
        ..GuardConfig::default()
    };
    let mut s = SessionState::new(config.budget, 0);
    let p = params(r#"{"q":"rust circuit breakers"}"#);
    let mut remaining_after = Vec::new();
    for n in 1..=3u64 {
        let c = call("web_search", &p, 100 + n, usd(0.002));
        let seen = s.repeat_count_for("web_search", c.params.canonical_digest().ok());
        assert_eq!(
            seen,
            u32::try_from(n - 1).unwrap(),
            "repeat_count at call {n}"
        );
        let d = step(&config, &mut s, &c, n, 0);
        assert_eq!(
            (d.verdict, d.reason),
            (Verdict::Allow, Reason::WithinThresholds)
        );
        remaining_after.push(s.budget_remaining);
        apply_post_exec(
            &config,
            &mut s,
            n,
            ReportedCost::Exact(usd(0.0015)),
            false,
            0,
        );
    }
    assert_eq!(remaining_after, vec![usd(0.498), usd(0.496), usd(0.494)]);
    let c = call("web_search", &p, 104, usd(0.002));
    assert_eq!(
        s.repeat_count_for("web_search", c.params.canonical_digest().ok()),
        3
    );
    let d = step(&config, &mut s, &c, 4, 0);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Deny, Reason::MaxRepeatExceeded)
    );
    assert!(s.circuit_tripped);
    assert_eq!(s.circuit_trip_reason, Some(Reason::MaxRepeatExceeded));
    // Every later call is DENY circuit_open, whatever it is.
    let other = params(r#"{"q":"something else"}"#);
    let d = step(
        &config,
        &mut s,
        &call("read_file", &other, 105, Money::ZERO),
        5,
        0,
    );
    assert_eq!((d.verdict, d.reason), (Verdict::Deny, Reason::CircuitOpen));
    // The DENYs charged nothing.
    assert_eq!(s.budget_remaining, usd(0.494));
    assert_eq!(s.total_calls, 3);
}

#[test]
fn settlement_policies() {
    let mut config = GuardConfig {
        budget: usd(1.0),
        ..GuardConfig::default()
    };
    let p = params("{}");
    for (policy, actual, want_remaining, want_spent) in [
        (Settlement::Conservative, 0.1, 0.8, 0.2),
        (Settlement::Conservative, 0.3, 0.7, 0.3),
        (Settlement::Actual, 0.1, 0.9, 0.1),
        (Settlement::Actual, 0.3, 0.7, 0.3),
    ] {
        config.settlement = policy;
        let mut s = SessionState::new(config.budget, 0);
        step(&config, &mut s, &call("t", &p, 1, usd(0.2)), 1, 0);
        assert_eq!(s.budget_remaining, usd(0.8));
        let settled = apply_post_exec(
            &config,
            &mut s,
            1,
            ReportedCost::Exact(usd(actual)),
            false,
            0,
        );
        assert!(settled.had_reservation);
        assert_eq!(
            s.budget_remaining,
            usd(want_remaining),
            "{policy:?} {actual}"
        );
        assert_eq!(s.budget_spent, usd(want_spent), "{policy:?} {actual}");
        assert!(s.reservations.is_empty());
    }
    // An actual cost larger than everything left drives remaining to zero, not below.
    let mut s = SessionState::new(config.budget, 0);
    step(&config, &mut s, &call("t", &p, 1, usd(0.2)), 1, 0);
    let settled = apply_post_exec(&config, &mut s, 1, ReportedCost::Exact(usd(5.0)), false, 0);
    assert_eq!(settled.charged, usd(5.0));
    assert_eq!(s.budget_remaining, Money::ZERO);
    // A report for a call never reserved is still charged.
    let settled = apply_post_exec(&config, &mut s, 99, ReportedCost::Exact(usd(0.1)), false, 0);
    assert!(!settled.had_reservation);
    assert_eq!(s.budget_spent, usd(5.1));
}

#[test]
fn reservations_stop_concurrent_overspend() {
    // Two calls decided before either reports: the second sees the first's reservation.
    let config = GuardConfig {
        budget: usd(1.0),
        ..GuardConfig::default()
    };
    let mut s = SessionState::new(config.budget, 0);
    let p = params(r#"{"a":1}"#);
    let q = params(r#"{"a":2}"#);
    let d1 = step(&config, &mut s, &call("buy", &p, 1, usd(0.6)), 1, 0);
    let d2 = step(&config, &mut s, &call("buy", &q, 2, usd(0.6)), 2, 0);
    assert_eq!(d1.verdict, Verdict::Allow);
    assert_eq!(
        (d2.verdict, d2.reason),
        (Verdict::Deny, Reason::BudgetOverrun)
    );
}

#[test]
fn budget_overrun_goes_to_a_human_with_on_deny() {
    let config = GuardConfig {
        budget: usd(1.0),
        hitl_mode: HitlMode::OnDeny,
        ..GuardConfig::default()
    };
    let mut s = SessionState::new(config.budget, 0);
    let d = step(
        &config,
        &mut s,
        &call("buy", &params("{}"), 1, usd(2.0)),
        1,
        0,
    );
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Hitl, Reason::BudgetOverrun)
    );
    assert_eq!(d.deny_reason, None);
    assert_eq!(s.status, SessionStatus::Paused);
    assert!(!s.circuit_tripped);
}

/// SP/1.0.1 exactly: one pending transition (these flows are the specification's).
fn hitl_always() -> GuardConfig {
    GuardConfig {
        budget: usd(10.0),
        hitl_mode: HitlMode::Always,
        max_held_calls: 1,
        ..GuardConfig::default()
    }
}

#[test]
fn hitl_approve_releases_exactly_one_call() {
    let config = hitl_always();
    let mut s = SessionState::new(config.budget, 0);
    let p = params(r#"{"amount":100,"to":"acct_1"}"#);
    let d = step(&config, &mut s, &call("wire", &p, 7, usd(1.0)), 1, 10);
    assert_eq!((d.verdict, d.reason), (Verdict::Hitl, Reason::HitlAllCalls));
    assert_eq!(s.status, SessionStatus::Paused);
    // Asking again before a human decides: still HITL, and nothing trips.
    let d = step(&config, &mut s, &call("wire", &p, 7, usd(1.0)), 2, 11);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Hitl, Reason::TransitionDeferEscalate)
    );
    record_human_decision(&mut s, None, HumanDecision::Approve, None, 12).unwrap();
    // Different arguments under the same approval: refused.
    let evil = params(r#"{"amount":100000,"to":"acct_attacker"}"#);
    let d = decide(&config, &s, &call("wire", &evil, 7, usd(1.0)), 13, 1.0);
    assert_eq!(d.reason, Reason::TransitionDigestMismatch);
    // Another nonce: refused.
    let d = decide(&config, &s, &call("wire", &p, 8, usd(1.0)), 13, 1.0);
    assert_eq!(d.reason, Reason::TransitionNonceMismatch);
    // The approved call: released once.
    let d = step(&config, &mut s, &call("wire", &p, 7, usd(1.0)), 3, 14);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Allow, Reason::TransitionApprove)
    );
    assert_eq!(s.status, SessionStatus::Active);
    assert!(s.pending.is_none());
    assert_eq!(s.budget_remaining, usd(9.0));
    // Replaying it: DENY.
    let d = decide(&config, &s, &call("wire", &p, 7, usd(1.0)), 15, 1.0);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Deny, Reason::DuplicateNonce)
    );
    // A fresh call under ALWAYS goes back to a human.
    let d = decide(&config, &s, &call("wire", &p, 9, usd(1.0)), 15, 1.0);
    assert_eq!(d.reason, Reason::HitlAllCalls);
}

#[test]
fn hitl_modify_releases_only_the_successor() {
    let config = hitl_always();
    let mut s = SessionState::new(config.budget, 0);
    let original = params(r#"{"amount":5}"#);
    let edited = params(r#"{"amount":2}"#);
    step(
        &config,
        &mut s,
        &call("buy", &original, 22, Money::ZERO),
        1,
        0,
    );
    let successor = Successor {
        nonce: 23,
        args_digest: Params::json(&edited).canonical_digest().unwrap(),
    };
    assert_eq!(
        record_human_decision(&mut s, None, HumanDecision::Modify, None, 1),
        Err(HumanDecisionRefused::ModifyWithoutSuccessor)
    );
    record_human_decision(&mut s, None, HumanDecision::Modify, Some(successor), 1).unwrap();
    let d = decide(
        &config,
        &s,
        &call("buy", &original, 22, Money::ZERO),
        2,
        1.0,
    );
    assert_eq!(d.reason, Reason::TransitionSupersededOriginal);
    let d = decide(
        &config,
        &s,
        &call("buy", &original, 23, Money::ZERO),
        2,
        1.0,
    );
    assert_eq!(d.reason, Reason::TransitionDigestMismatch);
    let d = step(
        &config,
        &mut s,
        &call("buy", &edited, 23, Money::ZERO),
        2,
        2,
    );
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Allow, Reason::TransitionModifySuccessor)
    );
    assert!(s.pending.is_none());
}

#[test]
fn hitl_reject_denies_and_decisions_are_final() {
    let config = hitl_always();
    let mut s = SessionState::new(config.budget, 0);
    let p = params("{}");
    step(&config, &mut s, &call("rm", &p, 1, Money::ZERO), 1, 0);
    record_human_decision(&mut s, None, HumanDecision::Defer, None, 1).unwrap();
    let d = decide(&config, &s, &call("rm", &p, 1, Money::ZERO), 2, 1.0);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Hitl, Reason::TransitionDeferEscalate)
    );
    record_human_decision(&mut s, None, HumanDecision::Reject, None, 2).unwrap();
    assert!(matches!(
        record_human_decision(&mut s, None, HumanDecision::Approve, None, 3),
        Err(HumanDecisionRefused::AlreadyDecided(_))
    ));
    let d = step(&config, &mut s, &call("rm", &p, 1, Money::ZERO), 2, 3);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Deny, Reason::TransitionReject)
    );
    assert!(s.circuit_tripped);
    assert_eq!(
        record_human_decision(
            &mut SessionState::default(),
            None,
            HumanDecision::Approve,
            None,
            0
        ),
        Err(HumanDecisionRefused::NothingPending)
    );
}

#[test]
fn error_amplification_from_post_exec_and_from_raw_params() {
    let config = GuardConfig {
        max_repeat_calls: 3,
        error_amplification: true,
        ..GuardConfig::default()
    };
    let p = params(r#"{"url":"https://api.example/x"}"#);
    let mut s = SessionState::new(Money::ZERO, 0);
    step(&config, &mut s, &call("fetch", &p, 1, Money::ZERO), 1, 0);
    apply_post_exec(
        &config,
        &mut s,
        1,
        ReportedCost::Exact(Money::ZERO),
        has_error_signal("HTTP 401 Unauthorized"),
        0,
    );
    step(&config, &mut s, &call("fetch", &p, 2, Money::ZERO), 2, 0);
    // Run of two; the limit 3 drops to 2 only while an error signal shows.
    let next = call("fetch", &p, 3, Money::ZERO);
    assert_eq!(
        decide(&config, &s, &next, 0, 1.0).reason,
        Reason::WithinThresholds
    );
    apply_post_exec(
        &config,
        &mut s,
        2,
        ReportedCost::Exact(Money::ZERO),
        has_error_signal("429 Too Many Requests"),
        0,
    );
    assert_eq!(
        decide(&config, &s, &next, 0, 1.0).reason,
        Reason::MaxRepeatExceeded
    );
    // Without amplification the same state allows the call.
    let plain = GuardConfig {
        error_amplification: false,
        ..config.clone()
    };
    assert_eq!(
        decide(&plain, &s, &next, 0, 1.0).reason,
        Reason::WithinThresholds
    );
    // The library's case: the signal is in the call's own raw params text.
    apply_post_exec(
        &config,
        &mut s,
        2,
        ReportedCost::Exact(Money::ZERO),
        false,
        0,
    );
    let raw = ToolCall {
        raw_params: Some(r#"{"last_error":"503 Service Unavailable"}"#),
        ..next
    };
    assert_eq!(
        decide(&config, &s, &raw, 0, 1.0).reason,
        Reason::MaxRepeatExceeded
    );
}

#[test]
fn repeat_needs_same_tool_and_same_params() {
    let config = GuardConfig {
        max_repeat_calls: 2,
        ..GuardConfig::default()
    };
    let a = params(r#"{"x":1}"#);
    let b = params(r#"{"x":2}"#);
    let mut s = SessionState::default();
    step(&config, &mut s, &call("t", &a, 1, Money::ZERO), 1, 0);
    step(&config, &mut s, &call("t", &a, 2, Money::ZERO), 2, 0);
    assert_eq!(
        decide(&config, &s, &call("t", &b, 3, Money::ZERO), 0, 1.0).reason,
        Reason::WithinThresholds
    );
    assert_eq!(
        decide(&config, &s, &call("u", &a, 3, Money::ZERO), 0, 1.0).reason,
        Reason::WithinThresholds
    );
    assert_eq!(
        decide(&config, &s, &call("t", &a, 3, Money::ZERO), 0, 1.0).reason,
        Reason::MaxRepeatExceeded
    );
    // A different call restarts the run.
    step(&config, &mut s, &call("t", &b, 3, Money::ZERO), 3, 0);
    assert_eq!(s.repeat_counts["t"], 1);
    assert_eq!(
        decide(&config, &s, &call("t", &a, 4, Money::ZERO), 0, 1.0).reason,
        Reason::WithinThresholds
    );
}

#[test]
fn session_cap_timeout_and_window() {
    let p = params("{}");
    let cap = GuardConfig {
        max_total_calls: 2,
        ..GuardConfig::default()
    };
    let mut s = SessionState::default();
    for n in 1..=2 {
        assert_eq!(
            step(&cap, &mut s, &call("t", &p, n, Money::ZERO), n, 0).verdict,
            Verdict::Allow
        );
    }
    assert_eq!(
        decide(&cap, &s, &call("t", &p, 3, Money::ZERO), 0, 1.0).reason,
        Reason::GlobalLimit
    );

    let timeout = GuardConfig {
        timeout_seconds: 10,
        ..GuardConfig::default()
    };
    let s = SessionState::new(Money::ZERO, 5_000_000_000);
    let c = call("t", &p, 1, Money::ZERO);
    assert_eq!(
        decide(&timeout, &s, &c, 14_999_999_999, 1.0).reason,
        Reason::WithinThresholds
    );
    assert_eq!(
        decide(&timeout, &s, &c, 15_000_000_000, 1.0).reason,
        Reason::Timeout
    );

    let window = GuardConfig {
        window_duration_s: 60,
        window_max_calls: 2,
        ..GuardConfig::default()
    };
    let mut s = SessionState::default();
    let sec = 1_000_000_000i64;
    let q = params(r#"{"other":true}"#);
    step(
        &window,
        &mut s,
        &call("t", &p, 1, Money::ZERO),
        1,
        100 * sec,
    );
    step(
        &window,
        &mut s,
        &call("t", &q, 2, Money::ZERO),
        2,
        110 * sec,
    );
    assert_eq!(
        decide(&window, &s, &call("t", &p, 3, Money::ZERO), 159 * sec, 1.0).reason,
        Reason::WindowExceeded
    );
    assert_eq!(
        decide(&window, &s, &call("u", &p, 3, Money::ZERO), 159 * sec, 1.0).reason,
        Reason::WithinThresholds
    );
    // The window restarts once `now` passes its start plus its duration.
    let d = step(
        &window,
        &mut s,
        &call("t", &p, 3, Money::ZERO),
        3,
        160 * sec,
    );
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(s.window_start_ns, 160 * sec);
    assert_eq!(s.window_counts["t"], 1);
}

#[test]
fn probabilistic_denial_follows_the_draw() {
    let config = GuardConfig {
        budget: usd(1.0),
        probabilistic_deny: true,
        deny_jitter_ratio: tollgate_core::Ratio::from_f64(0.5).unwrap(),
        ..GuardConfig::default()
    };
    let p = params("{}");
    let c = call("t", &p, 1, Money::ZERO);
    let mut s = SessionState::new(usd(1.0), 0);
    s.budget_remaining = usd(0.1); // 10% left: probability 0.5 × 0.9 = 0.45
    let d = decide(&config, &s, &c, 0, 0.44);
    assert_eq!(
        (d.verdict, d.reason, d.probabilistic),
        (Verdict::Deny, Reason::BudgetExhausted, true)
    );
    assert_eq!(
        decide(&config, &s, &c, 0, 0.46).reason,
        Reason::WithinThresholds
    );
    s.budget_remaining = usd(0.2); // not below 20%: never
    assert_eq!(
        decide(&config, &s, &c, 0, 0.0).reason,
        Reason::WithinThresholds
    );
}

#[test]
fn unreadable_inputs_are_denied_as_malformed() {
    let config = GuardConfig::default();
    let s = SessionState::default();
    let c = ToolCall::new("t", Params::unreadable());
    let d = decide(&config, &s, &c, 0, 1.0);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Deny, Reason::MalformedInput)
    );
}

// ---------------------------------------------------------------------------------------
// §3.6 step 4: a terminal status bars only an approve
// ---------------------------------------------------------------------------------------

/// Every status word a transition can carry that reads as terminal.
const TERMINAL: &[&str] = &[
    "superseded",
    "consumed",
    "executed",
    "expired",
    "revoked",
    "cancelled",
    "rejected",
    " EXPIRED ",
];

/// A decided MODIFY: original `{"amount":5}` nonce 22, successor `{"amount":2}` nonce 23.
fn modify_pending(
    status: &str,
    successor_nonce: Option<u64>,
    successor_digest: bool,
) -> PendingTransition {
    PendingTransition {
        decision: HumanDecision::Modify,
        original_nonce: Some(22),
        original_args_digest: Params::json(&params(r#"{"amount":5}"#))
            .canonical_digest()
            .ok(),
        successor_nonce,
        successor_args_digest: successor_digest
            .then(|| {
                Params::json(&params(r#"{"amount":2}"#))
                    .canonical_digest()
                    .ok()
            })
            .flatten(),
        terminal_status: TransitionStatus::parse(status),
        ..PendingTransition::default()
    }
}

/// Decide one call (`params` text, nonce) against a session holding `pending`.
fn check_transition(pending: &PendingTransition, p: &str, nonce: u64, want: (Verdict, Reason)) {
    let config = hitl_always();
    let mut s = SessionState::new(config.budget, 0);
    s.pending = Some(pending.clone());
    let value = params(p);
    let d = decide(
        &config,
        &s,
        &call("buy", &value, nonce, Money::ZERO),
        1,
        1.0,
    );
    assert_eq!(
        (d.verdict, d.reason),
        want,
        "status {} with {p} nonce {nonce}",
        pending.terminal_status
    );
}

#[test]
fn modify_with_a_terminal_status_still_releases_only_the_successor() {
    for status in TERMINAL {
        assert!(TransitionStatus::parse(status).is_terminal(), "{status}");
        let both = modify_pending(status, Some(23), true);
        // The successor pair: released.
        check_transition(
            &both,
            r#"{"amount":2}"#,
            23,
            (Verdict::Allow, Reason::TransitionModifySuccessor),
        );
        // The original's nonce, with either arguments: superseded.
        for p in [r#"{"amount":5}"#, r#"{"amount":2}"#] {
            check_transition(
                &both,
                p,
                22,
                (Verdict::Deny, Reason::TransitionSupersededOriginal),
            );
        }
        // Another nonce with the successor's arguments: not the authorized call.
        check_transition(
            &both,
            r#"{"amount":2}"#,
            24,
            (Verdict::Deny, Reason::TransitionNonceMismatch),
        );
        // The successor's nonce with other arguments: not the authorized arguments.
        for p in [r#"{"amount":5}"#, r#"{"amount":3}"#] {
            check_transition(
                &both,
                p,
                23,
                (Verdict::Deny, Reason::TransitionDigestMismatch),
            );
        }
        // A transition binding neither successor field is a blank cheque...
        let unbound = modify_pending(status, None, false);
        check_transition(
            &unbound,
            r#"{"amount":2}"#,
            23,
            (Verdict::Deny, Reason::TransitionUnboundAuthorization),
        );
        // ...but the original is still superseded first (step 4 before step 5).
        check_transition(
            &unbound,
            r#"{"amount":5}"#,
            22,
            (Verdict::Deny, Reason::TransitionSupersededOriginal),
        );
        // One bound field is enough, and only it is checked.
        check_transition(
            &modify_pending(status, Some(23), false),
            r#"{"amount":9}"#,
            23,
            (Verdict::Allow, Reason::TransitionModifySuccessor),
        );
        check_transition(
            &modify_pending(status, None, true),
            r#"{"amount":2}"#,
            99,
            (Verdict::Allow, Reason::TransitionModifySuccessor),
        );
    }
}

#[test]
fn a_resume_of_a_terminal_modify_has_no_effect_before_anything_else() {
    for status in TERMINAL {
        for pending in [
            modify_pending(status, Some(23), true),
            modify_pending(status, None, false),
        ] {
            let resume = PendingTransition {
                resume_attempt: true,
                ..pending
            };
            // Step 2 comes before step 4: even the successor pair and the original are
            // answered as a resume without effect.
            for (p, nonce) in [(r#"{"amount":2}"#, 23), (r#"{"amount":5}"#, 22)] {
                check_transition(
                    &resume,
                    p,
                    nonce,
                    (Verdict::Deny, Reason::DuplicateResumeNoEffect),
                );
            }
        }
    }
    // A resume of a transition that is not terminal is resolved normally.
    let resume = PendingTransition {
        resume_attempt: true,
        ..modify_pending("pending", Some(23), true)
    };
    check_transition(
        &resume,
        r#"{"amount":2}"#,
        23,
        (Verdict::Allow, Reason::TransitionModifySuccessor),
    );
}

#[test]
fn approve_with_a_terminal_status_stays_spent() {
    for status in TERMINAL {
        let approve = PendingTransition {
            decision: HumanDecision::Approve,
            original_nonce: Some(22),
            original_args_digest: Params::json(&params(r#"{"amount":5}"#))
                .canonical_digest()
                .ok(),
            terminal_status: TransitionStatus::parse(status),
            ..PendingTransition::default()
        };
        check_transition(
            &approve,
            r#"{"amount":5}"#,
            22,
            (Verdict::Deny, Reason::TransitionTerminalNoEffect),
        );
    }
}

#[test]
fn a_released_successor_cannot_be_replayed() {
    // The runtime's own flow: modify (status `superseded`), release the successor once.
    // The release clears the pending transition and records the successor's nonce, so
    // allowing a terminal-status modify's successor opens no second use.
    let config = hitl_always();
    let mut s = SessionState::new(config.budget, 0);
    let original = params(r#"{"amount":5}"#);
    let edited = params(r#"{"amount":2}"#);
    step(
        &config,
        &mut s,
        &call("buy", &original, 22, Money::ZERO),
        1,
        0,
    );
    let successor = Successor {
        nonce: 23,
        args_digest: Params::json(&edited).canonical_digest().unwrap(),
    };
    record_human_decision(&mut s, None, HumanDecision::Modify, Some(successor), 1).unwrap();
    let d = step(
        &config,
        &mut s,
        &call("buy", &edited, 23, Money::ZERO),
        2,
        2,
    );
    assert_eq!(d.reason, Reason::TransitionModifySuccessor);
    assert!(s.pending.is_none());
    let d = decide(&config, &s, &call("buy", &edited, 23, Money::ZERO), 3, 1.0);
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Deny, Reason::DuplicateNonce)
    );
    // Even with a stale pending transition put back (a store restored from before the
    // release), the recorded nonce answers first: a resume without effect.
    let mut stale = s.clone();
    stale.pending = Some(modify_pending("consumed", Some(23), true));
    let d = decide(
        &config,
        &stale,
        &call("buy", &edited, 23, Money::ZERO),
        3,
        1.0,
    );
    assert_eq!(
        (d.verdict, d.reason),
        (Verdict::Deny, Reason::DuplicateResumeNoEffect)
    );
}
