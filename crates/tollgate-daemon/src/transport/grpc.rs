//! The gRPC binding (SP/1.0 §6.2): the `ShackleDaemon` service over HTTP/2 and mutual TLS.
//!
//! It translates only. A connection is accepted, its TLS handshake run (rustls, ALPN `h2`,
//! a client certificate required), and the certificate mapped to one organization
//! ([`ClientIdentities`]); each rpc then calls the same [`Service`] handler the socket
//! binding calls, as [`Caller::Agent`] of that organization, and turns a [`Refusal`] into
//! a `tonic::Status` ([`status`]).
//!
//! The mTLS identity replaces the socket's HMAC here: each message is a plain SP/1.0
//! message (no `Envelope`); the TLS channel authenticates the peer and protects the
//! messages' integrity. Operators' requests (`hitl_list`, `hitl_decide`) are not served
//! here: operators use the control plane.
//!
//! Bounds on a peer: at most `limits.max_connections` gRPC connections at once (more are
//! closed at once), `limits.frame_timeout` to complete the TLS handshake, messages of at
//! most 1 MiB ([`tollgate_proto::MAX_FRAME_LEN`]) each way, at most
//! [`MAX_CONCURRENT_STREAMS`] rpcs in flight per connection.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use sha2::Digest as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tollgate_proto::sp1::shackle_daemon_server::{ShackleDaemon, ShackleDaemonServer};
use tollgate_proto::sp1::{self, ErrorCode};
use tollgate_proto::{MAX_FRAME_LEN, SUPPORTED_VERSIONS};
use tollgate_store::SessionStore;
use tonic::metadata::MetadataValue;
use tonic::transport::server::Connected;
use tonic::{Code, Request, Response, Status};

use crate::config::{san_matches, GrpcClientRules, GrpcSettings, Limits};
use crate::service::{refuse, Caller, Peer, Refusal, Service};

/// The metadata key carrying a refusal's SP/1.0 error code name (`SESSION_NOT_FOUND`).
pub const ERROR_CODE_KEY: &str = "tollgate-error-code";
/// The metadata key carrying a refusal's `retry_after_ms` (decimal).
pub const RETRY_AFTER_KEY: &str = "tollgate-retry-after-ms";
/// Rpcs in flight per connection at most.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;

/// Why the gRPC binding cannot start.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    /// A certificate or key file cannot be read or holds nothing usable.
    #[error("{what} `{path}`: {message}")]
    File {
        /// What the file is for.
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The TLS configuration cannot be built from the files.
    #[error("gRPC TLS: {0}")]
    Tls(String),
    /// Every certificate of one CA would map to two organizations.
    #[error(
        "organizations `{0}` and `{1}` trust the same client CA and one of them has no \
         grpc_client_san: every certificate of that CA would map to both"
    )]
    SharedCa(String, String),
    /// Client rules name an organization the daemon does not serve.
    #[error("gRPC client rules name `{0}`, which is not a configured organization")]
    UnknownOrganization(String),
    /// The address cannot be bound.
    #[error("binding the gRPC address `{addr}`: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// A bound gRPC listener with its TLS configuration, ready to [`serve`].
pub struct GrpcListener {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    identities: Arc<ClientIdentities>,
    addr: SocketAddr,
}

