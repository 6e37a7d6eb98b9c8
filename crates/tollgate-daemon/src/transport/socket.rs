//! The Unix-socket transport: accept, read frames with bounds and timeouts, authenticate
//! each envelope with its organization's key, hand the request to the service, seal and
//! write the reply. One request at a time per connection, in order.
//!
//! Bounds on a peer: at most `max_connections` connections (one more is sent an unsealed
//! `DAEMON_UNAVAILABLE` and closed); at most `idle_timeout` of silence between frames; at
//! most `frame_timeout` from a frame's first byte to its last, and for a reply to be taken
//! by the peer. So a slow or silent peer holds its slot for a bounded time.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tollgate_proto::auth::{self, AuthError, Unverified};
use tollgate_proto::frame::{self, FrameError, HEADER_LEN};
use tollgate_proto::sp1::{self, envelope::Payload, Envelope, ErrorCode};
use tollgate_proto::{MessageKey, Verified, SUPPORTED_VERSIONS};
use tollgate_store::SessionStore;

use crate::config::DEFAULT_ORG;
use crate::service::{check_major, refuse, Caller, Peer, Refusal, Service};

/// What to send back, if anything.
#[derive(Debug)]
pub enum Reply {
    /// A response frame body (sealed when the peer authenticated).
    Frame(Vec<u8>),
    /// Nothing (post-exec is fire-and-forget).
    Nothing,
}

/// Serve `listener` until `shutdown` resolves; then stop accepting, let every connection
/// finish the request it is handling, and return.
pub async fn serve<S: SessionStore>(
    listener: UnixListener,
    service: Arc<Service<S>>,
    limits: crate::config::Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    tracing::warn!("connection refused: {} connections open", limits.max_connections);
                    // The refusal is one small write into a fresh socket's empty buffer; the
                    // limit only guards the accept loop against the unexpected.
                    let mut s = stream;
                    let code = ErrorCode::DaemonUnavailable;
                    write_error(&mut s, code, "too many connections", Duration::from_millis(100)).await;
                    continue;
                };
                let service = service.clone();
                let stop = stop_rx.clone();
                let limits = limits.clone();
                tasks.spawn(async move {
                    connection(stream, service, &limits, stop).await;
                    drop(permit);
                });
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // In-flight requests finish; idle connections close at once.
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        tracing::warn!("connections still busy after 10 s; closing them");
        tasks.abort_all();
    }
}

/// Why a connection stops reading frames, and what it is told first.
enum Close {
    /// The peer hung up, or the daemon is stopping: close without a word.
    Quietly,
    /// Send an unsealed `Error` with this code and message, then close.
    With(ErrorCode, String),
}

