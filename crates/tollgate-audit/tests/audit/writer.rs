//! The writer: group commit from many threads, async completion, reopen, keys, modes.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use tollgate_audit::{BreakKind, Event, FsyncPolicy, OpenError, VerifyOptions, WriteError, Writer};

use crate::common::*;

#[test]
fn many_concurrent_writers_share_batches_and_chain_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.fsync = FsyncPolicy::Batch;
    let (w, report) = Writer::open(cfg, key(1)).unwrap();
    assert!(report.created);
    let w = Arc::new(w);
    let threads: Vec<_> = (0..64u64)
        .map(|t| {
            let w = w.clone();
            std::thread::spawn(move || {
                (0..20u64)
                    .map(|i| w.append(record(t * 1000 + i)).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut appended: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let stats = w.stats();
    w.shutdown().unwrap();
    // Group commit: concurrent writers share fsyncs.
    assert_eq!(stats.entries, 1280);
    assert!(stats.syncs < stats.entries, "{stats:?}");
    // Every fsync is timed (the daemon's /metrics reports the total).
    assert!(stats.syncs > 0 && stats.sync_nanos > 0, "{stats:?}");
    appended.sort_by_key(|a| a.index);
    assert_eq!(
        appended.iter().map(|a| a.index).collect::<Vec<_>>(),
        (0..1280).collect::<Vec<_>>()
    );
    let (s, entries) = verify_dir(dir.path(), &opts(&key(1))).unwrap();
    assert_eq!(s.entries, 1280);
    // What the writer reported is what is in the file.
    let bytes = fs::read(only_file(dir.path())).unwrap();
    for ((a, e), (off, len)) in appended.iter().zip(&entries).zip(record_spans(&bytes)) {
        assert_eq!(a.entry_id, e.entry_id);
        assert_eq!(
            a.hash,
            tollgate_audit::format::sha256(&bytes[off..off + len])
        );
    }
}

#[test]
fn completion_can_be_awaited() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    let a = block_on(w.submit(record(0))).unwrap();
    let b = block_on(w.submit(record(1))).unwrap();
    assert_eq!((a.index, b.index), (0, 1));
    block_on(w.flush()).unwrap();
    w.shutdown().unwrap();
    assert_eq!(verify_dir(dir.path(), &opts(&key(1))).unwrap().0.entries, 2);
}

#[test]
fn every_fsync_policy_writes_a_whole_log() {
    for policy in [FsyncPolicy::Always, FsyncPolicy::Batch, FsyncPolicy::Never] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.fsync = policy;
        let (w, _) = Writer::open(cfg, key(1)).unwrap();
        let pending: Vec<_> = (0..50).map(|i| w.submit(record(i))).collect();
        for (i, p) in pending.into_iter().enumerate() {
            assert_eq!(p.wait().unwrap().index, i as u64);
        }
        w.shutdown().unwrap();
        assert_eq!(
            verify_dir(dir.path(), &opts(&key(1))).unwrap().0.entries,
            50,
            "{policy:?}"
        );
    }
    assert_eq!("batch".parse::<FsyncPolicy>(), Ok(FsyncPolicy::Batch));
    assert!("sometimes".parse::<FsyncPolicy>().is_err());
}

#[test]
fn shutdown_drains_then_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    let pending: Vec<_> = (0..200).map(|i| w.submit(record(i))).collect();
    w.shutdown().unwrap();
    for p in pending {
        p.wait().unwrap();
    }
    assert_eq!(w.append(record(200)), Err(WriteError::WriterGone));
    assert!(matches!(w.flush().wait(), Err(WriteError::WriterGone)));
    w.shutdown().unwrap();
    assert_eq!(
        verify_dir(dir.path(), &opts(&key(1))).unwrap().0.entries,
        200
    );
}

#[test]
fn reopen_continues_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 5);
    let (w, report) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    assert!(!report.created);
    assert_eq!(report.next_index, 5);
    assert_eq!(report.recovered, None);
    assert_eq!(w.append(record(5)).unwrap().index, 5);
    w.shutdown().unwrap();
    let (s, entries) = verify_dir(dir.path(), &opts(&key(1))).unwrap();
    assert_eq!(s.entries, 6);
    assert_eq!(s.files, 1);
    assert_eq!(entries[5].event, ev(record(5)));
}

