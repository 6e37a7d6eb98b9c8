//! `tollgate policy replay`: a real daemon's log replayed under its own configuration (no
//! flip, exit 0) and under planted changes (a forbid added, a threshold lowered, a budget
//! halved), each of whose flips must be exactly what a daemon running the changed
//! configuration decides for the same calls; a tampered log is refused (exit 2).

use std::path::Path;

use tollgate_client::DaemonClient;
use tollgate_core::{json, Verdict};

use crate::{code, s, stdout, text, tollgate};

const BASE_GUARD: &str =
    "[guard.default]\nbudget_usd = 1.0\nmax_repeat_calls = 3\nprobabilistic_deny = false\n";
const NO_SHELL: &str =
    "@id(\"no-shell\") forbid (principal, action == Action::\"shell\", resource);\n";
const BIG_PAY: &str = "@id(\"big-pay\") forbid (principal, action == Action::\"pay\", resource) when { context.args has n && context.args.n > 5 };\n";
const FULL_PARAMS: &str = "[audit]\nparams = \"full\"\n";
const NO_PAY: &str = "@id(\"no-pay\") forbid (principal, action == Action::\"pay\", resource);\n";
const HOLD_BIG_PAY: &str = "@id(\"hold-big-pay\") @hitl(\"a big payment\") permit (principal, action == Action::\"pay\", resource) when { context.args has n && context.args.n > 5 };\n";

