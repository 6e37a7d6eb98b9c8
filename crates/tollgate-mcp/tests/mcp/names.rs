//! The names hosts accept (issue 20 §1): every offered name matches
//! `^[a-zA-Z0-9_-]{1,64}$`, routes back to its upstream's own tool, and per-tool settings
//! keep applying when an upstream is added.

use std::time::Duration;

use serde_json::json;

use crate::{denied, start, text, Host, Kit, TESTKIT};

fn host_safe(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// An `[[upstream]]` running the testkit, with extra tool names.
fn upstream(name: &str, extra: &str) -> String {
    format!(
        "[[upstream]]\nname = \"{name}\"\ncommand = \"{TESTKIT}\"\nargs = [\"upstream\"]\n\
         hide = [\"delete_everything\"]\n\
         [upstream.env]\nTESTKIT_LOG = \"LOG\"\nTESTKIT_EXTRA_TOOLS = \"{extra}\"\n"
    )
}

#[tokio::test]
async fn every_offered_name_is_one_hosts_accept_and_routes_back_to_its_tool() {
    let long = "x".repeat(70);
    let kit = Kit::with_upstreams(
        &format!(
            "{}{}",
            upstream("github", &format!("fs.read|say hi|{long}")),
            upstream("files", "")
        ),
        "",
    );
    let s = start(&kit.config(), Host::default()).await;
    let tools = s.client.list_all_tools().await.unwrap();
    let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    for n in &names {
        assert!(host_safe(n), "{n:?} is not a name hosts accept: {names:?}");
    }
    let unique: std::collections::BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    assert!(names.contains(&"github__echo".to_owned()), "{names:?}");
    assert!(names.contains(&"files__add".to_owned()), "{names:?}");
    assert!(names.contains(&"github__fs_read".to_owned()), "{names:?}");
    assert!(names.contains(&"github__say_hi".to_owned()), "{names:?}");
    let cut = names
        .iter()
        .find(|n| n.starts_with("github__xxxx"))
        .expect("the long name is offered, shortened");
    assert_eq!(cut.len(), 64);
    // Each listed name reaches its upstream's own tool.
    assert_eq!(
        text(&s.ok("files__add", json!({"a": 2, "b": 3})).await),
        "5"
    );
    assert_eq!(
        text(&s.ok("github__fs_read", json!({"p": 1})).await),
        r#"{"p":1}"#
    );
    assert!(!denied(&s.ok(cut, json!({})).await));
    assert!(!denied(&s.ok("github__say_hi", json!({})).await));
    let ran = kit.invocations();
    assert_eq!(ran, ["add", "fs.read", long.as_str(), "say hi"]);
    // The old dotted names and bare names are unknown: nothing is decided or run.
    assert!(s.call("github.echo", json!({})).await.is_err());
    assert!(s.call("echo", json!({})).await.is_err());
    // Prompts are named the same way.
    let prompts = s.client.list_all_prompts().await.unwrap();
    assert_eq!(prompts[1].name, "files__greet");
    s.close().await;
    assert_eq!(kit.invocations().len(), 4);
}

/// `[tools.kit.echo] cost_usd = 0.5` on a $1.20 budget: the third call is over budget,
/// with one upstream and after a second one is added (before, the key was the name the
/// host saw, which the second upstream changed: the cost fell to 0 and all three ran).
#[tokio::test]
async fn a_per_tool_cost_keeps_applying_when_an_upstream_is_added() {
    for upstreams in [
        upstream("kit", ""),
        format!("{}{}", upstream("kit", ""), upstream("other", "")),
    ] {
        let two = upstreams.contains("\"other\"");
        let kit = Kit::with_upstreams(
            &upstreams,
            "[guard]\nbudget_usd = 1.2\n[tools.kit.echo]\ncost_usd = 0.5\n",
        );
        let s = start(&kit.config(), Host::default()).await;
        let echo = if two { "kit__echo" } else { "echo" };
        assert!(!denied(&s.ok(echo, json!({"i": 1})).await));
        assert!(!denied(&s.ok(echo, json!({"i": 2})).await));
        let third = s.ok(echo, json!({"i": 3})).await;
        assert!(
            denied(&third) && text(&third).contains("budget_overrun"),
            "two upstreams: {two}: {}",
            text(&third)
        );
        assert_eq!(kit.invocations(), ["echo", "echo"]);
        s.close().await;
    }
}

/// The gateway process on `kit`'s configuration with its stdin closed at once: exit code
/// and standard error.
async fn run_closed(kit: &Kit, extra_args: &[&str]) -> (i32, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(TESTKIT)
            .arg("gateway")
            .arg(kit.config())
            .args(extra_args)
            .stdin(std::process::Stdio::null())
            .output(),
    )
    .await
    .expect("the gateway exits")
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn a_setting_that_names_no_offered_tool_stops_the_gateway_naming_the_key() {
    let kit = Kit::with_upstreams(&upstream("kit", ""), "[tools.kit.ech]\ncost_usd = 0.5\n");
    let (code, err) = run_closed(&kit, &[]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("tools.kit.\"ech\""), "{err}");
    assert!(err.contains("offers no tool `ech`"), "{err}");
    // --check says the same and fails.
    let (code, out) = run_closed(&kit, &["--check"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("error: [tools.kit.\"ech\"]"), "{out}");
    // A key of an upstream that cannot be listed is not reported as naming nothing: the
    // upstream's failure is what is reported.
    let down = Kit::with_upstreams(
        &format!(
            "{}[[upstream]]\nname = \"gone\"\ncommand = \"/nonexistent/server\"\n",
            upstream("kit", "")
        ),
        "[tools.gone.anything]\ncost_usd = 0.5\n",
    );
    let (code, out) = run_closed(&down, &["--check"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("upstream gone: error: cannot start"), "{out}");
    assert!(!out.contains("offers no tool"), "{out}");
}

#[tokio::test]
async fn check_shows_the_names_and_writes_nothing() {
    let kit = Kit::with_upstreams(
        &format!("{}{}", upstream("github", "fs.read"), upstream("files", "")),
        "[library]\naudit_dir = \"audit\"\naudit_key = \"audit.key\"\n\
         [tools.github.\"fs.read\"]\ncost_usd = 0.25\n",
    );
    kit.make_audit_key();
    let (code, out) = run_closed(&kit, &["--check"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("github__fs_read\tcost $0.25\t(its own name: fs.read)"),
        "{out}"
    );
    assert!(out.contains("files__echo\tcost $0"), "{out}");
    let audit = kit.dir.path().join("audit");
    let written: Vec<_> = std::fs::read_dir(&audit)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(written.is_empty(), "--check wrote {written:?}");
    // A host that hangs up before `initialize` is a host that hung up: exit 0.
    let (code, out) = run_closed(&kit, &[]).await;
    assert_eq!(code, 0, "{out}");
}
