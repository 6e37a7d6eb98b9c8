//! The writer's tap: every entry once durable, in chain order, before its completion.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tollgate_audit::{Committed, Event, FsyncPolicy, Writer};

use crate::common::*;

/// A tap that keeps what it is given, and how many calls it got.
fn collecting() -> (tollgate_audit::Tap, Arc<Mutex<Vec<Vec<Committed>>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    (Box::new(move |batch| s.lock().unwrap().push(batch)), seen)
}

#[test]
fn tap_sees_every_entry_in_order_across_batches_rotation_and_a_handover() {
    for policy in [FsyncPolicy::Always, FsyncPolicy::Batch, FsyncPolicy::Never] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.fsync = policy;
        cfg.rotate_bytes = 4096;
        let (tap, seen) = collecting();
        let (w, _) = Writer::open_with_tap(cfg, key(1), tap).unwrap();
        let w = Arc::new(w);
        let submit_from_threads = |base: u64| {
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let w = w.clone();
                    std::thread::spawn(move || {
                        let pending: Vec<_> = (0..25u64)
                            .map(|i| w.submit(record(base + t * 100 + i)))
                            .collect();
                        for p in pending {
                            p.wait().unwrap();
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        };
        submit_from_threads(0);
        let handover = w.rotate_key(key(2)).wait().unwrap();
        submit_from_threads(1000);
        w.shutdown().unwrap();

        let (summary, entries) = verify_dir(dir.path(), &opts(&key(1))).unwrap();
        assert_eq!(summary.entries, 201, "{policy:?}");
        assert!(
            log_files(dir.path()).len() > 1,
            "no rotation under {policy:?}"
        );
        let batches = seen.lock().unwrap();
        let tapped: Vec<&Committed> = batches.iter().flatten().collect();
        // Exactly the log, in order: no entry skipped or repeated.
        assert_eq!(tapped.len(), entries.len(), "{policy:?}");
        for (i, (c, e)) in tapped.iter().zip(&entries).enumerate() {
            assert_eq!(c.index, i as u64, "{policy:?}");
            assert_eq!(c.event, e.event, "{policy:?}");
            let next_prev = entries
                .get(i + 1)
                .map_or(summary.last_hash, |n| n.prev_hash);
            assert_eq!(c.hash, next_prev, "{policy:?}");
        }
        assert!(matches!(
            tapped[handover.index as usize].event,
            Event::KeyHandover { .. }
        ));
        // Group commit shows in the tap too: some calls carry several entries.
        if policy != FsyncPolicy::Always {
            assert!(
                batches.len() < tapped.len(),
                "{policy:?}: one call per entry"
            );
        }
    }
}

#[test]
fn a_completion_never_fires_before_its_tap_call() {
    for policy in [FsyncPolicy::Always, FsyncPolicy::Batch, FsyncPolicy::Never] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.fsync = policy;
        cfg.rotate_bytes = 4096;
        // How many entries the tap has been given so far (indices are contiguous).
        let tapped = Arc::new(AtomicU64::new(0));
        let t = tapped.clone();
        let tap: tollgate_audit::Tap = Box::new(move |batch| {
            for c in batch {
                assert_eq!(c.index, t.load(Ordering::SeqCst), "out of order");
                t.store(c.index + 1, Ordering::SeqCst);
            }
        });
        let (w, _) = Writer::open_with_tap(cfg, key(1), tap).unwrap();
        let w = Arc::new(w);
        let threads: Vec<_> = (0..8u64)
            .map(|th| {
                let w = w.clone();
                let tapped = tapped.clone();
                std::thread::spawn(move || {
                    for i in 0..40u64 {
                        let a = w.append(record(th * 100 + i)).unwrap();
                        assert!(
                            tapped.load(Ordering::SeqCst) > a.index,
                            "entry {} completed before it was tapped",
                            a.index
                        );
                    }
                })
            })
            .collect();
        let h = w.rotate_key(key(2)).wait().unwrap();
        assert!(tapped.load(Ordering::SeqCst) > h.index, "{policy:?}");
        for t in threads {
            t.join().unwrap();
        }
        w.flush().wait().unwrap();
        assert_eq!(tapped.load(Ordering::SeqCst), 321, "{policy:?}");
        w.shutdown().unwrap();
    }
}

#[test]
fn entries_already_in_the_log_at_open_are_not_tapped() {
    // A torn tail: open writes a recovery entry, which the caller reads with read_tail.
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 3);
    let path = only_file(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0, 0, 1]);
    std::fs::write(&path, &bytes).unwrap();
    let (tap, seen) = collecting();
    let (w, report) = Writer::open_with_tap(fast(config(dir.path())), key(1), tap).unwrap();
    assert_eq!(report.recovered.as_ref().map(|r| r.entry_index), Some(3));
    w.append(record(4)).unwrap();
    w.shutdown().unwrap();
    let tapped: Vec<u64> = seen
        .lock()
        .unwrap()
        .iter()
        .flatten()
        .map(|c| c.index)
        .collect();
    assert_eq!(tapped, [4]);
}