#[test]
fn reopen_with_another_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 3);
    match Writer::open(fast(config(dir.path())), key(2)) {
        Err(OpenError::KeyMismatch { log, given }) => {
            assert_eq!(
                log,
                tollgate_audit::KeyId::of(key(1).verifying_key().as_bytes())
            );
            assert_eq!(
                given,
                tollgate_audit::KeyId::of(key(2).verifying_key().as_bytes())
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn key_handover_is_signed_by_the_old_key_and_names_the_new() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    w.append(record(0)).unwrap();
    let h = w.rotate_key(key(2)).wait().unwrap();
    assert_eq!(h.index, 1);
    w.append(record(2)).unwrap();
    w.shutdown().unwrap();
    let (s, entries) = verify_dir(dir.path(), &opts(&key(1))).unwrap();
    assert_eq!(s.entries, 3);
    assert_eq!(
        s.key_id,
        tollgate_audit::KeyId::of(key(2).verifying_key().as_bytes())
    );
    assert_eq!(
        entries[1].event,
        Event::KeyHandover {
            new_public_key: key(2).verifying_key().to_bytes()
        }
    );
    assert_eq!(
        entries[1].key_id,
        tollgate_audit::KeyId::of(key(1).verifying_key().as_bytes())
    );
    assert_eq!(entries[2].key_id, s.key_id);
    // The log starts with key 1: trusting key 2 alone is not enough.
    assert!(matches!(
        break_of(dir.path(), &opts(&key(2))).1,
        BreakKind::UnknownKey { .. }
    ));
    // Reopening needs the new key now.
    assert!(matches!(
        Writer::open(fast(config(dir.path())), key(1)),
        Err(OpenError::KeyMismatch { .. })
    ));
    let (w, _) = Writer::open(fast(config(dir.path())), key(2)).unwrap();
    w.append(record(3)).unwrap();
    w.shutdown().unwrap();
    assert_eq!(verify_dir(dir.path(), &opts(&key(1))).unwrap().0.entries, 4);
}

#[test]
fn an_entry_signed_by_the_old_key_after_handover_is_unknown_key() {
    // Forge: after the handover, an entry signed by the old key is spliced in.
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    w.append(record(0)).unwrap();
    w.rotate_key(key(2)).wait().unwrap();
    w.shutdown().unwrap();
    let path = only_file(dir.path());
    let mut bytes = fs::read(&path).unwrap();
    let (s, _) = verify_dir(dir.path(), &opts(&key(1))).unwrap();
    let rec = tollgate_audit::format::encode_record(
        tollgate_audit::format::Position {
            index: 2,
            timestamp_ns: NOON,
            entry_id: uuid::Uuid::nil(),
            prev_hash: &s.last_hash,
        },
        &ev(record(2)),
        &key(1),
        tollgate_audit::KeyId::of(key(1).verifying_key().as_bytes()),
    )
    .unwrap();
    bytes.extend_from_slice(&rec);
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        break_of(dir.path(), &opts(&key(1))),
        (Some(2), BreakKind::UnknownKey { .. })
    ));
}

#[test]
fn oversized_field_is_rejected_and_the_chain_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    w.append(record(0)).unwrap();
    let mut big = record(1);
    big.tool_name = "x".repeat(1025);
    assert!(matches!(w.append(big), Err(WriteError::Encode(_))));
    assert_eq!(w.append(record(1)).unwrap().index, 1);
    w.shutdown().unwrap();
    assert_eq!(verify_dir(dir.path(), &opts(&key(1))).unwrap().0.entries, 2);
}