impl std::fmt::Debug for GrpcListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcListener")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl GrpcListener {
    /// The address bound (with the port picked when the configuration said 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, GrpcError> {
    let file = |message: String| GrpcError::File {
        what,
        path: path.to_owned(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file(e.to_string()))?;
    if certs.is_empty() {
        return Err(file("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// Load the server's certificate and key and the client rules of `organizations` (every
/// organization `clients` names must be one of them), and bind `settings.listen`.
pub async fn bind(
    settings: &GrpcSettings,
    clients: &BTreeMap<String, GrpcClientRules>,
    organizations: &[crate::config::Organization],
) -> Result<GrpcListener, GrpcError> {
    if let Some(unknown) = clients
        .keys()
        .find(|id| !organizations.iter().any(|o| &o.id == *id))
    {
        return Err(GrpcError::UnknownOrganization(unknown.clone()));
    }
    let chain = read_certs("gRPC server certificate", &settings.cert)?;
    let key = PrivateKeyDer::from_pem_file(&settings.key).map_err(|e| GrpcError::File {
        what: "gRPC server key",
        path: settings.key.clone(),
        message: e.to_string(),
    })?;
    let identities = Arc::new(ClientIdentities::new(clients)?);
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| GrpcError::Tls(e.to_string()))?
        .with_client_cert_verifier(identities.clone())
        .with_single_cert(chain, key)
        .map_err(|e| GrpcError::Tls(e.to_string()))?;
    // gRPC is HTTP/2 only; clients (Python's grpcio among them) require the server to
    // select `h2` in ALPN.
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|source| GrpcError::Bind {
            addr: settings.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| GrpcError::Bind {
        addr: settings.listen,
        source,
    })?;
    Ok(GrpcListener {
        listener,
        acceptor: TlsAcceptor::from(Arc::new(tls)),
        identities,
        addr,
    })
}

/// One organization's rules, loaded.
#[derive(Debug)]
struct OrgRules {
    id: String,
    /// Chains to this organization's CA.
    ca: Option<Arc<dyn ClientCertVerifier>>,
    fingerprints: Vec<[u8; 32]>,
    san: Vec<String>,
}

/// Which client certificates the TLS layer accepts, and whose agents they are.
///
/// The TLS layer accepts a certificate that chains to any organization's
/// `grpc_client_ca` (and is valid now), or whose SHA-256 an organization pins (and is
/// valid now); it refuses every other certificate, and a client without one. Accepted is
/// not authorized: [`ClientIdentities::organization_of`] then maps the certificate to
/// exactly one organization, or to none.
#[derive(Debug)]
pub struct ClientIdentities {
    orgs: Vec<OrgRules>,
    pins: HashMap<[u8; 32], String>,
    any_ca: Option<Arc<dyn ClientCertVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

/// Why a certificate the TLS layer accepted is no organization's agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unmapped {
    /// The peer sent no certificate (cannot happen past the handshake; kept total).
    #[error("no client certificate")]
    NoCertificate,
    /// No organization's rules match.
    #[error("the client certificate maps to no organization")]
    NoOrganization,
    /// More than one organization's rules match.
    #[error("the client certificate maps to more than one organization ({0})")]
    Ambiguous(String),
    /// The certificate names more than one agent of its organization
    /// (`spiffe://ORG/AGENT` URIs).
    #[error("the client certificate names more than one agent ({0})")]
    AmbiguousAgent(String),
    /// The certificate names an agent whose id breaks the id rule.
    #[error("the client certificate names agent `{0}`, which is not a valid agent id")]
    BadAgentId(String),
}

/// Who a client certificate is: an organization's agent, named by the certificate or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertIdentity {
    /// The organization the certificate maps to.
    pub organization: String,
    /// The agent its `spiffe://ORG/AGENT` URI names, if it names one.
    pub agent: Option<String>,
}

fn ca_verifier(
    roots: Vec<CertificateDer<'static>>,
) -> Result<Arc<dyn ClientCertVerifier>, GrpcError> {
    let mut store = RootCertStore::empty();
    for r in roots {
        store
            .add(r)
            .map_err(|e| GrpcError::Tls(format!("a client CA certificate: {e}")))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider())
        .build()
        .map_err(|e| GrpcError::Tls(e.to_string()))
}

impl ClientIdentities {
    /// Load the organizations' CA files and rules. Two organizations trusting the same CA
    /// certificate must both narrow it with SAN patterns.
    pub fn new(clients: &BTreeMap<String, GrpcClientRules>) -> Result<ClientIdentities, GrpcError> {
        let mut orgs = Vec::new();
        let mut pins = HashMap::new();
        let mut all_roots = Vec::new();
        let mut ca_owner: HashMap<Vec<u8>, (String, bool)> = HashMap::new();
        for (id, rules) in clients {
            let ca = match &rules.ca {
                Some(path) => {
                    let roots = read_certs("gRPC client CA", path)?;
                    for r in &roots {
                        let narrowed = !rules.san.is_empty();
                        if let Some((other, other_narrowed)) =
                            ca_owner.insert(r.to_vec(), (id.clone(), narrowed))
                        {
                            if other != *id && !(narrowed && other_narrowed) {
                                return Err(GrpcError::SharedCa(other, id.clone()));
                            }
                        }
                    }
                    all_roots.extend(roots.iter().cloned());
                    Some(ca_verifier(roots)?)
                }
                None => None,
            };
            for fp in &rules.fingerprints {
                pins.insert(*fp, id.clone());
            }
            orgs.push(OrgRules {
                id: id.clone(),
                ca,
                fingerprints: rules.fingerprints.clone(),
                san: rules.san.clone(),
            });
        }
        let any_ca = if all_roots.is_empty() {
            None
        } else {
            Some(ca_verifier(all_roots)?)
        };
        Ok(ClientIdentities {
            orgs,
            pins,
            any_ca,
            algorithms: provider().signature_verification_algorithms,
        })
    }

    /// The organization whose agent presented `chain` (leaf first), as of `now`: exactly
    /// one organization's rules must match.
    pub fn organization_of(
        &self,
        chain: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<String, Unmapped> {
        let (leaf, intermediates) = chain.split_first().ok_or(Unmapped::NoCertificate)?;
        let fingerprint: [u8; 32] = sha2::Sha256::digest(leaf.as_ref()).into();
        let names = subject_alt_names(leaf);
        let matching: Vec<&str> = self
            .orgs
            .iter()
            .filter(|o| {
                o.fingerprints.contains(&fingerprint)
                    || o.ca.as_ref().is_some_and(|v| {
                        v.verify_client_cert(leaf, intermediates, now).is_ok()
                            && (o.san.is_empty()
                                || o.san
                                    .iter()
                                    .any(|p| names.iter().any(|n| san_matches(p, n))))
                    })
            })
            .map(|o| o.id.as_str())
            .collect();
        match matching.as_slice() {
            [] => Err(Unmapped::NoOrganization),
            [one] => Ok((*one).to_owned()),
            many => Err(Unmapped::Ambiguous(many.join(", "))),
        }
    }
}

impl ClientIdentities {
    /// The organization and, when the certificate names one, the agent whose certificate
    /// `chain` is (leaf first), as of `now`. The agent is named by a URI subject
    /// alternative name `spiffe://ORG/AGENT`, `ORG` being the organization the certificate
    /// maps to; two different agents, or an agent id outside the id rule, refuse it.
    pub fn identity_of(
        &self,
        chain: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<CertIdentity, Unmapped> {
        let organization = self.organization_of(chain, now)?;
        let leaf = chain.first().ok_or(Unmapped::NoCertificate)?;
        let agent = agent_named(&organization, &subject_alt_names(leaf))?;
        Ok(CertIdentity {
            organization,
            agent,
        })
    }
}

/// The agent that `names` (a certificate's subject alternative names) name in `org`: the
/// rest of a `spiffe://ORG/` URI.
pub fn agent_named(org: &str, names: &[String]) -> Result<Option<String>, Unmapped> {
    let prefix = format!("spiffe://{org}/");
    let mut agent: Option<&str> = None;
    for n in names {
        let Some(rest) = n.strip_prefix(&prefix) else {
            continue;
        };
        if tollgate_core::check_id(rest).is_err() {
            return Err(Unmapped::BadAgentId(rest.escape_debug().to_string()));
        }
        match agent {
            Some(a) if a != rest => {
                return Err(Unmapped::AmbiguousAgent(format!("`{a}`, `{rest}`")));
            }
            _ => agent = Some(rest),
        }
    }
    Ok(agent.map(str::to_owned))
}

/// The DNS and URI subject alternative names of a certificate (none if it cannot be
/// parsed: it then matches no pattern).
fn subject_alt_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
            x509_parser::extensions::GeneralName::URI(u) => Some((*u).to_owned()),
            _ => None,
        })
        .collect()
}

/// Whether a pinned certificate is within its validity period at `now`.
fn valid_at(cert: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
    let secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let at = x509_parser::time::ASN1Time::from_timestamp(secs)
        .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::Expired))?;
    let v = parsed.validity();
    if at < v.not_before {
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidYet,
        ))
    } else if at > v.not_after {
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::Expired,
        ))
    } else {
        Ok(())
    }
}

