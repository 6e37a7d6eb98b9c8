//! The control plane (SP/1.0 §6.3): one HTTP/1.1 server, TLS optional on loopback and
//! required elsewhere, serving
//!
//! - `/`: the operators' console, a single static page embedded in the binary
//!   (`assets/console.html`);
//! - `/v1/control`: a WebSocket for consoles. A peer signs in with an operator's bearer
//!   token (the `Authorization` header of the upgrade request, or a first text frame
//!   `{"auth":{"token":"…"}}`), then exchanges `tollgate.control` messages in their proto3
//!   JSON form, one per text frame. Held calls are pushed as they happen;
//! - `/metrics`: Prometheus text ([`crate::metrics`]).
//!
//! Like every transport, it only translates: a signed-in operator is a
//! [`Caller::Operator`](crate::service::Caller::Operator) with the token's operator id, and every request is one call of
//! the service core (`hitl_list`, `hitl_decide`, `operator_sessions`, `history`,
//! `session_activity`). It keeps one thing of its own: the recent decisions it has seen
//! (in memory, `recent`; the history that survives restarts is `history`, from the log).
//!
//! Bounds on a peer: [`MAX_HTTP_CONNECTIONS`] HTTP connections at once (one more pushes the
//! oldest out); [`MAX_CONSOLES`] signed-in WebSockets (beyond: HTTP 503, or a
//! `DAEMON_UNAVAILABLE` event and close 1013) and, apart from them,
//! [`MAX_PENDING_CONSOLES`] upgraded WebSockets not signed in yet (one more pushes the
//! oldest out), each with [`AUTH_TIMEOUT`] to sign in; request headers within
//! [`HEADER_TIMEOUT`] and at most [`MAX_HEADER_BYTES`] (beyond: 431); a TLS handshake
//! within [`HEADER_TIMEOUT`]; a `Host` that is an IP address, `localhost` or a configured
//! name (beyond: 403, against DNS rebinding); a WebSocket `Origin`, when sent, the
//! console's own or a configured one (beyond: 403, before any sign-in is tried); text
//! frames of at most [`MAX_FRAME_BYTES`] read (larger ones get an `Error` event and the
//! connection stays usable, up to [`HARD_MAX_MESSAGE_BYTES`], past which the WebSocket
//! layer closes it with 1009); [`MAX_BAD_FRAMES`] unreadable frames per connection, then
//! it is closed with 1008; failed sign-ins per address as [`crate::operators::AuthLimiter`]
//! allows, except that a token of the form `tollgate operator-token` makes (256 random
//! bits, which no one guesses) is always looked at, so a flood of wrong tokens from the
//! operator's own address (an ssh tunnel, a local process) cannot lock the operator out.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use base64::Engine as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, watch, Semaphore};
use tokio::task::JoinSet;
use tollgate_proto::control::{
    control_event, control_request, ControlEvent, ControlRequest, RecentResponse, Resolved,
    SessionsResponse, Subscribed, Welcome,
};
use tollgate_proto::sp1::{self, ErrorCode};
use tollgate_store::SessionStore;

use super::pending::{Pending, PendingSlot};
use crate::config::{ControlSettings, Operator, TlsFiles, DEFAULT_ORG};
use crate::hitl::HitlEvent;
use crate::metrics;
use crate::operators::{self, AuthLimiter, Operators, TokenRefused};
use crate::service::{refuse, Refusal, Service};

/// The console page, embedded at build time.
pub const CONSOLE_HTML: &str = include_str!("../../assets/console.html");

