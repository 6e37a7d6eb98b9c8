//! Bad input, wrong keys and broken peers: every one refused, nothing else happens, and
//! the client fails closed.

use std::path::Path;
use std::time::{Duration, Instant};

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::{json, Verdict};
use tollgate_proto::auth::{seal, MessageKey};
use tollgate_proto::frame;
use tollgate_proto::sp1::{self, envelope::Payload, Envelope, ErrorCode};

use crate::{audited, config, connect, start, OPERATOR_SECRET, SECRET};

/// Send one frame body, read one reply envelope (None if the daemon closed instead).
async fn exchange(stream: &mut UnixStream, body: &[u8]) -> Option<Envelope> {
    stream
        .write_all(&frame::frame_bytes(body).unwrap())
        .await
        .unwrap();
    read_reply(stream).await
}

pub(crate) async fn read_reply(stream: &mut UnixStream) -> Option<Envelope> {
    let mut header = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut header))
        .await
        .ok()?
        .ok()?;
    let mut body = vec![0u8; frame::body_len(header).ok()?];
    stream.read_exact(&mut body).await.ok()?;
    Envelope::decode(body.as_slice()).ok()
}

pub(crate) fn error_code(env: &Option<Envelope>) -> Option<ErrorCode> {
    match env.as_ref()?.payload.as_ref()? {
        Payload::Error(e) => ErrorCode::try_from(e.code).ok(),
        _ => None,
    }
}

fn pre_exec_envelope(session: &str, call: u64) -> Envelope {
    Envelope {
        protocol_version: "1.0.0".into(),
        message_id: format!("m{call}"),
        payload: Some(Payload::PreExec(sp1::PreExecRequest {
            session_id: session.to_owned(),
            call_number: call,
            tool_name: "t".into(),
            tool_params_hash: vec![7; 32],
            nonce: call,
            ..Default::default()
        })),
        ..Default::default()
    }
}