impl ClientCertVerifier for ClientIdentities {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.any_ca.as_ref().map_or(&[], |v| v.root_hint_subjects())
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let fingerprint: [u8; 32] = sha2::Sha256::digest(end_entity.as_ref()).into();
        if self.pins.contains_key(&fingerprint) {
            valid_at(end_entity, now)?;
            return Ok(ClientCertVerified::assertion());
        }
        match &self.any_ca {
            Some(v) => v.verify_client_cert(end_entity, intermediates, now),
            None => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// What every rpc on a connection knows of its peer.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The peer's address.
    pub remote: SocketAddr,
    /// The organization (and agent) its certificate maps to, or why none.
    pub identity: Arc<Result<CertIdentity, Unmapped>>,
}

/// An accepted, authenticated TLS connection, holding its connection slot.
struct Conn {
    io: TlsStream<TcpStream>,
    info: ConnInfo,
    _permit: OwnedSemaphorePermit,
    _open: crate::metrics::OpenConnection,
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Accept connections, run their handshakes (each in its own task, bounded by the frame
/// timeout), map their certificates, and hand them to the HTTP/2 server.
async fn accept(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    identities: Arc<ClientIdentities>,
    limits: Limits,
    out: mpsc::Sender<Result<Conn, std::io::Error>>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let (tcp, remote) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("gRPC accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(
                %remote,
                "gRPC connection refused: {} connections open",
                limits.max_connections
            );
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let identities = identities.clone();
        let out = out.clone();
        let handshake_timeout = limits.frame_timeout;
        tokio::spawn(async move {
            let open = crate::metrics::connection_opened("grpc");
            let io = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(io)) => io,
                Ok(Err(e)) => {
                    tracing::info!(%remote, "gRPC TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::info!(%remote, "gRPC TLS handshake not complete in time");
                    return;
                }
            };
            let identity = match io.get_ref().1.peer_certificates() {
                Some(chain) => identities.identity_of(chain, UnixTime::now()),
                None => Err(Unmapped::NoCertificate),
            };
            if let Err(why) = &identity {
                // Accepted by TLS, refused by the daemon: every rpc gets UNAUTHENTICATED.
                tracing::warn!(%remote, "gRPC client refused: {why}");
            }
            let info = ConnInfo {
                remote,
                identity: Arc::new(identity),
            };
            let _ = out
                .send(Ok(Conn {
                    io,
                    info,
                    _permit: permit,
                    _open: open,
                }))
                .await;
        });
    }
}

/// Serve `listener` until `shutdown` resolves; then stop accepting, let in-flight rpcs
/// finish (for at most 10 s), and return.
pub async fn serve<S: SessionStore>(
    listener: GrpcListener,
    service: Arc<Service<S>>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let GrpcListener {
        listener,
        acceptor,
        identities,
        addr,
    } = listener;
    let (tx, rx) = mpsc::channel(64);
    let acceptor_task = tokio::spawn(accept(listener, acceptor, identities, limits.clone(), tx));
    let grpc = ShackleDaemonServer::new(Grpc { service })
        .max_decoding_message_size(MAX_FRAME_LEN)
        .max_encoding_message_size(MAX_FRAME_LEN);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .http2_keepalive_interval(Some(limits.heartbeat_interval))
        .http2_keepalive_timeout(Some(limits.frame_timeout))
        .serve_with_incoming_shutdown(
            grpc,
            tokio_stream::wrappers::ReceiverStream::new(rx),
            async {
                let _ = stop_rx.await;
            },
        );
    tracing::info!(%addr, "gRPC listening");
    tokio::pin!(server);
    tokio::pin!(shutdown);
    tokio::select! {
        r = &mut server => {
            if let Err(e) = r {
                tracing::error!("gRPC server stopped: {e}");
            }
            acceptor_task.abort();
            return;
        }
        () = &mut shutdown => {}
    }
    acceptor_task.abort();
    let _ = stop_tx.send(());
    match tokio::time::timeout(Duration::from_secs(10), &mut server).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("gRPC server stopped: {e}"),
        Err(_) => tracing::warn!("gRPC rpcs still busy after 10 s; closing them"),
    }
}

