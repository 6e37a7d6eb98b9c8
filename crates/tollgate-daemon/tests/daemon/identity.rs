//! Who an agent is (issue 15 §3) and the money edges (§4): ids are checked with one rule
//! on every transport, negative amounts however small are refused.

use tollgate_client::{ClientError, DaemonClient};
use tollgate_core::{json, Verdict};
use tollgate_proto::sp1::{self, ErrorCode};

use crate::{audited, client_config, config, connect, session_events, start};

fn digest(p: &json::Value) -> Vec<u8> {
    json::canonical_hash(p).unwrap().0.to_vec()
}

/// The code a registration as `agent` is refused with.
async fn refused(socket: &std::path::Path, agent: &str) -> ErrorCode {
    match DaemonClient::connect(client_config(socket, agent)).await {
        Ok(_) => panic!("{agent:?} was registered"),
        Err(ClientError::Refused { code, .. }) => code,
        Err(e) => panic!("{agent:?}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_agent_ids_are_invalid_requests_and_open_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.limits.registrations_per_second_per_peer = 1000;
    let d = start(c).await;
    for bad in [
        "research-bot ",
        " research-bot",
        "research\tbot",
        "research-bot\u{1}",
        "research-bot\u{0}",
        "research-bot\u{7f}",
        "research-bot\u{a0}",
        "research-bot\u{2028}",
        "research-bot\u{3000}",
        "research-bot\u{200b}",
        "",
    ] {
        assert_eq!(
            refused(&d.socket, bad).await,
            ErrorCode::InvalidRequest,
            "{bad:?}"
        );
    }
    let long = "a".repeat(129);
    assert_eq!(refused(&d.socket, &long).await, ErrorCode::InvalidRequest);
    // The set's edges are served.
    for good in ["a".repeat(128).as_str(), "acme.bot:1/x@y+z_w-v"] {
        connect(&d.socket, good).await;
    }
    d.stop().await;
    let opened = session_events(dir.path())
        .into_iter()
        .filter(|e| matches!(e, tollgate_audit::SessionEvent::Opened(_)))
        .count();
    assert_eq!(opened, 2, "only the two good ids opened sessions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trailing_space_does_not_dodge_the_agents_guard() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let held = connect(&d.socket, "reviewed").await;
    let p = json::parse_str("{}").unwrap();
    assert_eq!(held.pre_exec("t", &p, 0.0).await.verdict, Verdict::Hitl);
    assert_eq!(
        refused(&d.socket, "reviewed ").await,
        ErrorCode::InvalidRequest
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_estimate_however_small_is_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.limits.registrations_per_second_per_peer = 1000;
    let d = start(c).await;
    let p = json::parse_str(r#"{"q":1}"#).unwrap();
    for (n, cost) in [-4e-10, -1e-12, -f64::MIN_POSITIVE].into_iter().enumerate() {
        let agent = connect(&d.socket, "research-bot").await;
        let v = agent
            .pre_exec_request(sp1::PreExecRequest {
                session_id: agent.session_id().to_owned(),
                call_number: 1,
                tool_name: "search".into(),
                tool_params_hash: digest(&p),
                estimated_cost_usd: cost,
                nonce: 1 + n as u64,
                ..Default::default()
            })
            .await;
        assert_eq!(
            (v.verdict, v.reason.as_str()),
            (Verdict::Deny, "policy_violation:malformed_input"),
            "{cost}"
        );
    }
    d.stop().await;
    assert!(audited(dir.path())
        .iter()
        .all(|v| v.verdict == Verdict::Deny));
}

#[test]
fn a_negative_configured_budget_however_small_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for key in ["[guard.default]", "[guard.agents.bot]"] {
        for b in ["-4e-10", "-1e-12", "-0.5"] {
            let e = tollgate_daemon::DaemonConfig::from_toml(
                &format!("{key}\nbudget_usd = {b}\n"),
                dir.path(),
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("budget_usd") && e.contains("negative"),
                "{b}: {e}"
            );
        }
    }
    for bad in ["\"bot \"", "\"bot\\u00a0\"", "\"b\\u0001\""] {
        let e = tollgate_daemon::DaemonConfig::from_toml(
            &format!("[guard.agents.{bad}]\nbudget_usd = 1\n"),
            dir.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("guard.agents"), "{bad}: {e}");
        let e = tollgate_daemon::DaemonConfig::from_toml(
            &format!(
                "[[organization]]\nid = {bad}\nsecret = \"0123456789abcdef0123\"\noperator_secret = \"fedcba9876543210fedc\"\n"
            ),
            dir.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("organization[0].id"), "{bad}: {e}");
    }
}
