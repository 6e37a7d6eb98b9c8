//! `tollgate operator-token`: a fresh token, and an `[[operator]]` entry the daemon accepts
//! that admits exactly that token.

use crate::{stdout, tollgate};
use tollgate_daemon::operators::{hex, token_sha256, Operators};
use tollgate_daemon::DaemonConfig;

#[test]
fn prints_a_token_and_the_entry_that_admits_it() {
    let out = tollgate(&[
        "operator-token",
        "--id",
        "alice",
        "--org",
        "acme",
        "--org",
        "globex",
    ]);
    assert!(out.status.success());
    let text = stdout(&out);
    let token = text
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .unwrap()
        .to_owned();
    assert!(token.starts_with("tgo_") && token.len() == 68, "{token}");
    assert!(text.contains(&format!(
        "token_sha256 = \"{}\"",
        hex(&token_sha256(&token))
    )));
    // The printed entry, pasted into a configuration, is accepted and admits the token.
    let entry = text.split_once("[[operator]]").unwrap().1;
    let config = format!(
        "[[organization]]\nid = \"acme\"\n[[organization]]\nid = \"globex\"\n[[operator]]{entry}"
    );
    let c = DaemonConfig::from_toml(&config, std::path::Path::new(".")).unwrap();
    let ops = Operators::new(c.operators);
    let alice = ops.authenticate(&token, 0).unwrap();
    assert_eq!(alice.id, "alice");
    assert_eq!(alice.organizations, ["acme", "globex"]);
    // Two runs, two tokens.
    let again = stdout(&tollgate(&["operator-token"]));
    assert!(!again.contains(&token));
}

/// Tokens never reach the daemon's log: `tollgate serve` at `RUST_LOG=trace`, operators
/// signing in by header and by first frame, with the right token and with wrong ones, and
/// none of those strings is in what it logged.
#[test]
fn tokens_never_reach_the_log_even_at_trace() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = tollgate(&["operator-token", "--id", "alice", "--org", "default"]);
    let text = stdout(&out);
    let token = text
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .unwrap()
        .to_owned();
    let entry = text.split_once("[[operator]]").unwrap().1;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        dir.join("serve.toml"),
        format!("[control]\nlisten = \"127.0.0.1:{port}\"\n[[operator]]{entry}"),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--data-dir", crate::s(dir), "--config"])
        .arg(dir.join("serve.toml"))
        .env("RUST_LOG", "trace")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let wrong = format!("tgo_{}", "0".repeat(64));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = format!("ws://127.0.0.1:{port}/v1/control");
        for t in [token.as_str(), wrong.as_str()] {
            // By header.
            let mut req = url.as_str().into_client_request().unwrap();
            req.headers_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
            if let Ok((mut ws, _)) = tokio_tungstenite::connect_async(req).await {
                let _ = ws.next().await;
                let _ = ws.close(None).await;
            }
            // By first frame.
            let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
                .await
                .unwrap();
            ws.send(Message::text(format!(
                r#"{{"requestId":"a1","auth":{{"token":"{t}"}}}}"#
            )))
            .await
            .unwrap();
            let reply = ws.next().await.unwrap().unwrap();
            assert!(reply.is_text(), "{reply:?}");
            let _ = ws.close(None).await;
        }
    });
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert!(child.wait().unwrap().success());
    let logged = std::fs::read_to_string(dir.join("serve.log")).unwrap();
    // Trace logging was on and saw the control plane's connections.
    assert!(logged.lines().count() > 5, "{logged}");
    assert!(logged.contains("control"), "{logged}");
    assert!(
        !logged.contains(&token),
        "the operator's token is in the log"
    );
    assert!(!logged.contains(&wrong), "a refused token is in the log");
    assert!(
        !logged.contains(&token[4..20]),
        "part of the token is in the log"
    );
}