/// The largest text frame read; larger frames get a `MESSAGE_TOO_LARGE` event.
pub const MAX_FRAME_BYTES: usize = 256 * 1024;
/// The largest WebSocket message accepted at all: larger ones close the connection (1009).
pub const HARD_MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// Unreadable frames (malformed, oversized, binary, unknown) tolerated per connection.
pub const MAX_BAD_FRAMES: u32 = 16;
/// How long a WebSocket without an `Authorization` header has to send its sign-in frame.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// Upgraded WebSockets that have not signed in yet, at most (apart from [`MAX_CONSOLES`]).
pub const MAX_PENDING_CONSOLES: usize = 16;
/// The most bytes of request line and headers read (docs/protocol.md §9.1).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// How long a peer has to complete its TLS handshake and each request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Concurrent HTTP connections at most.
pub const MAX_HTTP_CONNECTIONS: usize = 256;
/// Concurrent signed-in WebSocket connections at most.
pub const MAX_CONSOLES: usize = 64;
/// How often the daemon pings a console (and re-checks its token's expiry).
pub const PING_INTERVAL: Duration = Duration::from_secs(20);
/// A frame the console does not take within this closes the connection.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Decisions remembered for `recent`.
pub const RECENT_KEPT: usize = 200;
/// The longest `request_id` accepted.
pub const MAX_REQUEST_ID_BYTES: usize = 128;
/// The longest error text read from the JSON decoder that is sent back.
const MAX_ERROR_TEXT: usize = 300;

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The address cannot be bound.
    #[error("control plane: binding `{addr}`: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// No certificate for an address other than loopback.
    #[error("control plane: `{0}` is not a loopback address: TLS is required there (set control.cert and control.key)")]
    TlsRequired(SocketAddr),
    /// The certificate or key cannot be used.
    #[error("control plane TLS: `{path}`: {message}")]
    Tls {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// A bound control plane, not yet serving.
pub struct Bound {
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    addr: SocketAddr,
    names: Arc<Names>,
}

/// Which `Host` and `Origin` headers are accepted.
#[derive(Debug, Default)]
struct Names {
    tls: bool,
    hosts: Vec<String>,
    origins: Vec<String>,
}

impl Names {
    /// Whether a `Host` header names this server: an IP address (no DNS name to rebind),
    /// `localhost` or a name under it, or a configured name; with any port.
    fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim();
        let name = if let Some(rest) = host.strip_prefix('[') {
            return match rest.split_once(']') {
                Some((ip, tail)) => {
                    ip.parse::<std::net::Ipv6Addr>().is_ok()
                        && (tail.is_empty() || tail.strip_prefix(':').is_some_and(is_port))
                }
                None => false,
            };
        } else {
            match host.rsplit_once(':') {
                Some((name, port)) if is_port(port) => name,
                Some(_) => return false,
                None => host,
            }
        };
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        name.parse::<std::net::Ipv4Addr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.hosts.contains(&name)
    }

    /// Whether a browser page from `origin` may open the WebSocket: the console's own
    /// (the scheme this server speaks and the `Host` it was reached by), or a configured
    /// one. `null` (sandboxed pages, files) is no one's.
    fn origin_allowed(&self, origin: &str, host: &str) -> bool {
        let origin = origin.trim().to_ascii_lowercase();
        let own = format!(
            "{}://{}",
            if self.tls { "https" } else { "http" },
            host.trim().to_ascii_lowercase()
        );
        origin == own || self.origins.contains(&origin)
    }
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Bound {
    /// The address it listens on (with the port chosen when the configuration said 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether it speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
}

/// Bind the configured address and load the TLS certificate, if any.
pub async fn bind(settings: &ControlSettings) -> Result<Bound, ControlError> {
    if settings.tls.is_none() && !settings.listen.ip().is_loopback() {
        return Err(ControlError::TlsRequired(settings.listen));
    }
    let tls = settings.tls.as_ref().map(tls_acceptor).transpose()?;
    let listener =
        TcpListener::bind(settings.listen)
            .await
            .map_err(|source| ControlError::Bind {
                addr: settings.listen,
                source,
            })?;
    let addr = listener.local_addr().map_err(|source| ControlError::Bind {
        addr: settings.listen,
        source,
    })?;
    let names = Arc::new(Names {
        tls: tls.is_some(),
        hosts: settings.allowed_hosts.clone(),
        origins: settings.allowed_origins.clone(),
    });
    Ok(Bound {
        listener,
        tls,
        addr,
        names,
    })
}

fn tls_acceptor(files: &TlsFiles) -> Result<tokio_rustls::TlsAcceptor, ControlError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let err = |path: &Path, message: String| ControlError::Tls {
        path: path.to_owned(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| err(&files.cert, e.to_string()))?;
    if certs.is_empty() {
        return Err(err(&files.cert, "no certificate in the file".into()));
    }
    let key =
        PrivateKeyDer::from_pem_file(&files.key).map_err(|e| err(&files.key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&files.cert, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| err(&files.key, e.to_string()))?;
    // WebSockets upgrade HTTP/1.1 connections.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The peer's address, put on every request by the accept loop.
#[derive(Debug, Clone, Copy)]
struct PeerAddr(SocketAddr);

/// What every handler shares.
struct Shared<S> {
    service: Arc<Service<S>>,
    operators: Operators,
    limiter: Mutex<AuthLimiter>,
    recent: Mutex<VecDeque<Resolved>>,
    consoles: Arc<Semaphore>,
    /// Upgraded WebSockets that have not signed in yet.
    pending_consoles: Arc<Pending>,
    names: Arc<Names>,
    stop: watch::Receiver<bool>,
    /// Dropped by each console when it ends; the server waits for all before returning.
    alive: mpsc::Sender<()>,
    csp: HeaderValue,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Serve until `stop` turns true; then stop accepting, tell consoles the daemon is going
/// away, let each finish the request it is handling, and return.
pub async fn serve<S: SessionStore>(
    bound: Bound,
    service: Arc<Service<S>>,
    operators: Operators,
    mut stop: watch::Receiver<bool>,
) {
    let Bound {
        listener,
        tls,
        names,
        ..
    } = bound;
    let (alive, mut all_gone) = mpsc::channel::<()>(1);
    let shared = Arc::new(Shared {
        service: service.clone(),
        operators,
        limiter: Mutex::new(AuthLimiter::new()),
        recent: Mutex::new(VecDeque::with_capacity(RECENT_KEPT)),
        consoles: Arc::new(Semaphore::new(MAX_CONSOLES)),
        pending_consoles: Pending::new(MAX_PENDING_CONSOLES),
        names: names.clone(),
        stop: stop.clone(),
        alive,
        csp: content_security_policy(CONSOLE_HTML),
    });
    let recorder = tokio::spawn(record_decisions(shared.clone(), service.hitl_events()));
    let router = Router::new()
        .route("/", get(console::<S>))
        .route("/metrics", get(metrics_page::<S>))
        .route("/v1/control", get(control_socket::<S>))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state(shared.clone());
    // Every HTTP connection until it upgrades: a flood of idle ones pushes only its own
    // oldest out, never keeps a new one from being served.
    let connections = Pending::new(MAX_HTTP_CONNECTIONS);
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => {
                let (tcp, addr) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!("control plane: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let slot = connections.admit("control plane");
                let router = router.clone();
                let tls = tls.clone();
                let stop = stop.clone();
                let names = names.clone();
                tasks.spawn(async move {
                    let evicted = slot.evicted();
                    let serve = async {
                        match tls {
                            None => http(tcp, addr, router, names, stop).await,
                            Some(acceptor) => {
                                if let Ok(Ok(s)) = tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(tcp)).await {
                                    http(s, addr, router, names, stop).await;
                                }
                            }
                        }
                    };
                    tokio::select! {
                        () = serve => {}
                        () = evicted.notified() => {}
                    }
                    drop(slot);
                });
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    drop(router);
    recorder.abort();
    // Consoles see the stop, finish what they are doing, and close; the last one to go
    // drops the last sender.
    drop(shared);
    let drain = async {
        while tasks.join_next().await.is_some() {}
        let _ = all_gone.recv().await;
    };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        tracing::warn!("control plane: connections still busy after 10 s; closing them");
        tasks.abort_all();
    }
}

/// One HTTP/1.1 connection (upgrades included) until it ends or the daemon stops.
async fn http<I>(
    io: I,
    addr: SocketAddr,
    router: Router,
    names: Arc<Names>,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        let refused = screen(&req, &names);
        req.extensions_mut().insert(PeerAddr(addr));
        let mut router = router.clone();
        async move {
            match refused {
                Some(r) => Ok(r),
                None => tower_service::Service::call(&mut router, req).await,
            }
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
        }
    }
}

/// What every request is checked for before it is routed: its head within
/// [`MAX_HEADER_BYTES`] (431), and a `Host` naming this server (403: a page on a name that
/// was rebound to this address must not read the console or `/metrics`).
fn screen<B>(req: &hyper::Request<B>, names: &Names) -> Option<Response> {
    let head = req.uri().to_string().len().saturating_add(
        req.headers()
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>(),
    );
    if head > MAX_HEADER_BYTES {
        return Some(
            (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                format!("request headers over {MAX_HEADER_BYTES} bytes\n"),
            )
                .into_response(),
        );
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    match host {
        Some(h) if names.host_allowed(h) => None,
        Some(h) => {
            tracing::warn!(host = %h.escape_debug(), "control plane: request for a host that is not this server refused");
            Some(
                (
                    StatusCode::FORBIDDEN,
                    "this Host is not served here (control.allowed_hosts)\n",
                )
                    .into_response(),
            )
        }
        None => Some((StatusCode::BAD_REQUEST, "no Host header\n").into_response()),
    }
}

/// The console's CSP: nothing loads from anywhere; the page's own inline script and style
/// run (by hash), and it connects back to the daemon.
fn content_security_policy(html: &str) -> HeaderValue {
    let hash_of = |open: &str, close: &str| -> String {
        let body = html
            .split_once(open)
            .and_then(|(_, rest)| rest.split_once(close))
            .map_or("", |(body, _)| body);
        let digest = Sha256::digest(body.as_bytes());
        format!(
            "'sha256-{}'",
            base64::engine::general_purpose::STANDARD.encode(digest)
        )
    };
    let csp = format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self' data:; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hash_of("<script>", "</script>"),
        hash_of("<style>", "</style>"),
    );
    HeaderValue::from_str(&csp).unwrap_or_else(|_| HeaderValue::from_static("default-src 'none'"))
}

async fn console<S: SessionStore>(State(shared): State<Arc<Shared<S>>>) -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CONTENT_SECURITY_POLICY, shared.csp.clone()),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        CONSOLE_HTML,
    )
        .into_response()
}

