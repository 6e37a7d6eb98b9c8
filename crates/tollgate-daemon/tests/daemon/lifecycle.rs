//! Heartbeats and staleness, restarts, shutdown.

use std::time::Duration;

use tollgate_core::{json, Verdict};
use tollgate_proto::sp1::{self, ErrorCode};

use crate::{audited, config, connect, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_misses_three_heartbeats_is_stale_until_it_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    // Stale 3 s after the last heartbeat: long enough for a registration and a call on a
    // loaded machine (each waits for an fsync); staleness is then waited for, not timed.
    cfg.limits.heartbeat_interval = Duration::from_secs(1);
    let d = start(cfg).await;
    let c = connect(&d.socket, "research-bot").await;
    let p = json::parse_str("{}").unwrap();
    assert!(c.pre_exec("t", &p, 0.0).await.allowed());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while c.session_state().await.unwrap().status != sp1::SessionStatus::Stale as i32 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not stale 30 s after the last heartbeat"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let v = c
        .pre_exec("t", &json::parse_str(r#"{"a":1}"#).unwrap(), 0.0)
        .await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "fail_closed:session_stale")
    );
    let s = c.session_state().await.unwrap();
    assert_eq!(s.status, sp1::SessionStatus::Stale as i32);
    // Refused, not denied: the circuit did not trip.
    assert!(!s.circuit_tripped);
    let ack = c.heartbeat(0.5).await.unwrap();
    assert_eq!(ack.status, sp1::SessionStatus::Active as i32);
    assert!(c
        .pre_exec("t", &json::parse_str(r#"{"a":2}"#).unwrap(), 0.0)
        .await
        .allowed());
    d.stop().await;
}

/// Budgets, tripped circuits, seen nonces and pending transitions survive a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_every_kind_of_state() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let spender = connect(&d.socket, "research-bot").await;
    let p = json::parse_str(r#"{"q":1}"#).unwrap();
    let hash = tollgate_core::Params::json(&p)
        .canonical_digest()
        .unwrap()
        .0
        .to_vec();
    let allowed = spender
        .pre_exec_request(sp1::PreExecRequest {
            session_id: spender.session_id().to_owned(),
            call_number: 1,
            tool_name: "t".into(),
            tool_params_hash: hash.clone(),
            estimated_cost_usd: 0.2,
            nonce: 4242,
            ..Default::default()
        })
        .await;
    assert!(allowed.allowed());
    let tripped = connect(&d.socket, "research-bot").await;
    let v = tripped
        .pre_exec("t", &json::parse_str("{}").unwrap(), 5.0)
        .await;
    assert_eq!(v.reason, "budget_overrun");
    let paused = connect(&d.socket, "reviewed").await;
    assert_eq!(paused.pre_exec("t", &p, 0.0).await.verdict, Verdict::Hitl);
    let ids = (
        spender.session_id().to_owned(),
        tripped.session_id().to_owned(),
        paused.session_id().to_owned(),
    );
    drop((spender, tripped, paused));
    d.stop().await;

    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let s = c.state_of(&ids.0).await.unwrap();
    assert_eq!(
        (s.budget_remaining_nanos, s.total_calls, s.last_call_number),
        (300_000_000, 1, 1)
    );
    // The nonce is remembered: replaying call 1 under a new number is refused.
    let spender = tollgate_client::DaemonClient::resume(
        crate::client_config(&d.socket, "research-bot"),
        &ids.0,
    )
    .await
    .unwrap();
    let replay = spender
        .pre_exec_request(sp1::PreExecRequest {
            session_id: ids.0.clone(),
            call_number: 2,
            tool_name: "t".into(),
            tool_params_hash: hash,
            nonce: 4242,
            ..Default::default()
        })
        .await;
    assert_eq!(replay.reason, "policy_violation:duplicate_nonce");
    let s = c.state_of(&ids.1).await.unwrap();
    assert!(s.circuit_tripped);
    assert_eq!(s.circuit_trip_reason, "budget_overrun");
    let s = c.state_of(&ids.2).await.unwrap();
    assert_eq!(s.status, sp1::SessionStatus::Paused as i32);
    assert_eq!(s.pending_transition.unwrap().tool_name, "t");
    d.stop().await;

    // Both runs wrote one verifiable chain.
    let log = audited(dir.path());
    assert_eq!(log.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_errors_not_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let e = c.state_of("s_missing").await.unwrap_err();
    assert!(matches!(
        e,
        tollgate_client::ClientError::Refused {
            code: ErrorCode::SessionNotFound,
            ..
        }
    ));
    d.stop().await;
    assert!(audited(dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_heartbeats_keep_a_session_live() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    // Stale 3 s after the last heartbeat; heartbeats every 100 ms for longer than that.
    cfg.limits.heartbeat_interval = Duration::from_secs(1);
    let d = start(cfg).await;
    let c = std::sync::Arc::new(connect(&d.socket, "research-bot").await);
    let hb = c.spawn_heartbeats(Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let v = c.pre_exec("t", &json::parse_str("{}").unwrap(), 0.0).await;
    assert!(v.allowed(), "{v:?}");
    hb.abort();
    d.stop().await;
}

/// A closed session is not heartbeated (the daemon would answer each with
/// `SESSION_NOT_FOUND`): `close` stops the client's background heartbeats, whose task
/// ends, though the client is still alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_stops_its_background_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = std::sync::Arc::new(connect(&d.socket, "research-bot").await);
    let hb = c.spawn_heartbeats(Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!hb.is_finished(), "heartbeats stopped before the close");
    c.close().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), hb)
        .await
        .expect("heartbeats went on after the session was closed")
        .unwrap();
    drop(c);
    d.stop().await;
}

/// A session closed through another connection (or ended idle) is gone for good: the
/// first heartbeat answered `SESSION_NOT_FOUND` ends the background heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_stop_once_the_daemon_no_longer_knows_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = std::sync::Arc::new(connect(&d.socket, "research-bot").await);
    let hb = c.spawn_heartbeats(Duration::from_millis(20));
    let other = tollgate_client::DaemonClient::resume(
        crate::client_config(&d.socket, "research-bot"),
        c.session_id(),
    )
    .await
    .unwrap();
    other.close().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), hb)
        .await
        .expect("heartbeats went on for a session the daemon closed")
        .unwrap();
    drop(c);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_and_connection_caps() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.max_sessions = 2;
    // Three for authenticated connections, three for those not authenticated yet.
    cfg.limits.max_connections = 6;
    let d = start(cfg).await;
    let a = connect(&d.socket, "research-bot").await;
    let _b = connect(&d.socket, "research-bot").await;
    let third =
        tollgate_client::DaemonClient::connect(crate::client_config(&d.socket, "research-bot"))
            .await;
    assert!(
        matches!(
            third,
            Err(tollgate_client::ClientError::Refused {
                code: ErrorCode::OrganizationQuotaExceeded,
                ..
            })
        ),
        "{third:?}"
    );
    // Two clients and the refused one's connection hold the three authenticated places
    // (an unauthenticated one does not take one): the fourth client is turned away.
    let _c = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    let fourth =
        tollgate_client::DaemonClient::connect(crate::client_config(&d.socket, "research-bot"))
            .await;
    assert!(fourth.is_err(), "{fourth:?}");
    // Existing sessions are unaffected.
    assert!(a
        .pre_exec("t", &json::parse_str("{}").unwrap(), 0.0)
        .await
        .allowed());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_budget_is_shared_by_its_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    let mut g = cfg.guard_for("research-bot").clone();
    g.budget_scope = tollgate_core::BudgetScope::PerAgent;
    g.budget = tollgate_core::Money::from_usd(1.0).unwrap();
    cfg.agent_guards.insert("team".into(), g);
    let d = start(cfg).await;
    let a = connect(&d.socket, "team").await;
    let b = connect(&d.socket, "team").await;
    let v = a
        .pre_exec("buy", &json::parse_str(r#"{"n":1}"#).unwrap(), 0.6)
        .await;
    assert!(v.allowed());
    // The other session of the same agent sees what the first reserved.
    let v = b
        .pre_exec("buy", &json::parse_str(r#"{"n":2}"#).unwrap(), 0.6)
        .await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "budget_overrun")
    );
    let v = connect(&d.socket, "team")
        .await
        .pre_exec("buy", &json::parse_str(r#"{"n":3}"#).unwrap(), 0.4)
        .await;
    assert!(v.allowed(), "{v:?}");
    d.stop().await;
}

/// The frame deadline runs from a frame's first byte, never between frames: a client
/// silent for longer than `frame_timeout` (but less than the idle timeout) is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_between_frames_is_governed_by_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.frame_timeout = Duration::from_millis(100);
    cfg.limits.idle_timeout = Duration::from_secs(300);
    let d = start(cfg).await;
    let c = connect(&d.socket, "research-bot").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let v = c.pre_exec("t", &json::parse_str("{}").unwrap(), 0.0).await;
    assert!(v.allowed(), "{v:?}");
    d.stop().await;
}

/// A connection that sends nothing for the idle timeout after its last reply gets an
/// unsealed `INVALID_REQUEST` ("idle timeout") and is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_told_and_closed() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.idle_timeout = Duration::from_millis(300);
    let d = start(cfg).await;
    let mut raw = tokio::net::UnixStream::connect(&d.socket).await.unwrap();
    let register = tollgate_proto::auth::seal(
        &tollgate_proto::auth::MessageKey::derive(crate::SECRET),
        &crate::bounds::register_envelope("acme", "r1"),
    )
    .unwrap();
    raw.write_all(&tollgate_proto::frame::frame_bytes(&register).unwrap())
        .await
        .unwrap();
    assert!(crate::hostile::read_reply(&mut raw).await.is_some());
    let reply = crate::hostile::read_reply(&mut raw).await;
    assert_eq!(
        crate::hostile::error_code(&reply),
        Some(ErrorCode::InvalidRequest)
    );
    assert!(reply.unwrap().hmac.is_empty());
    assert!(crate::hostile::closed(&mut raw).await);
    d.stop().await;
}

/// With any `[[organization]]` configured there is no `default` organization: a register
/// without `organization_id` (or naming `default`) gets the unsealed
/// `AUTHENTICATION_FAILED` an unknown organization gets, and no default secret is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_organizations_replace_the_default_one() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[daemon]\ndata_dir = {:?}\n[[organization]]\nid = \"acme\"\nsecret = {:?}\n",
        dir.path().to_str().unwrap(),
        std::str::from_utf8(crate::SECRET).unwrap(),
    );
    let cfg = tollgate_daemon::DaemonConfig::from_toml(&text, dir.path()).unwrap();
    let d = start(cfg).await;
    for org in ["", "default"] {
        let mut c = crate::client_config(&d.socket, "research-bot");
        c.organization_id = org.into();
        let e = tollgate_client::DaemonClient::connect(c).await.unwrap_err();
        assert!(
            matches!(
                e,
                tollgate_client::ClientError::Refused {
                    code: ErrorCode::AuthenticationFailed,
                    ..
                }
            ),
            "organization `{org}`: {e:?}"
        );
        assert_eq!(e.reason(), "fail_closed:authentication_failed");
    }
    assert!(!dir.path().join("secrets/default.secret").exists());
    // The configured organization is served.
    connect(&d.socket, "research-bot").await;
    d.stop().await;
}
