//! Issue 17 §4: sessions end, and one organization cannot starve another. An agent closes
//! its own session (audited, refused ever after, even across a restart); a silent session
//! ends as idle while an active one does not; `max_sessions` counts live sessions;
//! organizations have their own quotas; registration limits are per organization and
//! peer; a close racing decisions or a held call leaves nothing after it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_audit::{CloseReason, SessionEvent};
use tollgate_client::{ClientConfig, ClientError, DaemonClient};
use tollgate_core::{json, Verdict};
use tollgate_proto::sp1::{self, ErrorCode};

use crate::bounds::{two_orgs, OTHER_ORG, OTHER_SECRET};
use crate::{client_config, config, connect, operator, session_events, start};

fn refused_code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Err(ClientError::Refused { code, .. }) => code,
        other => panic!("not a refusal: {other:?}"),
    }
}

fn closes(dir: &std::path::Path) -> Vec<tollgate_audit::CloseRecord> {
    session_events(dir)
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::Closed(c) => Some(c),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_closes_its_session_and_it_never_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let p = json::parse_str(r#"{"q":1}"#).unwrap();
    let agent = connect(&d.socket, "research-bot").await;
    assert!(agent.pre_exec("search", &p, 0.1).await.allowed());
    let id = agent.session_id().to_owned();
    let closed = agent.close().await.unwrap();
    assert_eq!(closed.session_id, id);
    assert!(!closed.audit_entry_id.is_empty());
    assert_eq!(closed.budget_remaining_nanos, 400_000_000);
    // Nothing more is decided on it, by this connection or any other.
    let v = agent.pre_exec("search", &p, 0.1).await;
    assert_eq!(v.verdict, Verdict::Deny);
    assert!(
        matches!(
            v.error,
            Some(ClientError::Refused {
                code: ErrorCode::SessionNotFound,
                ..
            })
        ),
        "{v:?}"
    );
    assert_eq!(
        refused_code(agent.close().await),
        ErrorCode::SessionNotFound
    );
    assert_eq!(
        refused_code(DaemonClient::resume(client_config(&d.socket, "research-bot"), &id).await),
        ErrorCode::SessionNotFound
    );
    d.stop().await;
    // Nor after a restart: the snapshot and the fold of the log forgot it.
    let d = start(config(dir.path())).await;
    assert_eq!(
        refused_code(DaemonClient::resume(client_config(&d.socket, "research-bot"), &id).await),
        ErrorCode::SessionNotFound
    );
    d.stop().await;
    let events = session_events(dir.path());
    let mine: Vec<&SessionEvent> = events.iter().filter(|e| e.session_id() == id).collect();
    assert!(matches!(
        mine.last(),
        Some(SessionEvent::Closed(c)) if c.reason == CloseReason::Agent
    ));
    assert_eq!(mine.len(), 3, "opened, one verdict, closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_sessions_counts_live_sessions_and_each_organization_has_its_quota() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = two_orgs(dir.path());
    c.limits.registrations_per_second_per_peer = 1000;
    c.limits.max_sessions = 4;
    c.session_quotas.insert(crate::ORG.into(), 2);
    let other = |socket: &std::path::Path, agent: &str| {
        let mut cfg = ClientConfig::new(socket, OTHER_ORG, OTHER_SECRET, agent);
        cfg.timeout = Duration::from_secs(5);
        cfg
    };
    let d = start(c.clone()).await;
    let a1 = connect(&d.socket, "a1").await;
    let _a2 = connect(&d.socket, "a2").await;
    // acme is at its quota; globex is not held back by it.
    assert_eq!(
        refused_code(DaemonClient::connect(client_config(&d.socket, "a3")).await),
        ErrorCode::OrganizationQuotaExceeded
    );
    let g1 = DaemonClient::connect(other(&d.socket, "g1")).await.unwrap();
    let _g2 = DaemonClient::connect(other(&d.socket, "g2")).await.unwrap();
    // The daemon's cap (4) is reached: live sessions count, so a close makes room.
    assert_eq!(
        refused_code(DaemonClient::connect(other(&d.socket, "g3")).await),
        ErrorCode::OrganizationQuotaExceeded
    );
    g1.close().await.unwrap();
    let _g3 = DaemonClient::connect(other(&d.socket, "g3")).await.unwrap();
    a1.close().await.unwrap();
    let _a3 = connect(&d.socket, "a3").await;
    d.stop().await;
    // After a restart the live sessions are counted again: acme still has 2.
    let d = start(c).await;
    assert_eq!(
        refused_code(DaemonClient::connect(client_config(&d.socket, "a4")).await),
        ErrorCode::OrganizationQuotaExceeded
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_limits_are_per_organization_and_peer() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = two_orgs(dir.path());
    c.limits.registrations_per_second_per_peer = 3;
    let d = start(c).await;
    // acme's burst spends acme's allowance for this uid...
    let mut limited = false;
    for n in 0..6 {
        match DaemonClient::connect(client_config(&d.socket, &format!("a{n}"))).await {
            Ok(_) => {}
            Err(ClientError::Refused {
                code: ErrorCode::RateLimited,
                ..
            }) => {
                limited = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(limited, "acme was never rate limited");
    // ...not globex's: same uid, another organization.
    let mut cfg = ClientConfig::new(&d.socket, OTHER_ORG, OTHER_SECRET, "g");
    cfg.timeout = Duration::from_secs(5);
    DaemonClient::connect(cfg)
        .await
        .expect("globex was limited by acme's registrations");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_session_ends_as_idle_and_an_active_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.limits.registrations_per_second_per_peer = 1000;
    c.limits.session_idle_timeout = Duration::from_secs(2);
    c.limits.heartbeat_interval = Duration::from_secs(3600);
    let d = start(c).await;
    let quiet = connect(&d.socket, "quiet").await;
    let busy = connect(&d.socket, "busy").await;
    let quiet_id = quiet.session_id().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        busy.heartbeat(1.0).await.unwrap();
        match busy.state_of(&quiet_id).await {
            Ok(_) => {}
            Err(ClientError::Refused {
                code: ErrorCode::SessionNotFound,
                ..
            }) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "the silent session never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The active one was kept, and is still served.
    let p = json::parse_str("{}").unwrap();
    assert!(busy.pre_exec("t", &p, 0.0).await.allowed());
    assert_eq!(quiet.pre_exec("t", &p, 0.0).await.verdict, Verdict::Deny);
    d.stop().await;
    let closes = closes(dir.path());
    assert_eq!(closes.len(), 1, "{closes:?}");
    assert_eq!(closes[0].session_id, quiet_id);
    assert_eq!(closes[0].reason, CloseReason::Idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_withdraws_its_held_call() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let agent = Arc::new(connect(&d.socket, "reviewed").await);
    let id = agent.session_id().to_owned();
    let waiter = {
        let agent = agent.clone();
        tokio::spawn(async move {
            let p = json::parse_str(r#"{"to":"x"}"#).unwrap();
            let wait = tollgate_client::HumanWait {
                timeout: Duration::from_secs(120),
                ..Default::default()
            };
            agent.pre_exec_or_wait("pay", &p, 0.01, wait).await
        })
    };
    let op = operator(&d.socket).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !op
        .hitl_list()
        .await
        .unwrap()
        .iter()
        .any(|h| h.session_id == id)
    {
        assert!(Instant::now() < deadline, "the call was never held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Closed through another connection of the same agent, while the call is held and
    // its agent waits for a human.
    let other = DaemonClient::resume(client_config(&d.socket, "reviewed"), &id)
        .await
        .unwrap();
    other.close().await.unwrap();
    let released = waiter.await.unwrap();
    assert!(!released.allowed(), "{released:?}");
    assert!(op
        .hitl_list()
        .await
        .unwrap()
        .iter()
        .all(|h| h.session_id != id));
    let e = op
        .hitl_decide(sp1::HitlDecideRequest {
            session_id: id.clone(),
            decision: "approve".into(),
            operator_id: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Refused {
                code: ErrorCode::SessionNotFound,
                ..
            }
        ),
        "{e}"
    );
    d.stop().await;
    let events = session_events(dir.path());
    let mine: Vec<&SessionEvent> = events.iter().filter(|e| e.session_id() == id).collect();
    assert!(
        matches!(mine.last(), Some(SessionEvent::Closed(_))),
        "{mine:?}"
    );
    assert!(!mine
        .iter()
        .any(|e| matches!(e, SessionEvent::HumanDecision(_))));
}

/// Decisions in flight on one connection (pipelined) while the session is closed: each is
/// decided before the close (answered, and in the log before it) or refused; nothing is in
/// the log after the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_racing_decisions_leaves_nothing_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.limits.registrations_per_second_per_peer = 1000;
    let mut g = c.default_guard.clone();
    g.max_repeat_calls = 1000;
    g.budget = tollgate_core::Money::from_usd(100.0).unwrap();
    c.agent_guards.insert("racer".into(), g);
    let d = start(c).await;
    let mut allowed = Vec::new();
    let mut ids = Vec::new();
    for round in 0..10usize {
        let agent = Arc::new(connect(&d.socket, "racer").await);
        ids.push(agent.session_id().to_owned());
        let mut tasks = Vec::new();
        for n in 0..8usize {
            let caller = agent.clone();
            tasks.push(tokio::spawn(async move {
                let p = json::parse_str(&format!(r#"{{"n":{n}}}"#)).unwrap();
                caller.pre_exec("t", &p, 0.01).await
            }));
            if n == round % 8 {
                let agent = agent.clone();
                tasks.push(tokio::spawn(async move {
                    agent.close().await.unwrap();
                    agent
                        .pre_exec("t", &json::parse_str("{}").unwrap(), 0.0)
                        .await
                }));
            }
        }
        for t in tasks {
            let v = t.await.unwrap();
            if v.allowed() {
                allowed.push(v.response.unwrap().audit_entry_id);
            }
        }
    }
    d.stop().await;
    let public = std::fs::read_to_string(dir.path().join("audit.pub")).unwrap();
    let key = tollgate_audit::keys::parse_public_key(&public).unwrap();
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(key),
        ..Default::default()
    };
    let mut closed = std::collections::HashSet::new();
    let mut logged = std::collections::HashSet::new();
    tollgate_audit::verify_paths(&[dir.path().join("audit")], &opts, &mut |e| {
        if let tollgate_audit::Event::Session(ev) = &e.event {
            assert!(
                !closed.contains(ev.session_id()),
                "an entry after its session's close: {ev:?}"
            );
            if matches!(ev, SessionEvent::Closed(_)) {
                closed.insert(ev.session_id().to_owned());
            }
            logged.insert(e.entry_id.to_string());
        }
    })
    .unwrap();
    assert_eq!(closed.len(), ids.len());
    for a in &allowed {
        assert!(logged.contains(a), "an ALLOW not in the log");
    }
}
