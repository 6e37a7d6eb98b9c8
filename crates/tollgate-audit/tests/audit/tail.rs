//! The tail reader: entries from an index on, across files, compressed files and key
//! hand-overs, and every way it refuses.

use std::fs;
use std::path::Path;

use tollgate_audit::format::{self, FileHeader, HEADER_LEN};
use tollgate_audit::{read_tail, AuditEntry, BreakKind, TailEnd, TailError, Writer};

use crate::common::*;

/// A log of 60 entries over several files (all but the last compressed), with a key
/// hand-over at index 30 (key 1, then key 2). Returns the verified entries.
fn rotated_log(dir: &Path) -> (tollgate_audit::Summary, Vec<AuditEntry>) {
    let mut cfg = fast(config(dir));
    cfg.rotate_bytes = 2048;
    let (w, _) = Writer::open(cfg, key(1)).unwrap();
    for i in 0..30 {
        w.append(record(i)).unwrap();
    }
    assert_eq!(w.rotate_key(key(2)).wait().unwrap().index, 30);
    for i in 31..60 {
        w.append(record(i)).unwrap();
    }
    w.shutdown().unwrap();
    verify_dir(dir, &opts(&key(1))).unwrap()
}

/// The entries visited and the end, or the error.
fn tail(
    dir: &Path,
    from: u64,
    key: Option<&ed25519_dalek::VerifyingKey>,
) -> Result<(Vec<AuditEntry>, TailEnd), TailError> {
    let mut seen = Vec::new();
    let end = read_tail(dir, from, key, &mut |e| {
        seen.push(e.clone());
        Ok(())
    })?;
    Ok((seen, end))
}

fn first_indices(dir: &Path) -> Vec<u64> {
    log_files(dir)
        .iter()
        .map(|p| {
            let bytes = tollgate_audit::files::read_log_file(p).unwrap();
            FileHeader::decode(&bytes[..HEADER_LEN])
                .unwrap()
                .first_index
        })
        .collect()
}

#[test]
fn from_zero_the_middle_a_boundary_and_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let (summary, entries) = rotated_log(dir.path());
    let files = log_files(dir.path());
    assert!(files.len() >= 3, "{files:?}");
    assert!(files[0].to_str().unwrap().ends_with(".log.zst"));
    let end = TailEnd {
        next_index: 60,
        last_hash: summary.last_hash,
    };
    let starts = first_indices(dir.path());
    let boundary = starts[2];
    let middle = starts[1] + 1;
    assert!(middle < starts[2]);
    for from in [0, middle, boundary, 59, 60] {
        let (seen, got) = tail(dir.path(), from, None).unwrap();
        assert_eq!(got, end, "from {from}");
        assert_eq!(seen, entries[from as usize..], "from {from}");
    }
}

#[test]
fn signatures_are_checked_with_a_key_that_follows_the_handover() {
    let dir = tempfile::tempdir().unwrap();
    let (_, entries) = rotated_log(dir.path());
    let k1 = key(1).verifying_key();
    let k2 = key(2).verifying_key();
    // The key that signs entry `from`: key 1 up to the hand-over (index 30), then key 2.
    for (from, k) in [(0, &k1), (30, &k1), (31, &k2), (45, &k2), (60, &k2)] {
        let (seen, end) = tail(dir.path(), from, Some(k)).unwrap();
        assert_eq!(seen.len(), 60 - from as usize, "from {from}");
        assert_eq!(end.next_index, 60);
    }
    assert_eq!(entries[30].key_id, tollgate_audit::KeyId::of(k1.as_bytes()));
    // The wrong key for the starting entry.
    for (from, k) in [(10, &k2), (40, &k1)] {
        match tail(dir.path(), from, Some(k)) {
            Err(TailError::Break(b)) => {
                assert!(matches!(b.kind, BreakKind::UnknownKey { .. }), "{b}");
                assert_eq!(b.index, Some(from));
            }
            other => panic!("from {from}: {other:?}"),
        }
    }
}

#[test]
fn a_tampered_signature_fails_with_a_key_and_passes_structure_only() {
    // The last record's signature: the only one no later link covers.
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 10);
    let path = only_file(dir.path());
    let mut bytes = fs::read(&path).unwrap();
    let (off, len) = record_spans(&bytes)[9];
    bytes[off + len - 3] ^= 0x08;
    fs::write(&path, &bytes).unwrap();
    let k = key(1).verifying_key();
    let mut visited = Vec::new();
    let r = read_tail(dir.path(), 6, Some(&k), &mut |e| {
        visited.push(e.index);
        Ok(())
    });
    match r {
        Err(TailError::Break(b)) => {
            assert_eq!((b.index, b.kind), (Some(9), BreakKind::BadSignature));
            assert_eq!(b.offset, off as u64);
        }
        other => panic!("{other:?}"),
    }
    // Entries before the break were visited, in order.
    assert_eq!(visited, [6, 7, 8]);
    // Without a key only structure is checked: the signature is not looked at.
    let (seen, end) = tail(dir.path(), 6, None).unwrap();
    assert_eq!(seen.len(), 4);
    assert_eq!(end.next_index, 10);
    // Nor is the signature of an entry before `from`.
    assert_eq!(tail(dir.path(), 10, Some(&k)).unwrap().1.next_index, 10);
}

