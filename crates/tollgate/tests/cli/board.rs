//! `tollgate board check` and `tollgate board digest`, over every fixture.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::tollgate;

use tollgate_board::RuleId;
use tollgate_core::json::{self, Value};

fn board_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tollgate-board/tests/data/board")
}

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(board_data().join(kind))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    assert!(!v.is_empty());
    v
}

fn board_check(paths: &[&Path], extra: &[&str]) -> Output {
    let mut args: Vec<&str> = vec!["board", "check"];
    args.extend_from_slice(extra);
    args.extend(paths.iter().map(|p| p.to_str().unwrap()));
    tollgate(&args)
}

fn lines(out: &Output) -> Vec<Vec<String>> {
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

#[test]
fn every_valid_fixture_exits_0_silently() {
    for p in fixtures("valid") {
        let out = board_check(&[&p], &[]);
        assert_eq!(out.status.code(), Some(0), "{}", p.display());
        assert!(out.stdout.is_empty(), "{}", p.display());
    }
}

#[test]
fn every_invalid_fixture_exits_1_naming_its_rule() {
    for p in fixtures("invalid") {
        let out = board_check(&[&p], &[]);
        assert_eq!(out.status.code(), Some(1), "{}", p.display());
        let stem = p.file_stem().unwrap().to_str().unwrap();
        let rule = stem.split("--").next().unwrap();
        let ls = lines(&out);
        assert!(!ls.is_empty());
        for l in &ls {
            assert_eq!(l.len(), 4, "{l:?}");
            assert!(RuleId::from_id(&l[0]).is_some(), "{l:?}");
            assert_eq!(l[1], p.to_str().unwrap());
            assert!(!l[2].is_empty() && !l[3].is_empty());
        }
        assert!(ls.iter().any(|l| l[0] == rule), "{stem}: {ls:?}");
    }
}

#[test]
fn lines_are_sorted_by_path_then_rule_then_task() {
    let all = fixtures("invalid");
    // Give the files in reverse order: the output must still be sorted.
    let rev: Vec<&Path> = all.iter().rev().map(PathBuf::as_path).collect();
    let out = board_check(&rev, &[]);
    assert_eq!(out.status.code(), Some(1));
    let ls = lines(&out);
    let keys: Vec<(String, String, String)> = ls
        .iter()
        .map(|l| (l[1].clone(), l[0].clone(), l[2].clone()))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    // Every file contributed.
    for p in &all {
        assert!(keys.iter().any(|k| k.0 == p.to_str().unwrap()));
    }
}

#[test]
fn unreadable_path_exits_2_and_later_files_are_still_checked() {
    let bad = fixtures("invalid")
        .into_iter()
        .find(|p| p.ends_with("STOP-DEPTH.json"))
        .unwrap();
    let missing = board_data().join("no-such-file.json");
    let out = board_check(&[&missing, &bad], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-file.json"));
    let ls = lines(&out);
    assert!(ls.iter().any(|l| l[0] == "STOP-DEPTH"), "{ls:?}");

    let good = fixtures("valid").remove(0);
    let out = board_check(&[&good, &missing], &[]);
    assert_eq!(out.status.code(), Some(2));
    // A directory is a path that cannot be read as a file.
    let out = board_check(&[&board_data()], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn json_format_carries_the_same_findings() {
    let paths = fixtures("invalid");
    let some: Vec<&Path> = paths.iter().take(5).map(PathBuf::as_path).collect();
    let text = board_check(&some, &[]);
    let out = board_check(&some, &["--format", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let doc = json::parse_str(std::str::from_utf8(&out.stdout).unwrap().trim()).unwrap();
    assert_eq!(doc.get("exit_code").and_then(Value::as_i64), Some(1));
    let findings = doc.get("findings").and_then(Value::as_array).unwrap();
    let from_json: Vec<Vec<String>> = findings
        .iter()
        .map(|f| {
            vec![
                f.get("rule").and_then(Value::as_str).unwrap().to_owned(),
                f.get("path").and_then(Value::as_str).unwrap().to_owned(),
                f.get("task_id")
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_owned(),
                f.get("message").and_then(Value::as_str).unwrap().to_owned(),
            ]
        })
        .collect();
    assert_eq!(from_json, lines(&text));

    let valid = fixtures("valid");
    let out = board_check(&[&valid[0]], &["--format", "json"]);
    assert_eq!(out.status.code(), Some(0));
    let doc = json::parse_str(std::str::from_utf8(&out.stdout).unwrap().trim()).unwrap();
    assert_eq!(
        doc.get("findings")
            .and_then(Value::as_array)
            .map(<[Value]>::len),
        Some(0)
    );

    let missing = board_data().join("no-such-file.json");
    let out = board_check(&[&missing], &["--format", "json"]);
    assert_eq!(out.status.code(), Some(2));
    let doc = json::parse_str(std::str::from_utf8(&out.stdout).unwrap().trim()).unwrap();
    assert_eq!(
        doc.get("unreadable")
            .and_then(Value::as_array)
            .map(<[Value]>::len),
        Some(1)
    );
}

#[test]
fn catalog_option_replaces_the_built_in_catalog() {
    let dir = std::env::temp_dir().join(format!("tollgate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let catalog = dir.join("catalog.json");
    std::fs::write(
        &catalog,
        r#"[{"id": "agentic-system-architecture-review-agent", "execution_tier": "untiered"}]"#,
    )
    .unwrap();
    let example = fixtures("valid")
        .into_iter()
        .find(|p| p.ends_with("v01-delegate-example.json"))
        .unwrap();
    let out = board_check(&[&example], &["--catalog", catalog.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(lines(&out)[0][0], "HO-DESTINATION-TIER");

    std::fs::write(&catalog, "not json").unwrap();
    let out = board_check(&[&example], &["--catalog", catalog.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn digest_prints_the_canonical_request_digest() {
    let env = board_data().join("envelope-digest.json");
    let expected = std::fs::read_to_string(board_data().join("envelope-digest.expected")).unwrap();
    let out = tollgate(&["board", "digest", env.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), expected);

    let missing = board_data().join("no-such-file.json");
    let out = tollgate(&["board", "digest", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let nan = board_data().join("invalid/HO-SCHEMA--nan.json");
    let out = tollgate(&["board", "digest", nan.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn no_files_is_a_usage_error() {
    let out = tollgate(&["board", "check"]);
    assert_eq!(out.status.code(), Some(2));
}
