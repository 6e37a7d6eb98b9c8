//! The daemon's configuration: a TOML file, every key optional. With no file at all the
//! daemon runs on embedded defaults (see [`DaemonConfig::default`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tollgate_core::{BudgetScope, GuardConfig, HitlMode, Money, Ratio, Settlement};

/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The organization a zero-configuration daemon serves.
pub const DEFAULT_ORG: &str = "default";

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read `{path}`: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_CONFIG_BYTES`].
    #[error("`{0}` is larger than 1 MiB")]
    TooLarge(PathBuf),
    /// Not valid TOML for this schema (unknown keys are errors).
    #[error("invalid configuration: {0}")]
    Toml(#[from] toml::de::Error),
    /// A value out of range.
    #[error("invalid configuration: `{key}`: {message}")]
    Value {
        /// The key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

fn bad(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Value {
        key: key.into(),
        message: message.into(),
    }
}

/// The file's shape. Unknown keys are rejected so a typo cannot silently weaken a policy.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    daemon: DaemonSection,
    #[serde(default)]
    limits: LimitsSection,
    #[serde(default)]
    audit: AuditSection,
    #[serde(default)]
    state: StateSection,
    #[serde(default, rename = "organization")]
    organizations: Vec<OrgSection>,
    #[serde(default)]
    guard: GuardSection,
    // --- policies (crate::policy) ---
    policy: Option<PolicySection>,
    // --- gRPC binding (transport/grpc) ---
    #[serde(default)]
    grpc: GrpcSection,
    // --- control plane (console, /v1/control, /metrics) ---
    control: Option<ControlSection>,
    #[serde(default, rename = "operator")]
    operators: Vec<OperatorSection>,
    // --- end control plane ---
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DaemonSection {
    data_dir: Option<PathBuf>,
    socket: Option<PathBuf>,
    socket_mode: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsSection {
    pre_exec_per_second_per_session: Option<u32>,
    registrations_per_second_per_peer: Option<u32>,
    max_sessions: Option<usize>,
    max_connections: Option<usize>,
    max_unauthenticated_connections: Option<usize>,
    auth_timeout_ms: Option<u64>,
    max_bad_frames: Option<u32>,
    idle_timeout_secs: Option<u64>,
    frame_timeout_ms: Option<u64>,
    heartbeat_interval_secs: Option<u64>,
    missed_heartbeats_for_stale: Option<u32>,
    hitl_timeout_secs: Option<u64>,
    await_decision_max_secs: Option<u64>,
    session_idle_timeout_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditSection {
    dir: Option<PathBuf>,
    key: Option<PathBuf>,
    fsync: Option<String>,
    rotate_bytes: Option<u64>,
    rotate_daily: Option<bool>,
    retention_days: Option<u32>,
    checkpoint_every_entries: Option<u64>,
    checkpoint_every_secs: Option<u64>,
    sink: Option<String>,
    url: Option<String>,
    schema: Option<String>,
    chain_id: Option<String>,
    migrate_at_start: Option<bool>,
    commit_linger_ms: Option<u64>,
    ca_file: Option<PathBuf>,
    params: Option<String>,
    redact: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateSection {
    snapshot_interval_secs: Option<u64>,
    snapshot_entries: Option<u64>,
    backend: Option<String>,
    url: Option<String>,
    key_prefix: Option<String>,
    durability: Option<String>,
    command_timeout_ms: Option<u64>,
    session_ttl_secs: Option<u64>,
    sweep_interval_secs: Option<u64>,
    grace_secs: Option<u64>,
    ca_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OrgSection {
    id: String,
    secret: Option<String>,
    secret_file: Option<PathBuf>,
    operator_secret: Option<String>,
    operator_secret_file: Option<PathBuf>,
    // --- gRPC binding: which client certificates are this organization's agents ---
    grpc_client_ca: Option<PathBuf>,
    #[serde(default)]
    grpc_client_fingerprints: Vec<String>,
    #[serde(default)]
    grpc_client_san: Vec<String>,
    // --- agent enrollment (issue 15 §3) ---
    #[serde(default)]
    require_enrollment: bool,
    #[serde(default)]
    agent: Vec<AgentSection>,
    // --- quotas (issue 17 §4) ---
    max_sessions: Option<usize>,
}

/// `[[organization.agent]]`: an enrolled agent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentSection {
    id: String,
    secret: Option<String>,
    secret_file: Option<PathBuf>,
}

// --- control plane: file sections ---
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlSection {
    listen: Option<String>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    #[serde(default)]
    allowed_hosts: Vec<String>,
    #[serde(default)]
    allowed_origins: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperatorSection {
    id: String,
    token_sha256: String,
    organizations: Vec<String>,
    expires_at: Option<TimeValue>,
}

/// A point in time: Unix seconds, RFC 3339 text, or a TOML offset date-time.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TimeValue {
    Seconds(i64),
    Text(String),
    Toml(toml::value::Datetime),
}
// --- end control plane: file sections ---

/// `[policy]`: the Cedar policy set (docs/policy.md).
/// The `[policy]` section (`tollgate_policy::files`: the same section `mcp.toml` and the
/// Python `Guard` take): where the Cedar policy set comes from (the daemon loads it at
/// start, with `tollgate-policy`'s loader: `crate::policy`).
pub type PolicySettings = tollgate_policy::files::Settings;
type PolicySection = tollgate_policy::files::Section;

fn policy_settings(s: PolicySection, base: &Path) -> Result<PolicySettings, ConfigError> {
    PolicySettings::from_section(s, base).map_err(|e| bad(e.key, e.message))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GuardSection {
    #[serde(default)]
    default: GuardTable,
    #[serde(default)]
    agents: BTreeMap<String, GuardTable>,
}

/// One guard configuration in TOML (`[guard.default]`, `[guard.agents.NAME]`, and `tollgate
/// mcp`'s `[guard]`); every key optional, falling back to a base guard ([`guard`]).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardTable {
    budget_usd: Option<f64>,
    budget_scope: Option<String>,
    max_repeat_calls: Option<u32>,
    error_amplification: Option<bool>,
    timeout_seconds: Option<u32>,
    window_duration_s: Option<u32>,
    window_max_calls: Option<u32>,
    max_total_calls: Option<u64>,
    probabilistic_deny: Option<bool>,
    deny_jitter_ratio: Option<f64>,
    hitl_mode: Option<String>,
    hitl_budget_threshold: Option<f64>,
    settlement: Option<String>,
    nonce_window: Option<u32>,
    max_reservations: Option<u32>,
    max_held_calls: Option<u32>,
}

/// An organization the daemon serves.
#[derive(Debug, Clone)]
pub struct Organization {
    /// Its id, as agents send it in `RegisterRequest.organization_id`.
    pub id: String,
    /// Its secret, from which message keys are derived. `None`: generate one on first
    /// start and keep it in the data directory (`<data_dir>/secrets/<id>.secret`).
    pub secret: Option<Vec<u8>>,
    /// The operators' secret: human decisions (`hitl_list`, `hitl_decide`) must be sealed
    /// with a key derived from it, so an agent holding the organization secret cannot
    /// approve its own held calls. `None`: generated on first start and kept in
    /// `<data_dir>/secrets/<id>.operator.secret`.
    pub operator_secret: Option<Vec<u8>>,
}

/// An organization's enrolled agents (`[[organization.agent]]`, `require_enrollment`).
///
/// An enrolled agent id can be registered only with the agent's own credential: on the
/// socket, messages sealed with the key of its own `secret`; on gRPC, a client certificate
/// naming it (`spiffe://ORG/AGENT`). Without enrollment an agent id is a claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enrollment {
    /// Refuse every agent id that is not enrolled (and every request made with the
    /// organization's agents' secret alone).
    pub required: bool,
    /// The enrolled agents, by id: each one's socket secret, if it has one (an agent
    /// without one connects over gRPC only).
    pub agents: BTreeMap<String, Option<Vec<u8>>>,
}

/// Rate limits, caps and timeouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// PreExec requests per second per session (token bucket, burst of one second's worth).
    pub pre_exec_per_second_per_session: u32,
    /// Registrations per second per peer (Unix socket peer uid).
    pub registrations_per_second_per_peer: u32,
    /// Live sessions at most.
    pub max_sessions: usize,
    /// Open connections at most, per binding (the socket's, gRPC's): the descriptors it
    /// may hold. Of them, [`Limits::connection_split`] keeps a part for connections that
    /// have not authenticated yet and the rest for those that have.
    pub max_connections: usize,
    /// Connections that have not authenticated yet, at most (and at most half of
    /// `max_connections`): when full, the oldest of them is closed to make room, so a flood
    /// of unauthenticated peers can neither take an authenticated agent's slot nor keep a
    /// new one from signing in.
    pub max_unauthenticated_connections: usize,
    /// A connection must authenticate (its first sealed frame on the socket, the TLS
    /// handshake with a mapped certificate on gRPC) within this of being accepted.
    pub auth_timeout: Duration,
    /// Frames that fail to decode or authenticate before a connection is closed.
    pub max_bad_frames: u32,
    /// A connection with no authenticated frame for this long is closed (frames that fail
    /// to authenticate do not count as activity).
    pub idle_timeout: Duration,
    /// A frame whose header has arrived must complete within this.
    pub frame_timeout: Duration,
    /// The heartbeat interval agents are expected to keep.
    pub heartbeat_interval: Duration,
    /// Missed intervals after which a session is STALE.
    pub missed_heartbeats_for_stale: u32,
    /// A held call nobody decides for this long expires (audited; the transition becomes
    /// `expired` and the call is refused). Zero: held calls never expire.
    pub hitl_timeout: Duration,
    /// The longest one `AwaitDecision` waits before answering `pending` (the client asks
    /// again).
    pub await_decision_max: Duration,
    /// A session with no request from its agent (register, pre-exec, post-exec, heartbeat,
    /// close) for this long ends: audited as closed for `idle`, forgotten, no longer
    /// counted against quotas. A session with a held call waits for it to be decided or
    /// expire first. Zero: sessions end only when their agents close them.
    pub session_idle_timeout: Duration,
}