/// The gRPC status for a refusal: the code below, the refusal's message, and metadata
/// [`ERROR_CODE_KEY`] (the SP/1.0 code's name) and [`RETRY_AFTER_KEY`].
pub fn status(r: Refusal) -> Status {
    crate::metrics::refusal(r.code);
    let mut s = Status::new(grpc_code(r.code), r.message);
    let m = s.metadata_mut();
    m.insert(
        ERROR_CODE_KEY,
        MetadataValue::from_static(r.code.as_str_name()),
    );
    m.insert(RETRY_AFTER_KEY, MetadataValue::from(r.retry_after_ms));
    s
}

/// How an SP/1.0 error code maps to a gRPC status code.
pub fn grpc_code(code: ErrorCode) -> Code {
    match code {
        ErrorCode::SessionNotFound => Code::NotFound,
        ErrorCode::AuthenticationFailed => Code::Unauthenticated,
        ErrorCode::RateLimited
        | ErrorCode::OrganizationQuotaExceeded
        | ErrorCode::MessageTooLarge => Code::ResourceExhausted,
        ErrorCode::InvalidRequest | ErrorCode::MalformedMessage => Code::InvalidArgument,
        ErrorCode::DaemonUnavailable => Code::Unavailable,
        ErrorCode::SessionStale | ErrorCode::HitlRefused | ErrorCode::ProtocolVersionMismatch => {
            Code::FailedPrecondition
        }
        ErrorCode::ParentGuardDenied => Code::PermissionDenied,
        ErrorCode::Unspecified => Code::Unknown,
    }
}

