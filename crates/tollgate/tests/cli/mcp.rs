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
        "[[upstream]]\nname = \"a\"\ncommand = \"x\"\n[tools.a.t]\ncost_usd = -1\n",
    )
    .unwrap();
    let o = tollgate(&["mcp", "--config", s(&cfg)]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("tools.a.\"t\".cost_usd"), "{}", text(&o));
}

/// Logs a host keeps in a file are plain text, and an upstream that cannot be reached is
/// said in words, not with the HTTP stack's type names; a host that hangs up before
/// `initialize` sees exit 0.
#[test]
fn stderr_is_plain_words_and_an_early_hang_up_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("mcp.toml");
    // A port nothing listens on (port 1 needs root to bind, and nothing here does; a
    // port freed by this test could be taken by another before the check connects).
    let port = 1;
    std::fs::write(
        &cfg,
        format!("[[upstream]]\nname = \"docs\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n[tools.docs.search]\ncost_usd = 0.1\n"),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["mcp", "--check", "--config", s(&cfg)])
        .output()
        .unwrap();
    let all = text(&o);
    assert_eq!(code(&o), 1, "{all}");
    assert!(
        all.contains(&format!("connection refused to 127.0.0.1:{port}")),
        "{all}"
    );
    for noise in ["reqwest::", "rmcp::", "hyper", "Os {", "\u{1b}["] {
        assert!(!all.contains(noise), "{noise:?} in: {all}");
    }
    assert!(!all.contains("offers no tool"), "{all}");
    let o = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["mcp", "--config", s(&cfg)])
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let all = text(&o);
    assert_eq!(code(&o), 0, "{all}");
    assert!(
        !all.contains('\u{1b}'),
        "ANSI codes on a stderr that is no terminal: {all}"
    );
}

/// docs/mcp.md §11: each host's snippet parses, has the host's shape, names the installed
/// command by absolute path, and that command line starts the gateway.
#[test]
fn the_host_guides_parse_and_start_the_installed_command() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/mcp.md"),
    )
    .unwrap();
    let installed = std::path::Path::new(env!("CARGO_BIN_EXE_tollgate"));
    let mut seen = Vec::new();
    for (file, key) in [
        ("claude_desktop_config.json", "mcpServers"),
        (".cursor/mcp.json", "mcpServers"),
        (".vscode/mcp.json", "servers"),
    ] {
        let marker = format!("<!-- host-snippet: {file} -->\n```json\n");
        let start = doc
            .find(&marker)
            .unwrap_or_else(|| panic!("no snippet for {file}"))
            + marker.len();
        let len = doc[start..].find("```").unwrap();
        let v: serde_json::Value = serde_json::from_str(&doc[start..start + len])
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let servers = v[key]
            .as_object()
            .unwrap_or_else(|| panic!("{file}: no {key}"));
        assert_eq!(v.as_object().unwrap().len(), 1, "{file}: one top-level key");
        let server = &servers["tollgate"];
        if key == "servers" {
            assert_eq!(server["type"], "stdio", "{file}");
        }
        let command = std::path::Path::new(server["command"].as_str().unwrap());
        assert!(command.is_absolute(), "{file}: GUI hosts have no PATH");
        assert!(
            command.parent().unwrap().ends_with(".cargo/bin"),
            "{file}: cargo install's bin"
        );
        assert_eq!(command.file_name(), installed.file_name(), "{file}");
        let args: Vec<String> = server["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        let at = args.iter().position(|a| a == "--config").expect("--config");
        assert!(std::path::Path::new(&args[at + 1]).is_absolute(), "{file}");
        // The same command line, on a real configuration, with --check added.
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("mcp.toml");
        std::fs::write(
            &cfg,
            "[[upstream]]\nname = \"gone\"\ncommand = \"/nonexistent\"\n",
        )
        .unwrap();
        let mut run = args.clone();
        run[at + 1] = s(&cfg).to_owned();
        run.push("--check".into());
        let o = Command::new(installed).args(&run).output().unwrap();
        assert_eq!(code(&o), 1, "{file}: {}", text(&o));
        assert!(
            text(&o).contains("upstream gone: error"),
            "{file}: {}",
            text(&o)
        );
        seen.push(file);
    }
    assert_eq!(seen.len(), 3);
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
