//! What survives a restart, and what a damaged or locked file does.

use std::path::{Path, PathBuf};

use tollgate_core::state::Reservation;
use tollgate_core::{BudgetScope, HumanDecision, Money, PendingTransition, Reason, SessionStatus};
use tollgate_store::{
    BudgetKey, Change, Durability, EmbeddedStore, Session, StoreError, StoreOptions,
};

use crate::support::{agent_session, meta, session};

fn open(path: &Path) -> EmbeddedStore {
    EmbeddedStore::open(path, StoreOptions::default()).unwrap()
}

/// Every kind of state the brief names: a tripped circuit, seen nonces, reservations,
/// a pending transition, call numbers and heartbeat, and a shared budget.
fn eventful(store: &EmbeddedStore) -> Vec<Session> {
    store.create_sync(session("s1", 1_000)).unwrap();
    store
        .create_sync(agent_session("s2", "bot", 5_000))
        .unwrap();
    store.create_sync(agent_session("s3", "bot", 1)).unwrap();
    let mut last = None;
    last = Some(
        store
            .apply_sync("s1", |s| {
                s.next_call_number();
                s.state.circuit_tripped = true;
                s.state.circuit_trip_reason = Some(Reason::MaxRepeatExceeded);
                s.state.circuit_tripped_at_ns = 77;
                s.state.seen_nonces.extend([3, 1, u64::MAX]);
                s.last_heartbeat_ns = 9_999;
                Change::Commit(())
            })
            .unwrap()
            .1,
    )
    .or(last);
    last = Some(
        store
            .apply_sync("s2", |s| {
                s.last_call_number = 41;
                s.state.reservations.insert(
                    41,
                    Reservation {
                        estimated: Money(300),
                        deducted: Money(300),
                    },
                );
                s.state.budget_remaining = Money(4_700);
                s.state.status = SessionStatus::Paused;
                s.state.pending = Some(PendingTransition {
                    decision: HumanDecision::Unknown("Maybe".into()),
                    original_nonce: Some(12),
                    tool_name: Some("deploy".into()),
                    requested_at_ns: 5,
                    ..PendingTransition::default()
                });
                Change::Commit(())
            })
            .unwrap()
            .1,
    )
    .or(last);
    store.create_sync(session("gone", 1)).unwrap();
    let d = store.remove_sync("gone").unwrap();
    d.wait().unwrap();
    last.unwrap().wait().unwrap();
    store.list_sync(None).unwrap()
}

#[test]
fn restart_restores_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let before = {
        let store = open(&path);
        eventful(&store)
        // Dropped without close: only what the Durables promised is relied on.
    };
    assert_eq!(before.len(), 3);
    let store = open(&path);
    assert_eq!(store.list_sync(None).unwrap(), before);
    assert_eq!(store.len(), 3);
    let s2 = store.get_sync("s2").unwrap().unwrap();
    let s3 = store.get_sync("s3").unwrap().unwrap();
    // s3 joined s2's budget: the shared amounts, not its own 1 nano-dollar.
    assert_eq!(s3.state.budget_remaining, Money(4_700));
    assert_eq!(s2.state.budget_initial, Money(5_000));
    assert_eq!(
        store
            .budget_sync(&BudgetKey::Agent("org-1".into(), "bot".into()))
            .unwrap()
            .unwrap()
            .remaining,
        Money(4_700)
    );
    assert_eq!(store.get_sync("gone").unwrap(), None);
    // Call numbers continue from where they were.
    let (n, _) = store
        .apply_sync("s2", |s| Change::Commit(s.next_call_number()))
        .unwrap();
    assert_eq!(n, 42);
}

#[test]
fn never_durability_is_flushed_by_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let options = StoreOptions {
        durability: Durability::Never,
        ..StoreOptions::default()
    };
    let before = {
        let store = EmbeddedStore::open(&path, options).unwrap();
        let b = eventful(&store);
        store.close_sync().unwrap();
        b
    };
    assert_eq!(open(&path).list_sync(None).unwrap(), before);
}

#[test]
fn a_locked_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let _first = open(&path);
    let e = EmbeddedStore::open(&path, StoreOptions::default()).unwrap_err();
    assert!(matches!(e, StoreError::Backend { op: "open", .. }), "{e}");
}

fn write_raw(path: &Path, table: &str, key: &str, value: &[u8]) {
    let db = redb::Database::create(path).unwrap();
    let def: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new(table);
    let txn = db.begin_write().unwrap();
    txn.open_table(def).unwrap().insert(key, value).unwrap();
    txn.commit().unwrap();
}

