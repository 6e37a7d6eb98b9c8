//! `DaemonClient`: an agent's connection to the daemon, over its Unix socket or over gRPC
//! with mutual TLS ([`crate::grpc`]). Fails closed: when the daemon cannot be reached,
//! does not answer in time, answers with a bad MAC, fails the TLS handshake, or answers
//! with something unreadable, the verdict is DENY with a reason saying which.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{oneshot, Mutex};
use tollgate_core::json::Value;
use tollgate_core::{Digest, Params};
use tollgate_proto::auth::{self, Unverified};
use tollgate_proto::frame::{self, HEADER_LEN};
use tollgate_proto::sp1::{self, envelope::Payload, Envelope};
use tollgate_proto::{MessageKey, MAX_TOOL_PARAMS_BYTES, SUPPORTED_VERSIONS};

use crate::util::{now_ns, random_nonce};

/// How to reach and identify to the daemon.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// The organization, as configured in the daemon.
    pub organization_id: String,
    /// The organization's secret (the daemon's `secrets/<org>.secret`, or its config).
    pub secret: Vec<u8>,
    /// This agent's id.
    pub agent_id: String,
    /// This agent's version.
    pub agent_version: String,
    /// The agent framework.
    pub framework: String,
    /// How long to wait for any reply before failing closed.
    pub timeout: Duration,
    /// Talk gRPC with mutual TLS to this endpoint instead of the socket (`socket` and
    /// `secret` are then not used: the client certificate names the organization).
    pub grpc: Option<crate::grpc::GrpcConfig>,
}

impl ClientConfig {
    /// A config for `agent_id` of `organization_id` on `socket`, with a 2 s timeout.
    pub fn new(
        socket: impl Into<PathBuf>,
        organization_id: &str,
        secret: &[u8],
        agent_id: &str,
    ) -> Self {
        ClientConfig {
            socket: socket.into(),
            organization_id: organization_id.to_owned(),
            secret: secret.to_vec(),
            agent_id: agent_id.to_owned(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            framework: "rust".to_owned(),
            timeout: Duration::from_secs(2),
            grpc: None,
        }
    }

    /// A config for `agent_id` of `organization_id` over gRPC (`grpc`), with a 2 s
    /// timeout.
    pub fn grpc(grpc: crate::grpc::GrpcConfig, organization_id: &str, agent_id: &str) -> Self {
        ClientConfig {
            grpc: Some(grpc),
            ..ClientConfig::new(PathBuf::new(), organization_id, &[], agent_id)
        }
    }
}

/// Why a request got no trustworthy answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached, or the connection broke.
    #[error("daemon unreachable: {0}")]
    Unreachable(String),
    /// No reply within the timeout.
    #[error("daemon did not answer within {0:?}")]
    Timeout(Duration),
    /// The reply's MAC did not verify.
    #[error("reply failed authentication")]
    BadMac,
    /// The reply could not be read, or was the wrong kind.
    #[error("malformed reply: {0}")]
    Malformed(String),
    /// The TLS handshake or the TLS channel failed (gRPC): the daemon refused the
    /// client's certificate, or the client the daemon's.
    #[error("TLS failed: {0}")]
    Tls(String),
    /// The request is not served on this transport (operators' requests over gRPC).
    #[error("not served over this transport: {0}")]
    Unsupported(&'static str),
    /// The daemon answered with an error.
    #[error("daemon refused: {code:?}: {message}")]
    Refused {
        /// The error code.
        code: sp1::ErrorCode,
        /// Its message.
        message: String,
    },
}

impl ClientError {
    /// The fail-closed reason string reported with the DENY.
    pub fn reason(&self) -> String {
        match self {
            ClientError::Unreachable(_) => "fail_closed:daemon_unreachable".into(),
            ClientError::Timeout(_) => "fail_closed:timeout".into(),
            ClientError::BadMac => "fail_closed:bad_mac".into(),
            ClientError::Malformed(_) => "fail_closed:malformed_reply".into(),
            ClientError::Tls(_) => "fail_closed:tls".into(),
            ClientError::Unsupported(_) => "fail_closed:unsupported".into(),
            ClientError::Refused { code, .. } => {
                format!("fail_closed:{}", code.as_str_name().to_ascii_lowercase())
            }
        }
    }
}

/// A verdict as the agent sees it: the daemon's, or a fail-closed DENY.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientVerdict {
    /// ALLOW, DENY or HITL. Anything but ALLOW means: do not run the tool.
    pub verdict: tollgate_core::Verdict,
    /// The stable reason (`within_thresholds`, `max_repeat_exceeded`, or
    /// `fail_closed:...` when the daemon gave no usable answer).
    pub reason: String,
    /// The call number this verdict is for (pass it to `post_exec`).
    pub call_number: u64,
    /// The daemon's response, when there was one.
    pub response: Option<sp1::PreExecResponse>,
    /// Why the client failed closed, when it did.
    pub error: Option<ClientError>,
}

