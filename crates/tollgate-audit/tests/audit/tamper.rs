//! Every kind of tampering maps to its own break, at the right entry.

use std::fs;

use tollgate_audit::format::{self, FileHeader, HeaderError, HEADER_LEN};
use tollgate_audit::{BreakKind, Checkpoint, VerifyOptions};

use crate::common::*;

/// A 10-entry log in one file; returns the tempdir and the file's bytes.
fn ten() -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 10);
    let path = only_file(dir.path());
    let bytes = fs::read(&path).unwrap();
    (dir, path, bytes)
}

#[test]
fn untouched_log_verifies() {
    let (dir, _, bytes) = ten();
    let (s, entries) = verify_dir(dir.path(), &opts(&key(1))).unwrap();
    assert_eq!(s.entries, 10);
    assert_eq!(s.next_index, 10);
    assert!(s.key_trusted);
    assert_eq!(entries.len(), 10);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.index, i as u64);
        assert_eq!(e.event, ev(record(i as u64)));
        assert_eq!(e.entry_id.get_version_num(), 7);
    }
    // The chain starts at the documented genesis value.
    assert_eq!(entries[0].prev_hash, format::genesis_hash());
    assert_eq!(
        format::genesis_hash(),
        format::sha256(b"tollgate-audit/v1 genesis")
    );
    // Each link is SHA-256 over the whole previous record.
    let spans = record_spans(&bytes);
    for w in 1..10 {
        let (off, len) = spans[w - 1];
        assert_eq!(entries[w].prev_hash, format::sha256(&bytes[off..off + len]));
    }
}

#[test]
fn flipped_signature_byte_is_a_bad_signature() {
    let (dir, path, mut bytes) = ten();
    let (off, len) = record_spans(&bytes)[3];
    bytes[off + len - 10] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (Some(3), BreakKind::BadSignature)
    );
}

#[test]
fn flipped_field_byte_is_a_bad_signature() {
    let (dir, path, mut bytes) = ten();
    let (off, len) = record_spans(&bytes)[3];
    // Change the tool name `tool_3` to `tool_4`: still a well-formed record.
    let rec = &bytes[off..off + len];
    let pos = rec.windows(6).position(|w| w == b"tool_3").unwrap();
    bytes[off + pos + 5] = b'4';
    fs::write(&path, &bytes).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (Some(3), BreakKind::BadSignature)
    );
}

#[test]
fn flipped_length_prefix_is_a_bad_length() {
    let (dir, path, mut bytes) = ten();
    let (off, len) = record_spans(&bytes)[3];
    bytes[off + 3] ^= 0x04;
    fs::write(&path, &bytes).unwrap();
    let (index, kind) = break_of(dir.path(), &opts(&key(1)));
    assert_eq!(index, Some(3));
    match kind {
        BreakKind::BadLength { declared, actual } => {
            assert_eq!(actual, Some(len - 4));
            assert_eq!(declared as usize, (len - 4) ^ 0x04);
        }
        other => panic!("{other:?}"),
    }
    // A high byte flipped too: a prefix over the limit is too large, wherever the file
    // ends (not a huge allocation, not a panic).
    let mut bytes = fs::read(&path).unwrap();
    bytes[off + 3] ^= 0x04;
    bytes[off] ^= 0x80;
    fs::write(&path, &bytes).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (Some(3), BreakKind::TooLarge(0x8000_0000 + len as u64))
    );
}

#[test]
fn deleted_entry_is_a_missing_entry() {
    let (dir, path, bytes) = ten();
    let (off, len) = record_spans(&bytes)[4];
    let mut cut = bytes[..off].to_vec();
    cut.extend_from_slice(&bytes[off + len..]);
    fs::write(&path, &cut).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (
            Some(4),
            BreakKind::MissingEntry {
                expected: 4,
                found: 5
            }
        )
    );
}