#[test]
fn corrupt_records_are_reported_with_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    drop(open(&path));
    write_raw(
        &path,
        "sessions",
        "bad",
        b"{\"v\":1,\"session_id\":\"bad\"}",
    );
    let e = EmbeddedStore::open(&path, StoreOptions::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "stored record `bad` is corrupt: missing key `budget_scope`"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    drop(open(&path));
    write_raw(&path, "sessions", "x", &[0xff, 0x00, 0x7b]);
    let e = EmbeddedStore::open(&path, StoreOptions::default()).unwrap_err();
    assert!(
        matches!(&e, StoreError::Corrupt { key, .. } if key == "x"),
        "{e}"
    );

    // A record stored under another session's key.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    drop(open(&path));
    let good = tollgate_store::record::encode_session(&session("real", 1));
    write_raw(&path, "sessions", "other", &good);
    let e = EmbeddedStore::open(&path, StoreOptions::default()).unwrap_err();
    assert!(e.to_string().contains("names another session"), "{e}");

    // A shared-budget session whose budget record is missing.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    drop(open(&path));
    let orphan = Session::new(
        meta("orphan", "a", "o", BudgetScope::PerOrganization),
        Money(1),
        0,
    );
    write_raw(
        &path,
        "sessions",
        "orphan",
        &tollgate_store::record::encode_session(&orphan),
    );
    let e = EmbeddedStore::open(&path, StoreOptions::default()).unwrap_err();
    assert!(matches!(e, StoreError::BudgetMissing { .. }), "{e}");

    // Records over the size bound.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    drop(open(&path));
    write_raw(&path, "sessions", "real", &good);
    let e = EmbeddedStore::open(
        &path,
        StoreOptions {
            max_record_bytes: good.len() - 1,
            ..StoreOptions::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("over the limit"), "{e}");
    assert!(EmbeddedStore::open(&path, StoreOptions::default()).is_ok());
}

#[test]
fn durable_acknowledgement_implies_all_earlier_changes() {
    // Batches commit in order: once a later change is durable, every earlier one is too,
    // whichever session it touched. (The crash test checks the disk side of this.)
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.redb"));
    for i in 0..8 {
        store.create_sync(session(&format!("s{i}"), 1)).unwrap();
    }
    let mut all = Vec::new();
    for round in 1..=300_u64 {
        let id = format!("s{}", round % 8);
        let (_, d) = store
            .apply_sync(&id, |s| {
                s.state.total_calls = round;
                Change::Commit(())
            })
            .unwrap();
        if let Some(prev) = all.last() {
            let prev: &tollgate_store::Durable = prev;
            assert!(d.batch_seq() >= prev.batch_seq());
        }
        all.push(d);
    }
    all.last().unwrap().wait().unwrap();
    assert!(all.iter().all(|d| d.try_result() == Some(Ok(()))));
}

#[test]
fn nonces_are_written_incrementally_and_removed_with_their_session() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    {
        let store = open(&path);
        store.create_sync(session("n", 1)).unwrap();
        store.create_sync(session("gone", 1)).unwrap();
        for batch in [vec![5, 1, 9], vec![2], vec![u64::MAX, 0]] {
            for id in ["n", "gone"] {
                let b = batch.clone();
                let (_, d) = store
                    .apply_sync(id, move |s| {
                        s.state.seen_nonces.extend(b);
                        Change::Commit(())
                    })
                    .unwrap();
                d.wait().unwrap();
            }
        }
        // A closure may also drop nonces; the table follows.
        let (_, d) = store
            .apply_sync("n", |s| {
                s.state.seen_nonces.remove(&9);
                s.state.seen_nonces.remove(&0);
                Change::Commit(())
            })
            .unwrap();
        d.wait().unwrap();
        store.remove_sync("gone").unwrap().wait().unwrap();
        // Same id again: it must not inherit the old session's nonces.
        store
            .create_sync(session("gone", 1))
            .unwrap()
            .wait()
            .unwrap();
    }
    let store = open(&path);
    let n = store.get_sync("n").unwrap().unwrap();
    assert_eq!(
        n.state.seen_nonces.iter().copied().collect::<Vec<_>>(),
        [1, 2, 5, u64::MAX]
    );
    assert!(store
        .get_sync("gone")
        .unwrap()
        .unwrap()
        .state
        .seen_nonces
        .is_empty());
    drop(store);

    // Nonces with no session are a damaged file.
    let db = redb::Database::create(&path).unwrap();
    let def: redb::TableDefinition<(&str, u64), ()> = redb::TableDefinition::new("nonces");
    let txn = db.begin_write().unwrap();
    txn.open_table(def)
        .unwrap()
        .insert(("ghost", 1), ())
        .unwrap();
    txn.commit().unwrap();
    drop(db);
    let e = EmbeddedStore::open(&path, StoreOptions::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "stored record `ghost` is corrupt: nonces of a session that does not exist"
    );
}