impl ClientVerdict {
    /// Whether the tool may run.
    pub fn allowed(&self) -> bool {
        self.verdict == tollgate_core::Verdict::Allow
    }

    fn fail_closed(call_number: u64, e: ClientError) -> ClientVerdict {
        ClientVerdict {
            verdict: tollgate_core::Verdict::Deny,
            reason: e.reason(),
            call_number,
            response: None,
            error: Some(e),
        }
    }
}

type Waiters =
    Arc<std::sync::Mutex<HashMap<String, oneshot::Sender<Result<Envelope, ClientError>>>>>;

/// A registered session with the daemon. Cheap to share (`Arc`) across tasks: requests
/// are pipelined on one connection and matched to replies by correlation id.
pub struct DaemonClient {
    config: ClientConfig,
    key: MessageKey,
    writer: Mutex<Option<OwnedWriteHalf>>,
    waiters: Waiters,
    session_id: String,
    next_call: AtomicU64,
    /// Keeps pre_exec requests in call-number order from this client to the daemon (which
    /// refuses a call number not above every earlier one): the highest number dispatched.
    dispatch: Mutex<u64>,
    /// Call numbers this client gave out (`prepare`, `next_call_number`) and has not sent
    /// yet. Only such a number is renumbered when a higher one went first (a deliberate
    /// resend of a number already sent is left as it is). Bounded: the oldest are forgotten.
    issued: std::sync::Mutex<std::collections::BTreeSet<u64>>,
    registration: sp1::RegisterResponse,
    /// The last remaining budget the daemon reported, in nano-dollars (for heartbeats).
    last_remaining: std::sync::atomic::AtomicI64,
    /// The gRPC link, when the config asks for gRPC (then `writer` is `None`).
    grpc: Option<crate::grpc::GrpcLink>,
    /// Whether the session has ended for this client (`close` was called, or a heartbeat
    /// was answered `SESSION_NOT_FOUND`): background heartbeats stop. A background
    /// heartbeat holds the lock while it is in flight, and `close` sets the flag under
    /// it, so none is sent after the close.
    ended: Mutex<bool>,
}

impl std::fmt::Debug for DaemonClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonClient")
            .field("session_id", &self.session_id)
            .finish_non_exhaustive()
    }
}

