//! Arbitrary bytes into every reader of tollgate-audit: the verifier (every format
//! version, 1 to 8: policy sets, policy notes, shadow notes, recorded params, upstreams and draws included), the record and header parsers, and the checkpoint and key file parsers. None
//! may panic. A record that parses must encode back to the same bytes.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tollgate_audit::format::{self, FileHeader, Position};
use tollgate_audit::{checkpoint::Checkpoint, keys, verify, SigningKey, VerifyOptions};

fn key() -> &'static SigningKey {
    static K: OnceLock<SigningKey> = OnceLock::new();
    K.get_or_init(|| SigningKey::from_bytes(&[1; 32]))
}

/// A validly signed header of `version`, so that record parsing and chain checks are
/// reached.
fn header(version: u16) -> Vec<u8> {
    FileHeader::new_signed_version(version, key(), 0, 0, format::genesis_hash(), 0).encode()
}

/// Parse a record; if it parses, encoding its entry again must give the same bytes
/// (the signature aside: the fuzzer's bytes were not signed by our key).
fn round_trip(version: u16, bytes: &[u8]) {
    let Ok((r, n)) = format::parse_record_version(version, bytes) else {
        return;
    };
    let pos = Position {
        index: r.entry.index,
        timestamp_ns: r.entry.timestamp_ns,
        entry_id: r.entry.entry_id,
        prev_hash: &r.entry.prev_hash,
    };
    let again = format::encode_record_version(version, pos, &r.entry.event, key(), r.entry.key_id)
        .expect("a parsed entry encodes");
    assert_eq!(again.len(), n);
    assert_eq!(again[..n - 64], bytes[..n - 64]);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    // Bits 5-7 pick the format version, 1 to 8 (`NEWEST_VERSION`).
    let version = 1 + u16::from(mode >> 5) % format::NEWEST_VERSION;
    match mode % 5 {
        0 => {
            let _ = verify(&[("f", rest)], &VerifyOptions::default());
        }
        1 => {
            // Two files, split where the next byte says.
            let at = usize::from(rest.first().copied().unwrap_or(0)) * 8;
            let (a, b) = rest.split_at(at.min(rest.len()));
            let _ = verify(&[("a", a), ("b", b)], &VerifyOptions::default());
        }
        2 => {
            round_trip(version, rest);
            let _ = FileHeader::decode(rest);
        }
        3 => {
            // A valid header followed by arbitrary records, with and without signature
            // checks (without, the index, link and hand-over paths are reached).
            let mut file = header(version);
            file.extend_from_slice(rest);
            let _ = verify(&[("f", &file)], &VerifyOptions::default());
            let opts = VerifyOptions {
                check_signatures: false,
                ..VerifyOptions::default()
            };
            let _ = verify(&[("f", &file), ("g", &file)], &opts);
        }
        _ => {
            let text = String::from_utf8_lossy(rest);
            let _ = Checkpoint::parse(&text);
            let _ = keys::parse_secret_key(&text);
            let _ = keys::parse_public_key(&text);
        }
    }
});
