//! The writer refuses entries after a failure (a full disk), then recovers by itself once
//! the cause is gone, without losing or duplicating an acknowledged entry: on a real tmpfs
//! mounted for the test. And when its file was cut or edited meanwhile, it refuses for
//! good (fail-stop).

use std::path::Path;
use std::time::{Duration, Instant};

use tollgate_audit::{Event, FsyncPolicy, Health, WriteError, Writer, WriterConfig};

use crate::common::{config, key, log_files, opts, record, verify_dir, Tmpfs};

fn writer_on(dir: &Path, fsync: FsyncPolicy) -> Writer {
    let mut cfg: WriterConfig = config(dir);
    cfg.fsync = fsync;
    cfg.rotate_bytes = 48 * 1024;
    cfg.heal_interval = Some(Duration::from_millis(20));
    Writer::open(cfg, key(1)).unwrap().0
}

fn wait_for(w: &Writer, what: &str, ok: impl Fn(&Health) -> bool) -> Health {
    let t = Instant::now();
    loop {
        let h = w.health();
        if ok(&h) {
            return h;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{what}: {h:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Append until the disk refuses; the entries acknowledged, and the error.
fn append_until_refused(
    w: &Writer,
    from: u64,
) -> (Vec<(u64, tollgate_audit::Appended)>, WriteError) {
    let mut acked = Vec::new();
    for i in from..from + 1_000_000 {
        match w.append(record(i)) {
            Ok(a) => acked.push((i, a)),
            Err(e) => return (acked, e),
        }
    }
    panic!("the disk never filled");
}

#[test]
fn a_full_disk_is_refused_then_recovered_with_every_acknowledged_entry() {
    for fsync in [FsyncPolicy::Batch, FsyncPolicy::Always, FsyncPolicy::Never] {
        let Some(fs) = Tmpfs::mount(1024) else { return };
        let dir = fs.path().join("audit");
        let w = writer_on(&dir, fsync);
        fs.fill(&fs.path().join("filler"), 160 * 1024);

        let (mut acked, e) = append_until_refused(&w, 0);
        assert!(!acked.is_empty(), "{fsync:?}");
        assert!(
            matches!(e, WriteError::Io(_) | WriteError::Failed(_)),
            "{e}"
        );
        let failed = w.health();
        assert!(failed.failure.is_some() && !failed.permanent, "{failed:?}");
        // Refused while the disk stays full: at once, and nothing is written.
        for i in 0..5 {
            assert!(w.append(record(900_000 + i)).is_err(), "{fsync:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            w.health().failure.is_some(),
            "recovered with the disk still full"
        );

        std::fs::remove_file(fs.path().join("filler")).unwrap();
        let healed = wait_for(&w, "recovery", |h| h.failure.is_none());
        assert_eq!(healed.generation, 1);
        let next = acked.last().unwrap().0 + 1;
        for i in next..next + 200 {
            acked.push((i, w.append(record(i)).unwrap()));
        }
        w.shutdown().unwrap();

        // The log is whole, and holds exactly the acknowledged entries, each where its
        // acknowledgement said, plus the recoveries that recorded the cuts.
        let (_, entries) = verify_dir(&dir, &opts(&key(1))).unwrap();
        let sessions: Vec<_> = entries
            .iter()
            .filter(|e| matches!(e.event, Event::Session(_)))
            .collect();
        assert_eq!(sessions.len(), acked.len(), "{fsync:?}");
        for (e, (i, a)) in sessions.iter().zip(&acked) {
            assert_eq!((e.index, e.entry_id), (a.index, a.entry_id), "{fsync:?}");
            assert_eq!(e.event, Event::Session(record(*i).into()), "{fsync:?}");
        }
        let cuts = entries
            .iter()
            .filter(|e| matches!(e.event, Event::Recovery { .. }))
            .count();
        let torn = std::fs::read_dir(dir.join("torn"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(cuts, torn, "every cut is in torn/ and recorded ({fsync:?})");
        eprintln!("{fsync:?}: {} acknowledged, {cuts} cut(s)", acked.len());
    }
}

#[test]
fn a_log_cut_while_the_writer_is_failed_is_not_continued() {
    let Some(fs) = Tmpfs::mount(1024) else { return };
    let dir = fs.path().join("audit");
    let w = writer_on(&dir, FsyncPolicy::Batch);
    fs.fill(&fs.path().join("filler"), 96 * 1024);
    let (acked, _) = append_until_refused(&w, 0);
    assert!(acked.len() > 10);
    // Someone cuts the current file below what was acknowledged, then frees the disk.
    let last = log_files(&dir).pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len - 500)
        .unwrap();
    std::fs::remove_file(fs.path().join("filler")).unwrap();
    let h = wait_for(&w, "a permanent refusal", |h| h.permanent);
    assert!(h.failure.unwrap().contains("cut while the writer ran"));
    assert!(matches!(
        w.append(record(999_999)),
        Err(WriteError::Failed(_))
    ));
    let _ = w.shutdown();
}

#[test]
fn a_log_edited_while_the_writer_is_failed_is_not_continued() {
    let Some(fs) = Tmpfs::mount(1024) else { return };
    let dir = fs.path().join("audit");
    let w = writer_on(&dir, FsyncPolicy::Batch);
    fs.fill(&fs.path().join("filler"), 96 * 1024);
    let (acked, _) = append_until_refused(&w, 0);
    assert!(acked.len() > 10);
    // A byte of an acknowledged entry is changed in place.
    let last = log_files(&dir).pop().unwrap();
    let mut bytes = std::fs::read(&last).unwrap();
    let at = tollgate_audit::format::HEADER_LEN + 60;
    bytes[at] ^= 0x01;
    std::fs::write(&last, &bytes[..]).unwrap();
    std::fs::remove_file(fs.path().join("filler")).unwrap();
    let h = wait_for(&w, "a permanent refusal", |h| h.permanent);
    assert!(h
        .failure
        .unwrap()
        .contains("no longer reads as the writer wrote it"));
    let _ = w.shutdown();
}
