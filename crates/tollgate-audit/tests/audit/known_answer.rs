//! The known-answer file of docs/audit-format.md, rebuilt byte for byte from the values
//! the page lists, and the page's constants checked against the code.

use std::path::PathBuf;

use ed25519_dalek::SigningKey;
use tollgate_audit::format::{self, FileHeader, Position};
use tollgate_audit::verify::{verify_visit, Summary};
use tollgate_audit::{
    keys, AuditEntry, CloseReason, CloseRecord, CostStatus, DecisionRecord, Draw, Event, KeyId,
    ParamsMode, PolicyEffect, PolicyNote, PolicySetCause, PolicySetRecord, RecordedParams,
    SessionEvent, SessionRecord, SettlementRecord, ShadowNote, VerdictRecord, VoidRecord,
};
use tollgate_core::labels::Label;
use tollgate_core::{BudgetScope, DenyReason, Digest, HumanDecision, Money, Reason, Verdict};
use uuid::Uuid;

use crate::common::*;

fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn doc() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/audit-format.md");
    std::fs::read_to_string(p).unwrap()
}

const T0: i64 = 1_796_040_000_000_000_000;

/// Sign a header and the events (with their timestamps and entry ids) into one file of
/// format `version`.
fn build_file(version: u16, events: &[(i64, &str, Event)]) -> Vec<u8> {
    let k = SigningKey::from_bytes(&[1u8; 32]);
    let kid = KeyId::of(k.verifying_key().as_bytes());
    let header = FileHeader::new_signed_version(version, &k, 0, 0, format::genesis_hash(), T0);
    let mut out = header.encode();
    let mut prev = format::genesis_hash();
    for (i, (ts, id, ev)) in events.iter().enumerate() {
        let rec = format::encode_record_version(
            version,
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

fn handover() -> Event {
    Event::KeyHandover {
        new_public_key: SigningKey::from_bytes(&[2u8; 32])
            .verifying_key()
            .to_bytes(),
    }
}

/// The version-1 known answer, as format version 1 defined it (frozen).
fn build_v1() -> Vec<u8> {
    let r0 = VerdictRecord {
        timestamp_ns: T0,
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
        session_seq: 0,
        budget_version: 0,
        policy: None,
        shadow: Vec::new(),
        params: None,
        upstream: None,
        draw: None,
    };
    let r1 = VerdictRecord {
        timestamp_ns: T0 + 1_000_000,
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
    build_file(
        1,
        &[
            (T0, "0192f7c8-0000-7000-8000-000000000000", r0.into()),
            (
                T0 + 1_000_000,
                "0192f7c8-0001-7000-8000-000000000001",
                r1.into(),
            ),
            (
                T0 + 2_000_000,
                "0192f7c8-0002-7000-8000-000000000002",
                handover(),
            ),
        ],
    )
}

/// The configuration text of the version-2 known answer.
const CONFIG: &str = r#"{"budget_scope":"per_agent","budget_usd":10}"#;

/// The six events of the version-2 known answer, as docs/audit-format.md lists them.
fn v2_events() -> Vec<(i64, &'static str, Event)> {
    let config_digest = format::sha256(CONFIG.as_bytes());
    let opened = SessionRecord {
        timestamp_ns: T0,
        session_id: "s1".into(),
        agent_id: "a1".into(),
        organization_id: "o1".into(),
        budget_scope: BudgetScope::PerAgent,
        budget_initial: Money(10_000_000_000),
        budget_before: Money(7_500_000_000),
        config_digest,
        config: CONFIG.into(),
        session_seq: 1,
        budget_version: 0,
        policy_set: None,
    };
    let verdict = VerdictRecord {
        timestamp_ns: T0 + 1_000_000,
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
        budget_before: Money(7_500_000_000),
        budget_after: Money(7_498_500_000),
        operator_id: None,
        estimated_cost: Money(1_500_000),
        nonce: 7,
        config_digest: Some(config_digest),
        session_seq: 2,
        budget_version: 0,
        policy: None,
        shadow: Vec::new(),
        params: None,
        upstream: None,
        draw: None,
    };
    let settled = SettlementRecord {
        timestamp_ns: T0 + 2_000_000,
        session_id: "s1".into(),
        agent_id: "a1".into(),
        organization_id: "o1".into(),
        call_number: 1,
        success: true,
        reported_cost_bits: 0.001f64.to_bits(),
        cost_status: CostStatus::Readable,
        actual_cost: Money(1_000_000),
        estimated_cost: Money(1_500_000),
        reserved: true,
        charged: Money(1_000_000),
        budget_before: Money(7_498_500_000),
        budget_after: Money(7_499_000_000),
        error_signal: false,
        session_seq: 3,
        budget_version: 0,
    };
    let decided = DecisionRecord {
        timestamp_ns: T0 + 3_000_000,
        session_id: "s1".into(),
        agent_id: "a1".into(),
        organization_id: "o1".into(),
        call_number: 2,
        operator_id: "alice".into(),
        decision: HumanDecision::Modify,
        note: "checked the recipient".into(),
        tool_name: "send_email".into(),
        original_nonce: 8,
        original_args_digest: format::sha256(br#"{"to":"a"}"#),
        successor: Some((9, format::sha256(br#"{"to":"b"}"#))),
        budget_remaining: Money(7_499_000_000),
        session_seq: 4,
    };
    let recovery = Event::Recovery {
        file: "audit-00000000-20261130.log".into(),
        offset: 1234,
        length: 56,
        sha256: Digest([0xcd; 32]),
        moved_to: "torn/audit-00000000-20261130.log.1234.1796040000004000000.torn".into(),
    };
    vec![
        (T0, "0192f7c8-0000-7000-8000-000000000000", opened.into()),
        (
            T0 + 1_000_000,
            "0192f7c8-0001-7000-8000-000000000001",
            verdict.into(),
        ),
        (
            T0 + 2_000_000,
            "0192f7c8-0002-7000-8000-000000000002",
            settled.into(),
        ),
        (
            T0 + 3_000_000,
            "0192f7c8-0003-7000-8000-000000000003",
            decided.into(),
        ),
        (
            T0 + 4_000_000,
            "0192f7c8-0004-7000-8000-000000000004",
            recovery,
        ),
        (
            T0 + 5_000_000,
            "0192f7c8-0005-7000-8000-000000000005",
            handover(),
        ),
    ]
}

fn check_stored(name: &str, built: &[u8]) -> Vec<u8> {
    if std::env::var_os("TOLLGATE_BLESS").is_some() {
        std::fs::write(data_path(name), built).unwrap();
    }
    let stored = std::fs::read(data_path(name)).unwrap();
    assert_eq!(
        built, stored,
        "encoding of {name} changed: the format is frozen"
    );
    stored
}

/// The file `stored` (named `name`) verified with key 1: its summary and every entry.
fn verified(name: &str, stored: &[u8]) -> (Summary, Vec<AuditEntry>) {
    let mut seen = Vec::new();
    let s = verify_visit(&[(name, stored)], &opts(&key(1)), &mut |e| {
        seen.push(e.clone());
    })
    .unwrap();
    (s, seen)
}

/// The doc lists the SHA-256 of `stored` (for implementations without the file), `what`.
fn assert_documented(stored: &[u8], what: &str) {
    let digest = format::sha256(stored).to_string();
    assert!(
        doc().contains(&digest),
        "docs lack the {what}'s SHA-256 {digest}"
    );
}

/// Known answer `name`, built as format `version` from `events`: byte for byte the stored
/// file ([`check_stored`]), which verifies with key 1, one entry a kind of `kinds`, each
/// event reading back with its time and entry id, and whose SHA-256 the doc lists (`what`
/// names it). The stored file, its summary and its entries.
fn reproduced(
    name: &str,
    version: u16,
    events: &[(i64, &str, Event)],
    kinds: &[u8],
    what: &str,
) -> (Vec<u8>, Summary, Vec<AuditEntry>) {
    let stored = check_stored(name, &build_file(version, events));
    let (s, seen) = verified(name, &stored);
    assert_eq!(s.entries, kinds.len() as u64);
    let seen_kinds: Vec<u8> = seen.iter().map(|e| e.event.kind()).collect();
    assert_eq!(seen_kinds, kinds);
    for (e, (ts, id, ev)) in seen.iter().zip(events) {
        assert_eq!(&e.event, ev);
        assert_eq!(e.timestamp_ns, *ts);
        assert_eq!(e.entry_id.to_string(), *id);
    }
    assert_documented(&stored, what);
    (stored, s, seen)
}

/// The records of `bytes`, a file of format `version`, each read at that version: where
/// each starts, and its bytes.
fn records(version: u16, bytes: &[u8]) -> Vec<(usize, &[u8])> {
    let mut out = Vec::new();
    let mut off = format::HEADER_LEN;
    while off < bytes.len() {
        let (_, n) = format::parse_record_version(version, &bytes[off..]).unwrap();
        out.push((off, &bytes[off..off + n]));
        off += n;
    }
    out
}

/// The verdict entry `i` of `events` holds.
fn verdict_at(events: &[(i64, &str, Event)], i: usize) -> VerdictRecord {
    let Event::Session(SessionEvent::Verdict(v)) = events[i].2.clone() else {
        unreachable!()
    };
    v
}

/// Whether a verdict entry holding `v` can be written in format `version`.
fn check_verdict(v: &VerdictRecord, version: u16) -> Result<(), &'static str> {
    format::check_event(&Event::from(v.clone()), version)
}

/// `v` changed by `f`.
fn altered(v: &VerdictRecord, f: &dyn Fn(&mut VerdictRecord)) -> VerdictRecord {
    let mut v = v.clone();
    f(&mut v);
    v
}

#[test]
fn file_is_reproduced_byte_for_byte() {
    // Every value reads back as written, one record of each kind; the file's SHA-256 is
    // in the doc, for implementations without the file.
    let (_, s, _) = reproduced(
        "known-answer.log",
        2,
        &v2_events(),
        &[4, 1, 5, 6, 3, 2],
        "known answer",
    );
    assert_eq!(s.key_id, KeyId::of(key(2).verifying_key().as_bytes()));
}

/// Version 3: the first two records of the version-2 file, then a void of the session's
/// next version.
fn v3_events() -> Vec<(i64, &'static str, Event)> {
    let mut events: Vec<_> = v2_events().into_iter().take(2).collect();
    events.push((
        T0 + 2_000_000,
        "0192f7c8-0002-7000-8000-000000000002",
        Event::Void(VoidRecord {
            timestamp_ns: T0 + 2_000_000,
            session_id: "s1".into(),
            session_seq: 3,
            chain_id: "daemon-a".into(),
            reason: VoidRecord::UNCONFIRMED_AT_SETTLE.into(),
            budget_version: 0,
            budget_before: Money::ZERO,
            budget_after: Money::ZERO,
            revert_version: 0,
        }),
    ));
    events
}

/// The hex digits of the doc's code block tagged `text <tag>`.
fn doc_block(tag: &str) -> String {
    let open = format!("```text {tag}");
    doc()
        .lines()
        .skip_while(|l| l.trim_end() != open)
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect::<Vec<_>>()
        .concat()
        .split_whitespace()
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn version_3_void_is_reproduced_byte_for_byte() {
    let events = v3_events();
    let (stored, _, _) = reproduced(
        "known-answer-v3.log",
        3,
        &events,
        &[4, 1, 7],
        "v3 known answer",
    );
    // The void record, byte for byte, as the doc lists it (hex lines of 32 bytes).
    let (_, last) = *records(3, &stored).last().unwrap();
    assert_eq!(
        doc_block("void-record"),
        hex(last),
        "the doc's void record bytes differ"
    );
    // A void cannot stand in a version-2 file.
    let v2 = build_file_result(2, &events);
    assert!(v2.is_err());
}

/// Version 4: the events of the version-2 file with the shared budget's versions (the
/// opening created the per-agent budget: version 1; the verdict wrote 2, the
/// settlement 3; a human decision writes none), then a void of the session's next
/// change, which had written version 4 and was given back by version 5, before the
/// recovery and the hand-over. Whoever adds to version 4 adds their records here (or
/// their fields to these) and rebuilds the file with `TOLLGATE_BLESS=1`.
fn v4_events() -> Vec<(i64, &'static str, Event)> {
    let mut events = v2_events();
    for (i, (_, _, e)) in events.iter_mut().enumerate() {
        if let Event::Session(s) = e {
            s.set_budget_version(i as u64 + 1);
        }
    }
    let tail = events.split_off(4);
    events.push((
        T0 + 4_000_000,
        "0192f7c8-0004-7000-8000-000000000004",
        Event::Void(VoidRecord {
            timestamp_ns: T0 + 4_000_000,
            session_id: "s1".into(),
            session_seq: 5,
            chain_id: "daemon-a".into(),
            reason: VoidRecord::UNCONFIRMED_AT_SETTLE.into(),
            budget_version: 4,
            budget_before: Money(7_499_000_000),
            budget_after: Money(7_497_000_000),
            revert_version: 5,
        }),
    ));
    for (n, (_, _, e)) in tail.into_iter().enumerate() {
        let n = n as i64 + 5;
        let ids = [
            "0192f7c8-0005-7000-8000-000000000005",
            "0192f7c8-0006-7000-8000-000000000006",
        ];
        events.push((T0 + n * 1_000_000, ids[n as usize - 5], e));
    }
    events
}

#[test]
fn version_4_is_reproduced_byte_for_byte() {
    let (stored, _, seen) = reproduced(
        "known-answer-v4.log",
        4,
        &v4_events(),
        &[4, 1, 5, 6, 7, 3, 2],
        "v4 known answer",
    );
    assert_eq!(u16::from_be_bytes([stored[8], stored[9]]), 4);
    let versions: Vec<u64> = seen
        .iter()
        .map(|e| match &e.event {
            Event::Session(s) => s.budget_version(),
            Event::Void(v) => v.budget_version,
            _ => 0,
        })
        .collect();
    assert_eq!(versions, [1, 2, 3, 0, 4, 0, 0]);
    // The void record, byte for byte, as the doc lists it.
    assert_eq!(doc_block("void-record-v4"), hex(records(4, &stored)[4].1));
    // Read as an older version, the same bytes do not parse: the new fields are there.
    let first = &stored[format::HEADER_LEN..];
    assert!(format::parse_record_version(3, first).is_err());
}

/// Version 5: the first four records of the version-4 file (opened, verdict, settlement,
/// human decision), then the session's end (kind 8), then the recovery and the hand-over.
fn v5_events() -> Vec<(i64, &'static str, Event)> {
    let v4 = v4_events();
    let mut events: Vec<_> = v4.iter().take(4).cloned().collect();
    events.push((
        T0 + 4_000_000,
        "0192f7c8-0004-7000-8000-000000000004",
        Event::Session(SessionEvent::Closed(CloseRecord {
            timestamp_ns: T0 + 4_000_000,
            session_id: "s1".into(),
            agent_id: "a1".into(),
            organization_id: "o1".into(),
            reason: CloseReason::Agent,
            budget_remaining: Money(7_499_000_000),
            session_seq: 5,
        })),
    ));
    events.extend(v4.into_iter().skip(5));
    events
}

#[test]
fn version_5_is_reproduced_byte_for_byte() {
    let (stored, _, _) = reproduced(
        "known-answer-v5.log",
        5,
        &v5_events(),
        &[4, 1, 5, 6, 8, 3, 2],
        "v5 known answer",
    );
    assert_eq!(u16::from_be_bytes([stored[8], stored[9]]), 5);
    // The session-closed record, byte for byte, as the doc lists it.
    let (off, closed) = records(5, &stored)[4];
    assert_eq!(doc_block("closed-record-v5"), hex(closed));
    // Kind 8 does not exist in version 4: the same record is refused there.
    assert!(format::parse_record_version(4, &stored[off..]).is_err());
}

/// Version 6: the policy set in force at start (kind 9), the session opened under it
/// (record 0 of the version-5 file with the set's digest), an ALLOW a permit let through
/// that attaches a flow label, a forbid's DENY that does not trip, a reload (kind 9), and
/// a `@hitl` permit's HITL under the new set.
fn v6_events() -> Vec<(i64, &'static str, Event)> {
    let set_a = format::sha256(b"policy set a");
    let set_b = format::sha256(b"policy set b");
    let v5 = v5_events();
    let ids = [
        "0192f7c8-0000-7000-8000-000000000000",
        "0192f7c8-0001-7000-8000-000000000001",
        "0192f7c8-0002-7000-8000-000000000002",
        "0192f7c8-0003-7000-8000-000000000003",
        "0192f7c8-0004-7000-8000-000000000004",
        "0192f7c8-0005-7000-8000-000000000005",
    ];
    let at = |n: i64| T0 + n * 1_000_000;
    let Event::Session(SessionEvent::Opened(mut opened)) = v5[0].2.clone() else {
        unreachable!()
    };
    opened.timestamp_ns = at(1);
    opened.policy_set = Some(set_a);
    let mut allow = verdict_at(&v5, 1);
    allow.timestamp_ns = at(2);
    allow.tool_name = "read_customer".into();
    allow.policy = Some(PolicyNote {
        set_digest: set_a,
        effect: PolicyEffect::Permit,
        policy_id: Some("reads-customers".into()),
        decided: false,
        tripped: false,
        labels: vec![Label::parse("customer-data").unwrap()],
    });
    let deny = VerdictRecord {
        timestamp_ns: at(3),
        call_number: 2,
        tool_name: "send_email".into(),
        params_hash: format::sha256(br#"{"to":"x@elsewhere.example"}"#),
        verdict: Verdict::Deny,
        deny_reason: Some(DenyReason::PolicyViolation),
        reason: Reason::PolicyDeny,
        budget_before: Money(7_498_500_000),
        budget_after: Money(7_498_500_000),
        nonce: 8,
        session_seq: 3,
        budget_version: 0,
        policy: Some(PolicyNote {
            set_digest: set_a,
            effect: PolicyEffect::Forbid,
            policy_id: Some("no-mail-out-after-customers".into()),
            decided: true,
            tripped: false,
            labels: Vec::new(),
        }),
        ..allow.clone()
    };
    let hold = VerdictRecord {
        timestamp_ns: at(5),
        call_number: 3,
        tool_name: "pay".into(),
        params_hash: format::sha256(br#"{"amount":250.5}"#),
        verdict: Verdict::Hitl,
        deny_reason: None,
        reason: Reason::PolicyHold,
        nonce: 9,
        session_seq: 4,
        policy: Some(PolicyNote {
            set_digest: set_b,
            effect: PolicyEffect::Hitl,
            policy_id: Some("big-pay".into()),
            decided: true,
            tripped: false,
            labels: Vec::new(),
        }),
        ..deny.clone()
    };
    let set = |n: i64, digest, policies, default_deny, trip_on_refusal, cause| {
        Event::PolicySet(PolicySetRecord {
            timestamp_ns: at(n),
            digest,
            policies,
            default_deny,
            trip_on_refusal,
            cause,
            shadow_policies: 0,
            shadow_set: false,
        })
    };
    vec![
        (
            at(0),
            ids[0],
            set(0, set_a, 3, false, false, PolicySetCause::Start),
        ),
        (at(1), ids[1], opened.into()),
        (at(2), ids[2], allow.into()),
        (at(3), ids[3], deny.into()),
        (
            at(4),
            ids[4],
            set(4, set_b, 4, true, true, PolicySetCause::Reload),
        ),
        (at(5), ids[5], hold.into()),
    ]
}

#[test]
fn version_6_is_reproduced_byte_for_byte() {
    let events = v6_events();
    let (stored, _, seen) = reproduced(
        "known-answer-v6.log",
        6,
        &events,
        &[9, 4, 1, 1, 9, 1],
        "v6 known answer",
    );
    assert_eq!(u16::from_be_bytes([stored[8], stored[9]]), 6);
    // The reasons on the wire, from the notes alone.
    let reasons: Vec<Option<String>> = seen
        .iter()
        .filter_map(|e| match &e.event {
            Event::Session(SessionEvent::Verdict(v)) => Some(v.policy.as_ref().unwrap().reason()),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        [
            None,
            Some("policy:no-mail-out-after-customers".to_owned()),
            Some("policy:big-pay".to_owned())
        ]
    );
    // The policy DENY and the reload, byte for byte, as the doc lists them.
    let records = records(6, &stored);
    let record = |i: usize| records[i].1;
    assert_eq!(doc_block("policy-deny-record-v6"), hex(record(3)));
    assert_eq!(doc_block("policy-set-record-v6"), hex(record(4)));
    // Kind 9 does not exist in version 5, and a policy note cannot be written there.
    assert!(format::parse_record_version(5, record(4)).is_err());
    assert!(build_file_result(5, &events[3..4]).is_err());
}

/// Version 7: a set with one `@shadow` policy comes into force (kind 9, 1 shadow
/// policy), a session opens under it, an ALLOW whose shadow forbid would have refused it
/// (params recorded in full), an ALLOW with its params redacted whose shadow agrees, an
/// ALLOW whose params were over the bound (recorded as too large), then a reload into a set
/// in shadow mode (kind 9, every policy in shadow) and an ALLOW that set would have held.
fn v7_events() -> Vec<(i64, &'static str, Event)> {
    let v6 = v6_events();
    let set_a = format::sha256(b"policy set a");
    let set_b = format::sha256(b"policy set b");
    let ids = [
        "0192f7c8-0000-7000-8000-000000000000",
        "0192f7c8-0001-7000-8000-000000000001",
        "0192f7c8-0002-7000-8000-000000000002",
        "0192f7c8-0003-7000-8000-000000000003",
        "0192f7c8-0004-7000-8000-000000000004",
        "0192f7c8-0005-7000-8000-000000000005",
        "0192f7c8-0006-7000-8000-000000000006",
    ];
    let at = |n: i64| T0 + n * 1_000_000;
    let Event::PolicySet(mut start) = v6[0].2.clone() else {
        unreachable!()
    };
    start.shadow_policies = 1;
    let Event::Session(SessionEvent::Opened(opened)) = v6[1].2.clone() else {
        unreachable!()
    };
    let allow = verdict_at(&v6, 2);
    let full = r#"{"customer":"c-17"}"#;
    let first = VerdictRecord {
        params_hash: format::sha256(full.as_bytes()),
        shadow: vec![ShadowNote {
            name: "no-customer-reads".into(),
            verdict: Verdict::Deny,
            reason: "policy:no-customer-reads".into(),
            policy_id: Some("no-customer-reads".into()),
        }],
        params: Some(RecordedParams::Full(full.into())),
        ..allow.clone()
    };
    let redacted = VerdictRecord {
        timestamp_ns: at(3),
        call_number: 2,
        tool_name: "http_get".into(),
        params_hash: format::sha256(
            br#"{"headers":{"authorization":"Bearer abc.def"},"url":"https://x.example"}"#,
        ),
        nonce: 8,
        session_seq: 3,
        budget_version: 3,
        policy: Some(PolicyNote {
            set_digest: set_a,
            effect: PolicyEffect::Pass,
            policy_id: None,
            decided: false,
            tripped: false,
            labels: Vec::new(),
        }),
        shadow: vec![ShadowNote {
            name: "no-customer-reads".into(),
            verdict: Verdict::Allow,
            reason: "within_thresholds".into(),
            policy_id: None,
        }],
        params: Some(RecordedParams::Redacted(
            r#"{"headers":{"authorization":"[REDACTED]"},"url":"https://x.example"}"#.into(),
        )),
        ..first.clone()
    };
    let large = VerdictRecord {
        timestamp_ns: at(4),
        call_number: 3,
        params_hash: format::sha256(b"a large params object"),
        nonce: 9,
        session_seq: 4,
        budget_version: 4,
        params: Some(RecordedParams::TooLarge {
            mode: ParamsMode::Redacted,
            len: 70_000,
        }),
        ..redacted.clone()
    };
    let Event::PolicySet(mut reload) = v6[4].2.clone() else {
        unreachable!()
    };
    reload.timestamp_ns = at(5);
    reload.shadow_policies = 4;
    reload.shadow_set = true;
    let shadow_digest = format::sha256(b"policy set b in shadow");
    reload.digest = shadow_digest;
    let held = VerdictRecord {
        timestamp_ns: at(6),
        call_number: 4,
        tool_name: "pay".into(),
        params_hash: format::sha256(br#"{"amount":250.5}"#),
        nonce: 10,
        session_seq: 5,
        budget_version: 5,
        policy: Some(PolicyNote {
            set_digest: shadow_digest,
            effect: PolicyEffect::Pass,
            policy_id: None,
            decided: false,
            tripped: false,
            labels: Vec::new(),
        }),
        shadow: vec![ShadowNote {
            name: "*".into(),
            verdict: Verdict::Hitl,
            reason: "policy:big-pay".into(),
            policy_id: Some("big-pay".into()),
        }],
        params: None,
        ..redacted.clone()
    };
    let _ = set_b;
    vec![
        (at(0), ids[0], Event::PolicySet(start)),
        (at(1), ids[1], opened.into()),
        (at(2), ids[2], first.into()),
        (at(3), ids[3], redacted.into()),
        (at(4), ids[4], large.into()),
        (at(5), ids[5], Event::PolicySet(reload)),
        (at(6), ids[6], held.into()),
    ]
}

#[test]
fn version_7_is_reproduced_byte_for_byte() {
    let events = v7_events();
    let (stored, _, _) = reproduced(
        "known-answer-v7.log",
        7,
        &events,
        &[9, 4, 1, 1, 1, 9, 1],
        "v7 known answer",
    );
    assert_eq!(u16::from_be_bytes([stored[8], stored[9]]), 7);
    let records = records(7, &stored);
    let record = |i: usize| records[i].1;
    assert_eq!(doc_block("shadow-record-v7"), hex(record(2)));
    assert_eq!(doc_block("redacted-record-v7"), hex(record(3)));
    // The redacted record holds no byte of the secret; the full one hashes to its digest.
    assert!(!record(3).windows(7).any(|w| w == b"abc.def"));
    // Shadow notes, recorded params and shadow counts cannot be written in version 6.
    assert!(build_file_result(6, &events[2..3]).is_err());
    assert!(build_file_result(6, &events[0..1]).is_err());
    let mut plain = events[0].clone();
    if let Event::PolicySet(p) = &mut plain.2 {
        p.shadow_policies = 0;
    }
    assert!(build_file_result(6, &[plain]).is_ok());
}

#[test]
fn version_7_refuses_shadow_notes_and_params_that_do_not_hold() {
    let first = verdict_at(&v7_events(), 2);
    let ok = |v: &VerdictRecord| check_verdict(v, 7);
    assert!(ok(&first).is_ok());
    let with = |f: &dyn Fn(&mut VerdictRecord)| altered(&first, f);
    let note = first.shadow[0].clone();
    // Full params must hash to params_hash (a verifier checks the text it is given).
    assert!(ok(&with(
        &|v| v.params = Some(RecordedParams::Full(r#"{"customer":"c-18"}"#.into()))
    ))
    .is_err());
    // Redacted params need not (the hash is of the true params).
    assert!(ok(&with(
        &|v| v.params = Some(RecordedParams::Redacted("{}".into()))
    ))
    .is_ok());
    // "Too large" only for params over the bound, and never for mode hash.
    let too = |mode, len| Some(RecordedParams::TooLarge { mode, len });
    assert!(ok(&with(&|v| v.params = too(ParamsMode::Full, 16_384))).is_err());
    assert!(ok(&with(&|v| v.params = too(ParamsMode::Full, 16_385))).is_ok());
    assert!(ok(&with(&|v| v.params = too(ParamsMode::Hash, 70_000))).is_err());
    // A shadow note's name, policy and reason.
    let bad = |n: ShadowNote| with(&move |v| v.shadow = vec![n.clone()]);
    assert!(ok(&bad(ShadowNote {
        name: "a b".into(),
        ..note.clone()
    }))
    .is_err());
    assert!(ok(&bad(ShadowNote {
        name: "*".into(),
        ..note.clone()
    }))
    .is_ok());
    assert!(ok(&bad(ShadowNote {
        reason: "nonsense".into(),
        ..note.clone()
    }))
    .is_err());
    assert!(ok(&bad(ShadowNote {
        reason: "policy_deny".into(),
        ..note.clone()
    }))
    .is_err());
    assert!(ok(&bad(ShadowNote {
        verdict: Verdict::Allow,
        ..note.clone()
    }))
    .is_err());
    assert!(ok(&bad(ShadowNote {
        policy_id: Some("".into()),
        ..note.clone()
    }))
    .is_err());
    // The same candidate twice, more than 16 notes, notes without a policy note.
    assert!(ok(&with(&|v| v.shadow = vec![note.clone(), note.clone()])).is_err());
    let many: Vec<ShadowNote> = (0..17)
        .map(|i| ShadowNote {
            name: format!("p{i}"),
            ..note.clone()
        })
        .collect();
    assert!(ok(&with(&|v| v.shadow = many.clone())).is_err());
    assert!(ok(&with(&|v| v.policy = None)).is_err());
    // A policy-set entry's shadow counts.
    let Event::PolicySet(set) = v7_events()[5].2.clone() else {
        unreachable!()
    };
    let ok_set = |p: &PolicySetRecord| format::check_event(&Event::PolicySet(p.clone()), 7);
    assert!(ok_set(&set).is_ok());
    assert!(ok_set(&PolicySetRecord {
        shadow_policies: 3,
        ..set.clone()
    })
    .is_err());
    assert!(ok_set(&PolicySetRecord {
        shadow_policies: 5,
        shadow_set: false,
        ..set.clone()
    })
    .is_err());
}

/// Version 8: the version-7 file's first three records, the ALLOW naming the upstream it
/// called and the draw it was decided with, then a probabilistic DENY with its draw (the
/// local upstream).
fn v8_events() -> Vec<(i64, &'static str, Event)> {
    let v7 = v7_events();
    let at = |n: i64| T0 + n * 1_000_000;
    let allow = verdict_at(&v7, 2);
    let allow = VerdictRecord {
        upstream: Some("kit".into()),
        draw: Draw::new(0.25),
        ..allow
    };
    let deny = VerdictRecord {
        timestamp_ns: at(3),
        call_number: 2,
        tool_name: "search".into(),
        params_hash: format::sha256(br#"{"q":"tolls"}"#),
        verdict: Verdict::Deny,
        deny_reason: Some(DenyReason::BudgetExhausted),
        reason: Reason::BudgetExhausted,
        probabilistic: true,
        budget_after: allow.budget_after,
        budget_before: allow.budget_after,
        nonce: 8,
        session_seq: 3,
        budget_version: 0,
        policy: Some(PolicyNote {
            set_digest: format::sha256(b"policy set a"),
            effect: PolicyEffect::Pass,
            policy_id: None,
            decided: false,
            tripped: false,
            labels: Vec::new(),
        }),
        shadow: Vec::new(),
        params: None,
        upstream: None,
        draw: Draw::new(0.0625),
        ..allow.clone()
    };
    vec![
        v7[0].clone(),
        v7[1].clone(),
        (at(2), v7[2].1, allow.into()),
        (at(3), "0192f7c8-0003-7000-8000-000000000003", deny.into()),
    ]
}

#[test]
fn version_8_is_reproduced_byte_for_byte() {
    let events = v8_events();
    let (stored, _, _) = reproduced(
        "known-answer-v8.log",
        8,
        &events,
        &[9, 4, 1, 1],
        "v8 known answer",
    );
    assert_eq!(u16::from_be_bytes([stored[8], stored[9]]), 8);
    let records = records(8, &stored);
    assert_eq!(doc_block("upstream-record-v8"), hex(records[2].1));
    // The records of versions 1 to 7 read as before: no upstream, no draw; the version-7
    // records of this file's first three are those of the version-7 file, but for what
    // version 8 appends.
    let v7 = std::fs::read(data_path("known-answer-v7.log")).unwrap();
    let (r, _) = format::parse_record_version(7, &v7[records[2].0..]).unwrap();
    let Event::Session(SessionEvent::Verdict(old)) = r.entry.event else {
        unreachable!()
    };
    assert_eq!((old.upstream, old.draw), (None, None));
    // An upstream or a draw cannot be written in version 7.
    assert!(build_file_result(7, &events[2..3]).is_err());
    assert!(build_file_result(7, &events[3..4]).is_err());
    assert!(build_file_result(7, &events[..2]).is_ok());
}

#[test]
fn version_8_refuses_upstreams_and_draws_that_do_not_hold() {
    let first = verdict_at(&v8_events(), 2);
    let ok = |v: &VerdictRecord| check_verdict(v, 8);
    assert!(ok(&first).is_ok());
    let with = |f: &dyn Fn(&mut VerdictRecord)| altered(&first, f);
    // The local upstream is written as none; a name no resource can have is refused.
    for bad in ["", "local", "a\nb", &"u".repeat(257)] {
        assert!(
            ok(&with(&|v| v.upstream = Some(bad.to_owned()))).is_err(),
            "{bad:?}"
        );
    }
    assert!(ok(&with(&|v| v.upstream = Some("u".repeat(256)))).is_ok());
    assert!(ok(&with(&|v| v.upstream = None)).is_ok());
    // A draw is in [0, 1): Draw refuses the rest, and so does the reader.
    for bad in [1.0, -0.0, -0.5, f64::NAN, f64::INFINITY] {
        assert_eq!(Draw::new(bad), None, "{bad}");
    }
    assert!(Draw::new(0.0).is_some() && Draw::new(1.0 - f64::EPSILON / 2.0).is_some());
    let events = v8_events();
    let mut bytes = build_file(8, &events);
    // The last record ends with its draw's 8 bytes, prev_hash (32) and signature (64):
    // make the draw 1.0 and the reader refuses it as malformed (before the signature).
    let end = bytes.len() - 96;
    bytes[end - 8..end].copy_from_slice(&1.0f64.to_bits().to_be_bytes());
    let off = format::HEADER_LEN
        + (0..3).fold(0, |acc, _| {
            acc + format::parse_record_version(8, &bytes[format::HEADER_LEN + acc..])
                .unwrap()
                .1
        });
    let parsed = format::parse_record_version(8, &bytes[off..]);
    assert!(
        format!("{parsed:?}").contains("draw"),
        "a draw of 1.0 is read: {parsed:?}"
    );
}

#[test]
fn version_6_refuses_policy_notes_that_disagree_with_their_verdict() {
    let deny = verdict_at(&v6_events(), 3);
    let ok = |v: &VerdictRecord| check_verdict(v, 6);
    assert!(ok(&deny).is_ok());
    let note = deny.policy.clone().unwrap();
    let with = |f: &dyn Fn(&mut VerdictRecord)| altered(&deny, f);
    // A policy reason without a note, and a note whose verdict is not its effect's.
    assert!(ok(&with(&|v| v.policy = None)).is_err());
    assert!(ok(&with(&|v| v.verdict = Verdict::Allow)).is_err());
    assert!(ok(&with(&|v| v.reason = Reason::BudgetOverrun)).is_err());
    // A forbid names its policy; the default deny names none.
    assert!(ok(&with(&|v| v.policy = Some(PolicyNote {
        policy_id: None,
        ..note.clone()
    })))
    .is_err());
    assert!(ok(&with(&|v| {
        v.policy = Some(PolicyNote {
            effect: PolicyEffect::DefaultDeny,
            ..note.clone()
        })
    }))
    .is_err());
    // Labels only on an ALLOW; tripped only on a policy DENY.
    let label = Label::parse("pii").unwrap();
    assert!(ok(&with(&|v| {
        v.policy = Some(PolicyNote {
            labels: vec![label.clone()],
            ..note.clone()
        })
    }))
    .is_err());
    assert!(ok(&with(&|v| {
        v.policy = Some(PolicyNote {
            tripped: true,
            ..note.clone()
        })
    }))
    .is_ok());
    assert!(ok(&with(&|v| {
        v.policy = Some(PolicyNote {
            tripped: true,
            decided: false,
            effect: PolicyEffect::Permit,
            ..note.clone()
        });
        v.reason = Reason::WithinThresholds;
        v.verdict = Verdict::Allow;
        v.deny_reason = None;
    }))
    .is_err());
    // Labels out of order.
    let allow = verdict_at(&v6_events(), 2);
    let mut two = allow.clone();
    two.policy.as_mut().unwrap().labels =
        vec![Label::parse("b").unwrap(), Label::parse("a").unwrap()];
    assert!(ok(&two).is_err());
    assert!(ok(&allow).is_ok());
}

#[test]
fn version_5_refuses_a_close_that_is_a_sessions_first_entry() {
    let close = Event::Session(SessionEvent::Closed(CloseRecord {
        timestamp_ns: T0,
        session_id: "s1".into(),
        agent_id: "a".into(),
        organization_id: "o".into(),
        reason: CloseReason::Idle,
        budget_remaining: Money::ZERO,
        session_seq: 1,
    }));
    assert!(format::check_event(&close, 5).is_err());
}

#[test]
fn version_4_refuses_a_void_whose_budget_fields_disagree() {
    let void = |budget_version, before, revert_version| {
        Event::Void(VoidRecord {
            timestamp_ns: T0,
            session_id: "s1".into(),
            session_seq: 2,
            chain_id: "daemon-a".into(),
            reason: VoidRecord::UNCONFIRMED_AT_SETTLE.into(),
            budget_version,
            budget_before: Money(before),
            budget_after: Money::ZERO,
            revert_version,
        })
    };
    let one = |e: Event| build_file_result(4, &[(T0, "0192f7c8-0000-7000-8000-000000000000", e)]);
    assert!(one(void(3, 10, 4)).is_ok());
    assert!(one(void(3, 10, 0)).is_ok(), "nothing to give back");
    assert!(
        one(void(3, 10, 3)).is_err(),
        "revert before the voided write"
    );
    assert!(one(void(0, 10, 0)).is_err(), "amounts without a version");
    assert!(one(void(0, 0, 4)).is_err(), "a revert without a version");
    // Older versions carry none of it: written as version 3, the fields are dropped.
    let v3 = build_file(
        3,
        &[(T0, "0192f7c8-0000-7000-8000-000000000000", void(3, 10, 4))],
    );
    let (r, _) = format::parse_record_version(3, &v3[format::HEADER_LEN..]).unwrap();
    assert_eq!(r.entry.event, void(0, 0, 0));
}

fn build_file_result(
    version: u16,
    events: &[(i64, &str, Event)],
) -> Result<(), format::EncodeError> {
    let k = SigningKey::from_bytes(&[1u8; 32]);
    let kid = KeyId::of(k.verifying_key().as_bytes());
    let prev = format::genesis_hash();
    for (i, (ts, id, ev)) in events.iter().enumerate() {
        format::encode_record_version(
            version,
            Position {
                index: i as u64,
                timestamp_ns: *ts,
                entry_id: Uuid::parse_str(id).unwrap(),
                prev_hash: &prev,
            },
            ev,
            &k,
            kid,
        )?;
    }
    Ok(())
}

#[test]
fn version_1_file_is_still_reproduced_and_verified() {
    let stored = check_stored("known-answer-v1.log", &build_v1());
    let (s, seen) = verified("known-answer-v1.log", &stored);
    assert_eq!(s.entries, 3);
    assert_eq!(s.key_id, KeyId::of(key(2).verifying_key().as_bytes()));
    assert_eq!(u16::from_be_bytes([stored[8], stored[9]]), 1);
    // A version-1 verdict has no session_seq: it reads as 0.
    match &seen[0].event {
        Event::Session(SessionEvent::Verdict(v)) => assert_eq!(v.session_seq, 0),
        other => panic!("{other:?}"),
    }
    assert_documented(&stored, "v1 known answer");
}

#[test]
fn reason_strings_are_documented() {
    // The doc's list of reason strings is the code's, in the same order.
    let d = doc();
    let start = d.find("##### Reason strings").unwrap();
    let end = start + d[start..].find("These are SP/1.0.1").unwrap();
    let listed: Vec<&str> = d[start..end].split('`').skip(1).step_by(2).collect();
    let code: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(listed, code);
}

#[test]
fn record_hashes_are_documented() {
    let d = doc();
    for name in [
        "known-answer.log",
        "known-answer-v1.log",
        "known-answer-v3.log",
        "known-answer-v4.log",
        "known-answer-v5.log",
        "known-answer-v6.log",
        "known-answer-v7.log",
        "known-answer-v8.log",
    ] {
        let bytes = std::fs::read(data_path(name)).unwrap();
        let version = u16::from_be_bytes([bytes[8], bytes[9]]);
        let mut off = format::HEADER_LEN;
        while off < bytes.len() {
            let (_, n) = format::parse_record_version(version, &bytes[off..]).unwrap();
            let h = format::sha256(&bytes[off..off + n]).to_string();
            assert!(
                d.contains(&h),
                "docs lack record hash {h} of {name} at {off}"
            );
            off += n;
        }
    }
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
