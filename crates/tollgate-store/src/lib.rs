//! # tollgate-store: session state stores behind one trait
//!
//! The daemon keeps each session's decision state ([`tollgate_core::SessionState`]),
//! its call numbering and heartbeat, and budgets shared across an agent's or an
//! organization's sessions, in a [`SessionStore`]. The one operation that matters is
//! [`SessionStore::apply`]: an atomic check-and-apply that runs the caller's closure
//! (`decide` then `apply_decision`) on a session under exclusive access, returns the
//! closure's result at once, and hands back a [`Durable`] that completes when the change
//! is on disk, so the daemon can sign and send a verdict only once its state is durable
//! while many sessions share one fsync.
//!
//! Two stores:
//! - [`EmbeddedStore`]: in-memory sessions persisted by a single group-committing writer
//!   thread, each batch appended to a write-ahead log file (one `write` and one
//!   `fdatasync`) and folded now and then into a redb file; survives kill -9 and power
//!   loss ([`Durability::Batch`]): every change whose [`Durable`] completed is on disk,
//!   and the disk always holds a consistent cut (some prefix of all changes, budgets
//!   balanced with their sessions);
//! - [`MemoryStore`]: the same engine without a disk, for library mode and tests.
//!
//! What this crate does **not** do: no async runtime (futures here are ready at once
//! except [`Durable`], which any executor, or a blocked thread, can wait on), no clock
//! (times arrive in the [`Session`]), no decisions (the closure brings them), no network.
//! A Redis store is a later piece; see [`SessionStore`] for how it would check-and-apply.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

/// The engine-backed surface both of our stores share: the blocking `*_sync` methods, and
/// `SessionStore` over them (each future is ready when returned: the work happens at call
/// time). `$close` closes the store.
macro_rules! ready_session_store {
    ($ty:ty, $close:expr) => {
        impl $ty {
            /// How many sessions are live.
            pub fn len(&self) -> usize {
                self.engine.len()
            }

            /// Whether no session is live.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }

            /// [`SessionStore::create`](crate::SessionStore::create), without a future.
            pub fn create_sync(
                &self,
                session: $crate::Session,
            ) -> Result<$crate::Durable, $crate::StoreError> {
                self.engine.create(session)
            }

            /// [`SessionStore::apply`](crate::SessionStore::apply), without a future.
            pub fn apply_sync<R>(
                &self,
                id: &str,
                f: impl FnOnce(&mut $crate::Session) -> $crate::Change<R>,
            ) -> Result<(R, $crate::Durable), $crate::StoreError> {
                self.engine.apply(id, f)
            }

            /// [`SessionStore::get`](crate::SessionStore::get), without a future.
            pub fn get_sync(&self, id: &str) -> Result<Option<$crate::Session>, $crate::StoreError> {
                self.engine.get(id)
            }

            /// [`SessionStore::remove`](crate::SessionStore::remove), without a future.
            pub fn remove_sync(&self, id: &str) -> Result<$crate::Durable, $crate::StoreError> {
                self.engine.remove(id)
            }

            /// [`SessionStore::list`](crate::SessionStore::list), without a future.
            pub fn list_sync(
                &self,
                org: Option<&str>,
            ) -> Result<Vec<$crate::Session>, $crate::StoreError> {
                self.engine
                    .list(|s| org.is_none_or(|o| s.meta.organization_id == o))
            }

            /// [`SessionStore::budget`](crate::SessionStore::budget), without a future.
            pub fn budget_sync(
                &self,
                key: &$crate::BudgetKey,
            ) -> Result<Option<$crate::Budget>, $crate::StoreError> {
                self.engine.budget(key)
            }
        }

        impl $crate::SessionStore for $ty {
            fn create(
                &self,
                session: $crate::Session,
            ) -> impl std::future::Future<Output = Result<$crate::Durable, $crate::StoreError>> + Send
            {
                std::future::ready(self.create_sync(session))
            }

            fn get(
                &self,
                id: &str,
            ) -> impl std::future::Future<Output = Result<Option<$crate::Session>, $crate::StoreError>>
                   + Send {
                std::future::ready(self.get_sync(id))
            }

            fn apply<R: Send + 'static>(
                &self,
                id: &str,
                f: impl FnOnce(&mut $crate::Session) -> $crate::Change<R> + Send,
            ) -> impl std::future::Future<Output = Result<(R, $crate::Durable), $crate::StoreError>>
                   + Send {
                std::future::ready(self.apply_sync(id, f))
            }

            fn remove(
                &self,
                id: &str,
            ) -> impl std::future::Future<Output = Result<$crate::Durable, $crate::StoreError>> + Send
            {
                std::future::ready(self.remove_sync(id))
            }

            fn list(
                &self,
                org: Option<&str>,
            ) -> impl std::future::Future<Output = Result<Vec<$crate::Session>, $crate::StoreError>>
                   + Send {
                std::future::ready(self.list_sync(org))
            }

            fn pending_hitl(
                &self,
                org: Option<&str>,
            ) -> impl std::future::Future<Output = Result<Vec<$crate::Session>, $crate::StoreError>>
                   + Send {
                std::future::ready(self.engine.list(|s| {
                    s.state.pending.is_some() && org.is_none_or(|o| s.meta.organization_id == o)
                }))
            }

            fn budget(
                &self,
                key: &$crate::BudgetKey,
            ) -> impl std::future::Future<Output = Result<Option<$crate::Budget>, $crate::StoreError>>
                   + Send {
                std::future::ready(self.budget_sync(key))
            }

            fn close(
                &self,
            ) -> impl std::future::Future<Output = Result<(), $crate::StoreError>> + Send {
                let close = $close;
                std::future::ready(close(self))
            }
        }
    };
}
pub(crate) use ready_session_store;

