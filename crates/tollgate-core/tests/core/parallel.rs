//! The parallel-holds extension of SP/1.0.1 §3.6 (`max_held_calls` above 1): several held
//! calls in one session, each with its own transition bound to its own nonce, decided by
//! humans in any order; each decided call runs exactly once with what was decided, or
//! never, and no call of a well-behaved agent trips the circuit.

use proptest::prelude::*;
use tollgate_core::json::Value;
use tollgate_core::transition::HumanDecisionRefused;
use tollgate_core::{
    decide, record_human_decision, Digest, GuardConfig, HitlMode, HumanDecision, Money, Reason,
    SessionState, SessionStatus, Successor, Verdict,
};

use crate::support::{call, params, step, usd};

fn parallel(max_held_calls: u32) -> GuardConfig {
    GuardConfig {
        budget: usd(100.0),
        hitl_mode: HitlMode::Always,
        max_held_calls,
        ..GuardConfig::default()
    }
}

fn original(i: usize) -> Value {
    params(&format!(r#"{{"amount":{},"to":"acct_{i}"}}"#, 10 + i))
}

fn edited(i: usize) -> Value {
    params(&format!(r#"{{"amount":1,"to":"acct_{i}"}}"#))
}

fn digest(v: &Value) -> Digest {
    tollgate_core::json::canonical_hash(v).unwrap()
}

const NONCE: u64 = 7_000;
const SUCCESSOR: u64 = 9_000;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Human {
    Approve,
    Reject,
    Modify,
    /// Deferred first, approved later.
    DeferThenApprove,
}

fn human() -> impl Strategy<Value = Human> {
    prop_oneof![
        Just(Human::Approve),
        Just(Human::Reject),
        Just(Human::Modify),
        Just(Human::DeferThenApprove),
    ]
}

/// Runs `humans.len()` calls through hold → (an early re-dispatch) → decision →
/// re-dispatch, interleaved in the order `order` gives (each call's steps in its own
/// order), and returns what ran: (call, params) per ALLOW.
fn run(
    config: &GuardConfig,
    humans: &[Human],
    order: &[usize],
) -> Result<Vec<(usize, Value)>, String> {
    let n = humans.len();
    let mut s = SessionState::new(config.budget, 0);
    let mut phase = vec![0u8; n];
    let mut held_as = vec![0u64; n];
    let mut ran = Vec::new();
    let mut number = 0u64;
    let mut now = 0i64;
    for &i in order {
        number += 1;
        now += 1;
        let nonce = NONCE + i as u64;
        let p = original(i);
        match phase[i] {
            0 => {
                let d = step(
                    config,
                    &mut s,
                    &call("pay", &p, nonce, usd(1.0)),
                    number,
                    now,
                );
                if (d.verdict, d.reason) != (Verdict::Hitl, Reason::HitlAllCalls) {
                    return Err(format!("call {i} first dispatch: {d:?}"));
                }
                held_as[i] = number;
            }
            1 => {
                // The agent asks again before anyone decided: still held, nothing trips.
                let d = step(
                    config,
                    &mut s,
                    &call("pay", &p, nonce, usd(1.0)),
                    number,
                    now,
                );
                if (d.verdict, d.reason) != (Verdict::Hitl, Reason::TransitionDeferEscalate) {
                    return Err(format!("call {i} early re-dispatch: {d:?}"));
                }
            }
            2 => {
                let call_number = Some(held_as[i]);
                let (decision, successor) = match humans[i] {
                    Human::Approve => (HumanDecision::Approve, None),
                    Human::Reject => (HumanDecision::Reject, None),
                    Human::Modify => (
                        HumanDecision::Modify,
                        Some(Successor {
                            nonce: SUCCESSOR + i as u64,
                            args_digest: digest(&edited(i)),
                        }),
                    ),
                    Human::DeferThenApprove => {
                        record_human_decision(&mut s, call_number, HumanDecision::Defer, None, now)
                            .map_err(|e| format!("call {i} defer: {e}"))?;
                        (HumanDecision::Approve, None)
                    }
                };
                record_human_decision(&mut s, call_number, decision, successor, now)
                    .map_err(|e| format!("call {i} decision: {e}"))?;
            }
            3 => {
                // The agent re-dispatches what was released (nothing after a reject).
                let (v, d) = match humans[i] {
                    Human::Reject => {
                        phase[i] += 1;
                        continue;
                    }
                    Human::Modify => {
                        let e = edited(i);
                        let d = step(
                            config,
                            &mut s,
                            &call("pay", &e, SUCCESSOR + i as u64, usd(1.0)),
                            number,
                            now,
                        );
                        (e, d)
                    }
                    _ => {
                        let d = step(
                            config,
                            &mut s,
                            &call("pay", &p, nonce, usd(1.0)),
                            number,
                            now,
                        );
                        (p.clone(), d)
                    }
                };
                if d.verdict != Verdict::Allow {
                    return Err(format!("call {i} release: {d:?}"));
                }
                ran.push((i, v));
            }
            _ => return Err("a call has four steps".into()),
        }
        phase[i] += 1;
        if s.circuit_tripped {
            return Err(format!(
                "circuit tripped at call {i} phase {}",
                phase[i] - 1
            ));
        }
    }
    // Everything released is spent: a second run of any of them, the original of a
    // modified call, or a rejected call never runs.
    for (i, h) in humans.iter().enumerate() {
        let attempts = [
            (original(i), NONCE + i as u64),
            (edited(i), SUCCESSOR + i as u64),
        ];
        for (p, nonce) in attempts {
            let d = decide(config, &s, &call("pay", &p, nonce, usd(1.0)), now, 1.0);
            if d.verdict == Verdict::Allow {
                return Err(format!("call {i} ({h:?}) ran again: {d:?} {p:?}"));
            }
        }
    }
    if s.transitions().any(|t| t.decision != HumanDecision::Reject) {
        return Err(format!(
            "left held: {:?}",
            s.transitions().collect::<Vec<_>>()
        ));
    }
    Ok(ran)
}

/// Each call index four times, shuffled by `keys` (the interleaving).
fn interleaving(n: usize, keys: &[u32]) -> Vec<usize> {
    let mut slots: Vec<(u32, usize)> = (0..4 * n).map(|k| (keys[k], k / 4)).collect();
    slots.sort_by_key(|(key, _)| *key);
    slots.into_iter().map(|(_, i)| i).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Nine calls held at once, decided in any order: each approved call runs once with its
    /// own params, each modified one once with the edited params, a rejected one never,
    /// and the circuit never trips.
    #[test]
    fn nine_held_calls_decided_in_any_order(
        humans in proptest::collection::vec(human(), 9),
        keys in proptest::collection::vec(any::<u32>(), 36),
    ) {
        let order = interleaving(9, &keys);
        let ran = run(&parallel(16), &humans, &order).map_err(TestCaseError::fail)?;
        let mut want: Vec<(usize, Value)> = humans
            .iter()
            .enumerate()
            .filter_map(|(i, h)| match h {
                Human::Reject => None,
                Human::Modify => Some((i, edited(i))),
                _ => Some((i, original(i))),
            })
            .collect();
        let mut got = ran;
        want.sort_by_key(|(i, _)| *i);
        got.sort_by_key(|(i, _)| *i);
        prop_assert_eq!(got, want);
    }
}

/// SP/1.0.1 exactly (one transition) fails the same scenario: the second call is held
/// behind the first and its release is refused, tripping the circuit. This is what the
/// extension is for, and shows the model test can fail.
#[test]
fn one_transition_cannot_hold_two_calls() {
    let humans = [Human::Approve, Human::Approve];
    let order = [0, 1, 0, 1, 0, 1, 0, 1];
    assert!(run(&parallel(1), &humans, &order).is_err());
    assert_eq!(run(&parallel(16), &humans, &order).unwrap().len(), 2);
}

#[test]
fn an_operator_names_the_call_when_several_are_held() {
    let config = parallel(16);
    let mut s = SessionState::new(config.budget, 0);
    for i in 0..3u64 {
        step(
            &config,
            &mut s,
            &call("pay", &original(i as usize), NONCE + i, Money::ZERO),
            i + 1,
            1,
        );
    }
    assert_eq!(s.transition_count(), 3);
    assert_eq!(s.status, SessionStatus::Paused);
    assert_eq!(
        record_human_decision(&mut s, None, HumanDecision::Approve, None, 2),
        Err(HumanDecisionRefused::WhichCall(3))
    );
    assert_eq!(
        record_human_decision(&mut s, Some(9), HumanDecision::Approve, None, 2),
        Err(HumanDecisionRefused::NotHeld(9))
    );
    record_human_decision(&mut s, Some(2), HumanDecision::Approve, None, 2).unwrap();
    assert_eq!(
        record_human_decision(&mut s, Some(2), HumanDecision::Reject, None, 2),
        Err(HumanDecisionRefused::AlreadyDecided("approve".into()))
    );
    // Call 2's release leaves calls 1 and 3 held; the session stays paused until none is.
    let d = step(
        &config,
        &mut s,
        &call("pay", &original(1), NONCE + 1, Money::ZERO),
        4,
        3,
    );
    assert_eq!(d.reason, Reason::TransitionApprove);
    assert_eq!(
        s.transitions().map(|t| t.call_number).collect::<Vec<_>>(),
        vec![1, 3]
    );
    assert_eq!(s.status, SessionStatus::Paused);
    // With two undecided, still ambiguous; with one left, it needs no name.
    record_human_decision(&mut s, Some(1), HumanDecision::Reject, None, 4).unwrap();
    record_human_decision(&mut s, None, HumanDecision::Approve, None, 5).unwrap();
    assert_eq!(
        s.transition_of_call(3).unwrap().decision,
        HumanDecision::Approve
    );
}

#[test]
fn held_calls_are_bounded_and_refused_ones_make_room() {
    let config = parallel(3);
    let mut s = SessionState::new(config.budget, 0);
    for i in 0..4u64 {
        let d = step(
            &config,
            &mut s,
            &call("pay", &original(i as usize), NONCE + i, Money::ZERO),
            i + 1,
            1,
        );
        assert_eq!(d.verdict, Verdict::Hitl);
    }
    // The fourth is held behind: recorded nowhere.
    assert_eq!(s.transition_count(), 3);
    assert!(s.transition_of_call(4).is_none());
    // A refused call's slot is reused; an approved one's is not.
    record_human_decision(&mut s, Some(1), HumanDecision::Approve, None, 2).unwrap();
    record_human_decision(&mut s, Some(2), HumanDecision::Reject, None, 2).unwrap();
    let d = step(
        &config,
        &mut s,
        &call("pay", &original(3), NONCE + 3, Money::ZERO),
        5,
        3,
    );
    assert_eq!(d.verdict, Verdict::Hitl);
    assert_eq!(
        s.transitions().map(|t| t.call_number).collect::<Vec<_>>(),
        vec![1, 3, 5]
    );
    // The approved call still runs, once.
    let d = step(
        &config,
        &mut s,
        &call("pay", &original(0), NONCE, Money::ZERO),
        6,
        4,
    );
    assert_eq!(d.reason, Reason::TransitionApprove);
    assert!(!s.circuit_tripped);
}

#[test]
fn each_transition_is_resolved_by_the_specification_alone() {
    // With several held, a call naming one is decided exactly as SP/1.0.1 decides it
    // against that transition alone.
    let ext = parallel(16);
    let strict = parallel(1);
    let mut s = SessionState::new(ext.budget, 0);
    for i in 0..4u64 {
        step(
            &ext,
            &mut s,
            &call("pay", &original(i as usize), NONCE + i, Money::ZERO),
            i + 1,
            1,
        );
    }
    record_human_decision(&mut s, Some(1), HumanDecision::Approve, None, 2).unwrap();
    record_human_decision(&mut s, Some(2), HumanDecision::Reject, None, 2).unwrap();
    let successor = Successor {
        nonce: SUCCESSOR,
        args_digest: digest(&edited(2)),
    };
    record_human_decision(&mut s, Some(3), HumanDecision::Modify, Some(successor), 2).unwrap();
    let attempts: Vec<(Value, u64)> = (0..4)
        .flat_map(|i| {
            [
                (original(i), NONCE + i as u64),
                (edited(i), NONCE + i as u64),
                (original(i), SUCCESSOR),
                (edited(i), SUCCESSOR),
            ]
        })
        .collect();
    for (p, nonce) in attempts {
        let c = call("pay", &p, nonce, Money::ZERO);
        let got = decide(&ext, &s, &c, 3, 1.0);
        match s.transition_for_nonce(Some(nonce)) {
            Some(t) => {
                let mut alone = s.clone();
                alone.pending = Some(t.clone());
                alone.more_pending.clear();
                assert_eq!(got, decide(&strict, &alone, &c, 3, 1.0), "{p:?} {nonce}");
            }
            None => assert_eq!(got.reason, Reason::HitlAllCalls, "{p:?} {nonce}"),
        }
    }
}
