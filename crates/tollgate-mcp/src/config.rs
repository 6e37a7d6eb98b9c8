//! `mcp.toml`: the gateway's configuration. Every table is checked when it is read:
//! unknown keys, an upstream with both or neither of `command` and `url`, a duplicate
//! upstream name, a negative or non-finite cost, a listen address off loopback are errors,
//! each naming its key. Paths are relative to the configuration file's directory.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tollgate_core::{GuardConfig, Money};
use tollgate_daemon::config::GuardTable;

/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The default bound on one MCP message, either direction, either side (4 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

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
    Toml(String),
    /// A key has a value the gateway cannot use.
    #[error("`{key}`: {message}")]
    Invalid {
        /// The key, dotted (`upstream[1].command`).
        key: String,
        /// What is wrong.
        message: String,
    },
}

fn bad(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// Where verdicts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// In process: one [`tollgate_client::Guard`], with an optional local signed audit log.
    Library(LibrarySettings),
    /// Through `tollgate serve`: one daemon session for the gateway's life.
    Daemon(DaemonSettings),
}

/// `[library]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibrarySettings {
    /// The guard (`[guard]` over the embedded defaults).
    pub guard: GuardConfig,
    /// The local audit log's directory, if any.
    pub audit_dir: Option<PathBuf>,
    /// The Ed25519 signing key file (`tollgate keygen`); required with `audit_dir`.
    pub audit_key: Option<PathBuf>,
    /// What the local log's verdicts record of each call's params (`audit_params`:
    /// `hash`, the default, `full` or `redacted`, with the `audit_redact` paths), as the
    /// daemon's `[audit] params` and `redact` (docs/audit-format.md, "Recorded params").
    pub audit_params: tollgate_audit::params::Recorder,
    /// The session id written to audit entries.
    pub session_id: String,
    /// The agent id written to audit entries.
    pub agent_id: String,
    /// The organization id written to audit entries.
    pub organization_id: String,
    /// `[policy]`: the Cedar policy set every call is decided with (paths resolved
    /// against mcp.toml's directory); loaded when the gateway starts.
    pub policy: Option<tollgate_policy::files::Settings>,
}

/// `[daemon]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSettings {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// The file holding the organization's agents' secret.
    pub secret_file: PathBuf,
    /// The organization.
    pub organization: String,
    /// The agent id the gateway registers as.
    pub agent_id: String,
    /// How long to wait for any reply from the daemon before failing closed.
    pub timeout: Duration,
    /// Whether operators are shown a held call's arguments.
    pub share_params: bool,
}

/// What the host gets for a DENY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDeny {
    /// A tool result with `isError: true` and a text the model can act on (default).
    Result,
    /// A JSON-RPC error (code [`crate::gateway::DENIED_ERROR_CODE`]).
    Error,
}

/// One `[[upstream]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Its name: the tools' namespace when there is more than one upstream.
    pub name: String,
    /// How to reach it.
    pub transport: UpstreamTransport,
    /// Its own tool names the host must not see (nor call).
    pub hide: Vec<String>,
    /// How long one of its calls may take (default: `gateway.tool_timeout_secs`).
    pub timeout: Duration,
}

/// How an upstream is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamTransport {
    /// A child process speaking MCP on its stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Environment variables added to the gateway's own.
        env: BTreeMap<String, String>,
        /// Its working directory (default: the gateway's).
        cwd: Option<PathBuf>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// The URL (`http://` or `https://`).
        url: String,
    },
}

