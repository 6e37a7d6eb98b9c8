//! The quiet index (what the daemon's idle sweep reads): on random workloads of opens,
//! calls, heartbeats, held calls, human decisions, expiries and ends, `quiet(cutoff)`
//! names exactly the live sessions whose `quiet_since` is at or before `cutoff`, oldest
//! first, as a scan of every session would; and a reopened store indexes the sessions it
//! loads.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_audit::CloseReason;
use tollgate_core::{BudgetScope, Digest, GuardConfig, HitlMode, HumanDecision, Money, Successor};
use tollgate_store::{ops, Change, MemoryStore, Policy, Session, SessionStore, StoreOptions};

use crate::support::{block_on, close, create, meta, open_embedded, pre_exec, Call, Recorder};

const SESSIONS: usize = 6;

#[derive(Debug, Clone)]
enum Op {
    Open(usize),
    Call(usize, u64),
    Heartbeat(usize, i64),
    Decide(usize, &'static str),
    Expire(usize),
    End(usize),
    Advance(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..SESSIONS).prop_map(Op::Open),
        4 => (0..SESSIONS, 0u64..1_000).prop_map(|(i, n)| Op::Call(i, n)),
        3 => (0..SESSIONS, -5i64..5).prop_map(|(i, d)| Op::Heartbeat(i, d)),
        2 => (0..SESSIONS, prop::sample::select(vec!["approve", "reject", "defer", "escalate"]))
            .prop_map(|(i, d)| Op::Decide(i, d)),
        1 => (0..SESSIONS).prop_map(Op::Expire),
        1 => (0..SESSIONS).prop_map(Op::End),
        3 => (0i64..20).prop_map(Op::Advance),
    ]
}

/// Session `i`: odd ones ask a human for every call (so they hold calls); 0 and 1 share
/// their agent's budget.
fn new_session(i: usize, generation: u64, now: i64) -> Session {
    let scope = if i < 2 {
        BudgetScope::PerAgent
    } else {
        BudgetScope::PerSession
    };
    let config = GuardConfig {
        budget: Money(1_000_000),
        budget_scope: scope,
        nonce_window: 8,
        max_reservations: 4,
        max_repeat_calls: 0,
        hitl_mode: if i % 2 == 1 {
            HitlMode::Always
        } else {
            HitlMode::Never
        },
        ..GuardConfig::default()
    };
    let agent = if i < 2 { "shared" } else { "solo" };
    Session::new(
        meta(&format!("s{i}-{generation}"), agent, scope),
        Arc::new(Policy::new(config)),
        now,
    )
}

/// What a scan of every live session says `quiet(cutoff)` must be.
fn scanned(store: &MemoryStore, cutoff: i64) -> Vec<String> {
    let mut v: Vec<(i64, String)> = store
        .list_sync(None)
        .unwrap()
        .into_iter()
        .filter_map(|s| {
            s.quiet_since()
                .filter(|t| *t <= cutoff)
                .map(|t| (t, s.meta.session_id))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, id)| id).collect()
}