impl Limits {
    /// How `max_connections` is shared: `(authenticated, unauthenticated)`. The
    /// unauthenticated part is `max_unauthenticated_connections` but at most half (at
    /// least 1); the authenticated part is the rest (at least 1).
    pub fn connection_split(&self) -> (usize, usize) {
        let pending = self
            .max_unauthenticated_connections
            .min(self.max_connections / 2)
            .max(1);
        let authenticated = self.max_connections.saturating_sub(pending).max(1);
        (authenticated, pending)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            pre_exec_per_second_per_session: 1000,
            registrations_per_second_per_peer: 10,
            max_sessions: 100_000,
            max_connections: 1024,
            max_unauthenticated_connections: 256,
            auth_timeout: Duration::from_secs(5),
            max_bad_frames: 3,
            idle_timeout: Duration::from_secs(300),
            frame_timeout: Duration::from_secs(5),
            heartbeat_interval: Duration::from_secs(30),
            missed_heartbeats_for_stale: 3,
            hitl_timeout: Duration::from_secs(900),
            await_decision_max: Duration::from_secs(60),
            session_idle_timeout: Duration::from_secs(3600),
        }
    }
}

/// Audit log settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSettings {
    /// Directory of the log; default `<data_dir>/audit`.
    pub dir: Option<PathBuf>,
    /// Signing key file; default `<data_dir>/audit.key`, created on first start.
    pub key: Option<PathBuf>,
    /// `always`, `batch` or `never`.
    pub fsync: String,
    /// Rotate when a file reaches this size.
    pub rotate_bytes: u64,
    /// Rotate at UTC midnight.
    pub rotate_daily: bool,
    /// Delete archived files older than this many days; 0 keeps everything.
    pub retention_days: u32,
    /// Signed checkpoint every N entries.
    pub checkpoint_every_entries: u64,
    /// Signed checkpoint every T seconds.
    pub checkpoint_every_secs: u64,
    /// Where entries go: the local files (the settings above), or PostgreSQL.
    pub sink: AuditSink,
    /// What a verdict records of its call's params (`params = "hash" | "full" |
    /// "redacted"`, with `redact = [...]` paths; docs/audit-format.md, "Recorded params").
    pub params: tollgate_audit::params::Recorder,
}

/// Where the audit trail is written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AuditSink {
    /// Signed log files in `dir` (the default).
    #[default]
    File,
    /// The fleet's PostgreSQL (`[audit] sink = "postgres"`): this daemon's own signed chain.
    Postgres(PostgresSettings),
}

/// The longest `[audit] commit_linger_ms`.
pub const MAX_COMMIT_LINGER_MS: u64 = 50;

/// `[audit] sink = "postgres"`.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresSettings {
    /// `postgres://user@host:port/db?sslmode=...` (may hold a password: keep the file 0600).
    pub url: String,
    /// The schema holding the tables (default `tollgate`).
    pub schema: String,
    /// This daemon's chain; default `key-<key id>` (one chain per signing key).
    pub chain_id: Option<String>,
    /// Run the migrations at start (default true; they are idempotent).
    pub migrate_at_start: bool,
    /// Under load, how long a commit may wait for as many entries as the previous one
    /// held (`commit_linger_ms`, default 1; 0: never wait). docs/postgres.md.
    pub commit_linger: Duration,
    /// A CA certificate (PEM) to verify the server with, beside the system's roots.
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSettings")
            .field("url", &redact_url(&self.url))
            .field("schema", &self.schema)
            .field("chain_id", &self.chain_id)
            .field("migrate_at_start", &self.migrate_at_start)
            .field("commit_linger", &self.commit_linger)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// A URL with any password replaced by `***`, for logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some(x) => x,
        None => return url.to_owned(),
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings {
            dir: None,
            key: None,
            fsync: "batch".into(),
            rotate_bytes: 256 * 1024 * 1024,
            rotate_daily: true,
            retention_days: 0,
            checkpoint_every_entries: 10_000,
            checkpoint_every_secs: 60,
            sink: AuditSink::File,
            params: tollgate_audit::params::Recorder::hash_only(),
        }
    }
}

/// State store settings. The store writes nothing on the path of a change (the audit log
/// is its write-ahead log); it snapshots the state it folded from the log, which bounds
/// how much log a restart replays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSettings {
    /// Snapshot at most this often when something changed.
    pub snapshot_interval: Duration,
    /// Or after this many audit entries.
    pub snapshot_entries: u64,
    /// Where the state lives: this daemon's embedded store, or the fleet's Redis.
    pub backend: StateBackend,
}

impl Default for StateSettings {
    fn default() -> Self {
        StateSettings {
            snapshot_interval: Duration::from_secs(5),
            snapshot_entries: 100_000,
            backend: StateBackend::Embedded,
        }
    }
}

/// Where session state lives.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StateBackend {
    /// The embedded store in the data directory (the default).
    #[default]
    Embedded,
    /// Redis, shared by a fleet of daemons (`[state] backend = "redis"`).
    Redis(RedisSettings),
}

/// How much of Redis's durability `tollgate serve` expects; it warns at start when the
/// server's settings are weaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisDurability {
    /// `appendonly yes`, `appendfsync always`: no acknowledged verdict is lost.
    Always,
    /// `appendonly yes`, `appendfsync everysec`: a crash of Redis's host may lose up to
    /// about a second of changes.
    Everysec,
    /// No expectation (tests, caches that may lose everything).
    None,
}

/// `[state] backend = "redis"`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port/db` or `rediss://` for TLS.
    pub url: String,
    /// Prefix of every key (default `tg`); daemons sharing state share the prefix.
    pub key_prefix: String,
    /// What the server's persistence must be (default `always`).
    pub durability: RedisDurability,
    /// A command not answered within this is a failure: the verdict is refused.
    pub command_timeout: Duration,
    /// A session untouched this long is dropped (its shared budget is kept).
    pub session_ttl: Duration,
    /// How often each daemon looks for half-done changes of dead daemons.
    pub sweep_interval: Duration,
    /// How old a half-done change must be before a sweep settles it.
    pub grace: Duration,
    /// CA certificates (PEM, at most 1 MiB) for `rediss://`, trusted instead of the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("key_prefix", &self.key_prefix)
            .field("durability", &self.durability)
            .field("command_timeout", &self.command_timeout)
            .field("session_ttl", &self.session_ttl)
            .field("sweep_interval", &self.sweep_interval)
            .field("grace", &self.grace)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

// --- control plane: settings ---
/// The default address of the control plane when `[control]` names none.
pub const DEFAULT_CONTROL_LISTEN: &str = "127.0.0.1:8700";

/// The control plane (`[control]`): one HTTP server with the operators' console at `/`,
/// the WebSocket `/v1/control` and `/metrics`. Off unless the section is present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlSettings {
    /// Where to listen (port 0: any free port; `Daemon::control_addr` tells which).
    pub listen: std::net::SocketAddr,
    /// TLS, required when `listen` is not a loopback address.
    pub tls: Option<TlsFiles>,
    /// Host names (lowercase, no port) requests may name in `Host` besides loopback ones
    /// and IP addresses (`control.allowed_hosts`): the names operators reach the console
    /// by. Any other name is refused (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Browser origins (`scheme://host[:port]`, lowercase) that may open the WebSocket
    /// besides the console's own (`control.allowed_origins`).
    pub allowed_origins: Vec<String>,
}

