//! The control plane: operators sign in with bearer tokens over the WebSocket
//! `/v1/control`, see held calls pushed as they happen, decide them, and nothing else
//! changes on bad input. Everything here speaks the JSON a third-party console would.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tollgate_core::json as tjson;
use tollgate_core::{Params, Verdict};
use tollgate_daemon::config::{ControlSettings, Operator, Organization};
use tollgate_daemon::operators::token_sha256;
use tollgate_daemon::DaemonConfig;
use tollgate_proto::auth::{seal, MessageKey};
use tollgate_proto::frame;
use tollgate_proto::sp1::{self, envelope::Payload, Envelope};

use crate::hostile::read_reply;
use crate::{config, connect, session_events, start, Running, ORG, SECRET};

pub const ALICE: &str = "alice-token-0123456789";
pub const BOB: &str = "bob-token-0123456789";
const CAROL_EXPIRED: &str = "carol-token-0123456789";
pub const OTHER_ORG: &str = "globex";
pub const OTHER_SECRET: &[u8] = b"globex agents' secret, long enough";

/// The test configuration with the control plane on a free loopback port and operators:
/// alice (acme), bob (acme and globex), carol (acme, expired).
pub fn control_config(dir: &Path) -> DaemonConfig {
    let mut c = config(dir);
    c.organizations.push(Organization {
        id: OTHER_ORG.into(),
        secret: Some(OTHER_SECRET.to_vec()),
        operator_secret: Some(b"globex operators' secret, long".to_vec()),
    });
    c.control = Some(ControlSettings::plain("127.0.0.1:0".parse().unwrap()));
    let op = |id: &str, token: &str, orgs: &[&str], expires_at_ns| Operator {
        id: id.into(),
        token_sha256: token_sha256(token),
        organizations: orgs.iter().map(|o| o.to_string()).collect(),
        expires_at_ns,
    };
    c.operators = vec![
        op("alice", ALICE, &[ORG], None),
        op("bob", BOB, &[ORG, OTHER_ORG], None),
        op("carol", CAROL_EXPIRED, &[ORG], Some(1_000_000_000)),
    ];
    c
}

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A stream a WebSocket runs over (plain TCP, or TLS).
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> Io for T {}

/// A console's connection, signed in by header when `token` is given.
pub async fn ws(addr: SocketAddr, token: Option<&str>) -> Result<Ws, u16> {
    let mut req = format!("ws://{addr}/v1/control")
        .into_client_request()
        .unwrap();
    if let Some(t) = token {
        req.headers_mut().insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
        );
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

pub async fn send<S: Io>(ws: &mut WebSocketStream<S>, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

/// The next event (pings skipped); `None` when the daemon closed the connection (the close
/// code, if any, in the `Err`).
pub async fn next<S: Io>(ws: &mut WebSocketStream<S>) -> Result<Value, Option<u16>> {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("no event within 20 s");
        match m {
            Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(t.as_str()).unwrap()),
            Some(Ok(Message::Close(f))) => return Err(f.map(|f| u16::from(f.code))),
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return Err(None),
        }
    }
}

/// Send a request and return the event answering it; pushes that arrive first are
/// returned too, in order.
pub async fn request<S: Io>(
    ws: &mut WebSocketStream<S>,
    id: &str,
    body: Value,
) -> (Value, Vec<Value>) {
    let mut msg = body;
    msg["requestId"] = json!(id);
    send(ws, msg).await;
    let mut pushes = Vec::new();
    loop {
        let e = next(ws).await.unwrap();
        if e["requestId"] == json!(id) {
            return (e, pushes);
        }
        pushes.push(e);
    }
}

/// Wait for a push matching `pred`, skipping others.
pub async fn push_where<S: Io>(
    ws: &mut WebSocketStream<S>,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    loop {
        let e = next(ws).await.unwrap();
        if e.get("requestId").is_none() && pred(&e) {
            return e;
        }
    }
}

/// A console signed in by header and subscribed to all its organizations.
pub async fn subscribed(addr: SocketAddr, token: &str) -> Ws {
    let mut w = ws(addr, Some(token)).await.unwrap();
    assert!(next(&mut w).await.unwrap()["welcome"].is_object());
    let (e, _) = request(&mut w, "sub", json!({"subscribe": {}})).await;
    assert!(e["subscribed"].is_object(), "{e}");
    w
}

pub fn error_code(e: &Value) -> &str {
    e["error"]["code"].as_str().unwrap_or("")
}

/// One request over the socket sealed with `secret` (the agents' key), one reply.
pub async fn agent_request(socket: &Path, secret: &[u8], payload: Payload) -> Payload {
    let env = Envelope {
        protocol_version: "1.0.0".into(),
        message_id: "raw-1".into(),
        payload: Some(payload),
        ..Default::default()
    };
    let body = seal(&MessageKey::derive(secret), &env).unwrap();
    let mut s = UnixStream::connect(socket).await.unwrap();
    s.write_all(&frame::frame_bytes(&body).unwrap())
        .await
        .unwrap();
    read_reply(&mut s).await.unwrap().payload.unwrap()
}

pub fn digest(p: &tjson::Value) -> Vec<u8> {
    Params::json(p).canonical_digest().unwrap().0.to_vec()
}

