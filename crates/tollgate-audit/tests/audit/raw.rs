//! A small, independent record encoder for tests: fields as raw parts, so that a test
//! can write any value (including ones the crate's encoder refuses), sign and chain it,
//! and see what the verifier says. It follows docs/audit-format.md, not `format.rs`.

use ed25519_dalek::Signer;
use tollgate_audit::format::{self, FileHeader};
use tollgate_audit::{verify, Break, BreakKind, KeyId};
use tollgate_core::Digest;

use crate::common::*;

/// One field of a payload.
#[derive(Debug, Clone)]
pub enum P {
    U8(u8),
    U64(u64),
    I64(i64),
    Bytes(Vec<u8>),
    /// `str`: u16 length, then the bytes.
    Str(Vec<u8>),
    /// `text`: u32 length, then the bytes.
    Text(Vec<u8>),
}

pub fn s(text: &str) -> P {
    P::Str(text.as_bytes().to_vec())
}

pub fn d(digest: Digest) -> P {
    P::Bytes(digest.0.to_vec())
}

pub fn encode(parts: &[P]) -> Vec<u8> {
    let mut b = Vec::new();
    for p in parts {
        match p {
            P::U8(v) => b.push(*v),
            P::U64(v) => b.extend_from_slice(&v.to_be_bytes()),
            P::I64(v) => b.extend_from_slice(&v.to_be_bytes()),
            P::Bytes(v) => b.extend_from_slice(v),
            P::Str(v) => {
                b.extend_from_slice(&u16::try_from(v.len()).unwrap().to_be_bytes());
                b.extend_from_slice(v);
            }
            P::Text(v) => {
                b.extend_from_slice(&u32::try_from(v.len()).unwrap().to_be_bytes());
                b.extend_from_slice(v);
            }
        }
    }
    b
}

/// A whole signed record: the length prefix is computed unless `prefix` overrides it.
pub fn record(kind: u8, index: u64, prev: &Digest, payload: &[u8], prefix: Option<u32>) -> Vec<u8> {
    let k = key(1);
    let mut b = vec![0u8; 4];
    b.push(kind);
    b.extend_from_slice(&index.to_be_bytes());
    b.extend_from_slice(&NOON.to_be_bytes());
    b.extend_from_slice(&[0x11; 16]);
    b.extend_from_slice(&KeyId::of(k.verifying_key().as_bytes()).0);
    b.extend_from_slice(payload);
    b.extend_from_slice(&prev.0);
    let len = prefix.unwrap_or(u32::try_from(b.len() - 4 + 64).unwrap());
    b[..4].copy_from_slice(&len.to_be_bytes());
    let mut msg = format::ENTRY_DOMAIN.to_vec();
    msg.extend_from_slice(&b);
    b.extend_from_slice(&k.sign(&msg).to_bytes());
    b
}

/// A file of format `version` signed by key 1 holding the given (kind, payload) records
/// in a chain from index 0.
pub fn file(version: u16, records: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let h = FileHeader::new_signed_version(version, &key(1), 0, 0, format::genesis_hash(), NOON);
    let mut out = h.encode();
    let mut prev = format::genesis_hash();
    for (i, (kind, payload)) in records.iter().enumerate() {
        let r = record(*kind, i as u64, &prev, payload, None);
        prev = format::sha256(&r);
        out.extend_from_slice(&r);
    }
    out
}

/// What the verifier says about a file, with key 1 trusted.
pub fn check(bytes: &[u8]) -> Result<u64, Break> {
    verify(&[("f", bytes)], &opts(&key(1))).map(|s| s.entries)
}

/// The break kind of a file that must not verify.
pub fn kind_of(bytes: &[u8]) -> BreakKind {
    match check(bytes) {
        Err(b) => b.kind,
        Ok(n) => panic!("verified with {n} entries"),
    }
}

/// Assert the one record of kind `kind` is malformed with this message, in a v2 file.
pub fn assert_malformed(kind: u8, parts: &[P], what: &str) {
    let bytes = file(2, &[(kind, encode(parts))]);
    assert_eq!(
        kind_of(&bytes),
        BreakKind::Malformed(leak(what)),
        "{parts:?}"
    );
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

/// The fields of a valid kind-4 (session opened) payload.
pub fn opened(config: &str) -> Vec<P> {
    vec![
        s("s1"),
        s("a1"),
        s("o1"),
        P::U8(1),
        P::I64(10_000_000_000),
        P::I64(10_000_000_000),
        d(format::sha256(config.as_bytes())),
        P::Text(config.as_bytes().to_vec()),
        P::U64(1),
    ]
}

/// The fields of a valid kind-5 (settlement) payload.
pub fn settlement() -> Vec<P> {
    vec![
        s("s1"),
        s("a1"),
        s("o1"),
        P::U64(1),
        P::U8(1),
        P::U64(0.001f64.to_bits()),
        P::U8(0),
        P::I64(1_000_000),
        P::I64(1_500_000),
        P::U8(1),
        P::I64(1_000_000),
        P::I64(9_998_500_000),
        P::I64(9_999_000_000),
        P::U8(0),
        P::U64(3),
    ]
}

/// The fields of a valid kind-6 (human decision) payload, `modify` with a successor.
pub fn decision() -> Vec<P> {
    vec![
        s("s1"),
        s("a1"),
        s("o1"),
        P::U64(2),
        s("alice"),
        s("modify"),
        s("edited the recipient"),
        s("send_email"),
        P::U64(8),
        d(Digest([1; 32])),
        P::U8(1),
        P::U64(9),
        P::U8(1),
        d(Digest([2; 32])),
        P::I64(5),
        P::U64(4),
    ]
}

/// The fields of a valid kind-1 (verdict) payload; `version` 2 adds `session_seq`.
pub fn verdict(version: u16) -> Vec<P> {
    let mut v = vec![
        s("s1"),
        s("a1"),
        s("o1"),
        P::U64(1),
        s("search"),
        d(Digest([3; 32])),
        P::U8(1),
        P::U8(0),
        s("within_thresholds"),
        P::U8(0),
        P::I64(10),
        P::I64(9),
        P::U8(0),
        P::I64(1),
        P::U64(7),
        P::U8(0),
    ];
    if version >= 2 {
        v.push(P::U64(2));
    }
    v
}

/// The valid payloads verify: the baseline each malformed test changes one thing of.
pub fn baselines_verify() {
    let bytes = file(
        2,
        &[
            (4, encode(&opened("{}"))),
            (1, encode(&verdict(2))),
            (5, encode(&settlement())),
            (6, encode(&decision())),
        ],
    );
    assert_eq!(check(&bytes).unwrap(), 4);
    assert_eq!(check(&file(1, &[(1, encode(&verdict(1)))])).unwrap(), 1);
}
