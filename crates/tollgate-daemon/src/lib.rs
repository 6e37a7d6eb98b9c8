//! # tollgate-daemon: the SP/1.0 sidecar
//!
//! The daemon is the sole authority for time, state and verdicts. It listens on a Unix
//! socket (length-prefixed protobuf), authenticates every message with its organization's
//! key, decides with `tollgate-core`, keeps state in a `tollgate-store` store, and writes
//! every verdict to the `tollgate-audit` log before answering.
//!
//! What it does **not** do: decide anything itself (the core does), or know protobuf
//! encodings (the proto crate does). It is the only crate that knows sockets.
//!
//! Start with [`Daemon::start`], which prepares the data directory and binds the socket,
//! then [`Daemon::run`] until a shutdown signal.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod config;
pub mod convert;
pub mod ratelimit;
pub mod server;
pub mod service;

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use tokio::net::UnixListener;
use tollgate_store::{EmbeddedStore, SessionStore, StoreOptions};

pub use config::DaemonConfig;
pub use service::{Clock, Service, SystemClock};

/// A prepared daemon: data directory ready, socket bound, store and audit log open.
pub struct Daemon {
    config: Arc<DaemonConfig>,
    listener: UnixListener,
    service: Arc<Service<EmbeddedStore>>,
    socket: PathBuf,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

/// Read an organization secret, creating it (32 random bytes, hex, mode 0600) if absent.
pub fn org_secret(data_dir: &Path, org: &str) -> anyhow::Result<Vec<u8>> {
    let dir = data_dir.join("secrets");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let path = dir.join(format!("{org}.secret"));
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text.trim().as_bytes().to_vec()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut b = [0u8; 32];
            getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no system randomness: {e}"))?;
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            writeln!(f, "{hex}")?;
            f.sync_all()?;
            Ok(hex.into_bytes())
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn org_name_ok(org: &str) -> bool {
    !org.is_empty()
        && org
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !org.starts_with('.')
}

impl Daemon {
    /// Prepare everything: the data directory, secrets, the audit key and log, the store,
    /// and the socket (mode from the config, 0660 by default). A stale socket file left by
    /// a crashed daemon is replaced; a live one is an error.
    pub async fn start(config: DaemonConfig) -> anyhow::Result<Daemon> {
        let config = Arc::new(config);
        let data = &config.data_dir;
        std::fs::create_dir_all(data).with_context(|| format!("creating {}", data.display()))?;

        let mut secrets = HashMap::new();
        for org in &config.organizations {
            let secret = match &org.secret {
                Some(s) => s.clone(),
                None => {
                    anyhow::ensure!(
                        org_name_ok(&org.id),
                        "organization `{}` has no secret, and its id cannot name a secret file",
                        org.id
                    );
                    org_secret(data, &org.id)?
                }
            };
            secrets.insert(org.id.clone(), secret);
        }

        let key_path = config
            .audit
            .key
            .clone()
            .unwrap_or_else(|| data.join("audit.key"));
        let signing_key = load_or_create_key(&key_path)?;
        let audit_dir = config
            .audit
            .dir
            .clone()
            .unwrap_or_else(|| data.join("audit"));
        let mut wc = tollgate_audit::WriterConfig::new(&audit_dir);
        wc.fsync = config
            .audit
            .fsync
            .parse()
            .map_err(|e| anyhow::anyhow!("audit.fsync: {e}"))?;
        wc.rotate_bytes = config.audit.rotate_bytes;
        wc.rotate_daily = config.audit.rotate_daily;
        wc.retention_days =
            (config.audit.retention_days > 0).then_some(config.audit.retention_days);
        wc.checkpoint_every = config.audit.checkpoint_every_entries;
        wc.checkpoint_interval = std::time::Duration::from_secs(config.audit.checkpoint_every_secs);
        let (audit, report) = tollgate_audit::Writer::open(wc, signing_key)
            .with_context(|| format!("opening the audit log in {}", audit_dir.display()))?;
        tracing::info!(?report, "audit log open");

        let store = EmbeddedStore::open(
            data.join("state.redb"),
            StoreOptions {
                max_sessions: config.limits.max_sessions,
                durability: if config.state_fsync == "never" {
                    tollgate_store::Durability::Never
                } else {
                    tollgate_store::Durability::Batch
                },
                ..StoreOptions::default()
            },
        )
        .context("opening the state store")?;

        let socket = config.socket_path();
        let listener = bind(&socket, config.socket_mode).await?;
        let service = Arc::new(Service::new(
            config.clone(),
            store,
            audit,
            Arc::new(SystemClock),
            &secrets,
        ));
        Ok(Daemon {
            config,
            listener,
            service,
            socket,
        })
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The configuration in force.
    pub fn config(&self) -> &DaemonConfig {
        &self.config
    }

    /// Serve until `shutdown`; then finish in-flight calls, flush the audit log and the
    /// store, and remove the socket.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
        let Daemon {
            config,
            listener,
            service,
            socket,
        } = self;
        server::serve(listener, service.clone(), config.limits.clone(), shutdown).await;
        let _ = std::fs::remove_file(&socket);
        service.store().close().await.context("closing the store")?;
        service
            .audit()
            .shutdown()
            .context("flushing the audit log")?;
        tracing::info!("stopped cleanly");
        Ok(())
    }
}

fn write_new(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

/// Read the audit signing key, or create it (mode 0600) and its public key (mode 0644,
/// beside it with the `.pub` extension) on first start.
fn load_or_create_key(path: &Path) -> anyhow::Result<tollgate_audit::SigningKey> {
    use tollgate_audit::keys;
    if path.exists() {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the audit key {}", path.display()))?;
        return keys::parse_secret_key(&text)
            .with_context(|| format!("reading the audit key {}", path.display()));
    }
    let key = keys::generate().map_err(|e| anyhow::anyhow!("no system randomness: {e}"))?;
    write_new(path, &keys::secret_key_text(&key), 0o600)?;
    let public = path.with_extension("pub");
    if !public.exists() {
        write_new(&public, &keys::public_key_text(&key.verifying_key()), 0o644)?;
    }
    tracing::info!(key = %path.display(), "created the audit signing key");
    Ok(key)
}

async fn bind(path: &Path, mode: u32) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            anyhow::bail!("another daemon is listening on {}", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

/// A store-generic entry point for tests and embedders: serve `service` on `listener`.
pub async fn serve_with<S: SessionStore>(
    listener: UnixListener,
    service: Arc<Service<S>>,
    limits: config::Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    server::serve(listener, service, limits, shutdown).await;
}