async fn still_serving(socket: &Path) {
    let c = connect(socket, "research-bot").await;
    let v = c.pre_exec("t", &json::parse_str("{}").unwrap(), 0.0).await;
    assert_eq!(
        v.verdict,
        Verdict::Allow,
        "the daemon stopped serving others"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_or_missing_hmac_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let session = c.session_id().to_owned();
    // Each on a fresh connection: max_bad_frames (3) refusals close one.
    let socket = d.socket.clone();
    let fresh = || UnixStream::connect(socket.clone());
    // Sealed with another organization's key.
    let wrong = seal(
        &MessageKey::derive(b"not the organization secret!!"),
        &pre_exec_envelope(&session, 1),
    )
    .unwrap();
    assert_eq!(
        error_code(&exchange(&mut fresh().await.unwrap(), &wrong).await),
        Some(ErrorCode::AuthenticationFailed)
    );
    // No MAC at all.
    let plain = pre_exec_envelope(&session, 1).encode_to_vec();
    assert_eq!(
        error_code(&exchange(&mut fresh().await.unwrap(), &plain).await),
        Some(ErrorCode::AuthenticationFailed)
    );
    // Right key, one flipped bit in the MAC, and one in the call number.
    let good = seal(&MessageKey::derive(SECRET), &pre_exec_envelope(&session, 1)).unwrap();
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 0x01;
    assert_eq!(
        error_code(&exchange(&mut fresh().await.unwrap(), &flipped).await),
        Some(ErrorCode::AuthenticationFailed)
    );
    let mut flipped = good.clone();
    let at = flipped.windows(2).position(|w| w == [0x10, 0x01]).unwrap() + 1; // call_number = 1
    flipped[at] = 0x02;
    assert_eq!(
        error_code(&exchange(&mut fresh().await.unwrap(), &flipped).await),
        Some(ErrorCode::AuthenticationFailed)
    );
    // Nothing happened: no call counted, nothing audited.
    let s = c.session_state().await.unwrap();
    assert_eq!((s.total_calls, s.last_call_number), (0, 0));
    d.stop().await;
    assert!(audited(dir.path()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_frame_gets_message_too_large_and_the_connection_closes() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let mut raw = UnixStream::connect(&d.socket).await.unwrap();
    raw.write_all(&((1u32 << 20) + 1).to_be_bytes())
        .await
        .unwrap();
    let reply = read_reply(&mut raw).await;
    assert_eq!(error_code(&reply), Some(ErrorCode::MessageTooLarge));
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0, "connection should be closed");
    still_serving(&d.socket).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_get_an_error_and_others_are_still_served() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let mut raw = UnixStream::connect(&d.socket).await.unwrap();
    let reply = exchange(&mut raw, &[0xff, 0xfe, 0x00, 0x13, 0x37, 0xff, 0xff, 0xff]).await;
    assert_eq!(error_code(&reply), Some(ErrorCode::MalformedMessage));
    // A half-sent frame times out on its own without blocking anyone.
    let mut half = UnixStream::connect(&d.socket).await.unwrap();
    half.write_all(&100u32.to_be_bytes()).await.unwrap();
    half.write_all(b"only part").await.unwrap();
    still_serving(&d.socket).await;
    // An envelope without a payload.
    let empty = seal(&MessageKey::derive(SECRET), &Envelope::default()).unwrap();
    assert_eq!(
        error_code(&exchange(&mut raw, &empty).await),
        Some(ErrorCode::MalformedMessage)
    );
    d.stop().await;
}

/// Whether the daemon closed `stream` within a generous wait, sending nothing more: end
/// of file, or a reset (a Unix socket closed with our bytes unread in it reads as one).
pub(crate) async fn closed(stream: &mut UnixStream) -> bool {
    let mut rest = Vec::new();
    match tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await {
        Ok(Ok(n)) => n == 0,
        Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionReset && rest.is_empty(),
        Err(_) => false,
    }
}

/// Register a fresh client, retrying (the daemon may be at its connection cap) until it is
/// served or a generous deadline passes.
async fn served_eventually(socket: &Path) -> DaemonClient {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match DaemonClient::connect(crate::client_config(socket, "research-bot")).await {
            Ok(c) => return c,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "a fresh client was never served: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Slow senders: two bytes of a header, then silence, on more connections than the cap.
/// The frame deadline starts at a frame's first byte, so each is closed once
/// `frame_timeout` has passed, not after the idle timeout, and a fresh client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_headers_cannot_lock_others_out() {
    const CAP: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.max_connections = CAP;
    cfg.limits.frame_timeout = Duration::from_millis(200);
    cfg.limits.idle_timeout = Duration::from_secs(300);
    let d = start(cfg).await;
    let mut slow = Vec::new();
    for _ in 0..CAP + 4 {
        let mut s = UnixStream::connect(&d.socket).await.unwrap();
        // A connection over the cap may already be closed: the write may fail.
        let _ = s.write_all(&[0, 0]).await;
        slow.push(s);
    }
    let c = served_eventually(&d.socket).await;
    assert!(c
        .pre_exec("t", &json::parse_str("{}").unwrap(), 0.0)
        .await
        .allowed());
    // Every half-header got an unsealed, uncorrelated Error and was closed: those still
    // among the unauthenticated connections MALFORMED_MESSAGE for the unfinished frame,
    // the older ones DAEMON_UNAVAILABLE when newer arrivals pushed them out.
    let mut timed_out = 0;
    for s in &mut slow {
        let reply = read_reply(s).await.expect("an Error before the close");
        assert!(reply.hmac.is_empty() && reply.correlation_id.is_empty());
        match error_code(&Some(reply)) {
            Some(ErrorCode::MalformedMessage) => timed_out += 1,
            Some(ErrorCode::DaemonUnavailable) => {}
            other => panic!("unexpected reply {other:?}"),
        }
        assert!(closed(s).await, "the connection stayed open");
    }
    assert!(timed_out >= 1, "{timed_out}");
    d.stop().await;
}

/// Slow readers: a peer that sends requests and never reads the replies stalls the
/// daemon's write; the write has the frame deadline too, so the connection is closed and
/// its slot freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_reads_cannot_hold_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.max_connections = 1;
    cfg.limits.frame_timeout = Duration::from_millis(200);
    let d = start(cfg).await;
    let (_unread, mut write) = UnixStream::connect(&d.socket).await.unwrap().into_split();
    // Garbage frames, each answered with an Error nobody reads, until the daemon stops
    // reading (this write blocks) or hangs up (this write fails).
    let garbage = frame::frame_bytes(&[0xff, 0xfe, 0x00, 0x13, 0x37, 0xff, 0xff, 0xff]).unwrap();
    let hog = tokio::spawn(async move { while write.write_all(&garbage).await.is_ok() {} });
    let c = served_eventually(&d.socket).await;
    assert!(c
        .pre_exec("t", &json::parse_str("{}").unwrap(), 0.0)
        .await
        .allowed());
    hog.await.unwrap();
    d.stop().await;
}

/// A oneof member holding an empty message is still written, as a zero-length field, and
/// read as present: an empty `HitlListRequest` (bytes `a2 01 00`) is a hitl_list, and the
/// empty list it gets back is an `HitlListResponse` written as `aa 01 00`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_message_in_the_oneof_is_present() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.organizations[0].id = tollgate_daemon::config::DEFAULT_ORG.into();
    let d = start(cfg).await;
    // protocol_version "1.0.0", message_id "m1", hitl_list {} (the docs' example bytes).
    let b = hex("0a05312e302e3012026d31a20100");
    let env = Envelope::decode(b.as_slice()).unwrap();
    assert_eq!(
        env.payload,
        Some(Payload::HitlList(sp1::HitlListRequest::default()))
    );
    let key = MessageKey::derive(OPERATOR_SECRET);
    let mut body = b.clone();
    body.extend_from_slice(&[0x32, 0x20]);
    body.extend_from_slice(&key.tag(&b));
    let mut raw = UnixStream::connect(&d.socket).await.unwrap();
    raw.write_all(&frame::frame_bytes(&body).unwrap())
        .await
        .unwrap();
    let mut header = [0u8; 4];
    raw.read_exact(&mut header).await.unwrap();
    let mut reply = vec![0u8; frame::body_len(header).unwrap()];
    raw.read_exact(&mut reply).await.unwrap();
    let stripped = &reply[..reply.len() - 34];
    assert_eq!(&reply[reply.len() - 34..reply.len() - 32], [0x32, 0x20]);
    assert_eq!(&reply[reply.len() - 32..], key.tag(stripped));
    assert!(stripped.ends_with(&[0xaa, 0x01, 0x00]), "{stripped:02x?}");
    let env = Envelope::decode(reply.as_slice()).unwrap();
    assert_eq!(env.correlation_id, "m1");
    assert_eq!(
        env.payload,
        Some(Payload::HitlListResponse(sp1::HitlListResponse::default()))
    );
    d.stop().await;
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_session_and_bad_call_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let mut raw = UnixStream::connect(&d.socket).await.unwrap();
    let key = MessageKey::derive(SECRET);
    let reply = exchange(
        &mut raw,
        &seal(&key, &pre_exec_envelope("s_nope", 1)).unwrap(),
    )
    .await;
    assert_eq!(error_code(&reply), Some(ErrorCode::SessionNotFound));

    let c = connect(&d.socket, "research-bot").await;
    let ok = exchange(
        &mut raw,
        &seal(&key, &pre_exec_envelope(c.session_id(), 5)).unwrap(),
    )
    .await;
    assert!(matches!(
        ok.and_then(|e| e.payload),
        Some(Payload::PreExecResponse(_))
    ));
    for stale in [5, 4] {
        let r = exchange(
            &mut raw,
            &seal(&key, &pre_exec_envelope(c.session_id(), stale)).unwrap(),
        )
        .await;
        assert_eq!(
            error_code(&r),
            Some(ErrorCode::InvalidRequest),
            "call_number {stale}"
        );
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_or_empty_tool_names_are_refused_before_anything_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let p = json::parse_str("{}").unwrap();
    for name in ["".to_owned(), "t".repeat(257)] {
        let v = c.pre_exec(&name, &p, 0.0).await;
        assert_eq!(
            (v.verdict, v.reason.as_str()),
            (Verdict::Deny, "fail_closed:invalid_request")
        );
    }
    assert!(c.pre_exec(&"t".repeat(256), &p, 0.0).await.allowed());
    let s = c.session_state().await.unwrap();
    assert_eq!(s.total_calls, 1);
    d.stop().await;
    assert_eq!(audited(dir.path()).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_version_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let mut raw = UnixStream::connect(&d.socket).await.unwrap();
    let env = Envelope {
        protocol_version: "2.0.0".into(),
        message_id: "m".into(),
        payload: Some(Payload::Register(sp1::RegisterRequest {
            agent_id: "a".into(),
            organization_id: "acme".into(),
            ..Default::default()
        })),
        ..Default::default()
    };
    let r = exchange(&mut raw, &seal(&MessageKey::derive(SECRET), &env).unwrap()).await;
    assert_eq!(error_code(&r), Some(ErrorCode::ProtocolVersionMismatch));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_exec_rate_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.pre_exec_per_second_per_session = 2;
    let d = start(cfg).await;
    let c = connect(&d.socket, "research-bot").await;
    let mut limited = 0;
    let started = std::time::Instant::now();
    for i in 0..20 {
        let p = json::parse_str(&format!(r#"{{"i":{i}}}"#)).unwrap();
        let v = c.pre_exec("t", &p, 0.0).await;
        if v.reason == "fail_closed:rate_limited" {
            assert_eq!(v.verdict, Verdict::Deny);
            limited += 1;
        }
    }
    // A bucket of 2 refilled at 2/s: at most 2 + 2 a second allowed, however long the
    // calls took (no timing assumed); 20 calls are refused some unless they took 9 s.
    let allowed = 20 - limited;
    let bound = 2 + (2.0 * started.elapsed().as_secs_f64()).floor() as u32;
    assert!(
        allowed <= bound,
        "{allowed} of 20 allowed at 2/s (at most {bound})"
    );
    assert!(limited >= 1, "none of 20 rate limited at 2/s");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_rate_limit_per_peer() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.registrations_per_second_per_peer = 1;
    let d = start(cfg).await;
    let mut refused = 0;
    let started = std::time::Instant::now();
    for _ in 0..10 {
        if let Err(e) = DaemonClient::connect(crate::client_config(&d.socket, "research-bot")).await
        {
            assert!(
                matches!(
                    e,
                    tollgate_client::ClientError::Refused {
                        code: ErrorCode::RateLimited,
                        ..
                    }
                ),
                "{e:?}"
            );
            refused += 1;
        }
    }
    // A bucket of 1 refilled at 1/s: at most 1 + 1 a second registered, however long the
    // handshakes took (no timing assumed); 10 are refused some unless they took 9 s.
    let allowed = 10 - refused;
    let bound = 1 + started.elapsed().as_secs() as u32;
    assert!(
        allowed <= bound,
        "{allowed} of 10 registered at 1/s (at most {bound})"
    );
    assert!(refused >= 1, "none of 10 refused at 1/s");
    d.stop().await;
}

fn cfg_for(socket: &Path) -> ClientConfig {
    let mut c = ClientConfig::new(socket, "acme", SECRET, "agent");
    c.timeout = Duration::from_millis(300);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_fails_closed_when_the_daemon_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    d.stop().await;
    let v = c.pre_exec("t", &json::parse_str("{}").unwrap(), 0.0).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "fail_closed:daemon_unreachable")
    );
    // And a fresh client cannot even connect.
    let e = DaemonClient::connect(cfg_for(&dir.path().join("tollgate.sock")))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "fail_closed:daemon_unreachable");
}

/// A fake daemon: registers the client properly, then answers pre_exec with `answer`.
async fn imposter(socket: &Path, answer: fn(&MessageKey, &Envelope) -> Option<Vec<u8>>) {
    let listener = UnixListener::bind(socket).unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let key = MessageKey::derive(SECRET);
        loop {
            let mut header = [0u8; 4];
            if s.read_exact(&mut header).await.is_err() {
                return;
            }
            let mut body = vec![0u8; frame::body_len(header).unwrap()];
            s.read_exact(&mut body).await.unwrap();
            let req = Envelope::decode(body.as_slice()).unwrap();
            let reply = match &req.payload {
                Some(Payload::Register(_)) => Some(
                    seal(
                        &key,
                        &Envelope {
                            protocol_version: "1.0.0".into(),
                            correlation_id: req.message_id.clone(),
                            payload: Some(Payload::RegisterResponse(sp1::RegisterResponse {
                                session_id: "s_fake".into(),
                                negotiated_protocol: "1.0.0".into(),
                                ..Default::default()
                            })),
                            ..Default::default()
                        },
                    )
                    .unwrap(),
                ),
                _ => answer(&key, &req),
            };
            if let Some(body) = reply {
                s.write_all(&frame::frame_bytes(&body).unwrap())
                    .await
                    .unwrap();
            }
        }
    });
}

