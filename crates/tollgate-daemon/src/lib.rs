//! # tollgate-daemon: the SP/1.0 sidecar
//!
//! The daemon is the sole authority for time, state and verdicts. It listens on a Unix
//! socket (length-prefixed protobuf, every message authenticated with its organization's
//! key) and, when `[grpc]` is configured, on gRPC with mutual TLS (the client certificate
//! names the organization); decides with `tollgate-core`, keeps state in a
//! `tollgate-store` store, and writes every verdict to the `tollgate-audit` log before
//! answering.
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

pub mod activity;
pub mod config;
pub mod convert;
pub mod descriptors;
mod fleet;
pub mod hitl;
pub mod metrics;
pub mod operators;
pub mod policy;
pub mod ratelimit;
pub mod service;
pub mod transport;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
pub use tollgate_store::StoreReport;
use tollgate_store::{EmbeddedStore, SessionStore, StoreOptions};

pub use config::DaemonConfig;
pub use service::{AuditSink, Caller, Clock, Service, SystemClock};

/// Why the daemon could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The configuration asks for something this build cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// A file or directory operation failed.
    #[error("{what} `{path}`: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The system has no randomness to offer.
    #[error("no system randomness: {0}")]
    Randomness(String),
    /// A secret file holds fewer than [`MIN_SECRET_BYTES`] bytes (after trimming).
    #[error("the secret in `{path}` is {len} bytes; at least 16 are required (a cut or empty file is never used: remove it to have a new one generated, or write a longer secret)")]
    ShortSecret {
        /// The file.
        path: PathBuf,
        /// Its length after trimming.
        len: usize,
    },
    /// An organization without a configured secret whose id cannot name a file.
    #[error("organization `{0}` has no secret, and its id cannot name a secret file")]
    OrganizationId(String),
    /// The audit key file cannot be read.
    #[error("audit key `{path}`: {message}")]
    AuditKey {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A setting the audit log does not accept.
    #[error("audit.fsync: {0}")]
    AuditSetting(String),
    /// The audit log cannot be opened.
    #[error("opening the audit log in `{path}`: {source}")]
    AuditOpen {
        /// Its directory.
        path: PathBuf,
        /// Why.
        source: Box<tollgate_audit::OpenError>,
    },
    /// The audit log could not be flushed at shutdown.
    #[error("flushing the audit log: {0}")]
    AuditFlush(tollgate_audit::WriteError),
    /// PostgreSQL (the fleet's audit trail) refused to start: unreachable, not migrated,
    /// or this daemon's chain is held by another daemon.
    #[error("audit trail in postgres: {0}")]
    Postgres(#[from] tollgate_pg::PgError),
    /// The state store failed to open or close.
    #[error("state store: {0}")]
    Store(#[from] tollgate_store::StoreError),
    /// The data directory may be written by any user: anyone could replace the state
    /// file, the audit key or the secrets in it.
    #[error("the data directory `{path}` may be written by any user (mode {mode:04o}): anyone could replace the state file, the audit key or the secrets in it; `chmod o-w` it (the daemon creates it with mode 0750)")]
    UnsafeDataDir {
        /// The directory.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// Another daemon is serving the socket.
    #[error("another daemon is listening on `{0}`")]
    SocketInUse(PathBuf),
    /// The gRPC binding cannot start.
    #[error(transparent)]
    Grpc(#[from] transport::grpc::GrpcError),
    /// The control plane could not start.
    #[error(transparent)]
    Control(#[from] transport::control::ControlError),
    /// The descriptor limit leaves no room for connections.
    #[error(transparent)]
    Descriptors(#[from] descriptors::TooFew),
    /// The `[policy]` set cannot be read, does not load, or cannot be recorded (see
    /// [`policy`]).
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DaemonError {
    let path = path.to_owned();
    move |source| DaemonError::Io { what, path, source }
}

/// The one service core every transport calls, over the configured store.
enum Core {
    /// `[state] backend = "embedded"`: the store on this machine, the file audit log.
    Embedded(Arc<Service<EmbeddedStore>>),
    /// `[state] backend = "redis"` with `[audit] sink = "postgres"`: a fleet member.
    Fleet(Arc<Service<tollgate_redis::RedisStore>>),
}

/// A prepared daemon: data directory ready, socket bound, store and audit log open.
pub struct Daemon {
    config: Arc<DaemonConfig>,
    listener: UnixListener,
    core: Core,
    socket: PathBuf,
    /// The gRPC binding, when `[grpc]` is configured.
    grpc: Option<transport::grpc::GrpcListener>,
    // --- control plane ---
    control: Option<transport::control::Bound>,
    // --- end control plane ---
    /// What the operator should know at start (weaker Redis persistence than configured).
    warnings: Vec<String>,
    /// The chain this daemon writes in PostgreSQL (fleet mode).
    chain_id: Option<String>,
    /// The descriptor limit and the connection caps fitted under it.
    descriptors: descriptors::Budget,
    /// The file audit log's writer (embedded mode), whose health is watched.
    writer: Option<Arc<tollgate_audit::Writer>>,
    /// SIGHUP, with `[policy]`: each reloads the policy set. Installed at start, before
    /// the socket exists, so a SIGHUP sent once it answers never kills the daemon.
    hangup: Option<tokio::signal::unix::Signal>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

/// Read the secret `<data_dir>/secrets/<name>.secret`, creating it (32 random bytes as 64
/// hex characters, mode 0600) if absent. Organizations' agent secrets are named after the
/// organization, operator secrets `<org>.operator`.
pub fn org_secret(data_dir: &Path, name: &str) -> Result<Vec<u8>, DaemonError> {
    let dir = data_dir.join("secrets");
    std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io("setting the mode of", &dir))?;
    let path = dir.join(format!("{name}.secret"));
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let secret = text.trim().as_bytes().to_vec();
            check_secret_len(&path, &secret)?;
            Ok(secret)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut b = [0u8; 32];
            getrandom::fill(&mut b).map_err(|e| DaemonError::Randomness(e.to_string()))?;
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            write_new(&path, &format!("{hex}\n"), 0o600)?;
            Ok(hex.into_bytes())
        }
        Err(e) => Err(io("reading", &path)(e)),
    }
}

/// The shortest secret accepted, in bytes (configured or generated, inline or in a file).
pub const MIN_SECRET_BYTES: usize = 16;

/// A secret read from `path` must be at least [`MIN_SECRET_BYTES`] long: a short or empty
/// one (a file cut by a full disk, say) would make every message key guessable, so the
/// daemon refuses to start and names the file.
fn check_secret_len(path: &Path, secret: &[u8]) -> Result<(), DaemonError> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(DaemonError::ShortSecret {
            path: path.to_owned(),
            len: secret.len(),
        });
    }
    Ok(())
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
    pub async fn start(config: DaemonConfig) -> Result<Daemon, DaemonError> {
        let config = Arc::new(config);
        // A bad policy set never starts a daemon; a good one is recorded in the audit log
        // (a policy-set entry: in the file log, or in a fleet daemon's own PostgreSQL
        // chain) before the first call is decided.
        let policies = config.policy.as_ref().map(policy::enforced).transpose()?;
        let hangup = match &policies {
            Some(_) => Some(
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).map_err(
                    |e| policy::PolicyError::Read(format!("installing the SIGHUP handler: {e}")),
                )?,
            ),
            None => None,
        };
        let data = &config.data_dir;
        prepare_data_dir(data)?;

        let mut secrets = HashMap::new();
        let mut operator_secrets = HashMap::new();
        for org in &config.organizations {
            let given = |s: &Option<Vec<u8>>, file: String| match s {
                Some(s) => Ok(s.clone()),
                None if org_name_ok(&org.id) => org_secret(data, &file),
                None => Err(DaemonError::OrganizationId(org.id.clone())),
            };
            secrets.insert(org.id.clone(), given(&org.secret, org.id.clone())?);
            operator_secrets.insert(
                org.id.clone(),
                given(&org.operator_secret, format!("{}.operator", org.id))?,
            );
        }

        let key_path = config
            .audit
            .key
            .clone()
            .unwrap_or_else(|| data.join("audit.key"));
        let signing_key = load_or_create_key(&key_path)?;
        let socket = config.socket_path();
        if let (config::StateBackend::Redis(redis), config::AuditSink::Postgres(pg)) =
            (&config.state.backend, &config.audit.sink)
        {
            let (service, warnings, chain_id) = fleet::open(
                config.clone(),
                redis,
                pg,
                signing_key,
                &secrets,
                &operator_secrets,
            )
            .await?;
            // Recorded in this daemon's chain before the set decides anything; every daemon
            // of a fleet loads (and reloads) its own `[policy]` and records it in its own
            // chain. A chain registered before format version 6 cannot record one: the
            // start is refused, naming the chain.
            if let Some(set) = policies {
                service
                    .install_policies(set, tollgate_audit::PolicySetCause::Start)
                    .await?;
            }
            let mut d =
                Daemon::bind_transports(config.clone(), Core::Fleet(service), socket, warnings)
                    .await?;
            d.chain_id = Some(chain_id);
            d.hangup = hangup;
            return Ok(d);
        }
        let audit_dir = config
            .audit
            .dir
            .clone()
            .unwrap_or_else(|| data.join("audit"));
        let mut wc = tollgate_audit::WriterConfig::new(&audit_dir);
        wc.fsync = config
            .audit
            .fsync
            .parse::<tollgate_audit::FsyncPolicy>()
            .map_err(|e| DaemonError::AuditSetting(e.to_string()))?;
        wc.rotate_bytes = config.audit.rotate_bytes;
        wc.rotate_daily = config.audit.rotate_daily;
        wc.retention_days =
            (config.audit.retention_days > 0).then_some(config.audit.retention_days);
        wc.checkpoint_every = config.audit.checkpoint_every_entries;
        wc.checkpoint_interval = std::time::Duration::from_secs(config.audit.checkpoint_every_secs);
        // The audit log is the state's write-ahead log: the writer reports every durable
        // entry to the store (the tap), and the store folds the log at open.
        let verifying_key = signing_key.verifying_key();
        let (tap, tap_rx) = tollgate_store::tap();
        // The consoles' index of the log is fed by the same tap, before the store.
        let activity = Arc::new(activity::Activity::from_log());
        let mut to_store = tap.into_fn();
        let indexed = activity.clone();
        let tap: tollgate_audit::Tap = Box::new(move |batch| {
            indexed.feed(&batch);
            to_store(batch);
        });
        let (audit, report) =
            tollgate_audit::Writer::open_with_tap(wc, signing_key, tap).map_err(|source| {
                DaemonError::AuditOpen {
                    path: audit_dir.clone(),
                    source: Box::new(source),
                }
            })?;
        tracing::info!(?report, "audit log open");
        activity.load(&audit_dir, report.next_index);
        let audit = Arc::new(audit);

        let (store, store_report) = EmbeddedStore::open(
            data.join("state.redb"),
            &audit_dir,
            Some(&verifying_key),
            audit.clone(),
            tap_rx,
            StoreOptions {
                max_sessions: config.limits.max_sessions,
                snapshot_interval: config.state.snapshot_interval,
                snapshot_entries: config.state.snapshot_entries,
                ..StoreOptions::default()
            },
            SystemClock.now_ns(),
        )?;
        tracing::info!(?store_report, "state open");

        let service = Arc::new(
            Service::new(
                config.clone(),
                store,
                audit.clone(),
                Arc::new(SystemClock),
                &secrets,
                &operator_secrets,
            )
            .with_activity(activity),
        );
        if let Some(set) = policies {
            service
                .install_policies(set, tollgate_audit::PolicySetCause::Start)
                .await?;
        }
        let mut d =
            Daemon::bind_transports(config, Core::Embedded(service), socket, Vec::new()).await?;
        d.writer = Some(audit);
        d.hangup = hangup;
        Ok(d)
    }

    /// Bind every configured transport (the socket, the control plane, gRPC), so that a
    /// bad address or certificate stops the start before anything serves; first raise the
    /// descriptor limit and fit the connection caps under it.
    async fn bind_transports(
        config: Arc<DaemonConfig>,
        core: Core,
        socket: PathBuf,
        mut warnings: Vec<String>,
    ) -> Result<Daemon, DaemonError> {
        let (limit, raised_from, raise_warning) = descriptors::raise();
        let mut budget = descriptors::fit(
            limit,
            descriptors::in_use(),
            descriptors::Wanted {
                socket: config.limits.max_connections,
                grpc: config.grpc.as_ref().map(|_| config.limits.max_connections),
                control: config
                    .control
                    .as_ref()
                    // HTTP connections, and the WebSockets they became (signed in or not).
                    .map(|_| {
                        transport::control::MAX_HTTP_CONNECTIONS
                            + transport::control::MAX_CONSOLES
                            + transport::control::MAX_PENDING_CONSOLES
                    }),
                fleet: matches!(core, Core::Fleet(_)),
            },
        )?;
        budget.raised_from = raised_from;
        budget.warnings.extend(raise_warning);
        for w in &budget.warnings {
            tracing::warn!("{w}");
        }
        warnings.extend(budget.warnings.iter().cloned());
        // Per-agent guards and per_agent budgets over claimed ids (issue 15 §3).
        for w in config.identity_warnings() {
            tracing::warn!("{w}");
            warnings.push(w);
        }
        tracing::info!(budget = %budget.describe(), "descriptors");
        let control = match &config.control {
            Some(c) => Some(transport::control::bind(c).await?),
            None => None,
        };
        let listener = bind(&socket, config.socket_mode).await?;
        let grpc = match &config.grpc {
            Some(g) => Some(
                transport::grpc::bind(
                    g,
                    &config.grpc_clients,
                    &config.organizations,
                    &config.enrollment,
                )
                .await?,
            ),
            None => None,
        };
        Ok(Daemon {
            config,
            listener,
            core,
            socket,
            grpc,
            control,
            warnings,
            chain_id: None,
            descriptors: budget,
            writer: None,
            hangup: None,
        })
    }

    /// The descriptor limit and the connection caps fitted under it.
    pub fn descriptors(&self) -> &descriptors::Budget {
        &self.descriptors
    }

    /// The gRPC binding's address (its port picked when configured as 0), when it is on.
    pub fn grpc_addr(&self) -> Option<std::net::SocketAddr> {
        self.grpc
            .as_ref()
            .map(transport::grpc::GrpcListener::local_addr)
    }

    // --- control plane ---
    /// The control plane's address (its port chosen when the configuration said 0), when
    /// it is configured.
    pub fn control_addr(&self) -> Option<std::net::SocketAddr> {
        self.control
            .as_ref()
            .map(transport::control::Bound::local_addr)
    }

    /// Whether the control plane speaks TLS.
    pub fn control_tls(&self) -> bool {
        self.control
            .as_ref()
            .is_some_and(transport::control::Bound::is_tls)
    }
    // --- end control plane ---

    /// Warnings found at start, for `tollgate serve` to print (they are logged too).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The chain this daemon writes in PostgreSQL, in fleet mode.
    pub fn chain_id(&self) -> Option<&str> {
        self.chain_id.as_deref()
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The configuration in force.
    pub fn config(&self) -> &DaemonConfig {
        &self.config
    }

    /// Serve until `shutdown`; then finish in-flight calls, flush the audit log, write the
    /// store's last snapshot, and remove the socket.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), DaemonError> {
        let Daemon {
            config,
            listener,
            core,
            socket,
            grpc,
            control,
            warnings: _,
            chain_id: _,
            descriptors,
            writer,
            hangup,
        } = self;
        let caps = (descriptors.socket, descriptors.grpc.unwrap_or(0));
        let watch = writer.map(|w| tokio::spawn(watch_audit(w)));
        match core {
            Core::Embedded(service) => {
                let reload = hangup.map(|hup| reload_on_hangup(service.clone(), hup));
                let r = run_core(
                    config, listener, service, socket, grpc, control, caps, shutdown,
                )
                .await;
                if let Some(w) = watch {
                    w.abort();
                }
                if let Some(t) = reload {
                    t.abort();
                }
                r
            }
            Core::Fleet(service) => {
                let reload = hangup.map(|hup| reload_on_hangup(service.clone(), hup));
                let r = run_core(
                    config, listener, service, socket, grpc, control, caps, shutdown,
                )
                .await;
                if let Some(t) = reload {
                    t.abort();
                }
                r
            }
        }
    }
}

/// Reload the policy set on every SIGHUP (a set that does not load is refused and logged;
/// the set in force stays).
fn reload_on_hangup<S: SessionStore>(
    service: Arc<Service<S>>,
    mut hup: tokio::signal::unix::Signal,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match service.reload_policies().await {
                Ok(set) => tracing::info!(
                    digest = %set.policies.digest(),
                    policies = set.policies.len(),
                    "SIGHUP: policy set reloaded"
                ),
                Err(e) => {
                    tracing::error!("SIGHUP: policy reload refused, the set in force stays: {e}")
                }
            }
        }
    })
}