#[test]
fn beyond_the_end_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    rotated_log(dir.path());
    assert!(matches!(
        tail(dir.path(), 61, None),
        Err(TailError::BeyondEnd {
            from_index: 61,
            next_index: 60
        })
    ));
    assert!(matches!(
        tail(dir.path(), u64::MAX, None),
        Err(TailError::BeyondEnd { .. })
    ));
}

#[test]
fn an_empty_log_ends_at_genesis() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        tail(dir.path(), 0, None).unwrap().1,
        TailEnd {
            next_index: 0,
            last_hash: format::genesis_hash()
        }
    );
    assert!(matches!(
        tail(dir.path(), 1, None),
        Err(TailError::BeyondEnd { .. })
    ));
    // A log with a header and no record: the same.
    let (w, _) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    w.shutdown().unwrap();
    assert_eq!(tail(dir.path(), 0, None).unwrap().1.next_index, 0);
    assert_eq!(
        tail(dir.path(), 0, None).unwrap().1.last_hash,
        format::genesis_hash()
    );
}

#[test]
fn a_missing_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    rotated_log(dir.path());
    let files = log_files(dir.path());
    let starts = first_indices(dir.path());
    // A middle file gone: reading across the gap breaks.
    fs::remove_file(&files[1]).unwrap();
    match tail(dir.path(), 0, None) {
        Err(TailError::Break(b)) => {
            assert_eq!(
                b.kind,
                BreakKind::MissingFile {
                    expected: 1,
                    found: 2
                }
            );
        }
        other => panic!("{other:?}"),
    }
    // Reading from after the gap does not need it.
    assert!(tail(dir.path(), starts[2], None).is_ok());
    // The oldest file gone: its indices cannot be read.
    fs::remove_file(&files[0]).unwrap();
    assert!(matches!(
        tail(dir.path(), 0, None),
        Err(TailError::BeforeStart {
            from_index: 0,
            first_index
        }) if first_index == starts[2]
    ));
}

#[test]
fn a_torn_last_record_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 5);
    let path = only_file(dir.path());
    let bytes = fs::read(&path).unwrap();
    let (off, len) = record_spans(&bytes)[4];
    fs::write(&path, &bytes[..off + len - 1]).unwrap();
    match tail(dir.path(), 2, None) {
        Err(TailError::Break(b)) => {
            assert_eq!(b.index, Some(4));
            assert!(matches!(b.kind, BreakKind::TornRecord { .. }), "{b}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_broken_link_or_reordered_entry_before_from_is_still_an_error() {
    // Continuity is checked from the start of the file holding `from`, not only from
    // `from` itself.
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 10);
    let path = only_file(dir.path());
    let bytes = fs::read(&path).unwrap();
    let spans = record_spans(&bytes);
    let mut out = bytes[..spans[2].0].to_vec();
    out.extend_from_slice(&bytes[spans[3].0..spans[3].0 + spans[3].1]);
    out.extend_from_slice(&bytes[spans[2].0..spans[2].0 + spans[2].1]);
    out.extend_from_slice(&bytes[spans[4].0..]);
    fs::write(&path, &out).unwrap();
    match tail(dir.path(), 8, None) {
        Err(TailError::Break(b)) => assert_eq!(
            b.kind,
            BreakKind::ReorderedEntry {
                expected: 2,
                found: 3
            }
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_visitor_error_stops_the_read() {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 5);
    let mut n = 0;
    let r = read_tail(dir.path(), 0, None, &mut |e| {
        n += 1;
        if e.index == 2 {
            Err("no thanks".into())
        } else {
            Ok(())
        }
    });
    assert!(matches!(r, Err(TailError::Visit { index: 2, ref message }) if message == "no thanks"));
    assert_eq!(n, 3);
}

#[test]
fn a_corrupt_archive_is_a_break() {
    let dir = tempfile::tempdir().unwrap();
    rotated_log(dir.path());
    let files = log_files(dir.path());
    let zst = &files[0];
    let mut bytes = fs::read(zst).unwrap();
    let n = bytes.len();
    bytes.truncate(n / 2);
    fs::write(zst, &bytes).unwrap();
    match tail(dir.path(), 0, None) {
        Err(TailError::Break(b)) => {
            assert!(matches!(b.kind, BreakKind::CorruptArchive(_)), "{b}");
            assert_eq!(b.file, zst.file_name().unwrap().to_str().unwrap());
        }
        other => panic!("{other:?}"),
    }
}
