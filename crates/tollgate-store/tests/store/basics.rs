//! The trait contract, checked on both stores with the same code.

use tollgate_core::{BudgetScope, GuardConfig, Money, PendingTransition, Verdict};
use tollgate_store::{
    BudgetKey, Change, EmbeddedStore, MemoryStore, SessionStore, StoreError, StoreOptions,
};

use crate::support::{block_on, meta, pre_exec, session, Call};

fn embedded(options: StoreOptions) -> (tempfile::TempDir, EmbeddedStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path().join("state.redb"), options).unwrap();
    (dir, store)
}

fn contract<S: SessionStore>(store: &S) {
    // create, get
    block_on(store.create(session("a", 1_000_000)))
        .unwrap()
        .wait()
        .unwrap();
    let got = block_on(store.get("a")).unwrap().unwrap();
    assert_eq!(got.state.budget_remaining, Money(1_000_000));
    assert_eq!(block_on(store.get("nope")).unwrap(), None);
    assert_eq!(
        block_on(store.create(session("a", 5))).unwrap_err(),
        StoreError::Exists { id: "a".into() }
    );

    // Commit persists edits; the closure's result comes back.
    let config = GuardConfig {
        budget: Money(1_000_000),
        ..GuardConfig::default()
    };
    let (d, durable) = pre_exec(
        store,
        "a",
        &config,
        Call {
            tool: "search",
            arg: 1,
            nonce: 7,
            cost: 250_000,
            now: 2_000,
        },
    )
    .unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    block_on(durable).unwrap();
    let s = block_on(store.get("a")).unwrap().unwrap();
    assert_eq!(s.last_call_number, 1);
    assert_eq!(s.state.budget_remaining, Money(750_000));
    assert!(s.state.seen_nonces.contains(&7));

    // Replay is denied, and the DENY trips the circuit.
    let (d, _) = pre_exec(
        store,
        "a",
        &config,
        Call {
            tool: "search",
            arg: 2,
            nonce: 7,
            cost: 1,
            now: 3_000,
        },
    )
    .unwrap();
    assert_eq!(d.verdict, Verdict::Deny);
    assert!(
        block_on(store.get("a"))
            .unwrap()
            .unwrap()
            .state
            .circuit_tripped
    );

    // Keep discards every edit.
    let (r, durable) = block_on(store.apply("a", |s| {
        s.state.seen_nonces.insert(99);
        s.state.seen_nonces.insert(1);
        s.state.seen_nonces.remove(&7);
        s.state.budget_remaining = Money(0);
        s.last_call_number = 50;
        Change::Keep(42)
    }))
    .unwrap();
    assert_eq!(r, 42);
    durable.wait().unwrap();
    let after = block_on(store.get("a")).unwrap().unwrap();
    assert!(!after.state.seen_nonces.contains(&99));
    assert_eq!(after.last_call_number, 2);
    assert_eq!(after.state.budget_remaining, Money(750_000));

    // Refused commits write nothing.
    let e = block_on(store.apply("a", |s| {
        s.meta.agent_id = "someone-else".into();
        s.state.seen_nonces.remove(&7);
        s.state.seen_nonces.insert(1234);
        Change::Commit(())
    }))
    .unwrap_err();
    assert_eq!(e, StoreError::MetaChanged { id: "a".into() });
    let e = block_on(store.apply("a", |s| {
        s.last_call_number = 1;
        s.state.total_calls = 77;
        Change::Commit(())
    }))
    .unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::CallNumberRegressed {
                last: 2,
                new: 1,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(block_on(store.get("a")).unwrap().unwrap(), after);
    assert!(matches!(
        block_on(store.apply("nope", |_| Change::Commit(()))),
        Err(StoreError::NotFound { .. })
    ));

    // Pending HITL listing, by organization.
    let mut other = session("b", 10);
    other.meta.organization_id = "org-2".into();
    block_on(store.create(other)).unwrap();
    block_on(store.create(session("c", 10))).unwrap();
    for id in ["b", "c"] {
        block_on(store.apply(id, |s| {
            s.state.pending = Some(PendingTransition {
                original_nonce: Some(1),
                ..PendingTransition::default()
            });
            Change::Commit(())
        }))
        .unwrap();
    }
    let ids = |v: Vec<tollgate_store::Session>| {
        v.into_iter().map(|s| s.meta.session_id).collect::<Vec<_>>()
    };
    assert_eq!(ids(block_on(store.pending_hitl(None)).unwrap()), ["b", "c"]);
    assert_eq!(
        ids(block_on(store.pending_hitl(Some("org-2"))).unwrap()),
        ["b"]
    );
    assert_eq!(
        ids(block_on(store.list(Some("org-1"))).unwrap()),
        ["a", "c"]
    );
    assert_eq!(
        block_on(store.budget(&BudgetKey::Session("a".into())))
            .unwrap()
            .unwrap()
            .remaining,
        Money(750_000)
    );

    // Remove.
    block_on(store.remove("c")).unwrap().wait().unwrap();
    assert_eq!(block_on(store.get("c")).unwrap(), None);
    assert!(matches!(
        block_on(store.remove("c")),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn contract_holds_in_memory() {
    contract(&MemoryStore::default());
}

#[test]
fn contract_holds_embedded() {
    let (_dir, store) = embedded(StoreOptions::default());
    contract(&store);
    block_on(store.close()).unwrap();
}

fn limits<S: SessionStore>(store: &S) {
    block_on(store.create(session("x", 1))).unwrap();
    block_on(store.create(session("y", 1))).unwrap();
    assert_eq!(
        block_on(store.create(session("z", 1))).unwrap_err(),
        StoreError::SessionCap { max: 2 }
    );
    block_on(store.remove("x")).unwrap();
    block_on(store.create(session("z", 1))).unwrap();

    let e = block_on(store.apply("y", |s| {
        s.state.seen_nonces.extend(0..11);
        Change::Commit(())
    }))
    .unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::StateTooLarge {
                entries: 11,
                max: 10,
                ..
            }
        ),
        "{e}"
    );
    assert!(block_on(store.get("y"))
        .unwrap()
        .unwrap()
        .state
        .seen_nonces
        .is_empty());

    for (id, want) in [("", "empty"), ("a\nb", "contains a control character")] {
        let e = block_on(store.create(session(id, 1))).unwrap_err();
        assert_eq!(
            e,
            StoreError::InvalidId {
                field: "session_id",
                reason: want
            }
        );
    }
    let long = "x".repeat(257);
    let mut s = session("ok", 1);
    s.meta = meta("ok", &long, "org", BudgetScope::PerSession);
    assert!(matches!(
        block_on(store.create(s)),
        Err(StoreError::InvalidId {
            field: "agent_id",
            ..
        })
    ));
}

fn small() -> StoreOptions {
    StoreOptions {
        max_sessions: 2,
        max_state_entries: 10,
        ..StoreOptions::default()
    }
}

#[test]
fn limits_hold_in_memory() {
    limits(&MemoryStore::new(small()));
}

#[test]
fn limits_hold_embedded() {
    let (_dir, store) = embedded(small());
    limits(&store);
}

#[test]
fn closed_store_refuses_changes() {
    let (_dir, store) = embedded(StoreOptions::default());
    store.create_sync(session("a", 1)).unwrap();
    block_on(store.close()).unwrap();
    block_on(store.close()).unwrap();
    assert_eq!(
        store.apply_sync("a", |_| Change::Commit(())).unwrap_err(),
        StoreError::Closed
    );
    assert_eq!(
        store.create_sync(session("b", 1)).unwrap_err(),
        StoreError::Closed
    );
    // Reads still work from memory.
    assert!(store.get_sync("a").unwrap().is_some());
}

#[test]
fn keep_waits_for_the_state_it_read() {
    // A Keep right after a commit must not report durable before that commit is.
    let (_dir, store) = embedded(StoreOptions::default());
    store.create_sync(session("a", 1)).unwrap();
    for i in 0..50 {
        let (_, committed) = store
            .apply_sync("a", |s| {
                s.state.total_calls = i;
                Change::Commit(())
            })
            .unwrap();
        let (_, kept) = store.apply_sync("a", |_| Change::Keep(())).unwrap();
        kept.wait().unwrap();
        assert!(
            committed.try_result().is_some(),
            "keep completed before the commit it read"
        );
        assert!(kept.batch_seq() == 0 || kept.batch_seq() >= committed.batch_seq());
    }
}

/// The daemon spawns these futures on a multi-threaded runtime: they must be `Send`,
/// and so must `Durable` (which must also be awaitable after the store call returns).
#[test]
fn futures_and_handles_are_send() {
    fn send<T: Send + 'static>(_: &T) {}
    fn borrowed_send<T: Send>(_: &T) {}
    fn check<S: SessionStore>(store: &S) {
        borrowed_send(&store.apply("a", |s| Change::Commit(s.last_call_number)));
        borrowed_send(&store.get("a"));
        borrowed_send(&store.create(session("z", 1)));
        borrowed_send(&store.pending_hitl(None));
        borrowed_send(&store.close());
    }
    let store = MemoryStore::default();
    store.create_sync(session("a", 1)).unwrap();
    check(&store);
    let (n, durable) =
        block_on(store.apply("a", |s| Change::Commit(s.next_call_number()))).unwrap();
    assert_eq!(n, 1);
    send(&durable);
    assert_eq!(durable.try_result(), Some(Ok(())));
}

fn survives_panics<S: SessionStore>(store: &S) {
    block_on(store.create(session("p", 100))).unwrap();
    block_on(store.apply("p", |s| {
        s.state.seen_nonces.extend([1, 2, 3]);
        Change::Commit(())
    }))
    .unwrap();
    let before = block_on(store.get("p")).unwrap().unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        block_on(store.apply("p", |s| {
            s.state.seen_nonces.remove(&2);
            s.state.seen_nonces.insert(9);
            s.state.budget_remaining = Money(0);
            if s.state.seen_nonces.contains(&9) {
                panic!("closure failed");
            }
            Change::Commit(())
        }))
    }));
    assert!(caught.is_err());
    // Nothing of the panicking closure stuck, and the session goes on.
    assert_eq!(block_on(store.get("p")).unwrap().unwrap(), before);
    let (_, d) = block_on(store.apply("p", |s| {
        s.state.seen_nonces.insert(4);
        Change::Commit(())
    }))
    .unwrap();
    block_on(d).unwrap();
    let after = block_on(store.get("p")).unwrap().unwrap();
    assert_eq!(
        after.state.seen_nonces.iter().copied().collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
}

#[test]
fn a_panicking_closure_changes_nothing() {
    survives_panics(&MemoryStore::default());
    let (dir, store) = embedded(StoreOptions::default());
    survives_panics(&store);
    store.close_sync().unwrap();
    drop(store);
    let store =
        EmbeddedStore::open(dir.path().join("state.redb"), StoreOptions::default()).unwrap();
    assert_eq!(
        store
            .get_sync("p")
            .unwrap()
            .unwrap()
            .state
            .seen_nonces
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
}