async fn metrics_page<S: SessionStore>(State(shared): State<Arc<Shared<S>>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        metrics::render(&shared.service).await,
    )
        .into_response()
}

/// Keep the decisions consoles may ask for (`recent`).
async fn record_decisions<S: SessionStore>(
    shared: Arc<Shared<S>>,
    mut events: broadcast::Receiver<HitlEvent>,
) {
    loop {
        match events.recv().await {
            Ok(HitlEvent::Resolved {
                organization_id,
                session_id,
                call_number,
                outcome,
                operator_id,
            }) if outcome != "released" => {
                let mut recent = lock(&shared.recent);
                if recent.len() >= RECENT_KEPT {
                    recent.pop_back();
                }
                recent.push_front(Resolved {
                    organization_id,
                    session_id,
                    call_number,
                    outcome,
                    operator_id,
                    at_ns: shared.service.now(),
                });
            }
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Sign in at `now`, counting failures against `peer`.
fn sign_in<'a, S>(
    shared: &'a Shared<S>,
    peer: &SocketAddr,
    token: &str,
    now_ns: i64,
) -> Result<&'a Operator, Refusal> {
    let ip = peer.ip();
    let mut limiter = lock(&shared.limiter);
    // A spent budget refuses tokens without looking at them, except tokens of the form
    // `tollgate operator-token` makes: 256 random bits are not guessed, however many tries
    // the limiter allows, so looking at one costs nothing, and a flood of wrong tokens
    // from the operator's own address cannot lock the operator out.
    if let Err(wait) = limiter.check(&ip, Instant::now()).or_else(|w| {
        if operators::is_strong_token(token) {
            Ok(())
        } else {
            Err(w)
        }
    }) {
        return Err(Refusal {
            code: ErrorCode::RateLimited,
            message: "too many failed sign-ins from this address".into(),
            retry_after_ms: wait,
        });
    }
    match shared.operators.authenticate(token, now_ns) {
        Ok(op) => Ok(op),
        Err(e) => {
            limiter.failed(&ip, Instant::now());
            // The token is never logged; the address is.
            tracing::warn!(%peer, "control plane: sign-in refused: {e}");
            Err(refuse(ErrorCode::AuthenticationFailed, e.to_string()))
        }
    }
}

async fn control_socket<S: SessionStore>(
    State(shared): State<Arc<Shared<S>>>,
    Extension(PeerAddr(peer)): Extension<PeerAddr>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let upgrade = match upgrade {
        Ok(u) => u,
        Err(rejection) => return rejection.into_response(),
    };
    // A browser always says which page opens a WebSocket: refuse other sites' pages before
    // any token is looked at (so they cannot spend the operator's sign-in budget either).
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if !origin
            .to_str()
            .is_ok_and(|o| shared.names.origin_allowed(o, host))
        {
            tracing::warn!(%peer, origin = ?origin, "control plane: WebSocket from a foreign origin refused");
            metrics::refusal(ErrorCode::AuthenticationFailed);
            return (
                StatusCode::FORBIDDEN,
                "this Origin may not open the control WebSocket (control.allowed_origins)\n",
            )
                .into_response();
        }
    }
    let signed_in = match headers.get(header::AUTHORIZATION) {
        None => None,
        Some(value) => {
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, t)| t.trim());
            // A header that is not `Bearer <token>` counts as a failed sign-in too.
            let result =
                sign_in(&shared, &peer, token.unwrap_or(""), shared.service.now()).cloned();
            match result {
                Ok(op) => Some(op),
                Err(r) => {
                    metrics::refusal(r.code);
                    return http_refusal(&r);
                }
            }
        }
    };
    // Signed in: one of the consoles' places. Not yet: one of the places of those still to
    // sign in, apart, pushing the oldest out when full.
    let standing = match signed_in {
        Some(op) => {
            let Ok(permit) = shared.consoles.clone().try_acquire_owned() else {
                metrics::refusal(ErrorCode::DaemonUnavailable);
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too many consoles connected\n",
                )
                    .into_response();
            };
            Standing::SignedIn(op, permit)
        }
        None => Standing::Pending(shared.pending_consoles.admit("control plane WebSocket")),
    };
    upgrade
        .max_message_size(HARD_MAX_MESSAGE_BYTES)
        .max_frame_size(HARD_MAX_MESSAGE_BYTES)
        .on_upgrade(move |ws| async move {
            let _open = metrics::connection_opened("control");
            let _alive = shared.alive.clone();
            Console::run(ws, shared.clone(), peer, standing).await;
        })
}

