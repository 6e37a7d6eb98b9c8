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
//! Bounds on a peer (docs/protocol.md §8.2), with `limits.max_connections` shared out by
//! [`Limits::connection_split`]: a connection whose TLS handshake has not completed is
//! one of at most `limits.max_unauthenticated_connections` (one more pushes the oldest
//! out) and has `limits.auth_timeout` to complete it; a certificate that is invalid or
//! maps to no organization fails the handshake itself, so no message of its peer is ever
//! read; only then does the connection take one of the other slots (none left: it is
//! closed). The certificate must be an end entity (not a CA), and a CA's path-length
//! constraint holds for the path to it, trust anchors' included. A connection is served
//! until the earliest `notAfter` of the chain it presented, then closed. Messages are at
//! most 1 MiB ([`tollgate_proto::MAX_FRAME_LEN`]) each way; at most
//! [`MAX_CONCURRENT_STREAMS`] rpcs in flight per connection.

use std::collections::{BTreeMap, HashMap};
use std::future::Future as _;
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

use super::pending::Pending;
use crate::config::{san_matches, GrpcClientRules, GrpcSettings, Limits};
use crate::service::{refuse, Caller, Peer, Refusal, Service};

/// The metadata key carrying a refusal's SP/1.0 error code name (`SESSION_NOT_FOUND`).
pub const ERROR_CODE_KEY: &str = "tollgate-error-code";
/// The metadata key carrying a refusal's `retry_after_ms` (decimal).
pub const RETRY_AFTER_KEY: &str = "tollgate-retry-after-ms";
/// Rpcs in flight per connection at most.
pub const MAX_CONCURRENT_STREAMS: u32 = 16;
/// Bytes of request messages being received at once on one connection, at most.
pub const MAX_IN_FLIGHT_BYTES_PER_CONNECTION: usize = 4 << 20;
/// Bytes of request messages being received at once on all connections, at most.
pub const MAX_IN_FLIGHT_BYTES: usize = 64 << 20;
/// Intermediate certificates a client may present (a longer chain is refused).
pub const MAX_INTERMEDIATES: usize = 4;

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
    enrollment: &BTreeMap<String, crate::config::Enrollment>,
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
    let identities = Arc::new(ClientIdentities::new(clients)?.with_enrollment(enrollment));
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

/// One trusted CA certificate: a verifier with it as the only root, and its path-length
/// constraint (webpki keeps only a trust anchor's name and key, so the constraint is
/// enforced here: a path to it may hold at most that many intermediates).
#[derive(Debug)]
struct Anchor {
    verifier: Arc<dyn ClientCertVerifier>,
    path_len: Option<u32>,
}

/// Whether `leaf` (with `intermediates`) chains to one of `anchors` at `now`, within its
/// path-length constraint, and is an end entity. The intermediates are tried as a client
/// sends them, in order from the leaf: a constraint of N allows the first N at most.
fn chains_to(
    anchors: &[Anchor],
    leaf: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    now: UnixTime,
) -> Result<(), rustls::Error> {
    let refused = || {
        rustls::Error::InvalidCertificate(rustls::CertificateError::ApplicationVerificationFailure)
    };
    if is_ca(leaf) || intermediates.len() > MAX_INTERMEDIATES {
        return Err(refused());
    }
    let mut last = Err(rustls::Error::InvalidCertificate(
        rustls::CertificateError::UnknownIssuer,
    ));
    for a in anchors {
        let most = a
            .path_len
            .map_or(intermediates.len(), |n| intermediates.len().min(n as usize));
        // Unconstrained: the whole chain; constrained: every allowed prefix.
        let first = if a.path_len.is_none() { most } else { 0 };
        for n in first..=most {
            match a
                .verifier
                .verify_client_cert(leaf, intermediates.get(..n).unwrap_or(&[]), now)
            {
                Ok(_) => return Ok(()),
                Err(e) => last = Err(e),
            }
        }
    }
    // A chain webpki accepts with more intermediates than the constraint allows is a
    // violation, not an unknown issuer.
    if let (Err(_), true) = (&last, anchors.iter().any(|a| a.path_len.is_some())) {
        if anchors.iter().any(|a| {
            a.verifier
                .verify_client_cert(leaf, intermediates, now)
                .is_ok()
        }) {
            return Err(refused());
        }
    }
    last
}

