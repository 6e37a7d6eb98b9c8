//! Fleet mode: `[state] backend = "redis"` with `[audit] sink = "postgres"`. Several daemons
//! share session state (and shared budgets) in Redis, and each writes its own signed chain
//! to PostgreSQL. The same [`Service`] serves it: only the store and the audit sink differ.
//!
//! The store writes a change to Redis first, marked unconfirmed; the journal commits the
//! change's entry (and its claim on the session's version) to PostgreSQL; only then is the
//! verdict given. A change whose entry never commits (its daemon died in between) is
//! settled by whichever daemon finds it: voided (a signed VOID in that daemon's chain, the
//! state reverted) or confirmed. ARCHITECTURE.md ("Fleet") gives the argument.

use std::collections::HashMap;
use std::sync::Arc;

use tollgate_audit::KeyId;
use tollgate_pg::{PgJournal, PgSettings};
use tollgate_redis::{RedisOptions, RedisStore};

use crate::config::{PostgresSettings, RedisDurability, RedisSettings};
use crate::{DaemonConfig, DaemonError, Service, SystemClock};

/// The chain a daemon writes when `[audit] chain_id` is not set: one chain per signing key.
pub fn default_chain_id(key: &tollgate_audit::VerifyingKey) -> String {
    format!("key-{}", KeyId::of(key.as_bytes()))
}

/// A CA certificate file (PEM), at most 1 MiB.
fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, DaemonError> {
    use std::io::Read as _;
    let io = |source| DaemonError::Io {
        what: "reading the Redis CA certificate",
        path: path.to_owned(),
        source,
    };
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(1 << 20 | 1)
        .read_to_end(&mut pem)
        .map_err(io)?;
    if pem.len() > 1 << 20 {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "larger than 1 MiB",
        )));
    }
    Ok(pem)
}

/// Open the audit chain in PostgreSQL (migrating first unless told not to), then the
/// Redis store over it, and check Redis's persistence against `durability`.
pub(crate) async fn open(
    config: Arc<DaemonConfig>,
    redis: &RedisSettings,
    pg: &PostgresSettings,
    signing_key: tollgate_audit::SigningKey,
    secrets: &HashMap<String, Vec<u8>>,
    operator_secrets: &HashMap<String, Vec<u8>>,
) -> Result<(Arc<Service<RedisStore>>, Vec<String>, String), DaemonError> {
    let mut settings = PgSettings::new(pg.url.clone()).with_schema(pg.schema.clone());
    settings.ca_file.clone_from(&pg.ca_file);
    settings.commit_linger = pg.commit_linger;
    if pg.migrate_at_start {
        let mut client = tollgate_pg::connect(&settings).await?;
        let report = tollgate_pg::migrate(&mut client, &settings.schema).await?;
        tracing::info!(?report, "postgres schema migrated");
    }
    let chain_id = pg
        .chain_id
        .clone()
        .unwrap_or_else(|| default_chain_id(&signing_key.verifying_key()));
    let journal = Arc::new(PgJournal::open(settings, signing_key, &chain_id).await?);
    tracing::info!(chain = %chain_id, "audit chain open in postgres");
    if journal.format_version() < 7
        && config.audit.params.mode() != tollgate_audit::ParamsMode::Hash
    {
        return Err(DaemonError::Unsupported(format!(
            "chain `{chain_id}` is format version {}, which cannot record params (version 7); \
             give the daemon a new chain_id (or key) to start a version-{} chain, or remove \
             [audit] params",
            journal.format_version(),
            tollgate_pg::CHAIN_FORMAT_VERSION
        )));
    }
    // Format version 8 records the probabilistic layer's draw in every verdict of a
    // guard that has the layer on; an older chain cannot hold it.
    let draws = std::iter::once(&config.default_guard)
        .chain(config.agent_guards.values())
        .any(|g| g.probabilistic_deny);
    if journal.format_version() < 8 && draws {
        return Err(DaemonError::Unsupported(format!(
            "chain `{chain_id}` is format version {}, which cannot record the probabilistic \
             layer's draws (version 8); give the daemon a new chain_id (or key) to start a \
             version-{} chain, or set probabilistic_deny = false",
            journal.format_version(),
            tollgate_pg::CHAIN_FORMAT_VERSION
        )));
    }

    let mut opts = RedisOptions::new(redis.url.clone());
    if let Some(path) = &redis.ca_file {
        opts.ca_pem = Some(read_pem(path)?);
    }
    opts.key_prefix.clone_from(&redis.key_prefix);
    opts.command_timeout = redis.command_timeout;
    opts.session_ttl = redis.session_ttl;
    opts.sweep_interval = redis.sweep_interval;
    opts.grace = redis.grace;
    let store = RedisStore::connect(opts, journal.clone(), journal.clone()).await?;
    tracing::info!(daemon = %store.daemon_id(), "session state in redis");

    let mut warnings = Vec::new();
    if !matches!(redis.durability, RedisDurability::None) {
        let d = store.server_durability().await?;
        let weaker = match redis.durability {
            RedisDurability::Always => !d.is_strict(),
            RedisDurability::Everysec => {
                d.appendonly != "yes" || !matches!(d.appendfsync.as_str(), "always" | "everysec")
            }
            RedisDurability::None => false,
        };
        if weaker {
            let want = match redis.durability {
                RedisDurability::Always => "appendonly yes, appendfsync always",
                _ => "appendonly yes, appendfsync everysec or always",
            };
            let w = format!(
                "redis persistence is weaker than [state] durability: the server has \
                 appendonly {}, appendfsync {}; expected {want}. A Redis crash can lose \
                 verdicts already given (see docs/fleet.md)",
                d.appendonly, d.appendfsync
            );
            tracing::warn!("{w}");
            warnings.push(w);
        }
    }
    // A daemon of a fleet counts only the sessions it opened itself since it started: it
    // misses the other daemons' sessions and never hears of those Redis expired, so a
    // quota kept from that count would refuse an organization too early on one daemon and
    // too late on another, and leak places until a restart. It is not enforced, and said so.
    let mut config = config;
    if !config.session_quotas.is_empty() {
        let orgs: Vec<&str> = config.session_quotas.keys().map(String::as_str).collect();
        let w = format!(
            "[[organization]] max_sessions is not enforced in a fleet (organizations {}): \
             each daemon sees only the sessions it opened, not the other daemons' nor those \
             Redis expired; bound an organization with its registration rate limits and \
             the sessions' TTL instead (see docs/fleet.md)",
            orgs.join(", ")
        );
        tracing::warn!("{w}");
        warnings.push(w);
        Arc::make_mut(&mut config).session_quotas.clear();
    }
    let service = Arc::new(Service::new(
        config,
        store,
        journal,
        Arc::new(SystemClock),
        secrets,
        operator_secrets,
    ));
    Ok((service, warnings, chain_id))
}