/// Log the audit writer's failures and recoveries as they happen (checked every 200 ms):
/// while it refuses entries every change is refused with `DAEMON_UNAVAILABLE`.
async fn watch_audit(writer: Arc<tollgate_audit::Writer>) {
    let mut last = writer.health();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
    loop {
        tick.tick().await;
        let now = writer.health();
        if now.failures != last.failures && now.failure.is_some() {
            tracing::error!(
                failure = now.failure.as_deref().unwrap_or_default(),
                "the audit log refuses entries: every change is refused (DAEMON_UNAVAILABLE) until it recovers"
            );
            metrics::audit_failed();
        }
        if now.permanent && !last.permanent {
            tracing::error!(
                failure = now.failure.as_deref().unwrap_or_default(),
                "the audit log will not recover by itself: fail-stop; stop the daemon, check the log with `tollgate audit verify`, and restart"
            );
        }
        if now.generation != last.generation {
            tracing::warn!(
                generation = now.generation,
                next_index = now.recovered_at,
                "the audit log recovered: the log is whole to this index, the state is reloaded from it, and changes are taken again"
            );
            metrics::audit_recovered();
        }
        last = now;
    }
}

/// Serve one service core on every configured transport until `shutdown`, then stop in
/// order: transports, expiry, the audit sink (flushed), the store. `caps` are the socket's
/// and gRPC's connection caps, fitted under the descriptor limit.
#[allow(clippy::too_many_arguments)]
async fn run_core<S: SessionStore>(
    config: Arc<DaemonConfig>,
    listener: UnixListener,
    service: Arc<Service<S>>,
    socket: PathBuf,
    grpc: Option<transport::grpc::GrpcListener>,
    control: Option<transport::control::Bound>,
    caps: (usize, usize),
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DaemonError> {
    // --- control plane: stops when the socket does ---
    let (control_stop, control_stopped) = tokio::sync::watch::channel(false);
    let control = control.map(|bound| {
        tokio::spawn(transport::control::serve(
            bound,
            service.clone(),
            operators::Operators::new(config.operators.clone()),
            control_stopped,
        ))
    });
    let shutdown = async {
        shutdown.await;
        let _ = control_stop.send(true);
    };
    // --- end control plane ---
    // Held calls nobody decides in time expire, audited, once a second; and, on the
    // embedded store, sessions silent past the idle limit end (a fleet's daemons do not
    // share liveness, so one daemon cannot tell that another serves the session).
    let sweeps_idle = matches!(config.state.backend, config::StateBackend::Embedded);
    if let Err(e) = service.recount().await {
        tracing::warn!("counting live sessions by organization: {e}");
    }
    let expiry = {
        let service = service.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tick.tick().await;
                service.expire_overdue(service.now()).await;
                if sweeps_idle {
                    service.close_idle(service.now()).await;
                }
            }
        })
    };
    // --- gRPC binding: serves beside the socket and stops with it ---
    let (grpc_stop, mut grpc_stopping) = tokio::sync::watch::channel(false);
    let grpc_task = grpc.map(|l| {
        let (service, mut limits) = (service.clone(), config.limits.clone());
        limits.max_connections = caps.1;
        tokio::spawn(async move {
            let stop = async move {
                let _ = grpc_stopping.wait_for(|s| *s).await;
            };
            transport::grpc::serve(l, service, limits, stop).await;
        })
    });
    let shutdown = async move {
        shutdown.await;
        let _ = grpc_stop.send(true);
    };
    let mut socket_limits = config.limits.clone();
    socket_limits.max_connections = caps.0;
    transport::socket::serve(listener, service.clone(), socket_limits, shutdown).await;
    if let Some(t) = grpc_task {
        let _ = t.await;
    }
    expiry.abort();
    // --- control plane ---
    let _ = control_stop.send(true);
    if let Some(task) = control {
        let _ = task.await;
    }
    // --- end control plane ---
    let _ = std::fs::remove_file(&socket);
    // The audit log first: once it is shut down every entry has been reported to the
    // store, whose last snapshot then holds them all.
    let flushed = service.audit().shutdown().map_err(DaemonError::AuditFlush);
    service.store().close().await?;
    flushed?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Create a generated secret or key file: atomically (whole or absent, never empty: a
/// temporary file, fsync, link, fsync of the directory) and with exactly `mode`.
fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), DaemonError> {
    tollgate_audit::files::create_atomically(path, text.as_bytes(), mode)
        .map_err(io("creating", path))
}