/// Whether a certificate says it is a CA (basicConstraints cA TRUE). One that cannot be
/// parsed is treated as one (refused).
fn is_ca(cert: &CertificateDer<'_>) -> bool {
    match x509_parser::parse_x509_certificate(cert.as_ref()) {
        Ok((_, c)) => c
            .basic_constraints()
            .ok()
            .flatten()
            .is_some_and(|b| b.value.ca),
        Err(_) => true,
    }
}

/// The latest instant (Unix seconds) at which every certificate of `chain` is valid.
fn chain_not_after(chain: &[CertificateDer<'_>]) -> Option<i64> {
    chain
        .iter()
        .filter_map(|c| x509_parser::parse_x509_certificate(c.as_ref()).ok())
        .map(|(_, c)| c.validity().not_after.timestamp())
        .min()
}

/// One organization's rules, loaded.
#[derive(Debug)]
struct OrgRules {
    id: String,
    /// Chains to one of these CA certificates.
    ca: Option<Vec<Anchor>>,
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
    /// The organizations that require enrollment, each with its enrolled agents: a
    /// certificate of one of them must name an enrolled agent, or the handshake fails.
    enrolled_only: HashMap<String, std::collections::BTreeSet<String>>,
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
    /// Its organization requires enrollment, and the certificate names no agent, or one
    /// that is not enrolled.
    #[error("organization `{0}` requires enrolled agents, and the client certificate names {1}")]
    NotEnrolled(String, String),
}

/// Who a client certificate is: an organization's agent, named by the certificate or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertIdentity {
    /// The organization the certificate maps to.
    pub organization: String,
    /// The agent its `spiffe://ORG/AGENT` URI names, if it names one.
    pub agent: Option<String>,
}

