//! The gRPC link of [`crate::DaemonClient`]: SP/1.0 §6.2, the `ShackleDaemon` service over
//! HTTP/2 with mutual TLS. The client certificate names the agent's organization; there
//! is no HMAC and no envelope. Every reply goes through the same checks as a socket reply
//! (`DaemonClient`), and every failure is a `ClientError`, so a `pre_exec` fails closed
//! the same way on both transports.

use std::path::Path;
use std::time::Duration;

use tollgate_proto::sp1::shackle_daemon_client::ShackleDaemonClient;
use tollgate_proto::sp1::{self, envelope::Payload};
use tollgate_proto::MAX_FRAME_LEN;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use crate::daemon::ClientError;

/// The metadata key of a refusal's SP/1.0 error code name (the daemon's
/// `transport::grpc::ERROR_CODE_KEY`).
pub const ERROR_CODE_KEY: &str = "tollgate-error-code";

/// How to reach the daemon's gRPC binding.
#[derive(Clone)]
pub struct GrpcConfig {
    /// `host:port` of the daemon's `[grpc] listen`.
    pub address: String,
    /// The name the daemon's certificate must carry (a DNS name or an IP address).
    pub server_name: String,
    /// The CA certificate(s) that issued the daemon's certificate, PEM.
    pub ca_pem: Vec<u8>,
    /// This agent's certificate (chain), PEM, and its private key. `None`: connect
    /// without one (the daemon refuses such a client: useful only to test that).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for GrpcConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcConfig")
            .field("address", &self.address)
            .field("server_name", &self.server_name)
            .field("client_certificate", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl GrpcConfig {
    /// A configuration from PEM files: the daemon's CA, this agent's certificate and key.
    pub fn from_files(
        address: &str,
        server_name: &str,
        ca: &Path,
        cert: &Path,
        key: &Path,
    ) -> std::io::Result<GrpcConfig> {
        Ok(GrpcConfig {
            address: address.to_owned(),
            server_name: server_name.to_owned(),
            ca_pem: std::fs::read(ca)?,
            identity: Some((std::fs::read(cert)?, std::fs::read(key)?)),
        })
    }
}

/// An open HTTP/2 connection to the daemon.
#[derive(Debug, Clone)]
pub(crate) struct GrpcLink {
    client: ShackleDaemonClient<Channel>,
}

impl GrpcLink {
    /// Connect and run the TLS handshake. (With TLS 1.3 the daemon checks the client's
    /// certificate after the client has finished its handshake: a refused certificate
    /// shows on the first rpc, as [`ClientError::Tls`].)
    pub(crate) async fn connect(
        config: &GrpcConfig,
        timeout: Duration,
    ) -> Result<GrpcLink, ClientError> {
        let mut tls = ClientTlsConfig::new()
            .domain_name(config.server_name.clone())
            .ca_certificate(Certificate::from_pem(&config.ca_pem))
            .timeout(timeout);
        if let Some((cert, key)) = &config.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        let endpoint = Endpoint::from_shared(format!("https://{}", config.address))
            .map_err(|e| ClientError::Unreachable(format!("`{}`: {e}", config.address)))?
            .tls_config(tls)
            .map_err(|e| ClientError::Tls(error_chain(&e)))?
            .connect_timeout(timeout);
        let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
            Err(_) => return Err(ClientError::Timeout(timeout)),
            Ok(Err(e)) if is_tls(&e) => return Err(ClientError::Tls(error_chain(&e))),
            Ok(Err(e)) => {
                return Err(ClientError::Unreachable(format!(
                    "{}: {}",
                    config.address,
                    error_chain(&e)
                )))
            }
            Ok(Ok(c)) => c,
        };
        let client = ShackleDaemonClient::new(channel)
            .max_decoding_message_size(MAX_FRAME_LEN)
            .max_encoding_message_size(MAX_FRAME_LEN);
        Ok(GrpcLink { client })
    }

    /// Send one request as its rpc; the reply as the socket's payload would carry it
    /// (`None` for `post_exec`, answered with `Empty` once settled).
    pub(crate) async fn call(&self, payload: Payload) -> Result<Option<Payload>, ClientError> {
        let mut c = self.client.clone();
        let reply = match payload {
            Payload::Register(r) => c
                .register(r)
                .await
                .map(|r| Payload::RegisterResponse(r.into_inner())),
            Payload::PreExec(r) => c
                .pre_exec(r)
                .await
                .map(|r| Payload::PreExecResponse(r.into_inner())),
            Payload::PostExec(r) => {
                return c.post_exec(r).await.map(|_| None).map_err(from_status);
            }
            Payload::Heartbeat(r) => c
                .heartbeat(r)
                .await
                .map(|r| Payload::HeartbeatAck(r.into_inner())),
            Payload::GetSessionState(r) => c
                .get_session_state(r)
                .await
                .map(|r| Payload::SessionState(r.into_inner())),
            Payload::HeldParams(r) => c
                .send_held_params(r)
                .await
                .map(|r| Payload::HeldParamsAck(r.into_inner())),
            Payload::AwaitDecision(r) => c
                .await_decision(r)
                .await
                .map(|r| Payload::AwaitDecisionResponse(r.into_inner())),
            Payload::CloseSession(r) => c
                .close_session(r)
                .await
                .map(|r| Payload::CloseSessionResponse(r.into_inner())),
            _ => {
                return Err(ClientError::Unsupported(
                    "operators' requests are not served over gRPC (use the control plane)",
                ))
            }
        };
        reply.map(Some).map_err(from_status)
    }
}

/// What a gRPC status means to the client: the daemon's refusal when it carries the
/// SP/1.0 code, a TLS failure, a broken connection, or (any other status) a reply the
/// client cannot trust.
fn from_status(s: Status) -> ClientError {
    let named = s
        .metadata()
        .get(ERROR_CODE_KEY)
        .and_then(|v| v.to_str().ok())
        .and_then(sp1::ErrorCode::from_str_name);
    if let Some(code) = named {
        return ClientError::Refused {
            code,
            message: s.message().to_owned(),
        };
    }
    if is_tls(&s) {
        return ClientError::Tls(error_chain(&s));
    }
    match s.code() {
        Code::Unavailable | Code::Unknown | Code::Cancelled => {
            ClientError::Unreachable(error_chain(&s))
        }
        Code::DeadlineExceeded => {
            ClientError::Malformed(format!("gRPC deadline exceeded: {}", s.message()))
        }
        other => ClientError::Malformed(format!(
            "gRPC status {other:?} without `{ERROR_CODE_KEY}`: {}",
            s.message()
        )),
    }
}

/// How rustls's errors read once HTTP/2 has turned them into text (h2 keeps an I/O
/// error's kind and message, not the error itself).
const RUSTLS_MESSAGES: &[&str] = &[
    "received fatal alert",
    "invalid peer certificate",
    "peer sent no certificates",
    "peer is incompatible",
    "peer misbehaved",
];

/// Whether a TLS error is anywhere in `e`'s causes (including inside an I/O error, or
/// as the text HTTP/2 kept of one).
fn is_tls(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<rustls::Error>() {
            return true;
        }
        let text = err.to_string();
        if RUSTLS_MESSAGES.iter().any(|m| text.contains(m)) {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
            {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

/// `e` and its causes, `a: b: c`.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        let s = err.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = err.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_with_the_code_is_the_daemons_refusal() {
        let mut s = Status::not_found("unknown session `s_1`");
        s.metadata_mut()
            .insert(ERROR_CODE_KEY, "SESSION_NOT_FOUND".parse().unwrap());
        let e = from_status(s);
        assert_eq!(e.reason(), "fail_closed:session_not_found");
        // Without it, a NOT_FOUND is not a refusal the client can trust.
        let e = from_status(Status::not_found("x"));
        assert_eq!(e.reason(), "fail_closed:malformed_reply");
    }

    /// HTTP/2 keeps only the text of the TLS error under a transport error.
    #[test]
    fn a_tls_alert_kept_as_text_is_a_tls_failure() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: CertificateRequired",
        );
        let e = from_status(Status::from_error(Box::new(io)));
        assert_eq!(e.reason(), "fail_closed:tls", "{e:?}");
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        let e = from_status(Status::from_error(Box::new(io)));
        assert_eq!(e.reason(), "fail_closed:daemon_unreachable", "{e:?}");
    }
}
