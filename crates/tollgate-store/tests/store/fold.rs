//! The live state is the fold of the journal: on random workloads (sessions with their
//! own and shared budgets, calls, replays, settlements with unreadable costs, HITL and
//! human decisions), folding the records the store wrote gives exactly the sessions and
//! budgets the store holds. And a record whose outcome does not follow from its inputs is
//! refused by the fold.

use std::sync::Arc;

use proptest::prelude::*;
use tollgate_audit::{Event, SessionEvent};
use tollgate_core::{
    BudgetScope, Digest, GuardConfig, HitlMode, HumanDecision, Money, Settlement, Successor,
};
use tollgate_store::{
    ops, Change, FoldError, Ledger, LedgerError, MemoryStore, Policy, Session, SessionStore,
};

use crate::support::{block_on, create, meta, normalize, pre_exec, settle, Call, Recorder};

#[derive(Debug, Clone)]
enum Op {
    Call {
        session: usize,
        tool: usize,
        arg: i64,
        nonce: u64,
        cost: i64,
    },
    Settle {
        session: usize,
        back: u64,
        reported: f64,
    },
    Decide {
        session: usize,
        decision: &'static str,
        nonce: u64,
    },
    Expire {
        session: usize,
    },
}

const SESSIONS: usize = 5;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..SESSIONS, 0usize..3, 0i64..3, 0u64..40, 0i64..300).prop_map(|(session, tool, arg, nonce, cost)| Op::Call { session, tool, arg, nonce, cost }),
        2 => (0..SESSIONS, 0u64..4, prop_oneof![0.0f64..0.000_000_5, Just(f64::NAN), Just(-1.0), Just(1e300)]).prop_map(|(session, back, reported)| Op::Settle { session, back, reported }),
        1 => (0..SESSIONS, prop::sample::select(vec!["approve", "reject", "modify", "defer"]), 0u64..40).prop_map(|(session, decision, nonce)| Op::Decide { session, decision, nonce }),
        1 => (0..SESSIONS).prop_map(|session| Op::Expire { session }),
    ]
}

/// Sessions 0 and 1 share an agent budget; 2 asks a human for everything; 3 settles by
/// actual cost; 4 has no budget.
fn open_sessions(store: &MemoryStore) {
    for i in 0..SESSIONS {
        let mut config = GuardConfig {
            budget: Money(2_000),
            max_repeat_calls: 3,
            nonce_window: 8,
            max_reservations: 4,
            ..GuardConfig::default()
        };
        let scope = if i < 2 {
            BudgetScope::PerAgent
        } else {
            BudgetScope::PerSession
        };
        config.budget_scope = scope;
        match i {
            2 => config.hitl_mode = HitlMode::Always,
            3 => config.settlement = Settlement::Actual,
            4 => config.budget = Money::ZERO,
            _ => {}
        }
        let agent = if i < 2 { "shared" } else { "solo" };
        let s = Session::new(
            meta(&format!("s{i}"), agent, scope),
            Arc::new(Policy::new(config)),
            1_000,
        );
        create(store, s).unwrap();
    }
}

fn run(store: &MemoryStore, ops_list: &[Op]) {
    for (i, op) in ops_list.iter().enumerate() {
        let now = 2_000 + i as i64;
        match op {
            Op::Call {
                session,
                tool,
                arg,
                nonce,
                cost,
            } => {
                let (_, d) = pre_exec(
                    store,
                    &format!("s{session}"),
                    Call {
                        tool: ["a", "b", "c"][*tool],
                        arg: *arg,
                        nonce: *nonce,
                        cost: *cost,
                        now,
                    },
                )
                .unwrap();
                block_on(d).unwrap();
            }
            Op::Settle {
                session,
                back,
                reported,
            } => {
                let id = format!("s{session}");
                let last = store.get_sync(&id).unwrap().unwrap().last_call_number;
                let d = settle(store, &id, last.saturating_sub(*back), *reported).unwrap();
                block_on(d).unwrap();
            }
            Op::Decide {
                session,
                decision,
                nonce,
            } => {
                let decision = HumanDecision::parse(decision);
                let successor = Some(Successor {
                    nonce: *nonce,
                    args_digest: Digest([1; 32]),
                });
                let _ =
                    block_on(store.apply(
                        &format!("s{session}"),
                        move |s| match ops::human_decision(
                            s,
                            None,
                            decision.clone(),
                            successor,
                            "op",
                            "a note",
                            now,
                        ) {
                            Ok(r) => Change::Commit((), r.into()),
                            Err(_) => Change::Keep(()),
                        },
                    ))
                    .unwrap();
            }
            Op::Expire { session } => {
                let _ = block_on(store.apply(&format!("s{session}"), move |s| {
                    match ops::expire(s, None, now) {
                        Ok(r) => Change::Commit((), r.into()),
                        Err(_) => Change::Keep(()),
                    }
                }))
                .unwrap();
            }
        }
    }
}

