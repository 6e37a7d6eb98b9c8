//! `tollgate policy check`: findings with file, line and column; exit codes; the digest.
//! `tollgate policy reload` and SIGHUP against a running `tollgate serve`.

use crate::{code, s, stdout, text, tollgate};

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_owned()
}

#[test]
fn a_good_set_exits_0_with_its_digest_and_a_bad_one_1_naming_file_line_column() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        dir.path(),
        "tools.cedar",
        "@id(\"no-shell\")\nforbid(principal, action == Action::\"shell\", resource);\n",
    );
    let out = tollgate(&["policy", "check", &good]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.starts_with("ok: 1 policies, 0 warnings, default allow, digest "),
        "{text}"
    );
    // The same set checked again has the same digest; with default deny another.
    assert_eq!(stdout(&tollgate(&["policy", "check", &good])), text);
    let deny = stdout(&tollgate(&["policy", "check", "--default", "deny", &good]));
    assert!(
        deny.contains("default deny")
            && deny.split("digest ").nth(1) != text.split("digest ").nth(1)
    );

    let bad = write(
        dir.path(),
        "bad.cedar",
        "@id(\"a\")\npermit(principal, action, resource)\n  when { context.args.x == };\n",
    );
    let out = tollgate(&["policy", "check", &good, &bad]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains(&format!("{bad}:3:")), "{text}");
    assert!(
        text.trim_end().ends_with("refused: 1 errors, 0 warnings"),
        "{text}"
    );
}

