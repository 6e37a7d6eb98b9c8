//! Failures fail closed and the gateway stays up: an upstream that crashes mid-call, hangs
//! past its timeout, writes garbage or an oversized message gets the host an error result
//! (and is restarted for the next call); garbage and oversized lines from the host get
//! JSON-RPC errors; the host hanging up stops the gateway, which stops its upstreams
//! first.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::{start, text, Host, Kit, TESTKIT};

#[tokio::test]
async fn an_upstream_killed_mid_call_is_an_error_result_and_the_next_call_works() {
    let kit = Kit::new("");
    let s = start(&kit.config(), Host::default()).await;
    let r = tokio::time::timeout(Duration::from_secs(20), s.ok("crash", json!({})))
        .await
        .expect("no hang");
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("upstream `kit` failed"), "{}", text(&r));
    assert!(text(&r).contains("Tollgate allowed `crash`, but it may not have run"));
    // The gateway is up, and the upstream is started again.
    assert_eq!(text(&s.ok("add", json!({"a": 1, "b": 1})).await), "2");
    assert_eq!(kit.invocations(), ["crash", "add"]);
    s.close().await;
}

/// A gateway that exits leaves no process behind: its upstreams are killed and reaped
/// before it exits, not left running or as zombies for an init that may never reap them
/// (a container's PID 1 often does not). Whether the host hangs up or the gateway is
/// told to stop (SIGTERM) while the host is still connected.
#[tokio::test]
async fn the_gateway_reaps_its_upstreams_when_it_exits() {
    for terminate in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("upstream.pid");
        let kit = Kit::with_upstreams(
            &format!(
                "[[upstream]]\nname = \"kit\"\ncommand = \"{TESTKIT}\"\nargs = [\"upstream\"]\n\
                 [upstream.env]\nTESTKIT_PIDFILE = {pid_file:?}\n"
            ),
            "",
        );
        let mut s = start(&kit.config(), Host::default()).await;
        assert_eq!(text(&s.ok("add", json!({"a": 1, "b": 1})).await), "2");
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let proc_dir = std::path::PathBuf::from(format!("/proc/{}", pid.trim()));
        assert!(
            proc_dir.exists(),
            "the upstream runs while the host is connected"
        );
        let status = if terminate {
            let gateway = s.child.id().unwrap().to_string();
            let killed = std::process::Command::new("kill")
                .args(["-TERM", &gateway])
                .status()
                .unwrap();
            assert!(killed.success());
            tokio::time::timeout(Duration::from_secs(20), s.child.wait())
                .await
                .expect("the gateway exits on SIGTERM")
                .unwrap()
        } else {
            s.close().await
        };
        assert!(status.success(), "terminate: {terminate}: {status}");
        let stat = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
        assert!(
            stat.is_empty(),
            "terminate: {terminate}: the upstream is not gone: {stat}"
        );
    }
}

#[tokio::test]
async fn an_upstream_that_hangs_is_cut_off_at_the_tool_timeout() {
    let kit = Kit::new("[tools.kit.hang]\ntimeout_secs = 1\n");
    let s = start(&kit.config(), Host::default()).await;
    let r = tokio::time::timeout(Duration::from_secs(20), s.ok("hang", json!({})))
        .await
        .expect("no hang");
    assert_eq!(
        text(&r),
        "upstream `kit` did not answer within 1 s. Tollgate allowed `hang`, but it may not \
         have run."
    );
    assert_eq!(text(&s.ok("add", json!({"a": 2})).await), "2");
    s.close().await;
}

#[tokio::test]
async fn an_upstream_writing_garbage_is_dropped_and_restarted() {
    let kit = Kit::new("");
    let s = start(&kit.config(), Host::default()).await;
    let r = tokio::time::timeout(Duration::from_secs(20), s.ok("garbage", json!({})))
        .await
        .expect("no hang");
    assert_eq!(r.is_error, Some(true), "{r:?}");
    assert_eq!(text(&s.ok("add", json!({"a": 3})).await), "3");
    s.close().await;
}

#[tokio::test]
async fn an_oversized_upstream_message_is_an_error_result() {
    let kit = Kit::new("[gateway]\nmax_message_bytes = 65536\n");
    let s = start(&kit.config(), Host::default()).await;
    assert_eq!(text(&s.ok("big", json!({"bytes": 1000})).await).len(), 1000);
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        s.ok("big", json!({"bytes": 100_000})),
    )
    .await
    .expect("no hang");
    assert_eq!(r.is_error, Some(true));
    s.close().await;
}

/// Raw lines on the gateway's stdin: each bad one is answered, none stops it.
#[tokio::test]
async fn garbage_from_the_host_gets_json_rpc_errors_and_no_panic() {
    let kit = Kit::new("[gateway]\nmax_message_bytes = 4096\n");
    let mut child = tokio::process::Command::new(TESTKIT)
        .arg("gateway")
        .arg(kit.config())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let send = |l: String| {
        let mut l = l.into_bytes();
        l.push(b'\n');
        l
    };
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    stdin.write_all(&send(init.into())).await.unwrap();
    async fn next(
        lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    ) -> serde_json::Value {
        let l = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        serde_json::from_str::<serde_json::Value>(&l).unwrap()
    }
    assert_eq!(next(&mut lines).await["id"], 1);
    stdin
        .write_all(&send(
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.into(),
        ))
        .await
        .unwrap();
    let cases: Vec<(String, serde_json::Value, i64)> = vec![
        ("not json at all".into(), serde_json::Value::Null, -32700),
        ("\u{1}\u{2}{{{".into(), serde_json::Value::Null, -32700),
        (
            format!(
                r#"{{"jsonrpc":"2.0","id":7,"method":"ping","pad":"{}"}}"#,
                "x".repeat(5000)
            ),
            serde_json::Value::Null,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":3}}"#.into(),
            json!(8),
            -32602,
        ),
        (
            r#"{"jsonrpc":"2.0","id":"nine","method":"no/such"}"#.into(),
            json!("nine"),
            -32601,
        ),
        (
            r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"nope"}}"#.into(),
            json!(10),
            -32602,
        ),
    ];
    for (line, id, code) in cases {
        stdin.write_all(&send(line.clone())).await.unwrap();
        let answer = next(&mut lines).await;
        assert_eq!(answer["id"], id, "{line:.60}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{line:.60}: {answer}");
    }
    // Still serving.
    stdin
        .write_all(&send(r#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"add","arguments":{"a":5}}}"#.into()))
        .await
        .unwrap();
    let ok = next(&mut lines).await;
    assert_eq!(ok["id"], 11);
    assert_eq!(ok["result"]["content"][0]["text"], "5");
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the gateway exits on EOF")
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn an_upstream_that_cannot_start_is_an_error_result_not_a_hang() {
    let kit = Kit::with_upstreams(
        "[[upstream]]\nname = \"gone\"\ncommand = \"/nonexistent/mcp-server\"\n",
        "",
    );
    let s = start(&kit.config(), Host::default()).await;
    assert!(s.client.list_all_tools().await.unwrap().is_empty());
    let r = s.ok("anything", json!({})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("is unavailable"), "{}", text(&r));
    s.close().await;
}