/// The `ShackleDaemon` service over the one service core.
struct Grpc<S> {
    service: Arc<Service<S>>,
}

/// The caller of an rpc: an agent of the organization its connection's certificate maps
/// to, or `UNAUTHENTICATED` (nothing is decided).
fn caller<T>(req: &Request<T>) -> Result<(Caller, Peer), Status> {
    let unauthenticated = |m: String| status(refuse(ErrorCode::AuthenticationFailed, m));
    let info = req
        .extensions()
        .get::<ConnInfo>()
        .ok_or_else(|| unauthenticated(Unmapped::NoCertificate.to_string()))?;
    let peer = Peer {
        uid: 0,
        ip: Some(info.remote.ip()),
    };
    match info.identity.as_ref() {
        Ok(id) => Ok((
            Caller::Agent {
                organization: id.organization.clone(),
                agent: id.agent.clone(),
            },
            peer,
        )),
        Err(why) => Err(unauthenticated(why.to_string())),
    }
}

/// The protocol version a gRPC client is taken to offer when its `RegisterRequest` lists
/// none: the service is SP/1.0's, so 1.0.0.
fn offered_version() -> &'static str {
    SUPPORTED_VERSIONS.last().copied().unwrap_or("1.0.0")
}

#[tonic::async_trait]
impl<S: SessionStore> ShackleDaemon for Grpc<S> {
    async fn register(
        &self,
        req: Request<sp1::RegisterRequest>,
    ) -> Result<Response<sp1::RegisterResponse>, Status> {
        let (caller, peer) = caller(&req)?;
        let now = self.service.now();
        self.service
            .register(&caller, req.into_inner(), offered_version(), peer, now)
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn pre_exec(
        &self,
        req: Request<sp1::PreExecRequest>,
    ) -> Result<Response<sp1::PreExecResponse>, Status> {
        let (caller, _) = caller(&req)?;
        let now = self.service.now();
        self.service
            .pre_exec(&caller, req.into_inner(), now)
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn post_exec(
        &self,
        req: Request<sp1::PostExecNotification>,
    ) -> Result<Response<()>, Status> {
        let (caller, _) = caller(&req)?;
        let now = self.service.now();
        self.service
            .post_exec(&caller, req.into_inner(), now)
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn heartbeat(
        &self,
        req: Request<sp1::Heartbeat>,
    ) -> Result<Response<sp1::HeartbeatAck>, Status> {
        let (caller, _) = caller(&req)?;
        let now = self.service.now();
        self.service
            .heartbeat(&caller, req.into_inner(), now)
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn get_session_state(
        &self,
        req: Request<sp1::GetSessionStateRequest>,
    ) -> Result<Response<sp1::SessionState>, Status> {
        let (caller, _) = caller(&req)?;
        let now = self.service.now();
        let id = req.into_inner().session_id;
        self.service
            .session_state(&caller, &id, now)
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn send_held_params(
        &self,
        req: Request<sp1::HeldParams>,
    ) -> Result<Response<sp1::HeldParamsAck>, Status> {
        let (caller, _) = caller(&req)?;
        self.service
            .held_params(&caller, req.into_inner())
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn await_decision(
        &self,
        req: Request<sp1::AwaitDecisionRequest>,
    ) -> Result<Response<sp1::AwaitDecisionResponse>, Status> {
        let (caller, _) = caller(&req)?;
        self.service
            .await_decision(&caller, req.into_inner())
            .await
            .map(Response::new)
            .map_err(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_code_maps_and_travels_by_name() {
        let codes = [
            (ErrorCode::SessionNotFound, Code::NotFound),
            (ErrorCode::AuthenticationFailed, Code::Unauthenticated),
            (ErrorCode::RateLimited, Code::ResourceExhausted),
            (ErrorCode::InvalidRequest, Code::InvalidArgument),
            (ErrorCode::MalformedMessage, Code::InvalidArgument),
            (ErrorCode::DaemonUnavailable, Code::Unavailable),
            (ErrorCode::SessionStale, Code::FailedPrecondition),
            (ErrorCode::HitlRefused, Code::FailedPrecondition),
        ];
        for (code, want) in codes {
            let s = status(Refusal {
                code,
                message: "m".into(),
                retry_after_ms: 250,
            });
            assert_eq!(s.code(), want, "{code:?}");
            assert_eq!(s.message(), "m");
            let name = s.metadata().get(ERROR_CODE_KEY).unwrap().to_str().unwrap();
            assert_eq!(ErrorCode::from_str_name(name), Some(code));
            assert_eq!(s.metadata().get(RETRY_AFTER_KEY).unwrap(), "250");
        }
    }
}