/// An agent of `reviewed` (HITL always) whose call `deploy` with `params` is held; it
/// sends the params (HeldParams) when `show` is set. Returns the client and the nonce.
pub async fn held_call(
    d: &Running,
    params: &str,
    show: bool,
) -> (tollgate_client::DaemonClient, u64) {
    let agent = connect(&d.socket, "reviewed").await;
    let p = tjson::parse_str(params).unwrap();
    let nonce = 4242;
    let v = agent
        .pre_exec_request(sp1::PreExecRequest {
            session_id: agent.session_id().to_owned(),
            call_number: 1,
            tool_name: "deploy".into(),
            tool_params_hash: digest(&p),
            estimated_cost_usd: 0.25,
            nonce,
            ..Default::default()
        })
        .await;
    assert_eq!(v.verdict, Verdict::Hitl, "{v:?}");
    if show {
        let ack = agent_request(
            &d.socket,
            SECRET,
            Payload::HeldParams(sp1::HeldParams {
                session_id: agent.session_id().to_owned(),
                call_number: 1,
                params_json: params.to_owned(),
            }),
        )
        .await;
        assert!(matches!(ack, Payload::HeldParamsAck(_)), "{ack:?}");
    }
    (agent, nonce)
}

/// GET `path` over plain HTTP/1.1: status and body.
pub async fn http_get(addr: SocketAddr, path: &str, headers: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_by_header_or_first_frame_and_every_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(control_config(dir.path())).await;
    let addr = d.control.unwrap();

    // By header: the welcome names the operator from the token.
    let mut w = ws(addr, Some(ALICE)).await.unwrap();
    let welcome = next(&mut w).await.unwrap();
    assert_eq!(welcome["welcome"]["operatorId"], "alice");
    assert_eq!(welcome["welcome"]["organizationIds"], json!([ORG]));
    assert_eq!(welcome["welcome"]["maxFrameBytes"], 262144);

    // By first frame (what a browser does): the welcome answers the auth request.
    let mut w = ws(addr, None).await.unwrap();
    send(&mut w, json!({"requestId": "a1", "auth": {"token": BOB}})).await;
    let welcome = next(&mut w).await.unwrap();
    assert_eq!(welcome["requestId"], "a1");
    assert_eq!(welcome["welcome"]["operatorId"], "bob");
    // Signing in twice is a mistake, not a new identity.
    let (e, _) = request(&mut w, "a2", json!({"auth": {"token": ALICE}})).await;
    assert_eq!(error_code(&e), "INVALID_REQUEST");

    // A wrong token, by header: 401, no WebSocket.
    assert_eq!(ws(addr, Some("wrong")).await.unwrap_err(), 401);
    // ... or by first frame: an error, then the connection is closed (policy, 1008).
    let mut w = ws(addr, None).await.unwrap();
    send(&mut w, json!({"auth": {"token": "wrong"}})).await;
    let e = next(&mut w).await.unwrap();
    assert_eq!(error_code(&e), "AUTHENTICATION_FAILED");
    assert_eq!(e["error"]["message"], "authentication failed");
    assert_eq!(next(&mut w).await.unwrap_err(), Some(1008));
    // Anything but a sign-in first is refused the same way.
    let mut w = ws(addr, None).await.unwrap();
    send(&mut w, json!({"hitlList": {"organizationId": ORG}})).await;
    assert_eq!(
        error_code(&next(&mut w).await.unwrap()),
        "AUTHENTICATION_FAILED"
    );
    assert_eq!(next(&mut w).await.unwrap_err(), Some(1008));
    // An expired token.
    let mut w = ws(addr, None).await.unwrap();
    send(&mut w, json!({"auth": {"token": CAROL_EXPIRED}})).await;
    let e = next(&mut w).await.unwrap();
    assert_eq!(e["error"]["message"], "token expired");
    assert_eq!(ws(addr, Some(CAROL_EXPIRED)).await.unwrap_err(), 401);
    d.stop().await;

    // Revoked: alice is removed from the configuration; her token no longer works, bob's
    // still does.
    let mut c = control_config(dir.path());
    c.operators.retain(|o| o.id != "alice");
    let d = start(c).await;
    let addr = d.control.unwrap();
    assert_eq!(ws(addr, Some(ALICE)).await.unwrap_err(), 401);
    assert!(ws(addr, Some(BOB)).await.is_ok());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_sign_ins_are_rate_limited_per_address_even_for_a_right_token() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(control_config(dir.path())).await;
    let addr = d.control.unwrap();
    for _ in 0..tollgate_daemon::operators::AUTH_FAILURE_BURST {
        assert_eq!(ws(addr, Some("guess")).await.unwrap_err(), 401);
    }
    // The budget is spent: even the right token is refused now, without being looked at.
    assert_eq!(ws(addr, Some(ALICE)).await.unwrap_err(), 429);
    let mut w = ws(addr, None).await.unwrap();
    send(&mut w, json!({"auth": {"token": ALICE}})).await;
    let e = next(&mut w).await.unwrap();
    assert_eq!(error_code(&e), "RATE_LIMITED");
    assert!(
        e["error"]["retryAfterMs"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert_eq!(next(&mut w).await.unwrap_err(), Some(1013));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consoles_see_a_held_call_appear_with_its_params_and_disappear_when_decided() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(control_config(dir.path())).await;
    let addr = d.control.unwrap();
    let mut a = subscribed(addr, ALICE).await;
    let mut b = subscribed(addr, BOB).await;

    let (agent, _) = held_call(&d, r#"{"service":"api","replicas":3}"#, false).await;
    let sid = agent.session_id().to_owned();
    for w in [&mut a, &mut b] {
        // Held: the hash is shown, and the params are said to be unknown.
        let e = push_where(w, |e| e["held"]["sessionId"] == json!(sid)).await;
        let held = &e["held"];
        assert_eq!(held["organizationId"], ORG);
        assert_eq!(held["agentId"], "reviewed");
        assert_eq!(held["transition"]["toolName"], "deploy");
        assert_eq!(held["transition"]["callNumber"], "1");
        assert_eq!(held["transition"]["heldReason"], "hitl_all_calls");
        assert_eq!(held["transition"]["estimatedCostNanos"], "250000000");
        assert!(held["transition"]["originalArgsDigest"].is_string());
        assert!(held["transition"]["expiresAtNs"].is_string());
        assert_eq!(held.get("paramsKnown"), None); // false: omitted
    }
    // The agent shows its params: they arrive, canonical, on both consoles.
    let ack = agent_request(
        &d.socket,
        SECRET,
        Payload::HeldParams(sp1::HeldParams {
            session_id: sid.clone(),
            call_number: 1,
            params_json: r#"{"service":"api","replicas":3}"#.into(),
        }),
    )
    .await;
    assert!(matches!(ack, Payload::HeldParamsAck(_)));
    for w in [&mut a, &mut b] {
        let e = push_where(w, |e| e["held"]["paramsKnown"] == json!(true)).await;
        assert_eq!(e["held"]["paramsJson"], r#"{"replicas":3,"service":"api"}"#);
    }
    // Params that do not hash to the held digest are refused and shown nowhere.
    let wrong = agent_request(
        &d.socket,
        SECRET,
        Payload::HeldParams(sp1::HeldParams {
            session_id: sid.clone(),
            call_number: 1,
            params_json: r#"{"service":"api","replicas":300}"#.into(),
        }),
    )
    .await;
    assert!(matches!(wrong, Payload::Error(_)), "{wrong:?}");

    // The list says the same.
    let (e, _) = request(&mut a, "l1", json!({"hitlList": {"organizationId": ORG}})).await;
    assert_eq!(
        e["hitlList"]["pending"][0]["paramsJson"],
        r#"{"replicas":3,"service":"api"}"#
    );

    // Alice approves (with a note); both consoles see it resolved, by alice.
    let (e, _) = request(
        &mut a,
        "d1",
        json!({"hitlDecide": {"sessionId": sid, "decision": "approve", "note": "looks right"}}),
    )
    .await;
    assert!(e["hitlDecide"]["auditEntryId"].is_string(), "{e}");
    for w in [&mut a, &mut b] {
        let e = push_where(w, |e| e["resolved"].is_object()).await;
        assert_eq!(e["resolved"]["sessionId"], json!(sid));
        assert_eq!(e["resolved"]["outcome"], "approve");
        assert_eq!(e["resolved"]["operatorId"], "alice");
    }
    // Deciding again: refused, nothing changes.
    let (e, _) = request(
        &mut b,
        "d2",
        json!({"hitlDecide": {"sessionId": sid, "decision": "reject", "note": "too late"}}),
    )
    .await;
    assert_eq!(error_code(&e), "HITL_REFUSED");
    // The recent decisions name who decided.
    let (e, _) = request(&mut b, "r1", json!({"recent": {}})).await;
    let recent = &e["recent"]["decisions"][0];
    assert_eq!(
        (recent["outcome"].as_str(), recent["operatorId"].as_str()),
        (Some("approve"), Some("alice"))
    );
    // The kind-6 entry names alice and carries the note.
    let human: Vec<_> = session_events(&d.dir)
        .into_iter()
        .filter_map(|e| match e {
            tollgate_audit::SessionEvent::HumanDecision(h) => Some(h),
            _ => None,
        })
        .collect();
    assert_eq!(human.len(), 1);
    assert_eq!(
        (human[0].operator_id.as_str(), human[0].note.as_str()),
        ("alice", "looks right")
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modify_sends_the_agent_the_edited_arguments_and_only_they_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(control_config(dir.path())).await;
    let mut a = subscribed(d.control.unwrap(), ALICE).await;
    let (agent, nonce) = held_call(&d, r#"{"replicas":30}"#, true).await;
    let sid = agent.session_id().to_owned();
    push_where(&mut a, |e| e["held"]["paramsKnown"] == json!(true)).await;

    let (e, _) = request(
        &mut a,
        "m1",
        json!({"hitlDecide": {"sessionId": sid, "decision": "modify", "note": "3 is enough",
                              "successorParamsJson": "{ \"replicas\" : 3 }"}}),
    )
    .await;
    assert_eq!(
        e["hitlDecide"]["successorParamsJson"], r#"{"replicas":3}"#,
        "{e}"
    );
    let waited = agent_request(
        &d.socket,
        SECRET,
        Payload::AwaitDecision(sp1::AwaitDecisionRequest {
            session_id: sid.clone(),
            call_number: 1,
            timeout_ms: 5000,
        }),
    )
    .await;
    let Payload::AwaitDecisionResponse(r) = waited else {
        panic!("{waited:?}")
    };
    assert_eq!(r.outcome, "modify");
    assert_eq!(r.successor_params_json, r#"{"replicas":3}"#);
    let t = r.transition.unwrap();
    let successor = tjson::parse_str(&r.successor_params_json).unwrap();
    assert_eq!(t.successor_args_digest, digest(&successor));
    let run = |n: u64, nonce: u64, params: &tjson::Value| sp1::PreExecRequest {
        session_id: sid.clone(),
        call_number: n,
        tool_name: "deploy".into(),
        tool_params_hash: digest(params),
        nonce,
        ..Default::default()
    };
    // The original cannot run; the successor can, once.
    let original = tjson::parse_str(r#"{"replicas":30}"#).unwrap();
    let v = agent.pre_exec_request(run(2, nonce, &original)).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "hitl_transition:superseded_original")
    );
    d.stop().await;

    // (A fresh daemon for the successor, since the denial above tripped the circuit.)
    let dir = tempfile::tempdir().unwrap();
    let d = start(control_config(dir.path())).await;
    let mut a = subscribed(d.control.unwrap(), ALICE).await;
    let (agent, _) = held_call(&d, r#"{"replicas":30}"#, true).await;
    let sid = agent.session_id().to_owned();
    push_where(&mut a, |e| e["held"]["paramsKnown"] == json!(true)).await;
    let (e, _) = request(
        &mut a,
        "m1",
        json!({"hitlDecide": {"sessionId": sid, "decision": "modify", "note": "3 is enough",
                              "successorParamsJson": "{\"replicas\":3}"}}),
    )
    .await;
    let successor_nonce: u64 = e["hitlDecide"]["transition"]["successorNonce"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let edited = tjson::parse_str(r#"{"replicas":3}"#).unwrap();
    let v = agent
        .pre_exec_request(sp1::PreExecRequest {
            session_id: sid.clone(),
            call_number: 2,
            tool_name: "deploy".into(),
            tool_params_hash: digest(&edited),
            nonce: successor_nonce,
            ..Default::default()
        })
        .await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Allow, "hitl_transition:modify_successor")
    );
    let released = push_where(&mut a, |e| e["resolved"]["outcome"] == "released").await;
    assert_eq!(released["resolved"]["sessionId"], json!(sid));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_and_decides_only_their_organizations() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(control_config(dir.path())).await;
    let addr = d.control.unwrap();
    let mut alice = subscribed(addr, ALICE).await; // acme only
    let mut bob = subscribed(addr, BOB).await; // acme and globex

    // A globex agent's call is held.
    let mut cc = crate::client_config(&d.socket, "reviewed");
    cc.organization_id = OTHER_ORG.into();
    cc.secret = OTHER_SECRET.to_vec();
    let g = tollgate_client::DaemonClient::connect(cc).await.unwrap();
    let p = tjson::parse_str("{}").unwrap();
    assert_eq!(g.pre_exec("wire", &p, 0.0).await.verdict, Verdict::Hitl);
    let gsid = g.session_id().to_owned();
    push_where(&mut bob, |e| e["held"]["sessionId"] == json!(gsid)).await;

    // Alice cannot list globex, subscribe to it, see its sessions, or decide its call.
    let (e, _) = request(
        &mut alice,
        "l",
        json!({"hitlList": {"organizationId": OTHER_ORG}}),
    )
    .await;
    assert_eq!(error_code(&e), "AUTHENTICATION_FAILED");
    let (e, _) = request(
        &mut alice,
        "s",
        json!({"subscribe": {"organizationIds": [OTHER_ORG]}}),
    )
    .await;
    assert_eq!(error_code(&e), "AUTHENTICATION_FAILED");
    let (e, _) = request(
        &mut alice,
        "ss",
        json!({"sessions": {"organizationId": OTHER_ORG}}),
    )
    .await;
    assert_eq!(error_code(&e), "AUTHENTICATION_FAILED");
    let (e, pushes) = request(
        &mut alice,
        "d",
        json!({"hitlDecide": {"sessionId": gsid, "decision": "approve", "note": "mine now"}}),
    )
    .await;
    assert_eq!(error_code(&e), "SESSION_NOT_FOUND");
    assert!(
        pushes.iter().all(|p| p["held"]["sessionId"] != json!(gsid)),
        "{pushes:?}"
    );
    // Then an acme call is held: alice's next push is that one, and nothing of globex came
    // before it (pushes arrive in order).
    let (agent, _) = held_call(&d, "{}", false).await;
    let e = next(&mut alice).await.unwrap();
    assert_eq!(e["held"]["sessionId"], json!(agent.session_id()), "{e}");
    // Bob still sees globex's call undecided, and the sessions of both organizations.
    let (e, _) = request(
        &mut bob,
        "l",
        json!({"hitlList": {"organizationId": OTHER_ORG}}),
    )
    .await;
    assert_eq!(e["hitlList"]["pending"][0]["sessionId"], json!(gsid));
    assert_eq!(
        e["hitlList"]["pending"][0]["transition"].get("decision"),
        None
    );
    let (e, _) = request(
        &mut bob,
        "ss",
        json!({"sessions": {"organizationId": OTHER_ORG}}),
    )
    .await;
    assert_eq!(e["sessions"]["total"], "1");
    assert_eq!(e["sessions"]["sessions"][0]["sessionId"], json!(gsid));
    assert_eq!(e["sessions"]["sessions"][0]["status"], "PAUSED");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_get_error_events_decide_nothing_and_repeated_abuse_closes() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(control_config(dir.path())).await;
    let addr = d.control.unwrap();
    let (agent, _) = held_call(&d, r#"{"x":1}"#, true).await;
    let sid = agent.session_id().to_owned();
    let mut w = subscribed(addr, ALICE).await;

    // Oversized (over 256 KiB, under the 1 MiB hard cap).
    let big = json!({"requestId": "big", "hitlDecide": {"sessionId": sid, "decision": "approve",
                     "note": "x".repeat(300 * 1024)}});
    send(&mut w, big).await;
    assert_eq!(
        error_code(&next(&mut w).await.unwrap()),
        "MESSAGE_TOO_LARGE"
    );
    // Malformed JSON, an unknown message type (its request id echoed), a binary frame, an
    // empty request, a field of the wrong type.
    w.send(Message::text("{not json")).await.unwrap();
    assert_eq!(
        error_code(&next(&mut w).await.unwrap()),
        "MALFORMED_MESSAGE"
    );
    let (e, _) = request(&mut w, "u1", json!({"frobnicate": {"sessionId": sid}})).await;
    assert_eq!(error_code(&e), "MALFORMED_MESSAGE");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("frobnicate"));
    w.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
    assert_eq!(
        error_code(&next(&mut w).await.unwrap()),
        "MALFORMED_MESSAGE"
    );
    let (e, _) = request(&mut w, "e1", json!({})).await;
    assert_eq!(error_code(&e), "INVALID_REQUEST");
    let (e, _) = request(&mut w, "t1", json!({"hitlDecide": {"sessionId": 7}})).await;
    assert_eq!(error_code(&e), "MALFORMED_MESSAGE");
    // A decision without a note, with a bad word, on an unknown session, with successor
    // params that are not JSON: each refused.
    let decide = |extra: Value| {
        let mut d = json!({"sessionId": sid, "decision": "approve", "note": "ok"});
        d.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"hitlDecide": d})
    };
    let (e, _) = request(&mut w, "n1", decide(json!({"note": "  "}))).await;
    assert_eq!(error_code(&e), "INVALID_REQUEST");
    assert!(e["error"]["message"].as_str().unwrap().contains("note"));
    let (e, _) = request(&mut w, "n2", decide(json!({"sessionId": "s_nope"}))).await;
    assert_eq!(error_code(&e), "SESSION_NOT_FOUND");
    let (e, _) = request(
        &mut w,
        "n3",
        decide(json!({"decision": "modify", "successorParamsJson": "{oops"})),
    )
    .await;
    assert_eq!(error_code(&e), "INVALID_REQUEST");
    // The connection is still usable, and the call is still held, undecided.
    let (e, _) = request(&mut w, "l", json!({"hitlList": {"organizationId": ORG}})).await;
    let pending = &e["hitlList"]["pending"][0];
    assert_eq!(pending["sessionId"], json!(sid));
    assert_eq!(pending["transition"].get("decision"), None);
    assert!(session_events(&d.dir)
        .iter()
        .all(|e| !matches!(e, tollgate_audit::SessionEvent::HumanDecision(_))));

    // 16 unreadable frames in all close the connection (policy violation).
    let mut closed = None;
    for _ in 0..16 {
        if w.send(Message::text("]")).await.is_err() {
            break;
        }
        match next(&mut w).await {
            Ok(e) => assert_eq!(error_code(&e), "MALFORMED_MESSAGE"),
            Err(code) => {
                closed = code;
                break;
            }
        }
    }
    assert_eq!(closed, Some(1008));

    // A message over the 1 MiB hard cap closes the connection at once (1009).
    let mut w = subscribed(addr, ALICE).await;
    let _ = w.send(Message::text("x".repeat(1024 * 1024 + 1))).await;
    assert_eq!(next(&mut w).await.unwrap_err(), Some(1009));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_call_disappears_and_cannot_be_decided() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = control_config(dir.path());
    c.limits.hitl_timeout = Duration::from_secs(1);
    let d = start(c).await;
    let mut w = subscribed(d.control.unwrap(), ALICE).await;
    let (agent, _) = held_call(&d, "{}", false).await;
    let sid = agent.session_id().to_owned();
    let e = push_where(&mut w, |e| e["resolved"].is_object()).await;
    assert_eq!(e["resolved"]["sessionId"], json!(sid));
    assert_eq!(e["resolved"]["outcome"], "expire");
    assert_eq!(e["resolved"]["operatorId"], "tollgate");
    let (e, _) = request(
        &mut w,
        "late",
        json!({"hitlDecide": {"sessionId": sid, "decision": "approve", "note": "sorry, late"}}),
    )
    .await;
    assert_eq!(error_code(&e), "HITL_REFUSED");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_reconnecting_after_a_restart_is_told_the_truth() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(control_config(dir.path())).await;
    let mut w = subscribed(d.control.unwrap(), ALICE).await;
    let (agent, _) = held_call(&d, r#"{"k":"v"}"#, true).await;
    let sid = agent.session_id().to_owned();
    push_where(&mut w, |e| e["held"]["paramsKnown"] == json!(true)).await;
    drop(agent);
    // The daemon stops: the console is told it is going away.
    d.stop().await;
    assert_eq!(next(&mut w).await.unwrap_err(), Some(1001));

    let d = start(control_config(dir.path())).await;
    let mut w = subscribed(d.control.unwrap(), ALICE).await;
    let (e, _) = request(&mut w, "l", json!({"hitlList": {"organizationId": ORG}})).await;
    let pending = &e["hitlList"]["pending"][0];
    // Still held, its hash shown; its params were in memory only, so they are unknown now.
    assert_eq!(pending["sessionId"], json!(sid));
    assert!(pending["transition"]["originalArgsDigest"].is_string());
    assert_eq!(pending.get("paramsKnown"), None);
    // And it can still be decided.
    let (e, _) = request(
        &mut w,
        "d",
        json!({"hitlDecide": {"sessionId": sid, "decision": "reject", "note": "after restart"}}),
    )
    .await;
    assert!(e["hitlDecide"].is_object(), "{e}");
    d.stop().await;
}

/// The value of one sample on a metrics page (0 when absent).
fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_calls_refusals_connections_and_held_calls() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(control_config(dir.path())).await;
    let addr = d.control.unwrap();
    let (status, before) = http_get(addr, "/metrics", "").await;
    assert_eq!(status, 200);
    assert_eq!(sample(&before, "tollgate_hitl_pending"), 0.0);

    let c = connect(&d.socket, "research-bot").await;
    let p = tjson::parse_str(r#"{"q":1}"#).unwrap();
    for _ in 0..4 {
        c.pre_exec("search", &p, 0.001).await; // 3 ALLOW, then DENY max_repeat_exceeded
    }
    let unknown = agent_request(
        &d.socket,
        SECRET,
        Payload::Heartbeat(sp1::Heartbeat {
            session_id: "s_unknown".into(),
            ..Default::default()
        }),
    )
    .await;
    assert!(matches!(unknown, Payload::Error(_)));
    let (_agent, _) = held_call(&d, "{}", false).await;

    let (_, after) = http_get(addr, "/metrics", "").await;
    let moved = |name: &str| sample(&after, name) - sample(&before, name);
    assert!(moved(r#"tollgate_verdicts_total{verdict="allow",reason="within_thresholds"}"#) >= 3.0);
    assert!(
        moved(r#"tollgate_verdicts_total{verdict="deny",reason="max_repeat_exceeded"}"#) >= 1.0
    );
    assert!(moved(r#"tollgate_verdicts_total{verdict="hitl",reason="hitl_all_calls"}"#) >= 1.0);
    assert!(moved("tollgate_pre_exec_duration_seconds_count") >= 5.0);
    assert!(moved(r#"tollgate_refusals_total{code="SESSION_NOT_FOUND"}"#) >= 1.0);
    assert!(moved(r#"tollgate_connections_total{transport="socket"}"#) >= 3.0);
    assert!(moved("tollgate_audit_entries_total") >= 7.0);
    assert!(moved("tollgate_audit_batch_entries_count") >= 1.0);
    // This daemon's store: one held call, two live sessions (one paused).
    assert_eq!(sample(&after, "tollgate_hitl_pending"), 1.0);
    assert_eq!(sample(&after, r#"tollgate_sessions{status="paused"}"#), 1.0);
    assert_eq!(sample(&after, r#"tollgate_sessions{status="active"}"#), 1.0);
    // A console is a control connection while it is open.
    let w = subscribed(addr, ALICE).await;
    let (_, open) = http_get(addr, "/metrics", "").await;
    assert!(sample(&open, r#"tollgate_connections_open{transport="control"}"#) >= 1.0);
    assert!(sample(&open, r#"tollgate_connections_total{transport="control"}"#) >= 1.0);
    drop(w);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_page_and_unknown_paths() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(control_config(dir.path())).await;
    let addr = d.control.unwrap();
    let (status, page) = http_get(addr, "/", "").await;
    assert_eq!(status, 200);
    assert_eq!(page, tollgate_daemon::transport::control::CONSOLE_HTML);
    // Nothing is loaded from elsewhere.
    for external in ["http://", "https://", "//cdn", "<link", "src=\""] {
        assert!(
            !page.contains(external),
            "the console refers to `{external}`"
        );
    }
    assert_eq!(http_get(addr, "/nope", "").await.0, 404);
    // Not a WebSocket upgrade.
    assert!(http_get(addr, "/v1/control", "").await.0 >= 400);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_loopback_without_tls_the_daemon_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = control_config(dir.path());
    c.control = Some(ControlSettings::plain("0.0.0.0:0".parse().unwrap()));
    let err = tollgate_daemon::Daemon::start(c)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("TLS is required"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_with_the_configured_certificate() {
    use rustls::pki_types::{CertificateDer, ServerName};
    let dir = tempfile::tempdir().unwrap();
    let ca =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    std::fs::write(dir.path().join("cert.pem"), ca.cert.pem()).unwrap();
    std::fs::write(dir.path().join("key.pem"), ca.signing_key.serialize_pem()).unwrap();
    let mut c = control_config(dir.path());
    c.control = Some(ControlSettings {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls: Some(tollgate_daemon::config::TlsFiles {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
        }),
        ..ControlSettings::plain("127.0.0.1:0".parse().unwrap())
    });
    let d = start(c).await;
    let addr = d.control.unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(ca.cert.der().to_vec()))
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let stream = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let mut req = format!("wss://localhost:{}/v1/control", addr.port())
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {ALICE}")).unwrap(),
    );
    let (mut w, _) = tokio_tungstenite::client_async(req, stream).await.unwrap();
    assert_eq!(
        next(&mut w).await.unwrap()["welcome"]["operatorId"],
        "alice"
    );
    // Plain HTTP to the TLS port gets nothing.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    assert!(!String::from_utf8_lossy(&buf).contains("tollgate_"));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_expires_on_an_open_connection_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = control_config(dir.path());
    let now_ns = || {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        i64::try_from(d.as_nanos()).unwrap()
    };
    // Dave's token is good for a few more seconds.
    let expires = now_ns() + 8_000_000_000;
    c.operators.push(Operator {
        id: "dave".into(),
        token_sha256: token_sha256("dave-token"),
        organizations: vec![ORG.into()],
        expires_at_ns: Some(expires),
    });
    let d = start(c).await;
    let mut w = ws(d.control.unwrap(), Some("dave-token")).await.unwrap();
    let welcome = next(&mut w).await.unwrap();
    assert_eq!(
        welcome["welcome"]["tokenExpiresAtNs"],
        json!(expires.to_string())
    );
    let (e, _) = request(&mut w, "l1", json!({"hitlList": {"organizationId": ORG}})).await;
    assert!(e["hitlList"].is_object(), "{e}");
    while now_ns() < expires {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The next request is refused, and the connection closed.
    let (e, _) = request(&mut w, "l2", json!({"hitlList": {"organizationId": ORG}})).await;
    assert_eq!(error_code(&e), "AUTHENTICATION_FAILED");
    assert_eq!(e["error"]["message"], "token expired");
    assert_eq!(next(&mut w).await.unwrap_err(), Some(1008));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defer_and_escalate_keep_the_call_held_and_say_who() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(control_config(dir.path())).await;
    let mut a = subscribed(d.control.unwrap(), ALICE).await;
    let (agent, _) = held_call(&d, "{}", false).await;
    let sid = agent.session_id().to_owned();
    push_where(&mut a, |e| e["held"]["sessionId"] == json!(sid)).await;
    for word in ["defer", "escalate"] {
        let (e, _) = request(
            &mut a,
            word,
            json!({"hitlDecide": {"sessionId": sid, "decision": word, "note": "ask the owner"}}),
        )
        .await;
        assert_eq!(e["hitlDecide"]["transition"]["decision"], word, "{e}");
        let held = push_where(&mut a, |e| e["held"]["transition"]["decision"] == word).await;
        assert_eq!(held["held"]["transition"]["operatorId"], "alice");
    }
    let (e, _) = request(
        &mut a,
        "r",
        json!({"hitlDecide": {"sessionId": sid, "decision": "reject", "note": "the owner said no"}}),
    )
    .await;
    assert!(e["hitlDecide"].is_object(), "{e}");
    let resolved = push_where(&mut a, |e| e["resolved"].is_object()).await;
    assert_eq!(resolved["resolved"]["outcome"], "reject");
    d.stop().await;
}

/// Issue 20 §2 over the protocol: `history` is the audit log's record of decisions
/// (operator, decision, tool, note; a modify's change while the daemon knows it), searched,
/// limited to the operator's organizations, and the same after a restart (the change then
/// as digests only); `activity` is a session's last calls with verdict and cost, and the
/// purpose its registration stated; both refuse what they must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_activity_come_from_the_audit_log_and_survive_a_restart() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = control_config(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    if let Some(c) = cfg.control.as_mut() {
        c.listen = ([127, 0, 0, 1], port).into();
    }
    cfg.operators.push(Operator {
        id: "gina".into(),
        token_sha256: token_sha256("gina-token-0123456789"),
        organizations: vec![OTHER_ORG.into()],
        expires_at_ns: None,
    });
    let d = start(cfg.clone()).await;
    let addr = d.control.unwrap();
    // A session registered with a purpose (metadata), its call held and modified by alice.
    let reg = agent_request(
        &d.socket,
        SECRET,
        Payload::Register(sp1::RegisterRequest {
            agent_id: "reviewed".into(),
            organization_id: ORG.into(),
            metadata: [(
                "purpose".to_owned(),
                "Scale the API\u{1b}[31m for the launch".to_owned(),
            )]
            .into(),
            ..Default::default()
        }),
    )
    .await;
    let Payload::RegisterResponse(reg) = reg else {
        panic!("{reg:?}")
    };
    let sid = reg.session_id;
    let params = r#"{"replicas":30,"service":"api"}"#;
    let p = tjson::parse_str(params).unwrap();
    let held = agent_request(
        &d.socket,
        SECRET,
        Payload::PreExec(sp1::PreExecRequest {
            session_id: sid.clone(),
            call_number: 1,
            tool_name: "deploy".into(),
            tool_params_hash: digest(&p),
            estimated_cost_usd: 0.25,
            nonce: 77,
            ..Default::default()
        }),
    )
    .await;
    assert!(
        matches!(held, Payload::PreExecResponse(ref r) if r.verdict == sp1::Verdict::Hitl as i32),
        "{held:?}"
    );
    let ack = agent_request(
        &d.socket,
        SECRET,
        Payload::HeldParams(sp1::HeldParams {
            session_id: sid.clone(),
            call_number: 1,
            params_json: params.into(),
        }),
    )
    .await;
    assert!(matches!(ack, Payload::HeldParamsAck(_)), "{ack:?}");
    let mut a = subscribed(addr, ALICE).await;
    let (e, _) = request(&mut a, "l", json!({"hitlList": {"organizationId": ORG}})).await;
    let pending = &e["hitlList"]["pending"][0];
    assert_eq!(
        pending["heldExplanation"],
        "Every call of this agent waits for a human: rule 8, hitl_mode = \"always\" in `[guard.agents.reviewed]`."
    );
    // Control characters are dropped from a stated purpose.
    assert_eq!(pending["purpose"], "Scale the API[31m for the launch");
    let (e, _) = request(
        &mut a,
        "d",
        json!({"hitlDecide": {"sessionId": sid, "callNumber": "1", "decision": "modify",
                "note": "30 replicas is a typo", "successorParamsJson": r#"{"service":"api","replicas":3}"#}}),
    )
    .await;
    assert!(e["hitlDecide"].is_object(), "{e}");

    // History: the decision as the log records it, with the change.
    let (e, _) = request(&mut a, "h1", json!({"history": {"query": "TYPO deploy"}})).await;
    let h = &e["history"];
    assert_eq!(h["available"], true, "{e}");
    let entry = &h["entries"][0];
    assert_eq!(h["entries"].as_array().unwrap().len(), 1, "{e}");
    for (k, v) in [
        ("operatorId", "alice"),
        ("decision", "modify"),
        ("toolName", "deploy"),
        ("note", "30 replicas is a typo"),
        ("agentId", "reviewed"),
        ("paramsJson", params),
        ("successorParamsJson", r#"{"replicas":3,"service":"api"}"#),
    ] {
        assert_eq!(entry[k], v, "{k}: {e}");
    }
    // A search that matches nothing, one of another organization's operator, and bounds.
    let (e, _) = request(&mut a, "h2", json!({"history": {"query": "typo bob"}})).await;
    assert_eq!(e["history"].get("entries"), None, "{e}");
    let mut g = ws(addr, Some(BOB)).await.unwrap();
    next(&mut g).await.unwrap();
    let (e, _) = request(&mut g, "h3", json!({"history": {}})).await;
    assert_eq!(
        e["history"]["entries"].as_array().unwrap().len(),
        1,
        "bob operates acme too: {e}"
    );
    let (e, _) = request(&mut a, "h4", json!({"history": {"query": "x".repeat(257)}})).await;
    assert_eq!(error_code(&e), "INVALID_REQUEST", "{e}");
    let (e, _) = request(
        &mut a,
        "h5",
        json!({"history": {"beforeNs": entry["atNs"]}}),
    )
    .await;
    assert_eq!(
        e["history"].get("entries"),
        None,
        "older than the only entry: {e}"
    );

    // Activity: the session's calls, newest first, and its purpose.
    let (e, _) = request(&mut a, "a1", json!({"activity": {"sessionId": sid}})).await;
    let act = &e["activity"];
    assert_eq!(act["purpose"], "Scale the API[31m for the launch", "{e}");
    assert_eq!(act["calls"][0]["toolName"], "deploy", "{e}");
    assert_eq!(act["calls"][0]["verdict"], "HITL", "{e}");
    assert_eq!(act["calls"][0]["reason"], "hitl_all_calls", "{e}");
    assert_eq!(act["calls"][0]["estimatedCostNanos"], "250000000", "{e}");
    for bad in [json!("s_unknown"), json!("not a session id!")] {
        let (e, _) = request(&mut a, "a2", json!({"activity": {"sessionId": bad}})).await;
        assert!(
            ["SESSION_NOT_FOUND", "INVALID_REQUEST"].contains(&error_code(&e)),
            "{e}"
        );
    }
    // An operator of another organization alone sees neither.
    let mut gina = ws(addr, Some("gina-token-0123456789")).await.unwrap();
    next(&mut gina).await.unwrap();
    let (e, _) = request(&mut gina, "h7", json!({"history": {}})).await;
    assert_eq!(e["history"].get("entries"), None, "{e}");
    let (e, _) = request(&mut gina, "a4", json!({"activity": {"sessionId": sid}})).await;
    assert_eq!(error_code(&e), "SESSION_NOT_FOUND", "{e}");
    drop((a, g, gina));

    // After a restart: the record is read back from the log; the arguments are gone (memory
    // only), the digests stay.
    d.stop().await;
    let d = start(cfg).await;
    let mut a = subscribed(addr, ALICE).await;
    let (e, _) = request(&mut a, "h6", json!({"history": {"query": "typo"}})).await;
    let entry = &e["history"]["entries"][0];
    assert_eq!(entry["operatorId"], "alice", "{e}");
    assert_eq!(entry["note"], "30 replicas is a typo", "{e}");
    assert_eq!(entry.get("paramsJson"), None, "{e}");
    assert_eq!(
        entry["originalArgsDigest"],
        json!(base64::engine::general_purpose::STANDARD.encode(digest(&p))),
        "{e}"
    );
    assert!(entry["successorArgsDigest"].is_string(), "{e}");
    let (e, _) = request(&mut a, "a3", json!({"activity": {"sessionId": sid}})).await;
    assert_eq!(e["activity"]["calls"][0]["verdict"], "HITL", "{e}");
    d.stop().await;
}