/// A WebSocket's place: signed in (by header), or waiting for its sign-in frame.
enum Standing {
    SignedIn(Operator, tokio::sync::OwnedSemaphorePermit),
    Pending(PendingSlot),
}

/// An upgrade request refused before the WebSocket opens.
fn http_refusal(r: &Refusal) -> Response {
    match r.code {
        ErrorCode::RateLimited => {
            let secs = r.retry_after_ms.div_ceil(1000).max(1);
            (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, secs.to_string())],
                format!("{}\n", r.message),
            )
                .into_response()
        }
        _ => (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                format!(
                    "Bearer error=\"invalid_token\", error_description=\"{}\"",
                    r.message
                ),
            )],
            format!("{}\n", r.message),
        )
            .into_response(),
    }
}

fn event(request_id: &str, body: control_event::Body) -> ControlEvent {
    ControlEvent {
        request_id: request_id.to_owned(),
        body: Some(body),
    }
}

fn error_event(request_id: &str, r: Refusal) -> ControlEvent {
    metrics::refusal(r.code);
    event(
        request_id,
        control_event::Body::Error(sp1::Error {
            code: r.code as i32,
            message: r.message,
            retry_after_ms: r.retry_after_ms,
        }),
    )
}

/// How a console connection ends.
enum End {
    /// The peer went away, or a send failed: nothing more to say.
    Gone,
    /// Close with this code and reason.
    Close(u16, &'static str),
}

/// One console connection.
struct Console<S> {
    ws: WebSocket,
    shared: Arc<Shared<S>>,
    peer: SocketAddr,
    operator: Operator,
    /// The organizations pushes are sent for, once subscribed.
    subscribed: Option<Vec<String>>,
    events: Option<broadcast::Receiver<HitlEvent>>,
    bad_frames: u32,
}

impl<S: SessionStore> Console<S> {
    async fn run(mut ws: WebSocket, shared: Arc<Shared<S>>, peer: SocketAddr, standing: Standing) {
        let (operator, request_id, _permit) = match standing {
            Standing::SignedIn(op, permit) => (op, String::new(), permit),
            Standing::Pending(slot) => {
                match first_frame_sign_in(&mut ws, &shared, peer, &slot).await {
                    Ok(x) => x,
                    Err(end) => {
                        close(&mut ws, end).await;
                        return;
                    }
                }
            }
        };
        tracing::info!(operator = %operator.id, %peer, "control plane: console signed in");
        let mut console = Console {
            ws,
            shared,
            peer,
            operator,
            subscribed: None,
            events: None,
            bad_frames: 0,
        };
        let end = console.serve(request_id).await;
        tracing::info!(operator = %console.operator.id, peer = %console.peer, "control plane: console closed");
        close(&mut console.ws, end).await;
    }

