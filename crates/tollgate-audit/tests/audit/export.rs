//! Export for auditors: filters, JSON Lines, CSV.

use tollgate_audit::export::{self, Filter, COLUMNS};
use tollgate_core::json;
use tollgate_core::Verdict;

use crate::common::*;

fn entries() -> Vec<tollgate_audit::AuditEntry> {
    let dir = tempfile::tempdir().unwrap();
    write_log(fast(config(dir.path())), &key(1), 12);
    verify_dir(dir.path(), &opts(&key(1))).unwrap().1
}

#[test]
fn filters_select_by_session_time_and_verdict() {
    let all = entries();
    let pick = |f: &Filter| -> Vec<u64> {
        all.iter()
            .filter(|e| f.matches(e))
            .map(|e| e.index)
            .collect()
    };
    assert_eq!(pick(&Filter::default()).len(), 12);
    let by_session = Filter {
        session: Some("sess-1".into()),
        ..Filter::default()
    };
    assert_eq!(pick(&by_session), [1, 5, 9]);
    let denies = Filter {
        verdict: Some(Verdict::Deny),
        ..Filter::default()
    };
    assert_eq!(pick(&denies), [1, 4, 7, 10]);
    // Timestamps are NOON + i ms: since is inclusive, until exclusive.
    let window = Filter {
        since_ns: Some(NOON + 3_000_000),
        until_ns: Some(NOON + 6_000_000),
        ..Filter::default()
    };
    assert_eq!(pick(&window), [3, 4, 5]);
}

#[test]
fn json_lines_are_json_with_every_column() {
    for e in entries() {
        let line = export::to_json_line(&e, None);
        let v = json::parse_str(&line).unwrap();
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), COLUMNS.len());
        assert_eq!(obj["index"].as_u64(), Some(e.index));
        assert_eq!(obj["kind"].as_str(), Some("verdict"));
        assert_eq!(
            obj["entry_id"].as_str(),
            Some(e.entry_id.to_string().as_str())
        );
        assert!(obj["time"]
            .as_str()
            .unwrap()
            .starts_with("2026-11-30T12:00:00."));
    }
    let e = &entries()[1];
    let v = json::parse_str(&export::to_json_line(e, None)).unwrap();
    assert_eq!(v.get("verdict").unwrap().as_str(), Some("DENY"));
    assert_eq!(
        v.get("deny_reason").unwrap().as_str(),
        Some("BUDGET_EXHAUSTED")
    );
    assert_eq!(v.get("reason").unwrap().as_str(), Some("budget_overrun"));
    assert_eq!(v.get("budget_before_usd").unwrap().as_str(), Some("9.9985"));
    assert!(v.get("operator_id").unwrap().is_null());
}

#[test]
fn csv_rows_quote_what_needs_quoting() {
    let mut e = entries()[0].clone();
    if let tollgate_audit::Event::Session(tollgate_audit::SessionEvent::Verdict(v)) = &mut e.event {
        v.tool_name = "say \"hi\", twice".into();
        v.operator_id = Some("=cmd()".into());
    }
    let row = export::to_csv_row(&e, None);
    assert!(row.contains("\"say \"\"hi\"\", twice\""), "{row}");
    assert!(row.contains("\"'=cmd()\""), "{row}");
    assert_eq!(export::csv_header().split(',').count(), COLUMNS.len());
    // Negative money is a number, not a formula.
    if let tollgate_audit::Event::Session(tollgate_audit::SessionEvent::Verdict(v)) = &mut e.event {
        v.budget_after = tollgate_core::Money(-500_000_000);
    }
    assert!(export::to_csv_row(&e, None).contains(",-0.5,"));
}

/// The entries of the version-2 known answer: one of each kind.
fn every_kind() -> Vec<tollgate_audit::AuditEntry> {
    let p =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/known-answer.log");
    verify_dir_files(&p)
}

fn verify_dir_files(p: &std::path::Path) -> Vec<tollgate_audit::AuditEntry> {
    let mut out = Vec::new();
    tollgate_audit::verify_paths(&[p.to_owned()], &opts(&key(1)), &mut |e| {
        out.push(e.clone())
    })
    .unwrap();
    out
}

/// Split one RFC 4180 row (no line breaks inside fields in these tests).
fn csv_fields(row: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = row.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    out.push(cur);
    out
}

