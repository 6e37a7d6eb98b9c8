//! The known-answer file of docs/audit-format.md, rebuilt byte for byte from the values
//! the page lists, and the page's constants checked against the code.

use std::path::PathBuf;

use ed25519_dalek::SigningKey;
use tollgate_audit::format::{self, FileHeader, Position};
use tollgate_audit::{keys, verify, Event, KeyId, VerdictRecord};
use tollgate_core::{DenyReason, Digest, Money, Reason, Verdict};
use uuid::Uuid;

use crate::common::*;

fn data_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/known-answer.log")
}

fn doc() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/audit-format.md");
    std::fs::read_to_string(p).unwrap()
}

fn build() -> Vec<u8> {
    let k = SigningKey::from_bytes(&[1u8; 32]);
    let kid = KeyId::of(k.verifying_key().as_bytes());
    let t0 = 1_796_040_000_000_000_000i64;
    let header = FileHeader::new_signed(&k, 0, 0, format::genesis_hash(), t0);
    let mut out = header.encode();
    let r0 = VerdictRecord {
        timestamp_ns: t0,
        session_id: "s1".into(),
        agent_id: "a1".into(),
        organization_id: "o1".into(),
        call_number: 1,
        tool_name: "search".into(),
        params_hash: format::sha256(b"{}"),
        verdict: Verdict::Allow,
        deny_reason: None,
        reason: Reason::WithinThresholds,
        probabilistic: false,
        budget_before: Money(10_000_000_000),
        budget_after: Money(9_998_500_000),
        operator_id: None,
        estimated_cost: Money(1_500_000),
        nonce: 7,
        config_digest: None,
    };
    let r1 = VerdictRecord {
        timestamp_ns: t0 + 1_000_000,
        call_number: 2,
        tool_name: "send_email".into(),
        verdict: Verdict::Deny,
        deny_reason: Some(DenyReason::BudgetExhausted),
        reason: Reason::BudgetOverrun,
        probabilistic: true,
        operator_id: Some("alice".into()),
        config_digest: Some(Digest([0xab; 32])),
        ..r0.clone()
    };
    let events = [
        (
            t0,
            "0192f7c8-0000-7000-8000-000000000000",
            Event::Verdict(r0),
        ),
        (
            t0 + 1_000_000,
            "0192f7c8-0001-7000-8000-000000000001",
            Event::Verdict(r1),
        ),
        (
            t0 + 2_000_000,
            "0192f7c8-0002-7000-8000-000000000002",
            Event::KeyHandover {
                new_public_key: SigningKey::from_bytes(&[2u8; 32])
                    .verifying_key()
                    .to_bytes(),
            },
        ),
    ];
    let mut prev = format::genesis_hash();
    for (i, (ts, id, ev)) in events.iter().enumerate() {
        let rec = format::encode_record(
            Position {
                index: i as u64,
                timestamp_ns: *ts,
                entry_id: Uuid::parse_str(id).unwrap(),
                prev_hash: &prev,
            },
            ev,
            &k,
            kid,
        )
        .unwrap();
        prev = format::sha256(&rec);
        out.extend_from_slice(&rec);
    }
    out
}

#[test]
fn file_is_reproduced_byte_for_byte() {
    let built = build();
    if std::env::var_os("TOLLGATE_BLESS").is_some() {
        std::fs::write(data_path(), &built).unwrap();
    }
    let stored = std::fs::read(data_path()).unwrap();
    assert_eq!(built, stored, "encoding changed: the format is frozen");
    let s = verify(&[("known-answer.log", &stored)], &opts(&key(1))).unwrap();
    assert_eq!(s.entries, 3);
    assert_eq!(s.key_id, KeyId::of(key(2).verifying_key().as_bytes()));
}

#[test]
fn genesis_value_is_documented() {
    let g = format::genesis_hash().to_string();
    assert!(doc().contains(&g), "genesis {g} not in docs");
}

#[test]
fn key_file_examples_are_documented() {
    let k = key(1);
    let d = doc();
    for line in keys::secret_key_text(&k)
        .lines()
        .chain(keys::public_key_text(&k.verifying_key()).lines())
    {
        assert!(d.contains(line), "docs lack `{line}`");
    }
    assert!(d.contains(&KeyId::of(&[0u8; 32]).to_string()));
}

#[test]
fn documented_sizes_hold() {
    assert_eq!(format::HEADER_LEN, 170);
    assert_eq!(format::MIN_RECORD_LEN, 141);
    assert_eq!(format::MAX_RECORD_LEN, 65_536);
    assert_eq!(format::HEADER_DOMAIN.len(), 25);
    assert_eq!(format::ENTRY_DOMAIN.len(), 24);
    assert_eq!(tollgate_audit::checkpoint::CHECKPOINT_DOMAIN.len(), 29);
}
