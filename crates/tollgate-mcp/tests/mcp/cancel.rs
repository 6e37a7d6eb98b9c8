//! Issue 16 §3: a host's `notifications/cancelled` is honoured at once (a held call is
//! expired and never runs; a forwarded call is cancelled upstream), and a host waiting on
//! a held call gets progress notifications.

use std::time::Duration;

use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest};
use rmcp::service::PeerRequestOptions;
use tollgate_audit::SessionEvent;
use tollgate_core::HumanDecision;

use crate::{denied, start, text, Host, Kit};

/// Poll `ok` (no timing threshold: a bounded number of short waits).
pub async fn eventually(what: &str, mut ok: impl FnMut() -> bool) {
    for _ in 0..600 {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never happened: {what}");
}

/// Send `tools/call` `tool` as a request the test can cancel.
pub async fn cancellable(
    s: &crate::Session,
    tool: &str,
    args: serde_json::Value,
) -> rmcp::service::RequestHandle<rmcp::RoleClient> {
    let serde_json::Value::Object(args) = args else {
        panic!("an object")
    };
    let mut p = CallToolRequestParams::new(tool.to_owned());
    p.arguments = Some(args);
    s.client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(p)),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn a_call_cancelled_while_its_user_is_asked_is_expired_and_never_runs() {
    let kit = Kit::new(
        "[gateway]\nhitl_timeout_secs = 300\nprogress_interval_secs = 1\n\
         [guard]\nhitl_mode = \"always\"\n\
         [library]\naudit_dir = \"audit\"\naudit_key = \"audit.key\"\n",
    );
    kit.make_audit_key();
    // The host's user never answers; the host gives up and cancels.
    let host = Host {
        elicitation: true,
        answer: None,
        ..Host::default()
    };
    let asked = host.asked.clone();
    let progress = host.progress.clone();
    let s = start(&kit.config(), host).await;
    let call = cancellable(&s, "add", serde_json::json!({"a": 1, "b": 2})).await;
    eventually("the user is asked", || !asked.lock().unwrap().is_empty()).await;
    eventually("progress while the user is asked", || {
        progress
            .lock()
            .unwrap()
            .iter()
            .any(|m| m.contains("waiting for your approval"))
    })
    .await;
    call.cancel(Some("the user closed the dialog".into()))
        .await
        .unwrap();
    // The held call is expired, audited, at once (not at hitl_timeout_secs = 300).
    eventually("the held call is expired in the audit log", || {
        kit.audited().iter().any(
            |e| matches!(e, SessionEvent::HumanDecision(d) if d.decision == HumanDecision::Expire),
        )
    })
    .await;
    assert!(kit.invocations().is_empty(), "{:?}", kit.invocations());
    s.close().await;
    assert!(
        kit.invocations().is_empty(),
        "a cancelled call never runs afterwards"
    );
}

#[tokio::test]
async fn a_forwarded_call_the_host_cancels_is_cancelled_upstream_at_once() {
    // `hang` never answers; the tool timeout (300 s) is far away.
    let kit =
        Kit::new("[gateway]\nprogress_interval_secs = 1\n[tools.kit.hang]\ntimeout_secs = 300\n");
    let progress = Host::default().progress;
    let host = Host {
        progress: progress.clone(),
        ..Host::default()
    };
    let s = start(&kit.config(), host).await;
    let call = cancellable(&s, "hang", serde_json::json!({})).await;
    eventually("the upstream runs it", || kit.invocations() == ["hang"]).await;
    eventually("progress while it runs", || {
        progress
            .lock()
            .unwrap()
            .iter()
            .any(|m| m.contains("is running"))
    })
    .await;
    call.cancel(None).await.unwrap();
    eventually("the upstream is told to stop", || {
        kit.invocations() == ["hang", "hang:cancelled"]
    })
    .await;
    // The session goes on: the next call runs.
    let r = s.ok("add", serde_json::json!({"a": 2, "b": 2})).await;
    assert!(!denied(&r), "{}", text(&r));
    assert_eq!(text(&r), "4");
    s.close().await;
}
