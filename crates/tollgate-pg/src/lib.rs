//! # tollgate-pg: the signed audit trail in PostgreSQL
//!
//! Each daemon of a fleet writes its own signed, chain-linked audit chain into one
//! PostgreSQL database. The rows hold the exact record bytes of the file log
//! (docs/audit-format.md, format version 8 for a chain registered now), signed and linked through the same
//! [`tollgate_audit::Chainer`] as the file writer, so the file verifier checks them.
//! docs/postgres.md describes the schema, roles, TLS and what a break looks like.
//!
//! - [`migrate`]: versioned, idempotent migrations under an advisory lock; append-only
//!   triggers; the `tollgate_writer` role with INSERT and SELECT only.
//! - [`PgJournal`]: one chain, written by one task with group commit (one transaction
//!   per batch); a submitted entry completes only after its COMMIT. It is the store's
//!   [`tollgate_store::Journal`] and [`tollgate_store::Arbiter`]: every entry also takes
//!   its place `(session_id, session_seq)` in `claims`, and settling a place that no
//!   entry holds writes a signed void (record kind 7). [`PgJournal::submit_policy_set`]
//!   writes a daemon's policy-set entry (record kind 9), which takes no place.
//! - [`verify()`], [`verify_chain`], [`list_chains`]: verify chains with the registered
//!   (or given) public keys; export is verify with a visitor.
//!
//! What it does **not** do: it decides nothing and holds no session state (that is the
//! store's, e.g. Redis); it never updates or deletes a row; it does not rotate keys
//! inside a chain (a new key is a new chain); it does not create databases or login
//! roles; it is not wired into the daemon here (`tollgate-daemon`'s fleet mode does that).

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod conn;
mod journal;
mod schema;
mod verify;

pub use conn::{
    check_schema, connect, PgSettings, DEFAULT_COMMIT_LINGER, DEFAULT_SCHEMA, MAX_SCHEMA_LEN,
};
pub use journal::{check_chain_id, PgJournal, PgStats, CHAIN_FORMAT_VERSION, MAX_CHAIN_ID_BYTES};
pub use schema::{migrate, migrate_with, MigrateReport, RoleOutcome, SCHEMA_VERSION, WRITER_ROLE};
pub use verify::{
    chain_name, count_entries, list_chains, verify, verify_chain, ChainInfo, ChainReport,
};

/// Why a PostgreSQL operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PgError {
    /// The URL does not parse.
    #[error("bad postgres url: {0}")]
    Url(String),
    /// The TLS settings cannot be used (the CA file).
    #[error("postgres tls: {0}")]
    Tls(String),
    /// The schema name is not 1-63 of `[a-z0-9_]` starting with a letter or `_`.
    #[error(
        "bad schema name {0:?}: use 1-63 lowercase letters, digits or _, not starting with a digit"
    )]
    Schema(String),
    /// The chain id is empty, longer than 256 bytes or holds a control character.
    #[error("bad chain id {0:?}: 1-256 bytes, no control characters")]
    ChainId(String),
    /// A database call failed.
    #[error("postgres ({what}): {message}")]
    Db {
        /// What was being done.
        what: &'static str,
        /// The server's or driver's message (with the SQLSTATE when there is one).
        message: String,
    },
    /// Another journal (another daemon) holds the chain's advisory lock.
    #[error("chain `{0}` is already being written by another daemon (its advisory lock is held); give each daemon its own chain id")]
    ChainLocked(String),
    /// The schema has not been migrated (run `tollgate migrate`).
    #[error("schema `{0}` is not migrated to this version: run `tollgate migrate`")]
    NotMigrated(String),
    /// The database's schema is newer than this build knows.
    #[error("schema version {found} is newer than this build knows ({known})")]
    SchemaTooNew {
        /// The database's version.
        found: i32,
        /// This build's.
        known: i32,
    },
    /// The chain is registered with another key.
    #[error("chain `{chain_id}` is registered with key `{registered}`, not `{given}` (a new key needs a new chain id)")]
    KeyMismatch {
        /// The chain.
        chain_id: String,
        /// Its registered key id.
        registered: String,
        /// The key given.
        given: String,
    },
    /// The chain's stored tail cannot be continued.
    #[error("chain `{chain_id}` is broken: {what}; run `tollgate audit verify --postgres`")]
    Broken {
        /// The chain.
        chain_id: String,
        /// What is wrong.
        what: String,
    },
    /// No chain has that id.
    #[error("no chain `{0}`")]
    NoSuchChain(String),
    /// Called outside a tokio runtime (connections and the writer are tokio tasks).
    #[error("tollgate-pg needs a tokio runtime (called outside one)")]
    NoRuntime,
}

impl PgError {
    /// A mapper from a driver error, naming what was being done.
    pub(crate) fn db(what: &'static str) -> impl Fn(tokio_postgres::Error) -> PgError {
        move |e| PgError::Db {
            what,
            message: match e.as_db_error() {
                Some(d) => format!("{}: {}", d.code().code(), d.message()),
                None => e.to_string(),
            },
        }
    }
}
