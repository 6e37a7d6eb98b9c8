//! The board gate's data-driven tests: every fixture under tests/data/board/, rule coverage,
//! the digest, and property tests that no input panics the gate.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use tollgate_board::{check, check_with, digest, Catalog, Limits, Report, RuleId};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/board")
}

fn fixtures(kind: &str) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(data().join(kind))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            (
                p.file_stem().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no {kind} fixtures");
    out
}

/// The rule an invalid fixture is named after: the stem up to an optional `--variant`.
fn rule_of(stem: &str) -> RuleId {
    let id = stem.split("--").next().unwrap();
    RuleId::from_id(id).unwrap_or_else(|| panic!("fixture `{stem}` is not named after a rule id"))
}

/// Fixtures that cannot report their own rule alone: the ids each one must also report, and
/// the rule text that makes them unavoidable. Every other invalid fixture reports exactly its
/// own rule id; a fixture listed here reports exactly its own id plus these (an id said to be
/// unavoidable that stops being reported is as much a change as a new one).
const ALSO: &[(&str, &[&str], &str)] = &[
    (
        "DR-CHALLENGE-REQUIRED",
        &["DR-DESIGNATED-CHALLENGER"],
        "a required challenge that is missing is also a missing designated challenge",
    ),
    (
        "DRC-PRINCIPAL-SOURCE",
        &["HO-AGENT-NO-APPROVAL", "DRC-DECIDER-IS-SENDER"],
        "decision-record.md: approval_state is approved or rejected on a record \
         (DRC-APPROVAL-STATE), which handoff-envelope.md forbids an agent to write; and \
         decided_by is a principal (contract), so it is never an agent sender \
         (DRC-DECIDER-IS-SENDER holds for every record, whoever sent it)",
    ),
    (
        "DRC-DECIDER-IS-SENDER--agent-sender",
        &["DRC-PRINCIPAL-SOURCE", "DRC-APPROVAL-STATE"],
        "decided_by is a principal, so a record whose decider is not its sender because an \
         agent sent it is also agent-sourced; an agent record either writes approved or \
         rejected (HO-AGENT-NO-APPROVAL) or does not (DRC-APPROVAL-STATE); this one does not",
    ),
    (
        "DR-HARD-GATE",
        &["DR-NO-APPROVE-OVER-DISSENT"],
        "decision-record.md: DR-NO-APPROVE-OVER-DISSENT blocks approve over any open challenge \
         and conditional-approve over an open HARD gate, exactly what DR-HARD-GATE forbids",
    ),
    (
        "DR-NO-APPROVE-OVER-DISSENT--conditional-over-hard-gate",
        &["DR-HARD-GATE"],
        "decision-record.md: a conditional-approve over an open HARD gate is blocked by both",
    ),
    // Readings that hold for an envelope without its payload: the envelope is still of its
    // message_type, and the missing payload is the HO-PAYLOAD-* rule's own finding
    // (handoff-envelope.md: every type but delegate carries its payload).
    (
        "DR-TO-PRINCIPAL--without-payload",
        &["HO-PAYLOAD-DECISION-REQUEST"],
        "the request under test has no decision_request",
    ),
    (
        "DR-OWNER-FROM-ROOT--without-payload",
        &["HO-PAYLOAD-DECISION-REQUEST"],
        "the request under test has no decision_request",
    ),
    (
        "DR-RISK-CARRIED--without-payload",
        &["HO-PAYLOAD-DECISION-REQUEST"],
        "the request under test has no decision_request",
    ),
    (
        "STOP-TERMINAL--decided-stopped-request-without-payload",
        &["HO-PAYLOAD-DECISION-REQUEST"],
        "the request under test has no decision_request",
    ),
    (
        "DR-UNRESOLVED-DISSENT--challenge-without-payload",
        &["HO-PAYLOAD-CHALLENGE"],
        "the attached challenge under test has no challenge payload",
    ),
    (
        "DRC-PRINCIPAL-SOURCE--without-payload",
        &["HO-PAYLOAD-DECISION-RECORD"],
        "the record under test has no decision_record",
    ),
    (
        "DRC-COMPLETED--without-payload",
        &["HO-PAYLOAD-DECISION-RECORD"],
        "the record under test has no decision_record",
    ),
    // Readings that hold for an envelope carrying another type's payload: the payload does
    // not change its message_type, and carrying it is HO-PAYLOAD-EXCLUSIVE's own finding.
    (
        "DR-CHALLENGE-RESOLVES--not-a-challenge",
        &["HO-PAYLOAD-EXCLUSIVE"],
        "the attached return carries a challenge payload",
    ),
    (
        "DR-ONE-REQUEST--supersedes-not-a-request",
        &["HO-PAYLOAD-EXCLUSIVE"],
        "the superseded delegate carries a decision_request payload",
    ),
    (
        "DRC-CO-SIGN-BINDING--not-a-record",
        &["HO-PAYLOAD-EXCLUSIVE"],
        "the co-signed delegate carries a decision_record payload",
    ),
];

