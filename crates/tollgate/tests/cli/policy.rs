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

/// `tollgate serve` with `[policy]`, reloaded by SIGHUP and by `tollgate policy reload`:
/// each new set decides the session's next call; a bad set is refused (the CLI names the
/// file and line and exits 1) and the one in force stays; the daemon survives every
/// SIGHUP; the log records the start and each reload that loaded.
#[test]
fn sighup_and_policy_reload_apply_from_the_next_call_and_keep_the_old_set_on_error() {
    use std::time::{Duration, Instant};
    use tollgate_client::DaemonClient;
    use tollgate_core::json;

    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.cedar");
    std::fs::write(
        &rules,
        "@id(\"no-shell\") forbid (principal, action == Action::\"shell\", resource);\n",
    )
    .unwrap();
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
    let reason = |c: &DaemonClient| {
        n.set(n.get() + 1);
        let pay = json::parse_str(&format!(r#"{{"amount":{}}}"#, n.get())).unwrap();
        rt.block_on(c.pre_exec("pay", &pay, 0.0)).reason
    };
    assert_eq!(reason(&client), "within_thresholds");

    // SIGHUP with a stricter set: in force from a next call (the reload is asynchronous
    // to the signal, so the test asks until it is).
    std::fs::write(
        &rules,
        "@id(\"no-pay\") forbid (principal, action == Action::\"pay\", resource);\n",
    )
    .unwrap();
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
        let r = reason(&client);
        if r == "policy:no-pay" {
            break;
        }
        assert_eq!(r, "within_thresholds");
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "SIGHUP did not reload"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

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
    assert_eq!(reason(&client), "policy:no-pay");

    // The CLI reload of a good set.
    std::fs::write(
        &rules,
        "@id(\"no-shell\") forbid (principal, action == Action::\"shell\", resource);\n",
    )
    .unwrap();
    let o = tollgate(&["policy", "reload", "--data-dir", s(&data)]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(
        stdout(&o).starts_with("reloaded: 1 policies, digest "),
        "{}",
        stdout(&o)
    );
    assert_eq!(reason(&client), "within_thresholds");
    drop(client);
    assert!(serve.terminate().success());

    // The log: the start and the two reloads that loaded, nothing for the bad set.
    let mut causes = Vec::new();
    let public = std::fs::read_to_string(data.join("audit.pub")).unwrap();
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(tollgate_audit::keys::parse_public_key(&public).unwrap()),
        ..Default::default()
    };
    tollgate_audit::verify_paths(&[data.join("audit")], &opts, &mut |e| {
        if let tollgate_audit::Event::PolicySet(p) = &e.event {
            causes.push(p.cause.as_str());
        }
    })
    .unwrap();
    assert_eq!(causes, ["start", "reload", "reload"]);
}
