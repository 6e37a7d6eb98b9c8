//! `tollgate policy check --tools FILE` and `--mcp mcp.toml`: policies checked against the
//! tools' own input schemas (issue 19 part 4). The `--mcp` run against a real upstream is
//! in crates/tollgate-mcp/tests/mcp/policy_check.rs (its testkit upstream is that
//! crate's binary); here the wiring and its refusals.

use crate::{code, s, stdout, text, tollgate};

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    s(&p).to_owned()
}

const TOOLS: &str = r#"{"tools": [
  {"name": "pay", "description": "Pay someone", "inputSchema": {"type": "object",
    "properties": {"amount": {"type": "number"}, "currency": {"type": "string", "enum": ["EUR", "USD"]},
                   "to": {"type": "string"}, "note": {"type": ["string", "null"]}},
    "required": ["amount", "currency", "to"]}},
  {"name": "search", "inputSchema": {"type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["query"]}}
]}"#;

fn check(dir: &std::path::Path, cedar: &str) -> std::process::Output {
    let tools = write(dir, "tools.json", TOOLS);
    let p = write(dir, "p.cedar", cedar);
    tollgate(&["policy", "check", "--tools", &tools, &p])
}

#[test]
fn a_correct_set_passes_against_the_tools() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(
        dir.path(),
        "@id(\"eur-only\")\nforbid (principal, action == Action::\"pay\", resource)\n\
         unless { context.args.currency == \"EUR\" };\n\
         @id(\"small-searches\")\npermit (principal, action == Action::\"search\", resource)\n\
         when { context.args has limit && context.args.limit <= 20 && context.args.query like \"*\" };\n",
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    let t = stdout(&out);
    assert!(t.contains("checked against 2 tools ("), "{t}");
    assert!(
        t.contains("ok: 2 policies, 0 warnings, default allow, digest "),
        "{t}"
    );
}

#[test]
fn a_misspelt_argument_is_an_error_with_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(
        dir.path(),
        "@id(\"big\")\nforbid (principal, action == Action::\"pay\", resource)\n\
         when { context.args.amonut.greaterThan(decimal(\"100.0\")) };\n",
    );
    assert_eq!(code(&out), 1, "{}", text(&out));
    let t = stdout(&out);
    let p = dir.path().join("p.cedar");
    assert!(
        t.contains(&format!(
            "{}:3:8: error[tollgate::unknown-argument]",
            p.display()
        )),
        "{t}"
    );
    assert!(t.contains("did you mean `amount`?"), "{t}");
    assert!(
        t.trim_end().ends_with("refused: 1 errors, 0 warnings"),
        "{t}"
    );
    // Tested with `has` only, the misspelling is still an error (Cedar alone would type it
    // false and call the policy impossible).
    let out = check(
        dir.path(),
        "@id(\"noted\")\nforbid (principal, action == Action::\"pay\", resource)\n\
         when { context.args has ntoe };\n",
    );
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        stdout(&out).contains(&format!(
            "{}:3:25: error[tollgate::unknown-argument]",
            p.display()
        )),
        "{}",
        stdout(&out)
    );
}

#[test]
fn an_unknown_tool_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(
        dir.path(),
        "@id(\"x\")\nforbid (principal, action in [Action::\"search\", Action::\"serach\"], resource);\n",
    );
    assert_eq!(code(&out), 1, "{}", text(&out));
    let t = stdout(&out);
    assert!(t.contains(":2:49: error[tollgate::unknown-tool]"), "{t}");
    assert!(t.contains("serach"), "{t}");
    assert!(t.contains("help: did you mean `search`?"), "{t}");
}

#[test]
fn a_string_compared_with_a_number_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(
        dir.path(),
        "@id(\"x\")\nforbid (principal, action == Action::\"search\", resource)\n\
         when { context.args.query > 3 };\n",
    );
    assert_eq!(code(&out), 1, "{}", text(&out));
    let t = stdout(&out);
    assert!(t.contains(":3:8: error[tollgate::type-mismatch]"), "{t}");
    assert!(t.contains("expected Long but saw String"), "{t}");
}

