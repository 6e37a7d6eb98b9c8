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

// One test per malformed rule of format version 2 (docs/audit-format.md, "Malformed").
// Each starts from a valid, signed record (raw::baselines_verify) and changes one value.

mod malformed {
    use tollgate_audit::format;
    use tollgate_core::Digest;

    use crate::raw::{self, assert_malformed, d, encode, s, P};

    fn with(mut parts: Vec<P>, i: usize, p: P) -> Vec<P> {
        parts[i] = p;
        parts
    }

    #[test]
    fn the_baselines_verify() {
        raw::baselines_verify();
    }

    #[test]
    fn text_over_16384_bytes() {
        let big = "x".repeat(16_385);
        let mut parts = raw::opened(&big);
        parts[6] = d(format::sha256(big.as_bytes()));
        assert_malformed(4, &parts, "text longer than 16384 bytes");
        // 16384 is allowed.
        let ok = "x".repeat(16_384);
        let bytes = raw::file(2, &[(4, encode(&raw::opened(&ok)))]);
        assert_eq!(raw::check(&bytes).unwrap(), 1);
    }

    #[test]
    fn text_not_utf8() {
        let bad = vec![b'{', 0xff, b'}'];
        let parts = with(
            with(raw::opened("{}"), 7, P::Text(bad.clone())),
            6,
            d(format::sha256(&bad)),
        );
        assert_malformed(4, &parts, "text is not UTF-8");
    }

    #[test]
    fn budget_scope_outside_1_to_3() {
        for scope in [0, 4, 255] {
            assert_malformed(
                4,
                &with(raw::opened("{}"), 3, P::U8(scope)),
                "unknown budget_scope code",
            );
        }
    }

    #[test]
    fn config_digest_not_the_sha256_of_config() {
        assert_malformed(
            4,
            &with(raw::opened("{}"), 6, d(Digest([0; 32]))),
            "config_digest is not the SHA-256 of config",
        );
    }

    #[test]
    fn session_opened_with_session_seq_other_than_1() {
        for seq in [0, 2] {
            assert_malformed(
                4,
                &with(raw::opened("{}"), 8, P::U64(seq)),
                "session_seq of a session-opened entry is not 1",
            );
        }
    }

    #[test]
    fn session_seq_0_on_a_verdict_settlement_or_decision() {
        let v = raw::verdict(2);
        let last = v.len() - 1;
        assert_malformed(1, &with(v, last, P::U64(0)), "session_seq is 0");
        assert_malformed(
            5,
            &with(raw::settlement(), 14, P::U64(0)),
            "session_seq is 0",
        );
        assert_malformed(6, &with(raw::decision(), 15, P::U64(0)), "session_seq is 0");
    }

    #[test]
    fn settlement_flag_other_than_0_or_1() {
        for (i, what) in [
            (4, "bad success flag"),
            (9, "bad reserved flag"),
            (13, "bad error_signal flag"),
        ] {
            assert_malformed(5, &with(raw::settlement(), i, P::U8(2)), what);
        }
    }

    #[test]
    fn cost_status_outside_0_to_2() {
        assert_malformed(
            5,
            &with(raw::settlement(), 6, P::U8(3)),
            "unknown cost_status code",
        );
    }

    #[test]
    fn actual_cost_not_0_when_the_cost_was_not_readable() {
        for status in [1, 2] {
            assert_malformed(
                5,
                &with(raw::settlement(), 6, P::U8(status)),
                "actual_cost is not 0 though the cost was not readable",
            );
            // With actual_cost 0 the same status is fine.
            let parts = with(with(raw::settlement(), 6, P::U8(status)), 7, P::I64(0));
            let bytes = raw::file(2, &[(5, encode(&parts))]);
            assert_eq!(raw::check(&bytes).unwrap(), 1);
        }
    }

