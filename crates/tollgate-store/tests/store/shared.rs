//! Shared budgets: joining, and concurrent sessions of one agent that never overspend,
//! with the journal in an order that folds back to the same amounts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tollgate_core::{Money, Verdict};
use tollgate_store::{BudgetKey, MemoryStore, SessionStore, StoreOptions};

use crate::support::{
    agent_session, block_on, close, create, normalize, open_embedded, pre_exec, session, Call,
    Recorder,
};

fn agent_key(agent: &str) -> BudgetKey {
    BudgetKey::Agent("org-1".into(), agent.into())
}

#[test]
fn sessions_join_a_shared_budget() {
    let store = MemoryStore::default();
    create(&store, agent_session("a1", "bot", 1_000)).unwrap();
    // The second session's own budget is ignored: it joins the agent's.
    create(&store, agent_session("a2", "bot", 999_999)).unwrap();
    create(&store, agent_session("other", "bot-2", 50)).unwrap();
    create(&store, session("solo", 70)).unwrap();
    let a2 = store.get_sync("a2").unwrap().unwrap();
    assert_eq!(a2.state.budget_initial, Money(1_000));
    let (d, _) = pre_exec(
        &store,
        "a1",
        Call {
            tool: "t",
            arg: 0,
            nonce: 1,
            cost: 400,
            now: 2_000,
        },
    )
    .unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(
        store
            .get_sync("a2")
            .unwrap()
            .unwrap()
            .state
            .budget_remaining,
        Money(600)
    );
    assert_eq!(
        store
            .budget_sync(&agent_key("bot"))
            .unwrap()
            .unwrap()
            .remaining,
        Money(600)
    );
    assert_eq!(
        store
            .budget_sync(&agent_key("bot-2"))
            .unwrap()
            .unwrap()
            .remaining,
        Money(50)
    );
}

/// Eight sessions of one agent, each on its own thread, spend a shared budget of 1_000 at
/// 7 per call: exactly 142 calls are allowed, however the threads interleave, and the
/// journal folds back to the same amounts.
fn concurrent<S: SessionStore>(
    store: &S,
    journal_fold: impl Fn() -> Option<tollgate_store::Ledger>,
) {
    for t in 0..8 {
        create(store, agent_session(&format!("c{t}"), "spender", 1_000)).unwrap();
    }
    let allowed = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let allowed = &allowed;
            scope.spawn(move || {
                for n in 0..40u64 {
                    let (d, durable) = pre_exec(
                        store,
                        &format!("c{t}"),
                        Call {
                            tool: "t",
                            arg: (n % 3) as i64,
                            nonce: t * 1_000 + n,
                            cost: 7,
                            now: 3_000,
                        },
                    )
                    .unwrap();
                    block_on(durable).unwrap();
                    if d.verdict == Verdict::Allow {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(allowed.load(Ordering::Relaxed), 1_000 / 7);
    let b = block_on(store.budget(&agent_key("spender")))
        .unwrap()
        .unwrap();
    assert_eq!(b.remaining, Money(1_000 % 7));
    if let Some(ledger) = journal_fold() {
        assert_eq!(ledger.budgets.get(&agent_key("spender")), Some(&b));
        for t in 0..8 {
            let id = format!("c{t}");
            assert_eq!(
                normalize(ledger.session(&id).unwrap()),
                normalize(block_on(store.get(&id)).unwrap().unwrap())
            );
        }
    }
}

#[test]
fn concurrent_sessions_never_overspend_in_memory() {
    let journal = Arc::new(Recorder::default());
    let store = MemoryStore::new(100, Some(journal.clone()));
    concurrent(&store, || Some(journal.fold()));
}

#[test]
fn concurrent_sessions_never_overspend_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, store, _) = open_embedded(dir.path(), StoreOptions::default()).unwrap();
    let path = dir.path().to_owned();
    concurrent(&store, || {
        writer.flush().wait().unwrap();
        Some(crate::support::fold_log(&path))
    });
    close(&writer, &store);
}
