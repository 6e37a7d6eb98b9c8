//! The trait contract, checked on both stores with the same code.

use std::sync::Arc;

use tollgate_core::{BudgetScope, Money, SessionStatus, Verdict};
use tollgate_store::{
    BudgetKey, Change, EmbeddedStore, MemoryStore, SessionStore, StoreError, StoreOptions,
};

use crate::support::{
    agent_session, block_on, close, create, meta, open_embedded, policy, pre_exec, session, settle,
    Call, Recorder,
};

fn contract<S: SessionStore>(store: &S) {
    // create, get
    create(store, session("a", 1_000_000)).unwrap();
    let got = block_on(store.get("a")).unwrap().unwrap();
    assert_eq!(got.state.budget_remaining, Money(1_000_000));
    assert_eq!(got.seq, 1, "opening is version 1");
    assert_eq!(block_on(store.get("nope")).unwrap(), None);
    assert_eq!(
        block_on(store.create(session("a", 5), 1)).unwrap_err(),
        StoreError::Exists { id: "a".into() }
    );

    // A committed change is applied and numbered; the closure's result comes back.
    let call = |arg, nonce, cost, now| Call {
        tool: "search",
        arg,
        nonce,
        cost,
        now,
    };
    let (d, durable) = pre_exec(store, "a", call(1, 7, 250_000, 2_000)).unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    block_on(durable).unwrap();
    let s = block_on(store.get("a")).unwrap().unwrap();
    assert_eq!((s.last_call_number, s.seq), (1, 2));
    assert_eq!(s.state.budget_remaining, Money(750_000));
    assert!(s.state.seen_nonces.contains(&7));

    // A settlement is a change too.
    block_on(settle(store, "a", 1, 0.0001).unwrap()).unwrap();
    let s = block_on(store.get("a")).unwrap().unwrap();
    assert_eq!(s.seq, 3);
    assert_eq!(s.state.budget_spent, Money(250_000));

    // Replay is denied, and the DENY trips the circuit.
    let (d, _) = pre_exec(store, "a", call(2, 7, 1, 3_000)).unwrap();
    assert_eq!(d.verdict, Verdict::Deny);
    assert!(
        block_on(store.get("a"))
            .unwrap()
            .unwrap()
            .state
            .circuit_tripped
    );

    // Touch and Keep write nothing and leave the version alone.
    let (status, durable) = block_on(store.apply("a", |s| {
        s.state.status = SessionStatus::Stale;
        s.last_heartbeat_ns = 9;
        Change::Touch(s.state.status)
    }))
    .unwrap();
    assert_eq!(status, SessionStatus::Stale);
    assert_eq!(block_on(durable).unwrap(), None);
    let (seq, durable) = block_on(store.apply("a", |s| Change::Keep(s.seq))).unwrap();
    assert_eq!(seq, 4);
    assert_eq!(block_on(durable).unwrap(), None);

    // A commit that does not follow the session's version stops the store: the live
    // state can no longer be trusted to match the log.
    let err = block_on(store.apply("a", |s| {
        let mut record = tollgate_store::ops::settle(s, 1, 0.0, true, false, 1);
        record.session_seq = 99;
        Change::Commit((), record.into())
    }))
    .unwrap_err();
    assert!(matches!(err, StoreError::Failed { .. }), "{err}");
    assert!(matches!(
        block_on(store.apply("a", |_| Change::Keep(()))).unwrap_err(),
        StoreError::Failed { .. }
    ));
    assert!(matches!(
        block_on(store.create(session("b", 1), 1)).unwrap_err(),
        StoreError::Failed { .. }
    ));
}

#[test]
fn memory_store_keeps_the_contract() {
    contract(&MemoryStore::default());
}

#[test]
fn embedded_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, store, report) = open_embedded(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!((report.sessions, report.next_index), (0, 0));
    contract(&store);
    drop(writer);
    drop(store);
}