/// One `[tools.UPSTREAM."TOOL"]` entry (TOOL as the upstream names it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToolSettings {
    /// The estimate every call of this tool is checked with, in dollars (default 0).
    pub cost_usd: f64,
    /// The actual cost settled after a call, when the upstream reports none.
    pub actual_cost_usd: Option<f64>,
    /// How long one call may take (overrides the upstream's).
    pub timeout: Option<Duration>,
}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Library or daemon mode.
    pub mode: Mode,
    /// Also serve Streamable HTTP at `http://ADDR/mcp` (loopback only).
    pub listen: Option<SocketAddr>,
    /// Browser origins the HTTP endpoint accepts besides loopback ones
    /// (`gateway.allowed_origins`, e.g. `https://app.example:443`); a request with any other
    /// `Origin` gets HTTP 403.
    pub allowed_origins: Vec<String>,
    /// What a DENY looks like to the host.
    pub on_deny: OnDeny,
    /// Library mode: ask the host's user through MCP elicitation when a call is held.
    pub elicitation: bool,
    /// How long a held call waits for a human before it is denied.
    pub hitl_timeout: Duration,
    /// While a call waits (for a human, or for its upstream), how often the host is sent a
    /// progress notification, when its request carried a progress token.
    pub progress_interval: Duration,
    /// Library mode: the operator id an elicitation answer is recorded under.
    pub operator_id: String,
    /// The bound on one MCP message, each direction, host and upstream side.
    pub max_message_bytes: usize,
    /// Starting an upstream (process start and MCP initialization) may take this long.
    pub connect_timeout: Duration,
    /// What joins an upstream's name and its tool's in the names the host sees when there
    /// are several upstreams (default `__`; see [`crate::names`]).
    pub tool_separator: String,
    /// The upstreams, in file order.
    pub upstreams: Vec<UpstreamConfig>,
    /// The per-tool cost table and timeouts, keyed by (upstream name, the upstream's own
    /// tool name): adding an upstream cannot change what an entry matches.
    pub tools: BTreeMap<(String, String), ToolSettings>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    gateway: GatewaySection,
    library: Option<LibrarySection>,
    daemon: Option<DaemonSection>,
    guard: Option<GuardTable>,
    #[serde(default)]
    upstream: Vec<UpstreamSection>,
    #[serde(default)]
    tools: BTreeMap<String, toml::Table>,
    policy: Option<tollgate_policy::files::Section>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewaySection {
    mode: Option<String>,
    listen: Option<String>,
    #[serde(default)]
    allowed_origins: Vec<String>,
    on_deny: Option<String>,
    elicitation: Option<bool>,
    hitl_timeout_secs: Option<u64>,
    operator_id: Option<String>,
    max_message_bytes: Option<usize>,
    tool_timeout_secs: Option<u64>,
    connect_timeout_secs: Option<u64>,
    tool_separator: Option<String>,
    progress_interval_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LibrarySection {
    audit_dir: Option<PathBuf>,
    audit_key: Option<PathBuf>,
    audit_params: Option<String>,
    audit_redact: Option<Vec<String>>,
    session_id: Option<String>,
    agent_id: Option<String>,
    organization_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DaemonSection {
    socket: Option<PathBuf>,
    secret_file: Option<PathBuf>,
    organization: Option<String>,
    agent_id: Option<String>,
    timeout_ms: Option<u64>,
    share_params: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamSection {
    name: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    #[serde(default)]
    hide: Vec<String>,
    timeout_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolSection {
    cost_usd: Option<f64>,
    actual_cost_usd: Option<f64>,
    timeout_secs: Option<u64>,
}

/// The guard a library-mode gateway runs without a `[guard]` table: the daemon's embedded
/// default (budget $1.00, `max_repeat_calls = 3`, conservative settlement, HITL never).
pub fn default_guard() -> GuardConfig {
    GuardConfig {
        budget: Money(1_000_000_000),
        max_repeat_calls: 3,
        ..GuardConfig::default()
    }
}

fn cost(key: &str, v: f64) -> Result<f64, ConfigError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(bad(key, "must be a finite number of dollars, at least 0"))
    }
}

fn secs(key: &str, v: Option<u64>, default: u64) -> Result<Duration, ConfigError> {
    match v {
        None => Ok(Duration::from_secs(default)),
        Some(0) => Err(bad(key, "must be greater than zero")),
        Some(s) if s > 86_400 * 7 => Err(bad(key, "must be at most a week (604800)")),
        Some(s) => Ok(Duration::from_secs(s)),
    }
}

/// An id (agent, organization, session), checked with the daemon's one rule
/// (`tollgate_core::check_id`).
fn word(key: &str, v: Option<&str>, default: &str) -> Result<String, ConfigError> {
    let w = v.unwrap_or(default);
    tollgate_core::check_id(w).map_err(|e| bad(key, e.to_string()))?;
    Ok(w.to_owned())
}

/// An operator id, as the daemon reads one: 1 to 128 bytes, no control character.
fn operator_word(key: &str, v: Option<&str>, default: &str) -> Result<String, ConfigError> {
    let w = v.unwrap_or(default);
    if w.is_empty() || w.len() > 128 || w.chars().any(char::is_control) {
        return Err(bad(
            key,
            "must be 1 to 128 bytes, without control characters",
        ));
    }
    Ok(w.to_owned())
}

/// An upstream name: 1-64 ASCII letters, digits, `_` or `-` (the characters of a name a
/// host accepts).
pub fn valid_upstream_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Config {
    /// Read and check `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
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
        Config::from_toml(&text, base)
    }

    /// Parse and check `text`; relative paths are taken from `base`.
    pub fn from_toml(text: &str, base: &Path) -> Result<Config, ConfigError> {
        let file: File = toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))?;
        let rel = |p: &Path| {
            if p.is_absolute() {
                p.to_owned()
            } else {
                base.join(p)
            }
        };
        let g = &file.gateway;
        let mode_word = g.mode.as_deref().unwrap_or("library");
        let mode = match mode_word {
            "library" => {
                if file.daemon.is_some() {
                    return Err(bad("daemon", "is for mode = \"daemon\" only"));
                }
                let l = file.library.unwrap_or_default();
                let guard = match &file.guard {
                    Some(t) => guard(t, &default_guard())?,
                    None => default_guard(),
                };
                if l.audit_dir.is_some() != l.audit_key.is_some() {
                    return Err(bad(
                        "library.audit_key",
                        "audit_dir and audit_key go together (make a key with `tollgate keygen`)",
                    ));
                }
                let policy = file
                    .policy
                    .map(|p| tollgate_policy::files::Settings::from_section(p, base))
                    .transpose()
                    .map_err(|e| bad(e.key, e.message))?;
                let audit_params = tollgate_audit::params::Recorder::from_setting(
                    l.audit_params.as_deref(),
                    l.audit_redact.as_deref().unwrap_or(&[]),
                )
                .map_err(|e| {
                    bad(
                        e.key("library.audit_params", "library.audit_redact"),
                        e.to_string(),
                    )
                })?;
                if l.audit_dir.is_none()
                    && (audit_params.mode() != tollgate_audit::ParamsMode::Hash
                        || l.audit_redact.is_some())
                {
                    return Err(bad(
                        "library.audit_params",
                        "records params in the local audit log: set audit_dir and audit_key",
                    ));
                }
                let default_session = format!("mcp-{}", std::process::id());
                Mode::Library(LibrarySettings {
                    guard,
                    audit_dir: l.audit_dir.as_deref().map(rel),
                    audit_key: l.audit_key.as_deref().map(rel),
                    audit_params,
                    session_id: word(
                        "library.session_id",
                        l.session_id.as_deref(),
                        &default_session,
                    )?,
                    agent_id: word("library.agent_id", l.agent_id.as_deref(), "mcp-gateway")?,
                    organization_id: word(
                        "library.organization_id",
                        l.organization_id.as_deref(),
                        "local",
                    )?,
                    policy,
                })
            }
            "daemon" => {
                if file.library.is_some() {
                    return Err(bad("library", "is for mode = \"library\" only"));
                }
                if file.guard.is_some() {
                    return Err(bad(
                        "guard",
                        "in daemon mode the daemon's configuration holds the guard",
                    ));
                }
                if file.policy.is_some() {
                    return Err(bad(
                        "policy",
                        "in daemon mode the daemon's [policy] decides: put the section in \
                         tollgate serve's configuration",
                    ));
                }
                let d = file.daemon.unwrap_or_default();
                let organization =
                    word("daemon.organization", d.organization.as_deref(), "default")?;
                let socket = d
                    .socket
                    .as_deref()
                    .map_or_else(|| base.join("tollgate-data/tollgate.sock"), rel);
                let secret_file = d.secret_file.as_deref().map_or_else(
                    || base.join(format!("tollgate-data/secrets/{organization}.secret")),
                    rel,
                );
                let timeout_ms = d.timeout_ms.unwrap_or(2000);
                if timeout_ms == 0 || timeout_ms > 600_000 {
                    return Err(bad("daemon.timeout_ms", "must be 1 to 600000"));
                }
                Mode::Daemon(DaemonSettings {
                    socket,
                    secret_file,
                    organization,
                    agent_id: word("daemon.agent_id", d.agent_id.as_deref(), "mcp-gateway")?,
                    timeout: Duration::from_millis(timeout_ms),
                    share_params: d.share_params.unwrap_or(true),
                })
            }
            other => {
                return Err(bad(
                    "gateway.mode",
                    format!("`{other}` is neither \"library\" nor \"daemon\""),
                ))
            }
        };
        let listen = match &g.listen {
            None => None,
            Some(a) => {
                let addr: SocketAddr = a
                    .parse()
                    .map_err(|_| bad("gateway.listen", format!("`{a}` is not an IP:port")))?;
                if !addr.ip().is_loopback() {
                    return Err(bad(
                        "gateway.listen",
                        "must be a loopback address: the HTTP endpoint has no authentication",
                    ));
                }
                Some(addr)
            }
        };
        for o in &g.allowed_origins {
            let ok = o.split_once("://").is_some_and(|(scheme, rest)| {
                matches!(scheme, "http" | "https")
                    && !rest.is_empty()
                    && !rest.contains(['/', '?', '#', ' '])
            });
            if !ok {
                return Err(bad(
                    "gateway.allowed_origins",
                    format!("`{o}` is not an origin like https://app.example:443 (scheme, host, optional port or :*)"),
                ));
            }
        }
        let on_deny = match g.on_deny.as_deref().unwrap_or("result") {
            "result" => OnDeny::Result,
            "error" => OnDeny::Error,
            other => {
                return Err(bad(
                    "gateway.on_deny",
                    format!("`{other}` is neither \"result\" nor \"error\""),
                ))
            }
        };
        let max_message_bytes = g.max_message_bytes.unwrap_or(DEFAULT_MAX_MESSAGE_BYTES);
        if !(1024..=(64 << 20)).contains(&max_message_bytes) {
            return Err(bad(
                "gateway.max_message_bytes",
                "must be 1024 to 67108864 (64 MiB)",
            ));
        }
        let tool_timeout = secs("gateway.tool_timeout_secs", g.tool_timeout_secs, 60)?;
        let mut upstreams: Vec<UpstreamConfig> = Vec::new();
        for (i, u) in file.upstream.iter().enumerate() {
            let k = |name: &str| format!("upstream[{i}].{name}");
            let name = u.name.clone().unwrap_or_default();
            if !valid_upstream_name(&name) {
                return Err(bad(
                    k("name"),
                    "required: 1-64 ASCII letters, digits, `_` or `-`",
                ));
            }
            if upstreams.iter().any(|o| o.name == name) {
                return Err(bad(k("name"), format!("`{name}` is used twice")));
            }
            let transport = match (&u.command, &u.url) {
                (Some(command), None) => {
                    if command.is_empty() {
                        return Err(bad(k("command"), "is empty"));
                    }
                    UpstreamTransport::Stdio {
                        command: command.clone(),
                        args: u.args.clone(),
                        env: u.env.clone(),
                        cwd: u.cwd.as_deref().map(rel),
                    }
                }
                (None, Some(url)) => {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err(bad(k("url"), "must start with http:// or https://"));
                    }
                    if !u.args.is_empty() || !u.env.is_empty() || u.cwd.is_some() {
                        return Err(bad(k("url"), "args, env and cwd are for command only"));
                    }
                    UpstreamTransport::Http { url: url.clone() }
                }
                _ => return Err(bad(k("command"), "give exactly one of command and url")),
            };
            upstreams.push(UpstreamConfig {
                name,
                transport,
                hide: u.hide.clone(),
                timeout: match u.timeout_secs {
                    None => tool_timeout,
                    some => secs(&k("timeout_secs"), some, 60)?,
                },
            });
        }
        if upstreams.is_empty() {
            return Err(bad("upstream", "at least one [[upstream]] is required"));
        }
        let tool_separator = g.tool_separator.clone().unwrap_or_else(|| "__".into());
        if tool_separator.is_empty()
            || tool_separator.len() > 4
            || !crate::names::host_safe(&tool_separator)
        {
            return Err(bad(
                "gateway.tool_separator",
                "must be 1 to 4 of A-Z a-z 0-9 _ - (hosts refuse other characters in tool names)",
            ));
        }
        let mut tools = BTreeMap::new();
        for (upstream, table) in &file.tools {
            let Some(u) = upstreams.iter().find(|u| u.name == *upstream) else {
                let settings = ["cost_usd", "actual_cost_usd", "timeout_secs"];
                let message = if table.keys().any(|k| settings.contains(&k.as_str())) {
                    format!(
                        "per-tool settings are keyed by upstream and the upstream's own tool \
                         name: write [tools.UPSTREAM.\"{upstream}\"] (or \
                         [tools.UPSTREAM.\"TOOL\"] for a namespaced name)"
                    )
                } else {
                    format!("`{upstream}` is no configured [[upstream]] name")
                };
                return Err(bad(format!("tools.{upstream}"), message));
            };
            for (name, value) in table {
                let k = |f: &str| format!("tools.{upstream}.\"{name}\".{f}");
                let t: ToolSection = value.clone().try_into().map_err(|e: toml::de::Error| {
                    bad(
                        format!("tools.{upstream}.\"{name}\""),
                        e.message().to_owned(),
                    )
                })?;
                if u.hide.iter().any(|h| h == name) {
                    return Err(bad(
                        format!("tools.{upstream}.\"{name}\""),
                        "names a hidden tool (hide = [...]): it is never called",
                    ));
                }
                tools.insert(
                    (upstream.clone(), name.clone()),
                    ToolSettings {
                        cost_usd: cost(&k("cost_usd"), t.cost_usd.unwrap_or(0.0))?,
                        actual_cost_usd: t
                            .actual_cost_usd
                            .map(|v| cost(&k("actual_cost_usd"), v))
                            .transpose()?,
                        timeout: t
                            .timeout_secs
                            .map(|s| secs(&k("timeout_secs"), Some(s), 60))
                            .transpose()?,
                    },
                );
            }
        }
        Ok(Config {
            mode,
            listen,
            allowed_origins: g.allowed_origins.clone(),
            on_deny,
            elicitation: g.elicitation.unwrap_or(true),
            hitl_timeout: secs("gateway.hitl_timeout_secs", g.hitl_timeout_secs, 300)?,
            progress_interval: secs(
                "gateway.progress_interval_secs",
                g.progress_interval_secs,
                10,
            )?,
            operator_id: operator_word(
                "gateway.operator_id",
                g.operator_id.as_deref(),
                "mcp-host",
            )?,
            max_message_bytes,
            connect_timeout: secs("gateway.connect_timeout_secs", g.connect_timeout_secs, 10)?,
            tool_separator,
            upstreams,
            tools,
        })
    }

    /// The settings of upstream `upstream`'s tool `own` (its own name), or the defaults
    /// (cost 0).
    pub fn tool(&self, upstream: &str, own: &str) -> ToolSettings {
        self.tools
            .get(&(upstream.to_owned(), own.to_owned()))
            .copied()
            .unwrap_or(ToolSettings {
                cost_usd: 0.0,
                actual_cost_usd: None,
                timeout: None,
            })
    }
}

