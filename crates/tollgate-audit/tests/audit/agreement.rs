//! Points where docs/audit-format.md and the code could be read two ways, each pinned:
//! the checkpoint key after a hand-over, which error an impossible length prefix is, a
//! zero-filled tail, a corrupt archive, the file a truncation names, version upgrades
//! and downgrades, and the bounded checkpoint reader.

use std::fs;

use tollgate_audit::format::{self, FileHeader, HeaderError, HEADER_LEN};
use tollgate_audit::{
    read_checkpoint, verify_paths, BreakKind, Checkpoint, PathsError, ReadCheckpointError,
    VerifyOptions, Writer,
};

use crate::common::*;
use crate::raw::{self, encode};

#[test]
fn a_checkpoint_right_after_a_handover_is_signed_by_the_new_key() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    w.append(record(0)).unwrap();
    let h = w.rotate_key(key(2)).wait().unwrap();
    let cp = w.checkpoint().wait().unwrap();
    w.shutdown().unwrap();
    // The writer signs with the key current after the checkpoint's last entry.
    assert_eq!(cp.count, h.index + 1);
    assert!(cp.verify_with(&key(2).verifying_key()));
    let with = |cp: Checkpoint| VerifyOptions {
        checkpoint: Some(cp),
        ..opts(&key(1))
    };
    let (s, _) = verify_dir(dir.path(), &with(cp.clone())).unwrap();
    assert!(s.checkpoint_matched);
    // The same statement signed by the old key is not accepted.
    let by_old = Checkpoint::new_signed(&key(1), cp.count, cp.last_hash, cp.time_ns);
    assert_eq!(
        break_of(dir.path(), &with(by_old)),
        (Some(h.index), BreakKind::BadCheckpoint)
    );
    // A checkpoint before the hand-over is signed by the old key.
    let before = Checkpoint::new_signed(&key(1), 1, w_hash_of_first(dir.path()), NOON);
    assert!(
        verify_dir(dir.path(), &with(before))
            .unwrap()
            .0
            .checkpoint_matched
    );
}

fn w_hash_of_first(dir: &std::path::Path) -> tollgate_core::Digest {
    let bytes = fs::read(only_file(dir)).unwrap();
    let (off, len) = record_spans(&bytes)[0];
    format::sha256(&bytes[off..off + len])
}

/// A 10-entry log; the file and its record spans.
fn ten() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Vec<u8>,
    Vec<(usize, usize)>,
) {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 10);
    let path = only_file(dir.path());
    let bytes = fs::read(&path).unwrap();
    let spans = record_spans(&bytes);
    (dir, path, bytes, spans)
}

#[test]
fn a_length_prefix_over_the_maximum_is_too_large_even_where_the_file_ends_first() {
    let (dir, path, mut bytes, spans) = ten();
    let (off, _) = spans[9];
    bytes[off..off + 4].copy_from_slice(&65_533u32.to_be_bytes());
    fs::write(&path, &bytes).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (Some(9), BreakKind::TooLarge(65_537))
    );
    // The largest allowed prefix on a record the file ends inside: torn.
    bytes[off..off + 4].copy_from_slice(&65_532u32.to_be_bytes());
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        break_of(dir.path(), &opts(&key(1))),
        (
            Some(9),
            BreakKind::TornRecord {
                needed: Some(65_536),
                ..
            }
        )
    ));
}

#[test]
fn a_length_prefix_under_the_minimum_is_a_bad_length_even_where_the_file_ends_first() {
    let (dir, path, mut bytes, spans) = ten();
    let (off, len) = spans[9];
    bytes[off..off + 4].copy_from_slice(&10u32.to_be_bytes());
    // Cut the file inside what the real record would need.
    bytes.truncate(off + 60);
    fs::write(&path, &bytes).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (
            Some(9),
            BreakKind::BadLength {
                declared: 10,
                actual: None
            }
        )
    );
    assert!(len > 60);
}

#[test]
fn a_short_length_prefix_followed_by_more_data_is_a_bad_length_not_a_torn_record() {
    let (dir, path, mut bytes, spans) = ten();
    let (off, len) = spans[3];
    let short = u32::try_from(len - 4 - 20).unwrap();
    bytes[off..off + 4].copy_from_slice(&short.to_be_bytes());
    fs::write(&path, &bytes).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (
            Some(3),
            BreakKind::BadLength {
                declared: short,
                actual: Some(len - 4)
            }
        )
    );
}

