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
    let client = loop {
        match connect().await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
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
