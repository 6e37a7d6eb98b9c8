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

/// The nonce of the session's first held call, from the audit log's HITL verdict.
async fn held_nonce(d: &crate::Running, session: &str) -> u64 {
    session_events(&d.dir)
        .into_iter()
        .find_map(|e| match e {
            SessionEvent::Verdict(v) if v.session_id == session && v.verdict == Verdict::Hitl => {
                Some(v.nonce)
            }
            _ => None,
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_nobody_decides_expires_and_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // Long enough that the second held call below is still pending when asked about on a
    // loaded machine (its hold waits for an fsync).
    c.limits.hitl_timeout = Duration::from_secs(3);
    let d = start(c).await;
    let agent = connect(&d.socket, "reviewed").await;
    let p = json::parse_str(r#"{"to":"acct_1"}"#).unwrap();
    let r = agent.pre_exec_or_wait("pay", &p, 0.0, wait(20)).await;
    assert_eq!(r.decision, "expire");
    assert!(!r.allowed());
    assert_eq!(r.verdict.reason, "hitl_transition:reject");
    // The held call, dispatched again (its nonce), is refused.
    let again = sp1::PreExecRequest {
        nonce: held_nonce(&d, agent.session_id()).await,
        ..agent.prepare("pay", &p, 0.0)
    };
    let again = agent.pre_exec_request(again).await;
    assert_eq!(
        (again.verdict, again.reason.as_str()),
        (Verdict::Deny, "hitl_transition:reject")
    );
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

/// A random permutation of 0..n (the order humans decide in).
fn shuffled(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).unwrap();
        let j = usize::try_from(u64::from_le_bytes(b) % (i as u64 + 1)).unwrap();
        order.swap(i, j);
    }
    order
}

/// Issue 16 §1: nine calls held at once on one client shared by nine tasks, each decided
/// on its own (named by its call number) in a random order: approved calls run once with
/// their own params, modified ones with the edited params, rejected ones never, and
/// nothing trips the session's circuit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nine_parallel_held_calls_on_one_client_each_get_their_own_decision() {
    const N: usize = 9;
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let agent = std::sync::Arc::new(connect(&d.socket, "reviewed").await);
    let op = crate::operator(&d.socket).await;
    let session = agent.session_id().to_owned();
    let mut tasks = Vec::new();
    for i in 0..N {
        let agent = agent.clone();
        tasks.push(tokio::spawn(async move {
            let p = json::parse_str(&format!(r#"{{"i":{i},"to":"acct_{i}"}}"#)).unwrap();
            (i, agent.pre_exec_or_wait("pay", &p, 0.01, wait(60)).await)
        }));
    }
    // Every call held, each with its own transition (told apart by their params' digests:
    // the params an agent shows can lag under load, and are not what is checked here).
    let params_of = |i: usize| json::parse_str(&format!(r#"{{"i":{i},"to":"acct_{i}"}}"#)).unwrap();
    let digests: Vec<Vec<u8>> = (0..N)
        .map(|i| json::canonical_hash(&params_of(i)).unwrap().0.to_vec())
        .collect();
    let mut held = Vec::new();
    for _ in 0..3000 {
        held = op
            .hitl_list()
            .await
            .unwrap()
            .into_iter()
            .filter(|p| p.session_id == session)
            .collect();
        if held.len() == N {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(held.len(), N, "{held:#?}");
    // Several held: a decision that names no call is refused, not guessed.
    let e = op
        .hitl_decide(sp1::HitlDecideRequest {
            session_id: session.clone(),
            decision: "approve".into(),
            operator_id: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("name the call"), "{e}");
    let order = shuffled(N);
    for &k in &order {
        let h = &held[k];
        let t = h.transition.clone().unwrap();
        let i = digests
            .iter()
            .position(|d| *d == t.original_args_digest)
            .unwrap();
        let (decision, successor) = match i % 3 {
            0 => ("approve", String::new()),
            1 => (
                "modify",
                format!(r#"{{"i":{i},"to":"acct_{i}","edited":true}}"#),
            ),
            _ => ("reject", String::new()),
        };
        let r = op
            .hitl_decide(sp1::HitlDecideRequest {
                session_id: session.clone(),
                call_number: t.call_number,
                decision: decision.into(),
                operator_id: "alice".into(),
                note: format!("call {i}"),
                successor_params_json: successor,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(r.transition.unwrap().call_number, t.call_number);
    }
    for task in tasks {
        let (i, r) = task.await.unwrap();
        // Each waiting call gets its own decision's note with it (issue 16 §5).
        assert_eq!(r.note, format!("call {i}"), "{i}: {r:?}");
        match i % 3 {
            0 => {
                assert!(r.allowed(), "{i}: {r:?}");
                assert_eq!(r.verdict.reason, "hitl_transition:approve");
                assert_eq!(
                    r.params.unwrap().get("i").and_then(|v| v.as_u64()),
                    Some(i as u64)
                );
            }
            1 => {
                assert!(r.allowed(), "{i}: {r:?}");
                assert_eq!(r.verdict.reason, "hitl_transition:modify_successor");
                let p = r.params.unwrap();
                assert_eq!(p.get("edited"), Some(&json::Value::Bool(true)), "{i}");
                assert_eq!(p.get("i").and_then(|v| v.as_u64()), Some(i as u64));
            }
            _ => {
                assert!(!r.allowed(), "{i}: {r:?}");
                assert_eq!(r.decision, "reject");
            }
        }
    }
    let s = agent.session_state().await.unwrap();
    assert!(!s.circuit_tripped, "{s:?}");
    // Nothing waits for a human any more (rejected calls are not listed as waiting).
    assert!(op
        .hitl_list()
        .await
        .unwrap()
        .iter()
        .all(|p| p.session_id != session));
    d.stop().await;
    // The log: nine holds, nine decisions with their notes, six releases.
    let events = session_events(dir.path());
    let releases = events
        .iter()
        .filter(|e| matches!(e, SessionEvent::Verdict(v) if v.verdict == Verdict::Allow))
        .count();
    assert_eq!(releases, 6);
    let notes: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::HumanDecision(h) => Some(h.note.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(notes.len(), N);
    assert!((0..N).all(|i| notes.contains(&format!("call {i}"))));
}

/// Issue 16 §1: a task waits in `pre_exec_or_wait` while, right after the operator
/// approves, another task on the same client makes another call (under SP/1.0.1's one
/// transition that call answered to the approved transition: a nonce mismatch, DENY): the circuit never trips
/// (the other call is a call of its own, not a mismatched re-dispatch of the held one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_beside_a_waiting_call_never_trips_the_circuit() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let op = crate::operator(&d.socket).await;
    for trial in 0..5 {
        let agent = std::sync::Arc::new(connect(&d.socket, "reviewed").await);
        let session = agent.session_id().to_owned();
        let waiting = {
            let agent = agent.clone();
            tokio::spawn(async move {
                let p = json::parse_str(r#"{"to":"acct_1"}"#).unwrap();
                agent.pre_exec_or_wait("pay", &p, 0.01, wait(30)).await
            })
        };
        let held = listed_when(&op, &session, |p| p.params_known).await;
        let q = json::parse_str(r#"{"q":1}"#).unwrap();
        op.hitl_decide(sp1::HitlDecideRequest {
            session_id: session.clone(),
            call_number: held.transition.unwrap().call_number,
            decision: "approve".into(),
            operator_id: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap();
        // At once, before (or while) the waiting task re-dispatches its approved call.
        let other = agent.pre_exec("lookup", &q, 0.0).await;
        // The other call is held on its own (hitl_mode always), not refused.
        assert_eq!(other.verdict, Verdict::Hitl, "trial {trial}: {other:?}");
        let r = waiting.await.unwrap();
        assert!(r.allowed(), "trial {trial}: {r:?}");
        let s = agent.session_state().await.unwrap();
        assert!(!s.circuit_tripped, "trial {trial}: {s:?}");
    }
    d.stop().await;
}

/// Issue 16 §1, one client shared by tasks: calls numbered in one order reach the daemon in
/// another (task A prepares, task B prepares and sends first). The overtaken call is not
/// refused (`call_number ... is not greater`): the client renumbers a number it gave out
/// and never sent, so both calls are decided. A resend of a number already sent is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_sent_out_of_their_numbering_order_are_all_decided() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let agent = connect(&d.socket, "research-bot").await;
    let p = json::parse_str(r#"{"q":"a"}"#).unwrap();
    let q = json::parse_str(r#"{"q":"b"}"#).unwrap();
    let first = agent.prepare("search", &p, 0.0);
    let second = agent.prepare("search", &q, 0.0);
    assert!(first.call_number < second.call_number);
    let b = agent.pre_exec_request(second.clone()).await;
    assert_eq!(b.verdict, Verdict::Allow, "{b:?}");
    let a = agent.pre_exec_request(first.clone()).await;
    assert_eq!(a.verdict, Verdict::Allow, "{a:?}");
    assert!(a.call_number > b.call_number, "renumbered: {a:?}");
    // A number already sent is sent as it is: the daemon refuses it, deciding nothing.
    let again = agent.pre_exec_request(second).await;
    assert_eq!(again.reason, "fail_closed:invalid_request", "{again:?}");
    assert!(!agent.session_state().await.unwrap().circuit_tripped);
    d.stop().await;
}