#[test]
fn a_field_length_running_past_the_record_is_a_bad_length_not_a_torn_record() {
    // The file does not end inside record 3: its prefix is intact. A string length
    // inside it claims 65535 bytes, which would run past the end of the (small) file.
    let (dir, path, mut bytes, spans) = ten();
    let (off, len) = spans[3];
    let at = off + 45; // session_id's u16 length
    bytes[at..at + 2].copy_from_slice(&[0xff, 0xff]);
    fs::write(&path, &bytes).unwrap();
    assert!(bytes.len() < 65_535);
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (
            Some(3),
            BreakKind::BadLength {
                declared: u32::try_from(len - 4).unwrap(),
                actual: None
            }
        )
    );
}

#[test]
fn a_zero_filled_tail_is_its_own_kind() {
    let (dir, path, bytes, spans) = ten();
    let (off, len) = spans[9];
    let mut zeroed = bytes[..off].to_vec();
    zeroed.extend(std::iter::repeat_n(0u8, len + 100));
    fs::write(&path, &zeroed).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (Some(9), BreakKind::ZeroFilledTail { length: len + 100 })
    );
    // Fewer than 4 bytes left is a torn length prefix, zeros or not.
    fs::write(&path, &bytes[..off + 3]).unwrap();
    assert_eq!(
        break_of(dir.path(), &opts(&key(1))),
        (
            Some(9),
            BreakKind::TornRecord {
                available: 3,
                needed: None
            }
        )
    );
    // Zeros followed by anything else are not a tail: a length prefix of 0.
    let mut mixed = bytes[..off].to_vec();
    mixed.extend_from_slice(&[0, 0, 0, 0, 0, 7]);
    fs::write(&path, &mixed).unwrap();
    assert!(matches!(
        break_of(dir.path(), &opts(&key(1))),
        (Some(9), BreakKind::BadLength { declared: 0, .. })
    ));
}

