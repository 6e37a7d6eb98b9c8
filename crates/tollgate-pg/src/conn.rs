//! Connecting: settings, TLS (rustls with the `ring` provider), and schema names.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;

use crate::PgError;

/// How long a batch waits under load for as many entries as the last one held
/// ([`PgSettings::commit_linger`], `[audit] commit_linger_ms`).
pub const DEFAULT_COMMIT_LINGER: Duration = Duration::from_millis(1);

/// The default schema.
pub const DEFAULT_SCHEMA: &str = "tollgate";

/// Where the audit trail lives and how to reach it.
#[derive(Clone)]
pub struct PgSettings {
    /// A libpq-style URL or key=value string (`postgres://user@host:5432/db?sslmode=require`).
    /// `sslmode=require` (or `prefer`, the default) uses TLS when [`PgSettings::ca_file`] is set.
    pub url: String,
    /// The schema holding the tables (default [`DEFAULT_SCHEMA`]); see [`check_schema`].
    pub schema: String,
    /// PEM file of the certificate authorities trusted for the server's certificate.
    /// Without it the connection is plain TCP (and a URL with `sslmode=require` fails to
    /// connect: fail closed).
    pub ca_file: Option<PathBuf>,
    /// Most entries in one transaction (group commit).
    pub max_batch: usize,
    /// Under load (the previous commit held several entries), how long a commit may wait
    /// for as many entries as the previous one held (default 1 ms; zero: commit as soon as
    /// the previous commit is done). Fewer, fuller commits cost the server less per entry.
    pub commit_linger: Duration,
    /// Most submissions waiting for the writer; past it a submission fails at once.
    pub queue: usize,
    /// First wait before reconnecting after an error (doubles up to `reconnect_max`).
    pub reconnect_min: Duration,
    /// Longest wait between reconnection attempts.
    pub reconnect_max: Duration,
}

impl std::fmt::Debug for PgSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password.
        f.debug_struct("PgSettings")
            .field("url", &"<redacted>")
            .field("schema", &self.schema)
            .field("ca_file", &self.ca_file)
            .field("max_batch", &self.max_batch)
            .field("commit_linger", &self.commit_linger)
            .finish_non_exhaustive()
    }
}

impl PgSettings {
    /// Settings with defaults: schema `tollgate`, no TLS file, batches of up to 512
    /// lingering up to 1 ms under load, a queue of 65536, reconnect backoff 50 ms to 5 s.
    pub fn new(url: impl Into<String>) -> PgSettings {
        PgSettings {
            url: url.into(),
            schema: DEFAULT_SCHEMA.to_owned(),
            ca_file: None,
            max_batch: 512,
            commit_linger: DEFAULT_COMMIT_LINGER,
            queue: 65536,
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(5),
        }
    }

    /// The same, in schema `schema`.
    pub fn with_schema(mut self, schema: impl Into<String>) -> PgSettings {
        self.schema = schema.into();
        self
    }
}

/// The longest schema name (PostgreSQL's identifier limit).
pub const MAX_SCHEMA_LEN: usize = 63;

/// A schema name must be 1-63 bytes of lowercase ASCII letters, digits and `_`, not
/// starting with a digit: it is spliced into SQL (quoted), so nothing else is accepted.
pub fn check_schema(schema: &str) -> Result<(), PgError> {
    let ok = !schema.is_empty()
        && schema.len() <= MAX_SCHEMA_LEN
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !schema.as_bytes().first().is_some_and(u8::is_ascii_digit);
    if ok {
        Ok(())
    } else {
        Err(PgError::Schema(schema.to_owned()))
    }
}

/// Open one connection; its driver runs as a task on the current tokio runtime (outside
/// one: [`PgError::NoRuntime`]).
pub async fn connect(settings: &PgSettings) -> Result<Client, PgError> {
    let runtime = runtime()?;
    let config: tokio_postgres::Config = settings
        .url
        .parse()
        .map_err(|e: tokio_postgres::Error| PgError::Url(e.to_string()))?;
    match &settings.ca_file {
        None => {
            let (client, conn) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(PgError::db("connect"))?;
            runtime.spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "postgres connection ended");
                }
            });
            Ok(client)
        }
        Some(path) => {
            let tls = tls_connector(path)?;
            let (client, conn) = config.connect(tls).await.map_err(PgError::db("connect"))?;
            runtime.spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "postgres connection ended");
                }
            });
            Ok(client)
        }
    }
}

/// The current tokio runtime, or [`PgError::NoRuntime`].
pub(crate) fn runtime() -> Result<tokio::runtime::Handle, PgError> {
    tokio::runtime::Handle::try_current().map_err(|_| PgError::NoRuntime)
}

/// The largest CA file read.
const MAX_CA_FILE: u64 = 1 << 20;

fn tls_connector(path: &PathBuf) -> Result<tokio_postgres_rustls::MakeRustlsConnect, PgError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::CertificateDer;
    let tls = |m: String| PgError::Tls(format!("`{}`: {m}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| tls(e.to_string()))?;
    if meta.len() > MAX_CA_FILE {
        return Err(tls("larger than 1 MiB".to_owned()));
    }
    let pem = std::fs::read(path).map_err(|e| tls(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| tls(e.to_string()))?;
        roots.add(cert).map_err(|e| tls(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(tls("no certificate in the file".to_owned()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// A stable 64-bit advisory-lock key for `parts` (SHA-256, first 8 bytes).
pub(crate) fn lock_key(parts: &[&str]) -> i64 {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    let d = h.finalize();
    let mut b = [0u8; 8];
    for (slot, x) in b.iter_mut().zip(d.iter()) {
        *slot = *x;
    }
    i64::from_be_bytes(b)
}
