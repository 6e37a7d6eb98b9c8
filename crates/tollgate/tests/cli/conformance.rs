//! `tollgate conformance` and `tollgate canonical`.

mod vectors {
    use crate::*;

    fn published() -> Vec<String> {
        [
            "tests/data/sp1/conformance.json",
            "tests/data/sp1/conformance-1.0.1.json",
        ]
        .iter()
        .map(|p| repo(p).display().to_string())
        .collect()
    }

    #[test]
    fn published_vectors_all_pass() {
        let files = published();
        let mut args = vec!["conformance"];
        args.extend(files.iter().map(String::as_str));
        let out = tollgate(&args);
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 30);
        assert!(lines[..29].iter().all(|l| l.starts_with("PASS ")), "{text}");
        assert_eq!(lines[29], "29 passed, 0 failed");
    }

    /// Tollgate's own vectors (tests/data/sp1-tollgate/README.md).
    fn own() -> Vec<String> {
        [
            "tests/data/sp1-tollgate/transition-modify-terminal.json",
            "tests/data/sp1-tollgate/opaque-context.json",
            "tests/data/sp1-tollgate/parallel-holds.json",
        ]
        .iter()
        .map(|p| repo(p).display().to_string())
        .collect()
    }

    #[test]
    fn own_vectors_pass_beside_the_published_ones() {
        let mut files = published();
        files.extend(own());
        let mut args = vec!["conformance"];
        args.extend(files.iter().map(String::as_str));
        let out = tollgate(&args);
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 29 + 48 + 13 + 1, "{text}");
        assert!(lines[..90].iter().all(|l| l.starts_with("PASS ")), "{text}");
        assert!(lines.contains(&"PASS modify_consumed_successor_released"));
        assert!(lines.contains(&"PASS opaque_ctx_list_number_and_marker"));
        assert!(lines.contains(&"PASS held_second_approved_released"));
        assert_eq!(lines[90], "90 passed, 0 failed");
    }

    /// A user's file: one vector that passes, one whose expectation is wrong.
    fn mixed_file(dir: &tempfile::TempDir) -> String {
        let path = dir.path().join("mine.json");
        std::fs::write(
            &path,
            r#"[{"name":"mine_ok","config":{},"state":{},"call":{"tool_name":"t","params":{}},
                 "expected_verdict":"ALLOW","expected_reason":"within_thresholds"},
                {"name":"mine_wrong","config":{"hitl_mode":"always"},"state":{},
                 "call":{"tool_name":"t","params":{"a":1}},
                 "expected_verdict":"ALLOW","expected_reason":"within_thresholds"}]"#,
        )
        .unwrap();
        path.to_str().unwrap().to_owned()
    }

    /// `name<TAB>ns`, with a finite, non-negative number of nanoseconds.
    fn timed_line(line: &str) -> (&str, f64) {
        let (name, ns) = line.split_once('\t').unwrap_or_else(|| panic!("{line:?}"));
        let ns: f64 = ns.parse().unwrap_or_else(|_| panic!("{line:?}"));
        assert!(ns.is_finite() && ns >= 0.0, "{line:?}");
        (name, ns)
    }

    #[test]
    fn bench_times_every_published_vector_after_checking_it() {
        let files = published();
        let mut args = vec!["conformance", "--bench", "--iterations", "20"];
        args.extend(files.iter().map(String::as_str));
        let out = tollgate(&args);
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 31, "{text}");
        // The same vectors, in the same order, as the checking run names.
        let mut check = vec!["conformance"];
        check.extend(files.iter().map(String::as_str));
        let check = stdout(&tollgate(&check));
        let names: Vec<&str> = check
            .lines()
            .filter_map(|l| l.strip_prefix("PASS "))
            .collect();
        let timed: Vec<&str> = lines[..29].iter().map(|l| timed_line(l).0).collect();
        assert_eq!(timed, names);
        let summary = lines[29];
        assert!(
            summary.starts_with("29 vectors, 580 decisions, mean ")
                && summary.contains(" ns/vector, total ")
                && summary.ends_with(" ms"),
            "{summary}"
        );
        assert_eq!(lines[30], "29 passed, 0 failed");
    }

    #[test]
    fn bench_reports_a_failing_vector_untimed_and_exits_1() {
        let dir = tempfile::tempdir().unwrap();
        let file = mixed_file(&dir);
        let out = tollgate(&["conformance", "--bench", "--iterations", "5", &file]);
        assert_eq!(out.status.code(), Some(1));
        let text = stdout(&out);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(timed_line(lines[0]).0, "mine_ok");
        assert_eq!(
            lines[1],
            "FAIL mine_wrong: expected ALLOW within_thresholds, got HITL hitl_all_calls"
        );
        assert!(
            lines[2].starts_with("1 vectors, 5 decisions, mean "),
            "{text}"
        );
        assert_eq!(lines[3], "1 passed, 1 failed");
    }

    #[test]
    fn bench_json_shape() {
        let dir = tempfile::tempdir().unwrap();
        let file = mixed_file(&dir);
        let out = tollgate(&[
            "conformance",
            "--bench",
            "--iterations",
            "7",
            "--format",
            "json",
            &file,
            "/nonexistent/v.json",
        ]);
        assert_eq!(out.status.code(), Some(1));
        let doc = tollgate_core::json::parse_str(&stdout(&out)).unwrap();
        let n = |k: &str| doc.get(k).and_then(|v| v.as_u64());
        assert_eq!(n("iterations"), Some(7));
        assert_eq!(n("vectors"), Some(1));
        assert_eq!(n("decisions"), Some(7));
        assert_eq!(n("passed"), Some(1));
        assert_eq!(n("failed"), Some(2));
        assert!(n("total_ns").is_some());
        assert!(doc
            .get("mean_ns_per_vector")
            .and_then(|v| v.as_f64())
            .is_some_and(|f| f >= 0.0));
        let results = doc.get("results").and_then(|v| v.as_array()).unwrap();
        let status: Vec<_> = results
            .iter()
            .map(|r| {
                (
                    r.get("name").and_then(|v| v.as_str()).unwrap(),
                    r.get("status").and_then(|v| v.as_str()).unwrap(),
                    r.get("ns_per_decision").is_some(),
                    r.get("problems").is_some(),
                )
            })
            .collect();
        assert_eq!(
            status,
            vec![
                ("mine_ok", "pass", true, false),
                ("mine_wrong", "fail", false, true),
                ("/nonexistent/v.json", "fail", false, true),
            ]
        );
    }

    #[test]
    fn bench_arguments_are_checked() {
        let files = published();
        // --iterations only means something with --bench, and must be at least 1.
        let out = tollgate(&["conformance", "--iterations", "5", &files[0]]);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out).contains("required arguments were not provided:\n  --bench"));
        let out = tollgate(&["conformance", "--bench", "--iterations", "0", &files[0]]);
        assert_eq!(out.status.code(), Some(2));
        assert!(
            text(&out).contains("0 is not in 1..=1000000000"),
            "{}",
            text(&out)
        );
    }

    #[test]
    fn a_users_failing_vector_is_reported_and_exits_1() {
        let dir = tempfile::tempdir().unwrap();
        let file = mixed_file(&dir);
        let out = tollgate(&["conformance", &file]);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            stdout(&out),
            "PASS mine_ok\nFAIL mine_wrong: expected ALLOW within_thresholds, got HITL hitl_all_calls\n1 passed, 1 failed\n"
        );
    }

    #[test]
    fn json_format_and_unreadable_files() {
        let files = published();
        let out = tollgate(&[
            "conformance",
            "--format",
            "json",
            &files[0],
            "/nonexistent/v.json",
        ]);
        assert_eq!(out.status.code(), Some(1));
        let doc = tollgate_core::json::parse_str(&stdout(&out)).unwrap();
        assert_eq!(doc.get("passed").and_then(|v| v.as_u64()), Some(15));
        assert_eq!(doc.get("failed").and_then(|v| v.as_u64()), Some(1));
        let results = doc.get("results").and_then(|v| v.as_array()).unwrap();
        assert_eq!(results.len(), 16);
        let first = &results[0];
        assert_eq!(first.get("status").and_then(|v| v.as_str()), Some("pass"));
        assert_eq!(
            first
                .get("got")
                .and_then(|g| g.get("reason"))
                .and_then(|v| v.as_str()),
            Some("within_thresholds")
        );
        let last = &results[15];
        assert_eq!(last.get("status").and_then(|v| v.as_str()), Some("fail"));
    }

    #[test]
    fn no_files_is_a_usage_error() {
        assert_eq!(tollgate(&["conformance"]).status.code(), Some(2));
    }
}

mod canonical {
    use crate::*;

    #[test]
    fn hash_matches_a_published_canonical_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("params.json");
        std::fs::write(
            &path,
            "{ \"tool\": \"click\",\n  \"target\": \"search_box\" }",
        )
        .unwrap();
        let out = tollgate(&["canonical", "--hash", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(
            stdout(&out),
            "f487a46f520575a76a1537f2235bd32acdefa067fc54a69d7e85962650ac7efc\n"
        );
        let out = tollgate(&["canonical", path.to_str().unwrap()]);
        assert_eq!(
            stdout(&out),
            "{\"target\":\"search_box\",\"tool\":\"click\"}\n"
        );
    }

    #[test]
    fn rejected_json_is_an_error_naming_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dup.json");
        std::fs::write(&path, r#"{"a":1,"a":2}"#).unwrap();
        let out = tollgate(&["canonical", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains("duplicate key `a`"), "{err}");
    }
}