/// The store's write-ahead log file.
fn wal(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".wal");
    PathBuf::from(p)
}

/// A crash image of an open store, at `to`: copies of its two files, which is what a
/// kill -9 at this moment would leave (between checkpoints the redb file is not written,
/// and every acknowledged batch has been written to the log).
fn crash_image(path: &Path, to: &Path) {
    std::fs::copy(path, to).unwrap();
    std::fs::copy(wal(path), wal(to)).unwrap();
}

/// Sessions `a` and `b`, then `n` changes to `a` (each acknowledged, so one batch
/// each): `a`'s `total_calls` counts them.
fn numbered(store: &EmbeddedStore, n: u64) {
    store
        .create_sync(session("a", 1_000))
        .unwrap()
        .wait()
        .unwrap();
    store
        .create_sync(session("b", 1_000))
        .unwrap()
        .wait()
        .unwrap();
    for i in 1..=n {
        let (_, d) = store
            .apply_sync("a", |s| {
                s.state.total_calls = i;
                s.state.seen_nonces.insert(i);
                Change::Commit(())
            })
            .unwrap();
        d.wait().unwrap();
    }
}

fn total_calls(path: &Path) -> u64 {
    let store = open(path);
    let a = store.get_sync("a").unwrap().unwrap();
    assert_eq!(
        a.state.seen_nonces.iter().copied().collect::<Vec<_>>(),
        (1..=a.state.total_calls).collect::<Vec<_>>(),
        "a consistent cut"
    );
    a.state.total_calls
}

fn open_err(path: &Path) -> StoreError {
    EmbeddedStore::open(path, StoreOptions::default()).unwrap_err()
}

#[test]
fn the_log_replays_a_crash_image() {
    let dir = tempfile::tempdir().unwrap();
    let (path, image) = (dir.path().join("s.redb"), dir.path().join("i.redb"));
    let store = open(&path);
    let before = eventful(&store);
    crash_image(&path, &image);
    assert_eq!(open(&image).list_sync(None).unwrap(), before);
    // Replayed and folded at open: a second open reads it from the tables.
    assert_eq!(open(&image).list_sync(None).unwrap(), before);
    assert_eq!(std::fs::metadata(wal(&image)).unwrap().len(), 48);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(wal(&path)).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_torn_last_record_is_cut_off_and_kept_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = open(&path);
    numbered(&store, 6);
    // Cut short at every length inside the last record (44 bytes of framing plus the
    // entry), and with its last byte (checksum) damaged: the last change is lost, as it
    // would be had the crash come before its fsync returned, and nothing else.
    let len = std::fs::metadata(wal(&path)).unwrap().len();
    for cut in 1..=30 {
        let image = dir.path().join(format!("cut{cut}.redb"));
        crash_image(&path, &image);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(wal(&image))
            .unwrap();
        f.set_len(len - cut).unwrap();
        drop(f);
        assert_eq!(total_calls(&image), 5, "cut {cut}");
        let mut torn = wal(&image).into_os_string();
        torn.push(".torn");
        assert!(std::fs::metadata(&torn).unwrap().len() > 0);
        // The tail is gone for good: the next open finds a clean log.
        assert_eq!(total_calls(&image), 5, "cut {cut}, reopened");
    }
    let image = dir.path().join("flip.redb");
    crash_image(&path, &image);
    let mut bytes = std::fs::read(wal(&image)).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(wal(&image), &bytes).unwrap();
    assert_eq!(total_calls(&image), 5);
    // Zeros where the last record should be (space extended, data never written).
    let image = dir.path().join("zeros.redb");
    crash_image(&path, &image);
    let mut bytes = std::fs::read(wal(&image)).unwrap();
    bytes.extend([0; 100]);
    std::fs::write(wal(&image), &bytes).unwrap();
    assert_eq!(total_calls(&image), 6);
    drop(store);
    assert_eq!(total_calls(&path), 6);
}

