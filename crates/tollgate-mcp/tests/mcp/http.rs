//! Streamable HTTP, both sides: a host reaches the gateway at `http://127.0.0.1:PORT/mcp`,
//! and the gateway reaches an upstream at its URL.

use std::time::Duration;

use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::json;
use tokio::io::AsyncBufReadExt;

use crate::{text, Host, Kit, TESTKIT};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_streamable_http_both_ways() {
    // The upstream, over HTTP.
    let mut upstream = tokio::process::Command::new(TESTKIT)
        .arg("upstream-http")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut first = tokio::io::BufReader::new(upstream.stdout.take().unwrap()).lines();
    let url = first.next_line().await.unwrap().unwrap();
    // The gateway, listening on HTTP too (its stdin stays open and idle).
    let port = free_port();
    let kit = Kit::with_upstreams(
        &format!("[[upstream]]\nname = \"web\"\nurl = \"{url}\"\n"),
        &format!("[gateway]\nlisten = \"127.0.0.1:{port}\"\n[guard]\nmax_repeat_calls = 1\n"),
    );
    let mut gateway = tokio::process::Command::new(TESTKIT)
        .arg("gateway")
        .arg(kit.config())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tollgate_mcp::install_crypto_provider();
    let connect = || async {
        let cfg =
            StreamableHttpClientTransportConfig::with_uri(format!("http://127.0.0.1:{port}/mcp"));
        let t = StreamableHttpClientTransport::with_client(reqwest::Client::new(), cfg);
        Host::default().serve(t).await
    };
    // Until the gateway listens: a hang is a failure (its port, found free, may have been
    // taken meanwhile).
    let client = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match connect().await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("the gateway did not listen within 30 s");
    let mut p = rmcp::model::CallToolRequestParams::new("add");
    p.arguments = json!({"a": 4, "b": 5}).as_object().cloned();
    assert_eq!(text(&client.call_tool(p.clone()).await.unwrap()), "9");
    // Decided like any call: the repeat limit of 1 denies the second.
    let second = client.call_tool(p).await.unwrap();
    assert!(
        text(&second).starts_with("denied: max_repeat_exceeded;"),
        "{}",
        text(&second)
    );
    let _ = client.cancel().await;
    let _ = gateway.kill().await;
    let _ = upstream.kill().await;
}

/// Issue 17 §5: the Streamable HTTP endpoint refuses a foreign `Origin` with 403 (MCP
/// specification 2025-11-25: a present and invalid Origin MUST get 403), and a `Host`
/// that is not a loopback name (DNS rebinding). Before: `Origin: http://evil.example` got
/// 200. A loopback origin, a configured one and no Origin at all are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_origin_or_host_gets_403() {
    tollgate_mcp::install_crypto_provider();
    let port = free_port();
    let kit = Kit::new(&format!(
        "[gateway]\nlisten = \"127.0.0.1:{port}\"\nallowed_origins = [\"https://app.example:443\"]\n"
    ));
    let mut gateway = tokio::process::Command::new(TESTKIT)
        .arg("gateway")
        .arg(kit.config())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "probe", "version": "1"}}
    });
    let http = reqwest::Client::new();
    let post = |origin: Option<&'static str>, host: Option<&'static str>| {
        let mut r = http
            .post(&url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(initialize.to_string());
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        if let Some(h) = host {
            r = r.header("host", h);
        }
        async move { r.send().await.map(|r| r.status().as_u16()) }
    };
    // Wait for the gateway to listen.
    let first = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match post(None, None).await {
                Ok(s) => break s,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("the gateway did not listen within 30 s");
    assert_eq!(first, 200, "no Origin (a program) is served");
    for origin in [
        "http://evil.example",
        "null",
        "http://127.0.0.1.evil.example:80",
    ] {
        assert_eq!(post(Some(origin), None).await.unwrap(), 403, "{origin}");
    }
    assert_eq!(
        post(None, Some("evil.example")).await.unwrap(),
        403,
        "a rebinding Host"
    );
    for origin in [
        "http://localhost:6274",
        "http://127.0.0.1:3000",
        "https://app.example",
    ] {
        assert_eq!(post(Some(origin), None).await.unwrap(), 200, "{origin}");
    }
    let _ = gateway.kill().await;
}