fn assert_same(store: &MemoryStore, ledger: &Ledger) {
    let (sessions, budgets) = store.dump();
    assert_eq!(sessions.len(), ledger.sessions.len());
    for s in sessions {
        let folded = ledger.session(&s.meta.session_id).unwrap();
        assert_eq!(normalize(folded), normalize(s));
    }
    let mut budgets = budgets;
    budgets.sort_by(|a, b| a.0.cmp(&b.0));
    let mut folded: Vec<_> = ledger
        .budgets
        .iter()
        .map(|(k, b)| (k.clone(), *b))
        .collect();
    folded.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(budgets, folded);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_live_state_is_the_fold_of_its_records(ops_list in proptest::collection::vec(op(), 0..120)) {
        let journal = Arc::new(Recorder::default());
        let store = MemoryStore::new(100, Some(journal.clone()));
        open_sessions(&store);
        run(&store, &ops_list);
        assert_same(&store, &journal.fold());
    }
}

/// A workload long enough to fill the nonce window and the reservations, replay nonces,
/// trip circuits and cross human decisions, checked the same way.
#[test]
fn a_long_workload_folds_too() {
    let journal = Arc::new(Recorder::default());
    let store = MemoryStore::new(100, Some(journal.clone()));
    open_sessions(&store);
    let mut ops_list = Vec::new();
    for i in 0..3_000u64 {
        let session = (i % SESSIONS as u64) as usize;
        ops_list.push(match i % 7 {
            5 => Op::Settle {
                session,
                back: i % 3,
                reported: if i % 2 == 0 { f64::NAN } else { 0.000_000_05 },
            },
            6 if i % 5 == 0 => Op::Expire { session },
            6 => Op::Decide {
                session,
                decision: ["approve", "modify", "defer"][(i % 3) as usize],
                nonce: i,
            },
            _ => Op::Call {
                session,
                tool: (i % 3) as usize,
                arg: (i % 2) as i64,
                nonce: i / 2,
                cost: 1,
            },
        });
    }
    run(&store, &ops_list);
    let events = journal.0.lock().unwrap().len();
    assert!(events > 2_000, "{events}");
    assert_same(&store, &journal.fold());
}

#[test]
fn a_record_that_does_not_follow_from_its_inputs_is_refused() {
    let journal = Arc::new(Recorder::default());
    let store = MemoryStore::new(100, Some(journal.clone()));
    open_sessions(&store);
    let (_, d) = pre_exec(
        &store,
        "s3",
        Call {
            tool: "a",
            arg: 1,
            nonce: 5,
            cost: 100,
            now: 3_000,
        },
    )
    .unwrap();
    block_on(d).unwrap();
    let events = journal.0.lock().unwrap().clone();
    let fold = |events: &[SessionEvent]| -> Result<Ledger, LedgerError> {
        let mut l = Ledger::new();
        for (i, e) in events.iter().enumerate() {
            l.fold(
                i as u64,
                Digest::default(),
                None,
                &Event::Session(e.clone()),
            )?;
        }
        Ok(l)
    };
    assert!(fold(&events).is_ok());
    // The verdict claims more budget left than its inputs leave.
    let mut bad = events.clone();
    if let Some(SessionEvent::Verdict(v)) = bad.last_mut() {
        v.budget_after = Money(v.budget_after.0 + 1);
    }
    assert!(matches!(
        fold(&bad).unwrap_err(),
        LedgerError::Fold {
            source: FoldError::Diverged { .. },
            ..
        }
    ));
    // An entry out of its session's order.
    let mut swapped = events.clone();
    if let Some(SessionEvent::Verdict(v)) = swapped.last_mut() {
        v.session_seq = 5;
    }
    assert!(matches!(
        fold(&swapped).unwrap_err(),
        LedgerError::Fold {
            source: FoldError::OutOfOrder { .. },
            ..
        }
    ));
    // A session opened twice, and an entry for a session never opened.
    let mut twice = events.clone();
    twice.push(events[0].clone());
    assert!(fold(&twice).is_err());
    assert!(fold(&events[4..]).is_err());
    // An opening whose config does not match its digest.
    let mut forged = events.clone();
    if let SessionEvent::Opened(o) = &mut forged[0] {
        o.config = o
            .config
            .replace("\"budget_nanos\":2000", "\"budget_nanos\":9000");
    }
    assert!(fold(&forged).is_err());
    // Gaps in the chain are refused.
    let mut l = Ledger::new();
    assert!(matches!(
        l.fold(
            3,
            Digest::default(),
            None,
            &Event::Session(events[0].clone())
        ),
        Err(LedgerError::Gap { .. })
    ));
}