fn ids(report: &Report) -> BTreeSet<&'static str> {
    report.findings.iter().map(|f| f.rule.as_str()).collect()
}

fn show(report: &Report) -> String {
    report
        .findings
        .iter()
        .map(|f| {
            format!(
                "{}\t{}\t{}",
                f.rule,
                f.task_id.as_deref().unwrap_or("-"),
                f.message
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_valid_fixture_is_clean() {
    let catalog = Catalog::default();
    for (name, bytes) in fixtures("valid") {
        let report = check(&bytes, &catalog);
        assert!(report.is_clean(), "{name}:\n{}", show(&report));
    }
}

#[test]
fn every_invalid_fixture_reports_its_own_rule_and_only_that() {
    let catalog = Catalog::default();
    let mut failures = Vec::new();
    for (name, bytes) in fixtures("invalid") {
        let rule = rule_of(&name);
        let report = check(&bytes, &catalog);
        let got = ids(&report);
        let mut expected: BTreeSet<&str> = BTreeSet::from([rule.as_str()]);
        for (r, also, _) in ALSO {
            if *r == name.as_str() {
                expected.extend(also.iter().copied());
            }
        }
        if got != expected {
            failures.push(format!("{name}: expected {expected:?}\n{}", show(&report)));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn every_documented_pair_names_an_invalid_fixture() {
    let names: BTreeSet<String> = fixtures("invalid").into_iter().map(|(n, _)| n).collect();
    for (name, also, why) in ALSO {
        assert!(names.contains(*name), "ALSO names no fixture `{name}`");
        assert!(!also.is_empty() && !why.is_empty(), "{name}");
    }
}

#[test]
fn every_rule_id_has_an_invalid_fixture() {
    let covered: BTreeSet<RuleId> = fixtures("invalid")
        .iter()
        .map(|(n, _)| rule_of(n))
        .collect();
    let missing: Vec<&str> = RuleId::ALL
        .iter()
        .filter(|r| !covered.contains(r))
        .map(|r| r.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "rules without an invalid fixture: {missing:?}"
    );
    assert_eq!(RuleId::ALL.len(), 77);
}

#[test]
fn findings_name_task_ids_from_the_record_set_and_are_sorted() {
    let catalog = Catalog::default();
    for (name, bytes) in fixtures("invalid") {
        let report = check(&bytes, &catalog);
        let text = String::from_utf8_lossy(&bytes);
        for f in &report.findings {
            if let Some(t) = &f.task_id {
                assert!(
                    text.contains(&format!("\"{}\"", t.escape_debug())),
                    "{name}: {t}"
                );
            }
        }
        let keys: Vec<(&str, Option<&String>)> = report
            .findings
            .iter()
            .map(|f| (f.rule.as_str(), f.task_id.as_ref()))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted, "{name}");
    }
}

#[test]
fn several_violations_are_all_reported() {
    // Three independent defects in one envelope: all three are reported.
    let (_, bytes) = fixtures("valid")
        .into_iter()
        .find(|(n, _)| n == "v01-delegate-example")
        .unwrap();
    let text = String::from_utf8(bytes)
        .unwrap()
        .replace("\"not-required\"", "\"approved\"")
        .replace("\"challenge\",", "\"challenge\", \"deploy\",")
        .replace("\"dispatched\"", "\"stopped\"");
    let report = check(text.as_bytes(), &Catalog::default());
    let got = ids(&report);
    for want in [
        "HO-APPROVAL-ONLY-ON-RECORD",
        "HO-NO-EXECUTION",
        "HO-STOPPED-HAS-REASON",
    ] {
        assert!(got.contains(want), "{want} missing:\n{}", show(&report));
    }
    assert!(report
        .findings
        .iter()
        .all(|f| f.task_id.as_deref() == Some("ex-delegate-1")));
}

#[test]
fn trailing_newline_task_id_is_a_schema_violation() {
    let (_, bytes) = fixtures("valid")
        .into_iter()
        .find(|(n, _)| n == "v01-delegate-example")
        .unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let bad = text.replace("\"ex-delegate-1\"", "\"abc\\n\"");
    let report = check(bad.as_bytes(), &Catalog::default());
    assert_eq!(
        ids(&report),
        BTreeSet::from(["HO-SCHEMA"]),
        "{}",
        show(&report)
    );
    assert!(report.findings[0].message.contains("/messages/0/task_id"));
    let good = text.replace("\"ex-delegate-1\"", "\"abc\"");
    assert!(check(good.as_bytes(), &Catalog::default()).is_clean());
}

#[test]
fn digest_matches_python_and_binds_the_valid_records() {
    let env = std::fs::read(data().join("envelope-digest.json")).unwrap();
    let expected = std::fs::read_to_string(data().join("envelope-digest.expected")).unwrap();
    assert_eq!(digest(&env).unwrap(), expected.trim());
    // Pretty-printing differences do not change the digest; content changes do.
    let compact: String = String::from_utf8(env.clone())
        .unwrap()
        .lines()
        .map(str::trim)
        .collect();
    assert_eq!(digest(compact.as_bytes()).unwrap(), expected.trim());
    let edited = String::from_utf8(env)
        .unwrap()
        .replace("read-only tool list", "read-write tool list");
    assert_ne!(digest(edited.as_bytes()).unwrap(), expected.trim());
    assert!(digest(b"[1]").is_err());
    assert!(digest(b"{\"a\": 1e400}").is_err());
}

#[test]
fn a_custom_catalog_changes_destination_tier() {
    let (_, bytes) = fixtures("valid")
        .into_iter()
        .find(|(n, _)| n == "v01-delegate-example")
        .unwrap();
    let catalog = Catalog::from_json(
        br#"[{"id": "agentic-system-architecture-review-agent", "execution_tier": "sandbox-mutating"}]"#,
    )
    .unwrap();
    let report = check(&bytes, &catalog);
    assert_eq!(ids(&report), BTreeSet::from(["HO-DESTINATION-TIER"]));
    assert!(Catalog::from_json(b"{}").is_err());
    assert!(Catalog::from_json(br#"[{"id": "x-agent", "execution_tier": "root"}]"#).is_err());
}

#[test]
fn size_and_count_bounds_are_schema_violations() {
    let (_, bytes) = fixtures("valid")
        .into_iter()
        .find(|(n, _)| n == "v02-r2-architecture-decision")
        .unwrap();
    let catalog = Catalog::default();
    let small = Limits {
        max_bytes: bytes.len() - 1,
        max_messages: 100,
    };
    let report = check_with(&bytes, &catalog, small);
    assert_eq!(ids(&report), BTreeSet::from(["HO-SCHEMA"]));
    assert!(
        report.findings[0].message.contains("over the limit"),
        "{}",
        show(&report)
    );
    let few = Limits {
        max_bytes: bytes.len(),
        max_messages: 3,
    };
    let report = check_with(&bytes, &catalog, few);
    assert_eq!(ids(&report), BTreeSet::from(["HO-SCHEMA"]));
    assert!(
        report.findings[0].message.contains("messages"),
        "{}",
        show(&report)
    );
    assert!(check_with(
        &bytes,
        &catalog,
        Limits {
            max_bytes: bytes.len(),
            max_messages: 7
        }
    )
    .is_clean());
}

fn all_fixture_bytes() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = fixtures("valid").into_iter().map(|(_, b)| b).collect();
    v.extend(fixtures("invalid").into_iter().map(|(_, b)| b));
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = check(&bytes, &Catalog::default());
        let _ = digest(&bytes);
    }

    #[test]
    fn mutated_fixtures_never_panic(
        which in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let all = all_fixture_bytes();
        let mut bytes = which.get(&all).clone();
        for (at, b) in edits {
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
        }
        let _ = check(&bytes, &Catalog::default());
    }

    #[test]
    fn spliced_field_values_never_panic(
        which in any::<prop::sample::Index>(),
        from in any::<prop::sample::Index>(),
        to in any::<prop::sample::Index>(),
    ) {
        // Swap one JSON string value for another from the same file: keeps the JSON valid,
        // so the semantic rules (not just the parser) see odd but well-formed input.
        let all = all_fixture_bytes();
        let text = String::from_utf8_lossy(which.get(&all).as_slice()).into_owned();
        let values: Vec<&str> = text.split('"').collect();
        if values.len() > 4 {
            let a = from.index(values.len() / 2) * 2 + 1;
            let b = to.index(values.len() / 2) * 2 + 1;
            if a < values.len() && b < values.len() {
                let mut parts: Vec<String> = values.iter().map(|s| (*s).to_owned()).collect();
                parts[a] = values[b].to_owned();
                let _ = check(parts.join("\"").as_bytes(), &Catalog::default());
            }
        }
    }
}
