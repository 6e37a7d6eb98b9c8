//! The published SP/1.0 vectors, and that the runner really checks what it claims to.

use tollgate_core::json::{self, Value};
use tollgate_core::vectors::{prepare_file, run_file, Outcome};

const SP10: &[u8] = include_bytes!("../../../../tests/data/sp1/conformance.json");
const SP101: &[u8] = include_bytes!("../../../../tests/data/sp1/conformance-1.0.1.json");

fn failures(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(ToString::to_string)
        .collect()
}

/// Tollgate's own vectors (tests/data/sp1-tollgate/README.md), in the published format.
const OWN: &[(&str, &[u8], usize)] = &[
    (
        "transition-modify-terminal.json",
        include_bytes!("../../../../tests/data/sp1-tollgate/transition-modify-terminal.json"),
        23,
    ),
    (
        "opaque-context.json",
        include_bytes!("../../../../tests/data/sp1-tollgate/opaque-context.json"),
        25,
    ),
    (
        "parallel-holds.json",
        include_bytes!("../../../../tests/data/sp1-tollgate/parallel-holds.json"),
        13,
    ),
];

#[test]
fn all_own_vectors_pass_with_their_seals() {
    for (file, bytes, count) in OWN {
        let out = run_file(bytes).unwrap();
        assert_eq!(out.len(), *count, "{file}");
        assert!(failures(&out).is_empty(), "{file}: {:#?}", failures(&out));
        // Every one is sealed, so an edit to an expectation cannot pass unnoticed.
        let doc = json::parse(bytes, json::Limits::default()).unwrap();
        let items = doc.get("fixtures").and_then(Value::as_array).unwrap();
        for v in items {
            assert!(v.get("canonical_hash").is_some() && v.get("vector_hash").is_some());
        }
    }
}

