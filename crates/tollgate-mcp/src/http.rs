//! Streamable HTTP for hosts that connect over HTTP: the same gateway at
//! `http://ADDR/mcp`, on a loopback address only (it has no authentication of its own).
//! Each HTTP session is one host connection; all of them share the gateway's one
//! Tollgate session.
//!
//! DNS rebinding and cross-site pages: a request whose `Host` is not a loopback name
//! (`localhost`, `127.0.0.1`, `::1`) is refused, and so is one whose `Origin` header is
//! present and neither a loopback origin (any port) nor in `gateway.allowed_origins`:
//! HTTP 403, as the MCP specification (2025-11-25, Streamable HTTP) requires. Hosts that
//! send no `Origin` (programs, not browsers) are served.

use std::net::SocketAddr;
use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::gateway::{Core, Gateway};

/// The origins a page served from this machine has (any port).
pub const LOOPBACK_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "https://localhost:*",
    "http://127.0.0.1:*",
    "https://127.0.0.1:*",
    "http://[::1]:*",
    "https://[::1]:*",
];

/// Bind `addr` and serve until `ct` is cancelled; returns the bound address.
pub async fn serve(
    core: Arc<Core>,
    addr: SocketAddr,
    ct: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = ct.child_token();
    config.max_request_body_bytes = core.config().max_message_bytes;
    let origins = LOOPBACK_ORIGINS
        .iter()
        .map(|o| (*o).to_owned())
        .chain(core.config().allowed_origins.iter().cloned());
    let config = config
        .with_allowed_hosts(["localhost", "127.0.0.1", "::1"])
        .with_allowed_origins(origins)
        .enforce_origin_validation();
    let factory = move || Ok(Gateway(core.clone()));
    let service =
        StreamableHttpService::new(factory, LocalSessionManager::default().into(), config);
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        let stop = ct.clone();
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
        {
            tracing::warn!("HTTP server stopped: {e}");
        }
    });
    Ok(bound)
}