#[test]
fn deleted_entry_cannot_be_relinked_without_the_key() {
    // The attack the spec's "fields 1-13" signature allows: delete entry 4, rewrite
    // entry 5's previous hash to entry 3's hash. Our signature covers the link.
    let (dir, path, bytes) = ten();
    let spans = record_spans(&bytes);
    let (off3, len3) = spans[3];
    let (off4, len4) = spans[4];
    let h3 = format::sha256(&bytes[off3..off3 + len3]);
    let mut cut = bytes[..off4].to_vec();
    let mut rec5 = bytes[off4 + len4..spans[5].0 + spans[5].1].to_vec();
    let n = rec5.len();
    rec5[n - 96..n - 64].copy_from_slice(&h3.0);
    cut.extend_from_slice(&rec5);
    cut.extend_from_slice(&bytes[spans[5].0 + spans[5].1..]);
    fs::write(&path, &cut).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (Some(4), BreakKind::BadSignature)
    );
}

#[test]
fn swapped_entries_are_reordered() {
    let (dir, path, bytes) = ten();
    let spans = record_spans(&bytes);
    let (o5, l5) = spans[5];
    let (o6, l6) = spans[6];
    let mut out = bytes[..o5].to_vec();
    out.extend_from_slice(&bytes[o6..o6 + l6]);
    out.extend_from_slice(&bytes[o5..o5 + l5]);
    out.extend_from_slice(&bytes[o6 + l6..]);
    fs::write(&path, &out).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (
            Some(5),
            BreakKind::ReorderedEntry {
                expected: 5,
                found: 6
            }
        )
    );
}

#[test]
fn tail_truncated_mid_record_is_torn() {
    let (dir, path, bytes) = ten();
    let (off, len) = record_spans(&bytes)[9];
    fs::write(&path, &bytes[..off + len / 2]).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (
            Some(9),
            BreakKind::TornRecord {
                available: len / 2,
                needed: Some(len as u64)
            }
        )
    );
    // Cut inside the length prefix itself.
    fs::write(&path, &bytes[..off + 2]).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (
            Some(9),
            BreakKind::TornRecord {
                available: 2,
                needed: None
            }
        )
    );
}

#[test]
fn different_key_is_unknown_key() {
    let (dir, _, _) = ten();
    let (index, kind) = break_of(dir.path(), &opts(&key(2)));
    assert_eq!(index, None);
    assert!(
        matches!(kind, BreakKind::UnknownKey { expected, found }
            if expected == tollgate_audit::KeyId::of(key(2).verifying_key().as_bytes())
            && found == tollgate_audit::KeyId::of(key(1).verifying_key().as_bytes())),
        "{kind:?}"
    );
}

#[test]
fn a_log_forged_with_another_key_is_unknown_key() {
    // The attacker rewrites the whole file with their own key: self-consistent, but not
    // the key the auditor trusts.
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(9), 5);
    assert!(matches!(
        break_of(dir.path(), &opts(&key(1))).1,
        BreakKind::UnknownKey { .. }
    ));
    // Without a trusted key the forged log is self-consistent: that is why --key matters.
    let (s, _) = verify_dir(dir.path(), &VerifyOptions::default()).unwrap();
    assert!(!s.key_trusted);
}

#[test]
fn entry_spliced_from_another_log_is_unknown_key() {
    let (dir, path, bytes) = ten();
    let other = tempfile::tempdir().unwrap();
    write_log(fast(config(other.path())), &key(2), 10);
    let ob = fs::read(only_file(other.path())).unwrap();
    let (o, l) = record_spans(&ob)[7];
    let (so, _) = record_spans(&bytes)[7];
    let mut out = bytes[..so].to_vec();
    out.extend_from_slice(&ob[o..o + l]);
    fs::write(&path, &out).unwrap();
    assert!(matches!(
        break_of(dir.path(), &opts(&key(1))),
        (Some(7), BreakKind::UnknownKey { .. })
    ));
}

#[test]
fn flipped_header_byte_is_a_bad_header() {
    let (dir, path, mut bytes) = ten();
    bytes[20] ^= 0x01; // first_index
    fs::write(&path, &bytes).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (None, BreakKind::BadHeader(HeaderError::Signature))
    );
    bytes[20] ^= 0x01;
    bytes[0] = b'X';
    fs::write(&path, &bytes).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (None, BreakKind::BadHeader(HeaderError::Magic))
    );
    bytes[0] = b'T';
    fs::write(&path, &bytes[..100]).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))).1,
        BreakKind::BadHeader(HeaderError::Short(100))
    );
}

