//! Humans in the loop over the socket: a held call's params shown to operators (checked
//! against its digest), an agent waiting for the decision, approve and modify (with edited
//! arguments) released by one client call, and expiry of a call nobody decides.

use std::time::Duration;

use tollgate_audit::SessionEvent;
use tollgate_client::{HumanWait, ShareParams};
use tollgate_core::{json, Verdict};
use tollgate_proto::sp1;

use crate::{config, connect, session_events, start};

fn wait(secs: u64) -> HumanWait {
    HumanWait {
        timeout: Duration::from_secs(secs),
        share_params: ShareParams::All,
    }
}

/// The one held call of the agent's session, as operators list it.
async fn listed(op: &tollgate_client::DaemonClient, session: &str) -> sp1::HitlPending {
    listed_when(op, session, |_| true).await
}

/// The held call of the session once `ready` holds for it.
async fn listed_when(
    op: &tollgate_client::DaemonClient,
    session: &str,
    ready: fn(&sp1::HitlPending) -> bool,
) -> sp1::HitlPending {
    for _ in 0..500 {
        if let Some(p) = op
            .hitl_list()
            .await
            .unwrap()
            .into_iter()
            .find(|p| p.session_id == session && ready(p))
        {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("nothing held for {session}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_the_params_only_when_they_hash_to_the_held_call() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let agent = connect(&d.socket, "reviewed").await;
    let op = crate::operator(&d.socket).await;
    let p = json::parse_str(r#"{"to":"acct_1","amount":100}"#).unwrap();
    let v = agent.pre_exec("pay", &p, 1.0).await;
    assert_eq!(v.verdict, Verdict::Hitl);
    let before = listed(&op, agent.session_id()).await;
    assert!(!before.params_known && before.params_json.is_empty());
    let t = before.transition.clone().unwrap();
    assert_eq!(t.held_reason, "hitl_all_calls");
    assert_eq!(t.estimated_cost_nanos, 1_000_000_000);
    assert!(t.expires_at_ns > t.requested_at_ns, "{t:?}");
    // Other params than the held call's are refused, and nothing is shown.
    let other = json::parse_str(r#"{"to":"acct_attacker","amount":100}"#).unwrap();
    let e = agent
        .send_held_params(v.call_number, &other)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "fail_closed:invalid_request");
    // A call that is not held is refused too.
    assert!(agent.send_held_params(v.call_number + 5, &p).await.is_err());
    assert!(!listed(&op, agent.session_id()).await.params_known);
    // The held call's own params are shown, canonical.
    agent.send_held_params(v.call_number, &p).await.unwrap();
    let after = listed(&op, agent.session_id()).await;
    assert!(after.params_known);
    assert_eq!(after.params_json, r#"{"amount":100,"to":"acct_1"}"#);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_releases_the_waiting_call_with_its_own_params() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let agent = connect(&d.socket, "reviewed").await;
    let op = crate::operator(&d.socket).await;
    let session = agent.session_id().to_owned();
    let decider = tokio::spawn(async move {
        // The client shows the params by default, right after the HITL verdict.
        let held = listed_when(&op, &session, |p| p.params_known).await;
        assert_eq!(held.params_json, r#"{"to":"acct_1"}"#);
        op.hitl_decide(sp1::HitlDecideRequest {
            session_id: session,
            decision: "approve".into(),
            operator_id: "alice".into(),
            note: "looks right".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    });
    let p = json::parse_str(r#"{"to":"acct_1"}"#).unwrap();
    let r = agent.pre_exec_or_wait("pay", &p, 0.5, wait(20)).await;
    decider.await.unwrap();
    assert_eq!(r.decision, "approve");
    assert!(r.allowed(), "{r:?}");
    assert_eq!(r.verdict.reason, "hitl_transition:approve");
    assert_eq!(r.params, Some(p));
    // Waiting on a call that is no longer held: nothing to wait for.
    let none = agent
        .await_decision(1, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(none.outcome, "none");
    d.stop().await;
    let decisions: Vec<_> = session_events(dir.path())
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::HumanDecision(h) => Some(h),
            _ => None,
        })
        .collect();
    assert_eq!(decisions.len(), 1);
    assert_eq!(
        (
            decisions[0].operator_id.as_str(),
            decisions[0].note.as_str()
        ),
        ("alice", "looks right")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modify_with_edited_arguments_runs_exactly_those() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let agent = connect(&d.socket, "reviewed").await;
    let op = crate::operator(&d.socket).await;
    let session = agent.session_id().to_owned();
    let decider = tokio::spawn(async move {
        listed(&op, &session).await;
        // Edited by a human: other spacing and key order; the daemon canonicalizes.
        op.hitl_decide(sp1::HitlDecideRequest {
            session_id: session,
            decision: "modify".into(),
            operator_id: "bob".into(),
            note: "smaller amount".into(),
            successor_params_json: "{ \"to\": \"acct_1\",\n  \"amount\": 10 }".into(),
            ..Default::default()
        })
        .await
        .unwrap()
    });
    let p = json::parse_str(r#"{"to":"acct_1","amount":1000}"#).unwrap();
    let r = agent.pre_exec_or_wait("pay", &p, 0.5, wait(20)).await;
    let response = decider.await.unwrap();
    assert_eq!(
        response.successor_params_json,
        r#"{"amount":10,"to":"acct_1"}"#
    );
    let edited = json::parse_str(r#"{"amount":10,"to":"acct_1"}"#).unwrap();
    assert_eq!(r.decision, "modify");
    assert!(r.allowed(), "{r:?}");
    assert_eq!(r.verdict.reason, "hitl_transition:modify_successor");
    assert_eq!(r.params, Some(edited.clone()));
    d.stop().await;
    let h = session_events(dir.path())
        .into_iter()
        .find_map(|e| match e {
            SessionEvent::HumanDecision(h) => Some(h),
            _ => None,
        })
        .unwrap();
    let t = response.transition.unwrap();
    assert_eq!(
        h.successor,
        Some((t.successor_nonce, json::canonical_hash(&edited).unwrap()))
    );
    assert_ne!(
        t.successor_nonce, 0,
        "the daemon assigned the successor's nonce"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_nobody_decides_expires_and_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.limits.hitl_timeout = Duration::from_secs(1);
    let d = start(c).await;
    let agent = connect(&d.socket, "reviewed").await;
    let p = json::parse_str(r#"{"to":"acct_1"}"#).unwrap();
    let r = agent.pre_exec_or_wait("pay", &p, 0.0, wait(20)).await;
    assert_eq!(r.decision, "expire");
    assert!(!r.allowed());
    assert_eq!(r.verdict.reason, "hitl_transition:reject");
    // The held call, dispatched again, is refused.
    let again = agent.pre_exec("pay", &p, 0.0).await;
    assert_eq!(again.verdict, Verdict::Deny);
    // And a client that waits less than the daemon's timeout is told to wait on.
    let agent2 = connect(&d.socket, "reviewed").await;
    let v = agent2.pre_exec("pay", &p, 0.0).await;
    let pending = agent2
        .await_decision(v.call_number, Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(pending.outcome, "pending");
    d.stop().await;
    let expired: Vec<_> = session_events(dir.path())
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::HumanDecision(h) => Some(h),
            _ => None,
        })
        .collect();
    assert!(!expired.is_empty());
    assert_eq!(expired[0].decision.as_str(), "expire");
    assert_eq!(expired[0].operator_id, "tollgate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn params_over_64_kib_are_neither_shown_nor_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let agent = connect(&d.socket, "reviewed").await;
    let op = crate::operator(&d.socket).await;
    let big = json::parse_str(&format!(r#"{{"blob":"{}"}}"#, "x".repeat(64 * 1024))).unwrap();
    let v = agent.pre_exec("pay", &big, 0.0).await;
    assert_eq!(v.verdict, Verdict::Hitl);
    // Shown: refused as too large, and the console keeps showing the digest alone.
    let e = agent
        .send_held_params(v.call_number, &big)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "fail_closed:message_too_large", "{e:?}");
    assert!(!listed(&op, agent.session_id()).await.params_known);
    // Edited into a successor over the bound: refused, nothing decided, still held.
    let r = op
        .hitl_decide(sp1::HitlDecideRequest {
            session_id: agent.session_id().to_owned(),
            decision: "modify".into(),
            operator_id: "bob".into(),
            note: "too big".into(),
            successor_params_json: format!(r#"{{"blob":"{}"}}"#, "y".repeat(64 * 1024)),
            ..Default::default()
        })
        .await;
    assert!(r.is_err(), "{r:?}");
    let still = listed(&op, agent.session_id()).await;
    assert_eq!(still.transition.unwrap().decision, "");
    d.stop().await;
    assert!(!session_events(dir.path())
        .iter()
        .any(|e| matches!(e, SessionEvent::HumanDecision(_))));
}
