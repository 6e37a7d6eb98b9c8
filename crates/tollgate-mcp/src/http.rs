//! Streamable HTTP for hosts that connect over HTTP: the same gateway at
//! `http://ADDR/mcp`, on a loopback address only (it has no authentication of its own).
//! Each HTTP session is one host connection; all of them share the gateway's one
//! Tollgate session.

use std::net::SocketAddr;
use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::gateway::{Core, Gateway};

/// Bind `addr` and serve until `ct` is cancelled; returns the bound address.
pub async fn serve(
    core: Arc<Core>,
    addr: SocketAddr,
    ct: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = ct.child_token();
    config.max_request_body_bytes = core.config().max_message_bytes;
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