#[test]
fn header_decodes_to_what_was_written() {
    let (_, _, bytes) = ten();
    let h = FileHeader::decode(&bytes[..HEADER_LEN]).unwrap();
    assert_eq!(h.file_seq, 0);
    assert_eq!(h.first_index, 0);
    assert_eq!(h.prev_hash, format::genesis_hash());
    assert_eq!(h.public_key, key(1).verifying_key().to_bytes());
    assert_eq!(h.created_ns, NOON);
}

#[test]
fn clean_cut_tail_is_caught_only_by_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = tollgate_audit::Writer::open(fast(config(dir.path())), key(1)).unwrap();
    for i in 0..8 {
        w.append(record(i)).unwrap();
    }
    let cp = w.checkpoint().wait().unwrap();
    assert_eq!(cp.count, 8);
    w.shutdown().unwrap();
    let path = only_file(dir.path());
    let bytes = fs::read(&path).unwrap();
    let (off, _) = record_spans(&bytes)[6];
    fs::write(&path, &bytes[..off]).unwrap();
    // Whole records only: without a checkpoint the shorter log looks whole.
    verify_dir(dir.path(), &opts(&key(1))).unwrap();
    let with_cp = VerifyOptions {
        checkpoint: Some(cp.clone()),
        ..opts(&key(1))
    };
    assert_eq!(
        break_of(dir.path(), &with_cp),
        (
            Some(6),
            BreakKind::TruncatedBelowCheckpoint {
                checkpoint: 8,
                entries: 6
            }
        )
    );
    // A forged checkpoint (count changed) does not verify.
    let forged = Checkpoint {
        count: 3,
        ..cp.clone()
    };
    let o = VerifyOptions {
        checkpoint: Some(forged),
        ..opts(&key(1))
    };
    assert_eq!(break_of(dir.path(), &o).1, BreakKind::BadCheckpoint);
    // A checkpoint whose hash is another log's: mismatch at its index.
    let other = Checkpoint::new_signed(&key(1), 4, format::sha256(b"other"), NOON);
    let o = VerifyOptions {
        checkpoint: Some(other),
        ..opts(&key(1))
    };
    assert_eq!(
        break_of(dir.path(), &o),
        (Some(3), BreakKind::CheckpointMismatch { index: 3 })
    );
}

#[test]
fn checkpoint_on_a_whole_log_matches() {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 12);
    // The final checkpoint written at shutdown counts every entry.
    let cp = tollgate_audit::read_checkpoint(dir.path()).unwrap();
    assert_eq!(cp.count, 12);
    assert!(cp.verify_with(&key(1).verifying_key()));
    let o = VerifyOptions {
        checkpoint: Some(cp),
        ..opts(&key(1))
    };
    let (s, _) = verify_dir(dir.path(), &o).unwrap();
    assert!(s.checkpoint_matched);
}

#[test]
fn parallel_signature_checks_report_the_first_break_in_order() {
    // 700 entries with a key hand-over in the middle: windows large enough to be checked
    // on several threads.
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = tollgate_audit::Writer::open(fast(config(dir.path())), key(1)).unwrap();
    let pending: Vec<_> = (0..350).map(|i| w.submit(record(i))).collect();
    for p in pending {
        p.wait().unwrap();
    }
    w.rotate_key(key(2)).wait().unwrap();
    let pending: Vec<_> = (351..700).map(|i| w.submit(record(i))).collect();
    for p in pending {
        p.wait().unwrap();
    }
    w.shutdown().unwrap();
    let (s, _) = verify_dir(dir.path(), &opts(&key(1))).unwrap();
    assert_eq!(s.entries, 700);
    let path = only_file(dir.path());
    let clean = fs::read(&path).unwrap();
    let spans = record_spans(&clean);
    // Two tampered records: the earlier one is reported, wherever the threads split.
    for (first, second) in [(600, 650), (100, 500), (351, 352)] {
        let mut bytes = clean.clone();
        for i in [second, first] {
            let (off, len) = spans[i];
            bytes[off + len - 2] ^= 0x40;
        }
        fs::write(&path, &bytes).unwrap();
        assert_eq!(
            break_of(dir.path(), &opts(&key(1))),
            (Some(first as u64), BreakKind::BadSignature)
        );
    }
}