fn allow_response(req: &Envelope) -> Envelope {
    let (call, session_id) = match &req.payload {
        Some(Payload::PreExec(p)) => (p.call_number, p.session_id.clone()),
        _ => (0, String::new()),
    };
    Envelope {
        protocol_version: "1.0.0".into(),
        correlation_id: req.message_id.clone(),
        payload: Some(Payload::PreExecResponse(sp1::PreExecResponse {
            session_id,
            call_number: call,
            verdict: sp1::Verdict::Allow as i32,
            reason: "within_thresholds".into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

async fn verdict_from_imposter(
    answer: fn(&MessageKey, &Envelope) -> Option<Vec<u8>>,
) -> tollgate_client::ClientVerdict {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fake.sock");
    imposter(&socket, answer).await;
    let c = DaemonClient::connect(cfg_for(&socket)).await.unwrap();
    c.pre_exec("t", &json::parse_str("{}").unwrap(), 0.0).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_fails_closed_on_timeout_bad_mac_and_malformed_replies() {
    // The imposter is honest: its ALLOW is accepted (so the checks below can fail).
    let v = verdict_from_imposter(|k, req| seal(k, &allow_response(req)).ok()).await;
    assert_eq!(v.verdict, Verdict::Allow);
    // Silence: DENY on timeout, and the client forgets the request.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("silent.sock");
    imposter(&socket, |_, _| None).await;
    let c = DaemonClient::connect(cfg_for(&socket)).await.unwrap();
    let v = c.pre_exec("t", &json::parse_str("{}").unwrap(), 0.0).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "fail_closed:timeout")
    );
    assert_eq!(c.in_flight(), 0);
    // An ALLOW sealed with the wrong key.
    let v = verdict_from_imposter(|_, req| {
        seal(
            &MessageKey::derive(b"some other secret entirely"),
            &allow_response(req),
        )
        .ok()
    })
    .await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "fail_closed:bad_mac")
    );
    // An unsealed ALLOW.
    let v = verdict_from_imposter(|_, req| Some(allow_response(req).encode_to_vec())).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "fail_closed:bad_mac")
    );
    // A properly sealed reply of the wrong kind.
    let v = verdict_from_imposter(|k, req| {
        let mut e = allow_response(req);
        e.payload = Some(Payload::HeartbeatAck(sp1::HeartbeatAck::default()));
        seal(k, &e).ok()
    })
    .await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "fail_closed:malformed_reply")
    );
    // A verdict of zero (unspecified) is not an ALLOW.
    let v = verdict_from_imposter(|k, req| {
        let mut e = allow_response(req);
        if let Some(Payload::PreExecResponse(r)) = &mut e.payload {
            r.verdict = 0;
        }
        seal(k, &e).ok()
    })
    .await;
    assert_eq!(v.verdict, Verdict::Deny);
    // A sealed ALLOW for the same call number of another session.
    let v = verdict_from_imposter(|k, req| {
        let mut e = allow_response(req);
        if let Some(Payload::PreExecResponse(r)) = &mut e.payload {
            r.session_id = "s_someone_else".into();
        }
        seal(k, &e).ok()
    })
    .await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "fail_closed:malformed_reply")
    );
    // The daemon refusing the connection itself (an unsealed, uncorrelated error, as at
    // its connection cap): every waiting call fails with the daemon's code.
    let v = verdict_from_imposter(|_, _| {
        Some(
            Envelope {
                protocol_version: "1.0.0".into(),
                payload: Some(Payload::Error(sp1::Error {
                    code: sp1::ErrorCode::DaemonUnavailable as i32,
                    message: "too many connections".into(),
                    retry_after_ms: 0,
                })),
                ..Default::default()
            }
            .encode_to_vec(),
        )
    })
    .await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "fail_closed:daemon_unavailable")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_must_come_back_as_the_session_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("fake.sock");
    // The imposter answers every registration as a new session `s_fake`.
    imposter(&socket, |_, _| None).await;
    let e = DaemonClient::resume(cfg_for(&socket), "s_mine")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "fail_closed:malformed_reply");
}