#[test]
fn every_kind_exports_every_field() {
    let all = every_kind();
    let objs: Vec<_> = all
        .iter()
        .map(|e| {
            let v = json::parse_str(&export::to_json_line(e, None)).unwrap();
            assert_eq!(v.as_object().unwrap().len(), COLUMNS.len());
            v
        })
        .collect();
    let get = |i: usize, k: &str| objs[i].get(k).unwrap().clone();
    let text = |i: usize, k: &str| get(i, k).as_str().map(str::to_owned);
    let kinds: Vec<_> = (0..6).map(|i| text(i, "kind").unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "session_opened",
            "verdict",
            "settlement",
            "human_decision",
            "recovery",
            "key_handover"
        ]
    );
    // Session opened.
    assert_eq!(text(0, "budget_scope").as_deref(), Some("per_agent"));
    assert_eq!(text(0, "budget_initial_usd").as_deref(), Some("10"));
    assert_eq!(text(0, "budget_before_usd").as_deref(), Some("7.5"));
    assert_eq!(
        text(0, "config").as_deref(),
        Some(r#"{"budget_scope":"per_agent","budget_usd":10}"#)
    );
    assert_eq!(get(0, "session_seq").as_u64(), Some(1));
    assert!(text(0, "config_digest").is_some());
    assert!(get(0, "verdict").is_null());
    // Verdict.
    assert_eq!(text(1, "verdict").as_deref(), Some("ALLOW"));
    assert_eq!(get(1, "session_seq").as_u64(), Some(2));
    // Settlement.
    assert_eq!(
        text(2, "reported_cost_bits").as_deref(),
        Some("3f50624dd2f1a9fc")
    );
    assert_eq!(text(2, "reported_cost").as_deref(), Some("0.001"));
    assert_eq!(text(2, "cost_status").as_deref(), Some("readable"));
    assert_eq!(text(2, "actual_cost_usd").as_deref(), Some("0.001"));
    assert_eq!(text(2, "charged_usd").as_deref(), Some("0.001"));
    assert_eq!(text(2, "estimated_cost_usd").as_deref(), Some("0.0015"));
    assert_eq!(get(2, "reserved").as_bool(), Some(true));
    assert_eq!(get(2, "success").as_bool(), Some(true));
    assert_eq!(get(2, "error_signal").as_bool(), Some(false));
    assert_eq!(text(2, "budget_after_usd").as_deref(), Some("7.499"));
    assert_eq!(get(2, "call_number").as_u64(), Some(1));
    // Human decision.
    assert_eq!(text(3, "decision").as_deref(), Some("modify"));
    assert_eq!(text(3, "operator_id").as_deref(), Some("alice"));
    // The human's words are in the signed record and in the export (issue 16 §5).
    assert_eq!(text(3, "note").as_deref(), Some("checked the recipient"));
    assert_eq!(get(3, "original_nonce").as_u64(), Some(8));
    assert_eq!(get(3, "successor_nonce").as_u64(), Some(9));
    assert!(text(3, "successor_args_digest").is_some());
    assert_eq!(text(3, "budget_remaining_usd").as_deref(), Some("7.499"));
    assert_eq!(text(3, "tool_name").as_deref(), Some("send_email"));
    // Recovery and hand-over.
    assert_eq!(get(4, "recovery_offset").as_u64(), Some(1234));
    assert_eq!(get(4, "recovery_length").as_u64(), Some(56));
    assert_eq!(
        text(4, "recovery_file").as_deref(),
        Some("audit-00000000-20261130.log")
    );
    assert!(get(4, "session_id").is_null());
    assert_eq!(
        text(5, "new_key_id"),
        Some(tollgate_audit::KeyId::of(&key(2).verifying_key().to_bytes()).to_string())
    );
    // CSV: one field per column, the same values.
    let header = export::csv_header();
    assert_eq!(csv_fields(&header), COLUMNS);
    for (e, obj) in all.iter().zip(&objs) {
        let row = csv_fields(&export::to_csv_row(e, None));
        assert_eq!(row.len(), COLUMNS.len(), "{}", export::to_csv_row(e, None));
        for (col, cell) in COLUMNS.iter().zip(&row) {
            let v = obj.get(col).unwrap();
            let expected = if v.is_null() {
                String::new()
            } else if let Some(s) = v.as_str() {
                s.to_owned()
            } else {
                String::from_utf8(json::to_canonical_vec(v).unwrap()).unwrap()
            };
            assert_eq!(cell, &expected, "column {col}");
        }
    }
}

