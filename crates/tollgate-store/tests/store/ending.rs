//! Sessions end (issue 17 §4): a session-closed entry makes the store forget the session
//! (no more changes, not counted against the cap), the snapshot and the fold of the log
//! forget it too (no restart brings it back), and a change racing the end is either
//! before it in the log or refused.

use std::sync::Arc;
use std::time::Duration;

use tollgate_audit::{CloseReason, SessionEvent};
use tollgate_store::{ops, Change, Durable, MemoryStore, SessionStore, StoreError, StoreOptions};

use crate::support::{
    agent_session, block_on, close, create, fold_log, open_embedded, pre_exec, session, Call,
    Recorder,
};

fn manual() -> StoreOptions {
    StoreOptions {
        snapshot_interval: Duration::from_secs(3600),
        snapshot_entries: u64::MAX,
        ..StoreOptions::default()
    }
}

/// What the daemon's close does inside `apply`.
fn end<S: SessionStore>(store: &S, id: &str, now: i64) -> Result<Durable, StoreError> {
    block_on(store.apply(id, move |s| {
        let record = ops::close(s, CloseReason::Agent, now);
        Change::End((), record.into())
    }))
    .map(|((), d)| d)
}

fn call(nonce: u64) -> Call<'static> {
    Call {
        tool: "t",
        arg: nonce as i64,
        nonce,
        cost: 1_000,
        now: 10_000 + nonce as i64,
    }
}

#[test]
fn an_ended_session_leaves_the_store_the_snapshot_and_the_fold() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, store, _) = open_embedded(dir.path(), manual()).unwrap();
    for id in ["a1", "a2", "s1"] {
        let s = if id == "s1" {
            session(id, 1_000_000)
        } else {
            agent_session(id, "bot", 1_000_000)
        };
        create(&store, s).unwrap();
        block_on(pre_exec(&store, id, call(1)).unwrap().1).unwrap();
    }
    // A snapshot holds all three; then a1 ends.
    store.snapshot().unwrap();
    block_on(end(&store, "a1", 20_000).unwrap()).unwrap();
    assert_eq!(store.get_sync("a1").unwrap(), None);
    assert_eq!(store.len(), 2);
    assert!(matches!(
        pre_exec(&store, "a1", call(2)),
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        end(&store, "a1", 20_001),
        Err(StoreError::NotFound { .. })
    ));
    // The next snapshot is written with a1 gone; s1 ends after it (the log holds that end).
    store.snapshot().unwrap();
    block_on(end(&store, "s1", 20_002).unwrap()).unwrap();
    close(&writer, &store);
    // Reopened: the snapshot forgot a1 (nothing to replay: the last snapshot was at
    // close), and s1's end was folded too. a2 keeps the budget a1 shared with it.
    let (writer, store, report) = open_embedded(dir.path(), manual()).unwrap();
    assert_eq!(report.sessions, 1, "{report:?}");
    assert_eq!(report.replayed, 0);
    assert_eq!(store.get_sync("a1").unwrap(), None);
    assert_eq!(store.get_sync("s1").unwrap(), None);
    let a2 = store.get_sync("a2").unwrap().unwrap();
    assert_eq!(a2.state.budget_remaining.0, 1_000_000 - 2 * 1_000);
    close(&writer, &store);
    // The fold of the log alone (an auditor's) agrees.
    let ledger = fold_log(dir.path());
    let mut ids: Vec<&String> = ledger.sessions.keys().collect();
    ids.sort();
    assert_eq!(ids, ["a2"]);
    // And a rebuild from the log alone (no snapshot) too.
    std::fs::remove_file(dir.path().join("state.redb")).unwrap();
    let (writer, store, report) = open_embedded(dir.path(), manual()).unwrap();
    assert_eq!(report.sessions, 1, "{report:?}");
    assert_eq!(store.get_sync("a1").unwrap(), None);
    close(&writer, &store);
}

#[test]
fn the_cap_counts_live_sessions() {
    let store = MemoryStore::new(2, None);
    create(&store, session("x1", 10)).unwrap();
    create(&store, session("x2", 10)).unwrap();
    assert!(matches!(
        create(&store, session("x3", 10)),
        Err(StoreError::SessionCap { max: 2 })
    ));
    block_on(end(&store, "x1", 5_000).unwrap()).unwrap();
    create(&store, session("x3", 10)).unwrap();
    assert_eq!(store.len(), 2);
}

/// Interleavings of decide and end on the same sessions, on several threads: every
/// decision either precedes the end in the journal (and was answered) or was refused as
/// an unknown session; nothing follows a session's end in the journal; the live state is
/// the fold of the journal; the count is the live sessions.
#[test]
fn decisions_racing_an_end_are_before_it_or_refused() {
    for round in 0..20u64 {
        let journal = Arc::new(Recorder::default());
        let store = Arc::new(MemoryStore::new(1_000, Some(journal.clone())));
        let ids: Vec<String> = (0..4).map(|i| format!("r{round}-{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            let s = if i % 2 == 0 {
                agent_session(id, "bot", 1_000_000_000)
            } else {
                session(id, 1_000_000_000)
            };
            create(&*store, s).unwrap();
        }
        let mut threads = Vec::new();
        for id in ids.clone() {
            for t in 0..2u64 {
                let (store, id) = (store.clone(), id.clone());
                threads.push(std::thread::spawn(move || {
                    let mut answered = Vec::new();
                    for n in 0..50u64 {
                        let nonce = 1 + t * 1_000 + n;
                        match pre_exec(&*store, &id, call(nonce)) {
                            Ok((_, d)) => {
                                block_on(d).unwrap();
                                answered.push(nonce);
                            }
                            Err(StoreError::NotFound { .. }) => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    (id, answered)
                }));
            }
            let (store, id) = (store.clone(), id.clone());
            threads.push(std::thread::spawn(move || {
                for _ in 0..(round * 7 % 40) {
                    std::thread::yield_now();
                }
                block_on(end(&*store, &id, 50_000).unwrap()).unwrap();
                (id, Vec::new())
            }));
        }
        let mut answered = Vec::new();
        for t in threads {
            let (id, nonces) = t.join().unwrap();
            answered.extend(nonces.into_iter().map(|n| (id.clone(), n)));
        }
        assert_eq!(store.len(), 0);
        let events = journal.0.lock().unwrap().clone();
        for id in &ids {
            let mine: Vec<&SessionEvent> = events.iter().filter(|e| e.session_id() == id).collect();
            let last = mine.last().unwrap();
            assert!(
                matches!(last, SessionEvent::Closed(_)),
                "{id}: the end is not its last entry"
            );
            assert_eq!(
                mine.iter()
                    .filter(|e| matches!(e, SessionEvent::Closed(_)))
                    .count(),
                1
            );
        }
        // Every answered decision is in the journal, before its session's end.
        for (id, nonce) in &answered {
            assert!(events.iter().any(|e| matches!(
                e,
                SessionEvent::Verdict(v) if &v.session_id == id && v.nonce == *nonce
            )));
        }
        // The fold of the journal has no session left.
        assert!(journal.fold().sessions.is_empty());
    }
}
