//! Property tests: random entries verify and round-trip; any single-byte flip is caught;
//! arbitrary bytes never panic the reader.

use std::fs;

use proptest::prelude::*;
use tollgate_audit::format::{self, FileHeader, HEADER_LEN};
use tollgate_audit::{verify, VerdictRecord, VerifyOptions, Writer};
use tollgate_core::{DenyReason, Digest, Money, Reason, Verdict};

use crate::common::*;

fn arb_record() -> impl Strategy<Value = VerdictRecord> {
    let text = "\\PC{0,40}";
    (
        (any::<i64>(), text, text, text, any::<u64>(), text),
        (
            any::<[u8; 32]>(),
            0usize..3,
            proptest::option::of(0usize..8),
            0usize..Reason::ALL.len(),
            any::<bool>(),
        ),
        (
            any::<i64>(),
            any::<i64>(),
            proptest::option::of(text),
            any::<i64>(),
            any::<u64>(),
            proptest::option::of(any::<[u8; 32]>()),
        ),
    )
        .prop_map(|(a, b, c)| VerdictRecord {
            timestamp_ns: a.0,
            session_id: a.1,
            agent_id: a.2,
            organization_id: a.3,
            call_number: a.4,
            tool_name: a.5,
            params_hash: Digest(b.0),
            verdict: [Verdict::Allow, Verdict::Deny, Verdict::Hitl][b.1],
            deny_reason: b.2.map(|i| {
                [
                    DenyReason::CircuitOpen,
                    DenyReason::BudgetExhausted,
                    DenyReason::MaxRepeatExceeded,
                    DenyReason::WindowExceeded,
                    DenyReason::GlobalLimit,
                    DenyReason::PolicyViolation,
                    DenyReason::AuthFailed,
                    DenyReason::Timeout,
                ][i]
            }),
            reason: Reason::ALL[b.3],
            probabilistic: b.4,
            budget_before: Money(c.0),
            budget_after: Money(c.1),
            // Version 2: an operator exactly on a verdict that releases an approved call.
            operator_id: matches!(
                Reason::ALL[b.3],
                Reason::TransitionApprove | Reason::TransitionModifySuccessor
            )
            .then(|| c.2.unwrap_or_default()),
            estimated_cost: Money(c.3),
            nonce: c.4,
            config_digest: c.5.map(Digest),
            session_seq: 1,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_entries_verify_and_round_trip(
        records in proptest::collection::vec(arb_record(), 1..12),
        flip_at in any::<prop::sample::Index>(),
        flip_mask in 1u8..=255,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (w, _) = Writer::open(fast(config(dir.path())), key(1)).unwrap();
        let pending: Vec<_> = records.iter().cloned().map(|r| w.submit(r)).collect();
        for p in pending {
            p.wait().unwrap();
        }
        w.shutdown().unwrap();
        let (s, entries) = verify_dir(dir.path(), &opts(&key(1))).unwrap();
        prop_assert_eq!(s.entries, records.len() as u64);
        for (e, r) in entries.iter().zip(&records) {
            prop_assert_eq!(&e.event, &ev(r.clone()));
            prop_assert_eq!(e.timestamp_ns, r.timestamp_ns);
        }
        // Any single-byte change anywhere in the file is detected.
        let path = only_file(dir.path());
        let mut bytes = fs::read(&path).unwrap();
        let i = flip_at.index(bytes.len());
        bytes[i] ^= flip_mask;
        let r = verify(&[("f", &bytes)], &opts(&key(1)));
        prop_assert!(r.is_err(), "flip at {} of {} went unnoticed", i, bytes.len());
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_reader(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = verify(&[("f", &bytes)], &VerifyOptions::default());
        let _ = format::parse_record(&bytes);
        let _ = FileHeader::decode(&bytes);
    }

    #[test]
    fn arbitrary_records_after_a_valid_header_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..600),
        prefix_len in 0u32..2000,
    ) {
        let h = FileHeader::new_signed(&key(1), 0, 0, format::genesis_hash(), NOON);
        let mut bytes = h.encode();
        prop_assert_eq!(bytes.len(), HEADER_LEN);
        bytes.extend_from_slice(&prefix_len.to_be_bytes());
        bytes.extend_from_slice(&tail);
        let r = verify(&[("f", &bytes)], &opts(&key(1)));
        prop_assert!(r.is_err());
        // Without signature checks the index, link and hand-over paths are reached too.
        let unsigned = VerifyOptions { check_signatures: false, ..VerifyOptions::default() };
        let _ = verify(&[("f", &bytes), ("g", &bytes)], &unsigned);
    }
}