#[test]
fn a_session_filter_selects_every_kind_of_that_session() {
    let all = every_kind();
    let by_session = Filter {
        session: Some("s1".into()),
        ..Filter::default()
    };
    let picked: Vec<u8> = all
        .iter()
        .filter(|e| by_session.matches(e))
        .map(|e| e.event.kind())
        .collect();
    assert_eq!(picked, [4, 1, 5, 6]);
    let allows = Filter {
        verdict: Some(Verdict::Allow),
        ..Filter::default()
    };
    let picked: Vec<u8> = all
        .iter()
        .filter(|e| allows.matches(e))
        .map(|e| e.event.kind())
        .collect();
    assert_eq!(picked, [1]);
}

#[test]
fn version_4_exports_budget_versions_and_the_chain() {
    let p =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/known-answer-v4.log");
    let all = verify_dir_files(&p);
    let objs: Vec<_> = all
        .iter()
        .map(|e| json::parse_str(&export::to_json_line(e, Some("daemon-a"))).unwrap())
        .collect();
    let get = |i: usize, k: &str| objs[i].get(k).unwrap().clone();
    let versions: Vec<Option<u64>> = (0..7).map(|i| get(i, "budget_version").as_u64()).collect();
    // Opened, verdict, settlement write versions 1-3; a human decision, a recovery and a
    // hand-over have none; the void names the voided write (4) and its give-back (5).
    assert_eq!(
        versions,
        [Some(1), Some(2), Some(3), None, Some(4), None, None]
    );
    assert_eq!(get(4, "revert_version").as_u64(), Some(5));
    assert_eq!(get(4, "budget_before_usd").as_str(), Some("7.499"));
    assert_eq!(get(4, "budget_after_usd").as_str(), Some("7.497"));
    assert!(get(1, "revert_version").is_null());
    for i in 0..7 {
        assert_eq!(get(i, "chain_id").as_str(), Some("daemon-a"));
    }
    // A file log names no chain.
    let v = json::parse_str(&export::to_json_line(&all[0], None)).unwrap();
    assert!(v.get("chain_id").unwrap().is_null());
    let row = csv_fields(&export::to_csv_row(&all[4], Some("daemon-a")));
    let col = |c: &str| COLUMNS.iter().position(|x| *x == c).unwrap();
    assert_eq!(row[col("chain_id")], "daemon-a");
    assert_eq!(row[col("budget_version")], "4");
    assert_eq!(row[col("revert_version")], "5");
}

/// Version 7 in the export: every shadow note with its would-be verdict, how many
/// disagree, the recorded params (or, over the bound, their length only), and a policy
/// set's shadow counts, from the known-answer file.
#[test]
fn shadow_notes_and_recorded_params_are_exported() {
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/known-answer-v7.log");
    let bytes = std::fs::read(path).unwrap();
    let mut all = Vec::new();
    tollgate_audit::verify::verify_visit(&[("v7", &bytes)], &opts(&key(1)), &mut |e| {
        all.push(e.clone())
    })
    .unwrap();
    let rows: Vec<json::Value> = all
        .iter()
        .map(|e| json::parse_str(&export::to_json_line(e, None)).unwrap())
        .collect();
    let get = |i: usize, k: &str| -> json::Value {
        let json::Value::Object(m) = &rows[i] else {
            panic!()
        };
        m.get(k).cloned().unwrap()
    };
    let s = |t: &str| json::Value::String(t.into());
    assert_eq!(
        get(2, "shadow"),
        s("no-customer-reads=DENY(policy:no-customer-reads)")
    );
    assert_eq!(get(2, "shadow_disagree"), json::parse_str("1").unwrap());
    assert_eq!(get(2, "params_mode"), s("full"));
    assert_eq!(get(2, "params"), s(r#"{"customer":"c-17"}"#));
    assert_eq!(get(3, "shadow_disagree"), json::parse_str("0").unwrap());
    assert_eq!(get(3, "params_mode"), s("redacted"));
    assert_eq!(get(4, "params"), json::Value::Null);
    assert_eq!(get(4, "params_len"), json::parse_str("70000").unwrap());
    assert_eq!(get(5, "shadow_set"), json::Value::Bool(true));
    assert_eq!(get(5, "shadow_policies"), json::parse_str("4").unwrap());
    assert_eq!(get(6, "shadow"), s("*=HITL(policy:big-pay)"));
    assert_eq!(get(6, "params_mode"), s("hash"));
    // CSV has the same columns.
    assert_eq!(export::csv_header().split(',').count(), COLUMNS.len());
}