#[test]
fn a_policy_that_can_never_match_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    // `note` may be null, so it is optional: without `has` it is an error, and `has`
    // on a required argument is fine; `false` never matches.
    let out = check(
        dir.path(),
        "@id(\"never\")\nforbid (principal, action == Action::\"pay\", resource)\n\
         when { context.args.to == \"x\" && false };\n",
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    let t = stdout(&out);
    assert!(t.contains(":1:1: warning[tollgate::never-matches]"), "{t}");
    assert!(t.contains("ok: 1 policies, 1 warnings"), "{t}");
    // A value the tool's enum does not have.
    let out = check(
        dir.path(),
        "@id(\"usd\")\nforbid (principal, action == Action::\"pay\", resource)\n\
         when { context.args.currency == \"usd\" };\n",
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        stdout(&out).contains(":3:33: warning[tollgate::outside-enum]"),
        "{}",
        stdout(&out)
    );
    let out = check(
        dir.path(),
        "@id(\"n\")\nforbid (principal, action == Action::\"pay\", resource)\n\
         when { context.args.note == \"x\" };\n",
    );
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(
        stdout(&out).contains("error[tollgate::optional-argument]"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_number_argument_without_a_schema_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(
        dir.path(),
        "@id(\"big\")\nforbid (principal, action == Action::\"pay\", resource)\n\
         when { context.args.amount.greaterThan(decimal(\"100.0\")) };\n",
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        stdout(&out).contains(":3:21: warning[tollgate::undeclared-number]"),
        "{}",
        stdout(&out)
    );
    // Declared `decimal` in the set's schema, it is what the set runs with: no warning.
    let schema = write(
        dir.path(),
        "s.cedarschema",
        "action \"pay\" appliesTo { principal: Agent, resource: Upstream,\n  context: { args: { amount: decimal, currency: String, to: String } } };\n",
    );
    let out = tollgate(&[
        "policy",
        "check",
        "--schema",
        &schema,
        "--tools",
        s(&dir.path().join("tools.json")),
        s(&dir.path().join("p.cedar")),
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        stdout(&out).contains("ok: 1 policies, 0 warnings"),
        "{}",
        text(&out)
    );
}

#[test]
fn bad_tools_files_are_refused_in_words_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.cedar",
        "@id(\"x\")\nforbid (principal, action == Action::\"pay\", resource);\n",
    );
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let big = format!("[{}]", " ".repeat(4 << 20));
    for (name, content, says) in [
        ("broken.json", "{\"tools\": [", "not JSON"),
        ("binary.json", "\u{0}\u{1}", "not JSON"),
        ("deep.json", deep.as_str(), "brackets nest deeper than 64"),
        (
            "big.json",
            big.as_str(),
            "a tools file holds at most 4194304",
        ),
        ("none.json", "{\"result\": {}}", "no tools array"),
        (
            "noschema.json",
            "[{\"name\": \"pay\"}]",
            "no `inputSchema` object",
        ),
    ] {
        let f = write(dir.path(), name, content);
        let out = tollgate(&["policy", "check", "--tools", &f, &p]);
        assert_eq!(code(&out), 2, "{name}: {}", text(&out));
        let all = text(&out);
        assert!(all.contains(&f) && all.contains(says), "{name}: {all}");
        assert!(!all.contains("panicked"), "{name}: {all}");
    }
    std::fs::write(dir.path().join("latin1.json"), [b'[', 0xe9, b']']).unwrap();
    let out = tollgate(&[
        "policy",
        "check",
        "--tools",
        s(&dir.path().join("latin1.json")),
        &p,
    ]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("is not UTF-8"), "{}", text(&out));
    let out = tollgate(&[
        "policy",
        "check",
        "--tools",
        s(&dir.path().join("missing.json")),
        &p,
    ]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("cannot read"), "{}", text(&out));
}

#[test]
fn mcp_refuses_what_it_cannot_check() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "p.cedar",
        "@id(\"x\")\nforbid (principal, action == Action::\"pay\", resource);\n",
    );
    // An upstream that cannot start: its tools are unknown, so nothing is checked.
    let cfg = write(
        dir.path(),
        "mcp.toml",
        "[[upstream]]\nname = \"gone\"\ncommand = \"/nonexistent/server\"\n",
    );
    let out = tollgate(&["policy", "check", "--mcp", &cfg, &p]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out)
            .contains("upstream `gone`: cannot list its tools: cannot start `/nonexistent/server`"),
        "{}",
        text(&out)
    );
    // An upstream that never speaks MCP: given up after the connect timeout, and stopped:
    // killed and reaped by the check itself, so its process is gone (not running, not a
    // zombie left for init to reap) when the check exits.
    let pid_file = dir.path().join("silent.pid");
    let silent = write(
        dir.path(),
        "silent.toml",
        &format!(
            "[gateway]\nconnect_timeout_secs = 1\n[[upstream]]\nname = \"silent\"\ncommand = \"sh\"\nargs = [\"-c\", \"echo $$ > {}; exec sleep 120 2>/dev/null\"]\n",
            pid_file.display()
        ),
    );
    let out = tollgate(&["policy", "check", "--mcp", &silent, &p]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out)
            .contains("upstream `silent`: cannot list its tools: did not initialize within 1s"),
        "{}",
        text(&out)
    );
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
    let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
    let stopped = state.is_none();
    if !stopped {
        // Left running by a broken check: stop it before failing.
        let _ = std::process::Command::new("kill").arg(pid.trim()).status();
    }
    assert!(stopped, "the upstream is not gone: {stat}");
    // No files and no [policy]: nothing to check.
    let out = tollgate(&["policy", "check", "--mcp", &cfg]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(
        text(&out).contains("has no [policy] section"),
        "{}",
        text(&out)
    );
    // A configuration that does not read.
    let bad = write(dir.path(), "bad.toml", "[[upstream]]\nname = 3\n");
    let out = tollgate(&["policy", "check", "--mcp", &bad, &p]);
    assert_eq!(code(&out), 2, "{}", text(&out));
    assert!(text(&out).contains("bad.toml"), "{}", text(&out));
    // Without --mcp, files are required.
    let out = tollgate(&["policy", "check"]);
    assert_eq!(code(&out), 2, "{}", text(&out));
}

