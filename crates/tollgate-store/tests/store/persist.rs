//! The embedded store over a real audit log: close and reopen, replay of the entries
//! after a snapshot, rebuilding from the log alone, and the refusals when the snapshot and
//! the log disagree.

use std::path::Path;
use std::time::Duration;

use tollgate_core::Money;
use tollgate_store::{EmbeddedStore, StoreError, StoreOptions};

use crate::support::{
    agent_session, block_on, close, create, fold_log, normalize, open_embedded, open_embedded_with,
    pre_exec, session, settle, Call,
};

/// Never snapshot on a timer or count: only at close or when asked.
fn manual() -> StoreOptions {
    StoreOptions {
        snapshot_interval: Duration::from_secs(3600),
        snapshot_entries: u64::MAX,
        ..StoreOptions::default()
    }
}

/// Some work: two sessions sharing a budget and one on its own, calls and settlements.
fn work(store: &EmbeddedStore, from: u64, calls: u64) {
    for id in ["a1", "a2", "s1"] {
        if store.get_sync(id).unwrap().is_none() {
            let s = if id == "s1" {
                session(id, 1_000_000)
            } else {
                agent_session(id, "bot", 1_000_000)
            };
            create(store, s).unwrap();
        }
    }
    for n in from..from + calls {
        for id in ["a1", "a2", "s1"] {
            let (_, d) = pre_exec(
                store,
                id,
                Call {
                    tool: "t",
                    arg: (n % 2) as i64,
                    nonce: n * 10 + 1,
                    cost: 1_000,
                    now: 10_000 + n as i64,
                },
            )
            .unwrap();
            block_on(d).unwrap();
            let last = store.get_sync(id).unwrap().unwrap().last_call_number;
            block_on(settle(store, id, last, 0.000_000_5).unwrap()).unwrap();
        }
    }
}

/// The store's sessions equal the fold of the log, session by session.
fn assert_is_fold_of_log(store: &EmbeddedStore, dir: &Path) {
    let ledger = fold_log(dir);
    let (sessions, _) = tollgate_store::dump(store);
    assert_eq!(sessions.len(), ledger.sessions.len());
    for s in sessions {
        let folded = ledger.session(&s.meta.session_id).unwrap();
        assert_eq!(normalize(folded), normalize(s));
    }
}

/// The files of a running store copied as a kill -9 would leave them: its last snapshot,
/// and the log with everything made durable so far.
fn crash_copy(writer: &tollgate_audit::Writer, dir: &Path) -> tempfile::TempDir {
    writer.flush().wait().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    std::fs::copy(dir.join("state.redb"), crashed.path().join("state.redb")).unwrap();
    copy_dir(&dir.join("audit"), &crashed.path().join("audit"));
    crashed
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn state_survives_close_and_reopen_with_nothing_to_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, store, _) = open_embedded(dir.path(), manual()).unwrap();
    work(&store, 0, 20);
    close(&writer, &store);
    let (writer, store, report) = open_embedded(dir.path(), manual()).unwrap();
    assert_eq!(report.sessions, 3);
    assert_eq!(report.replayed, 0, "the last snapshot was written at close");
    assert_eq!(report.snapshot_index, report.next_index);
    assert_is_fold_of_log(&store, dir.path());
    // And it carries on.
    work(&store, 20, 5);
    assert_is_fold_of_log(&store, dir.path());
    close(&writer, &store);
}

#[test]
fn entries_after_the_snapshot_are_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, store, _) = open_embedded(dir.path(), manual()).unwrap();
    work(&store, 0, 10);
    let snap = store.snapshot().unwrap();
    assert_eq!(snap.snapshots, 1);
    work(&store, 10, 10);
    // The snapshot from before the second half, the log with all of it.
    let crashed = crash_copy(&writer, dir.path());
    close(&writer, &store);

    let (writer, store, report) = open_embedded(crashed.path(), manual()).unwrap();
    assert_eq!(report.snapshot_index, snap.position);
    assert!(report.replayed >= 10 * 3 * 2, "{report:?}");
    assert_is_fold_of_log(&store, crashed.path());
    let b = store
        .budget_sync(&tollgate_store::BudgetKey::Agent(
            "org-1".into(),
            "bot".into(),
        ))
        .unwrap()
        .unwrap();
    // 20 rounds, two sessions, 1_000 each, conservative settlement.
    assert_eq!(b.remaining, Money(1_000_000 - 20 * 2 * 1_000));
    close(&writer, &store);
    // The replay was snapshotted at open: nothing to replay the next time.
    let (writer, store, report) = open_embedded(crashed.path(), manual()).unwrap();
    assert_eq!(report.replayed, 0);
    close(&writer, &store);
}

#[test]
fn a_lost_state_file_is_rebuilt_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, store, _) = open_embedded(dir.path(), manual()).unwrap();
    work(&store, 0, 15);
    let before = tollgate_store::dump(&store);
    close(&writer, &store);
    std::fs::remove_file(dir.path().join("state.redb")).unwrap();
    let (writer, store, report) = open_embedded(dir.path(), manual()).unwrap();
    assert_eq!(report.snapshot_index, 0);
    assert_eq!(report.replayed, report.next_index);
    let after = tollgate_store::dump(&store);
    assert_eq!(
        before.0.into_iter().map(normalize).collect::<Vec<_>>(),
        after.0.into_iter().map(normalize).collect::<Vec<_>>()
    );
    assert_eq!(before.1.len(), after.1.len());
    close(&writer, &store);
}