/// One [`Anchor`] per CA certificate.
fn anchors(roots: &[CertificateDer<'static>]) -> Result<Vec<Anchor>, GrpcError> {
    roots
        .iter()
        .map(|r| {
            let (_, parsed) = x509_parser::parse_x509_certificate(r.as_ref())
                .map_err(|e| GrpcError::Tls(format!("a client CA certificate: {e}")))?;
            let path_len = parsed
                .basic_constraints()
                .ok()
                .flatten()
                .and_then(|b| b.value.path_len_constraint);
            Ok(Anchor {
                verifier: ca_verifier(vec![r.clone()])?,
                path_len,
            })
        })
        .collect()
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
                    Some(anchors(&roots)?)
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
            enrolled_only: HashMap::new(),
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
        self.organization_of_parts(leaf, intermediates, now)
    }

    fn organization_of_parts(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<String, Unmapped> {
        let fingerprint: [u8; 32] = sha2::Sha256::digest(leaf.as_ref()).into();
        let names = subject_alt_names(leaf);
        let matching: Vec<&str> = self
            .orgs
            .iter()
            .filter(|o| {
                o.fingerprints.contains(&fingerprint)
                    || o.ca.as_ref().is_some_and(|anchors| {
                        chains_to(anchors, leaf, intermediates, now).is_ok()
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
    /// Refuse, in the handshake, every certificate of an organization that requires
    /// enrollment unless it names one of its enrolled agents (`spiffe://ORG/AGENT`).
    pub fn with_enrollment(
        mut self,
        enrollment: &BTreeMap<String, crate::config::Enrollment>,
    ) -> ClientIdentities {
        self.enrolled_only = enrollment
            .iter()
            .filter(|(_, e)| e.required)
            .map(|(org, e)| (org.clone(), e.agents.keys().cloned().collect()))
            .collect();
        self
    }

    /// The organization and, when the certificate names one, the agent whose certificate
    /// `chain` is (leaf first), as of `now`. The agent is named by a URI subject
    /// alternative name `spiffe://ORG/AGENT`, `ORG` being the organization the certificate
    /// maps to; two different agents, or an agent id outside the id rule, refuse it, and so
    /// does a certificate of an organization that requires enrollment naming no enrolled
    /// agent.
    pub fn identity_of(
        &self,
        chain: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<CertIdentity, Unmapped> {
        let (leaf, intermediates) = chain.split_first().ok_or(Unmapped::NoCertificate)?;
        self.identity_of_parts(leaf, intermediates, now)
    }

    fn identity_of_parts(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<CertIdentity, Unmapped> {
        let organization = self.organization_of_parts(leaf, intermediates, now)?;
        let agent = agent_named(&organization, &subject_alt_names(leaf))?;
        if let Some(enrolled) = self.enrolled_only.get(&organization) {
            match &agent {
                Some(a) if enrolled.contains(a) => {}
                Some(a) => {
                    return Err(Unmapped::NotEnrolled(
                        organization,
                        format!("agent `{a}`, which is not enrolled"),
                    ))
                }
                None => return Err(Unmapped::NotEnrolled(organization, "no agent".into())),
            }
        }
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
        } else {
            match &self.any_ca {
                Some(v) => {
                    v.verify_client_cert(end_entity, intermediates, now)?;
                }
                None => {
                    return Err(rustls::Error::InvalidCertificate(
                        rustls::CertificateError::UnknownIssuer,
                    ))
                }
            }
        }
        // Valid is not enough: the certificate must be exactly one organization's agent
        // (path-length and CA constraints included), name at most one agent with a valid
        // id, and, where its organization requires enrollment, name an enrolled one; or
        // the handshake fails and nothing its peer sends is read.
        match self.identity_of_parts(end_entity, intermediates, now) {
            Ok(_) => Ok(ClientCertVerified::assertion()),
            Err(why) => {
                tracing::warn!("gRPC client certificate refused: {why}");
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::ApplicationVerificationFailure,
                ))
            }
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
    /// The earliest `notAfter` of the chain it presented (Unix seconds): past it, the
    /// connection is no longer served.
    pub not_after: Option<i64>,
    /// The SHA-256 of its client certificate (the peer, for registration limits).
    pub fingerprint: Option<[u8; 32]>,
    /// Its share of request bytes being received ([`MAX_IN_FLIGHT_BYTES_PER_CONNECTION`]).
    budget: Arc<Semaphore>,
}

impl ConnInfo {
    /// Whether its certificate has expired at `now_secs`.
    fn expired(&self, now_secs: i64) -> bool {
        self.not_after.is_some_and(|t| now_secs > t)
    }
}

fn unix_now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// An accepted, authenticated TLS connection, holding its connection slot.
struct Conn {
    io: TlsStream<TcpStream>,
    info: ConnInfo,
    /// Fires when the client certificate expires: reads then fail, and the HTTP/2 server
    /// closes the connection.
    expiry: Pin<Box<tokio::time::Sleep>>,
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
        let this = self.get_mut();
        if this.expiry.as_mut().poll(cx).is_ready() {
            tracing::info!(remote = %this.info.remote, "gRPC client certificate expired: closing its connection");
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "client certificate expired",
            )));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
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
    let (authenticated, unauthenticated) = limits.connection_split();
    let permits = Arc::new(Semaphore::new(authenticated));
    let handshaking = Pending::new(unauthenticated);
    loop {
        let (tcp, remote) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("gRPC accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        // Until its handshake completes with a mapped certificate, a connection holds a
        // place among the handshaking ones only (the newest pushes the oldest out).
        let slot = handshaking.admit("gRPC");
        let permits = permits.clone();
        let acceptor = acceptor.clone();
        let identities = identities.clone();
        let out = out.clone();
        let handshake_timeout = limits.auth_timeout;
        tokio::spawn(async move {
            let open = crate::metrics::connection_opened("grpc");
            let evicted = slot.evicted();
            let handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(tcp));
            let io = tokio::select! {
                r = handshake => match r {
                    Ok(Ok(io)) => io,
                    Ok(Err(e)) => {
                        tracing::info!(%remote, "gRPC TLS handshake failed: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::info!(%remote, "gRPC TLS handshake not complete in time");
                        return;
                    }
                },
                () = evicted.notified() => {
                    tracing::info!(%remote, "gRPC handshake pushed out by newer connections");
                    return;
                }
            };
            let chain = io.get_ref().1.peer_certificates();
            let identity = match chain {
                Some(chain) => identities.identity_of(chain, UnixTime::now()),
                None => Err(Unmapped::NoCertificate),
            };
            if let Err(why) = &identity {
                // The verifier refuses these in the handshake; never serve one anyway.
                tracing::warn!(%remote, "gRPC client refused: {why}");
                return;
            }
            let not_after = chain.and_then(chain_not_after);
            let fingerprint = chain
                .and_then(|c| c.first())
                .map(|leaf| sha2::Sha256::digest(leaf.as_ref()).into());
            let Ok(permit) = permits.try_acquire_owned() else {
                tracing::warn!(%remote, "gRPC connection refused: {authenticated} connections open");
                return;
            };
            drop(slot);
            let left = not_after.map_or(Duration::from_secs(100 * 365 * 86_400), |t| {
                Duration::from_secs(u64::try_from(t.saturating_sub(unix_now_secs())).unwrap_or(0))
                    // notAfter is inclusive: served through its last second.
                    + Duration::from_secs(1)
            });
            let info = ConnInfo {
                remote,
                identity: Arc::new(identity),
                not_after,
                fingerprint,
                budget: Arc::new(Semaphore::new(MAX_IN_FLIGHT_BYTES_PER_CONNECTION)),
            };
            let _ = out
                .send(Ok(Conn {
                    io,
                    info,
                    expiry: Box::pin(tokio::time::sleep(left)),
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
    let grpc = Metered {
        inner: ShackleDaemonServer::new(Grpc { service })
            .max_decoding_message_size(MAX_FRAME_LEN)
            .max_encoding_message_size(MAX_FRAME_LEN),
        budget: Arc::new(Semaphore::new(MAX_IN_FLIGHT_BYTES)),
        frame_timeout: limits.frame_timeout,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // Every rpc ends: the longest (an AwaitDecision long-poll) waits `await_decision_max`,
    // and its request must have arrived within the frame timeout before that.
    let rpc_deadline = limits.await_decision_max + limits.frame_timeout * 2;
    let server = tonic::transport::Server::builder()
        .timeout(rpc_deadline)
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

/// The service with each request's body metered: the bytes of a request being received
/// count against its connection's share and the daemon's whole budget until the message
/// is decoded (when tonic drops the body); a request whose body is not complete within
/// the frame timeout, or that finds a budget spent, fails (the peer is told
/// `RESOURCE_EXHAUSTED` or the stream is reset), and nothing is decided.
#[derive(Clone)]
struct Metered<S> {
    inner: S,
    budget: Arc<Semaphore>,
    frame_timeout: Duration,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Metered<S> {
    const NAME: &'static str = S::NAME;
}

type Req = tonic::codegen::http::Request<tonic::body::Body>;

impl<S> tower_service::Service<Req> for Metered<S>
where
    S: tower_service::Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let connection = req.extensions().get::<ConnInfo>().map(|i| i.budget.clone());
        let global = self.budget.clone();
        let deadline = Box::pin(tokio::time::sleep(self.frame_timeout));
        let req = req.map(|body| {
            tonic::body::Body::new(MeteredBody {
                inner: body,
                budgets: [Some(global), connection],
                held: Vec::new(),
                deadline,
                done: false,
            })
        });
        self.inner.call(req)
    }
}

/// A request body whose received bytes hold permits of its budgets until it is dropped.
struct MeteredBody {
    inner: tonic::body::Body,
    budgets: [Option<Arc<Semaphore>>; 2],
    held: Vec<OwnedSemaphorePermit>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    done: bool,
}

impl http_body::Body for MeteredBody {
    type Data = tonic::codegen::Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if !this.done && this.deadline.as_mut().poll(cx).is_ready() {
            this.done = true;
            crate::metrics::refusal(ErrorCode::MalformedMessage);
            return Poll::Ready(Some(Err(
                "request message not complete within the frame timeout".into(),
            )));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
                    for budget in this.budgets.iter().flatten() {
                        match budget.clone().try_acquire_many_owned(n) {
                            Ok(p) => this.held.push(p),
                            Err(_) => {
                                this.done = true;
                                crate::metrics::refusal(ErrorCode::DaemonUnavailable);
                                return Poll::Ready(Some(Err(
                                    "too many request bytes in flight: try again".into(),
                                )));
                            }
                        }
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
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
    // Registrations are limited per organization and certificate, not per address:
    // agents behind one address (a NAT, a proxy) are different peers.
    let peer = Peer {
        uid: 0,
        certificate: info.fingerprint,
    };
    if info.expired(unix_now_secs()) {
        return Err(unauthenticated("the client certificate has expired".into()));
    }
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

    async fn close_session(
        &self,
        req: Request<sp1::CloseSessionRequest>,
    ) -> Result<Response<sp1::CloseSessionResponse>, Status> {
        let (caller, _) = caller(&req)?;
        let now = self.service.now();
        self.service
            .close_session(&caller, req.into_inner(), now)
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
