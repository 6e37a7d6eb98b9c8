//! Issue 18 phase 2, first slice: the call's params on the wire (`tool_params`, checked
//! against `tool_params_hash`) and the `[policy]` section at start.

use tollgate_core::json;
use tollgate_proto::MAX_TOOL_PARAMS_BYTES;

use super::*;

/// Params that are not the params hashed: a DENY (malformed input) that trips the
/// circuit, recorded as such; honest params before it are allowed.
#[tokio::test]
async fn params_that_do_not_hash_to_the_hash_are_denied_and_trip_the_circuit() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let pay = json::parse_str(r#"{"amount": 100.50, "to": "shop"}"#).unwrap();

    // The Rust client sends the params' canonical form beside their hash.
    let honest = c.prepare("pay", &pay, 0.01);
    assert_eq!(honest.tool_params, json::to_canonical_vec(&pay).unwrap());
    let v = c.pre_exec_request(honest).await;
    assert!(v.allowed(), "{v:?}");

    // The same hash, other params: the client lied.
    let mut lying = c.prepare("pay", &pay, 0.01);
    lying.tool_params = br#"{"amount":5000,"to":"attacker"}"#.to_vec();
    let v = c.pre_exec_request(lying).await;
    assert!(!v.allowed());
    assert_eq!(v.reason, "policy_violation:malformed_input", "{v:?}");
    let r = v.response.unwrap();
    assert_eq!(
        r.human_readable_reason,
        "tool_params do not hash to tool_params_hash"
    );
    let s = c.session_state().await.unwrap();
    assert!(s.circuit_tripped);
    // The session stays tripped: an honest call is refused now.
    let v = c
        .pre_exec("search", &json::parse_str("{}").unwrap(), 0.01)
        .await;
    assert_eq!(v.reason, "circuit_open");
    d.stop().await;

    let audited = audited(dir.path());
    assert!(audited
        .iter()
        .any(|e| e.reason == tollgate_core::Reason::MalformedInput && e.tool_name == "pay"));
}

/// Params that are not JSON at all are a lie too.
#[tokio::test]
async fn params_that_are_not_json_are_denied() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let mut req = c.prepare("pay", &json::parse_str(r#"{"a": 1}"#).unwrap(), 0.01);
    req.tool_params = b"{\"a\":".to_vec();
    let v = c.pre_exec_request(req).await;
    assert_eq!(v.reason, "policy_violation:malformed_input", "{v:?}");
    assert!(c.session_state().await.unwrap().circuit_tripped);
    d.stop().await;
}

/// Params beyond the bound are refused as a bad request: nothing decided, nothing
/// tripped; the client does not send them (the call goes by its hash alone).
#[tokio::test]
async fn params_beyond_the_bound_are_not_sent_and_not_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let big = json::parse_str(&format!(
        r#"{{"blob": "{}"}}"#,
        "x".repeat(MAX_TOOL_PARAMS_BYTES)
    ))
    .unwrap();
    let req = c.prepare("upload", &big, 0.01);
    assert!(
        req.tool_params.is_empty(),
        "the client sent params past the bound"
    );
    let mut forced = req.clone();
    forced.tool_params = json::to_canonical_vec(&big).unwrap();
    let v = c.pre_exec_request(forced).await;
    assert_eq!(v.reason, "fail_closed:invalid_request", "{v:?}");
    assert!(!c.session_state().await.unwrap().circuit_tripped);
    // Without them the call is decided on its hash, as before.
    let v = c.pre_exec_request(req).await;
    assert!(v.allowed(), "{v:?}");
    d.stop().await;
}

fn write_config(dir: &Path, policy: &str, files: &[(&str, &str)]) -> PathBuf {
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let data = dir.join("data");
    let path = dir.join("tollgate.toml");
    std::fs::write(
        &path,
        format!(
            "[daemon]\ndata_dir = {:?}\n\n[[organization]]\nid = \"acme\"\n\n[policy]\n{policy}\n",
            data.display().to_string()
        ),
    )
    .unwrap();
    path
}

/// A bad policy set stops the daemon before anything is served, naming the file, line
/// and column of each error (the loader's own messages).
#[tokio::test]
async fn a_bad_policy_file_stops_the_daemon_with_its_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let bad = "@id(\"ok\")\npermit (principal, action, resource);\n\nforbid (principal, action == Action::\"shell\", resource)\nwhen { context.args.command like };\n";
    let path = write_config(
        dir.path(),
        "files = [\"tools.cedar\"]\ndefault = \"deny\"",
        &[("tools.cedar", bad)],
    );
    let config = DaemonConfig::load(&path).unwrap();
    let e = Daemon::start(config).await.unwrap_err().to_string();
    let file = dir.path().join("tools.cedar").display().to_string();
    assert!(e.contains(&format!("{file}:5:")), "{e}");
    assert!(e.contains("error["), "{e}");
    assert!(!dir.path().join("data").join("tollgate.sock").exists());

    // A misspelt annotation is the loader's error too, with its place.
    let path = write_config(
        dir.path(),
        "files = [\"tools.cedar\"]",
        &[(
            "tools.cedar",
            "@hitll\npermit (principal, action, resource);\n",
        )],
    );
    let e = Daemon::start(DaemonConfig::load(&path).unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("{file}:1:1")), "{e}");

    // A file that is not there.
    let path = write_config(dir.path(), "files = [\"missing.cedar\"]", &[]);
    let e = Daemon::start(DaemonConfig::load(&path).unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.cedar"), "{e}");
}

/// A valid set is refused too, until the service enforces it: a daemon never runs
/// without the rules it was configured with.
#[tokio::test]
async fn a_valid_policy_set_is_refused_until_the_daemon_enforces_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        dir.path(),
        "files = [\"tools.cedar\"]\ntrip_on_refusal = true",
        &[(
            "tools.cedar",
            "@id(\"no-shell\")\nforbid (principal, action == Action::\"shell\", resource);\n",
        )],
    );
    let config = DaemonConfig::load(&path).unwrap();
    let settings = config.policy.clone().unwrap();
    assert!(settings.trip_on_refusal);
    assert_eq!(settings.files, vec![dir.path().join("tools.cedar")]);
    let e = Daemon::start(config).await.unwrap_err().to_string();
    assert!(e.contains("does not enforce policies yet"), "{e}");
    assert!(e.contains("1 policies"), "{e}");
}

/// The section's own keys are checked.
#[test]
fn the_policy_section_is_checked() {
    let base = Path::new("/etc/tollgate");
    for (text, key) in [
        (
            "[policy]\nfiles = [\"a.cedar\"]\ndefault = \"maybe\"",
            "policy.default",
        ),
        ("[policy]\nfiles = []", "policy.files"),
    ] {
        let e = DaemonConfig::from_toml(text, base).unwrap_err().to_string();
        assert!(e.contains(key), "{e}");
    }
    let e = DaemonConfig::from_toml("[policy]\nfiles = [\"a\"]\nreload = true", base)
        .unwrap_err()
        .to_string();
    assert!(e.contains("reload"), "{e}");
    let c = DaemonConfig::from_toml("", base).unwrap();
    assert!(c.policy.is_none());
}
