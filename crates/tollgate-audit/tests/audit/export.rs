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
        let line = export::to_json_line(&e);
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
    let v = json::parse_str(&export::to_json_line(e)).unwrap();
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
    let row = export::to_csv_row(&e);
    assert!(row.contains("\"say \"\"hi\"\", twice\""), "{row}");
    assert!(row.contains("\"'=cmd()\""), "{row}");
    assert_eq!(export::csv_header().split(',').count(), COLUMNS.len());
    // Negative money is a number, not a formula.
    if let tollgate_audit::Event::Session(tollgate_audit::SessionEvent::Verdict(v)) = &mut e.event {
        v.budget_after = tollgate_core::Money(-500_000_000);
    }
    assert!(export::to_csv_row(&e).contains(",-0.5,"));
}
