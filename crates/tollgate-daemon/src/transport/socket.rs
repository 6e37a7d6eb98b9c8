//! The Unix-socket transport: accept, read frames with bounds and timeouts, authenticate
//! each envelope with its organization's key, hand the request to the service, seal and
//! write the reply. One request at a time per connection, in order.
//!
//! Bounds on a peer (docs/protocol.md §6.1), with `max_connections` shared out by
//! [`crate::config::Limits::connection_split`]: a connection that has not authenticated
//! yet is one of at most `max_unauthenticated_connections` (admitting one more closes the
//! oldest with an unsealed `DAEMON_UNAVAILABLE`), and must send a frame that authenticates
//! within `auth_timeout`; only then does it take one of the other slots (none
//! left: a sealed `DAEMON_UNAVAILABLE`, and it is closed). Only authenticated frames count
//! as activity: `idle_timeout` of silence from the last reply closes the connection, and
//! `max_bad_frames` frames that fail to decode or authenticate close it. A frame has
//! `frame_timeout` from its first byte to its last, and a reply as long to be taken by the
//! peer. So a peer holds nothing for longer than it takes to prove who it is.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use super::pending::{Pending, PendingSlot};
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
    let (authenticated, unauthenticated) = limits.connection_split();
    let permits = Arc::new(Semaphore::new(authenticated));
    let pending = Pending::new(unauthenticated);
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
                let slot = pending.admit("socket");
                let service = service.clone();
                let stop = stop_rx.clone();
                let limits = limits.clone();
                let permits = permits.clone();
                tasks.spawn(async move {
                    connection(stream, service, &limits, stop, slot, permits).await;
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

/// Where a connection stands: not yet authenticated (holding a [`Pending`] place, with
/// the sign-in deadline), or authenticated (holding one of `max_connections` permits).
enum Standing {
    Pending(PendingSlot),
    Authenticated(#[allow(dead_code)] OwnedSemaphorePermit),
}

// INVARIANT (earned-slot): a connection holds one of the `max_connections` permits only
// once a frame it sent has authenticated; before that it holds a place among at most
// `max_unauthenticated_connections`, for at most `auth_timeout`, and the newest arrival
// pushes the oldest out. Only an authenticated frame moves the idle deadline, and
// `max_bad_frames` frames that fail to decode or authenticate close the connection.
async fn connection<S: SessionStore>(
    mut stream: UnixStream,
    service: Arc<Service<S>>,
    limits: &crate::config::Limits,
    mut stop: watch::Receiver<bool>,
    slot: PendingSlot,
    permits: Arc<Semaphore>,
) {
    let _open = crate::metrics::connection_opened("socket");
    let peer = Peer {
        uid: stream.peer_cred().map(|c| c.uid()).unwrap_or(0),
        certificate: None,
    };
    let mut standing = Standing::Pending(slot);
    let mut deadline = tokio::time::Instant::now() + limits.auth_timeout;
    let mut bad = 0u32;
    loop {
        let evicted = match &standing {
            Standing::Pending(p) => Some(p.evicted()),
            Standing::Authenticated(_) => None,
        };
        let body = match next_frame(&mut stream, limits, &mut stop, deadline, evicted).await {
            Ok(body) => body,
            Err(Close::Quietly) => return,
            Err(Close::With(code, message)) => {
                write_error(&mut stream, code, &message, limits.frame_timeout).await;
                return;
            }
        };
        let reply = match service.authenticate(&body).await {
            Err(refused) => {
                bad = bad.saturating_add(1);
                if bad >= limits.max_bad_frames {
                    tracing::warn!(
                        "closing a connection after {bad} frames that did not authenticate"
                    );
                    let _ = send(&mut stream, refused, limits).await;
                    return;
                }
                refused
            }
            Ok(authenticated) => {
                if let Standing::Pending(_) = standing {
                    match permits.clone().try_acquire_owned() {
                        Ok(permit) => standing = Standing::Authenticated(permit),
                        Err(_) => {
                            tracing::warn!(
                                "connection refused: {} authenticated connections open",
                                limits.connection_split().0
                            );
                            let refused = service.refuse_authenticated(
                                &authenticated,
                                refuse(ErrorCode::DaemonUnavailable, "too many connections"),
                            );
                            let _ = send(&mut stream, refused, limits).await;
                            return;
                        }
                    }
                }
                let reply = service.serve_authenticated(authenticated, peer).await;
                // Silence is measured from the reply: a long AwaitDecision is not idleness.
                deadline = tokio::time::Instant::now() + limits.idle_timeout;
                reply
            }
        };
        if !send(&mut stream, reply, limits).await {
            return;
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// Write a reply. False: the peer did not take it within the frame timeout (it is holding
/// a connection without reading) or hung up; close the connection.
async fn send(stream: &mut UnixStream, reply: Reply, limits: &crate::config::Limits) -> bool {
    match reply {
        Reply::Frame(out) => {
            let Ok(bytes) = frame::frame_bytes(&out) else {
                return false;
            };
            matches!(
                tokio::time::timeout(limits.frame_timeout, stream.write_all(&bytes)).await,
                Ok(Ok(()))
            )
        }
        Reply::Nothing => true,
    }
}

/// Read the next frame's body.
///
/// The first byte of the next frame must come before `deadline` (the sign-in deadline
/// before the connection authenticates, the idle deadline after); a pending connection
/// also stops when `evicted` is signalled.
// INVARIANT (frame-deadline): a frame's deadline is set when its first byte arrives, and
// covers the rest of its header and its whole body; a peer that sends part of a frame
// holds its connection for at most `frame_timeout`, whatever it sends or withholds.
async fn next_frame(
    stream: &mut UnixStream,
    limits: &crate::config::Limits,
    stop: &mut watch::Receiver<bool>,
    deadline: tokio::time::Instant,
    evicted: Option<Arc<Notify>>,
) -> Result<Vec<u8>, Close> {
    let pending = evicted.is_some();
    let evicted = async move {
        match evicted {
            Some(n) => n.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(evicted);
    let mut header = [0u8; HEADER_LEN];
    // Wait for the first byte of the next frame, the deadline, or shutdown.
    let first = tokio::select! {
        r = tokio::time::timeout_at(deadline, stream.read(&mut header)) => match r {
            Ok(Ok(0) | Err(_)) => return Err(Close::Quietly), // closed by the peer
            Ok(Ok(n)) => n,
            Err(_) if pending => {
                return Err(Close::With(
                    ErrorCode::InvalidRequest,
                    "no authenticated frame within the sign-in deadline".into(),
                ))
            }
            Err(_) => return Err(Close::With(ErrorCode::InvalidRequest, "idle timeout".into())),
        },
        () = &mut evicted => return Err(evicted_close()),
        _ = stop.changed() => return Err(Close::Quietly),
    };
    let frame_deadline = tokio::time::Instant::now() + limits.frame_timeout;
    let late = || {
        Close::With(
            ErrorCode::MalformedMessage,
            "frame not complete within the frame timeout".into(),
        )
    };
    let rest = async {
        if let Some(rest) = header.get_mut(first..) {
            match tokio::time::timeout_at(frame_deadline, stream.read_exact(rest)).await {
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
        match tokio::time::timeout_at(frame_deadline, stream.read_exact(&mut body)).await {
            Ok(Ok(_)) => Ok(body),
            Ok(Err(_)) => Err(Close::Quietly),
            Err(_) => Err(late()),
        }
    };
    tokio::select! {
        r = rest => r,
        () = &mut evicted => Err(evicted_close()),
    }
}

fn evicted_close() -> Close {
    Close::With(
        ErrorCode::DaemonUnavailable,
        "too many unauthenticated connections; this, the oldest, was closed".into(),
    )
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

/// A frame that authenticated: its request, the key that sealed it (replies are sealed
/// with it), and who sent it.
pub struct Authenticated {
    envelope: Verified<Envelope>,
    key: MessageKey,
    caller: Caller,
    message_id: String,
    received_ns: i64,
}

impl std::fmt::Debug for Authenticated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticated")
            .field("message_id", &self.message_id)
            .field("caller", &self.caller)
            .finish_non_exhaustive()
    }
}

impl<S: SessionStore> Service<S> {
    /// Handle one frame body from `peer`: [`Service::authenticate`], then
    /// [`Service::serve_authenticated`].
    pub async fn handle(&self, body: &[u8], peer: Peer) -> Reply {
        match self.authenticate(body).await {
            Ok(a) => self.serve_authenticated(a, peer).await,
            Err(refused) => refused,
        }
    }

    /// Decode one frame body and check its seal. `Err`: the unsealed `Error` to send (the
    /// frame did not decode, or no key of the organization it names sealed it); nothing
    /// was changed.
    pub async fn authenticate(&self, body: &[u8]) -> Result<Authenticated, Reply> {
        let received_ns = self.now();
        let unverified = match Unverified::decode(body) {
            Ok(u) => u,
            Err(e) => {
                return Err(self.error_reply(
                    None,
                    "",
                    received_ns,
                    refuse(ErrorCode::MalformedMessage, e.to_string()),
                ))
            }
        };
        let message_id = unverified.envelope().message_id.clone();
        let keys = match keys_for(self, unverified.envelope()).await {
            Ok(k) => k,
            Err(r) => return Err(self.error_reply(None, &message_id, received_ns, r)),
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
        match outcome {
            Ok((envelope, key, caller)) => Ok(Authenticated {
                envelope,
                key,
                caller,
                message_id,
                received_ns,
            }),
            Err(e) => {
                let message = match e {
                    AuthError::BadMac => "message authentication failed".to_owned(),
                    other => other.to_string(),
                };
                tracing::warn!(%message_id, "authentication failed: {message}");
                Err(self.error_reply(
                    None,
                    &message_id,
                    received_ns,
                    refuse(ErrorCode::AuthenticationFailed, message),
                ))
            }
        }
    }

    /// Serve an authenticated request from `peer`; the reply is sealed with its key.
    pub async fn serve_authenticated(&self, a: Authenticated, peer: Peer) -> Reply {
        let result = dispatch(self, a.envelope, &a.caller, peer, a.received_ns).await;
        match result {
            Ok(Some(payload)) => self.reply(&a.key, &a.message_id, a.received_ns, payload),
            Ok(None) => Reply::Nothing,
            Err(r) => self.error_reply(Some(&a.key), &a.message_id, a.received_ns, r),
        }
    }

    /// A sealed `Error` for an authenticated request the transport refuses itself (no
    /// room for another authenticated connection).
    pub fn refuse_authenticated(&self, a: &Authenticated, r: Refusal) -> Reply {
        self.error_reply(Some(&a.key), &a.message_id, a.received_ns, r)
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
        Some(Payload::HitlList(_) | Payload::HitlDecide(_) | Payload::PolicyReload(_)) => {
            Who::Operator
        }
        Some(Payload::GetSessionState(_)) => Who::Either,
        _ => Who::Agent,
    };
    let or_default = |org: &str| {
        if org.is_empty() {
            DEFAULT_ORG.to_owned()
        } else {
            org.to_owned()
        }
    };
    // The organization, and the agent the request is about (whose own key seals it when
    // the agent is enrolled with a secret).
    let (org, agent) = match &env.payload {
        Some(Payload::Register(r)) => (or_default(&r.organization_id), Some(r.agent_id.clone())),
        Some(Payload::HitlList(r)) => (or_default(&r.organization_id), None),
        Some(Payload::PolicyReload(r)) => (or_default(&r.organization_id), None),
        Some(Payload::PreExec(r)) => owner(service, &r.session_id).await?,
        Some(Payload::PostExec(r)) => owner(service, &r.session_id).await?,
        Some(Payload::Heartbeat(r)) => owner(service, &r.session_id).await?,
        Some(Payload::GetSessionState(r)) => owner(service, &r.session_id).await?,
        Some(Payload::HitlDecide(r)) => owner(service, &r.session_id).await?,
        Some(Payload::HeldParams(r)) => owner(service, &r.session_id).await?,
        Some(Payload::AwaitDecision(r)) => owner(service, &r.session_id).await?,
        Some(Payload::CloseSession(r)) => owner(service, &r.session_id).await?,
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
        // An enrolled agent's own key, and then only it; otherwise the organization's
        // agents' key, whose holder's agent id is a claim (the service decides whether
        // the organization accepts claims for this id).
        let own = agent
            .as_ref()
            .and_then(|a| service.agent_keys.get(&(org.clone(), a.clone())));
        match own {
            Some(k) => keys.push((
                k.clone(),
                Caller::Agent {
                    organization: org.clone(),
                    agent: agent.clone(),
                },
            )),
            None => {
                if let Some(k) = service.keys.get(&org) {
                    keys.push((
                        k.clone(),
                        Caller::Agent {
                            organization: org.clone(),
                            agent: None,
                        },
                    ));
                }
            }
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

/// A session's organization and agent.
async fn owner<S: SessionStore>(
    service: &Service<S>,
    session_id: &str,
) -> Result<(String, Option<String>), Refusal> {
    let (org, agent) = service.session_owner(session_id).await?;
    Ok((org, Some(agent)))
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
        Some(Payload::PolicyReload(_)) => {
            Payload::PolicyReloadResponse(service.policy_reload(caller).await?)
        }
        Some(Payload::HeldParams(r)) => {
            Payload::HeldParamsAck(service.held_params(caller, r).await?)
        }
        Some(Payload::CloseSession(r)) => {
            Payload::CloseSessionResponse(service.close_session(caller, r, now).await?)
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