    fn now(&self) -> i64 {
        self.shared.service.now()
    }

    async fn send(&mut self, e: &ControlEvent) -> Result<(), End> {
        let text = serde_json::to_string(e).map_err(|_| End::Close(1011, "cannot encode"))?;
        match tokio::time::timeout(SEND_TIMEOUT, self.ws.send(Message::Text(text.into()))).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(End::Gone),
        }
    }

    async fn serve(&mut self, request_id: String) -> End {
        let welcome = event(
            &request_id,
            control_event::Body::Welcome(Welcome {
                operator_id: self.operator.id.clone(),
                organization_ids: self.operator.organizations.clone(),
                daemon_version: crate::service::DAEMON_VERSION.into(),
                daemon_time_ns: self.now(),
                token_expires_at_ns: self.operator.expires_at_ns.unwrap_or(0),
                max_frame_bytes: u32::try_from(MAX_FRAME_BYTES).unwrap_or(u32::MAX),
            }),
        );
        if let Err(end) = self.send(&welcome).await {
            return end;
        }
        let mut stop = self.shared.stop.clone();
        let mut ping = tokio::time::interval(PING_INTERVAL);
        ping.tick().await;
        loop {
            let step = tokio::select! {
                _ = stop.changed() => Err(End::Close(1001, "the daemon is stopping")),
                _ = ping.tick() => self.tick().await,
                ev = next_event(&mut self.events) => self.push(ev).await,
                msg = self.ws.recv() => match msg {
                    None => Err(End::Gone),
                    Some(Err(e)) => Err(read_failed(&e)),
                    Some(Ok(m)) => self.frame(m).await,
                },
            };
            if let Err(end) = step {
                return end;
            }
        }
    }

    /// Ping, and end the connection of a token that expired since sign-in.
    async fn tick(&mut self) -> Result<(), End> {
        self.check_token("").await?;
        tokio::time::timeout(SEND_TIMEOUT, self.ws.send(Message::Ping(Vec::new().into())))
            .await
            .map_err(|_| End::Gone)?
            .map_err(|_| End::Gone)
    }

    async fn check_token(&mut self, request_id: &str) -> Result<(), End> {
        if Operators::still_valid(&self.operator, self.now()) {
            return Ok(());
        }
        let e = error_event(
            request_id,
            refuse(
                ErrorCode::AuthenticationFailed,
                TokenRefused::Expired.to_string(),
            ),
        );
        self.send(&e).await?;
        Err(End::Close(1008, "token expired"))
    }

