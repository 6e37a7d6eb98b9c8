//! The upstream MCP servers: started (or reached) on first use, restarted on the next use
//! after they crash, hang up or break the protocol. The gateway is their MCP client.
//!
//! An upstream's notifications that mean something to the host (list changes, resource
//! updates, log messages) are passed to the [`Hosts`]; its requests to the client
//! (sampling, elicitation, roots) are refused: the gateway offers upstreams no client
//! capabilities, so an upstream cannot ask the host's user anything in Tollgate's name.

// Log messages are deprecated by SEP-2577 but still sent by 2025-11-25 servers.
#![allow(deprecated)]

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    ClientConfig, Implementation, LoggingMessageNotificationParam, ProtocolVersion,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::{NotificationContext, Peer, RunningService};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, RoleServer, ServiceExt};

use crate::config::{UpstreamConfig, UpstreamTransport};
use crate::lines::LineTransport;

/// The protocol revision the gateway asks its upstreams for (it accepts what they answer
/// down to 2024-11-05).
pub const UPSTREAM_PROTOCOL: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// Why an upstream could not be used.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Its process could not be started.
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP client could not be built.
    #[error("cannot build an HTTP client: {0}")]
    Http(String),
    /// MCP initialization failed.
    #[error("MCP initialization failed: {0}")]
    Initialize(String),
    /// Starting and initializing took longer than the connect timeout.
    #[error("did not initialize within {0:?}")]
    ConnectTimeout(Duration),
}

/// The host connections the gateway serves (one on stdio; one per session over HTTP),
/// to which upstream notifications are passed on.
#[derive(Debug, Default)]
pub struct Hosts {
    peers: std::sync::Mutex<Vec<Peer<RoleServer>>>,
    /// An upstream said its tools changed since the gateway last listed them.
    tools_changed: std::sync::atomic::AtomicBool,
}

impl Hosts {
    fn live(&self) -> Vec<Peer<RoleServer>> {
        let mut peers = self
            .peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        peers.retain(|p| !p.is_transport_closed());
        peers.clone()
    }

    /// A host connection was initialized.
    pub fn add(&self, peer: Peer<RoleServer>) {
        self.peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(peer);
    }

    /// Whether an upstream's tools changed since the last call (and clear the flag).
    pub fn take_tools_changed(&self) -> bool {
        self.tools_changed
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// Tell every host the tool list changed.
    pub async fn tools_changed(&self) {
        self.tools_changed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for p in self.live() {
            let _ = p.notify_tool_list_changed().await;
        }
    }

    async fn resources_changed(&self) {
        for p in self.live() {
            let _ = p.notify_resource_list_changed().await;
        }
    }

    async fn prompts_changed(&self) {
        for p in self.live() {
            let _ = p.notify_prompt_list_changed().await;
        }
    }

    async fn resource_updated(&self, params: ResourceUpdatedNotificationParam) {
        for p in self.live() {
            let _ = p.notify_resource_updated(params.clone()).await;
        }
    }

    #[allow(deprecated)]
    async fn log(&self, params: LoggingMessageNotificationParam) {
        for p in self.live() {
            let _ = p.notify_logging_message(params.clone()).await;
        }
    }
}

/// The gateway's client side of one upstream connection.
#[derive(Debug, Clone)]
struct Handler {
    hosts: Arc<Hosts>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            rmcp::model::ClientCapabilities::default(),
            Implementation::new("tollgate-mcp", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(UPSTREAM_PROTOCOL)
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.hosts.tools_changed().await;
    }

    async fn on_resource_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.hosts.resources_changed().await;
    }

    async fn on_prompt_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.hosts.prompts_changed().await;
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        self.hosts.resource_updated(params).await;
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        self.hosts.log(params).await;
    }
}

struct Conn {
    service: RunningService<RoleClient, Handler>,
    /// The upstream's process: killed and reaped by [`Conn::stop`], or killed (not waited
    /// for) when the connection is dropped.
    child: Option<tokio::process::Child>,
}

impl Conn {
    /// Kill the upstream's process and wait for it, so it is gone when this returns.
    async fn stop(mut self) {
        if let Some(child) = self.child.as_mut() {
            stop_child(child).await;
        }
    }
}

/// Kill `child` and reap it (a process that has already exited is only reaped).
async fn stop_child(child: &mut tokio::process::Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Err(e) = child.kill().await {
        tracing::warn!("cannot stop an upstream process: {e}");
    }
}

