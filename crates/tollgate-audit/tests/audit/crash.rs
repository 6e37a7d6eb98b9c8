//! Torn tails: moved aside, recorded in the chain, and nothing whole lost.

use std::fs;

use tollgate_audit::{BreakKind, Event, OpenError, Writer};

use crate::common::*;

fn torn_tail_recovers(cut: impl Fn(&[u8], usize, usize) -> Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 10);
    let path = only_file(dir.path());
    let bytes = fs::read(&path).unwrap();
    let (off, len) = record_spans(&bytes)[9];
    let damaged = cut(&bytes, off, len);
    let tail = damaged[off..].to_vec();
    fs::write(&path, &damaged).unwrap();
    assert!(matches!(
        break_of(dir.path(), &opts(&key(1))).1,
        BreakKind::TornRecord { .. } | BreakKind::ZeroFilledTail { .. }
    ));

    let (w, report) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
    let rec = report.recovered.clone().expect("recovery reported");
    assert_eq!(rec.offset, off as u64);
    assert_eq!(rec.length, tail.len() as u64);
    assert_eq!(rec.entry_index, 9);
    assert_eq!(
        fs::read(&rec.moved_to).unwrap(),
        tail,
        "torn bytes kept aside"
    );
    assert_eq!(report.next_index, 10);
    w.append(record(10)).unwrap();
    w.shutdown().unwrap();

    let (s, entries) = verify_dir(dir.path(), &opts(&key(1))).unwrap();
    assert_eq!(s.entries, 11);
    // Every whole entry survived, in place.
    for (i, e) in entries.iter().take(9).enumerate() {
        assert_eq!(e.event, ev(record(i as u64)));
    }
    match &entries[9].event {
        Event::Recovery {
            offset,
            length,
            sha256,
            moved_to,
            ..
        } => {
            assert_eq!(*offset, off as u64);
            assert_eq!(*length, tail.len() as u64);
            assert_eq!(*sha256, tollgate_audit::format::sha256(&tail));
            assert!(moved_to.starts_with("torn/"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(entries[10].event, ev(record(10)));
}

#[test]
fn tail_cut_mid_record_is_moved_aside() {
    torn_tail_recovers(|b, off, len| b[..off + len - 7].to_vec());
}

#[test]
fn tail_cut_inside_the_length_prefix_is_moved_aside() {
    torn_tail_recovers(|b, off, _| b[..off + 3].to_vec());
}

#[test]
fn zero_filled_tail_is_moved_aside() {
    // Some file systems leave zeros after a crash where the data never landed.
    torn_tail_recovers(|b, off, len| {
        let mut v = b[..off].to_vec();
        v.extend(std::iter::repeat_n(0u8, len));
        v
    });
}

#[test]
fn a_break_that_is_not_a_torn_tail_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 10);
    let path = only_file(dir.path());
    let mut bytes = fs::read(&path).unwrap();
    let (off, _) = record_spans(&bytes)[4];
    bytes[off + 3] ^= 0x10; // length prefix of a middle record
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        Writer::open(fast(config(dir.path())), key(1)),
        Err(OpenError::Broken(_))
    ));
    // Nothing was moved or cut.
    assert_eq!(fs::read(&path).unwrap(), bytes);
}

#[test]
fn open_with_signature_checks_refuses_a_forged_tail() {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 4);
    let path = only_file(dir.path());
    let mut bytes = fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 1;
    fs::write(&path, &bytes).unwrap();
    let mut cfg = fast(config(dir.path()));
    cfg.verify_on_open = true;
    assert!(matches!(
        Writer::open(cfg, key(1)),
        Err(OpenError::Broken(b)) if b.kind == BreakKind::BadSignature
    ));
}