/// The calls every daemon in this module is asked, in order: a repeated search (the repeat
/// limit), payments and searches with distinct params, a forbidden shell; each costs
/// $0.08, so a $1.00 budget runs out near the end and a $0.50 one in the middle.
fn calls() -> Vec<(&'static str, String)> {
    let mut out = vec![
        ("search", r#"{"q":1}"#.to_owned()),
        ("search", r#"{"q":1}"#.to_owned()),
        ("search", r#"{"q":1}"#.to_owned()),
        ("shell", r#"{"cmd":"ls"}"#.to_owned()),
    ];
    for i in 0..12 {
        let tool = if i % 2 == 0 { "pay" } else { "search" };
        out.push((tool, format!(r#"{{"n":{i}}}"#)));
    }
    out.push(("shell", r#"{"cmd":"pwd"}"#.to_owned()));
    out
}

/// A configuration in `dir` (its policy file beside it): the guard text and the policies.
fn config(dir: &Path, name: &str, guard: &str, policies: &str) -> std::path::PathBuf {
    let rules = dir.join(format!("{name}.cedar"));
    std::fs::write(&rules, policies).unwrap();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!("{guard}\n[policy]\nfiles = [\"{name}.cedar\"]\n"),
    )
    .unwrap();
    path
}

/// Run the calls against a daemon started with `config`; its verdicts (call number,
/// verdict, reason) and its data directory.
fn run_daemon(
    dir: &Path,
    name: &str,
    config: &Path,
) -> (Vec<(u64, Verdict, String)>, std::path::PathBuf) {
    let data = dir.join(format!("data-{name}"));
    let serve = serve_in(&data, config);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(DaemonClient::connect(serve.client_config("bot")))
        .unwrap();
    let mut verdicts = Vec::new();
    for (tool, params) in calls() {
        let v = rt.block_on(client.pre_exec(tool, &json::parse_str(&params).unwrap(), 0.08));
        assert!(v.error.is_none(), "{v:?}");
        verdicts.push((v.call_number, v.verdict, v.reason));
    }
    drop(client);
    assert!(serve.terminate().success());
    (verdicts, data)
}

/// `(call_number, recorded, candidate, candidate_reason)` of every flip the JSON report
/// lists.
fn flips(report: &json::Value) -> Vec<(u64, String, String, String)> {
    let str_of = |v: &json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).unwrap().to_owned();
    match report.get("flip_examples").unwrap() {
        json::Value::Array(items) => items
            .iter()
            .map(|f| {
                (
                    f.get("call_number").and_then(json::Value::as_u64).unwrap(),
                    str_of(f, "recorded"),
                    str_of(f, "candidate"),
                    str_of(f, "candidate_reason"),
                )
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

fn replay(args: &[&str]) -> (i32, json::Value, String) {
    let mut all = vec!["policy", "replay", "--format", "json", "--examples", "1000"];
    all.extend_from_slice(args);
    let o = tollgate(&all);
    let t = text(&o);
    let report = json::parse_str(stdout(&o).trim()).unwrap_or(json::Value::Null);
    (code(&o), report, t)
}

/// `policy replay --config CONFIG --key KEY LOG` (the text form).
fn text_args<'a>(config: &'a Path, key: &'a Path, log: &'a Path) -> [&'a str; 7] {
    [
        "policy",
        "replay",
        "--config",
        s(config),
        "--key",
        s(key),
        s(log),
    ]
}

/// `tollgate serve --config CONFIG` in a new data directory `data` (0750).
fn serve_in(data: &Path, config: &Path) -> crate::daemon::Serve {
    std::fs::create_dir(data).unwrap();
    std::fs::set_permissions(data, std::os::unix::fs::PermissionsExt::from_mode(0o750)).unwrap();
    crate::daemon::Serve::start_with(data, &["--config", s(config)])
}

fn count(report: &json::Value, k: &str) -> u64 {
    report.get(k).and_then(json::Value::as_u64).unwrap()
}

#[test]
fn replay_finds_exactly_the_flips_a_planted_change_makes_and_none_for_the_config_itself() {
    let dir = tempfile::tempdir().unwrap();
    // The log records params in full, so argument rules can be replayed.
    let base_guard = format!("{FULL_PARAMS}{BASE_GUARD}");
    let base = config(dir.path(), "base", &base_guard, NO_SHELL);
    let (recorded, data) = run_daemon(dir.path(), "base", &base);
    // The log has what the test needs: a policy's refusal, a repeat refusal, the budget.
    let reasons: Vec<&str> = recorded.iter().map(|(_, _, r)| r.as_str()).collect();
    assert!(reasons.contains(&"policy:no-shell"), "{recorded:?}");
    assert!(reasons.contains(&"within_thresholds"), "{recorded:?}");
    let key = data.join("audit.pub");
    let log = data.join("audit");

    // Self-check: the very configuration that wrote the log: nothing flips, nothing
    // changes, every verdict replayed.
    let (c, report, t) = replay(&["--config", s(&base), "--key", s(&key), s(&log)]);
    assert_eq!(c, 0, "{t}");
    assert_eq!(count(&report, "flips"), 0, "{t}");
    assert_eq!(count(&report, "reason_changes"), 0, "{t}");
    assert_eq!(count(&report, "unreplayable"), 0, "{t}");
    assert_eq!(count(&report, "verdicts"), recorded.len() as u64, "{t}");
    assert_eq!(count(&report, "replayed"), recorded.len() as u64, "{t}");
    // The text form says the same.
    let o = tollgate(&text_args(&base, &key, &log));
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(
        stdout(&o).contains(" 0 flip(s), 0 reason change(s), 0 not replayable"),
        "{}",
        text(&o)
    );

    // Planted changes. Each one's truth: a daemon running it, asked the same calls.
    let forbid = config(
        dir.path(),
        "forbid",
        BASE_GUARD,
        &format!("{NO_SHELL}{NO_PAY}"),
    );
    let args_rule = config(
        dir.path(),
        "args",
        BASE_GUARD,
        &format!("{NO_SHELL}{BIG_PAY}"),
    );
    let lower = config(
        dir.path(),
        "lower",
        "[guard.default]\nbudget_usd = 1.0\nmax_repeat_calls = 2\nprobabilistic_deny = false\n",
        NO_SHELL,
    );
    let halved = config(
        dir.path(),
        "halved",
        "[guard.default]\nbudget_usd = 0.5\nmax_repeat_calls = 3\nprobabilistic_deny = false\n",
        NO_SHELL,
    );
    // A hold added: an argument rule that sends big payments to a human (ALLOW->HITL).
    let hold = config(
        dir.path(),
        "hold",
        BASE_GUARD,
        &format!("{NO_SHELL}{HOLD_BIG_PAY}"),
    );
    // The base configuration with its set in shadow mode: `--policy` files replayed over
    // it are the candidate, enforced (the mode does not carry over to them).
    let shadowed = dir.path().join("shadowed.toml");
    std::fs::write(
        &shadowed,
        format!("{BASE_GUARD}\n[policy]\nfiles = [\"base.cedar\"]\nmode = \"shadow\"\n"),
    )
    .unwrap();
    for (name, candidate, extra) in [
        ("forbid", &forbid, None),
        // The forbid again, as `--policy` files replacing the base configuration's.
        (
            "forbid-by-flag",
            &base,
            Some(dir.path().join("forbid.cedar")),
        ),
        (
            "forbid-by-flag-over-a-shadow-set",
            &shadowed,
            Some(dir.path().join("forbid.cedar")),
        ),
        ("lower", &lower, None),
        // An argument rule, on the recorded params.
        ("args", &args_rule, None),
        ("halved", &halved, None),
        ("hold", &hold, None),
    ] {
        let truth_config = if extra.is_some() { &forbid } else { candidate };
        let (truth, _) = run_daemon(dir.path(), name, truth_config);
        let expected: Vec<(u64, String, String, String)> = recorded
            .iter()
            .zip(&truth)
            .filter(|(r, t)| r.1 != t.1)
            .map(|(r, t)| (r.0, r.1.to_string(), t.1.to_string(), t.2.clone()))
            .collect();
        assert!(!expected.is_empty(), "{name}: the change flips nothing");
        // The verdicts whose reason alone changes, by the same truth.
        let reasons_only = recorded
            .iter()
            .zip(&truth)
            .filter(|(r, t)| r.1 == t.1 && r.2 != t.2)
            .count() as u64;
        let mut args = vec!["--config", s(candidate), "--key", s(&key)];
        if let Some(p) = &extra {
            args.extend(["--policy", s(p)]);
        }
        args.push(s(&log));
        let (c, report, t) = replay(&args);
        assert_eq!(c, 1, "{name}: {t}");
        assert_eq!(flips(&report), expected, "{name}: {t}");
        assert_eq!(
            count(&report, "flips"),
            expected.len() as u64,
            "{name}: {t}"
        );
        assert_eq!(count(&report, "unreplayable"), 0, "{name}: {t}");
        assert_eq!(
            count(&report, "reason_changes"),
            reasons_only,
            "{name}: {t}"
        );
        match name {
            // The halved budget refuses earlier; the refusal trips the circuit, so the
            // call the daemon refused for its budget is refused by the open circuit.
            "halved" => assert!(reasons_only > 0, "{t}"),
            "hold" => {
                let kinds = report.get("flips_by_kind").unwrap();
                assert!(
                    kinds.get("ALLOW->HITL").and_then(json::Value::as_u64) > Some(0),
                    "{t}"
                );
                assert!(
                    flips(&report)
                        .iter()
                        .any(|f| f.2 == "HITL" && f.3 == "policy:hold-big-pay"),
                    "{t}"
                );
            }
            _ => {}
        }
    }

    // The same argument rule on a log of hashes only (the default): the payments it
    // would read cannot be replayed; counted, nothing flips: exit 3.
    let hashes = config(dir.path(), "hashes", BASE_GUARD, NO_SHELL);
    let (hash_verdicts, hash_data) = run_daemon(dir.path(), "hashes", &hashes);
    let args_hash = config(
        dir.path(),
        "args-hash",
        BASE_GUARD,
        &format!("{NO_SHELL}{BIG_PAY}"),
    );
    let (c, report, t) = replay(&[
        "--config",
        s(&args_hash),
        "--key",
        s(&hash_data.join("audit.pub")),
        s(&hash_data.join("audit")),
    ]);
    assert_eq!(c, 3, "{t}");
    assert_eq!(count(&report, "flips"), 0, "{t}");
    // Every payment the policies were asked about: all but those refused by an open
    // circuit (rule 2, before the policies).
    let pays = calls()
        .iter()
        .zip(&hash_verdicts)
        .filter(|((tool, _), (_, _, reason))| *tool == "pay" && reason != "circuit_open")
        .count() as u64;
    assert!(pays > 0, "{hash_verdicts:?}");
    assert_eq!(count(&report, "unreplayable"), pays, "{t}");
    assert_eq!(
        count(&report, "replayed") + pays,
        count(&report, "verdicts"),
        "{t}"
    );

    // A log that does not verify: refused, nothing replayed.
    let refused = || {
        let o = tollgate(&text_args(&base, &key, &log));
        assert_eq!(code(&o), 2, "{}", text(&o));
        assert!(text(&o).contains("BROKEN"), "{}", text(&o));
        assert!(stdout(&o).is_empty(), "{}", text(&o));
    };
    // A tampered log: one byte of the last file changed.
    let mut files: Vec<_> = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    let last = files.last().unwrap();
    let mut bytes = std::fs::read(last).unwrap();
    let at = bytes.len() - 40;
    bytes[at] ^= 0x01;
    std::fs::write(last, &bytes).unwrap();
    refused();

    // A byte changed in the first entry, which the directory's checkpoint counts (replay
    // lets the checkpoint vouch for those entries' signatures): refused all the same, by
    // the chain of links the checkpoint signs.
    bytes[at] ^= 0x01;
    std::fs::write(last, &bytes).unwrap();
    let first = files.first().unwrap();
    let mut head = std::fs::read(first).unwrap();
    head[tollgate_audit::format::HEADER_LEN + 60] ^= 0x01;
    std::fs::write(first, &head).unwrap();
    refused();
}

#[test]
fn bad_input_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let o = tollgate(&["policy", "replay", "--config", s(&missing), s(dir.path())]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    let bad_policy = config(
        dir.path(),
        "bad",
        BASE_GUARD,
        "permit (principal, action, resource)\nwhen {\n",
    );
    let o = tollgate(&[
        "policy",
        "replay",
        "--config",
        s(&bad_policy),
        s(dir.path()),
    ]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("bad.cedar"), "{}", text(&o));
}

/// A log that verifies (every signature and link) but does not fold (verdicts of sessions
/// it never opened: `audit demo-write`'s) is refused like a broken one, with no replay
/// result; so is a log signed by another key than `--key`'s.
#[test]
fn a_log_that_verifies_but_does_not_fold_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for name in ["audit", "other"] {
        let o = tollgate(&["keygen", "--out", s(root), "--name", name]);
        assert_eq!(code(&o), 0, "{}", text(&o));
    }
    let log = root.join("log");
    let o = tollgate(&[
        "audit",
        "demo-write",
        "--dir",
        s(&log),
        "--key",
        s(&root.join("audit.key")),
        "--count",
        "5",
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let empty = root.join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let key = root.join("audit.pub");
    let o = tollgate(&["audit", "verify", "--key", s(&key), s(&log)]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let o = tollgate(&text_args(&empty, &key, &log));
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("does not fold"), "{}", text(&o));
    assert!(stdout(&o).is_empty(), "{}", text(&o));
    let other = root.join("other.pub");
    let o = tollgate(&text_args(&empty, &other, &log));
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("BROKEN"), "{}", text(&o));
}

/// A library guard of `guard` deciding with the set `policy` names, auditing as `who` into
/// a new log `log` recording params in full, signed with a key `tollgate keygen --out
/// KEYDIR` makes.
fn library_guard(
    guard: &tollgate_core::GuardConfig,
    policy: &tollgate_policy::files::Settings,
    who: tollgate_client::AuditIdentity,
    keydir: &Path,
    log: &Path,
) -> tollgate_client::Guard {
    use tollgate_audit::{keys, params::Recorder, ParamsMode, Writer, WriterConfig};
    let (set, _) = tollgate_policy::files::enforced(policy).unwrap();
    let o = tollgate(&["keygen", "--out", s(keydir)]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let key = keys::parse_secret_key(&std::fs::read_to_string(keydir.join("audit.key")).unwrap())
        .unwrap();
    let (writer, _) = Writer::open(WriterConfig::new(log), key).unwrap();
    tollgate_client::Guard::new_as(guard.clone(), who.clone())
        .with_policies(set)
        .unwrap()
        .with_audit(writer, who)
        .unwrap()
        .with_params(Recorder::new(ParamsMode::Full, &[]).unwrap())
}

/// Run the calls through the library `Guard` (the Python package's and the MCP gateway's
/// decision path) configured as `config` says, with an audit log in `dir/log-NAME`
/// recording params in full; its verdicts and the log.
fn run_guard(
    dir: &Path,
    name: &str,
    config: &Path,
) -> (
    Vec<(u64, Verdict, String)>,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let daemon = tollgate_daemon::config::DaemonConfig::load(config).unwrap();
    let keydir = dir.join(format!("keys-{name}"));
    std::fs::create_dir(&keydir).unwrap();
    let log = dir.join(format!("log-{name}"));
    let who = tollgate_client::AuditIdentity {
        session_id: format!("guard-{name}"),
        agent_id: "bot".into(),
        organization_id: "default".into(),
    };
    let guard = library_guard(
        &daemon.default_guard,
        daemon.policy.as_ref().unwrap(),
        who,
        &keydir,
        &log,
    );
    let mut verdicts = Vec::new();
    for (tool, params) in calls() {
        let c = guard.check(
            tool,
            &json::parse_str(&params).unwrap(),
            tollgate_core::Money(80_000_000),
        );
        verdicts.push((c.call_number, c.decision.verdict, c.reason.clone()));
    }
    // Dropping the guard shuts its writer down (every entry was durable before its
    // verdict was returned).
    drop(guard);
    (verdicts, keydir.join("audit.pub"), log)
}

/// The library guard's log (what the Python package and the MCP gateway write): replayed
/// under the configuration it ran with, nothing flips; under an added forbid and a halved
/// budget, exactly the flips of a guard running the change.
#[test]
fn a_library_guard_log_replays_under_its_own_config_with_no_flip() {
    let dir = tempfile::tempdir().unwrap();
    let base = config(dir.path(), "base", BASE_GUARD, NO_SHELL);
    let (recorded, key, log) = run_guard(dir.path(), "base", &base);
    let (c, report, t) = replay(&["--config", s(&base), "--key", s(&key), s(&log)]);
    assert_eq!(c, 0, "{t}");
    assert_eq!(count(&report, "flips"), 0, "{t}");
    assert_eq!(count(&report, "reason_changes"), 0, "{t}");
    assert_eq!(count(&report, "replayed"), recorded.len() as u64, "{t}");
    let forbid = config(
        dir.path(),
        "forbid",
        BASE_GUARD,
        &format!("{NO_SHELL}{NO_PAY}{BIG_PAY}"),
    );
    let halved = config(
        dir.path(),
        "halved",
        "[guard.default]\nbudget_usd = 0.5\nmax_repeat_calls = 3\nprobabilistic_deny = false\n",
        NO_SHELL,
    );
    for (name, candidate) in [("forbid", &forbid), ("halved", &halved)] {
        let (truth, _, _) = run_guard(dir.path(), name, candidate);
        let expected: Vec<(u64, String, String, String)> = recorded
            .iter()
            .zip(&truth)
            .filter(|(r, t)| r.1 != t.1)
            .map(|(r, t)| (r.0, r.1.to_string(), t.1.to_string(), t.2.clone()))
            .collect();
        assert!(!expected.is_empty(), "{name}");
        let (c, report, t) = replay(&["--config", s(candidate), "--key", s(&key), s(&log)]);
        assert_eq!(c, 1, "{name}: {t}");
        assert_eq!(flips(&report), expected, "{name}: {t}");
        assert_eq!(count(&report, "unreplayable"), 0, "{name}: {t}");
    }
}

/// `--mcp mcp.toml`: a library-mode gateway's configuration is the candidate (its
/// `[guard]` and `[policy]`), and each call is decided for the upstream its entry names.
/// The log here is the one the gateway's library decider writes (`Guard::check_in` with
/// the tool's upstream; the gateway itself writes and replays one in
/// crates/tollgate-mcp/tests/mcp/replay.rs). A daemon-mode mcp.toml is refused (exit 2).
#[test]
fn an_mcp_toml_is_a_candidate_and_its_upstreams_are_the_resources() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("tools.cedar"),
        "@id(\"kit-big-pay\") forbid (principal, action == Action::\"pay\", resource == Upstream::\"kit\") when { context.args has n && context.args.n > 5 };\n\
         @id(\"no-local-pay\") forbid (principal, action == Action::\"pay\", resource == Upstream::\"local\");\n",
    )
    .unwrap();
    let mcp = d.join("mcp.toml");
    std::fs::write(
        &mcp,
        "[[upstream]]\nname = \"kit\"\ncommand = \"/nonexistent/kit\"\n\
         [guard]\nbudget_usd = 1.0\nmax_repeat_calls = 3\n\
         [policy]\nfiles = [\"tools.cedar\"]\n",
    )
    .unwrap();
    let config = tollgate_mcp::Config::load(&mcp).unwrap();
    let tollgate_mcp::config::Mode::Library(l) = &config.mode else {
        panic!()
    };
    let guard = library_guard(
        &l.guard,
        l.policy.as_ref().unwrap(),
        tollgate_client::AuditIdentity::default(),
        d,
        &d.join("audit"),
    );
    let mut refused = 0;
    for n in 0..10 {
        let p = json::parse_str(&format!(r#"{{"n":{n}}}"#)).unwrap();
        let c = guard.check_in("kit", "pay", &p, tollgate_core::Money(10_000_000), None);
        refused += usize::from(c.reason == "policy:kit-big-pay");
    }
    assert_eq!(refused, 4);
    // An embedder naming an upstream no entry can record (empty, a control character) is
    // refused as malformed: decided for that name, it would be replayed for `local`.
    let one = json::parse_str(r#"{"n":1}"#).unwrap();
    for odd in ["", "k\nit"] {
        let c = guard.check_in(odd, "pay", &one, tollgate_core::Money(10_000_000), None);
        assert_eq!(
            c.decision.reason,
            tollgate_core::Reason::MalformedInput,
            "{odd:?}"
        );
    }
    drop(guard);
    let log = d.join("audit");
    let pubkey = d.join("audit.pub");
    let (c, report, t) = replay(&["--mcp", s(&mcp), "--key", s(&pubkey), s(&log)]);
    assert_eq!(c, 0, "{t}");
    assert_eq!(count(&report, "flips"), 0, "{t}");
    assert_eq!(count(&report, "replayed"), 12, "{t}");
    // The same policies under a serve configuration: the entries still name their
    // upstream, so the forbid still applies.
    let serve = d.join("serve.toml");
    std::fs::write(
        &serve,
        "[guard.default]\nbudget_usd = 1.0\nmax_repeat_calls = 3\n[policy]\nfiles = [\"tools.cedar\"]\n",
    )
    .unwrap();
    let (c, report, t) = replay(&["--config", s(&serve), "--key", s(&pubkey), s(&log)]);
    assert_eq!((c, count(&report, "flips")), (0, 0), "{t}");
    // A daemon-mode gateway keeps no log of its own.
    std::fs::write(
        &mcp,
        "[gateway]\nmode = \"daemon\"\n[[upstream]]\nname = \"kit\"\ncommand = \"/nonexistent/kit\"\n",
    )
    .unwrap();
    let o = tollgate(&["policy", "replay", "--mcp", s(&mcp), s(&log)]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("replay the daemon's log"), "{}", text(&o));
    assert!(stdout(&o).is_empty(), "{}", text(&o));
}

/// `tollgate_client::candidate::candidate_toml` (what the Python `Guard.replay_config()`
/// writes) is a `tollgate serve` configuration whose default guard is exactly the library
/// guard's, every key set apart from the defaults, and whose `[policy]` is its set's.
#[test]
fn a_library_guards_candidate_toml_reads_back_as_the_same_guard_and_set() {
    use tollgate_core::{BudgetScope, GuardConfig, HitlMode, Money, Ratio, Settlement};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a \"b\".cedar"), NO_SHELL).unwrap();
    let g = GuardConfig {
        budget: Money(2_345_678_912),
        budget_scope: BudgetScope::PerAgent,
        max_repeat_calls: 7,
        error_amplification: true,
        timeout_seconds: 11,
        window_duration_s: 13,
        window_max_calls: 17,
        max_total_calls: 19,
        probabilistic_deny: true,
        deny_jitter_ratio: Ratio::from_ppm(123_457),
        hitl_mode: HitlMode::OnThreshold,
        hitl_budget_threshold: Ratio::from_ppm(250_001),
        settlement: Settlement::Actual,
        parent_guard_id: None,
        nonce_window: 23,
        max_reservations: 29,
        max_held_calls: 3,
    };
    let settings = tollgate_policy::files::Settings {
        files: vec!["a \"b\".cedar".into()],
        default: tollgate_policy::DefaultEffect::Deny,
        schema: None,
        trip_on_refusal: true,
        shadow: true,
    };
    let toml = tollgate_client::candidate::candidate_toml(&g, Some(&settings), dir.path()).unwrap();
    let path = dir.path().join("candidate.toml");
    std::fs::write(&path, &toml).unwrap();
    let config = tollgate_daemon::config::DaemonConfig::load(&path).unwrap();
    assert_eq!(config.default_guard, g, "{toml}");
    let read = config.policy.unwrap();
    assert_eq!(read.files, [dir.path().join("a \"b\".cedar")], "{toml}");
    assert_eq!(
        (read.default, read.trip_on_refusal, read.shadow),
        (tollgate_policy::DefaultEffect::Deny, true, true),
        "{toml}"
    );
    // And the set loads from it (shadow mode: nothing enforced).
    let (set, _) = tollgate_policy::files::enforced(&read).unwrap();
    assert!(set.policies.is_shadow_set());
}

/// Run `tollgate ARGS` with its standard error on a pseudo-terminal (standard output
/// piped): the exit code and what it wrote on the terminal.
pub fn on_a_terminal(args: &[&str]) -> (i32, String) {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    use std::io::Read as _;
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(name.to_str().unwrap())
        .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(slave)
        .spawn()
        .unwrap();
    // Read the terminal until the child's end of it is closed (EIO), standard output
    // on its own thread so neither pipe fills.
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let mut master = std::fs::File::from(master);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match master.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    let status = child.wait().unwrap();
    let _ = reader.join().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&seen).into_owned(),
    )
}

/// The progress bar: on a terminal, a bar toward a total known before the first entry
/// (the log's bytes on disk), drawn at least at the start and at 100%, then cleared; on a
/// pipe, none.
#[test]
fn a_progress_bar_is_drawn_on_a_terminal_only() {
    let dir = tempfile::tempdir().unwrap();
    let base = config(dir.path(), "base", BASE_GUARD, NO_SHELL);
    let (recorded, key, log) = run_guard(dir.path(), "bar", &base);
    let args = text_args(&base, &key, &log);
    let (c, terminal) = on_a_terminal(&args);
    assert_eq!(c, 0, "{terminal}");
    let full = format!("replaying [{}] 100%", "#".repeat(30));
    assert!(terminal.contains(&full), "{terminal:?}");
    let size: u64 = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    // The whole log: its files' bytes, and every entry (the policy set, the opening, the
    // verdicts).
    let kib = format!("{:.1} KiB", size as f64 / 1024.0);
    assert!(size >= 1024, "{size}");
    assert!(
        terminal.contains(&format!(
            "{full}  {kib} of {kib}, {} entries",
            recorded.len() + 2
        )),
        "{terminal:?}"
    );
    // Drawn from the start, then cleared before the summary line.
    assert!(terminal.starts_with("\r\x1b[2Kreplaying ["), "{terminal:?}");
    assert!(
        terminal.contains("\r\x1b[2Ktollgate: verified and replayed"),
        "{terminal:?}"
    );
    let o = tollgate(&args);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let piped = String::from_utf8_lossy(&o.stderr);
    assert!(
        !piped.contains('\r') && !piped.contains("replaying ["),
        "{piped:?}"
    );
}

/// The whole of a session's history a daemon records, replayed under the configuration
/// that wrote it: settlements at costs other than the estimates (over and under), human
/// decisions on held calls (an approval re-dispatched, a rejection), sessions closed by
/// their agent, three sessions of one agent spending one `per_agent` budget, and the
/// probabilistic layer on (its draws recorded). No flip, no reason change, every verdict
/// replayed, no recorded entry skipped: exit 0.
#[test]
fn settlements_decisions_closings_and_a_shared_budget_replay_with_no_flip() {
    use tollgate_client::HumanWait;
    use tollgate_proto::sp1;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let hold_deploy =
        "@id(\"hold-deploy\") @hitl(\"a deploy\") permit (principal, action == Action::\"deploy\", resource);\n";
    let base = config(
        d,
        "shared",
        "[audit]\nparams = \"full\"\n\
         [guard.default]\nbudget_usd = 1.0\nbudget_scope = \"per_agent\"\nsettlement = \"actual\"\n\
         max_repeat_calls = 3\nprobabilistic_deny = true\ndeny_jitter_ratio = 0.9\n\
         [guard.agents.reviewed]\nbudget_usd = 1.0\nhitl_mode = \"always\"\n",
        &format!("{NO_SHELL}{hold_deploy}"),
    );
    let data = d.join("data");
    let serve = serve_in(&data, &base);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let operator_secret = std::fs::read_to_string(data.join("secrets/default.operator.secret"))
        .unwrap()
        .trim()
        .to_owned();
    let mut op_cfg = serve.client_config("operator");
    op_cfg.secret = operator_secret.into_bytes();
    // Decide the next held call of `session` (once the daemon shows it) with `decision`.
    let decide = |session: String, decision: &'static str| {
        let op_cfg = op_cfg.clone();
        async move {
            let op = DaemonClient::operator(op_cfg).await.unwrap();
            let t = std::time::Instant::now();
            loop {
                let held = op.hitl_list().await.unwrap();
                if held.iter().any(|p| p.session_id == session) {
                    break;
                }
                assert!(
                    t.elapsed() < std::time::Duration::from_secs(20),
                    "never held"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            op.hitl_decide(sp1::HitlDecideRequest {
                session_id: session,
                decision: decision.into(),
                operator_id: "alice".into(),
                note: "replay test".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
    };
    let wait = HumanWait {
        timeout: std::time::Duration::from_secs(20),
        ..HumanWait::default()
    };
    let p = |text: String| json::parse_str(&text).unwrap();
    rt.block_on(async {
        // Three sessions of one agent, one after the other, on the agent's one budget.
        for n in 0..3u32 {
            let c = DaemonClient::connect(serve.client_config("bot"))
                .await
                .unwrap();
            let v = c
                .pre_exec("search", &p(format!(r#"{{"q":{n}}}"#)), 0.1)
                .await;
            if v.allowed() {
                c.post_exec(v.call_number, 0.13, true, "").await.unwrap();
            }
            let v = c.pre_exec("pay", &p(format!(r#"{{"n":{n}}}"#)), 0.05).await;
            if v.allowed() {
                c.post_exec(v.call_number, 0.02, true, "").await.unwrap();
            }
            let v = c.pre_exec("shell", &p(r#"{"cmd":"ls"}"#.into()), 0.0).await;
            assert_eq!(v.reason, "policy:no-shell");
            if n == 1 {
                // Held by the @hitl permit, approved, re-dispatched with its nonce.
                let decider = tokio::spawn(decide(c.session_id().to_owned(), "approve"));
                let r = c
                    .pre_exec_or_wait("deploy", &p(r#"{"env":"prod"}"#.into()), 0.1, wait)
                    .await;
                decider.await.unwrap();
                assert!(r.allowed(), "{r:?}");
                c.post_exec(r.verdict.call_number, 0.1, true, "")
                    .await
                    .unwrap();
            }
            if n < 2 {
                c.close().await.unwrap();
            } else {
                // The last session spends the rest: the budget runs low, the layer draws.
                for k in 0..8u32 {
                    let v = c
                        .pre_exec("fetch", &p(format!(r#"{{"k":{k}}}"#)), 0.1)
                        .await;
                    if v.allowed() {
                        c.post_exec(v.call_number, 0.1, true, "").await.unwrap();
                    }
                }
            }
        }
        // Every call of `reviewed` is held; one is rejected.
        let c = DaemonClient::connect(serve.client_config("reviewed"))
            .await
            .unwrap();
        let decider = tokio::spawn(decide(c.session_id().to_owned(), "reject"));
        let r = c
            .pre_exec_or_wait("search", &p(r#"{"q":"x"}"#.into()), 0.1, wait)
            .await;
        decider.await.unwrap();
        assert!(!r.allowed(), "{r:?}");
        assert_eq!(r.decision, "reject");
    });
    assert!(serve.terminate().success());
    let key = data.join("audit.pub");
    let log = data.join("audit");

    // The log holds what the test is about.
    let mut events = Vec::new();
    let opts = tollgate_audit::VerifyOptions::default();
    tollgate_audit::verify_paths(std::slice::from_ref(&log), &opts, &mut |e| {
        if let tollgate_audit::Event::Session(ev) = &e.event {
            events.push(ev.clone());
        }
    })
    .unwrap();
    use tollgate_audit::SessionEvent as E;
    let settled_off_estimate = events
        .iter()
        .any(|e| matches!(e, E::Settled(s) if s.reserved && s.actual_cost != s.estimated_cost));
    assert!(settled_off_estimate, "{events:?}");
    let decisions: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            E::HumanDecision(d) => Some(d.decision.as_str().to_owned()),
            _ => None,
        })
        .collect();
    assert_eq!(decisions, ["approve", "reject"]);
    assert_eq!(
        events.iter().filter(|e| matches!(e, E::Closed(_))).count(),
        2
    );
    let bot_sessions = events
        .iter()
        .filter(|e| matches!(e, E::Opened(o) if o.agent_id == "bot" && o.budget_scope == tollgate_core::BudgetScope::PerAgent))
        .count();
    assert_eq!(bot_sessions, 3);
    assert!(events
        .iter()
        .any(|e| matches!(e, E::Verdict(v) if v.draw.is_some())));

    let (c, report, t) = replay(&["--config", s(&base), "--key", s(&key), s(&log)]);
    assert_eq!(c, 0, "{t}");
    for k in [
        "flips",
        "reason_changes",
        "unreplayable",
        "skipped_settlements",
        "skipped_decisions",
    ] {
        assert_eq!(count(&report, k), 0, "{k}: {t}");
    }
    let verdicts = events.iter().filter(|e| matches!(e, E::Verdict(_))).count() as u64;
    assert_eq!(count(&report, "verdicts"), verdicts, "{t}");
    assert_eq!(count(&report, "replayed"), verdicts, "{t}");
}
