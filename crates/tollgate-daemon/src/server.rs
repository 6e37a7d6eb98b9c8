//! The Unix-socket transport: accept, read frames with bounds and timeouts, hand each to
//! the service, write the reply. One request at a time per connection, in order.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tollgate_proto::frame::{self, FrameError, HEADER_LEN};
use tollgate_proto::sp1::ErrorCode;
use tollgate_store::SessionStore;

use crate::service::{Peer, Reply, Service};

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
                    let mut s = stream;
                    let _ = write_error(&mut s, ErrorCode::DaemonUnavailable, "too many connections").await;
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

async fn connection<S: SessionStore>(
    mut stream: UnixStream,
    service: Arc<Service<S>>,
    limits: &crate::config::Limits,
    mut stop: watch::Receiver<bool>,
) {
    let peer = Peer {
        uid: stream.peer_cred().map(|c| c.uid()).unwrap_or(0),
    };
    loop {
        let mut header = [0u8; HEADER_LEN];
        // Wait for the next frame, the idle timeout, or shutdown, whichever first.
        tokio::select! {
            r = tokio::time::timeout(limits.idle_timeout, stream.read_exact(&mut header)) => {
                match r {
                    Ok(Ok(_)) => {}
                    Ok(Err(_)) => return, // closed by the peer
                    Err(_) => {
                        let _ = write_error(&mut stream, ErrorCode::InvalidRequest, "idle timeout").await;
                        return;
                    }
                }
            }
            _ = stop.changed() => return,
        }
        let len = match frame::body_len(header) {
            Ok(n) => n,
            Err(e @ FrameError::TooLarge { .. }) => {
                let _ = write_error(&mut stream, ErrorCode::MessageTooLarge, &e.to_string()).await;
                return;
            }
            Err(e) => {
                let _ = write_error(&mut stream, ErrorCode::MalformedMessage, &e.to_string()).await;
                return;
            }
        };
        let mut body = vec![0u8; len];
        match tokio::time::timeout(limits.frame_timeout, stream.read_exact(&mut body)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                let _ = write_error(
                    &mut stream,
                    ErrorCode::MalformedMessage,
                    "frame timed out half-sent",
                )
                .await;
                return;
            }
        }
        match service.handle(&body, peer).await {
            Reply::Frame(out) => {
                let Ok(bytes) = frame::frame_bytes(&out) else {
                    return;
                };
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Reply::Nothing => {}
        }
        if *stop.borrow() {
            return;
        }
    }
}

async fn write_error(
    stream: &mut UnixStream,
    code: ErrorCode,
    message: &str,
) -> std::io::Result<()> {
    if let Ok(bytes) = frame::frame_bytes(&crate::service::transport_error(code, message)) {
        stream.write_all(&bytes).await?;
    }
    stream.flush().await
}