#[test]
fn a_snapshot_ahead_of_its_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, store, _) = open_embedded(dir.path(), manual()).unwrap();
    work(&store, 0, 3);
    writer.flush().wait().unwrap();
    let early_log = tempfile::tempdir().unwrap();
    copy_dir(&dir.path().join("audit"), early_log.path());
    work(&store, 3, 3);
    close(&writer, &store);
    // The log as it was before the last three rounds, under the final snapshot.
    std::fs::remove_dir_all(dir.path().join("audit")).unwrap();
    copy_dir(early_log.path(), &dir.path().join("audit"));
    let err = open_embedded(dir.path(), manual()).unwrap_err();
    assert!(matches!(err, StoreError::Mismatch { .. }), "{err}");
}

#[test]
fn a_log_that_is_not_the_snapshots_is_refused() {
    // Two histories from the same key: the snapshot of one does not link into the other.
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    for (d, rounds) in [(&one, 4), (&two, 6)] {
        let (writer, store, _) = open_embedded(d.path(), manual()).unwrap();
        work(&store, 0, rounds);
        if rounds == 6 {
            // A different history: other nonces.
            work(&store, 100, 1);
        }
        close(&writer, &store);
    }
    std::fs::copy(one.path().join("state.redb"), two.path().join("state.redb")).unwrap();
    let err = open_embedded(two.path(), manual()).unwrap_err();
    assert!(matches!(err, StoreError::Mismatch { .. }), "{err}");
}

#[test]
fn a_tampered_entry_after_the_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, store, _) = open_embedded(dir.path(), manual()).unwrap();
    work(&store, 0, 2);
    store.snapshot().unwrap();
    work(&store, 2, 2);
    let crashed = crash_copy(&writer, dir.path());
    close(&writer, &store);
    // Flip a byte near the end of the log (inside the last entry's signed fields).
    let log = std::fs::read_dir(crashed.path().join("audit"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .unwrap();
    let mut bytes = std::fs::read(&log).unwrap();
    let at = bytes.len() - 120;
    bytes[at] ^= 0x01;
    std::fs::write(&log, bytes).unwrap();
    let err = open_embedded(crashed.path(), manual()).unwrap_err();
    assert!(matches!(err, StoreError::Mismatch { .. }), "{err}");
}

#[test]
fn a_state_file_of_another_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        // A file whose META table holds something else, as another version would.
        let db = redb::Database::create(dir.path().join("state.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn
                .open_table(redb::TableDefinition::<&str, u64>::new("meta"))
                .unwrap();
            t.insert("folded_seq", 3).unwrap();
        }
        txn.commit().unwrap();
    }
    let err = open_embedded(dir.path(), manual()).unwrap_err();
    assert!(matches!(err, StoreError::Incompatible { .. }), "{err}");
}

#[test]
fn snapshots_happen_on_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        snapshot_interval: Duration::from_secs(3600),
        snapshot_entries: 10,
        ..StoreOptions::default()
    };
    let (writer, store, _) = open_embedded(dir.path(), options).unwrap();
    work(&store, 0, 10);
    writer.flush().wait().unwrap();
    // 3 openings and 60 changes: at least six snapshots by count alone, written before the
    // explicit one below can add at most one more.
    let s = store.snapshot().unwrap();
    assert_eq!(s.position, 63);
    assert!(s.snapshots >= 6, "{s:?}");
    close(&writer, &store);
}

#[test]
fn replay_follows_a_key_handover() {
    // A snapshot, more work, a hand-over to a new key, more work: the entries after the
    // snapshot are signed by two keys, and replay checks each with the right one.
    let dir = tempfile::tempdir().unwrap();
    let new_key = tollgate_audit::SigningKey::from_bytes(&[8; 32]);
    let (writer, store, _) = open_embedded(dir.path(), manual()).unwrap();
    work(&store, 0, 3);
    store.snapshot().unwrap();
    work(&store, 3, 2);
    writer.rotate_key(new_key.clone()).wait().unwrap();
    work(&store, 5, 2);
    let crashed = crash_copy(&writer, dir.path());
    close(&writer, &store);
    let (writer, store, report) =
        open_embedded_with(crashed.path(), manual(), new_key.clone()).unwrap();
    assert!(
        report.replayed > 0 && report.snapshot_index > 0,
        "{report:?}"
    );
    work(&store, 7, 1);
    close(&writer, &store);
    // And the snapshot written since records the new key: a restart reads on with it.
    let (writer, store, report) = open_embedded_with(crashed.path(), manual(), new_key).unwrap();
    assert_eq!(report.replayed, 0);
    close(&writer, &store);
}

#[test]
fn a_handover_while_the_daemon_was_stopped_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, store, _) = open_embedded(dir.path(), manual()).unwrap();
    work(&store, 0, 2);
    close(&writer, &store);
    // `tollgate audit rotate-key` while the daemon is down: a hand-over entry after the
    // last snapshot's position, signed by the old key.
    let new_key = tollgate_audit::SigningKey::from_bytes(&[9; 32]);
    let (w, _) = tollgate_audit::Writer::open(
        tollgate_audit::WriterConfig::new(dir.path().join("audit")),
        crate::support::key(),
    )
    .unwrap();
    w.rotate_key(new_key.clone()).wait().unwrap();
    w.shutdown().unwrap();
    let (writer, store, report) = open_embedded_with(dir.path(), manual(), new_key).unwrap();
    assert_eq!(report.replayed, 1);
    assert_eq!(report.sessions, 3);
    close(&writer, &store);
}