mod durable;
mod embedded;
mod engine;
mod memory;
pub mod record;
mod session;
mod wal;

use std::future::Future;

/// Entry points for the fuzz targets in `fuzz/`; not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    /// Read a write-ahead log file's bytes as opening does, with batches up to `folded`
    /// already in the tables: the last batch number, or why the log cannot be replayed.
    pub fn read_log(bytes: &[u8], folded: u64) -> Result<u64, String> {
        crate::wal::read_log(bytes, folded)
            .map(|log| log.last_seq)
            .map_err(|e| e.to_string())
    }

    /// A log file header for records starting at batch `base`.
    pub fn log_header(base: u64) -> Vec<u8> {
        crate::wal::header(base)
    }

    /// Decode one log entry (the bytes inside a record).
    pub fn decode_entry(bytes: &[u8]) -> bool {
        crate::wal::decode_batch(bytes).is_ok()
    }
}

pub use durable::Durable;
pub use embedded::{Durability, EmbeddedStore, StoreOptions, WriterStats};
pub use memory::MemoryStore;
pub use session::{Budget, BudgetKey, Session, SessionMeta, MAX_ID_BYTES};

/// What a check-and-apply closure decided to do with its edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<R> {
    /// Persist the edited session (and shared budget), then return `R`.
    Commit(R),
    /// Discard every edit the closure made, then return `R`.
    Keep(R),
}

/// Why a store operation failed. Every variant says when it happens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// `apply` or `remove` named a session the store does not hold (`get` returns `None`).
    #[error("no session `{id}`")]
    NotFound {
        /// The id asked for.
        id: String,
    },
    /// `create` with an id that is already live.
    #[error("session `{id}` already exists")]
    Exists {
        /// The id.
        id: String,
    },
    /// `create` when [`StoreOptions::max_sessions`] sessions are live.
    #[error("session cap of {max} reached")]
    SessionCap {
        /// The cap.
        max: usize,
    },
    /// `create` with an id that is empty, longer than [`MAX_ID_BYTES`], or holds a
    /// control character.
    #[error("invalid {field}: {reason}")]
    InvalidId {
        /// Which id.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An `apply` closure changed the session's metadata (nothing was written).
    #[error("session `{id}`: metadata cannot change after creation")]
    MetaChanged {
        /// The session.
        id: String,
    },
    /// An `apply` closure lowered `last_call_number` (nothing was written).
    #[error("session `{id}`: call number would go back from {last} to {new}")]
    CallNumberRegressed {
        /// The session.
        id: String,
        /// The stored number.
        last: u64,
        /// The closure's number.
        new: u64,
    },
    /// An `apply` closure grew the state past [`StoreOptions::max_state_entries`]
    /// (nothing was written).
    #[error("session `{id}`: state holds {entries} entries, over the limit of {max}")]
    StateTooLarge {
        /// The session.
        id: String,
        /// Entries the state would hold.
        entries: usize,
        /// The limit.
        max: usize,
    },
    /// A session names a shared budget the store does not hold (at open: a damaged file).
    #[error("shared budget {key:?} is missing")]
    BudgetMissing {
        /// The budget.
        key: BudgetKey,
    },
    /// Any change after `close`.
    #[error("the store is closed")]
    Closed,
    /// Any change after a batch failed to commit: memory is ahead of disk, so the store
    /// refuses to go on. Reopen it to continue from the last committed state.
    #[error("the store stopped after a failed write: {message}")]
    Failed {
        /// The original failure.
        message: String,
    },
    /// The storage engine reported an error (`op` says during what).
    #[error("storage error during {op}: {message}")]
    Backend {
        /// open, load, commit, ...
        op: &'static str,
        /// The engine's message.
        message: String,
    },
    /// At open: a stored record does not decode, or the write-ahead log is missing or
    /// damaged anywhere but in its last record (`key` is then the log's path).
    #[error("stored record `{key}` is corrupt: {reason}")]
    Corrupt {
        /// The record's key.
        key: String,
        /// Why it does not decode.
        reason: String,
    },
}

