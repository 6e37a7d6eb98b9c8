//! The Unix-socket transport: accept, read frames with bounds and timeouts, hand each to
//! the service, write the reply. One request at a time per connection, in order.
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
    let peer = Peer {
        uid: stream.peer_cred().map(|c| c.uid()).unwrap_or(0),
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
    let Ok(bytes) = frame::frame_bytes(&crate::service::transport_error(code, message)) else {
        return;
    };
    let _ = tokio::time::timeout(limit, async {
        stream.write_all(&bytes).await?;
        stream.flush().await
    })
    .await;
}