    #[test]
    fn estimated_cost_not_0_without_a_reservation() {
        assert_malformed(
            5,
            &with(raw::settlement(), 9, P::U8(0)),
            "estimated_cost is not 0 though nothing was reserved",
        );
    }

    #[test]
    fn decision_word_not_one_of_the_six() {
        for word in ["", "Approve", "approved", "awaiting", "maybe", "expired"] {
            assert_malformed(
                6,
                &with(raw::decision(), 5, s(word)),
                "decision is not approve, reject, modify, defer, escalate or expire",
            );
        }
    }

    #[test]
    fn successor_present_exactly_for_modify() {
        let none = |parts: Vec<P>| -> Vec<P> {
            let mut p = parts;
            p.splice(10..14, [P::U8(0), P::U8(0)]);
            p
        };
        // approve with a successor
        assert_malformed(
            6,
            &with(raw::decision(), 5, s("approve")),
            "successor present without modify, or modify without successor",
        );
        // modify without one
        assert_malformed(
            6,
            &none(raw::decision()),
            "successor present without modify, or modify without successor",
        );
        // only one half present
        let mut half = raw::decision();
        half.splice(12..14, [P::U8(0)]);
        assert_malformed(
            6,
            &half,
            "only one of successor_nonce and successor_args_digest present",
        );
        // approve without a successor is fine
        let ok = none(with(raw::decision(), 5, s("approve")));
        assert_eq!(raw::check(&raw::file(2, &[(6, encode(&ok))])).unwrap(), 1);
    }

    #[test]
    fn successor_presence_flag_other_than_0_or_1() {
        assert_malformed(
            6,
            &with(raw::decision(), 10, P::U8(2)),
            "bad successor_nonce presence flag",
        );
        assert_malformed(
            6,
            &with(raw::decision(), 12, P::U8(7)),
            "bad successor_args_digest presence flag",
        );
    }

    #[test]
    fn operator_on_a_verdict_that_releases_nothing() {
        let mut v = raw::verdict(2);
        v.splice(12..13, [P::U8(1), s("alice")]);
        assert_malformed(
            1,
            &v,
            "operator_id on a verdict that releases no human-approved call",
        );
        // On a release it is allowed, and so is its absence.
        v[8] = s("hitl_transition:approve");
        assert_eq!(raw::check(&raw::file(2, &[(1, encode(&v))])).unwrap(), 1);
        let mut w = raw::verdict(2);
        w[8] = s("hitl_transition:modify_successor");
        assert_eq!(raw::check(&raw::file(2, &[(1, encode(&w))])).unwrap(), 1);
        // Version 1 had no such rule.
        let mut v1 = raw::verdict(1);
        v1.splice(12..13, [P::U8(1), s("alice")]);
        assert_eq!(raw::check(&raw::file(1, &[(1, encode(&v1))])).unwrap(), 1);
    }

    #[test]
    fn kinds_4_to_6_in_a_version_1_file() {
        for (kind, parts) in [
            (4, raw::opened("{}")),
            (5, raw::settlement()),
            (6, raw::decision()),
        ] {
            let bytes = raw::file(1, &[(kind, encode(&parts))]);
            assert_eq!(
                raw::kind_of(&bytes),
                tollgate_audit::BreakKind::Malformed(
                    "record kind 4, 5 or 6 in a format-version-1 file"
                )
            );
        }
        let bytes = raw::file(2, &[(7, encode(&raw::settlement()))]);
        assert_eq!(
            raw::kind_of(&bytes),
            tollgate_audit::BreakKind::Malformed("unknown record kind")
        );
    }

    #[test]
    fn handover_to_a_small_order_key() {
        // The identity point (y = 1) decompresses but has order 1: strict verification
        // would refuse every later signature. The hand-over itself is malformed.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert_malformed(
            2,
            &[P::Bytes(identity.to_vec())],
            "hand-over names an invalid public key",
        );
    }
}