#[test]
fn the_schema_is_checked_and_checks_the_policies() {
    let dir = tempfile::tempdir().unwrap();
    let schema = write(dir.path(), "tools.cedarschema", "action \"pay\" appliesTo { principal: Agent, resource: Upstream,\n  context: { args: { amount: decimal } } };\n");
    let p = write(dir.path(), "pay.cedar", "@id(\"big\")\n@hitl\npermit(principal, action == Action::\"pay\", resource)\n  when { context.args.amout.greaterThan(decimal(\"100.0\")) };\n");
    let out = tollgate(&["policy", "check", "--schema", &schema, &p]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stdout(&out).contains(&format!("{p}:4:")),
        "{}",
        stdout(&out)
    );
    std::fs::write(dir.path().join("pay.cedar"), "@id(\"big\")\n@hitl\npermit(principal, action == Action::\"pay\", resource)\n  when { context.args.amount.greaterThan(decimal(\"100.0\")) };\n").unwrap();
    let out = tollgate(&["policy", "check", "--schema", &schema, &p]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

#[test]
fn unreadable_files_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.cedar");
    let out = tollgate(&["policy", "check", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let binary = dir.path().join("bin.cedar");
    std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
    let out = tollgate(&["policy", "check", binary.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not UTF-8"));
}

/// `tollgate serve` with `[policy]`: a forbidden tool is DENYed naming the policy
/// (`policy:<id>`) and the session goes on with its other tools; reloaded by SIGHUP and by
/// `tollgate policy reload`, each new set decides the same session's next call; a bad set
/// is refused (the CLI names the file and line and exits 1) and the one in force stays;
/// the daemon survives every SIGHUP. `tollgate audit verify` and `export` on the log show
/// the start and each reload that loaded (policy-set entries), and each verdict a policy
/// decided names its policy and the digest of the set that decided it.
#[test]
fn serve_enforces_and_reloads_its_policy_set_and_the_log_says_which_set_decided() {
    use std::time::{Duration, Instant};
    use tollgate_client::DaemonClient;
    use tollgate_core::{json, Verdict};

    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.cedar");
    let no_shell = "@id(\"no-shell\") forbid (principal, action == Action::\"shell\", resource);\n";
    let no_pay = "@id(\"no-pay\") forbid (principal, action == Action::\"pay\", resource);\n";
    std::fs::write(&rules, no_shell).unwrap();
    let config = dir.path().join("tollgate.toml");
    std::fs::write(&config, "[policy]\nfiles = [\"rules.cedar\"]\n").unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o750)).unwrap();
    let serve = crate::daemon::Serve::start_with(&data, &["--config", s(&config)]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(DaemonClient::connect(serve.client_config("bot")))
        .unwrap();
    // Every call's params differ, so the guards' repeat limit never decides.
    let n = std::cell::Cell::new(0u32);
    let call = |tool: &str| {
        n.set(n.get() + 1);
        let args = json::parse_str(&format!(r#"{{"amount":{}}}"#, n.get())).unwrap();
        let v = rt.block_on(client.pre_exec(tool, &args, 0.0));
        assert!(v.error.is_none(), "{v:?}");
        (v.verdict, v.reason)
    };
    let allowed = (Verdict::Allow, "within_thresholds".to_owned());
    // The set at start: `shell` is refused, naming the policy; the refusal does not trip
    // the circuit, so the session's other tools go on.
    assert_eq!(call("pay"), allowed);
    assert_eq!(call("shell"), (Verdict::Deny, "policy:no-shell".to_owned()));
    assert_eq!(call("pay"), allowed);
    assert_eq!(call("shell"), (Verdict::Deny, "policy:no-shell".to_owned()));

    // SIGHUP with another set: in force from the same session's next call (the reload is
    // asynchronous to the signal, so the test asks until it is).
    std::fs::write(&rules, no_pay).unwrap();
    let hup = |pid: u32| {
        assert!(std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap()
            .success());
    };
    hup(serve.child.id());
    let t = Instant::now();
    loop {
        let r = call("pay");
        if r == (Verdict::Deny, "policy:no-pay".to_owned()) {
            break;
        }
        assert_eq!(r, allowed);
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "SIGHUP did not reload"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(call("shell"), allowed);

    // A bad set: refused by SIGHUP and by the CLI; the set in force stays.
    std::fs::write(&rules, "permit (principal, action, resource)\nwhen {\n").unwrap();
    hup(serve.child.id());
    let o = tollgate(&["policy", "reload", "--data-dir", s(&data)]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    assert!(
        text(&o).contains(&format!("{}:", rules.display())),
        "{}",
        text(&o)
    );
    assert_eq!(call("pay"), (Verdict::Deny, "policy:no-pay".to_owned()));
    assert_eq!(call("shell"), allowed);

    // The CLI reload of a good set: in force from the next call, with its digest.
    std::fs::write(&rules, no_shell).unwrap();
    let o = tollgate(&["policy", "reload", "--data-dir", s(&data)]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let out = stdout(&o);
    assert!(out.starts_with("reloaded: 1 policies, digest "), "{out}");
    let reloaded_digest = out.trim_end().rsplit(' ').next().unwrap().to_owned();
    assert_eq!(reloaded_digest.len(), 64, "{out}");
    assert_eq!(call("pay"), allowed);
    assert_eq!(call("shell"), (Verdict::Deny, "policy:no-shell".to_owned()));
    drop(client);
    assert!(serve.terminate().success());

    // The log, as an auditor reads it with the CLI.
    let public = data.join("audit.pub");
    let log = data.join("audit");
    let o = tollgate(&["audit", "verify", "--key", s(&public), s(&log)]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let o = tollgate(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        "--key",
        s(&public),
        s(&log),
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let rows: Vec<json::Value> = stdout(&o)
        .lines()
        .map(|l| json::parse_str(l).unwrap())
        .collect();
    let field = |r: &json::Value, k: &str| -> Option<String> {
        match r.get(k)? {
            json::Value::String(t) => Some(t.clone()),
            json::Value::Bool(b) => Some(b.to_string()),
            json::Value::Null => None,
            other => Some(format!("{other:?}")),
        }
    };
    let kind = |r: &json::Value| field(r, "kind").unwrap();
    // The start and the two reloads that loaded, nothing for the bad set; the start's
    // set and the CLI reload's are the same files, so the same digest.
    let sets: Vec<(String, String)> = rows
        .iter()
        .filter(|r| kind(r) == "policy_set")
        .map(|r| {
            (
                field(r, "policy_cause").unwrap(),
                field(r, "policy_set").unwrap(),
            )
        })
        .collect();
    // (The SIGHUP of the bad set is handled asynchronously: should it ever run after the
    // good files are back, it records the good set once more, never the bad one.)
    let causes: Vec<&str> = sets.iter().map(|(c, _)| c.as_str()).collect();
    assert!(
        causes == ["start", "reload", "reload"]
            || causes == ["start", "reload", "reload", "reload"],
        "{sets:?}"
    );
    assert_ne!(sets[0].1, sets[1].1);
    for (_, d) in &sets[2..] {
        assert_eq!(*d, sets[0].1);
        assert_eq!(*d, reloaded_digest);
    }
    // The session opened under the start's set.
    let opened: Vec<&json::Value> = rows
        .iter()
        .filter(|r| kind(r) == "session_opened")
        .collect();
    assert_eq!(opened.len(), 1);
    assert_eq!(field(opened[0], "policy_set").as_ref(), Some(&sets[0].1));
    // Each verdict names the set that evaluated it: the one of the last policy-set entry
    // before it, or the one before that (a verdict being decided while a reload was
    // recorded, which the note says); and each refusal its policy.
    let mut recorded: Vec<Option<String>> = Vec::new();
    let mut refusals = Vec::new();
    let mut verdicts = 0;
    for r in &rows {
        match kind(r).as_str() {
            "policy_set" => recorded.push(field(r, "policy_set")),
            "verdict" => {
                verdicts += 1;
                let set = field(r, "policy_set");
                assert!(set.is_some(), "{r:?}");
                assert!(recorded.iter().rev().take(2).any(|d| *d == set), "{r:?}");
                if field(r, "verdict").as_deref() == Some("DENY") {
                    assert_eq!(field(r, "policy_effect").as_deref(), Some("forbid"));
                    assert_eq!(field(r, "policy_decided").as_deref(), Some("true"));
                    assert_eq!(field(r, "policy_tripped").as_deref(), Some("false"));
                    refusals.push((
                        field(r, "tool_name").unwrap(),
                        field(r, "policy_reason").unwrap(),
                    ));
                } else {
                    assert_eq!(field(r, "policy_reason"), None, "{r:?}");
                }
            }
            _ => {}
        }
    }
    assert_eq!(verdicts, n.get() as usize);
    let names: Vec<(&str, &str)> = refusals
        .iter()
        .map(|(t, r)| (t.as_str(), r.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("shell", "policy:no-shell"),
            ("shell", "policy:no-shell"),
            ("pay", "policy:no-pay"),
            ("pay", "policy:no-pay"),
            ("shell", "policy:no-shell"),
        ]
    );
}