#[test]
fn prepared_vectors_decide_as_they_are_checked() {
    let items = prepare_file(SP101).unwrap();
    assert_eq!(items.len(), 14);
    for item in &items {
        let p = item.as_ref().unwrap();
        let outcome = p.check();
        assert!(outcome.passed(), "{outcome}");
        assert_eq!(outcome.got, Some(p.decide()));
        assert_eq!(outcome.name, p.vector().name);
    }
    // An unreadable vector is its failed outcome, in place; the file still prepares.
    let items = prepare_file(br#"[{"name":"x"}, 3]"#).unwrap();
    let bad: Vec<String> = items
        .iter()
        .map(|i| i.as_ref().unwrap_err().to_string())
        .collect();
    assert_eq!(
        bad,
        vec![
            "FAIL x: invalid vector: `config`: expected an object, found null",
            "FAIL #1: invalid vector: ``: expected an object, found integer",
        ]
    );
}

#[test]
fn all_29_published_vectors_pass() {
    let a = run_file(SP10).unwrap();
    let b = run_file(SP101).unwrap();
    assert_eq!(a.len(), 15);
    assert_eq!(b.len(), 14);
    let mut bad = failures(&a);
    bad.extend(failures(&b));
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Edit one vector of the published file with `f`, run the file, return that outcome.
fn run_edited(
    name: &str,
    f: impl FnOnce(&mut std::collections::BTreeMap<String, Value>),
) -> Outcome {
    let mut doc = json::parse(SP10, json::Limits::default()).unwrap();
    let Value::Object(top) = &mut doc else {
        panic!()
    };
    let Some(Value::Array(items)) = top.get_mut("fixtures") else {
        panic!()
    };
    let v = items
        .iter_mut()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(name))
        .unwrap();
    let Value::Object(m) = v else { panic!() };
    f(m);
    let bytes = json::to_canonical_vec(&doc).unwrap();
    run_file(&bytes)
        .unwrap()
        .into_iter()
        .find(|o| o.name == name)
        .unwrap()
}

#[test]
fn an_edited_expectation_breaks_the_vector_seal() {
    let o = run_edited("deny_circuit_open", |m| {
        m.insert("expected_verdict".into(), Value::from("ALLOW"));
        m.insert("expected_reason".into(), Value::from("within_thresholds"));
    });
    assert!(!o.passed());
    assert!(
        o.problems
            .iter()
            .any(|p| p.starts_with("vector_hash mismatch")),
        "{o}"
    );
    assert!(
        o.problems
            .iter()
            .any(|p| p == "expected ALLOW within_thresholds, got DENY circuit_open"),
        "{o}"
    );
}

#[test]
fn edited_params_break_the_canonical_hash() {
    let o = run_edited("allow_within_thresholds", |m| {
        let Some(Value::Object(call)) = m.get_mut("call") else {
            panic!()
        };
        call.insert(
            "params".into(),
            json::parse_str(r#"{"tool":"click","target":"x"}"#).unwrap(),
        );
        m.remove("vector_hash");
    });
    assert_eq!(o.problems.len(), 1, "{o}");
    assert!(o.problems[0].starts_with("canonical_hash mismatch"), "{o}");
}

#[test]
fn a_wrong_expectation_without_seals_fails_with_the_documented_line() {
    let o = run_edited("hitl_always", |m| {
        m.remove("vector_hash");
        m.insert("expected_verdict".into(), Value::from("DENY"));
    });
    assert_eq!(
        o.to_string(),
        "FAIL hitl_always: expected DENY hitl_all_calls, got HITL hitl_all_calls"
    );
}

#[test]
fn unknown_fields_and_bad_values_are_reported_not_ignored() {
    let o = run_edited("hitl_always", |m| {
        let Some(Value::Object(cfg)) = m.get_mut("config") else {
            panic!()
        };
        cfg.insert("hitl_mod".into(), Value::from("never"));
    });
    assert_eq!(
        o.problems,
        vec!["invalid vector: `config.hitl_mod`: unknown field"]
    );
    let o = run_edited("hitl_always", |m| {
        let Some(Value::Object(cfg)) = m.get_mut("config") else {
            panic!()
        };
        cfg.insert("hitl_mode".into(), Value::from("sometimes"));
    });
    assert_eq!(
        o.problems,
        vec!["invalid vector: `config.hitl_mode`: unknown hitl_mode `sometimes`"]
    );
}

#[test]
fn files_of_the_wrong_shape_are_errors() {
    assert!(run_file(b"{\"fixtures\": 3}").is_err());
    assert!(run_file(b"{\"vectors\": []}").is_err());
    assert!(run_file(b"42").is_err());
    assert!(run_file(b"[").is_err());
    assert_eq!(run_file(b"[]").unwrap().len(), 0);
    // A bare array of vectors is accepted; a broken vector fails alone.
    let out = run_file(br#"[{"name":"x"}, 3]"#).unwrap();
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|o| !o.passed()));
    assert_eq!(out[1].name, "#1");
}

#[test]
fn extension_vectors_use_now_and_rng() {
    let text = r#"[{"name":"window","config":{"window_duration_s":60,"window_max_calls":2},
        "state":{"window_start_ns":1000000000,"window_counts":{"t":2}},
        "call":{"tool_name":"t","params":{}},"now_ns":2000000000,
        "expected_verdict":"DENY","expected_reason":"window_exceeded"},
      {"name":"window_restarted","config":{"window_duration_s":60,"window_max_calls":2},
        "state":{"window_start_ns":1000000000,"window_counts":{"t":2}},
        "call":{"tool_name":"t","params":{}},"now_ns":61000000000,
        "expected_verdict":"ALLOW","expected_reason":"within_thresholds"},
      {"name":"jitter","config":{"budget_usd":1,"probabilistic_deny":true,"deny_jitter_ratio":1.0},
        "state":{"budget_remaining_usd":0.1},"call":{"tool_name":"t","params":{}},"rng":0.5,
        "expected_verdict":"DENY","expected_reason":"budget_exhausted"}]"#;
    let out = run_file(text.as_bytes()).unwrap();
    assert!(failures(&out).is_empty(), "{:#?}", failures(&out));
    assert!(out[2].got.unwrap().probabilistic);
}

#[test]
fn canonical_writer_matches_cpython_on_generated_documents() {
    // tools/gen-canonical-fixture.py wrote both files with CPython's json module.
    let input = include_bytes!("../../../../tests/data/canonical/input.json");
    let expected = include_bytes!("../../../../tests/data/canonical/expected.json");
    let v = json::parse(input, json::Limits::default()).unwrap();
    let got = json::to_canonical_vec(&v).unwrap();
    if got != expected {
        let at = got
            .iter()
            .zip(expected.iter())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        let lo = at.saturating_sub(40);
        panic!(
            "differs at byte {at}: got {:?}, want {:?}",
            String::from_utf8_lossy(&got[lo..(at + 40).min(got.len())]),
            String::from_utf8_lossy(&expected[lo..(at + 40).min(expected.len())])
        );
    }
}
