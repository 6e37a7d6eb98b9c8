//! MCP's stdio framing (one JSON-RPC message per line), bounded, for both sides of the
//! gateway: the host's stdin and stdout ([`LineTransport::host`]) and each child
//! upstream's stdout and stdin ([`LineTransport::upstream`]).
//!
//! rmcp's own stdio transport drops a line that is not JSON without a word (so a host that
//! sent one waits forever) and answers a well-formed but wrong message with an error whose
//! id is null (so the host cannot tell which request failed). This one answers the host
//! every time, with the request's id when the line has one, and treats an upstream that
//! writes anything but JSON-RPC as broken: the connection is closed, so every call waiting
//! on it gets an error result at once instead of waiting for its timeout.
//!
//! What a line is, and what is done with it, is decided by [`classify`], a pure function
//! over bytes (proptested).

use std::marker::PhantomData;
use std::sync::Arc;

use rmcp::model::NumberOrString;
use rmcp::service::{RxJsonRpcMessage, ServiceRole, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// The JSON-RPC error code of a line that is not JSON.
pub const PARSE_ERROR: i32 = -32700;
/// The JSON-RPC error code of a message that is JSON but not a valid request.
pub const INVALID_REQUEST: i32 = -32600;

/// What one line (without its `\n`) is.
#[derive(Debug)]
pub enum Line<T> {
    /// A message of the expected kind.
    Message(T),
    /// Empty or whitespace: skipped.
    Blank,
    /// Not JSON (or not UTF-8): a parse error, with no id to answer to.
    NotJson(String),
    /// JSON, but not a message of the expected kind. `id` is the line's `id` member when
    /// it is a string or a number (a request that can be answered); `None` for a
    /// notification or anything without a usable id.
    Invalid {
        /// The id to answer with, when there is one.
        id: Option<NumberOrString>,
        /// What is wrong.
        reason: String,
    },
}

/// Classify one line. Never panics; bounded by the caller's line length and serde_json's
/// nesting limit (128).
pub fn classify<T: DeserializeOwned>(line: &[u8]) -> Line<T> {
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Line::Blank;
    }
    let value: serde_json::Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return Line::NotJson(e.to_string()),
    };
    let id = match value.get("id") {
        Some(serde_json::Value::String(s)) => Some(NumberOrString::String(s.as_str().into())),
        Some(serde_json::Value::Number(n)) => n.as_i64().map(NumberOrString::Number),
        _ => None,
    };
    match serde_json::from_value::<T>(value) {
        Ok(m) => Line::Message(m),
        Err(e) => Line::Invalid {
            id,
            reason: e.to_string(),
        },
    }
}

/// What a transport does with a line that is not a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnBad {
    /// Answer with a JSON-RPC error and read on (the host side).
    Answer,
    /// Close the connection (the upstream side).
    Close,
}

/// One side's stdio, as an rmcp [`Transport`].
pub struct LineTransport<R: ServiceRole, Rd, Wr> {
    read: BufReader<Rd>,
    buf: Vec<u8>,
    max: usize,
    discarding: bool,
    write: Arc<tokio::sync::Mutex<Option<Wr>>>,
    on_bad: OnBad,
    name: String,
    _role: PhantomData<fn() -> R>,
}

impl<R: ServiceRole, Rd, Wr> std::fmt::Debug for LineTransport<R, Rd, Wr> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineTransport")
            .field("name", &self.name)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl<R: ServiceRole, Rd: AsyncRead + Unpin, Wr: AsyncWrite + Unpin> LineTransport<R, Rd, Wr> {
    fn new(read: Rd, write: Wr, max: usize, on_bad: OnBad, name: String) -> Self {
        LineTransport {
            read: BufReader::new(read),
            buf: Vec::new(),
            max,
            discarding: false,
            write: Arc::new(tokio::sync::Mutex::new(Some(write))),
            on_bad,
            name,
            _role: PhantomData,
        }
    }
}

impl<Rd: AsyncRead + Unpin, Wr: AsyncWrite + Unpin> LineTransport<rmcp::RoleServer, Rd, Wr> {
    /// The host's side: lines of at most `max` bytes; a bad line is answered.
    pub fn host(read: Rd, write: Wr, max: usize) -> Self {
        LineTransport::new(read, write, max, OnBad::Answer, "host".into())
    }
}

impl<Rd: AsyncRead + Unpin, Wr: AsyncWrite + Unpin> LineTransport<rmcp::RoleClient, Rd, Wr> {
    /// An upstream's side: lines of at most `max` bytes; a bad line closes the connection.
    pub fn upstream(read: Rd, write: Wr, max: usize, name: &str) -> Self {
        LineTransport::new(read, write, max, OnBad::Close, format!("upstream `{name}`"))
    }
}

/// One bounded line read.
enum Read {
    Line,
    TooLong,
    Eof,
}

impl<R: ServiceRole, Rd: AsyncRead + Unpin, Wr> LineTransport<R, Rd, Wr> {
    /// Read one line into `buf` without letting it grow past `max`. Cancel-safe: bytes are
    /// consumed from the reader only once copied into `buf`, which survives cancellation.
    async fn read_line(&mut self) -> std::io::Result<Read> {
        loop {
            let chunk = self.read.fill_buf().await?;
            if chunk.is_empty() {
                return Ok(Read::Eof);
            }
            let newline = chunk.iter().position(|b| *b == b'\n');
            let take = newline.map_or(chunk.len(), |i| i + 1);
            let piece = chunk.get(..take).unwrap_or_default();
            if self.discarding {
                self.read.consume(take);
                if newline.is_some() {
                    self.discarding = false;
                }
                continue;
            }
            if self.buf.len().saturating_add(take) > self.max.saturating_add(1) {
                // Over the bound: drop what was kept, skip to the end of the line.
                self.buf.clear();
                self.discarding = newline.is_none();
                self.read.consume(take);
                return Ok(Read::TooLong);
            }
            self.buf.extend_from_slice(piece);
            self.read.consume(take);
            if newline.is_some() {
                return Ok(Read::Line);
            }
        }
    }
}