/// docs/protocol.md §5.4: a settled post_exec gets no reply (the next reply on the
/// connection is the next request's), and a refused one gets an `Error` correlated to it,
/// unsealed when the sender was never authenticated (an unknown session, a wrong key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_exec_is_answered_only_by_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let key = MessageKey::derive(SECRET);
    let mut raw = UnixStream::connect(&d.socket).await.unwrap();
    let post = |session: &str, id: &str| Envelope {
        protocol_version: "1.0.0".into(),
        message_id: id.into(),
        payload: Some(Payload::PostExec(sp1::PostExecNotification {
            session_id: session.to_owned(),
            call_number: 1,
            actual_cost_usd: 0.0,
            success: true,
            ..Default::default()
        })),
        ..Default::default()
    };
    // Read one reply, raw, so its seal can be checked.
    async fn raw_reply(stream: &mut UnixStream) -> Vec<u8> {
        let mut header = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut header))
            .await
            .unwrap()
            .unwrap();
        let mut body = vec![0u8; frame::body_len(header).unwrap()];
        stream.read_exact(&mut body).await.unwrap();
        body
    }
    let send = |env: Vec<u8>| frame::frame_bytes(&env).unwrap();

    // An allowed call, settled: no reply; the next reply is the heartbeat's.
    let allowed = exchange(
        &mut raw,
        &seal(&key, &pre_exec_envelope(c.session_id(), 1)).unwrap(),
    )
    .await;
    assert!(matches!(
        allowed.and_then(|e| e.payload),
        Some(Payload::PreExecResponse(_))
    ));
    raw.write_all(&send(seal(&key, &post(c.session_id(), "p1")).unwrap()))
        .await
        .unwrap();
    let beat = Envelope {
        protocol_version: "1.0.0".into(),
        message_id: "h1".into(),
        payload: Some(Payload::Heartbeat(sp1::Heartbeat {
            session_id: c.session_id().to_owned(),
            ..Default::default()
        })),
        ..Default::default()
    };
    raw.write_all(&send(seal(&key, &beat).unwrap()))
        .await
        .unwrap();
    let next = tollgate_proto::auth::Unverified::decode(&raw_reply(&mut raw).await)
        .unwrap()
        .verify(&key)
        .unwrap()
        .into_inner();
    assert_eq!(
        next.correlation_id, "h1",
        "the settled post_exec got no reply"
    );

    // An unknown session: SESSION_NOT_FOUND for that post_exec, unsealed (the daemon picks
    // the key by the session's organization, so it never authenticated the sender).
    raw.write_all(&send(seal(&key, &post("s_nope", "p2")).unwrap()))
        .await
        .unwrap();
    let refused = Envelope::decode(raw_reply(&mut raw).await.as_slice()).unwrap();
    assert!(refused.hmac.is_empty());
    assert_eq!(refused.correlation_id, "p2");
    assert_eq!(error_code(&Some(refused)), Some(ErrorCode::SessionNotFound));

    // A key the daemon does not know: an unsealed AUTHENTICATION_FAILED, and nothing settled.
    let wrong = MessageKey::derive(b"not the organization's secret at all");
    raw.write_all(&send(seal(&wrong, &post(c.session_id(), "p3")).unwrap()))
        .await
        .unwrap();
    let body = raw_reply(&mut raw).await;
    let unsealed = Envelope::decode(body.as_slice()).unwrap();
    assert!(unsealed.hmac.is_empty());
    assert_eq!(unsealed.correlation_id, "p3");
    assert_eq!(
        error_code(&Some(unsealed)),
        Some(ErrorCode::AuthenticationFailed)
    );
    d.stop().await;
    let settled = crate::session_events(dir.path())
        .into_iter()
        .filter(|e| matches!(e, tollgate_audit::SessionEvent::Settled(_)))
        .count();
    assert_eq!(
        settled, 1,
        "only the authenticated post_exec of a real session settled"
    );
}