#[test]
fn files_are_0640_and_only_grow() {
    let dir = tempfile::tempdir().unwrap();
    let (w, report) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    let mode = fs::metadata(&report.file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    let mut last = fs::read(&report.file).unwrap();
    for i in 0..20 {
        w.append(record(i)).unwrap();
        let now = fs::read(&report.file).unwrap();
        assert!(
            now.starts_with(&last),
            "file was rewritten, not appended to"
        );
        last = now;
    }
    w.shutdown().unwrap();
    let cp_mode = fs::metadata(dir.path().join("checkpoint"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(cp_mode, 0o640);
}

#[test]
fn checkpoints_follow_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = fast(config(dir.path()));
    cfg.checkpoint_every = 10;
    let (w, _) = Writer::open(cfg, key(1)).unwrap();
    for i in 0..25 {
        w.append(record(i)).unwrap();
    }
    let cp = tollgate_audit::read_checkpoint(dir.path()).unwrap();
    assert!(cp.count >= 20 && cp.count <= 25, "{}", cp.count);
    w.shutdown().unwrap();
    let cp = tollgate_audit::read_checkpoint(dir.path()).unwrap();
    assert_eq!(cp.count, 25);
    let o = VerifyOptions {
        checkpoint: Some(cp),
        ..opts(&key(1))
    };
    assert!(verify_dir(dir.path(), &o).unwrap().0.checkpoint_matched);
}

#[test]
fn checkpoints_follow_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::at(NOON);
    let mut cfg = fast(config(dir.path()));
    cfg.clock = clock.clone();
    cfg.checkpoint_every = 0;
    cfg.checkpoint_interval = std::time::Duration::from_millis(20);
    let (w, _) = Writer::open(cfg, key(1)).unwrap();
    for i in 0..3 {
        w.append(record(i)).unwrap();
    }
    assert!(tollgate_audit::read_checkpoint(dir.path()).is_err());
    clock.set(NOON + 1_000_000_000);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let cp = loop {
        if let Ok(cp) = tollgate_audit::read_checkpoint(dir.path()) {
            break cp;
        }
        assert!(std::time::Instant::now() < deadline, "no timed checkpoint");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(cp.count, 3);
    assert_eq!(cp.time_ns, NOON + 1_000_000_000);
    w.shutdown().unwrap();
}

#[test]
fn writer_is_shareable_and_completions_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Writer>();
    send::<tollgate_audit::Pending<tollgate_audit::Appended>>();
    send::<tollgate_audit::Pending<()>>();

    let dir = tempfile::tempdir().unwrap();
    let (w, _) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    let p = w.try_submit(record(0)).unwrap();
    let a = std::thread::spawn(move || p.wait())
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(a.index, 0);
    w.shutdown().unwrap();
}

#[test]
fn the_encoder_refuses_what_the_verifier_would_call_malformed() {
    use tollgate_audit::format::{encode_record_version, EncodeError, Position};
    use tollgate_audit::{DecisionRecord, Event, KeyId, SessionEvent};
    let k = key(1);
    let kid = KeyId::of(k.verifying_key().as_bytes());
    let prev = tollgate_audit::format::genesis_hash();
    let pos = Position {
        index: 0,
        timestamp_ns: NOON,
        entry_id: uuid::Uuid::nil(),
        prev_hash: &prev,
    };
    let decision = DecisionRecord {
        timestamp_ns: NOON,
        session_id: "s".into(),
        agent_id: "a".into(),
        organization_id: "o".into(),
        call_number: 1,
        operator_id: "op".into(),
        decision: tollgate_core::HumanDecision::Awaiting,
        note: "checked the recipient".into(),
        tool_name: "t".into(),
        original_nonce: 1,
        original_args_digest: tollgate_core::Digest([0; 32]),
        successor: None,
        budget_remaining: tollgate_core::Money(0),
        session_seq: 1,
    };
    let ev = Event::Session(SessionEvent::HumanDecision(decision.clone()));
    assert!(matches!(
        encode_record_version(2, pos, &ev, &k, kid),
        Err(EncodeError::Invalid(_))
    ));
    assert!(matches!(
        encode_record_version(1, pos, &ev, &k, kid),
        Err(EncodeError::KindNotInVersion {
            kind: 6,
            version: 1
        })
    ));
    assert_eq!(
        encode_record_version(9, pos, &ev, &k, kid),
        Err(EncodeError::Version(9))
    );
    // Through the writer: refused, nothing written, the chain goes on.
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    assert!(matches!(w.append(decision), Err(WriteError::Encode(_))));
    let mut verdict = record(0);
    verdict.session_seq = 0;
    assert!(matches!(w.append(verdict), Err(WriteError::Encode(_))));
    assert_eq!(w.append(record(0)).unwrap().index, 0);
    w.shutdown().unwrap();
    assert_eq!(verify_dir(dir.path(), &opts(&key(1))).unwrap().0.entries, 1);
}