fn lock_waiters(
    w: &Waiters,
) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Result<Envelope, ClientError>>>> {
    w.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How many given-out, unsent call numbers a client remembers.
const MAX_ISSUED: usize = 4096;

impl DaemonClient {
    /// Connect and register a new session.
    pub async fn connect(config: ClientConfig) -> Result<DaemonClient, ClientError> {
        Self::connect_inner(config, Some(String::new())).await
    }

    /// Connect and resume an existing session.
    pub async fn resume(
        config: ClientConfig,
        session_id: &str,
    ) -> Result<DaemonClient, ClientError> {
        Self::connect_inner(config, Some(session_id.to_owned())).await
    }

    /// Connect as an operator, without registering a session: for `hitl_list`,
    /// `hitl_decide` and `state_of` (operator messages are authenticated by the
    /// organization's key alone).
    pub async fn operator(config: ClientConfig) -> Result<DaemonClient, ClientError> {
        Self::connect_inner(config, None).await
    }

    async fn connect_inner(
        config: ClientConfig,
        session_id: Option<String>,
    ) -> Result<DaemonClient, ClientError> {
        let (grpc, writer, key, waiters) = match &config.grpc {
            Some(g) => (
                Some(crate::grpc::GrpcLink::connect(g, config.timeout).await?),
                None,
                MessageKey::derive(&config.secret),
                Waiters::default(),
            ),
            None => {
                let (w, k, ws) = Self::open_socket(&config).await?;
                (None, Some(w), k, ws)
            }
        };
        let mut client = DaemonClient {
            key,
            writer: Mutex::new(writer),
            waiters,
            session_id: String::new(),
            next_call: AtomicU64::new(1),
            dispatch: Mutex::new(0),
            issued: std::sync::Mutex::default(),
            registration: sp1::RegisterResponse::default(),
            last_remaining: std::sync::atomic::AtomicI64::new(0),
            config,
            grpc,
            ended: Mutex::new(false),
        };
        let Some(session_id) = session_id else {
            return Ok(client);
        };
        client.register(session_id).await?;
        Ok(client)
    }

    /// A second connection for this client's session, for a request that may take long
    /// (an `await_decision` long poll): the daemon answers one request at a time per
    /// socket connection, so a long poll on the shared connection would hold up every
    /// other call of every thread sharing this client. Over gRPC each request is its own
    /// rpc already, and the client itself is returned (`None`).
    pub(crate) async fn side_connection(&self) -> Result<Option<DaemonClient>, ClientError> {
        if self.grpc.is_some() {
            return Ok(None);
        }
        let (w, key, waiters) = Self::open_socket(&self.config).await?;
        Ok(Some(DaemonClient {
            key,
            writer: Mutex::new(Some(w)),
            waiters,
            session_id: self.session_id.clone(),
            next_call: AtomicU64::new(0),
            dispatch: Mutex::new(0),
            issued: std::sync::Mutex::default(),
            registration: sp1::RegisterResponse::default(),
            last_remaining: std::sync::atomic::AtomicI64::new(0),
            config: self.config.clone(),
            grpc: None,
            ended: Mutex::new(false),
        }))
    }

    /// Connect to the socket and start the reader that routes replies to their waiters.
    async fn open_socket(
        config: &ClientConfig,
    ) -> Result<(OwnedWriteHalf, MessageKey, Waiters), ClientError> {
        let stream = tokio::time::timeout(config.timeout, UnixStream::connect(&config.socket))
            .await
            .map_err(|_| ClientError::Timeout(config.timeout))?
            .map_err(|e| ClientError::Unreachable(format!("{}: {e}", config.socket.display())))?;
        let (mut read, write) = stream.into_split();
        let key = MessageKey::derive(&config.secret);
        let waiters: Waiters = Arc::default();
        let reader_waiters = waiters.clone();
        let reader_key = key.clone();
        tokio::spawn(async move {
            let failure = loop {
                let mut header = [0u8; HEADER_LEN];
                if let Err(e) = read.read_exact(&mut header).await {
                    break ClientError::Unreachable(format!("connection closed: {e}"));
                }
                let len = match frame::body_len(header) {
                    Ok(n) => n,
                    Err(e) => break ClientError::Malformed(e.to_string()),
                };
                let mut body = vec![0u8; len];
                if let Err(e) = read.read_exact(&mut body).await {
                    break ClientError::Unreachable(format!("connection closed: {e}"));
                }
                if let Some(refusal) = deliver(&reader_waiters, &reader_key, &body) {
                    // The daemon refused the connection itself and closes it.
                    break refusal;
                }
            };
            // Everyone still waiting fails closed.
            for (_, tx) in lock_waiters(&reader_waiters).drain() {
                let _ = tx.send(Err(failure.clone()));
            }
        });
        Ok((write, key, waiters))
    }

    /// Register (an empty `session_id`) or resume a session.
    async fn register(&mut self, session_id: String) -> Result<(), ClientError> {
        let resume = (!session_id.is_empty()).then(|| session_id.clone());
        let reply = self
            .request(Payload::Register(sp1::RegisterRequest {
                agent_id: self.config.agent_id.clone(),
                agent_version: self.config.agent_version.clone(),
                framework: self.config.framework.clone(),
                session_id,
                organization_id: self.config.organization_id.clone(),
                runtime: "tollgate-client-rust".into(),
                metadata: HashMap::new(),
                supported_versions: SUPPORTED_VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
            }))
            .await?;
        let Payload::RegisterResponse(r) = reply else {
            return Err(ClientError::Malformed(
                "expected a register response".into(),
            ));
        };
        if !resumed_as_asked(&r, resume.as_deref()) {
            return Err(ClientError::Malformed(
                "the registration does not answer the session asked for".into(),
            ));
        }
        self.session_id = r.session_id.clone();
        let last = r.state.as_ref().map_or(0, |s| s.last_call_number);
        self.next_call = AtomicU64::new(last + 1);
        let remaining = r.state.as_ref().map_or(0, |s| s.budget_remaining_nanos);
        self.last_remaining = std::sync::atomic::AtomicI64::new(remaining);
        self.registration = r;
        Ok(())
    }

    /// How long a request waits for its reply.
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// The session id.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Requests sent on the socket and not yet answered (or timed out); 0 over gRPC,
    /// where each request is its own rpc.
    pub fn in_flight(&self) -> usize {
        lock_waiters(&self.waiters).len()
    }

    /// The registration response (negotiated protocol, active config, state).
    pub fn registration(&self) -> &sp1::RegisterResponse {
        &self.registration
    }

    async fn send(
        &self,
        payload: Payload,
        expect_reply: bool,
    ) -> Result<Option<(String, oneshot::Receiver<Result<Envelope, ClientError>>)>, ClientError>
    {
        if let Some(link) = &self.grpc {
            return self.send_grpc(link, payload, expect_reply).await;
        }
        let message_id = uuid::Uuid::now_v7().to_string();
        let env = Envelope {
            protocol_version: SUPPORTED_VERSIONS
                .first()
                .copied()
                .unwrap_or("1.0.0")
                .into(),
            message_id: message_id.clone(),
            correlation_id: String::new(),
            client_timestamp_ns: now_ns(),
            server_timestamp_ns: 0,
            hmac: Vec::new(),
            payload: Some(payload),
        };
        let body =
            auth::seal(&self.key, &env).map_err(|e| ClientError::Malformed(e.to_string()))?;
        let bytes = frame::frame_bytes(&body).map_err(|e| ClientError::Malformed(e.to_string()))?;
        let rx = if expect_reply {
            let (tx, rx) = oneshot::channel();
            lock_waiters(&self.waiters).insert(message_id.clone(), tx);
            Some((message_id.clone(), rx))
        } else {
            None
        };
        let mut w = self.writer.lock().await;
        let Some(stream) = w.as_mut() else {
            lock_waiters(&self.waiters).remove(&message_id);
            return Err(ClientError::Unreachable("connection closed".into()));
        };
        if let Err(e) = stream.write_all(&bytes).await {
            *w = None;
            lock_waiters(&self.waiters).remove(&message_id);
            return Err(ClientError::Unreachable(e.to_string()));
        }
        Ok(rx)
    }

    /// [`DaemonClient::send`] over gRPC. A request that expects a reply runs in its own
    /// task, its answer delivered like a socket reply (so the caller's timeout and checks
    /// apply unchanged), and abandoned when the caller stops waiting. A `post_exec` is
    /// awaited here: its `Empty` reply means the settlement is durable, so it is settled
    /// before this client's next request, as on the socket.
    async fn send_grpc(
        &self,
        link: &crate::grpc::GrpcLink,
        payload: Payload,
        expect_reply: bool,
    ) -> Result<Option<(String, oneshot::Receiver<Result<Envelope, ClientError>>)>, ClientError>
    {
        if !expect_reply {
            return match tokio::time::timeout(self.config.timeout, link.call(payload)).await {
                Err(_) => Err(ClientError::Timeout(self.config.timeout)),
                Ok(r) => r.map(|_| None),
            };
        }
        let (mut tx, rx) = oneshot::channel();
        let link = link.clone();
        tokio::spawn(async move {
            tokio::select! {
                r = link.call(payload) => {
                    let reply = r.and_then(|p| {
                        p.map(|p| Envelope { payload: Some(p), ..Envelope::default() })
                            .ok_or_else(|| ClientError::Malformed("no reply".into()))
                    });
                    let _ = tx.send(reply);
                }
                () = tx.closed() => {}
            }
        });
        Ok(Some((String::new(), rx)))
    }

    pub(crate) async fn request(&self, payload: Payload) -> Result<Payload, ClientError> {
        self.request_within(payload, self.config.timeout).await
    }

    /// [`DaemonClient::request`], waiting at most `timeout` for the reply.
    pub(crate) async fn request_within(
        &self,
        payload: Payload,
        timeout: Duration,
    ) -> Result<Payload, ClientError> {
        let Some((message_id, rx)) = self.send(payload, true).await? else {
            return Err(ClientError::Malformed("no reply channel".into()));
        };
        self.wait_reply(message_id, rx, timeout).await
    }

    /// Wait at most `timeout` for the reply to message `message_id`.
    async fn wait_reply(
        &self,
        message_id: String,
        rx: oneshot::Receiver<Result<Envelope, ClientError>>,
        timeout: Duration,
    ) -> Result<Payload, ClientError> {
        let env = match tokio::time::timeout(timeout, rx).await {
            Err(_) => {
                // Forget the waiter: a daemon that never answers must not grow the map.
                lock_waiters(&self.waiters).remove(&message_id);
                return Err(ClientError::Timeout(timeout));
            }
            Ok(Err(_)) => return Err(ClientError::Unreachable("connection closed".into())),
            Ok(Ok(r)) => r?,
        };
        match env.payload {
            Some(Payload::Error(e)) => Err(ClientError::Refused {
                code: sp1::ErrorCode::try_from(e.code).unwrap_or(sp1::ErrorCode::Unspecified),
                message: e.message,
            }),
            Some(p) => Ok(p),
            None => Err(ClientError::Malformed("reply has no payload".into())),
        }
    }

    /// Ask whether `tool` may run with `params`. Never errors: any failure is a DENY whose
    /// reason starts with `fail_closed:`.
    pub async fn pre_exec(
        &self,
        tool: &str,
        params: &Value,
        estimated_cost_usd: f64,
    ) -> ClientVerdict {
        self.pre_exec_request(self.prepare(tool, params, estimated_cost_usd))
            .await
    }

    /// The request [`DaemonClient::pre_exec`] sends: the next call number, a fresh random
    /// nonce, the params' canonical hash and the client's classification of them.
    pub fn prepare(
        &self,
        tool: &str,
        params: &Value,
        estimated_cost_usd: f64,
    ) -> sp1::PreExecRequest {
        let call_number = self.next_call_number();
        // The params themselves, for the daemon's policies (docs/protocol.md §4.3.1): their
        // canonical form, the bytes the hash covers (written once, then hashed); not sent
        // beyond the bound (a call a policy reads the arguments of is then refused, never
        // decided without them).
        let (classified, canonical) = Params::json_with_canonical(params);
        let (hash, noncanonical) = match classified.canonical_digest() {
            Ok(d) => (d, false),
            Err(_) => (Digest::default(), true),
        };
        let tool_params = canonical
            .filter(|bytes| bytes.len() <= MAX_TOOL_PARAMS_BYTES)
            .unwrap_or_default();
        sp1::PreExecRequest {
            session_id: self.session_id.clone(),
            call_number,
            tool_name: tool.to_owned(),
            tool_params_hash: hash.0.to_vec(),
            estimated_cost_usd,
            parent_guard_id: String::new(),
            nonce: random_nonce(),
            tags: HashMap::new(),
            params_noncanonical: noncanonical,
            params_opaque_context: classified.has_opaque_context(),
            tool_params,
        }
    }

    /// Send a prepared request (nonce, call number and hash chosen by the caller), for
    /// re-dispatching a call a human approved with its original nonce.
    ///
    /// Safe from many tasks at once: requests reach the daemon in call-number order. A
    /// number this client gave out (`prepare`) that another task's higher number overtook
    /// before it was sent is replaced by a fresh one (the verdict's `call_number` says
    /// which); a number sent before (a resend after a daemon crash) is sent as it is.
    pub async fn pre_exec_request(&self, mut req: sp1::PreExecRequest) -> ClientVerdict {
        let reply = {
            let mut last = self.dispatch.lock().await;
            self.place(&mut last, &mut req);
            if self.grpc.is_some() {
                // Each rpc is its own stream: keep the order by waiting for the answer.
                let call_number = req.call_number;
                (
                    call_number,
                    self.request(Payload::PreExec(req.clone())).await,
                )
            } else {
                // One connection: what is written in order is decided in order. Write
                // under the lock, wait for the answer without it.
                let call_number = req.call_number;
                match self.send(Payload::PreExec(req.clone()), true).await {
                    Ok(Some((id, rx))) => {
                        drop(last);
                        (
                            call_number,
                            self.wait_reply(id, rx, self.config.timeout).await,
                        )
                    }
                    Ok(None) => (
                        call_number,
                        Err(ClientError::Malformed("no reply channel".into())),
                    ),
                    Err(e) => (call_number, Err(e)),
                }
            }
        };
        let (call_number, reply) = reply;
        let session_id = req.session_id.clone();
        match reply {
            Ok(Payload::PreExecResponse(r)) => {
                let verdict = match sp1::Verdict::try_from(r.verdict) {
                    Ok(sp1::Verdict::Allow) => tollgate_core::Verdict::Allow,
                    Ok(sp1::Verdict::Hitl) => tollgate_core::Verdict::Hitl,
                    // DENY, and anything unknown or unspecified: fail closed.
                    _ => tollgate_core::Verdict::Deny,
                };
                if r.call_number != call_number || r.session_id != session_id {
                    return ClientVerdict::fail_closed(
                        call_number,
                        ClientError::Malformed("reply is for another call".into()),
                    );
                }
                self.last_remaining
                    .store(r.budget_remaining_nanos, Ordering::Relaxed);
                ClientVerdict {
                    verdict,
                    reason: r.reason.clone(),
                    call_number,
                    response: Some(r),
                    error: None,
                }
            }
            Ok(_) => ClientVerdict::fail_closed(
                call_number,
                ClientError::Malformed("expected a pre_exec response".into()),
            ),
            Err(e) => ClientVerdict::fail_closed(call_number, e),
        }
    }

    /// The next call number this client will use.
    pub fn next_call_number(&self) -> u64 {
        let n = self.next_call.fetch_add(1, Ordering::SeqCst);
        let mut issued = self
            .issued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        issued.insert(n);
        while issued.len() > MAX_ISSUED {
            issued.pop_first();
        }
        n
    }

    /// Give `req` its place in this client's call order, holding `last` (the dispatch
    /// lock): a number this client gave out and never sent, overtaken by a higher one sent
    /// by another task, is replaced by a fresh one (the daemon would refuse it, deciding
    /// nothing); any other number is kept.
    fn place(&self, last: &mut u64, req: &mut sp1::PreExecRequest) {
        let unsent = self
            .issued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&req.call_number);
        if unsent && req.call_number <= *last {
            req.call_number = self.next_call.fetch_add(1, Ordering::SeqCst);
        }
        *last = (*last).max(req.call_number);
    }

    /// Report a call's outcome (fire-and-forget).
    pub async fn post_exec(
        &self,
        call_number: u64,
        actual_cost_usd: f64,
        success: bool,
        error_message: &str,
    ) -> Result<(), ClientError> {
        self.send(
            Payload::PostExec(sp1::PostExecNotification {
                session_id: self.session_id.clone(),
                call_number,
                actual_cost_usd,
                success,
                error_message: error_message.to_owned(),
                ..sp1::PostExecNotification::default()
            }),
            false,
        )
        .await
        .map(|_| ())
    }

    /// Send a heartbeat with the agent's local view of its budget.
    pub async fn heartbeat(
        &self,
        local_budget_remaining: f64,
    ) -> Result<sp1::HeartbeatAck, ClientError> {
        match self
            .request(Payload::Heartbeat(sp1::Heartbeat {
                session_id: self.session_id.clone(),
                last_call_number: self.next_call.load(Ordering::SeqCst).saturating_sub(1),
                local_budget_remaining,
            }))
            .await?
        {
            Payload::HeartbeatAck(a) if a.session_id == self.session_id => Ok(a),
            _ => Err(ClientError::Malformed(
                "expected this session's heartbeat ack".into(),
            )),
        }
    }

    /// Heartbeat every `interval` in the background, reporting the last budget the daemon
    /// told this client, until the session ends for this client ([`DaemonClient::close`],
    /// or a heartbeat answered `SESSION_NOT_FOUND`: the session was closed elsewhere or
    /// ended idle, and cannot come back) or the client is dropped; the task then returns.
    /// The daemon marks a session that misses three intervals STALE and refuses its calls
    /// until it heartbeats again.
    pub fn spawn_heartbeats(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(c) = weak.upgrade() else { return };
                let mut ended = c.ended.lock().await;
                if *ended {
                    return;
                }
                #[allow(clippy::cast_precision_loss)]
                let local = c.last_remaining.load(Ordering::Relaxed) as f64 / 1e9;
                // A missed heartbeat is not fatal here: calls fail closed on their own.
                if let Err(ClientError::Refused {
                    code: sp1::ErrorCode::SessionNotFound,
                    ..
                }) = c.heartbeat(local).await
                {
                    *ended = true;
                    return;
                }
            }
        })
    }

    /// The daemon's view of this session.
    pub async fn session_state(&self) -> Result<sp1::SessionState, ClientError> {
        self.state_of(&self.session_id.clone()).await
    }

    /// End this client's session (`CloseSession`): the daemon audits it as closed,
    /// decides nothing more on it and forgets it; it cannot be resumed. Every later call
    /// of this client is refused (`SESSION_NOT_FOUND`, a DENY). Background heartbeats
    /// ([`DaemonClient::spawn_heartbeats`]) stop first (a heartbeat in flight is answered
    /// before the close is sent), whether or not the close then succeeds: an agent that
    /// ends its session does not keep it alive, and if the close is lost the session is
    /// left for the daemon's idle sweep.
    pub async fn close(&self) -> Result<sp1::CloseSessionResponse, ClientError> {
        *self.ended.lock().await = true;
        let id = self.session_id.clone();
        match self
            .request(Payload::CloseSession(sp1::CloseSessionRequest {
                session_id: id.clone(),
            }))
            .await?
        {
            Payload::CloseSessionResponse(r) if r.session_id == id => Ok(r),
            _ => Err(ClientError::Malformed(
                "expected this session's close".into(),
            )),
        }
    }

    /// The daemon's view of any session of this organization.
    pub async fn state_of(&self, session_id: &str) -> Result<sp1::SessionState, ClientError> {
        match self
            .request(Payload::GetSessionState(sp1::GetSessionStateRequest {
                session_id: session_id.to_owned(),
            }))
            .await?
        {
            Payload::SessionState(s) if s.session_id == session_id => Ok(s),
            _ => Err(ClientError::Malformed(
                "expected that session's state".into(),
            )),
        }
    }

    /// Pending HITL transitions of this organization (operator use).
    pub async fn hitl_list(&self) -> Result<Vec<sp1::HitlPending>, ClientError> {
        match self
            .request(Payload::HitlList(sp1::HitlListRequest {
                organization_id: self.config.organization_id.clone(),
            }))
            .await?
        {
            Payload::HitlListResponse(r) => Ok(r.pending),
            _ => Err(ClientError::Malformed("expected a HITL list".into())),
        }
    }

    /// Ask the daemon to reload its `[policy]` set (operator use): the set now in force,
    /// or the daemon's refusal (the set in force stays).
    pub async fn policy_reload(&self) -> Result<sp1::PolicyReloadResponse, ClientError> {
        match self
            .request(Payload::PolicyReload(sp1::PolicyReloadRequest {
                organization_id: self.config.organization_id.clone(),
            }))
            .await?
        {
            Payload::PolicyReloadResponse(r) => Ok(r),
            _ => Err(ClientError::Malformed(
                "expected a policy reload response".into(),
            )),
        }
    }

    /// Record a human decision on a session's pending transition (operator use).
    pub async fn hitl_decide(
        &self,
        req: sp1::HitlDecideRequest,
    ) -> Result<sp1::HitlDecideResponse, ClientError> {
        let session_id = req.session_id.clone();
        match self.request(Payload::HitlDecide(req)).await? {
            Payload::HitlDecideResponse(r) if r.session_id == session_id => Ok(r),
            _ => Err(ClientError::Malformed(
                "expected a HITL decision response".into(),
            )),
        }
    }
}