#[test]
fn damage_before_the_last_record_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = open(&path);
    numbered(&store, 4);
    let clean = std::fs::read(wal(&path)).unwrap();
    // A byte of every record but the last, in turn: length, number, entry, checksum.
    let mut starts = vec![48_usize];
    loop {
        let at = *starts.last().unwrap();
        let n = u32::from_be_bytes(clean[at..at + 4].try_into().unwrap()) as usize;
        let next = at + 44 + n;
        if next >= clean.len() {
            break;
        }
        starts.push(next);
    }
    assert_eq!(starts.len(), 6, "two creates and four changes");
    for (i, at) in starts[..starts.len() - 1].iter().enumerate() {
        for off in [0, 5, 12, 20] {
            let image = dir.path().join(format!("r{i}o{off}.redb"));
            crash_image(&path, &image);
            let mut bytes = clean.clone();
            bytes[at + off] ^= 0x40;
            std::fs::write(wal(&image), &bytes).unwrap();
            let e = open_err(&image);
            assert!(
                matches!(&e, StoreError::Corrupt { reason, .. }
                    if reason.contains("damaged") || reason.contains("expected")),
                "record {i}, byte {off}: {e}"
            );
        }
    }
    // A damaged header.
    let image = dir.path().join("header.redb");
    crash_image(&path, &image);
    let mut bytes = clean.clone();
    bytes[10] ^= 1;
    std::fs::write(wal(&image), &bytes).unwrap();
    let e = open_err(&image);
    assert!(e.to_string().contains("bad header"), "{e}");
}

#[test]
fn batches_already_folded_are_skipped() {
    // A crash after a checkpoint's fold committed and before the new log replaced the
    // old one: the old log's batches are all in the tables already.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = open(&path);
    numbered(&store, 5);
    let old_log = std::fs::read(wal(&path)).unwrap();
    store.close_sync().unwrap();
    drop(store);
    std::fs::write(wal(&path), &old_log).unwrap();
    assert_eq!(total_calls(&path), 5);
    let store = open(&path);
    numbered_more(&store, 5, 3);
    drop(store);
    assert_eq!(total_calls(&path), 8);
}

fn numbered_more(store: &EmbeddedStore, from: u64, n: u64) {
    for i in from + 1..=from + n {
        let (_, d) = store
            .apply_sync("a", |s| {
                s.state.total_calls = i;
                s.state.seen_nonces.insert(i);
                Change::Commit(())
            })
            .unwrap();
        d.wait().unwrap();
    }
}

#[test]
fn a_log_that_skips_batches_is_corrupt() {
    // Tables from before a checkpoint with the log from after it (say, the redb file
    // restored from an older copy): the batches between are missing.
    let dir = tempfile::tempdir().unwrap();
    let (path, old) = (dir.path().join("s.redb"), dir.path().join("old.redb"));
    let store = open(&path);
    numbered(&store, 3);
    crash_image(&path, &old);
    drop(store);
    let store = open(&path);
    numbered_more(&store, 3, 2);
    std::fs::copy(wal(&path), wal(&old)).unwrap();
    let e = open_err(&old);
    assert!(
        e.to_string().contains("only batches up to 0 were folded"),
        "{e}"
    );
}

#[test]
fn an_older_stores_unreplayed_log_table_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let db = redb::Database::create(&path).unwrap();
    let def: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log");
    let txn = db.begin_write().unwrap();
    txn.open_table(def)
        .unwrap()
        .insert(5, &[0_u8; 8][..])
        .unwrap();
    txn.commit().unwrap();
    drop(db);
    let e = open_err(&path);
    assert!(e.to_string().contains("older version"), "{e}");
}

#[test]
fn a_missing_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    drop(open(&path));
    std::fs::remove_file(wal(&path)).unwrap();
    let e = open_err(&path);
    assert!(e.to_string().contains("log file is missing"), "{e}");
}

#[test]
fn every_batch_is_fsynced_before_it_completes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.redb"));
    store
        .create_sync(session("a", 1_000))
        .unwrap()
        .wait()
        .unwrap();
    for i in 1..=50 {
        let (_, d) = store
            .apply_sync("a", |s| {
                s.state.total_calls = i;
                Change::Commit(())
            })
            .unwrap();
        d.wait().unwrap();
        // Batches 1..=d.batch_seq() have all completed, each after its own sync.
        assert!(store.writer_stats().log_syncs >= d.batch_seq(), "{i}");
    }
    let never = EmbeddedStore::open(
        dir.path().join("n.redb"),
        StoreOptions {
            durability: Durability::Never,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    numbered(&never, 5);
    assert_eq!(never.writer_stats().log_syncs, 0);
    assert!(never.writer_stats().batches >= 7);
}

#[test]
fn frequent_checkpoints_keep_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let options = StoreOptions {
        checkpoint_entries: 1,
        ..StoreOptions::default()
    };
    let before = {
        let store = EmbeddedStore::open(&path, options).unwrap();
        let b = eventful(&store);
        let st = store.writer_stats();
        assert!(st.batches >= 1);
        assert_eq!(st.checkpoints, st.batches);
        b
    };
    assert_eq!(open(&path).list_sync(None).unwrap(), before);
}
