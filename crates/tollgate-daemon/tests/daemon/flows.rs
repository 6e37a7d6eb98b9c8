//! Protocol flows that should work.

use tollgate_core::json;
use tollgate_core::{Params, Verdict};
use tollgate_proto::sp1;

use crate::{audited, config, connect, start};

fn digest(p: &json::Value) -> Vec<u8> {
    Params::json(p).canonical_digest().unwrap().0.to_vec()
}

/// SP/1.0 Appendix A, exactly: budget 0.50, repeat limit 3, four identical web searches at
/// 0.002 each, actual 0.0015: ALLOW 0.498, ALLOW 0.496 (repeat 1), ALLOW 0.494 (repeat 2),
/// DENY max_repeat_exceeded (repeat 3); the circuit trips; every later call is DENY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appendix_a_flow() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let reg = c.registration();
    assert!(reg.session_id.starts_with("s_"));
    assert_eq!(reg.negotiated_protocol, "1.0.0");
    let cfg = reg.active_config.clone().unwrap();
    assert_eq!((cfg.budget_nanos, cfg.max_repeat_calls), (500_000_000, 3));

    let p = json::parse_str(r#"{"q":"rust"}"#).unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let v = c.pre_exec("web_search", &p, 0.002).await;
        let r = v.response.clone().unwrap();
        seen.push((
            v.verdict,
            v.reason.clone(),
            r.budget_remaining_nanos,
            r.repeat_count,
        ));
        if v.allowed() {
            c.post_exec(v.call_number, 0.0015, true, "").await.unwrap();
        }
    }
    assert_eq!(
        seen,
        vec![
            (Verdict::Allow, "within_thresholds".into(), 498_000_000, 0),
            (Verdict::Allow, "within_thresholds".into(), 496_000_000, 1),
            (Verdict::Allow, "within_thresholds".into(), 494_000_000, 2),
            (Verdict::Deny, "max_repeat_exceeded".into(), 494_000_000, 3),
        ]
    );
    let s = c.session_state().await.unwrap();
    assert!(s.circuit_tripped);
    assert_eq!(s.circuit_trip_reason, "max_repeat_exceeded");
    assert_eq!(s.budget_spent_nanos, 6_000_000);
    let v = c
        .pre_exec("other", &json::parse_str("{}").unwrap(), 0.0)
        .await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "circuit_open")
    );
    d.stop().await;

    // Every verdict was written to the audit log, in order, and the log verifies.
    let log = audited(dir.path());
    let got: Vec<(u64, Verdict, &str, i64, i64)> = log
        .iter()
        .map(|e| {
            (
                e.call_number,
                e.verdict,
                e.reason.as_str(),
                e.budget_before.0,
                e.budget_after.0,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                1,
                Verdict::Allow,
                "within_thresholds",
                500_000_000,
                498_000_000
            ),
            (
                2,
                Verdict::Allow,
                "within_thresholds",
                498_000_000,
                496_000_000
            ),
            (
                3,
                Verdict::Allow,
                "within_thresholds",
                496_000_000,
                494_000_000
            ),
            (
                4,
                Verdict::Deny,
                "max_repeat_exceeded",
                494_000_000,
                494_000_000
            ),
            (5, Verdict::Deny, "circuit_open", 494_000_000, 494_000_000),
        ]
    );
    assert!(log
        .iter()
        .all(|e| e.agent_id == "research-bot" && e.organization_id == "acme"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_nonce_is_denied() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let p = json::parse_str(r#"{"q":"a"}"#).unwrap();
    let req = |n: u64| sp1::PreExecRequest {
        session_id: c.session_id().to_owned(),
        call_number: n,
        tool_name: "web_search".into(),
        tool_params_hash: digest(&p),
        nonce: 77,
        ..Default::default()
    };
    let first = c.pre_exec_request(req(1)).await;
    assert_eq!(first.verdict, Verdict::Allow);
    let replay = c.pre_exec_request(req(2)).await;
    assert_eq!(
        (replay.verdict, replay.reason.as_str()),
        (Verdict::Deny, "policy_violation:duplicate_nonce")
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hitl_round_trip_approve_then_single_use() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let agent = connect(&d.socket, "reviewed").await;
    let operator = crate::operator(&d.socket).await;
    let p = json::parse_str(r#"{"amount":100,"to":"acct_1"}"#).unwrap();
    let req = |n: u64, nonce: u64, params: &json::Value| sp1::PreExecRequest {
        session_id: agent.session_id().to_owned(),
        call_number: n,
        tool_name: "wire_transfer".into(),
        tool_params_hash: digest(params),
        estimated_cost_usd: 1.0,
        nonce,
        ..Default::default()
    };
    let v = agent.pre_exec_request(req(1, 900, &p)).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Hitl, "hitl_all_calls")
    );

    // The operator sees it, bound to the call's nonce and digest.
    let pending = operator.hitl_list().await.unwrap();
    let mine: Vec<_> = pending
        .iter()
        .filter(|x| x.session_id == agent.session_id())
        .collect();
    assert_eq!(mine.len(), 1);
    let t = mine[0].transition.clone().unwrap();
    assert_eq!(
        (
            t.original_nonce,
            t.original_args_digest.clone(),
            t.decision.as_str()
        ),
        (900, digest(&p), "")
    );
    assert_eq!(t.tool_name, "wire_transfer");

    // Until someone decides, asking again stays HITL.
    let v = agent.pre_exec_request(req(2, 900, &p)).await;
    assert_eq!(v.reason, "hitl_transition:defer_escalate");

    let r = operator
        .hitl_decide(sp1::HitlDecideRequest {
            session_id: agent.session_id().to_owned(),
            decision: "approve".into(),
            operator_id: "alice@example.com".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!r.audit_entry_id.is_empty());
    // A second, conflicting decision is refused.
    let again = operator
        .hitl_decide(sp1::HitlDecideRequest {
            session_id: agent.session_id().to_owned(),
            decision: "reject".into(),
            operator_id: "mallory".into(),
            ..Default::default()
        })
        .await;
    assert!(
        matches!(
            again,
            Err(tollgate_client::ClientError::Refused {
                code: sp1::ErrorCode::HitlRefused,
                ..
            })
        ),
        "{again:?}"
    );

    // Other arguments under the approval: refused (and the circuit trips).
    let evil = json::parse_str(r#"{"amount":100000,"to":"acct_attacker"}"#).unwrap();
    let agent2 = connect(&d.socket, "reviewed").await;
    let v = agent2
        .pre_exec_request(sp1::PreExecRequest {
            session_id: agent2.session_id().to_owned(),
            ..req(1, 1, &evil)
        })
        .await;
    assert_eq!(v.verdict, Verdict::Hitl); // a different session has nothing approved
    let v = agent.pre_exec_request(req(3, 900, &p)).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Allow, "hitl_transition:approve")
    );
    // Single use: the same call again is a replay.
    let v = agent.pre_exec_request(req(4, 900, &p)).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "policy_violation:duplicate_nonce")
    );
    d.stop().await;

    let log = audited(dir.path());
    let human: Vec<_> = log.iter().filter(|e| e.operator_id.is_some()).collect();
    assert_eq!(human.len(), 1);
    assert_eq!(human[0].operator_id.as_deref(), Some("alice@example.com"));
    assert_eq!(human[0].reason.as_str(), "hitl_transition:approve");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hitl_modify_releases_the_successor_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let agent = connect(&d.socket, "reviewed").await;
    let original = json::parse_str(r#"{"amount":5}"#).unwrap();
    let edited = json::parse_str(r#"{"amount":2}"#).unwrap();
    let req = |n: u64, nonce: u64, params: &json::Value| sp1::PreExecRequest {
        session_id: agent.session_id().to_owned(),
        call_number: n,
        tool_name: "buy".into(),
        tool_params_hash: digest(params),
        nonce,
        ..Default::default()
    };
    assert_eq!(
        agent.pre_exec_request(req(1, 22, &original)).await.verdict,
        Verdict::Hitl
    );
    // The agent holds its organization's secret, but not the operators': it cannot release
    // its own held call, nor list what is held.
    let self_approval = agent
        .hitl_decide(sp1::HitlDecideRequest {
            session_id: agent.session_id().to_owned(),
            decision: "approve".into(),
            operator_id: "the-agent-itself".into(),
            ..Default::default()
        })
        .await;
    assert!(
        matches!(
            self_approval,
            Err(tollgate_client::ClientError::Refused {
                code: sp1::ErrorCode::AuthenticationFailed,
                ..
            })
        ),
        "{self_approval:?}"
    );
    assert!(matches!(
        agent.hitl_list().await,
        Err(tollgate_client::ClientError::Refused {
            code: sp1::ErrorCode::AuthenticationFailed,
            ..
        })
    ));
    crate::operator(&d.socket)
        .await
        .hitl_decide(sp1::HitlDecideRequest {
            session_id: agent.session_id().to_owned(),
            decision: "modify".into(),
            operator_id: "bob".into(),
            successor_nonce: 23,
            successor_args_digest: digest(&edited),
            ..Default::default()
        })
        .await
        .unwrap();
    let v = agent.pre_exec_request(req(2, 23, &edited)).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Allow, "hitl_transition:modify_successor")
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_reports_drift_against_the_daemons_budget() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let ack = c.heartbeat(0.50).await.unwrap();
    assert!(!ack.drift_detected);
    assert_eq!(ack.daemon_budget_remaining, 0.5);
    let v = c.pre_exec("t", &json::parse_str("{}").unwrap(), 0.1).await;
    assert!(v.allowed());
    let ack = c.heartbeat(0.50).await.unwrap();
    assert!(ack.drift_detected);
    assert!((ack.daemon_budget_remaining - 0.4).abs() < 1e-12);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_continues_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let v = c.pre_exec("t", &json::parse_str("{}").unwrap(), 0.1).await;
    assert!(v.allowed());
    let id = c.session_id().to_owned();
    drop(c);
    let r =
        tollgate_client::DaemonClient::resume(crate::client_config(&d.socket, "research-bot"), &id)
            .await
            .unwrap();
    assert!(r.registration().resumed);
    let s = r.registration().state.clone().unwrap();
    assert_eq!(
        (s.last_call_number, s.budget_remaining_nanos),
        (1, 400_000_000)
    );
    // The next call continues the numbering.
    let v = r
        .pre_exec("t", &json::parse_str(r#"{"x":1}"#).unwrap(), 0.0)
        .await;
    assert_eq!(v.call_number, 2);
    assert!(v.allowed());
    // Another agent cannot resume it.
    let other =
        tollgate_client::DaemonClient::resume(crate::client_config(&d.socket, "someone-else"), &id)
            .await;
    assert!(matches!(
        other,
        Err(tollgate_client::ClientError::Refused {
            code: sp1::ErrorCode::SessionNotFound,
            ..
        })
    ));
    d.stop().await;
}