#[test]
fn ids_and_caps_are_checked() {
    let store = MemoryStore::new(2, None);
    let mut s = session("x", 1);
    s.meta.agent_id = String::new();
    assert!(matches!(
        block_on(store.create(s, 1)).unwrap_err(),
        StoreError::InvalidId {
            field: "agent_id",
            ..
        }
    ));
    let mut s = session("x", 1);
    s.meta.session_id = "a\u{7}".into();
    assert!(matches!(
        block_on(store.create(s, 1)).unwrap_err(),
        StoreError::InvalidId { .. }
    ));
    create(&store, session("one", 1)).unwrap();
    create(&store, session("two", 1)).unwrap();
    assert_eq!(
        block_on(store.create(session("three", 1), 1)).unwrap_err(),
        StoreError::SessionCap { max: 2 }
    );
    assert_eq!(
        block_on(store.apply("nope", |_| Change::Keep(()))).unwrap_err(),
        StoreError::NotFound { id: "nope".into() }
    );
}

#[test]
fn a_panicking_change_stops_the_store() {
    let store = MemoryStore::default();
    create(&store, session("a", 100)).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = store.apply_sync("a", |_| -> Change<()> { panic!("boom") });
    }));
    assert!(r.is_err());
    assert!(matches!(
        store.apply_sync("a", |_| Change::Keep(())).unwrap_err(),
        StoreError::Failed { .. }
    ));
}

#[test]
fn list_pending_and_budgets() {
    let journal = Arc::new(Recorder::default());
    let store = MemoryStore::new(100, Some(journal.clone()));
    create(&store, session("s1", 100)).unwrap();
    create(&store, agent_session("a1", "bot", 1_000)).unwrap();
    let mut other = agent_session("o1", "bot", 7);
    other.meta.organization_id = "org-2".into();
    create(&store, other).unwrap();
    assert_eq!(
        store
            .list_sync(None)
            .unwrap()
            .iter()
            .map(|s| s.meta.session_id.as_str())
            .collect::<Vec<_>>(),
        vec!["a1", "o1", "s1"]
    );
    assert_eq!(store.list_sync(Some("org-2")).unwrap().len(), 1);
    assert!(block_on(store.pending_hitl(None)).unwrap().is_empty());
    assert_eq!(
        store
            .budget_sync(&BudgetKey::Agent("org-1".into(), "bot".into()))
            .unwrap()
            .map(|b| b.remaining),
        Some(Money(1_000))
    );
    assert_eq!(
        store
            .budget_sync(&BudgetKey::Session("s1".into()))
            .unwrap()
            .map(|b| b.remaining),
        Some(Money(100))
    );
    // Every opening was journaled, in order.
    let events = journal.0.lock().unwrap();
    assert_eq!(events.len(), 3);
    assert!(events.iter().all(|e| e.kind() == 4 && e.session_seq() == 1));
}

#[test]
fn a_session_keeps_the_policy_it_was_opened_with() {
    // The policy travels with the session; a different one for a new session of the same
    // agent does not change the first.
    let store = MemoryStore::default();
    let first = tollgate_store::Session::new(
        meta("p1", "bot", BudgetScope::PerSession),
        policy(500, BudgetScope::PerSession),
        1,
    );
    create(&store, first).unwrap();
    let second = tollgate_store::Session::new(
        meta("p2", "bot", BudgetScope::PerSession),
        policy(900, BudgetScope::PerSession),
        1,
    );
    create(&store, second).unwrap();
    assert_eq!(
        store.get_sync("p1").unwrap().unwrap().policy.config.budget,
        Money(500)
    );
    assert_eq!(
        store.get_sync("p2").unwrap().unwrap().policy.config.budget,
        Money(900)
    );
}

#[test]
fn embedded_store_closes_once_and_refuses_changes_after() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, store, _) = open_embedded(dir.path(), StoreOptions::default()).unwrap();
    create(&store, session("a", 10)).unwrap();
    close(&writer, &store);
    store.close_sync().unwrap();
    assert_eq!(
        store.apply_sync("a", |_| Change::Keep(())).unwrap_err(),
        StoreError::Closed
    );
    let _: &EmbeddedStore = &store;
}
