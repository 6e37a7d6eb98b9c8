//! Property tests: random entries verify and round-trip; any single-byte flip is caught;
//! arbitrary bytes never panic the reader.

use std::fs;

use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use tollgate_audit::format::{self, FileHeader, HEADER_LEN};

use tollgate_audit::{
    read_tail, verify, CostStatus, DecisionRecord, Event, ParamsMode, PolicyEffect, PolicyNote,
    RecordedParams, SessionEvent, SessionRecord, SettlementRecord, ShadowNote, VerdictRecord,
    VerifyOptions, Writer,
};
use tollgate_core::{BudgetScope, DenyReason, Digest, HumanDecision, Money, Reason, Verdict};

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
        // Version 7: shadow notes (with a policy note), recorded params.
        (
            proptest::collection::vec((0usize..3, any::<bool>()), 0..4),
            0usize..4,
            "\\PC{0,60}",
            16_385u32..,
        ),
        // Version 8: the upstream called, the draw.
        (
            proptest::option::of("[a-zA-Z0-9_-]{1,64}"),
            proptest::option::of(0.0f64..1.0),
        ),
    )
        .prop_map(|(a, b, c, d, e)| {
            let mut v = verdict(a, b, c);
            v.upstream = e.0.filter(|u| u != "local");
            v.draw = e.1.and_then(tollgate_audit::Draw::new);
            if !d.0.is_empty() {
                v.policy = Some(PolicyNote {
                    set_digest: Digest([7; 32]),
                    effect: PolicyEffect::Pass,
                    policy_id: None,
                    decided: false,
                    tripped: false,
                    labels: Vec::new(),
                });
            }
            v.shadow =
                d.0.iter()
                    .enumerate()
                    .map(|(i, &(w, by_policy))| {
                        let verdict = [Verdict::Allow, Verdict::Deny, Verdict::Hitl][w];
                        let policy = by_policy && verdict != Verdict::Allow;
                        ShadowNote {
                            name: if i == 0 { "*".into() } else { format!("p{i}") },
                            verdict,
                            reason: if policy {
                                format!("policy:p{i}")
                            } else {
                                "within_thresholds".into()
                            },
                            policy_id: policy.then(|| format!("p{i}")),
                        }
                    })
                    .collect();
            v.params = match d.1 {
                0 => None,
                1 => {
                    v.params_hash = format::sha256(d.2.as_bytes());
                    Some(RecordedParams::Full(d.2))
                }
                2 => Some(RecordedParams::Redacted(d.2)),
                _ => Some(RecordedParams::TooLarge {
                    mode: ParamsMode::Full,
                    len: d.3,
                }),
            };
            v
        })
}

type PartA = (i64, String, String, String, u64, String);
type PartB = ([u8; 32], usize, Option<usize>, usize, bool);
type PartC = (i64, i64, Option<String>, i64, u64, Option<[u8; 32]>);

fn verdict(a: PartA, b: PartB, c: PartC) -> VerdictRecord {
    VerdictRecord {
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
        // The two policy reasons need a policy note (format version 6).
        reason: Some(Reason::ALL[b.3])
            .filter(|r| !r.is_policy())
            .unwrap_or(Reason::WithinThresholds),
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
        session_seq: c.4 | 1,
        budget_version: c.4.rotate_left(17),
        policy: None,
        shadow: Vec::new(),
        params: None,
        upstream: None,
        draw: None,
    }
}

fn arb_opened() -> impl Strategy<Value = SessionRecord> {
    let text = "\\PC{0,40}";
    (
        (any::<i64>(), text, text, text, 0usize..3),
        (any::<i64>(), any::<i64>(), "\\PC{0,300}"),
    )
        .prop_map(|(a, b)| SessionRecord {
            timestamp_ns: a.0,
            session_id: a.1,
            agent_id: a.2,
            organization_id: a.3,
            budget_scope: [
                BudgetScope::PerSession,
                BudgetScope::PerAgent,
                BudgetScope::PerOrganization,
            ][a.4],
            budget_initial: Money(b.0),
            budget_before: Money(b.1),
            config_digest: format::sha256(b.2.as_bytes()),
            session_seq: 1,
            budget_version: b.0.unsigned_abs(),
            config: b.2,
            policy_set: None,
        })
}

fn arb_settlement() -> impl Strategy<Value = SettlementRecord> {
    let text = "\\PC{0,40}";
    (
        (any::<i64>(), text, text, text, any::<u64>(), any::<bool>()),
        (
            any::<u64>(),
            0usize..3,
            any::<i64>(),
            any::<bool>(),
            any::<i64>(),
        ),
        (
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
            any::<bool>(),
            1u64..,
        ),
    )
        .prop_map(|(a, b, c)| {
            let status = [
                CostStatus::Readable,
                CostStatus::Unreadable,
                CostStatus::OverRange,
            ][b.1];
            SettlementRecord {
                timestamp_ns: a.0,
                session_id: a.1,
                agent_id: a.2,
                organization_id: a.3,
                call_number: a.4,
                success: a.5,
                reported_cost_bits: b.0,
                cost_status: status,
                actual_cost: Money(if status == CostStatus::Readable {
                    b.2
                } else {
                    0
                }),
                estimated_cost: Money(if b.3 { b.4 } else { 0 }),
                reserved: b.3,
                charged: Money(c.0),
                budget_before: Money(c.1),
                budget_after: Money(c.2),
                error_signal: c.3,
                session_seq: c.4,
                budget_version: a.4.rotate_left(9),
            }
        })
}