/// Whether a registration reply answers what was asked: a resume must come back as that
/// session, resumed; a new registration as a new session.
fn resumed_as_asked(r: &sp1::RegisterResponse, resume: Option<&str>) -> bool {
    match resume {
        Some(id) => r.resumed && r.session_id == id,
        None => !r.resumed && !r.session_id.is_empty(),
    }
}

/// Route a reply to its waiter, if it verifies. An unsealed error with no correlation id
/// is the daemon refusing the connection itself (at its connection cap, or after a frame
/// or idle timeout): returned, so that every waiter fails with it.
fn deliver(waiters: &Waiters, key: &MessageKey, body: &[u8]) -> Option<ClientError> {
    let Ok(unverified) = Unverified::decode(body) else {
        return None; // unreadable: whoever waits times out, failing closed
    };
    let correlation = unverified.envelope().correlation_id.clone();
    if correlation.is_empty() {
        if let Some(Payload::Error(e)) = &unverified.envelope().payload {
            return Some(ClientError::Refused {
                code: sp1::ErrorCode::try_from(e.code).unwrap_or(sp1::ErrorCode::Unspecified),
                message: e.message.clone(),
            });
        }
    }
    let tx = lock_waiters(waiters).remove(&correlation)?;
    // An unauthenticated error (sent before the daemon knew our key) is still a failure;
    // anything else unauthenticated is a forgery.
    let unsealed_error = match &unverified.envelope().payload {
        Some(Payload::Error(e)) => Some(ClientError::Refused {
            code: sp1::ErrorCode::try_from(e.code).unwrap_or(sp1::ErrorCode::Unspecified),
            message: e.message.clone(),
        }),
        _ => None,
    };
    let result = match unverified.verify(key) {
        Ok(v) => Ok(v.into_inner()),
        Err(_) => Err(unsealed_error.unwrap_or(ClientError::BadMac)),
    };
    let _ = tx.send(result);
    None
}