/// One configured upstream and its current connection, if any.
pub struct Upstream {
    /// Its configuration.
    pub config: UpstreamConfig,
    max_message_bytes: usize,
    connect_timeout: Duration,
    hosts: Arc<Hosts>,
    conn: tokio::sync::Mutex<Option<Conn>>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.config.name)
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// An upstream, not yet started.
    pub fn new(
        config: UpstreamConfig,
        max_message_bytes: usize,
        connect_timeout: Duration,
        hosts: Arc<Hosts>,
    ) -> Upstream {
        Upstream {
            config,
            max_message_bytes,
            connect_timeout,
            hosts,
            conn: tokio::sync::Mutex::new(None),
        }
    }

    /// The connection's peer, starting (or restarting) the upstream first when it is not
    /// connected.
    pub async fn peer(&self) -> Result<Peer<RoleClient>, UpstreamError> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            if !c.service.is_closed() && !c.service.peer().is_transport_closed() {
                return Ok(c.service.peer().clone());
            }
            tracing::info!(
                "upstream `{}`: connection lost; restarting",
                self.config.name
            );
        }
        // Stop the old one before starting the next.
        if let Some(old) = conn.take() {
            old.stop().await;
        }
        let fresh = self.connect().await?;
        let peer = fresh.service.peer().clone();
        *conn = Some(fresh);
        Ok(peer)
    }

    /// Forget the connection and stop its process (killed and reaped before this returns),
    /// so the next use starts a new one.
    pub async fn reset(&self) {
        if let Some(old) = self.conn.lock().await.take() {
            old.stop().await;
        }
    }

    /// A new connection, initialized within the connect timeout. A process started for it
    /// that does not initialize in time, or fails to, is stopped before this returns.
    async fn connect(&self) -> Result<Conn, UpstreamError> {
        let timeout = self.connect_timeout;
        let handler = Handler {
            hosts: self.hosts.clone(),
        };
        let init =
            |e: rmcp::service::ClientInitializeError| UpstreamError::Initialize(e.to_string());
        match &self.config.transport {
            UpstreamTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args)
                    .envs(env)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::inherit())
                    .kill_on_drop(true);
                if let Some(dir) = cwd {
                    cmd.current_dir(dir);
                }
                let mut child = cmd.spawn().map_err(|source| UpstreamError::Spawn {
                    command: command.clone(),
                    source,
                })?;
                let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
                    return Err(UpstreamError::Spawn {
                        command: command.clone(),
                        source: std::io::Error::other("no stdio pipes"),
                    });
                };
                let transport = LineTransport::upstream(
                    stdout,
                    stdin,
                    self.max_message_bytes,
                    &self.config.name,
                );
                let served = tokio::time::timeout(timeout, handler.serve(transport)).await;
                match served {
                    Ok(Ok(service)) => Ok(Conn {
                        service,
                        child: Some(child),
                    }),
                    Ok(Err(e)) => {
                        stop_child(&mut child).await;
                        Err(init(e))
                    }
                    Err(_) => {
                        stop_child(&mut child).await;
                        Err(UpstreamError::ConnectTimeout(timeout))
                    }
                }
            }
            UpstreamTransport::Http { url } => {
                crate::install_crypto_provider();
                let client = reqwest::Client::builder()
                    .build()
                    .map_err(|e| UpstreamError::Http(e.to_string()))?;
                let mut cfg = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                cfg.max_json_response_size = self.max_message_bytes;
                cfg.max_sse_event_size = self.max_message_bytes;
                let transport = StreamableHttpClientTransport::with_client(client, cfg);
                let service = tokio::time::timeout(timeout, handler.serve(transport))
                    .await
                    .map_err(|_| UpstreamError::ConnectTimeout(timeout))?
                    .map_err(|e| UpstreamError::Initialize(explain_http(url, &e)))?;
                Ok(Conn {
                    service,
                    child: None,
                })
            }
        }
    }
}

/// Why an HTTP upstream could not be initialized, in words a person reads ("connection
/// refused to 127.0.0.1:1"), not the transport's type names.
fn explain_http(url: &str, e: &rmcp::service::ClientInitializeError) -> String {
    use std::error::Error;
    let rmcp::service::ClientInitializeError::TransportError { error, .. } = e else {
        return e.to_string();
    };
    let authority = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or(url);
    // The innermost cause, and whether any layer says what kind of failure it was.
    let mut innermost: &(dyn Error + 'static) = error.error.as_ref();
    let mut io_kind = None;
    let mut reqwest_kind = None;
    let mut next: Option<&(dyn Error + 'static)> = Some(error.error.as_ref());
    while let Some(cause) = next {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            io_kind = Some(io.kind());
        }
        if let Some(r) = cause.downcast_ref::<reqwest::Error>() {
            reqwest_kind = Some((r.is_connect(), r.is_timeout(), r.status()));
        }
        innermost = cause;
        // rmcp's HTTP error does not name the client's error as its source: step in.
        next = match cause.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            Some(StreamableHttpError::Client(r)) => Some(r as &(dyn Error + 'static)),
            _ => cause.source(),
        };
    }
    match (io_kind, reqwest_kind) {
        (Some(std::io::ErrorKind::ConnectionRefused), _) => {
            format!("connection refused to {authority}")
        }
        (_, Some((_, true, _))) => format!("timed out reaching {authority}"),
        (_, Some((true, _, _))) => format!("cannot connect to {authority}: {innermost}"),
        (_, Some((_, _, Some(status)))) => format!("{authority} answered HTTP {status}"),
        _ => format!("{authority}: {innermost}"),
    }
}
