//! `tollgate mcp`: the wiring of the gateway into the binary (the gateway itself is tested
//! in crates/tollgate-mcp, with real MCP on both sides).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use crate::{code, s, text, tollgate};

#[test]
fn a_bad_configuration_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("mcp.toml");
    std::fs::write(
        &cfg,
        "[[upstream]]\nname = \"a\"\ncommand = \"x\"\n[tools.t]\ncost_usd = -1\n",
    )
    .unwrap();
    let o = tollgate(&["mcp", "--config", s(&cfg)]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("tools.\"t\".cost_usd"), "{}", text(&o));
}

#[test]
fn check_reports_an_upstream_that_cannot_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("mcp.toml");
    std::fs::write(
        &cfg,
        "[[upstream]]\nname = \"gone\"\ncommand = \"/nonexistent/server\"\n",
    )
    .unwrap();
    let o = tollgate(&["mcp", "--check", "--config", s(&cfg)]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    assert!(text(&o).contains("mode: library"), "{}", text(&o));
    assert!(
        text(&o).contains("upstream gone: error: cannot start `/nonexistent/server`"),
        "{}",
        text(&o)
    );
}

/// The host's side of stdio: `initialize` is answered by the gateway; EOF stops it.
#[test]
fn serves_mcp_on_stdio_until_the_host_hangs_up() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("mcp.toml");
    std::fs::write(
        &cfg,
        "[[upstream]]\nname = \"gone\"\ncommand = \"/nonexistent\"\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["mcp", "--config", s(&cfg)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"cli-test","version":"1"}}}}}}"#
    )
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["id"], 1);
    assert_eq!(v["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(v["result"]["serverInfo"]["name"], "tollgate-mcp");
    drop(stdin);
    assert!(child.wait().unwrap().success());
}