/// The wiring of `--mcp`: a real stdio MCP server is started and listed (`tollgate mcp`
/// itself, whose own upstream cannot start, so it offers no tools: the testkit upstream,
/// with real tool schemas, is tollgate-mcp's binary, checked in
/// crates/tollgate-mcp/tests/mcp/policy_check.rs), and the policies come from the outer
/// mcp.toml's `[policy]`.
#[test]
fn mcp_starts_the_upstreams_and_checks_the_policies_of_its_policy_section() {
    let dir = tempfile::tempdir().unwrap();
    let inner = write(
        dir.path(),
        "inner.toml",
        "[[upstream]]\nname = \"gone\"\ncommand = \"/nonexistent/server\"\n",
    );
    write(
        dir.path(),
        "p.cedar",
        "@id(\"no-echo\")\nforbid (principal, action == Action::\"echo\", resource);\n",
    );
    let cfg = write(
        dir.path(),
        "mcp.toml",
        &format!(
            "[[upstream]]\nname = \"inner\"\ncommand = {:?}\nargs = [\"mcp\", \"--config\", {inner:?}]\n\
             [policy]\nfiles = [\"p.cedar\"]\n",
            env!("CARGO_BIN_EXE_tollgate")
        ),
    );
    let out = tollgate(&["policy", "check", "--mcp", &cfg]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let t = stdout(&out);
    assert!(
        t.contains(&format!(
            "{}:2:30: error[tollgate::unknown-tool]",
            dir.path().join("p.cedar").display()
        )),
        "{t}"
    );
    assert!(
        t.contains("checked against 0 tools (1 upstreams of "),
        "{t}"
    );
}

#[test]
fn a_schema_that_drifted_from_the_tools_is_refused_at_its_declaration() {
    // The set runs with the author's types: `amount` declared `Long` where the tool sends
    // a `number`, `to` declared a record where it sends a string, and `note` required where
    // the tool allows `null` would each refuse the tool's own calls at run time.
    let dir = tempfile::tempdir().unwrap();
    let tools = write(dir.path(), "tools.json", TOOLS);
    let p = write(
        dir.path(),
        "p.cedar",
        "@id(\"eur-only\")\nforbid (principal, action == Action::\"pay\", resource)\n\
         unless { context.args.currency == \"EUR\" };\n",
    );
    let schema = write(
        dir.path(),
        "s.cedarschema",
        "// payments\n\
         action \"pay\" appliesTo { principal: Agent, resource: Upstream,\n\
           context: { args: { amount: Long, currency: String, to: { iban: String }, note: String } } };\n",
    );
    let out = tollgate(&[
        "policy", "check", "--schema", &schema, "--tools", &tools, &p,
    ]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let t = stdout(&out);
    for says in [
        "2:8: warning[tollgate::schema-drift]: the schema declares `context.args.amount` of tool `pay` as `Long`",
        "2:8: error[tollgate::schema-drift]: the schema declares `context.args.note` of tool `pay` required",
        "2:8: error[tollgate::schema-drift]: the schema declares `context.args.to` of tool `pay` as a record, but the tool's input schema says `string`",
    ] {
        assert!(t.contains(&format!("{schema}:{says}")), "{says}\n{t}");
    }
    assert!(
        t.trim_end().ends_with("refused: 2 errors, 1 warnings"),
        "{t}"
    );
    // Said as the tool says it, the schema passes.
    std::fs::write(
        &schema,
        "action \"pay\" appliesTo { principal: Agent, resource: Upstream,\n\
           context: { args: { amount: decimal, currency: String, to: String, note?: String } } };\n",
    )
    .unwrap();
    let out = tollgate(&[
        "policy", "check", "--schema", &schema, "--tools", &tools, &p,
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}