/// A JSON-RPC error response line; `id` is `null` when the request's id is unknown (as
/// JSON-RPC 2.0 requires).
fn error_line(id: Option<NumberOrString>, code: i32, message: String) -> Vec<u8> {
    let id = id.map_or(serde_json::Value::Null, NumberOrString::into_json_value);
    let msg = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message},
    });
    let mut out = serde_json::to_vec(&msg).unwrap_or_default();
    out.push(b'\n');
    out
}

impl<R, Rd, Wr> Transport<R> for LineTransport<R, Rd, Wr>
where
    R: ServiceRole,
    Rd: AsyncRead + Unpin + Send + 'static,
    Wr: AsyncWrite + Unpin + Send + 'static,
    RxJsonRpcMessage<R>: DeserializeOwned,
    TxJsonRpcMessage<R>: Serialize,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<R>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = self.write.clone();
        let bytes = serde_json::to_vec(&item).map(|mut b| {
            b.push(b'\n');
            b
        });
        async move {
            let bytes = bytes.map_err(std::io::Error::other)?;
            let mut w = write.lock().await;
            let Some(w) = w.as_mut() else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "transport closed",
                ));
            };
            w.write_all(&bytes).await?;
            w.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<R>> {
        loop {
            let read = match self.read_line().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("{}: read failed: {e}", self.name);
                    return None;
                }
            };
            let answer = match read {
                Read::Eof => return None,
                Read::TooLong => {
                    let text = format!("message larger than {} bytes", self.max);
                    if self.on_bad == OnBad::Close {
                        tracing::warn!("{}: {text}; closing", self.name);
                        return None;
                    }
                    error_line(None, INVALID_REQUEST, text)
                }
                Read::Line => {
                    let line = std::mem::take(&mut self.buf);
                    let body = line.strip_suffix(b"\n").unwrap_or(&line);
                    let classified = classify::<RxJsonRpcMessage<R>>(body);
                    self.buf = line;
                    self.buf.clear();
                    match classified {
                        Line::Message(m) => return Some(m),
                        Line::Blank => continue,
                        Line::NotJson(e) => {
                            if self.on_bad == OnBad::Close {
                                tracing::warn!(
                                    "{}: wrote a line that is not JSON ({e}); closing",
                                    self.name
                                );
                                return None;
                            }
                            error_line(None, PARSE_ERROR, format!("parse error: {e}"))
                        }
                        // A notification nobody understands is ignored (JSON-RPC never
                        // answers one); so is an unknown one from an upstream.
                        Line::Invalid { id: None, reason } => {
                            tracing::debug!("{}: ignored a message: {reason}", self.name);
                            continue;
                        }
                        Line::Invalid {
                            id: Some(id),
                            reason,
                        } => {
                            if self.on_bad == OnBad::Close {
                                tracing::warn!(
                                    "{}: wrote an invalid JSON-RPC message ({reason}); closing",
                                    self.name
                                );
                                return None;
                            }
                            error_line(
                                Some(id),
                                INVALID_REQUEST,
                                format!("invalid request: {reason}"),
                            )
                        }
                    }
                }
            };
            let mut w = self.write.lock().await;
            let w = w.as_mut()?;
            if w.write_all(&answer).await.is_err() || w.flush().await.is_err() {
                return None;
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        let w = self.write.lock().await.take();
        if let Some(mut w) = w {
            let _ = w.shutdown().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rmcp::model::ClientJsonRpcMessage;

    #[test]
    fn each_kind_of_line() {
        let ok = br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;
        assert!(matches!(
            classify::<ClientJsonRpcMessage>(ok),
            Line::Message(_)
        ));
        assert!(matches!(
            classify::<ClientJsonRpcMessage>(b"  \r"),
            Line::Blank
        ));
        assert!(matches!(
            classify::<ClientJsonRpcMessage>(b"{oops"),
            Line::NotJson(_)
        ));
        // (A known method with bad params reads as a custom request: the gateway answers
        // it -32602 itself.)
        let bad = br#"{"jsonrpc":"2.0","id":"x","result_or_method":"neither"}"#;
        match classify::<ClientJsonRpcMessage>(bad) {
            Line::Invalid {
                id: Some(NumberOrString::String(s)),
                ..
            } => assert_eq!(&*s, "x"),
            other => panic!("{other:?}"),
        }
        let note = br#"{"jsonrpc":"2.0","method":"notifications/whatever","params":[1]}"#;
        assert!(matches!(
            classify::<ClientJsonRpcMessage>(note),
            Line::Invalid { id: None, .. } | Line::Message(_)
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        /// Any bytes: a verdict, never a panic.
        #[test]
        fn any_bytes_classify(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = classify::<ClientJsonRpcMessage>(&bytes);
        }

        /// Any JSON object with an integer id that is no JSON-RPC message is answered with
        /// that id.
        #[test]
        fn invalid_requests_keep_their_id(id in any::<i64>(), junk in "[a-z]{0,12}") {
            let line = format!(r#"{{"jsonrpc":"2.0","id":{id},"x{junk}":1}}"#);
            match classify::<ClientJsonRpcMessage>(line.as_bytes()) {
                Line::Invalid { id: Some(NumberOrString::Number(n)), .. } => prop_assert_eq!(n, id),
                other => prop_assert!(false, "{:?}", other),
            }
        }
    }
}