#[test]
fn a_corrupt_archive_is_one_break_kind() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = fast(config(dir.path()));
    cfg.rotate_bytes = 1500;
    write_log(cfg, &key(1), 15);
    let files = log_files(dir.path());
    let zst = files[0].clone();
    assert!(zst.to_str().unwrap().ends_with(".log.zst"));
    let good = fs::read(&zst).unwrap();
    let name = zst.file_name().unwrap().to_str().unwrap().to_owned();
    // Cut short, a flipped byte, not zstd at all: the same kind, naming the file.
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0xff;
    for damaged in [
        good[..good.len() / 2].to_vec(),
        flipped,
        b"not zstd".to_vec(),
    ] {
        fs::write(&zst, &damaged).unwrap();
        match verify_paths(&[dir.path().to_owned()], &opts(&key(1)), &mut |_| {}) {
            Err(PathsError::Break(b)) => {
                assert!(matches!(b.kind, BreakKind::CorruptArchive(_)), "{b}");
                assert_eq!(b.file, name);
                assert_eq!(b.index, None);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn truncated_below_checkpoint_names_the_last_file_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = fast(config(dir.path()));
    cfg.rotate_bytes = 1500;
    cfg.compress_rotated = false;
    write_log(cfg, &key(1), 15);
    let cp = read_checkpoint(dir.path()).unwrap();
    let files = log_files(dir.path());
    let last = files.last().unwrap();
    let bytes = fs::read(last).unwrap();
    let (off, _) = record_spans(&bytes)[0];
    fs::write(last, &bytes[..off]).unwrap();
    let o = VerifyOptions {
        checkpoint: Some(cp),
        ..opts(&key(1))
    };
    match verify_paths(&[dir.path().to_owned()], &o, &mut |_| {}) {
        Err(PathsError::Break(b)) => {
            assert!(
                matches!(b.kind, BreakKind::TruncatedBelowCheckpoint { .. }),
                "{b}"
            );
            assert_eq!(b.file, last.file_name().unwrap().to_str().unwrap());
            assert_eq!(b.offset, off as u64);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_version_1_log_is_continued_in_a_new_file_of_the_current_version() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = raw::file(
        1,
        &[(1, encode(&raw::verdict(1))), (1, encode(&raw::verdict(1)))],
    );
    // Make it chain-correct: raw::file signs with key 1, index 0.. from genesis.
    let name = "audit-00000000-20261130.log";
    fs::write(dir.path().join(name), &v1).unwrap();
    let (w, report) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    assert_eq!(report.upgraded_from, Some(1));
    assert_eq!(report.next_index, 2);
    assert_ne!(report.file, dir.path().join(name));
    w.append(record(2)).unwrap();
    w.shutdown().unwrap();
    // The old file is kept as it was (compressed like any rotated file).
    let files = log_files(dir.path());
    assert_eq!(files.len(), 2);
    assert_eq!(tollgate_audit::files::read_log_file(&files[0]).unwrap(), v1);
    let new = fs::read(&files[1]).unwrap();
    let h = FileHeader::decode(&new[..HEADER_LEN]).unwrap();
    assert_eq!(
        (h.version, h.file_seq, h.first_index),
        (format::FORMAT_VERSION, 1, 2)
    );
    let (s, entries) = verify_dir(dir.path(), &opts(&key(1))).unwrap();
    assert_eq!(s.entries, 3);
    assert_eq!(entries[2].event, ev(record(2)));
    // Reopening the upgraded log continues the new file.
    let (w, report) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    assert_eq!(report.upgraded_from, None);
    assert_eq!(report.file, files[1]);
    w.shutdown().unwrap();
}

#[test]
fn a_version_1_file_after_a_version_2_file_is_a_downgrade() {
    let k = key(1);
    let v2 = raw::file(2, &[(1, encode(&raw::verdict(2)))]);
    let (_, n) = format::parse_record_version(2, &v2[HEADER_LEN..]).unwrap();
    let last = format::sha256(&v2[HEADER_LEN..HEADER_LEN + n]);
    let h1 = FileHeader::new_signed_version(1, &k, 1, 1, last, NOON).encode();
    let r = tollgate_audit::verify(&[("a", &v2), ("b", &h1)], &opts(&k));
    match r {
        Err(b) => {
            assert_eq!(b.file, "b");
            assert_eq!(
                b.kind,
                BreakKind::VersionDowngrade {
                    previous: 2,
                    found: 1
                }
            );
        }
        Ok(s) => panic!("{s:?}"),
    }
    // Upgrades are fine.
    let v1 = raw::file(1, &[(1, encode(&raw::verdict(1)))]);
    let (_, n) = format::parse_record_version(1, &v1[HEADER_LEN..]).unwrap();
    let last = format::sha256(&v1[HEADER_LEN..HEADER_LEN + n]);
    let h2 = FileHeader::new_signed_version(2, &k, 1, 1, last, NOON).encode();
    assert!(tollgate_audit::verify(&[("a", &v1), ("b", &h2)], &opts(&k)).is_ok());
    // Unknown versions are a bad header.
    let h9 = FileHeader::new_signed_version(9, &k, 0, 0, format::genesis_hash(), NOON).encode();
    assert_eq!(
        tollgate_audit::verify(&[("c", &h9)], &opts(&k))
            .unwrap_err()
            .kind,
        BreakKind::BadHeader(HeaderError::Version(9))
    );
}

#[test]
fn a_header_is_checked_for_length_before_magic() {
    // Fewer than 170 bytes is a short header, whatever they hold.
    assert_eq!(
        FileHeader::decode(&[0x55; 100]),
        Err(HeaderError::Short(100))
    );
    let mut h = FileHeader::new_signed(&key(1), 0, 0, format::genesis_hash(), NOON).encode();
    h[0] = b'X';
    assert_eq!(FileHeader::decode(&h), Err(HeaderError::Magic));
}

#[test]
fn a_header_with_a_small_order_key_is_a_bad_public_key() {
    let k = key(1);
    let mut h = FileHeader::new_signed(&k, 0, 0, format::genesis_hash(), NOON);
    h.public_key = [0; 32];
    h.public_key[0] = 1; // the identity point
    h.key_id = tollgate_audit::KeyId::of(&h.public_key);
    assert_eq!(FileHeader::decode(&h.encode()), Err(HeaderError::PublicKey));
}

#[test]
fn a_checkpoint_file_is_six_lines_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let cp = Checkpoint::new_signed(&key(1), 3, format::sha256(b"x"), NOON);
    let path = dir.path().join("cp");
    // As written, with CRLF line ends, or with trailing blank lines: accepted.
    for text in [
        cp.to_text(),
        cp.to_text().replace('\n', "\r\n"),
        format!("{}\n\n", cp.to_text()),
    ] {
        fs::write(&path, &text).unwrap();
        assert_eq!(read_checkpoint(&path).unwrap(), cp);
    }
    // Anything more is not a checkpoint.
    fs::write(&path, format!("{}count 4\n", cp.to_text())).unwrap();
    assert!(matches!(
        read_checkpoint(&path),
        Err(ReadCheckpointError::Parse { .. })
    ));
    // A large file is refused without reading it all.
    fs::write(&path, vec![b'#'; 1 << 20]).unwrap();
    assert!(matches!(
        read_checkpoint(&path),
        Err(ReadCheckpointError::TooLarge { .. })
    ));
}

#[test]
fn io_errors_are_described_once() {
    // The message carries the OS error; it is not also the error's source (a report that
    // prints the chain would print it twice).
    let missing = std::path::PathBuf::from("/nonexistent/tollgate-audit-test");
    let e = verify_paths(&[missing], &VerifyOptions::default(), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("No such file"), "{e}");
    assert!(std::error::Error::source(&e).is_none());
    let e = read_checkpoint(std::path::Path::new("/nonexistent/cp")).unwrap_err();
    assert!(std::error::Error::source(&e).is_none());
}