impl ControlSettings {
    /// On `listen`, without TLS, accepting only loopback names and the console's own
    /// origin.
    pub fn plain(listen: std::net::SocketAddr) -> ControlSettings {
        ControlSettings {
            listen,
            tls: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

/// A PEM certificate chain and its private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// A human operator of the control plane (`[[operator]]`).
#[derive(Clone, PartialEq, Eq)]
pub struct Operator {
    /// Written into the audit entry of every decision the operator makes.
    pub id: String,
    /// SHA-256 of the operator's bearer token (the token itself is never stored).
    pub token_sha256: [u8; 32],
    /// The organizations whose held calls and sessions the operator sees and decides.
    pub organizations: Vec<String>,
    /// After this (ns since the Unix epoch), the token is refused. `None`: never.
    pub expires_at_ns: Option<i64>,
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("id", &self.id)
            .field("organizations", &self.organizations)
            .field("expires_at_ns", &self.expires_at_ns)
            .finish_non_exhaustive()
    }
}
// --- end control plane: settings ---

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Where state, keys, secrets and the audit log live.
    pub data_dir: PathBuf,
    /// The Unix socket; default `<data_dir>/tollgate.sock`.
    pub socket: Option<PathBuf>,
    /// The socket's permission bits; default 0o660.
    pub socket_mode: u32,
    /// Limits.
    pub limits: Limits,
    /// Audit settings.
    pub audit: AuditSettings,
    /// State store durability: `batch` (group commit with fsync, the default) or `never`
    /// (no fsync: a crash loses changes since the last clean stop; for tests and benches).
    pub state: StateSettings,
    /// The organizations served; never empty.
    pub organizations: Vec<Organization>,
    /// The guard every agent gets unless overridden.
    pub default_guard: GuardConfig,
    /// Per-agent guards (complete configs: the default with the agent's keys applied).
    pub agent_guards: BTreeMap<String, GuardConfig>,
    /// The Cedar policy set (`[policy]`); `None`, the default: no policies.
    pub policy: Option<PolicySettings>,
    // --- gRPC binding (transport/grpc) ---
    /// The gRPC binding (`[grpc]`): `None`, the default, leaves it off.
    pub grpc: Option<GrpcSettings>,
    /// Which client certificates are whose agents on the gRPC binding, by organization id
    /// (`grpc_client_*` in `[[organization]]`).
    pub grpc_clients: BTreeMap<String, GrpcClientRules>,
    /// The control plane; `None` (the default): not served.
    pub control: Option<ControlSettings>,
    /// The control plane's operators.
    pub operators: Vec<Operator>,
    /// Enrolled agents, by organization id (organizations that enroll none are absent).
    pub enrollment: BTreeMap<String, Enrollment>,
    /// Live sessions at most, by organization id (`[[organization]] max_sessions`);
    /// an organization without one shares `limits.max_sessions` only.
    pub session_quotas: BTreeMap<String, usize>,
}

impl Default for DaemonConfig {
    /// Embedded defaults: data in `./tollgate-data`, one organization `default` with a
    /// generated secret, a guard of $1.00 budget, 3 repeats, HITL never.
    fn default() -> Self {
        DaemonConfig {
            data_dir: PathBuf::from("tollgate-data"),
            socket: None,
            socket_mode: 0o660,
            limits: Limits::default(),
            audit: AuditSettings::default(),
            state: StateSettings::default(),
            organizations: vec![Organization {
                id: DEFAULT_ORG.into(),
                secret: None,
                operator_secret: None,
            }],
            default_guard: default_guard(),
            agent_guards: BTreeMap::new(),
            policy: None,
            grpc: None,
            grpc_clients: BTreeMap::new(),
            control: None,
            operators: Vec::new(),
            enrollment: BTreeMap::new(),
            session_quotas: BTreeMap::new(),
        }
    }
}

/// The embedded default guard.
pub fn default_guard() -> GuardConfig {
    GuardConfig {
        budget: Money(1_000_000_000),
        max_repeat_calls: 3,
        ..GuardConfig::default()
    }
}

impl DaemonConfig {
    /// Read a configuration file.
    pub fn load(path: &Path) -> Result<DaemonConfig, ConfigError> {
        let meta = std::fs::metadata(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge(path.to_owned()));
        }
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        DaemonConfig::from_toml(&text, base)
    }

    /// Parse configuration text; relative `secret_file` paths resolve against `base`.
    pub fn from_toml(text: &str, base: &Path) -> Result<DaemonConfig, ConfigError> {
        let file: File = toml::from_str(text)?;
        let mut c = DaemonConfig::default();
        if let Some(d) = file.daemon.data_dir {
            c.data_dir = d;
        }
        c.socket = file.daemon.socket;
        if let Some(m) = file.daemon.socket_mode {
            c.socket_mode = u32::from_str_radix(m.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o777)
                .ok_or_else(|| bad("daemon.socket_mode", format!("`{m}` is not an octal mode")))?;
        }
        let l = file.limits;
        let d = Limits::default();
        c.limits = Limits {
            pre_exec_per_second_per_session: positive(
                "limits.pre_exec_per_second_per_session",
                l.pre_exec_per_second_per_session,
                d.pre_exec_per_second_per_session,
            )?,
            registrations_per_second_per_peer: positive(
                "limits.registrations_per_second_per_peer",
                l.registrations_per_second_per_peer,
                d.registrations_per_second_per_peer,
            )?,
            max_sessions: positive("limits.max_sessions", l.max_sessions, d.max_sessions)?,
            max_connections: positive(
                "limits.max_connections",
                l.max_connections,
                d.max_connections,
            )?,
            max_unauthenticated_connections: positive(
                "limits.max_unauthenticated_connections",
                l.max_unauthenticated_connections,
                d.max_unauthenticated_connections,
            )?,
            auth_timeout: Duration::from_millis(positive(
                "limits.auth_timeout_ms",
                l.auth_timeout_ms,
                u64::try_from(d.auth_timeout.as_millis()).unwrap_or(u64::MAX),
            )?),
            max_bad_frames: positive("limits.max_bad_frames", l.max_bad_frames, d.max_bad_frames)?,
            idle_timeout: l
                .idle_timeout_secs
                .map_or(d.idle_timeout, Duration::from_secs),
            frame_timeout: l
                .frame_timeout_ms
                .map_or(d.frame_timeout, Duration::from_millis),
            heartbeat_interval: l
                .heartbeat_interval_secs
                .map_or(d.heartbeat_interval, Duration::from_secs),
            missed_heartbeats_for_stale: positive(
                "limits.missed_heartbeats_for_stale",
                l.missed_heartbeats_for_stale,
                d.missed_heartbeats_for_stale,
            )?,
            hitl_timeout: l
                .hitl_timeout_secs
                .map_or(d.hitl_timeout, Duration::from_secs),
            await_decision_max: Duration::from_secs(positive(
                "limits.await_decision_max_secs",
                l.await_decision_max_secs,
                d.await_decision_max.as_secs(),
            )?),
            session_idle_timeout: l
                .session_idle_timeout_secs
                .map_or(d.session_idle_timeout, Duration::from_secs),
        };
        let a = file.audit;
        let da = AuditSettings::default();
        let params = tollgate_audit::params::Recorder::from_setting(
            a.params.as_deref(),
            a.redact.as_deref().unwrap_or(&[]),
        )
        .map_err(|e| bad(e.key("audit.params", "audit.redact"), e.to_string()))?;
        c.audit = AuditSettings {
            params,
            dir: a.dir,
            key: a.key,
            fsync: match a.fsync {
                None => da.fsync,
                Some(f) if ["always", "batch", "never"].contains(&f.as_str()) => f,
                Some(f) => {
                    return Err(bad(
                        "audit.fsync",
                        format!("`{f}` is not always, batch or never"),
                    ))
                }
            },
            rotate_bytes: a.rotate_bytes.unwrap_or(da.rotate_bytes),
            rotate_daily: a.rotate_daily.unwrap_or(da.rotate_daily),
            retention_days: a.retention_days.unwrap_or(da.retention_days),
            checkpoint_every_entries: a
                .checkpoint_every_entries
                .unwrap_or(da.checkpoint_every_entries),
            checkpoint_every_secs: a.checkpoint_every_secs.unwrap_or(da.checkpoint_every_secs),
            sink: match a.sink.as_deref() {
                None | Some("file") => {
                    for (key, set) in [
                        ("url", a.url.is_some()),
                        ("schema", a.schema.is_some()),
                        ("chain_id", a.chain_id.is_some()),
                        ("migrate_at_start", a.migrate_at_start.is_some()),
                        ("commit_linger_ms", a.commit_linger_ms.is_some()),
                        ("ca_file", a.ca_file.is_some()),
                    ] {
                        if set {
                            return Err(bad(
                                format!("audit.{key}"),
                                "only for sink = \"postgres\"",
                            ));
                        }
                    }
                    AuditSink::File
                }
                Some("postgres") => AuditSink::Postgres(PostgresSettings {
                    url: a
                        .url
                        .filter(|u| u.starts_with("postgres://") || u.starts_with("postgresql://"))
                        .ok_or_else(|| {
                            bad("audit.url", "sink = \"postgres\" needs a postgres:// URL")
                        })?,
                    schema: match a.schema {
                        None => "tollgate".into(),
                        Some(s) if sql_identifier(&s) => s,
                        Some(s) => {
                            return Err(bad(
                                "audit.schema",
                                format!("`{s}` is not a plain identifier (a-z, 0-9, _; 1 to 63)"),
                            ))
                        }
                    },
                    chain_id: match a.chain_id {
                        None => None,
                        Some(c) if chain_id_ok(&c) => Some(c),
                        Some(c) => {
                            return Err(bad(
                                "audit.chain_id",
                                format!("`{c}` must be 1 to 64 of a-z A-Z 0-9 . _ -"),
                            ))
                        }
                    },
                    migrate_at_start: a.migrate_at_start.unwrap_or(true),
                    commit_linger: match a.commit_linger_ms {
                        None => tollgate_pg::DEFAULT_COMMIT_LINGER,
                        Some(ms) if ms <= MAX_COMMIT_LINGER_MS => Duration::from_millis(ms),
                        Some(ms) => {
                            return Err(bad(
                                "audit.commit_linger_ms",
                                format!("{ms} is more than {MAX_COMMIT_LINGER_MS} (every verdict under load would wait that long)"),
                            ))
                        }
                    },
                    ca_file: a.ca_file.map(|p| base.join(p)),
                }),
                Some(other) => {
                    return Err(bad(
                        "audit.sink",
                        format!("`{other}` is not file or postgres"),
                    ))
                }
            },
        };
        c.state.snapshot_interval = Duration::from_secs(positive(
            "state.snapshot_interval_secs",
            file.state.snapshot_interval_secs,
            c.state.snapshot_interval.as_secs(),
        )?);
        c.state.snapshot_entries = positive(
            "state.snapshot_entries",
            file.state.snapshot_entries,
            c.state.snapshot_entries,
        )?;
        c.state.backend = state_backend(&file.state, base)?;
        if matches!(c.state.backend, StateBackend::Redis(_))
            != matches!(c.audit.sink, AuditSink::Postgres(_))
        {
            return Err(bad(
                "state.backend",
                "state in Redis and the audit trail in PostgreSQL go together (a fleet needs both: see docs/fleet.md)",
            ));
        }
        if !file.organizations.is_empty() {
            let mut orgs = Vec::new();
            for (i, o) in file.organizations.into_iter().enumerate() {
                let key = format!("organization[{i}]");
                let rules = grpc_client_rules(
                    &key,
                    o.grpc_client_ca.as_deref(),
                    &o.grpc_client_fingerprints,
                    &o.grpc_client_san,
                    base,
                )?;
                if let Some(rules) = rules {
                    c.grpc_clients.insert(o.id.clone(), rules);
                }
                tollgate_core::check_id(&o.id)
                    .map_err(|e| bad(format!("{key}.id"), e.to_string()))?;
                if orgs.iter().any(|x: &Organization| x.id == o.id) {
                    return Err(bad(
                        format!("{key}.id"),
                        format!("`{}` appears twice", o.id),
                    ));
                }
                let secret = read_secret(&key, "secret", o.secret, o.secret_file, base)?;
                let operator_secret = read_secret(
                    &key,
                    "operator_secret",
                    o.operator_secret,
                    o.operator_secret_file,
                    base,
                )?;
                if secret.is_some() && secret == operator_secret {
                    return Err(bad(
                        format!("{key}.operator_secret"),
                        "must differ from the agents' secret",
                    ));
                }
                let enrollment = enrollment(
                    &key,
                    o.require_enrollment,
                    o.agent,
                    [secret.as_deref(), operator_secret.as_deref()],
                    base,
                )?;
                if enrollment.required || !enrollment.agents.is_empty() {
                    c.enrollment.insert(o.id.clone(), enrollment);
                }
                if let Some(max) = o.max_sessions {
                    if max == 0 {
                        return Err(bad(format!("{key}.max_sessions"), "must be at least 1"));
                    }
                    c.session_quotas.insert(o.id.clone(), max);
                }
                orgs.push(Organization {
                    id: o.id,
                    secret,
                    operator_secret,
                });
            }
            c.organizations = orgs;
        }
        c.grpc = grpc_settings(file.grpc, &c.grpc_clients, base)?;
        c.default_guard = guard(&file.guard.default, &default_guard(), "guard.default")?;
        for (agent, table) in &file.guard.agents {
            // A guard for an id no agent can register under would silently never apply.
            tollgate_core::check_id(agent)
                .map_err(|e| bad(format!("guard.agents.{agent:?}"), format!("agent id {e}")))?;
            let g = guard(table, &c.default_guard, &format!("guard.agents.{agent}"))?;
            c.agent_guards.insert(agent.clone(), g);
        }
        c.policy = file.policy.map(|s| policy_settings(s, base)).transpose()?;
        c.control = file.control.map(|s| control(s, base)).transpose()?;
        c.operators = operators(file.operators, &c.organizations)?;
        if matches!(c.state.backend, StateBackend::Redis(_)) {
            // Daemons of a fleet authenticate each other's agents and operators: a secret
            // generated into one daemon's data directory would lock the others out.
            if let Some(o) = c
                .organizations
                .iter()
                .find(|o| o.secret.is_none() || o.operator_secret.is_none())
            {
                return Err(bad(
                    "organization",
                    format!(
                        "`{}`: with backend = \"redis\" every organization needs secret (or secret_file) and operator_secret (or operator_secret_file), the same on every daemon of the fleet",
                        o.id
                    ),
                ));
            }
        }
        Ok(c)
    }