/// Policy notes (audit format version 6) fold too: an ALLOW's labels become the
/// session's (only those it did not carry), a policy DENY that does not trip changes
/// nothing, one that trips trips; and a note whose labels do not follow from the state
/// is refused.
#[test]
fn policy_notes_fold_labels_and_refusals_that_do_not_trip() {
    use tollgate_audit::{PolicyEffect, PolicyNote};
    use tollgate_core::labels::Label;
    use tollgate_core::{Decision, DenyReason, Params, Reason, ToolCall, Verdict};

    let journal = Arc::new(Recorder::default());
    let store = MemoryStore::new(100, Some(journal.clone()));
    let config = GuardConfig {
        budget: Money(10_000),
        ..GuardConfig::default()
    };
    let s = Session::new(
        meta("p1", "agent", BudgetScope::PerSession),
        Arc::new(Policy::new(config)),
        1_000,
    );
    create(&store, s).unwrap();
    let note = |effect, id: &str, decided, tripped, labels: &[&str]| PolicyNote {
        set_digest: Digest([9; 32]),
        effect,
        policy_id: Some(id.to_owned()),
        decided,
        tripped,
        labels: labels.iter().map(|l| Label::parse(l).unwrap()).collect(),
    };
    let allow = Decision {
        verdict: Verdict::Allow,
        deny_reason: None,
        reason: Reason::WithinThresholds,
        probabilistic: false,
    };
    let deny = Decision {
        verdict: Verdict::Deny,
        deny_reason: Some(DenyReason::PolicyViolation),
        reason: Reason::PolicyDeny,
        probabilistic: false,
    };
    let step = |n: u64, tool: &'static str, decision: Decision, note: PolicyNote| {
        let (labels, d) = block_on(store.apply("p1", move |s: &mut Session| {
            let call = ToolCall {
                nonce: Some(n),
                estimated_cost: Money(10),
                ..ToolCall::new(tool, Params::digest(Digest([n as u8; 32])))
            };
            let r = ops::verdict_with(s, &call, &decision, Some(note.clone()), n, 2_000 + n as i64);
            let labels: Vec<String> = r
                .policy
                .as_ref()
                .unwrap()
                .labels
                .iter()
                .map(|l| l.as_str().to_owned())
                .collect();
            Change::Commit(labels, r.into())
        }))
        .unwrap();
        block_on(d).unwrap();
        labels
    };
    let live = || store.get_sync("p1").unwrap().unwrap();

    let added = step(
        1,
        "crm",
        allow,
        note(
            PolicyEffect::Permit,
            "reads",
            false,
            false,
            &["customer-data"],
        ),
    );
    assert_eq!(added, ["customer-data"]);
    let before = live();
    step(
        2,
        "mail",
        deny,
        note(PolicyEffect::Forbid, "no-mail", true, false, &[]),
    );
    let after = live();
    assert!(!after.state.circuit_tripped);
    assert_eq!(
        (
            after.state.total_calls,
            after.state.budget_remaining,
            &after.state.seen_nonces
        ),
        (
            before.state.total_calls,
            before.state.budget_remaining,
            &before.state.seen_nonces
        ),
        "a refusal that does not trip changed the state"
    );
    // Labels already carried are not recorded again.
    let added = step(
        3,
        "crm",
        allow,
        note(
            PolicyEffect::Permit,
            "reads",
            false,
            false,
            &["customer-data", "pii"],
        ),
    );
    assert_eq!(added, ["pii"]);
    step(
        4,
        "shell",
        deny,
        note(PolicyEffect::Forbid, "no-shell", true, true, &[]),
    );
    let end = live();
    assert!(end.state.circuit_tripped);
    assert_eq!(end.state.circuit_trip_reason, Some(Reason::PolicyDeny));
    assert_eq!(
        end.labels.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
        ["customer-data", "pii"]
    );
    assert_same(&store, &journal.fold());

    // A logged ALLOW that claims a label the session already carried does not follow.
    let mut events = journal.0.lock().unwrap().clone();
    if let SessionEvent::Verdict(v) = &mut events[3] {
        v.policy.as_mut().unwrap().labels = vec![
            Label::parse("customer-data").unwrap(),
            Label::parse("pii").unwrap(),
        ];
    }
    let mut l = Ledger::new();
    let folded: Result<(), LedgerError> = events.iter().enumerate().try_for_each(|(i, e)| {
        l.fold(
            i as u64,
            Digest::default(),
            None,
            &Event::Session(e.clone()),
        )
    });
    assert!(matches!(
        folded.unwrap_err(),
        LedgerError::Fold {
            source: FoldError::Diverged { .. },
            ..
        }
    ));
}