fn run(ops_list: &[Op]) {
    let store = MemoryStore::new(100, Some(Arc::new(Recorder::default())));
    let mut now = 1_000i64;
    // The live id of each slot, and how many times it was opened.
    let mut live: Vec<Option<String>> = vec![None; SESSIONS];
    let mut opened = [0u64; SESSIONS];
    for op in ops_list {
        match *op {
            Op::Open(i) => {
                if live[i].is_none() {
                    opened[i] += 1;
                    let s = new_session(i, opened[i], now);
                    live[i] = Some(s.meta.session_id.clone());
                    create(&store, s).unwrap();
                }
            }
            Op::Call(i, nonce) => {
                if let Some(id) = &live[i] {
                    let call = Call {
                        tool: "t",
                        arg: 1,
                        nonce,
                        cost: 10,
                        now,
                    };
                    let (_, d) = pre_exec(&store, id, call).unwrap();
                    block_on(d).unwrap();
                }
            }
            Op::Heartbeat(i, delta) => {
                if let Some(id) = &live[i] {
                    let at = now + delta;
                    // A touch is not journaled: nothing to wait for.
                    let ((), _touched) = block_on(store.apply(id, move |s| {
                        s.last_heartbeat_ns = at;
                        Change::Touch(())
                    }))
                    .unwrap();
                }
            }
            Op::Decide(i, decision) => {
                if let Some(id) = &live[i] {
                    let decision = HumanDecision::parse(decision);
                    let successor = Some(Successor {
                        nonce: 7,
                        args_digest: Digest([1; 32]),
                    });
                    let at = now;
                    let ((), d) = block_on(store.apply(id, move |s| {
                        match ops::human_decision(
                            s,
                            None,
                            decision.clone(),
                            successor,
                            "op",
                            "",
                            at,
                        ) {
                            Ok(r) => Change::Commit((), r.into()),
                            Err(_) => Change::Keep(()),
                        }
                    }))
                    .unwrap();
                    block_on(d).unwrap();
                }
            }
            Op::Expire(i) => {
                if let Some(id) = &live[i] {
                    let at = now;
                    let ((), d) =
                        block_on(store.apply(id, move |s| match ops::expire(s, None, at) {
                            Ok(r) => Change::Commit((), r.into()),
                            Err(_) => Change::Keep(()),
                        }))
                        .unwrap();
                    block_on(d).unwrap();
                }
            }
            Op::End(i) => {
                if let Some(id) = live[i].take() {
                    let at = now;
                    let ((), d) = block_on(store.apply(&id, move |s| {
                        let record = ops::close(s, CloseReason::Idle, at);
                        Change::End((), record.into())
                    }))
                    .unwrap();
                    block_on(d).unwrap();
                }
            }
            Op::Advance(d) => now += d,
        }
        for cutoff in [
            i64::MIN,
            0,
            now - 30,
            now - 10,
            now - 3,
            now,
            now + 10,
            i64::MAX,
        ] {
            assert_eq!(
                block_on(store.quiet(cutoff)).unwrap(),
                scanned(&store, cutoff),
                "cutoff {cutoff} at {now} after {op:?}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn quiet_names_exactly_the_sessions_a_scan_finds(ops_list in proptest::collection::vec(op(), 0..80)) {
        run(&ops_list);
    }
}

/// A held call keeps its session out of the index until a human (or the HITL timeout)
/// decides it; then the session is quiet since its last sign of life.
#[test]
fn a_held_call_leaves_the_index_until_it_is_decided() {
    let store = MemoryStore::new(10, Some(Arc::new(Recorder::default())));
    let s = new_session(1, 1, 1_000);
    let id = s.meta.session_id.clone();
    create(&store, s).unwrap();
    assert_eq!(store.quiet_sync(1_000).unwrap(), vec![id.clone()]);
    let call = Call {
        tool: "t",
        arg: 1,
        nonce: 1,
        cost: 10,
        now: 1_500,
    };
    block_on(pre_exec(&store, &id, call).unwrap().1).unwrap();
    assert!(store
        .get_sync(&id)
        .unwrap()
        .unwrap()
        .state
        .pending
        .is_some());
    assert_eq!(store.quiet_sync(i64::MAX).unwrap(), Vec::<String>::new());
    let ((), d) = block_on(store.apply(&id, |s| {
        let r = ops::expire(s, None, 9_000).unwrap();
        Change::Commit((), r.into())
    }))
    .unwrap();
    block_on(d).unwrap();
    let last = store.get_sync(&id).unwrap().unwrap().quiet_since().unwrap();
    assert_eq!(store.quiet_sync(last - 1).unwrap(), Vec::<String>::new());
    assert_eq!(store.quiet_sync(last).unwrap(), vec![id]);
}

/// A reopened embedded store indexes every session it loads, quiet since the reopening
/// (a restart gives each a fresh heartbeat window); an ended session is not among them.
#[test]
fn a_reopened_store_indexes_what_it_loads() {
    let dir = tempfile::tempdir().unwrap();
    let manual = || StoreOptions {
        snapshot_interval: Duration::from_secs(3600),
        snapshot_entries: u64::MAX,
        ..StoreOptions::default()
    };
    let (writer, store, _) = open_embedded(dir.path(), manual()).unwrap();
    for i in [2, 4, 5] {
        create(&store, new_session(i, 1, 1_000)).unwrap();
    }
    assert_eq!(store.quiet_sync(999).unwrap(), Vec::<String>::new());
    assert_eq!(store.quiet_sync(1_000).unwrap().len(), 3);
    let ((), d) = block_on(store.apply("s5-1", |s| {
        let r = ops::close(s, CloseReason::Agent, 1_100);
        Change::End((), r.into())
    }))
    .unwrap();
    block_on(d).unwrap();
    store.snapshot().unwrap();
    close(&writer, &store);
    // `open_embedded` opens at time 2,000.
    let (writer, store, _) = open_embedded(dir.path(), manual()).unwrap();
    assert_eq!(store.quiet_sync(1_999).unwrap(), Vec::<String>::new());
    assert_eq!(
        store.quiet_sync(2_000).unwrap(),
        vec!["s2-1".to_owned(), "s4-1".to_owned()]
    );
    close(&writer, &store);
}