/// Verification of a log of key 1 against `cp`: checking every signature, and anchored on
/// the checkpoint.
fn full_and_anchored(cp: Checkpoint) -> (VerifyOptions, VerifyOptions) {
    let full = VerifyOptions {
        checkpoint: Some(cp),
        ..opts(&key(1))
    };
    let anchored = VerifyOptions {
        anchor_on_checkpoint: true,
        ..full.clone()
    };
    (full, anchored)
}

/// The break verifying `dir` with `o` names (file, entry, offset, kind), or `None`.
fn named(
    dir: &std::path::Path,
    o: &VerifyOptions,
) -> Option<(String, Option<u64>, u64, BreakKind)> {
    match verify_dir(dir, o) {
        Err(tollgate_audit::PathsError::Break(b)) => Some((b.file, b.index, b.offset, b.kind)),
        Err(e) => panic!("io error {e}"),
        Ok(_) => None,
    }
}

/// Anchoring on a checkpoint (`anchor_on_checkpoint`, for bulk readers such as `tollgate
/// policy replay`): for every byte changed anywhere in a log whose checkpoint counts its
/// first 10 entries (a key hand-over among them) but not its last 4, the anchored
/// verification refuses the log exactly when the full one does, and names the same first
/// break (the same entry, the same kind: an entry changed below the anchor is first seen
/// at the next entry's link, and traced back to it); untouched, both verify.
#[test]
fn a_checkpoint_anchor_catches_every_change_full_verification_catches() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = tollgate_audit::Writer::open(fast(config(dir.path())), key(1)).unwrap();
    for i in 0..5 {
        w.append(record(i)).unwrap();
    }
    w.rotate_key(key(2)).wait().unwrap();
    for i in 5..9 {
        w.append(record(i)).unwrap();
    }
    let cp = w.checkpoint().wait().unwrap();
    assert_eq!(cp.count, 10);
    for i in 9..13 {
        w.append(record(i)).unwrap();
    }
    w.shutdown().unwrap();
    let path = only_file(dir.path());
    let bytes = fs::read(&path).unwrap();
    let (full, anchored) = full_and_anchored(cp);
    let (s, entries) = verify_dir(dir.path(), &anchored).unwrap();
    assert!(s.checkpoint_matched);
    assert_eq!(entries.len(), 14);
    verify_dir(dir.path(), &full).unwrap();
    let mut caught = 0;
    for pos in HEADER_LEN..bytes.len() {
        let mut b = bytes.clone();
        b[pos] ^= 0x20;
        fs::write(&path, &b).unwrap();
        let (f, a) = (named(dir.path(), &full), named(dir.path(), &anchored));
        assert_eq!(a, f, "byte {pos}: anchored (left) and full (right) differ");
        caught += usize::from(f.is_some());
    }
    // Every byte of a record is covered by its signature or by the chain.
    assert_eq!(caught, bytes.len() - HEADER_LEN);
    fs::write(&path, &bytes).unwrap();
    verify_dir(dir.path(), &anchored).unwrap();
}