fn arb_decision() -> impl Strategy<Value = DecisionRecord> {
    let text = "\\PC{0,40}";
    (
        (any::<i64>(), text, text, text, any::<u64>(), text),
        (0usize..6, text, any::<u64>(), any::<[u8; 32]>()),
        (any::<u64>(), any::<[u8; 32]>(), any::<i64>(), 1u64..),
    )
        .prop_map(|(a, b, c)| {
            let decision = [
                HumanDecision::Approve,
                HumanDecision::Reject,
                HumanDecision::Modify,
                HumanDecision::Defer,
                HumanDecision::Escalate,
                HumanDecision::Expire,
            ][b.0]
                .clone();
            DecisionRecord {
                timestamp_ns: a.0,
                session_id: a.1,
                agent_id: a.2,
                organization_id: a.3,
                call_number: a.4,
                operator_id: a.5,
                successor: (decision == HumanDecision::Modify).then_some((c.0, Digest(c.1))),
                note: b.1.chars().rev().collect(),
                decision,
                tool_name: b.1,
                original_nonce: b.2,
                original_args_digest: Digest(b.3),
                budget_remaining: Money(c.2),
                session_seq: c.3,
            }
        })
}

fn arb_event() -> impl Strategy<Value = SessionEvent> {
    prop_oneof![
        arb_record().prop_map(SessionEvent::Verdict),
        arb_opened().prop_map(SessionEvent::Opened),
        arb_settlement().prop_map(SessionEvent::Settled),
        arb_decision().prop_map(SessionEvent::HumanDecision),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_entries_verify_and_round_trip(
        records in proptest::collection::vec(arb_event(), 1..12),
        from in any::<prop::sample::Index>(),
        flip_at in any::<prop::sample::Index>(),
        flip_mask in 1u8..=255,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let tapped = Arc::new(Mutex::new(Vec::new()));
        let t = tapped.clone();
        let (w, _) = Writer::open_with_tap(
            fast(config(dir.path())),
            key(1),
            Box::new(move |batch| t.lock().unwrap().extend(batch)),
        )
        .unwrap();
        let pending: Vec<_> = records.iter().cloned().map(|r| w.submit(r)).collect();
        for p in pending {
            p.wait().unwrap();
        }
        w.shutdown().unwrap();
        let (s, entries) = verify_dir(dir.path(), &opts(&key(1))).unwrap();
        prop_assert_eq!(s.entries, records.len() as u64);
        for (e, r) in entries.iter().zip(&records) {
            prop_assert_eq!(&e.event, &Event::Session(r.clone()));
            prop_assert_eq!(e.timestamp_ns, r.timestamp_ns());
        }
        // The tap saw the same entries; the tail reader reads any suffix of them.
        let tapped: Vec<Event> = tapped.lock().unwrap().iter().map(|c| c.event.clone()).collect();
        let logged: Vec<Event> = entries.iter().map(|e| e.event.clone()).collect();
        prop_assert_eq!(tapped, logged);
        let from = from.index(entries.len() + 1);
        let mut tail = Vec::new();
        let end = read_tail(dir.path(), from as u64, Some(&key(1).verifying_key()), &mut |e| {
            tail.push(e.clone());
            Ok(())
        })
        .unwrap();
        prop_assert_eq!(&tail[..], &entries[from..]);
        prop_assert_eq!(end.next_index, s.next_index);
        prop_assert_eq!(end.last_hash, s.last_hash);
        // Decoding then encoding gives back the same bytes, signature included.
        let path = only_file(dir.path());
        let clean = fs::read(&path).unwrap();
        for (off, len) in record_spans(&clean) {
            let (r, _) = format::parse_record(&clean[off..]).unwrap();
            let again = format::encode_record(
                format::Position {
                    index: r.entry.index,
                    timestamp_ns: r.entry.timestamp_ns,
                    entry_id: r.entry.entry_id,
                    prev_hash: &r.entry.prev_hash,
                },
                &r.entry.event,
                &key(1),
                r.entry.key_id,
            )
            .unwrap();
            prop_assert_eq!(&again[..], &clean[off..off + len]);
        }
        // Any single-byte change anywhere in the file is detected.
        let mut bytes = clean;
        let i = flip_at.index(bytes.len());
        bytes[i] ^= flip_mask;
        let r = verify(&[("f", &bytes)], &opts(&key(1)));
        prop_assert!(r.is_err(), "flip at {} of {} went unnoticed", i, bytes.len());
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_reader(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = verify(&[("f", &bytes)], &VerifyOptions::default());
        for version in format::OLDEST_VERSION..=format::NEWEST_VERSION {
            let _ = format::parse_record_version(version, &bytes);
        }
        let _ = FileHeader::decode(&bytes);
    }

    #[test]
    fn arbitrary_records_after_a_valid_header_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..600),
        prefix_len in 0u32..2000,
    ) {
        let h = FileHeader::new_signed(&key(1), 0, 0, format::genesis_hash(), NOON);
        let mut bytes = h.encode();
        let h1 = FileHeader::new_signed_version(1, &key(1), 0, 0, format::genesis_hash(), NOON);
        let mut v1 = h1.encode();
        v1.extend_from_slice(&prefix_len.to_be_bytes());
        v1.extend_from_slice(&tail);
        prop_assert!(verify(&[("f", &v1)], &opts(&key(1))).is_err());
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