    /// The socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.data_dir.join("tollgate.sock"))
    }

    /// The guard for `agent`.
    pub fn guard_for(&self, agent: &str) -> &GuardConfig {
        self.agent_guards.get(agent).unwrap_or(&self.default_guard)
    }

    /// What `tollgate serve` warns about at start: per-agent guards and `per_agent`
    /// budgets that rest on claimed agent ids (an organization that does not require
    /// enrollment, or a guarded id it does not enroll).
    pub fn identity_warnings(&self) -> Vec<String> {
        let per_agent_budget = std::iter::once(&self.default_guard)
            .chain(self.agent_guards.values())
            .any(|g| g.budget_scope == BudgetScope::PerAgent);
        let mut out = Vec::new();
        for org in &self.organizations {
            let e = self.enrollment.get(&org.id);
            let unenrolled: Vec<&str> = self
                .agent_guards
                .keys()
                .filter(|a| !e.is_some_and(|e| e.agents.contains_key(*a)))
                .map(String::as_str)
                .collect();
            if !unenrolled.is_empty() {
                out.push(format!(
                    "organization `{}`: the per-agent guards of {} apply to claimed agent ids, not enrolled agents: any agent of the organization may register under another id and get another guard; enroll them ([[organization.agent]], docs/protocol.md §3)",
                    org.id,
                    unenrolled
                        .iter()
                        .map(|a| format!("`{a}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if per_agent_budget && !e.is_some_and(|e| e.required) {
                out.push(format!(
                    "organization `{}`: per_agent budgets are kept per claimed agent id: without require_enrollment a new id gets a fresh budget (docs/protocol.md §3)",
                    org.id
                ));
            }
        }
        out
    }
}

/// An organization's `[[organization.agent]]` list, checked: ids by the id rule and
/// unique; secrets at least 16 bytes and none equal to another's or to the
/// organization's own (`org_secrets`).
fn enrollment(
    key: &str,
    required: bool,
    agents: Vec<AgentSection>,
    org_secrets: [Option<&[u8]>; 2],
    base: &Path,
) -> Result<Enrollment, ConfigError> {
    let mut e = Enrollment {
        required,
        agents: BTreeMap::new(),
    };
    for (i, a) in agents.into_iter().enumerate() {
        let k = format!("{key}.agent[{i}]");
        tollgate_core::check_id(&a.id).map_err(|err| bad(format!("{k}.id"), err.to_string()))?;
        if e.agents.contains_key(&a.id) {
            return Err(bad(format!("{k}.id"), format!("`{}` appears twice", a.id)));
        }
        let secret = read_secret(&k, "secret", a.secret, a.secret_file, base)?;
        if let Some(s) = &secret {
            let reused = org_secrets.iter().flatten().any(|o| *o == s.as_slice())
                || e.agents.values().flatten().any(|o| o == s);
            if reused {
                return Err(bad(
                    format!("{k}.secret"),
                    "must differ from the organization's secrets and every other agent's",
                ));
            }
        }
        e.agents.insert(a.id, secret);
    }
    Ok(e)
}

// --- gRPC binding (transport/grpc) ---

/// `[grpc]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrpcSection {
    listen: Option<String>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

/// The gRPC binding: SP/1.0 §6.2, `ShackleDaemon` over HTTP/2 with mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcSettings {
    /// The address to listen on (`[grpc] listen`, e.g. `127.0.0.1:9000`; port 0 picks a
    /// free port, see `Daemon::grpc_addr`).
    pub listen: std::net::SocketAddr,
    /// The server's certificate chain, PEM (leaf first).
    pub cert: PathBuf,
    /// The server's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Which client certificates are an organization's agents on the gRPC binding. A
/// certificate maps to the organization when its SHA-256 is in `fingerprints`, or when it
/// chains to `ca` and (if `san` is not empty) one of its subject alternative names
/// matches one of the patterns. Exactly one organization must match (transport/grpc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrpcClientRules {
    /// A PEM file of CA certificates (`grpc_client_ca`).
    pub ca: Option<PathBuf>,
    /// SHA-256 of client certificates' DER (`grpc_client_fingerprints`).
    pub fingerprints: Vec<[u8; 32]>,
    /// Patterns for a DNS or URI subject alternative name (`grpc_client_san`), see
    /// [`san_matches`].
    pub san: Vec<String>,
}

/// The longest SAN pattern accepted.
pub const MAX_SAN_PATTERN_BYTES: usize = 256;

fn grpc_client_rules(
    key: &str,
    ca: Option<&Path>,
    fingerprints: &[String],
    san: &[String],
    base: &Path,
) -> Result<Option<GrpcClientRules>, ConfigError> {
    if ca.is_none() && fingerprints.is_empty() && san.is_empty() {
        return Ok(None);
    }
    if ca.is_none() && !san.is_empty() {
        // A name in a certificate is only as trustworthy as the CA that signed it: a SAN
        // pattern without this organization's CA would let any other organization's CA
        // issue this organization's names.
        return Err(bad(
            format!("{key}.grpc_client_san"),
            "needs grpc_client_ca: a name is only as trustworthy as the CA that issued it",
        ));
    }
    let mut fps = Vec::with_capacity(fingerprints.len());
    for f in fingerprints {
        let fp = parse_fingerprint(f).ok_or_else(|| {
            bad(
                format!("{key}.grpc_client_fingerprints"),
                format!("`{f}` is not a SHA-256 in hex (64 hex digits, colons allowed)"),
            )
        })?;
        fps.push(fp);
    }
    for p in san {
        check_san_pattern(p).map_err(|m| bad(format!("{key}.grpc_client_san"), m))?;
    }
    Ok(Some(GrpcClientRules {
        ca: ca.map(|c| base.join(c)),
        fingerprints: fps,
        san: san.to_vec(),
    }))
}

/// A SHA-256 fingerprint in hex: 64 hex digits, either case, optionally separated by
/// colons (`AB:CD:...`, as `openssl x509 -fingerprint -sha256` prints it).
pub fn parse_fingerprint(text: &str) -> Option<[u8; 32]> {
    let hex: Vec<u8> = text.bytes().filter(|b| *b != b':').collect();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        let s = std::str::from_utf8(pair).ok()?;
        *o = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

fn check_san_pattern(p: &str) -> Result<(), String> {
    if p.is_empty() || p.len() > MAX_SAN_PATTERN_BYTES {
        return Err(format!("a pattern is 1 to {MAX_SAN_PATTERN_BYTES} bytes"));
    }
    let stars = p.matches('*').count();
    let ok = match stars {
        0 => true,
        1 => {
            (p.starts_with("*.") && !p.contains("://") && p.len() > 2)
                || (p.contains("://") && p.ends_with("/*"))
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{p}`: a `*` may only be a DNS name's whole first label (`*.agents.example`) \
             or a URI's last path segment and what follows (`spiffe://acme/*`)"
        ))
    }
}

/// Whether a certificate's subject alternative name `name` (a DNS name or a URI) matches
/// `pattern`:
/// - no `*`: the same name (DNS names compared ASCII case-insensitively, URIs exactly);
/// - `*.rest`: a DNS name of exactly one more, non-empty label before `.rest`
///   (`*.agents.acme.example` matches `bot1.agents.acme.example`, not
///   `a.b.agents.acme.example` nor `agents.acme.example`);
/// - `prefix/*` (a URI): a URI that starts with `prefix/` and has at least one more
///   character (`spiffe://acme/*` matches `spiffe://acme/agent/7`, not `spiffe://acme/`
///   nor `spiffe://acme-evil/x`).
pub fn san_matches(pattern: &str, name: &str) -> bool {
    if let Some(rest) = pattern.strip_prefix("*.") {
        let Some((first, tail)) = name.split_once('.') else {
            return false;
        };
        return !first.is_empty() && !first.contains('*') && tail.eq_ignore_ascii_case(rest);
    }
    if let Some(prefix) = pattern.strip_suffix('*') {
        return name.len() > prefix.len() && name.starts_with(prefix);
    }
    if pattern.contains("://") {
        pattern == name
    } else {
        pattern.eq_ignore_ascii_case(name)
    }
}

fn grpc_settings(
    g: GrpcSection,
    clients: &BTreeMap<String, GrpcClientRules>,
    base: &Path,
) -> Result<Option<GrpcSettings>, ConfigError> {
    // A certificate pinned by two organizations would map to both: certain from the
    // configuration alone, so refused here rather than at every connection.
    let mut pinned: BTreeMap<[u8; 32], &str> = BTreeMap::new();
    for (org, rules) in clients {
        for fp in &rules.fingerprints {
            if let Some(other) = pinned.insert(*fp, org) {
                if other != org {
                    return Err(bad(
                        "grpc_client_fingerprints",
                        format!("one certificate is pinned by both `{other}` and `{org}`"),
                    ));
                }
            }
        }
    }
    let Some(listen) = g.listen else {
        if g.cert.is_some() || g.key.is_some() {
            return Err(bad(
                "grpc.listen",
                "`cert` and `key` are set but `listen` is not",
            ));
        }
        return Ok(None);
    };
    let listen = listen.parse::<std::net::SocketAddr>().map_err(|_| {
        bad(
            "grpc.listen",
            format!("`{listen}` is not an IP address and port"),
        )
    })?;
    let cert = g.cert.ok_or_else(|| {
        bad(
            "grpc.cert",
            "required with `listen`: mutual TLS is required",
        )
    })?;
    let key = g
        .key
        .ok_or_else(|| bad("grpc.key", "required with `listen`: mutual TLS is required"))?;
    if clients.is_empty() {
        return Err(bad(
            "grpc.listen",
            "no [[organization]] names grpc_client_ca or grpc_client_fingerprints: no client could connect",
        ));
    }
    Ok(Some(GrpcSettings {
        listen,
        cert: base.join(cert),
        key: base.join(key),
    }))
}

// --- control plane: parsing ---
fn control(s: ControlSection, base: &Path) -> Result<ControlSettings, ConfigError> {
    let text = s.listen.as_deref().unwrap_or(DEFAULT_CONTROL_LISTEN);
    let listen: std::net::SocketAddr = text.parse().map_err(|_| {
        bad(
            "control.listen",
            format!("`{text}` is not an IP address and port (e.g. `127.0.0.1:8700`)"),
        )
    })?;
    let tls = match (s.cert, s.key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: base.join(cert),
            key: base.join(key),
        }),
        (None, None) => None,
        _ => return Err(bad("control", "give both `cert` and `key`, or neither")),
    };
    if tls.is_none() && !listen.ip().is_loopback() {
        return Err(bad(
            "control.listen",
            format!(
                "`{listen}` is not a loopback address: TLS is required there (set control.cert and control.key)"
            ),
        ));
    }
    let mut allowed_hosts = Vec::new();
    for h in s.allowed_hosts {
        let name = h.trim_end_matches('.').to_ascii_lowercase();
        let ok = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !ok {
            return Err(bad(
                "control.allowed_hosts",
                format!("`{h}` is not a host name (letters, digits, '-' and '.'; no port)"),
            ));
        }
        allowed_hosts.push(name);
    }
    let mut allowed_origins = Vec::new();
    for o in s.allowed_origins {
        let lower = o.to_ascii_lowercase();
        let ok = lower
            .strip_prefix("https://")
            .or_else(|| lower.strip_prefix("http://"))
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(['/', '?', '#', ' ', '*']));
        if !ok {
            return Err(bad(
                "control.allowed_origins",
                format!("`{o}` is not an origin: scheme://host[:port], e.g. https://console.example:8700"),
            ));
        }
        allowed_origins.push(lower);
    }
    Ok(ControlSettings {
        listen,
        tls,
        allowed_hosts,
        allowed_origins,
    })
}