/// Read the audit signing key, or create it (mode 0600) and its public key (mode 0644,
/// beside it with the `.pub` extension) on first start.
fn load_or_create_key(path: &Path) -> Result<tollgate_audit::SigningKey, DaemonError> {
    use tollgate_audit::keys;
    if path.exists() {
        let text = std::fs::read_to_string(path).map_err(io("reading the audit key", path))?;
        return keys::parse_secret_key(&text).map_err(|e| DaemonError::AuditKey {
            path: path.to_owned(),
            message: e.to_string(),
        });
    }
    let key = keys::generate().map_err(|e| DaemonError::Randomness(e.to_string()))?;
    write_new(path, &keys::secret_key_text(&key), 0o600)?;
    let public = path.with_extension("pub");
    if !public.exists() {
        write_new(&public, &keys::public_key_text(&key.verifying_key()), 0o644)?;
    }
    tracing::info!(key = %path.display(), "created the audit signing key");
    Ok(key)
}

/// Create the data directory (mode 0750 whatever the umask) or check the one there: a
/// directory anyone may write is refused (unless sticky, like `/tmp`, where others cannot
/// replace our files).
fn prepare_data_dir(data: &Path) -> Result<(), DaemonError> {
    tollgate_audit::files::create_dir_with_mode(data, 0o750).map_err(io("creating", data))?;
    let mode = std::fs::metadata(data)
        .map_err(io("reading", data))?
        .permissions()
        .mode();
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(DaemonError::UnsafeDataDir {
            path: data.to_owned(),
            mode: mode & 0o7777,
        });
    }
    Ok(())
}