/// `[guard]`: the same keys, parsed by the same code, as `tollgate serve`'s
/// `[guard.default]`.
fn guard(t: &GuardTable, base: &GuardConfig) -> Result<GuardConfig, ConfigError> {
    tollgate_daemon::config::guard(t, base, "guard").map_err(|e| match e {
        tollgate_daemon::config::ConfigError::Value { key, message } => bad(key, message),
        other => bad("guard", other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml(text, Path::new("/etc/tg"))
    }

    const ONE: &str = "[[upstream]]\nname = \"a\"\ncommand = \"srv\"\n";

    #[test]
    fn minimal_is_library_mode_with_the_default_guard() {
        let c = parse(ONE).unwrap();
        let Mode::Library(l) = &c.mode else {
            panic!("library mode expected")
        };
        assert_eq!(l.guard, default_guard());
        assert_eq!(c.on_deny, OnDeny::Result);
        assert_eq!(c.tool("a", "anything").cost_usd, 0.0);
        assert_eq!(c.tool_separator, "__");
        assert_eq!(c.max_message_bytes, DEFAULT_MAX_MESSAGE_BYTES);
    }

    #[test]
    fn every_mistake_names_its_key() {
        let err = |t: &str| parse(t).unwrap_err().to_string();
        assert!(err("").contains("at least one [[upstream]]"));
        assert!(err("[[upstream]]\nname = \"a.b\"\ncommand = \"x\"").contains("upstream[0].name"));
        assert!(err("[[upstream]]\nname = \"a\"").contains("exactly one of command and url"));
        assert!(err(&format!(
            "{ONE}[[upstream]]\nname = \"a\"\nurl = \"http://x\""
        ))
        .contains("used twice"));
        assert!(
            err(&format!("{ONE}[tools.a.t]\ncost_usd = -1.0")).contains("tools.a.\"t\".cost_usd")
        );
        assert!(err(&format!("{ONE}[tools.a.t]\ncost_us = 1.0")).contains("cost_us"));
        // The old, flat form matches by a name that changes when an upstream is added:
        // refused with the new form named.
        assert!(err(&format!("{ONE}[tools.t]\ncost_usd = 1.0")).contains("[tools.UPSTREAM.\"t\"]"));
        assert!(err(&format!("{ONE}[tools.b.t]\ncost_usd = 1.0")).contains("no configured"));
        assert!(err(
            "[[upstream]]\nname = \"a\"\ncommand = \"srv\"\nhide = [\"t\"]\n[tools.a.t]\ncost_usd = 1.0"
        )
        .contains("hidden"));
        assert!(err(&format!("{ONE}[gateway]\ntool_separator = \".\"")).contains("tool_separator"));
        assert!(err(&format!("{ONE}[gateway]\nlisten = \"0.0.0.0:1\"")).contains("loopback"));
        assert!(err(&format!("{ONE}[gateway]\nmodee = 1")).contains("modee"));
        assert!(err(&format!("{ONE}[guard]\nbudget_usdd = 1")).contains("budget_usdd"));
        assert!(err(&format!(
            "{ONE}[gateway]\nmode = \"daemon\"\n[guard]\nbudget_usd = 1.0"
        ))
        .contains("daemon's configuration holds the guard"));
        assert!(err(&format!("{ONE}[library]\naudit_dir = \"x\"")).contains("audit_key"));
        // [library] audit_params / audit_redact: the daemon's [audit] params and redact,
        // for the local log only.
        let audited = "[library]\naudit_dir = \"x\"\naudit_key = \"k\"\n";
        assert!(
            err(&format!("{ONE}{audited}audit_params = \"all\"")).contains("library.audit_params")
        );
        assert!(err(&format!("{ONE}[library]\naudit_params = \"full\"")).contains("set audit_dir"));
        assert!(err(&format!(
            "{ONE}{audited}audit_params = \"full\"\naudit_redact = [\"a\"]"
        ))
        .contains("library.audit_redact"));
        let c = parse(&format!(
            "{ONE}{audited}audit_params = \"redacted\"\naudit_redact = [\"card.number\"]"
        ))
        .unwrap();
        let Mode::Library(l) = c.mode else { panic!() };
        assert_eq!(l.audit_params.mode(), tollgate_audit::ParamsMode::Redacted);
        // [policy]: the shared section's checks, and in daemon mode the daemon's decides.
        assert!(err(&format!("{ONE}[policy]\nfiles = []")).contains("policy.files"));
        assert!(
            err(&format!("{ONE}[policy]\nfiles = [\"a\"]\ndefault = \"no\""))
                .contains("policy.default")
        );
        assert!(err(&format!("{ONE}[policy]\nfiles = [\"a\"]\nfile = 1")).contains("file"));
        assert!(err(&format!(
            "{ONE}[gateway]\nmode = \"daemon\"\n[policy]\nfiles = [\"a.cedar\"]"
        ))
        .contains("the daemon's [policy] decides"));
        // Ids follow the daemon's one rule (issue 15 §3): no trailing space, no control
        // character, no non-ASCII space.
        for bad in ["research-bot ", "a\\u0001b", "bot\\u00a0", "bot\\u3000", ""] {
            assert!(
                err(&format!("{ONE}[library]\nagent_id = \"{bad}\"")).contains("library.agent_id"),
                "{bad:?}"
            );
            assert!(
                err(&format!(
                    "{ONE}[gateway]\nmode = \"daemon\"\n[daemon]\nagent_id = \"{bad}\""
                ))
                .contains("daemon.agent_id"),
                "{bad:?}"
            );
        }
        assert!(err(&format!(
            "{ONE}[gateway]\nmode = \"daemon\"\n[daemon]\norganization = \"a b\""
        ))
        .contains("daemon.organization"));
    }

    #[test]
    fn policy_paths_are_relative_to_the_config_directory() {
        let c = parse(&format!(
            "{ONE}[policy]\nfiles = [\"a.cedar\", \"/abs/b.cedar\"]\ndefault = \"deny\"\n\
             schema = \"s.cedarschema\""
        ))
        .unwrap();
        let Mode::Library(l) = &c.mode else {
            panic!("library mode expected")
        };
        let p = l.policy.as_ref().unwrap();
        assert_eq!(
            p.files,
            vec![
                PathBuf::from("/etc/tg/a.cedar"),
                PathBuf::from("/abs/b.cedar")
            ]
        );
        assert_eq!(
            p.schema.as_deref(),
            Some(Path::new("/etc/tg/s.cedarschema"))
        );
        assert_eq!(p.default, tollgate_policy::DefaultEffect::Deny);
    }

    #[test]
    fn guard_keys_are_the_daemons() {
        let c = parse(&format!(
            "{ONE}[guard]\nbudget_usd = 0.5\nmax_repeat_calls = 2\nhitl_mode = \"always\""
        ))
        .unwrap();
        let Mode::Library(l) = &c.mode else {
            panic!("library mode expected")
        };
        assert_eq!(l.guard.budget, Money(500_000_000));
        assert_eq!(l.guard.max_repeat_calls, 2);
        assert_eq!(l.guard.hitl_mode, tollgate_core::HitlMode::Always);
    }

    #[test]
    fn daemon_paths_default_under_the_config_directory() {
        let c = parse(&format!("{ONE}[gateway]\nmode = \"daemon\"")).unwrap();
        let Mode::Daemon(d) = &c.mode else {
            panic!("daemon mode expected")
        };
        assert_eq!(d.socket, Path::new("/etc/tg/tollgate-data/tollgate.sock"));
        assert_eq!(
            d.secret_file,
            Path::new("/etc/tg/tollgate-data/secrets/default.secret")
        );
    }
}