fn operators(
    list: Vec<OperatorSection>,
    orgs: &[Organization],
) -> Result<Vec<Operator>, ConfigError> {
    let mut out: Vec<Operator> = Vec::new();
    for (i, o) in list.into_iter().enumerate() {
        let key = format!("operator[{i}]");
        if o.id.trim().is_empty() || o.id.len() > 256 || o.id.chars().any(char::is_control) {
            return Err(bad(
                format!("{key}.id"),
                "must be 1 to 256 bytes of printable text",
            ));
        }
        if out.iter().any(|x| x.id == o.id) {
            return Err(bad(
                format!("{key}.id"),
                format!("`{}` appears twice", o.id),
            ));
        }
        let token_sha256 = parse_sha256(&o.token_sha256).ok_or_else(|| {
            bad(
                format!("{key}.token_sha256"),
                "must be 64 hex digits (the SHA-256 of the token; `tollgate operator-token` prints one)",
            )
        })?;
        if out.iter().any(|x| x.token_sha256 == token_sha256) {
            return Err(bad(
                format!("{key}.token_sha256"),
                "another operator has the same token",
            ));
        }
        if o.organizations.is_empty() {
            return Err(bad(
                format!("{key}.organizations"),
                "must name at least one",
            ));
        }
        for org in &o.organizations {
            if !orgs.iter().any(|x| &x.id == org) {
                return Err(bad(
                    format!("{key}.organizations"),
                    format!("`{org}` is not an organization this daemon serves"),
                ));
            }
        }
        let expires_at_ns = o
            .expires_at
            .map(|t| time_value(&t).ok_or_else(|| {
                bad(
                    format!("{key}.expires_at"),
                    "must be Unix seconds or an RFC 3339 date-time with an offset (e.g. `2026-12-31T23:59:59Z`)",
                )
            }))
            .transpose()?;
        out.push(Operator {
            id: o.id,
            token_sha256,
            organizations: o.organizations,
            expires_at_ns,
        });
    }
    Ok(out)
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn time_value(t: &TimeValue) -> Option<i64> {
    match t {
        TimeValue::Seconds(s) => s.checked_mul(1_000_000_000),
        TimeValue::Text(text) => rfc3339_ns(text),
        TimeValue::Toml(d) => rfc3339_ns(&d.to_string()),
    }
}

/// Nanoseconds since the Unix epoch of an RFC 3339 date-time
/// (`YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`; `t`, `z` and a space separator accepted).
/// `None` for anything else, including a date-time without an offset.
pub fn rfc3339_ns(text: &str) -> Option<i64> {
    let b = text.trim().as_bytes();
    if b.len() < 20 || b.len() > 40 {
        return None;
    }
    let num = |from: usize, len: usize| -> Option<i64> {
        let digits = b.get(from..from + len)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    };
    let sep = |at: usize, ok: &[u8]| b.get(at).is_some_and(|c| ok.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&month)
        || !(1..=days_in_month(year, month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut at = 19;
    let mut nanos = 0i64;
    if sep(at, b".") {
        at += 1;
        let start = at;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        let digits = at - start;
        if digits == 0 || digits > 9 {
            return None;
        }
        nanos = num(start, digits)? * 10i64.pow(u32::try_from(9 - digits).ok()?);
    }
    let offset_secs = match b.get(at..)? {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), ..] if b.len() == at + 6 && sep(at + 3, b":") => {
            let (h, m) = (num(at + 1, 2)?, num(at + 4, 2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let s = h * 3600 + m * 60;
            if *sign == b'-' {
                -s
            } else {
                s
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_secs;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
// --- end control plane: parsing ---

/// A secret given inline or in a file (relative to `base`), at least 16 bytes.
fn read_secret(
    key: &str,
    name: &str,
    inline: Option<String>,
    file: Option<PathBuf>,
    base: &Path,
) -> Result<Option<Vec<u8>>, ConfigError> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(bad(
            key,
            format!("give `{name}` or `{name}_file`, not both"),
        )),
        (Some(s), None) if s.len() < 16 => {
            Err(bad(format!("{key}.{name}"), "must be at least 16 bytes"))
        }
        (Some(s), None) => Ok(Some(s.into_bytes())),
        (None, Some(f)) => {
            let path = base.join(f);
            let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            let secret = text.trim().as_bytes().to_vec();
            if secret.len() < 16 {
                return Err(bad(
                    format!("{key}.{name}_file"),
                    format!(
                        "`{}` holds {} bytes (after trimming whitespace); a secret must be at least 16 bytes",
                        path.display(),
                        secret.len()
                    ),
                ));
            }
            Ok(Some(secret))
        }
        (None, None) => Ok(None),
    }
}

fn positive<T: PartialOrd + Default + Copy>(
    key: &str,
    v: Option<T>,
    default: T,
) -> Result<T, ConfigError> {
    match v {
        None => Ok(default),
        Some(x) if x > T::default() => Ok(x),
        Some(_) => Err(bad(key, "must be greater than zero")),
    }
}

/// `base` with the keys `t` sets; a bad value is [`ConfigError::Value`] naming
/// `<key>.<name>`.
pub fn guard(t: &GuardTable, base: &GuardConfig, key: &str) -> Result<GuardConfig, ConfigError> {
    let k = |name: &str| format!("{key}.{name}");
    let mut g = base.clone();
    if let Some(b) = t.budget_usd {
        g.budget =
            Money::from_usd_non_negative(b).map_err(|e| bad(k("budget_usd"), e.to_string()))?;
    }
    if let Some(s) = &t.budget_scope {
        g.budget_scope = s
            .parse::<BudgetScope>()
            .map_err(|e| bad(k("budget_scope"), e.to_string()))?;
    }
    if let Some(v) = t.max_repeat_calls {
        g.max_repeat_calls = v;
    }
    if let Some(v) = t.error_amplification {
        g.error_amplification = v;
    }
    if let Some(v) = t.timeout_seconds {
        g.timeout_seconds = v;
    }
    if let Some(v) = t.window_duration_s {
        g.window_duration_s = v;
    }
    if let Some(v) = t.window_max_calls {
        g.window_max_calls = v;
    }
    if let Some(v) = t.max_total_calls {
        g.max_total_calls = v;
    }
    if let Some(v) = t.probabilistic_deny {
        g.probabilistic_deny = v;
    }
    if let Some(v) = t.deny_jitter_ratio {
        g.deny_jitter_ratio =
            Ratio::from_f64(v).map_err(|e| bad(k("deny_jitter_ratio"), e.to_string()))?;
    }
    if let Some(s) = &t.hitl_mode {
        g.hitl_mode = s
            .parse::<HitlMode>()
            .map_err(|e| bad(k("hitl_mode"), e.to_string()))?;
    }
    if let Some(v) = t.hitl_budget_threshold {
        g.hitl_budget_threshold =
            Ratio::from_f64(v).map_err(|e| bad(k("hitl_budget_threshold"), e.to_string()))?;
    }
    if let Some(s) = &t.settlement {
        g.settlement = s
            .parse::<Settlement>()
            .map_err(|e| bad(k("settlement"), e.to_string()))?;
    }
    g.nonce_window = positive(&k("nonce_window"), t.nonce_window, g.nonce_window)?;
    g.max_reservations = positive(
        &k("max_reservations"),
        t.max_reservations,
        g.max_reservations,
    )?;
    g.max_held_calls = positive(&k("max_held_calls"), t.max_held_calls, g.max_held_calls)?;
    Ok(g)
}

fn sql_identifier(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !s.as_bytes().first().is_some_and(u8::is_ascii_digit)
}

fn chain_id_ok(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

fn state_backend(st: &StateSection, base: &Path) -> Result<StateBackend, ConfigError> {
    match st.backend.as_deref() {
        None | Some("embedded") => {
            for (key, set) in [
                ("url", st.url.is_some()),
                ("key_prefix", st.key_prefix.is_some()),
                ("durability", st.durability.is_some()),
                ("command_timeout_ms", st.command_timeout_ms.is_some()),
                ("session_ttl_secs", st.session_ttl_secs.is_some()),
                ("sweep_interval_secs", st.sweep_interval_secs.is_some()),
                ("grace_secs", st.grace_secs.is_some()),
                ("ca_file", st.ca_file.is_some()),
            ] {
                if set {
                    return Err(bad(format!("state.{key}"), "only for backend = \"redis\""));
                }
            }
            Ok(StateBackend::Embedded)
        }
        Some("redis") => {
            let url = st
                .url
                .clone()
                .filter(|u| u.starts_with("redis://") || u.starts_with("rediss://"))
                .ok_or_else(|| {
                    bad(
                        "state.url",
                        "backend = \"redis\" needs a redis:// or rediss:// URL",
                    )
                })?;
            let key_prefix = match &st.key_prefix {
                None => "tg".to_owned(),
                Some(p) if chain_id_ok(p) && !p.contains(['{', '}']) => p.clone(),
                Some(p) => {
                    return Err(bad(
                        "state.key_prefix",
                        format!("`{p}` must be 1 to 64 of a-z A-Z 0-9 . _ -"),
                    ))
                }
            };
            let durability = match st.durability.as_deref() {
                None | Some("always") => RedisDurability::Always,
                Some("everysec") => RedisDurability::Everysec,
                Some("none") => RedisDurability::None,
                Some(d) => {
                    return Err(bad(
                        "state.durability",
                        format!("`{d}` is not always, everysec or none"),
                    ))
                }
            };
            let secs =
                |key: &str, v: Option<u64>, d: u64| positive(key, v, d).map(Duration::from_secs);
            Ok(StateBackend::Redis(RedisSettings {
                url,
                key_prefix,
                durability,
                command_timeout: Duration::from_millis(positive(
                    "state.command_timeout_ms",
                    st.command_timeout_ms,
                    2000,
                )?),
                session_ttl: secs("state.session_ttl_secs", st.session_ttl_secs, 30 * 86_400)?,
                sweep_interval: secs("state.sweep_interval_secs", st.sweep_interval_secs, 5)?,
                grace: secs("state.grace_secs", st.grace_secs, 10)?,
                ca_file: st.ca_file.as_ref().map(|p| base.join(p)),
            }))
        }
        Some(other) => Err(bad(
            "state.backend",
            format!("`{other}` is not embedded or redis"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_embedded_defaults() {
        let c = DaemonConfig::from_toml("", Path::new(".")).unwrap();
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.default_guard, default_guard());
        assert_eq!(c.organizations.len(), 1);
        assert_eq!(
            c.socket_path(),
            PathBuf::from("tollgate-data/tollgate.sock")
        );
    }

    #[test]
    fn a_full_file() {
        let c = DaemonConfig::from_toml(
            r#"
            [daemon]
            data_dir = "/var/lib/tollgate"
            socket = "/run/tollgate.sock"
            socket_mode = "0600"
            [limits]
            pre_exec_per_second_per_session = 50
            heartbeat_interval_secs = 5
            [audit]
            fsync = "always"
            [[organization]]
            id = "acme"
            secret = "0123456789abcdef0123"
            [guard.default]
            budget_usd = 0.5
            hitl_mode = "on_threshold"
            hitl_budget_threshold = 0.2
            [guard.agents.research-bot]
            max_repeat_calls = 5
            budget_scope = "per_agent"
            "#,
            Path::new("."),
        )
        .unwrap();
        assert_eq!(c.socket_mode, 0o600);
        assert_eq!(c.limits.pre_exec_per_second_per_session, 50);
        assert_eq!(c.audit.fsync, "always");
        assert_eq!(
            c.organizations[0].secret.as_deref(),
            Some(&b"0123456789abcdef0123"[..])
        );
        let g = c.guard_for("research-bot");
        assert_eq!(g.budget, Money(500_000_000));
        assert_eq!(g.max_repeat_calls, 5);
        assert_eq!(g.budget_scope, BudgetScope::PerAgent);
        assert_eq!(g.hitl_mode, HitlMode::OnThreshold);
        assert_eq!(c.guard_for("other").max_repeat_calls, 3);
    }

    /// `[guard.agents.X]` inherits `[guard.default]` key by key: a key the agent does not
    /// set takes the default's value (from the file, else the embedded default), wherever
    /// the tables appear in the file.
    #[test]
    fn agent_guards_inherit_the_default_key_by_key() {
        let c = DaemonConfig::from_toml(
            r#"
            [guard.agents.bot]
            budget_usd = 0.25
            [guard.agents.plain]
            [guard.default]
            budget_usd = 2.0
            max_repeat_calls = 7
            hitl_mode = "always"
            settlement = "actual"
            error_amplification = true
            "#,
            Path::new("."),
        )
        .unwrap();
        let d = &c.default_guard;
        assert_eq!(
            (d.budget, d.max_repeat_calls, d.hitl_mode, d.settlement),
            (
                Money(2_000_000_000),
                7,
                HitlMode::Always,
                Settlement::Actual
            )
        );
        assert!(d.error_amplification);
        let mut want = d.clone();
        want.budget = Money(250_000_000);
        assert_eq!(c.guard_for("bot"), &want);
        assert_eq!(c.guard_for("plain"), d);
        assert_eq!(c.guard_for("unlisted"), d);
    }

    /// Any `[[organization]]` replaces the embedded `default` organization.
    #[test]
    fn configured_organizations_replace_the_default_one() {
        let c = DaemonConfig::from_toml("[[organization]]\nid = \"acme\"", Path::new(".")).unwrap();
        let ids: Vec<&str> = c.organizations.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["acme"]);
        let c = DaemonConfig::from_toml("", Path::new(".")).unwrap();
        assert_eq!(c.organizations[0].id, DEFAULT_ORG);
    }

    #[test]
    fn the_grpc_binding_and_its_client_rules() {
        let c = DaemonConfig::from_toml("", Path::new("/etc/t")).unwrap();
        assert_eq!(c.grpc, None, "off by default");
        let fp = "AB:".repeat(31) + "AB";
        let c = DaemonConfig::from_toml(
            &format!(
                r#"
            [grpc]
            listen = "127.0.0.1:9000"
            cert = "server.pem"
            key = "/abs/server.key"
            [[organization]]
            id = "acme"
            grpc_client_ca = "acme-ca.pem"
            grpc_client_san = ["*.agents.acme.example", "spiffe://acme/*"]
            [[organization]]
            id = "beta"
            grpc_client_fingerprints = ["{fp}"]
            "#
            ),
            Path::new("/etc/t"),
        )
        .unwrap();
        let g = c.grpc.unwrap();
        assert_eq!(g.listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(g.cert, PathBuf::from("/etc/t/server.pem"));
        assert_eq!(g.key, PathBuf::from("/abs/server.key"));
        let acme = &c.grpc_clients["acme"];
        assert_eq!(acme.ca, Some(PathBuf::from("/etc/t/acme-ca.pem")));
        assert_eq!(acme.san.len(), 2);
        assert_eq!(c.grpc_clients["beta"].fingerprints, vec![[0xab; 32]]);
    }

    #[test]
    fn grpc_mistakes_are_named() {
        let err = |t: &str| {
            DaemonConfig::from_toml(t, Path::new("."))
                .unwrap_err()
                .to_string()
        };
        let org = "[[organization]]\nid = \"a\"\ngrpc_client_ca = \"ca.pem\"\n";
        assert!(err(&format!(
            "[grpc]\nlisten = \"127.0.0.1:1\"\nkey = \"k\"\n{org}"
        ))
        .contains("grpc.cert"));
        assert!(err(&format!(
            "[grpc]\nlisten = \"nowhere\"\ncert = \"c\"\nkey = \"k\"\n{org}"
        ))
        .contains("grpc.listen"));
        assert!(
            err("[grpc]\nlisten = \"127.0.0.1:1\"\ncert = \"c\"\nkey = \"k\"")
                .contains("no client could connect")
        );
        assert!(err("[grpc]\ncert = \"c\"").contains("grpc.listen"));
        assert!(
            err("[[organization]]\nid = \"a\"\ngrpc_client_san = [\"x.example\"]")
                .contains("needs grpc_client_ca")
        );
        assert!(
            err("[[organization]]\nid = \"a\"\ngrpc_client_fingerprints = [\"abc\"]")
                .contains("organization[0].grpc_client_fingerprints")
        );
        assert!(err(&format!("{org}grpc_client_san = [\"a.*.example\"]")).contains("`*`"));
        assert!(err(&format!("{org}grpc_client_san = [\"*\"]")).contains("`*`"));
        let fp = "0".repeat(64);
        assert!(err(&format!(
            "[[organization]]\nid = \"a\"\ngrpc_client_fingerprints = [\"{fp}\"]\n\
             [[organization]]\nid = \"b\"\ngrpc_client_fingerprints = [\"{fp}\"]"
        ))
        .contains("pinned by both `a` and `b`"));
    }

    #[test]
    fn san_patterns() {
        let yes = [
            ("*.agents.acme.example", "bot1.agents.acme.example"),
            ("*.agents.acme.example", "BOT1.Agents.ACME.example"),
            ("spiffe://acme/*", "spiffe://acme/agent/7"),
            ("bot.acme.example", "BOT.acme.example"),
            ("spiffe://acme/bot", "spiffe://acme/bot"),
        ];
        let no = [
            ("*.agents.acme.example", "agents.acme.example"),
            ("*.agents.acme.example", "a.b.agents.acme.example"),
            ("*.agents.acme.example", ".agents.acme.example"),
            ("*.agents.acme.example", "bot.agents.acme.example.evil"),
            ("spiffe://acme/*", "spiffe://acme/"),
            ("spiffe://acme/*", "spiffe://acme-evil/x"),
            ("spiffe://acme/bot", "spiffe://ACME/bot"),
            ("bot.acme.example", "bot.acme.example.evil"),
        ];
        for (p, n) in yes {
            assert!(san_matches(p, n), "{p} should match {n}");
        }
        for (p, n) in no {
            assert!(!san_matches(p, n), "{p} should not match {n}");
        }
    }

    // --- control plane: tests ---
    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn control_and_operators() {
        let c = DaemonConfig::from_toml(
            &format!(
                r#"
            [control]
            listen = "127.0.0.1:0"
            [[organization]]
            id = "acme"
            [[organization]]
            id = "globex"
            [[operator]]
            id = "alice"
            token_sha256 = "{HASH}"
            organizations = ["acme", "globex"]
            expires_at = "2026-12-31T23:59:59Z"
            [[operator]]
            id = "bob"
            token_sha256 = "{}"
            organizations = ["acme"]
            expires_at = 1700000000
            [[operator]]
            id = "carol"
            token_sha256 = "{}"
            organizations = ["globex"]
            expires_at = 2027-01-01T00:00:00+01:00
            "#,
                "a".repeat(64),
                "b".repeat(64)
            ),
            Path::new("/etc/tollgate"),
        )
        .unwrap();
        let control = c.control.unwrap();
        assert_eq!(control.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(control.tls, None);
        let ops = &c.operators;
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[0].id, "alice");
        assert_eq!(ops[0].token_sha256[0], 0x9f);
        assert_eq!(ops[0].organizations, ["acme", "globex"]);
        assert_eq!(ops[0].expires_at_ns, Some(1_798_761_599_000_000_000));
        assert_eq!(ops[1].expires_at_ns, Some(1_700_000_000_000_000_000));
        assert_eq!(ops[2].expires_at_ns, Some(1_798_758_000_000_000_000));
        // The token hash is not printed.
        assert!(!format!("{ops:?}").contains("9f86"));
        // Off by default.
        let c = DaemonConfig::from_toml("", Path::new(".")).unwrap();
        assert_eq!(c.control, None);
        // Relative certificate paths resolve against the file's directory.
        let c = DaemonConfig::from_toml(
            "[control]\nlisten = \"0.0.0.0:8700\"\ncert = \"c.pem\"\nkey = \"k.pem\"",
            Path::new("/etc/tollgate"),
        )
        .unwrap();
        assert_eq!(
            c.control.unwrap().tls.unwrap().cert,
            PathBuf::from("/etc/tollgate/c.pem")
        );
    }

    #[test]
    fn control_mistakes_are_named() {
        let err = |t: &str| {
            DaemonConfig::from_toml(t, Path::new("."))
                .unwrap_err()
                .to_string()
        };
        let e = err("[control]\nlisten = \"0.0.0.0:8700\"");
        assert!(
            e.contains("control.listen") && e.contains("TLS is required"),
            "{e}"
        );
        assert!(err("[control]\nlisten = \"[::]:8700\"").contains("TLS is required"));
        assert!(err("[control]\nlisten = \"localhost:8700\"").contains("not an IP address"));
        assert!(err("[control]\ncert = \"c.pem\"").contains("both"));
        let op = |extra: &str| {
            format!("[[operator]]\nid = \"alice\"\ntoken_sha256 = \"{HASH}\"\n{extra}")
        };
        assert!(err(&op("organizations = [\"nope\"]")).contains("not an organization"));
        assert!(err(&op("organizations = []")).contains("at least one"));
        assert!(err(&op(
            "organizations = [\"default\"]\nexpires_at = \"tomorrow\""
        ))
        .contains("operator[0].expires_at"));
        assert!(err(&op(
            "organizations = [\"default\"]\nexpires_at = \"2026-12-31T23:59:59\""
        ))
        .contains("RFC 3339"));
        assert!(err(
            "[[operator]]\nid = \"a\"\ntoken_sha256 = \"abc\"\norganizations = [\"default\"]"
        )
        .contains("operator[0].token_sha256"));
        let twice = format!(
            "{}\norganizations = [\"default\"]\n{}\norganizations = [\"default\"]",
            op(""),
            op("").replace("alice", "bob")
        );
        assert!(err(&twice).contains("same token"));
        assert!(err(&op("organizations = [\"default\"]\nsecret = 1")).contains("secret"));
    }

    #[test]
    fn rfc3339() {
        assert_eq!(rfc3339_ns("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_ns("1970-01-01t00:00:01.5z"), Some(1_500_000_000));
        assert_eq!(rfc3339_ns("1970-01-01 01:00:00+01:00"), Some(0));
        assert_eq!(
            rfc3339_ns("1969-12-31T23:59:59-00:00"),
            Some(-1_000_000_000)
        );
        assert_eq!(
            rfc3339_ns("2000-02-29T00:00:00Z"),
            Some(951_782_400_000_000_000)
        );
        for bad in [
            "",
            "2001-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00.Z",
            "2026-01-01T00:00:00.1234567890Z",
            "2026-01-01T00:00:00+1:00",
            "2026-01-01T00:00:00Zjunk",
            "２026-01-01T00:00:00Z",
        ] {
            assert_eq!(rfc3339_ns(bad), None, "{bad}");
        }
    }
    // --- end control plane: tests ---

    #[test]
    fn mistakes_are_named() {
        let err = |t: &str| {
            DaemonConfig::from_toml(t, Path::new("."))
                .unwrap_err()
                .to_string()
        };
        assert!(err("[guard.default]\nbudget_usdd = 1").contains("budget_usdd"));
        assert!(err("[guard.default]\nbudget_usd = -1").contains("guard.default.budget_usd"));
        assert!(err("[guard.default]\nhitl_mode = \"often\"").contains("often"));
        assert!(err("[limits]\nmax_sessions = 0").contains("limits.max_sessions"));
        assert!(err("[[organization]]\nid = \"a\"\nsecret = \"short\"").contains("at least 16"));
        assert!(err("[audit]\nfsync = \"sometimes\"").contains("audit.fsync"));
    }

    const FLEET_ORG: &str = "[[organization]]\nid = \"acme\"\nsecret = \"0123456789abcdef0123\"\noperator_secret = \"fedcba9876543210fedc\"\n";

    #[test]
    fn a_fleet_config_reads_redis_and_postgres() {
        let text = format!(
            "[state]\nbackend = \"redis\"\nurl = \"redis://:pw@127.0.0.1:6379/2\"\nkey_prefix = \"prod\"\ndurability = \"everysec\"\ncommand_timeout_ms = 500\ngrace_secs = 3\n\
             [audit]\nsink = \"postgres\"\nurl = \"postgres://tg:secret@db/tollgate\"\nchain_id = \"daemon-a\"\nmigrate_at_start = false\n{FLEET_ORG}"
        );
        let c = DaemonConfig::from_toml(&text, Path::new("/etc/tg")).unwrap();
        let StateBackend::Redis(r) = &c.state.backend else {
            panic!("{:?}", c.state.backend)
        };
        assert_eq!(r.key_prefix, "prod");
        assert_eq!(r.durability, RedisDurability::Everysec);
        assert_eq!(r.command_timeout, Duration::from_millis(500));
        assert_eq!(r.grace, Duration::from_secs(3));
        assert_eq!(r.sweep_interval, Duration::from_secs(5));
        let AuditSink::Postgres(p) = &c.audit.sink else {
            panic!("{:?}", c.audit.sink)
        };
        assert_eq!(p.schema, "tollgate");
        assert_eq!(p.chain_id.as_deref(), Some("daemon-a"));
        assert!(!p.migrate_at_start);
        assert_eq!(p.commit_linger, Duration::from_millis(1));
        for (ms, ok) in [(0, true), (7, true), (50, true), (51, false)] {
            let t = format!("{text}\n").replace(
                "migrate_at_start = false\n",
                &format!("migrate_at_start = false\ncommit_linger_ms = {ms}\n"),
            );
            let r = DaemonConfig::from_toml(&t, Path::new("/etc/tg"));
            match (r, ok) {
                (Ok(c), true) => {
                    let AuditSink::Postgres(p) = &c.audit.sink else {
                        panic!()
                    };
                    assert_eq!(p.commit_linger, Duration::from_millis(ms));
                }
                (Err(e), false) => assert!(e.to_string().contains("audit.commit_linger_ms")),
                (r, _) => panic!("commit_linger_ms = {ms}: {r:?}"),
            }
        }
        assert!(
            DaemonConfig::from_toml("[audit]\ncommit_linger_ms = 1", Path::new("."))
                .unwrap_err()
                .to_string()
                .contains("only for sink")
        );
        // Passwords never reach a log line through Debug.
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("secret@") && !shown.contains(":pw@"),
            "{shown}"
        );
        assert!(shown.contains("tg:***@db"), "{shown}");
    }

    /// The README's and docs/fleet.md's example parses as a fleet member's configuration.
    #[test]
    fn the_example_fleet_configuration_parses() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("acme.secret"), "0123456789abcdef0123\n").unwrap();
        std::fs::write(dir.path().join("acme.ops"), "fedcba9876543210fedc\n").unwrap();
        let text = include_str!("../../../examples/fleet.toml");
        let c = DaemonConfig::from_toml(text, dir.path()).unwrap();
        assert!(matches!(c.state.backend, StateBackend::Redis(_)));
        assert!(matches!(c.audit.sink, AuditSink::Postgres(_)));
    }

    #[test]
    fn fleet_mistakes_are_named() {
        let err = |t: &str| {
            DaemonConfig::from_toml(t, Path::new("."))
                .unwrap_err()
                .to_string()
        };
        let redis = "[state]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1\"\n";
        let pg = "[audit]\nsink = \"postgres\"\nurl = \"postgres://127.0.0.1/test\"\n";
        // One without the other.
        assert!(err(&format!("{redis}{FLEET_ORG}")).contains("go together"));
        assert!(err(&format!("{pg}{FLEET_ORG}")).contains("go together"));
        // Generated secrets cannot be shared by a fleet.
        assert!(err(&format!("{redis}{pg}")).contains("`default`"));
        assert!(err(&format!(
            "{redis}{pg}[[organization]]\nid = \"a\"\nsecret = \"0123456789abcdef0123\"\n"
        ))
        .contains("operator_secret"));
        assert!(err("[state]\nbackend = \"etcd\"").contains("state.backend"));
        assert!(err("[state]\nbackend = \"redis\"\nurl = \"http://x\"").contains("state.url"));
        assert!(err("[state]\nurl = \"redis://x\"").contains("state.url"));
        assert!(err("[audit]\nurl = \"postgres://x\"").contains("audit.url"));
        assert!(err(&format!("{redis}[audit]\nsink = \"postgres\"\nurl = \"postgres://x\"\nschema = \"Drop Table\"\n{FLEET_ORG}")).contains("audit.schema"));
        assert!(err(&format!("{redis}[audit]\nsink = \"postgres\"\nurl = \"postgres://x\"\nchain_id = \"a/b\"\n{FLEET_ORG}")).contains("audit.chain_id"));
        assert!(
            err("[state]\nbackend = \"redis\"\nurl = \"redis://x\"\ndurability = \"maybe\"")
                .contains("state.durability")
        );
        assert!(
            err("[state]\nbackend = \"redis\"\nurl = \"redis://x\"\nkey_prefix = \"{x}\"")
                .contains("state.key_prefix")
        );
        assert!(err("[audit]\nsink = \"s3\"").contains("audit.sink"));
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(redact_url("redis://:pw@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact_url("postgres://u:p@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("redis://h"), "redis://h");
    }
}