async fn connection<S: SessionStore>(
    mut stream: UnixStream,
    service: Arc<Service<S>>,
    limits: &crate::config::Limits,
    mut stop: watch::Receiver<bool>,
) {
    let _open = crate::metrics::connection_opened("socket");
    let peer = Peer {
        uid: stream.peer_cred().map(|c| c.uid()).unwrap_or(0),
        ip: None,
    };
    loop {
        let body = match next_frame(&mut stream, limits, &mut stop).await {
            Ok(body) => body,
            Err(Close::Quietly) => return,
            Err(Close::With(code, message)) => {
                write_error(&mut stream, code, &message, limits.frame_timeout).await;
                return;
            }
        };
        match service.handle(&body, peer).await {
            Reply::Frame(out) => {
                let Ok(bytes) = frame::frame_bytes(&out) else {
                    return;
                };
                // A peer that does not take its reply within the frame timeout is holding
                // a connection slot without reading: close it.
                match tokio::time::timeout(limits.frame_timeout, stream.write_all(&bytes)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => return,
                }
            }
            Reply::Nothing => {}
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// Read the next frame's body.
///
/// Between frames the connection may be silent for `idle_timeout`.
// INVARIANT (frame-deadline): a frame's deadline is set when its first byte arrives, and
// covers the rest of its header and its whole body; a peer that sends part of a frame
// holds its connection for at most `frame_timeout`, whatever it sends or withholds.
async fn next_frame(
    stream: &mut UnixStream,
    limits: &crate::config::Limits,
    stop: &mut watch::Receiver<bool>,
) -> Result<Vec<u8>, Close> {
    let mut header = [0u8; HEADER_LEN];
    // Wait for the first byte of the next frame, the idle timeout, or shutdown.
    let first = tokio::select! {
        r = tokio::time::timeout(limits.idle_timeout, stream.read(&mut header)) => match r {
            Ok(Ok(0) | Err(_)) => return Err(Close::Quietly), // closed by the peer
            Ok(Ok(n)) => n,
            Err(_) => return Err(Close::With(ErrorCode::InvalidRequest, "idle timeout".into())),
        },
        _ = stop.changed() => return Err(Close::Quietly),
    };
    let deadline = tokio::time::Instant::now() + limits.frame_timeout;
    let late = || {
        Close::With(
            ErrorCode::MalformedMessage,
            "frame not complete within the frame timeout".into(),
        )
    };
    if let Some(rest) = header.get_mut(first..) {
        match tokio::time::timeout_at(deadline, stream.read_exact(rest)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return Err(Close::Quietly),
            Err(_) => return Err(late()),
        }
    }
    let len = frame::body_len(header).map_err(|e| match e {
        FrameError::TooLarge { .. } => Close::With(ErrorCode::MessageTooLarge, e.to_string()),
        FrameError::Malformed(_) => Close::With(ErrorCode::MalformedMessage, e.to_string()),
    })?;
    let mut body = vec![0u8; len];
    match tokio::time::timeout_at(deadline, stream.read_exact(&mut body)).await {
        Ok(Ok(_)) => Ok(body),
        Ok(Err(_)) => Err(Close::Quietly),
        Err(_) => Err(late()),
    }
}

/// Send the transport's own unsealed `Error` (no correlation id), giving up after `limit`:
/// the connection is closed next either way.
async fn write_error(stream: &mut UnixStream, code: ErrorCode, message: &str, limit: Duration) {
    let Ok(bytes) = frame::frame_bytes(&transport_error(code, message)) else {
        return;
    };
    let _ = tokio::time::timeout(limit, async {
        stream.write_all(&bytes).await?;
        stream.flush().await
    })
    .await;
}

impl<S: SessionStore> Service<S> {
    /// Handle one frame body from `peer`.
    pub async fn handle(&self, body: &[u8], peer: Peer) -> Reply {
        let received_ns = self.now();
        let unverified = match Unverified::decode(body) {
            Ok(u) => u,
            Err(e) => {
                return self.error_reply(
                    None,
                    "",
                    received_ns,
                    refuse(ErrorCode::MalformedMessage, e.to_string()),
                )
            }
        };
        let message_id = unverified.envelope().message_id.clone();
        let keys = match keys_for(self, unverified.envelope()).await {
            Ok(k) => k,
            Err(r) => return self.error_reply(None, &message_id, received_ns, r),
        };
        let mut outcome = Err(AuthError::BadMac);
        for (k, caller) in &keys {
            outcome = unverified
                .clone()
                .verify(k)
                .map(|v| (v, k.clone(), caller.clone()));
            if outcome.is_ok() {
                break;
            }
        }
        let (verified, key, caller) = match outcome {
            Ok(v) => v,
            Err(e) => {
                let message = match e {
                    AuthError::BadMac => "message authentication failed".to_owned(),
                    other => other.to_string(),
                };
                tracing::warn!(%message_id, "authentication failed: {message}");
                return self.error_reply(
                    None,
                    &message_id,
                    received_ns,
                    refuse(ErrorCode::AuthenticationFailed, message),
                );
            }
        };
        let result = dispatch(self, verified, &caller, peer, received_ns).await;
        match result {
            Ok(Some(payload)) => self.reply(&key, &message_id, received_ns, payload),
            Ok(None) => Reply::Nothing,
            Err(r) => self.error_reply(Some(&key), &message_id, received_ns, r),
        }
    }

    fn reply(
        &self,
        key: &MessageKey,
        correlation: &str,
        received_ns: i64,
        payload: Payload,
    ) -> Reply {
        match auth::seal(key, &reply_envelope(correlation, received_ns, payload)) {
            Ok(body) => Reply::Frame(body),
            Err(e) => {
                tracing::error!("response too large to send: {e}");
                Reply::Nothing
            }
        }
    }

    /// An error reply: sealed with the peer's key once it is authenticated, plain before.
    fn error_reply(
        &self,
        key: Option<&MessageKey>,
        correlation: &str,
        received_ns: i64,
        r: Refusal,
    ) -> Reply {
        crate::metrics::refusal(r.code);
        let payload = Payload::Error(sp1::Error {
            code: r.code as i32,
            message: r.message,
            retry_after_ms: r.retry_after_ms,
        });
        match key {
            Some(k) => self.reply(k, correlation, received_ns, payload),
            None => Reply::Frame(unsealed(correlation, received_ns, payload)),
        }
    }
}

/// The keys one of which must have sealed this envelope: its organization's agent key,
/// or operator key for human decisions, or either for reading a session's state.
async fn keys_for<S: SessionStore>(
    service: &Service<S>,
    env: &Envelope,
) -> Result<Vec<(MessageKey, Caller)>, Refusal> {
    #[derive(PartialEq)]
    enum Who {
        Agent,
        Operator,
        Either,
    }
    let who = match &env.payload {
        Some(Payload::HitlList(_) | Payload::HitlDecide(_)) => Who::Operator,
        Some(Payload::GetSessionState(_)) => Who::Either,
        _ => Who::Agent,
    };
    let org = match &env.payload {
        Some(Payload::Register(r)) => {
            if r.organization_id.is_empty() {
                DEFAULT_ORG.to_owned()
            } else {
                r.organization_id.clone()
            }
        }
        Some(Payload::HitlList(r)) => {
            if r.organization_id.is_empty() {
                DEFAULT_ORG.to_owned()
            } else {
                r.organization_id.clone()
            }
        }
        Some(Payload::PreExec(r)) => service.session_organization(&r.session_id).await?,
        Some(Payload::PostExec(r)) => service.session_organization(&r.session_id).await?,
        Some(Payload::Heartbeat(r)) => service.session_organization(&r.session_id).await?,
        Some(Payload::GetSessionState(r)) => service.session_organization(&r.session_id).await?,
        Some(Payload::HitlDecide(r)) => service.session_organization(&r.session_id).await?,
        Some(Payload::HeldParams(r)) => service.session_organization(&r.session_id).await?,
        Some(Payload::AwaitDecision(r)) => service.session_organization(&r.session_id).await?,
        Some(_) => {
            return Err(refuse(
                ErrorCode::InvalidRequest,
                "the daemon does not accept responses",
            ))
        }
        None => {
            return Err(refuse(
                ErrorCode::MalformedMessage,
                "envelope has no payload",
            ))
        }
    };
    let mut keys = Vec::with_capacity(2);
    if who != Who::Operator {
        if let Some(k) = service.keys.get(&org) {
            keys.push((
                k.clone(),
                Caller::Agent {
                    organization: org.clone(),
                },
            ));
        }
    }
    if who != Who::Agent {
        if let Some(k) = service.operator_keys.get(&org) {
            keys.push((
                k.clone(),
                Caller::Operator {
                    organizations: vec![org.clone()],
                    operator_id: None,
                },
            ));
        }
    }
    if keys.is_empty() {
        // Same answer as a bad MAC: do not reveal which organizations exist.
        return Err(refuse(
            ErrorCode::AuthenticationFailed,
            "message authentication failed",
        ));
    }
    Ok(keys)
}

/// Serve a verified request as `caller`.
async fn dispatch<S: SessionStore>(
    service: &Service<S>,
    env: Verified<Envelope>,
    caller: &Caller,
    peer: Peer,
    now: i64,
) -> Result<Option<Payload>, Refusal> {
    let env = env.into_inner();
    if !matches!(env.payload, Some(Payload::Register(_))) {
        check_major(&env.protocol_version)?;
    }
    Ok(Some(match env.payload {
        Some(Payload::Register(r)) => Payload::RegisterResponse(
            service
                .register(caller, r, &env.protocol_version, peer, now)
                .await?,
        ),
        Some(Payload::PreExec(r)) => {
            Payload::PreExecResponse(service.pre_exec(caller, r, now).await?)
        }
        Some(Payload::PostExec(r)) => {
            service.post_exec(caller, r, now).await?;
            return Ok(None);
        }
        Some(Payload::Heartbeat(r)) => {
            Payload::HeartbeatAck(service.heartbeat(caller, r, now).await?)
        }
        Some(Payload::GetSessionState(r)) => {
            Payload::SessionState(service.session_state(caller, &r.session_id, now).await?)
        }
        Some(Payload::HitlList(r)) => {
            let org = if r.organization_id.is_empty() {
                DEFAULT_ORG.to_owned()
            } else {
                r.organization_id
            };
            Payload::HitlListResponse(service.hitl_list(caller, &org).await?)
        }
        Some(Payload::HitlDecide(r)) => {
            Payload::HitlDecideResponse(service.hitl_decide(caller, r, now).await?)
        }
        Some(Payload::HeldParams(r)) => {
            Payload::HeldParamsAck(service.held_params(caller, r).await?)
        }
        Some(Payload::AwaitDecision(r)) => {
            Payload::AwaitDecisionResponse(service.await_decision(caller, r).await?)
        }
        _ => return Err(refuse(ErrorCode::InvalidRequest, "not a request")),
    }))
}

/// An unauthenticated reply body: only ever an `Error`, sent before the daemon knows which
/// key to seal with (clients treat it as a failure, never a verdict).
fn unsealed(correlation: &str, received_ns: i64, payload: Payload) -> Vec<u8> {
    prost::Message::encode_to_vec(&reply_envelope(correlation, received_ns, payload))
}

/// The envelope of every reply: our version, a fresh id, the request's id as correlation.
fn reply_envelope(correlation: &str, received_ns: i64, payload: Payload) -> Envelope {
    Envelope {
        protocol_version: SUPPORTED_VERSIONS
            .first()
            .copied()
            .unwrap_or("1.0.0")
            .to_owned(),
        message_id: uuid::Uuid::now_v7().to_string(),
        correlation_id: correlation.to_owned(),
        client_timestamp_ns: 0,
        server_timestamp_ns: received_ns,
        hmac: Vec::new(),
        payload: Some(payload),
    }
}

/// The body of an unsealed `Error` reply, for the transport's own refusals (oversize
/// frames, timeouts, too many connections), which come before any request is read.
pub fn transport_error(code: ErrorCode, message: &str) -> Vec<u8> {
    crate::metrics::refusal(code);
    unsealed(
        "",
        0,
        Payload::Error(sp1::Error {
            code: code as i32,
            message: message.to_owned(),
            retry_after_ms: 0,
        }),
    )
}