/// Bind the socket with exactly `mode`, whatever the umask: it is bound inside a fresh
/// directory only this user can enter (so nobody can connect while its mode is the
/// umask's), given its mode, then renamed into place. A directory made for it gets
/// mode 0755 (the socket's own mode says who may connect).
async fn bind(path: &Path, mode: u32) -> Result<UnixListener, DaemonError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    tollgate_audit::files::create_dir_with_mode(&dir, 0o755).map_err(io("creating", &dir))?;
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(DaemonError::SocketInUse(path.to_owned()));
        }
        std::fs::remove_file(path).map_err(io("removing the stale socket", path))?;
    }
    let staging = dir.join(format!(".tg-{}", std::process::id()));
    // A leftover of a daemon that died here with the same pid.
    let _ = std::fs::remove_dir_all(&staging);
    tollgate_audit::files::create_dir_with_mode(&staging, 0o700)
        .map_err(io("creating", &staging))?;
    let bound = staging.join("s");
    let result = (|| {
        let listener = UnixListener::bind(&bound).map_err(io("binding", path))?;
        std::fs::set_permissions(&bound, std::fs::Permissions::from_mode(mode))
            .map_err(io("setting the mode of", path))?;
        std::fs::rename(&bound, path).map_err(io("moving the socket to", path))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&staging);
    result
}

/// A store-generic entry point for tests and embedders: serve `service` on `listener`.
pub async fn serve_with<S: SessionStore>(
    listener: UnixListener,
    service: Arc<Service<S>>,
    limits: config::Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    transport::socket::serve(listener, service, limits, shutdown).await;
}
