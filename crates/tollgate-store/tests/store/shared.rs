//! Shared budgets: joining, spending from several sessions, and concurrent sessions of
//! one agent that never overspend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tollgate_core::{BudgetScope, GuardConfig, Money, Verdict};
use tollgate_store::{
    Budget, BudgetKey, Change, EmbeddedStore, MemoryStore, Session, SessionStore, StoreOptions,
};

use crate::support::{agent_session, block_on, meta, pre_exec, session, Call};

fn agent_key(agent: &str) -> BudgetKey {
    BudgetKey::Agent("org-1".into(), agent.into())
}

#[test]
fn sessions_join_and_share_a_budget() {
    let store = MemoryStore::default();
    store
        .create_sync(agent_session("a1", "bot", 1_000))
        .unwrap();
    // The second session's own budget is ignored: it joins the agent's.
    store
        .create_sync(agent_session("a2", "bot", 999_999))
        .unwrap();
    store
        .create_sync(agent_session("other", "bot-2", 50))
        .unwrap();
    store.create_sync(session("solo", 70)).unwrap();
    assert_eq!(
        store.get_sync("a2").unwrap().unwrap().state.budget_initial,
        Money(1_000)
    );

    store
        .apply_sync("a1", |s| {
            s.state.budget_remaining = Money(600);
            s.state.budget_spent = Money(400);
            Change::Commit(())
        })
        .unwrap();
    let a2 = store.get_sync("a2").unwrap().unwrap();
    assert_eq!(a2.state.budget_remaining, Money(600));
    assert_eq!(a2.state.budget_spent, Money(400));
    // A Keep does not touch the shared record.
    store
        .apply_sync("a2", |s| {
            s.state.budget_remaining = Money(0);
            Change::Keep(())
        })
        .unwrap();
    assert_eq!(
        store.budget_sync(&agent_key("bot")).unwrap(),
        Some(Budget {
            initial: Money(1_000),
            remaining: Money(600),
            spent: Money(400),
        })
    );
    // Other agents and per-session budgets are untouched.
    assert_eq!(
        store
            .budget_sync(&agent_key("bot-2"))
            .unwrap()
            .unwrap()
            .remaining,
        Money(50)
    );
    assert_eq!(
        store
            .budget_sync(&BudgetKey::Session("solo".into()))
            .unwrap()
            .unwrap()
            .remaining,
        Money(70)
    );
    // The shared budget outlives its sessions, and a new session joins it again.
    store.remove_sync("a1").unwrap();
    store.remove_sync("a2").unwrap();
    store.create_sync(agent_session("a3", "bot", 5)).unwrap();
    assert_eq!(
        store
            .get_sync("a3")
            .unwrap()
            .unwrap()
            .state
            .budget_remaining,
        Money(600)
    );

    // Organization scope spans agents.
    let mk = |id: &str, agent: &str| {
        Session::new(
            meta(id, agent, "org-9", BudgetScope::PerOrganization),
            Money(100),
            0,
        )
    };
    store.create_sync(mk("o1", "x")).unwrap();
    store.create_sync(mk("o2", "y")).unwrap();
    store
        .apply_sync("o2", |s| {
            s.state.budget_remaining = Money(1);
            Change::Commit(())
        })
        .unwrap();
    assert_eq!(
        store
            .get_sync("o1")
            .unwrap()
            .unwrap()
            .state
            .budget_remaining,
        Money(1)
    );
}

const BUDGET: i64 = 1_000_000;
const COST: i64 = 7_000;

/// Four sessions of one agent, two threads each, all calling through `decide` and
/// `apply_decision` as the daemon will: exactly floor(budget / cost) calls are allowed,
/// and the shared record balances to the nano-dollar.
fn no_overspend<S: SessionStore>(store: Arc<S>) -> Vec<Session> {
    let config = GuardConfig {
        budget: Money(BUDGET),
        budget_scope: BudgetScope::PerAgent,
        ..GuardConfig::default()
    };
    for i in 0..4 {
        block_on(store.create(agent_session(&format!("c{i}"), "spender", BUDGET))).unwrap();
    }
    let allowed = Arc::new(AtomicU64::new(0));
    let nonce = Arc::new(AtomicU64::new(1));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = Arc::clone(&store);
            let config = config.clone();
            let allowed = Arc::clone(&allowed);
            let nonce = Arc::clone(&nonce);
            std::thread::spawn(move || {
                let id = format!("c{}", t % 4);
                for i in 0..60 {
                    let n = nonce.fetch_add(1, Ordering::Relaxed);
                    let (d, durable) = pre_exec(
                        &*store,
                        &id,
                        &config,
                        Call {
                            tool: "buy",
                            arg: i,
                            nonce: n,
                            cost: COST,
                            now: 10_000 + i,
                        },
                    )
                    .unwrap();
                    // The daemon answers only once the verdict's state is durable.
                    durable.wait().unwrap();
                    if d.verdict == Verdict::Allow {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let max_calls = BUDGET / COST;
    assert_eq!(allowed.load(Ordering::Relaxed), max_calls as u64);
    let sessions = block_on(store.list(None)).unwrap();
    let reserved: i64 = sessions
        .iter()
        .flat_map(|s| s.state.reservations.values())
        .map(|r| r.deducted.0)
        .sum();
    assert_eq!(reserved, max_calls * COST);
    let b = block_on(store.budget(&agent_key("spender")))
        .unwrap()
        .unwrap();
    assert_eq!(b.remaining, Money(BUDGET - max_calls * COST));
    assert_eq!(b.initial, Money(BUDGET));
    sessions
}

#[test]
fn concurrent_sessions_never_overspend_in_memory() {
    no_overspend(Arc::new(MemoryStore::default()));
}

#[test]
fn concurrent_sessions_never_overspend_embedded_and_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = Arc::new(EmbeddedStore::open(&path, StoreOptions::default()).unwrap());
    let before = no_overspend(Arc::clone(&store));
    store.close_sync().unwrap();
    drop(store);
    let store = EmbeddedStore::open(&path, StoreOptions::default()).unwrap();
    assert_eq!(store.list_sync(None).unwrap(), before);
    assert_eq!(
        store
            .budget_sync(&agent_key("spender"))
            .unwrap()
            .unwrap()
            .remaining,
        Money(BUDGET - (BUDGET / COST) * COST)
    );
}