    async fn push(
        &mut self,
        ev: Result<HitlEvent, broadcast::error::RecvError>,
    ) -> Result<(), End> {
        let body = match ev {
            Ok(ev) => {
                let mine = self
                    .subscribed
                    .as_ref()
                    .is_some_and(|orgs| orgs.iter().any(|o| o == ev.organization()));
                if !mine {
                    return Ok(());
                }
                match ev {
                    HitlEvent::Held(p) => control_event::Body::Held(*p),
                    HitlEvent::Resolved {
                        organization_id,
                        session_id,
                        call_number,
                        outcome,
                        operator_id,
                    } => control_event::Body::Resolved(Resolved {
                        organization_id,
                        session_id,
                        call_number,
                        outcome,
                        operator_id,
                        at_ns: self.now(),
                    }),
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                control_event::Body::Resync(tollgate_proto::control::Resync {})
            }
            Err(broadcast::error::RecvError::Closed) => {
                self.events = None;
                return Ok(());
            }
        };
        self.send(&event("", body)).await
    }

    async fn bad_frame(&mut self, request_id: &str, r: Refusal) -> Result<(), End> {
        self.bad_frames += 1;
        self.send(&error_event(request_id, r)).await?;
        if self.bad_frames >= MAX_BAD_FRAMES {
            return Err(End::Close(1008, "too many unreadable frames"));
        }
        Ok(())
    }

    async fn frame(&mut self, m: Message) -> Result<(), End> {
        let text = match m {
            Message::Text(t) => t,
            Message::Binary(_) => {
                return self
                    .bad_frame(
                        "",
                        refuse(
                            ErrorCode::MalformedMessage,
                            "binary frames are not read: send JSON in text frames",
                        ),
                    )
                    .await
            }
            Message::Close(_) => return Err(End::Gone),
            Message::Ping(_) | Message::Pong(_) => return Ok(()),
        };
        if text.len() > MAX_FRAME_BYTES {
            return self
                .bad_frame(
                    "",
                    refuse(
                        ErrorCode::MessageTooLarge,
                        format!(
                            "frame of {} bytes: at most {MAX_FRAME_BYTES} are read",
                            text.len()
                        ),
                    ),
                )
                .await;
        }
        let req = match decode(text.as_str()) {
            Ok(r) => r,
            Err((request_id, r)) => return self.bad_frame(&request_id, r).await,
        };
        self.check_token(&req.request_id).await?;
        let id = req.request_id;
        let reply = match req.body {
            None => {
                return self
                    .bad_frame(
                        &id,
                        refuse(ErrorCode::InvalidRequest, "no request in the message"),
                    )
                    .await
            }
            Some(body) => self.request(body).await,
        };
        let e = match reply {
            Ok(body) => event(&id, body),
            Err(r) => error_event(&id, r),
        };
        self.send(&e).await
    }

    async fn request(
        &mut self,
        body: control_request::Body,
    ) -> Result<control_event::Body, Refusal> {
        let service = self.shared.service.clone();
        let caller = operators::caller(&self.operator);
        let org_or_default = |o: String| {
            if o.is_empty() {
                DEFAULT_ORG.to_owned()
            } else {
                o
            }
        };
        Ok(match body {
            control_request::Body::Auth(_) => {
                return Err(refuse(ErrorCode::InvalidRequest, "already signed in"))
            }
            control_request::Body::Subscribe(s) => {
                let orgs = if s.organization_ids.is_empty() {
                    self.operator.organizations.clone()
                } else {
                    s.organization_ids
                };
                if let Some(o) = orgs
                    .iter()
                    .find(|o| !self.operator.organizations.contains(o))
                {
                    return Err(refuse(
                        ErrorCode::AuthenticationFailed,
                        format!("`{o}` is not one of this operator's organizations"),
                    ));
                }
                if self.events.is_none() {
                    self.events = Some(service.hitl_events());
                }
                self.subscribed = Some(orgs.clone());
                control_event::Body::Subscribed(Subscribed {
                    organization_ids: orgs,
                })
            }
            control_request::Body::HitlList(r) => control_event::Body::HitlList(
                service
                    .hitl_list(&caller, &org_or_default(r.organization_id))
                    .await?,
            ),
            control_request::Body::HitlDecide(mut r) => {
                if r.note.trim().is_empty() {
                    return Err(refuse(
                        ErrorCode::InvalidRequest,
                        "a note is required with every decision",
                    ));
                }
                r.operator_id = self.operator.id.clone();
                control_event::Body::HitlDecide(
                    service.hitl_decide(&caller, r, service.now()).await?,
                )
            }
            control_request::Body::Sessions(r) => {
                let limit = usize::try_from(r.limit).unwrap_or(usize::MAX);
                let (sessions, total) = service
                    .operator_sessions(
                        &caller,
                        &org_or_default(r.organization_id),
                        limit,
                        service.now(),
                    )
                    .await?;
                control_event::Body::Sessions(SessionsResponse { sessions, total })
            }
            control_request::Body::Recent(r) => {
                let limit = match usize::try_from(r.limit).unwrap_or(usize::MAX) {
                    0 => 100,
                    n => n.min(100),
                };
                let decisions = lock(&self.shared.recent)
                    .iter()
                    .filter(|d| self.operator.organizations.contains(&d.organization_id))
                    .take(limit)
                    .cloned()
                    .collect();
                control_event::Body::Recent(RecentResponse { decisions })
            }
            control_request::Body::History(r) => {
                let limit = usize::try_from(r.limit).unwrap_or(usize::MAX);
                control_event::Body::History(service.history(
                    &caller,
                    &r.query,
                    r.before_ns,
                    limit,
                )?)
            }
            control_request::Body::Activity(r) => {
                let limit = usize::try_from(r.limit).unwrap_or(usize::MAX);
                control_event::Body::Activity(
                    service
                        .session_activity(&caller, &r.session_id, limit)
                        .await?,
                )
            }
        })
    }
}

/// How to end a connection whose frames cannot be read: a message over
/// [`HARD_MAX_MESSAGE_BYTES`] is closed with 1009 (too big), a broken frame with 1002.
fn read_failed(e: &axum::Error) -> End {
    let text = e.to_string();
    if text.contains("Space limit exceeded") || text.contains("too long") {
        End::Close(1009, "message too big")
    } else if text.contains("Connection reset") || text.contains("closed") {
        End::Gone
    } else {
        End::Close(1002, "protocol error")
    }
}

async fn next_event(
    events: &mut Option<broadcast::Receiver<HitlEvent>>,
) -> Result<HitlEvent, broadcast::error::RecvError> {
    match events {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// A request from a text frame; on failure, the request id it seemed to carry (so the
/// error can answer it) and the error.
fn decode(text: &str) -> Result<ControlRequest, (String, Refusal)> {
    match serde_json::from_str::<ControlRequest>(text) {
        Ok(r) if r.request_id.len() > MAX_REQUEST_ID_BYTES => Err((
            String::new(),
            refuse(
                ErrorCode::InvalidRequest,
                format!("request_id over {MAX_REQUEST_ID_BYTES} bytes"),
            ),
        )),
        Ok(r) => Ok(r),
        Err(e) => {
            let id = serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|v| {
                    let id = v.get("requestId").or_else(|| v.get("request_id"))?;
                    id.as_str().map(str::to_owned)
                })
                .filter(|id| id.len() <= MAX_REQUEST_ID_BYTES)
                .unwrap_or_default();
            let mut message = format!("not a control request: {e}");
            if message.len() > MAX_ERROR_TEXT {
                let mut cut = MAX_ERROR_TEXT;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
            }
            Err((id, refuse(ErrorCode::MalformedMessage, message)))
        }
    }
}

/// Wait for the sign-in frame of a WebSocket whose upgrade carried no token.
async fn first_frame_sign_in<S: SessionStore>(
    ws: &mut WebSocket,
    shared: &Shared<S>,
    peer: SocketAddr,
    slot: &PendingSlot,
) -> Result<(Operator, String, tokio::sync::OwnedSemaphorePermit), End> {
    let refused = |request_id: &str, r: Refusal| error_event(request_id, r);
    let evicted = slot.evicted();
    let first = tokio::select! {
        r = tokio::time::timeout(AUTH_TIMEOUT, next_text(ws)) => r,
        () = evicted.notified() => {
            let e = refused(
                "",
                refuse(
                    ErrorCode::DaemonUnavailable,
                    "too many connections waiting to sign in; this, the oldest, was closed",
                ),
            );
            send_once(ws, &e).await;
            return Err(End::Close(1013, "too many connections waiting to sign in"));
        }
    };
    let first = match first {
        Err(_) => {
            let e = refused(
                "",
                refuse(ErrorCode::AuthenticationFailed, "no sign-in frame in time"),
            );
            send_once(ws, &e).await;
            return Err(End::Close(1008, "sign in first"));
        }
        Ok(None) => return Err(End::Gone),
        Ok(Some(t)) => t,
    };
    let (request_id, token) = match (first.len() <= MAX_FRAME_BYTES).then(|| decode(&first)) {
        Some(Ok(ControlRequest {
            request_id,
            body: Some(control_request::Body::Auth(a)),
        })) => (request_id, a.token),
        Some(Ok(r)) => (r.request_id, String::new()),
        Some(Err((id, _))) => (id, String::new()),
        None => (String::new(), String::new()),
    };
    if token.is_empty() {
        let e = refused(
            &request_id,
            refuse(
                ErrorCode::AuthenticationFailed,
                "sign in first: the first frame must be {\"auth\":{\"token\":\"…\"}}",
            ),
        );
        send_once(ws, &e).await;
        return Err(End::Close(1008, "sign in first"));
    }
    match sign_in(shared, &peer, &token, shared.service.now()) {
        Ok(op) => {
            let op = op.clone();
            let Ok(permit) = shared.consoles.clone().try_acquire_owned() else {
                let e = refused(
                    &request_id,
                    refuse(ErrorCode::DaemonUnavailable, "too many consoles connected"),
                );
                send_once(ws, &e).await;
                return Err(End::Close(1013, "too many consoles connected"));
            };
            Ok((op, request_id, permit))
        }
        Err(r) => {
            let code = if r.code == ErrorCode::RateLimited {
                1013
            } else {
                1008
            };
            send_once(ws, &refused(&request_id, r)).await;
            Err(End::Close(code, "sign-in refused"))
        }
    }
}

/// The next text frame (anything else before it is skipped, up to a few); `None` when the
/// peer closes or sends something else.
async fn next_text(ws: &mut WebSocket) -> Option<String> {
    loop {
        match ws.recv().await? {
            Ok(Message::Text(t)) => return Some(t.as_str().to_owned()),
            Ok(Message::Ping(_) | Message::Pong(_)) => {}
            Ok(Message::Binary(_)) => return Some(String::new()),
            Ok(Message::Close(_)) | Err(_) => return None,
        }
    }
}

async fn send_once(ws: &mut WebSocket, e: &ControlEvent) {
    if let Ok(text) = serde_json::to_string(e) {
        let _ = tokio::time::timeout(SEND_TIMEOUT, ws.send(Message::Text(text.into()))).await;
    }
}

async fn close(ws: &mut WebSocket, end: End) {
    if let End::Close(code, reason) = end {
        let frame = Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }));
        let _ = tokio::time::timeout(SEND_TIMEOUT, ws.send(frame)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undecodable_frames_are_named_and_keep_their_request_id() {
        let (id, r) = decode(r#"{"requestId":"r7","frobnicate":{}}"#).unwrap_err();
        assert_eq!(id, "r7");
        assert_eq!(r.code, ErrorCode::MalformedMessage);
        assert!(r.message.contains("frobnicate"), "{}", r.message);
        let (id, r) = decode("{not json").unwrap_err();
        assert_eq!((id.as_str(), r.code), ("", ErrorCode::MalformedMessage));
        let (_, r) = decode(&format!(r#"{{"requestId":"{}"}}"#, "x".repeat(129))).unwrap_err();
        assert_eq!(r.code, ErrorCode::InvalidRequest);
        // Deep nesting is refused by the decoder's recursion limit, not a stack overflow.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(decode(&deep).is_err());
        let req = decode(r#"{"request_id":"a","hitl_list":{}}"#).unwrap();
        assert!(matches!(req.body, Some(control_request::Body::HitlList(_))));
    }

    proptest::proptest! {
        /// Whatever a peer sends in a text frame is a request or a named error, never a
        /// panic: random text, and valid requests cut or spliced at random places.
        #[test]
        fn any_text_decodes_or_is_refused(
            text in ".{0,512}",
            cut in 0usize..200,
            splice in ".{0,16}",
        ) {
            let _ = decode(&text);
            let valid = r#"{"requestId":"r","hitlDecide":{"sessionId":"s_1","decision":"modify","note":"n","successorParamsJson":"{\"a\":[1,2]}","successorNonce":"9"}}"#;
            let mut at = cut.min(valid.len());
            while !valid.is_char_boundary(at) {
                at -= 1;
            }
            let (head, tail) = valid.split_at(at);
            match decode(&format!("{head}{splice}{tail}")) {
                Ok(_) => {}
                Err((id, r)) => {
                    proptest::prop_assert!(id.len() <= MAX_REQUEST_ID_BYTES);
                    proptest::prop_assert!(matches!(r.code, ErrorCode::MalformedMessage | ErrorCode::InvalidRequest));
                    proptest::prop_assert!(r.message.len() <= MAX_ERROR_TEXT);
                }
            }
        }
    }

    #[test]
    fn hosts_and_origins() {
        let names = Names {
            tls: false,
            hosts: vec!["console.example".into()],
            origins: vec!["https://ops.example".into()],
        };
        for ok in [
            "127.0.0.1",
            "127.0.0.1:8700",
            "10.1.2.3:1",
            "[::1]:8700",
            "[::1]",
            "localhost",
            "LOCALHOST:80",
            "a.localhost",
            "localhost.",
            "console.example:8700",
            "Console.Example",
        ] {
            assert!(names.host_allowed(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:8700",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "console.example.evil",
            "[::1",
            "[not-ip]:1",
            "localhost:x",
            "localhost:123456",
            "1.2.3.4:80:80",
        ] {
            assert!(!names.host_allowed(bad), "{bad}");
        }
        assert!(names.origin_allowed("http://127.0.0.1:8700", "127.0.0.1:8700"));
        assert!(names.origin_allowed("HTTP://LocalHost:8700", "localhost:8700"));
        assert!(names.origin_allowed("https://ops.example", "127.0.0.1:8700"));
        for bad in [
            "https://127.0.0.1:8700",
            "http://127.0.0.1:8701",
            "null",
            "http://evil.example",
            "",
        ] {
            assert!(!names.origin_allowed(bad, "127.0.0.1:8700"), "{bad}");
        }
    }

    proptest::proptest! {
        /// Any Host or Origin text is answered, never a panic.
        #[test]
        fn any_host_or_origin_is_answered(host in ".{0,64}", origin in ".{0,64}") {
            let names = Names::default();
            let _ = names.host_allowed(&host);
            let _ = names.origin_allowed(&origin, &host);
        }
    }

    #[test]
    fn the_console_runs_under_its_own_hashes_only() {
        let csp = content_security_policy("<style>a{}</style><script>go()</script>");
        let csp = csp.to_str().unwrap();
        // printf 'go()' | openssl dgst -sha256 -binary | base64
        assert!(csp.contains("script-src 'sha256-"), "{csp}");
        assert!(csp.contains("default-src 'none'"));
        assert!(!csp.contains("unsafe-inline"));
        let real = content_security_policy(CONSOLE_HTML);
        assert_ne!(real, csp);
    }
}