/// Where sessions live. The daemon is generic over it (`S: SessionStore`); no `dyn`.
///
/// Every method's future is `Send`. Implementations must make `apply` atomic per
/// session: two closures on one session never run at once, and each sees the state the
/// previous committed one left. Sessions sharing a budget (per agent or organization)
/// are serialized against each other too, so a shared budget is never overspent.
///
/// *How a Redis store would check-and-apply.* Redis cannot run a Rust closure, and a
/// `FnOnce` cannot be retried, so optimistic `WATCH`/`MULTI` with retry does not fit.
/// Instead: take a per-session lease (`SET lease:{sid} token NX PX ttl`; and
/// `lease:budget:{key}` for a shared budget, always session first, then budget), `GET`
/// the session and budget records (the [`record`] encoding), run the closure locally,
/// then write both with one Lua script that checks the lease tokens are still ours
/// (fencing) and sets the records and releases the leases atomically. `Durable` then
/// completes when `WAIT`/`WAITAOF` confirms the write reached the replicas or the AOF
/// fsync, which gives the same "return at once, durable later" split.
pub trait SessionStore: Send + Sync + 'static {
    /// Create a session. Fails with [`StoreError::Exists`] if the id is live, with
    /// [`StoreError::SessionCap`] at the cap, or [`StoreError::InvalidId`].
    ///
    /// Under a shared budget scope, the first session of an agent (or organization)
    /// starts the shared budget from its own `state.budget_*` amounts; later sessions join
    /// it, and their own amounts are replaced by the shared ones.
    fn create(&self, session: Session) -> impl Future<Output = Result<Durable, StoreError>> + Send;

    /// A copy of the session (shared budget loaded), or `None`.
    fn get(&self, id: &str) -> impl Future<Output = Result<Option<Session>, StoreError>> + Send;

    /// Atomic check-and-apply: run `f` on the session, with its shared budget loaded,
    /// under exclusive access to both. On [`Change::Commit`] the edited session (and the
    /// shared budget's amounts from `state.budget_*`) replace the stored ones; on
    /// [`Change::Keep`] every edit is discarded.
    ///
    /// Returns `f`'s result as soon as the change is made in memory, without waiting for
    /// the disk, plus a [`Durable`] that completes when the change (for `Keep`: the state
    /// `f` read) is durable. A commit is refused, and nothing written, if `f` changed
    /// `meta`, lowered `last_call_number`, or grew the state past the store's limit.
    ///
    /// `f` runs while locks are held: it must be quick and must not call the store.
    fn apply<R: Send + 'static>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Session) -> Change<R> + Send,
    ) -> impl Future<Output = Result<(R, Durable), StoreError>> + Send;

    /// Remove a session (its shared budget stays). Frees a place under the cap.
    fn remove(&self, id: &str) -> impl Future<Output = Result<Durable, StoreError>> + Send;

    /// Every live session (shared budgets loaded), optionally one organization's, sorted
    /// by id. For stale-session sweeps and operators; copies every session.
    fn list(
        &self,
        org: Option<&str>,
    ) -> impl Future<Output = Result<Vec<Session>, StoreError>> + Send;

    /// Sessions with a pending HITL transition (for `tollgate hitl list`), optionally
    /// one organization's, sorted by id.
    fn pending_hitl(
        &self,
        org: Option<&str>,
    ) -> impl Future<Output = Result<Vec<Session>, StoreError>> + Send;

    /// A budget's amounts: a shared record, or a session's own for
    /// [`BudgetKey::Session`]. `None` if there is none.
    fn budget(
        &self,
        key: &BudgetKey,
    ) -> impl Future<Output = Result<Option<Budget>, StoreError>> + Send;

    /// Refuse further changes, make everything already changed durable, and stop
    /// (graceful shutdown). Idempotent. Blocks the calling thread while the last batch
    /// is written.
    fn close(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}