/// The same over several files: a log rotated every few entries, its checkpoint counting
/// all but the last entries. Every byte of every file changed in turn is refused anchored
/// exactly when in full, with the same break named (the last record of a file changed is
/// first seen at the next file's header when anchored). A rotated file is compressed: a
/// changed byte is refused unless the file still decompresses to exactly the same log (a
/// bit zstd does not read, such as padding: nothing the log says has changed).
#[test]
fn a_checkpoint_anchor_names_the_full_break_across_files() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tollgate_audit::WriterConfig {
        rotate_bytes: 600,
        ..fast(config(dir.path()))
    };
    let (w, _) = tollgate_audit::Writer::open(cfg, key(1)).unwrap();
    for i in 0..8 {
        w.append(record(i)).unwrap();
    }
    let cp = w.checkpoint().wait().unwrap();
    for i in 8..10 {
        w.append(record(i)).unwrap();
    }
    w.shutdown().unwrap();
    let mut files: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("audit-"))
        })
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    let (full, anchored) = full_and_anchored(cp);
    verify_dir(dir.path(), &anchored).unwrap();
    let mut unread = 0;
    for path in &files {
        let bytes = fs::read(path).unwrap();
        let compressed = path.extension().is_some_and(|e| e == "zst");
        let plain = compressed.then(|| zstd::stream::decode_all(bytes.as_slice()).unwrap());
        for pos in HEADER_LEN..bytes.len() {
            let mut b = bytes.clone();
            b[pos] ^= 0x20;
            fs::write(path, &b).unwrap();
            let (f, a) = (named(dir.path(), &full), named(dir.path(), &anchored));
            let same_log = plain
                .as_ref()
                .is_some_and(|p| zstd::stream::decode_all(b.as_slice()).is_ok_and(|d| d == *p));
            if same_log {
                unread += 1;
            } else {
                assert!(f.is_some(), "{path:?} byte {pos}: not refused");
            }
            assert_eq!(
                a, f,
                "{path:?} byte {pos}: anchored (left) and full (right) differ"
            );
        }
        fs::write(path, &bytes).unwrap();
    }
    // Bits zstd does not read are rare: almost every byte is covered.
    let total: usize = files
        .iter()
        .map(|p| (fs::metadata(p).unwrap().len() as usize).saturating_sub(HEADER_LEN))
        .sum();
    assert!(unread * 100 < total, "{unread} of {total} bytes not read");
}

/// The attack anchoring must not admit: the writer's own header, then entries signed by an
/// attacker's key but naming the writer's, a key hand-over to the attacker's key among
/// them, and a checkpoint the attacker signs over all of it. The links are consistent and
/// the checkpoint verifies under the key the hand-over names, so only the hand-over's own
/// signature (checked even below the anchor) refuses it.
#[test]
fn an_anchor_does_not_admit_a_forged_key_hand_over() {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 1);
    let path = only_file(dir.path());
    let header = fs::read(&path).unwrap()[..HEADER_LEN].to_vec();
    let version = FileHeader::decode(&header).unwrap().version;
    let (writer_id, attacker) = (
        tollgate_audit::KeyId::of(key(1).verifying_key().as_bytes()),
        key(9),
    );
    let attacker_id = tollgate_audit::KeyId::of(attacker.verifying_key().as_bytes());
    let mut bytes = header;
    let mut prev = format::genesis_hash();
    let events = [
        (ev(record(0)), writer_id),
        (
            tollgate_audit::Event::KeyHandover {
                new_public_key: attacker.verifying_key().to_bytes(),
            },
            writer_id,
        ),
        (ev(record(1)), attacker_id),
        (ev(record(2)), attacker_id),
    ];
    for (i, (event, id)) in events.iter().enumerate() {
        let pos = format::Position {
            index: i as u64,
            timestamp_ns: NOON + i as i64,
            entry_id: uuid::Uuid::from_u128(i as u128 + 1),
            prev_hash: &prev,
        };
        let raw = format::encode_record_version(version, pos, event, &attacker, *id).unwrap();
        prev = format::sha256(&raw);
        bytes.extend_from_slice(&raw);
    }
    fs::write(&path, &bytes).unwrap();
    let forged = Checkpoint::new_signed(&attacker, 4, prev, NOON + 10);
    let full = VerifyOptions {
        checkpoint: Some(forged),
        ..opts(&key(1))
    };
    assert_eq!(
        break_of(dir.path(), &full),
        (Some(0), BreakKind::BadSignature)
    );
    let anchored = VerifyOptions {
        anchor_on_checkpoint: true,
        ..full
    };
    // Refused anchored too (by the hand-over's own signature, checked even below the
    // anchor), and named as in full.
    assert_eq!(
        break_of(dir.path(), &anchored),
        (Some(0), BreakKind::BadSignature)
    );
}
