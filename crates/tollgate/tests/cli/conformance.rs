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

    #[test]
    fn a_users_failing_vector_is_reported_and_exits_1() {
        let dir = tempfile::tempdir().unwrap();
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
        let out = tollgate(&["conformance", path.to_str().unwrap()]);
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
