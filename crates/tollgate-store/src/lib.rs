//! # tollgate-store: session state stores behind one trait
//!
//! The daemon keeps each session's decision state ([`tollgate_core::SessionState`]), the
//! policy it runs under, its call numbering and heartbeat, and budgets shared across an
//! agent's or an organization's sessions, in a [`SessionStore`]. The one operation that
//! matters is [`SessionStore::apply`]: an atomic check-and-apply that runs the caller's
//! closure on a session under exclusive access. A closure that changes durable state does
//! so through [`ops`] (open, verdict, settlement, human decision), each of which returns
//! the audit record of the change; the store writes that record to its journal (the
//! audit log) while it still holds the session's locks, and hands back a [`Durable`] that
//! completes when the record is durable.
//!
//! **The audit log is the state's write-ahead log.** A change is durable exactly when its
//! audit entry is: the store writes nothing else on the path of a change, and the state is
//! the fold of the log ([`Ledger`], [`ops::replay`]). There is no window in which a change
//! is durable in one place and missing in the other.
//!
//! Two stores:
//! - [`EmbeddedStore`]: sessions in memory; a thread folds each durable audit entry into
//!   a [`Ledger`] and snapshots it to a redb file every few seconds; opening loads the
//!   snapshot and folds the log after it. Survives kill -9 and power loss as well as the
//!   audit log does;
//! - [`MemoryStore`]: the same engine without a disk, for tests and embedders.
//!
//! What this crate does **not** do: no async runtime (futures here are ready at once
//! except [`Durable`], which any executor, or a blocked thread, can wait on), no clock
//! (times arrive as arguments), no decisions (the closure brings them), no network.

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
                now: tollgate_core::UnixNanos,
            ) -> Result<(tollgate_core::SessionState, $crate::Durable), $crate::StoreError> {
                self.engine.create(session, now)
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

            /// [`SessionStore::list`](crate::SessionStore::list), without a future.
            pub fn list_sync(
                &self,
                org: Option<&str>,
            ) -> Result<Vec<$crate::Session>, $crate::StoreError> {
                self.engine
                    .list(|s| org.is_none_or(|o| s.meta.organization_id == o))
            }

            /// [`SessionStore::quiet`](crate::SessionStore::quiet), without a future.
            pub fn quiet_sync(
                &self,
                cutoff: tollgate_core::UnixNanos,
            ) -> Result<Vec<String>, $crate::StoreError> {
                self.engine.quiet(cutoff)
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
                now: tollgate_core::UnixNanos,
            ) -> impl std::future::Future<
                Output = Result<(tollgate_core::SessionState, $crate::Durable), $crate::StoreError>,
            > + Send {
                std::future::ready(self.create_sync(session, now))
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
                f: impl FnMut(&mut $crate::Session) -> $crate::Change<R> + Send,
            ) -> impl std::future::Future<Output = Result<(R, $crate::Durable), $crate::StoreError>>
                   + Send {
                std::future::ready(self.apply_sync(id, f))
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

            fn quiet(
                &self,
                cutoff: tollgate_core::UnixNanos,
            ) -> impl std::future::Future<Output = Result<Vec<String>, $crate::StoreError>> + Send
            {
                std::future::ready(self.quiet_sync(cutoff))
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
mod ledger;
mod memory;
pub mod ops;
pub mod record;
pub mod replay;
pub mod rules;
mod session;

use std::future::Future;

/// Entry points for the fuzz targets in `fuzz/`; not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    /// Decode a snapshot's session record (bounded to 1 MiB).
    pub fn decode_session(bytes: &[u8]) -> bool {
        crate::record::decode_session(bytes, 1 << 20, 0).is_ok()
    }

    /// Decode a snapshot's budget record and key.
    pub fn decode_budget(bytes: &[u8]) -> bool {
        let key = std::str::from_utf8(bytes).map(crate::record::parse_budget_key);
        crate::record::decode_budget(bytes).is_ok() || matches!(key, Ok(Ok(_)))
    }
}

pub use durable::{Arbiter, Durable, Journal, JournalHealth, SettleFuture, Settled, VoidBudget};
pub use embedded::{
    dump, tap, EmbeddedStore, SnapshotStats, StoreOptions, StoreReport, Tap, TapReceiver,
};
pub use ledger::{Ledger, LedgerError};
pub use memory::MemoryStore;
pub use ops::FoldError;
pub use session::{check_id, Budget, BudgetKey, Policy, Session, SessionMeta, MAX_ID_BYTES};

/// What a check-and-apply closure did to the session.
// A `Change` lives only between the closure and the store, by value; boxing the record
// would cost an allocation per verdict for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<R> {
    /// It made one durable change through [`ops`], which returned this audit record: the
    /// store writes it to its journal (and stores the shared budget's amounts back), then
    /// returns `R` with a [`Durable`] for the record.
    Commit(R, tollgate_audit::SessionEvent),
    /// It ended the session through [`ops::close`], which returned this record (a
    /// session-closed entry): the store writes it like a commit's, then forgets the
    /// session. From then on `apply` and `get` answer as for an unknown session (a store
    /// shared by several daemons answers so on every daemon), and it no longer counts
    /// against [`StoreOptions::max_sessions`].
    End(R, tollgate_audit::SessionEvent),
    /// It changed only liveness, which is not durable: `last_heartbeat_ns`,
    /// `state.status` between STALE and its live value, `state.last_activity_ns`. Nothing
    /// is written; a restart gives every session a fresh heartbeat window.
    Touch(R),
    /// It changed nothing.
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
    /// A session names a shared budget the store does not hold (at open: a damaged file).
    #[error("shared budget {key:?} is missing")]
    BudgetMissing {
        /// The budget.
        key: BudgetKey,
    },
    /// Any change after `close`.
    #[error("the store is closed")]
    Closed,
    /// Any change after a change could not be made whole (a closure panicked, or a
    /// commit did not follow the session's version): the live state can no longer be
    /// trusted to match the log, so the store refuses to go on. Reopen it to continue from
    /// the fold of the log.
    #[error("the store stopped: {message}")]
    Failed {
        /// What happened.
        message: String,
    },
    /// The journal (the audit log) refuses entries now (after a failure to write, sync
    /// or rotate): no change is made. It passes when the journal has recovered; the store
    /// then reloads its state from the fold of the log before the next change.
    #[error("the audit log is not taking entries: {message}")]
    Unavailable {
        /// Why, as the journal says.
        message: String,
    },
    /// The journal (the audit log) could not make a change durable. The audit writer
    /// refuses every later entry too until it has recovered (then the store reloads its
    /// state from the log), so no later change is built on this one.
    #[error("the audit log did not take the change: {message}")]
    Journal {
        /// The writer's error.
        message: String,
    },
    /// At open: the snapshot file was written by another version of the store.
    #[error("the state file is not a snapshot of this version ({found}); move it aside: the state is rebuilt from the audit log")]
    Incompatible {
        /// What the file says it is.
        found: String,
    },
    /// At open: the snapshot and the audit log disagree (see [`EmbeddedStore::open`]).
    /// The message says what to do: the log is the record, the snapshot only a cache of
    /// its fold.
    #[error("the state file `{state}` and the audit log `{log}` disagree: {reason}. The log is the record: check it with `tollgate audit verify {log} --key <the log's public key>` (and `--checkpoint FILE` with a checkpoint kept elsewhere, to detect a cut). If it verifies and is the log to continue, move `{state}` aside and start again: the state is rebuilt from the log. If the log was cut or replaced, restore it from its archive instead: a state rebuilt from a cut log has forgotten the changes that were cut")]
    Mismatch {
        /// The snapshot file.
        state: String,
        /// The log directory.
        log: String,
        /// What disagrees.
        reason: String,
    },
    /// At open: the snapshot file is not safe to trust: another user owns it, or users
    /// other than its owner may write it (whoever can write it can set any session's
    /// budget at the next start).
    #[error("the state file `{path}` {reason}: refusing to trust it. Fix its owner and mode (`chown` it to the daemon's user, `chmod 0640`), or move it aside: the state is then rebuilt from the audit log")]
    Unsafe {
        /// The snapshot file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The storage engine reported an error (`op` says during what).
    #[error("storage error during {op}: {message}")]
    Backend {
        /// open, load, commit, ...
        op: &'static str,
        /// The engine's message.
        message: String,
    },
    /// At open: a snapshot record does not decode.
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
/// previous one left. Sessions sharing a budget (per agent or organization) are
/// serialized against each other too, so a shared budget is never overspent. And every
/// committed change's audit record must reach the journal in the order of the changes of
/// its session and of its shared budget.
pub trait SessionStore: Send + Sync + 'static {
    /// Open a new session (built by [`Session::new`], version 0): join or start its shared
    /// budget (a later session of an agent or organization takes the shared amounts), and
    /// write its session-opened record. Returns its starting state. Fails with
    /// [`StoreError::Exists`] if the id is live, [`StoreError::SessionCap`] at the cap, or
    /// [`StoreError::InvalidId`].
    fn create(
        &self,
        session: Session,
        now: tollgate_core::UnixNanos,
    ) -> impl Future<Output = Result<(tollgate_core::SessionState, Durable), StoreError>> + Send;

    /// A copy of the session (shared budget loaded), or `None`.
    fn get(&self, id: &str) -> impl Future<Output = Result<Option<Session>, StoreError>> + Send;

    /// Atomic check-and-apply: run `f` on the session, with its shared budget loaded,
    /// under exclusive access to both; see [`Change`] for what `f` may return. Returns
    /// `f`'s result as soon as the change is made in memory, plus a [`Durable`] that
    /// completes when its audit record is durable.
    ///
    /// `f` runs while locks are held: it must be quick and must not call the store.
    ///
    /// `f` may run more than once: a store shared by several daemons runs it on its copy
    /// of the session, and if another daemon changed the session or its shared budget
    /// first, runs it again on a fresh copy. Only the last run's result and changes count,
    /// so anything `f` does besides changing the session must be safe to repeat.
    fn apply<R: Send + 'static>(
        &self,
        id: &str,
        f: impl FnMut(&mut Session) -> Change<R> + Send,
    ) -> impl Future<Output = Result<(R, Durable), StoreError>> + Send;

    /// Every live session (shared budgets loaded), optionally one organization's, sorted
    /// by id. For stale-session sweeps and operators; copies every session.
    fn list(
        &self,
        org: Option<&str>,
    ) -> impl Future<Output = Result<Vec<Session>, StoreError>> + Send;

    /// The ids of the live sessions whose [`Session::quiet_since`] is at or before
    /// `cutoff` (silent since then, and no held call awaiting a human), oldest first:
    /// what an idle sweep needs. Both stores of this crate keep an index by that time, so
    /// the cost follows the sessions returned, not the sessions live. The default (for a
    /// store without such an index) filters [`SessionStore::list`], which copies every
    /// session.
    fn quiet(
        &self,
        cutoff: tollgate_core::UnixNanos,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send {
        async move {
            let mut quiet: Vec<(tollgate_core::UnixNanos, String)> = self
                .list(None)
                .await?
                .into_iter()
                .filter_map(|s| {
                    s.quiet_since()
                        .filter(|t| *t <= cutoff)
                        .map(|t| (t, s.meta.session_id))
                })
                .collect();
            quiet.sort_unstable();
            Ok(quiet.into_iter().map(|(_, id)| id).collect())
        }
    }

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

    /// Refuse further changes and stop (graceful shutdown). Idempotent.
    fn close(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The note kept beside session `id` for the daemons that share the store (the daemon
    /// keeps a held call's params there, so operators and waiting agents on other daemons
    /// see them), or `None`. A note is not session state: not audited, not folded, gone
    /// with the session. A store that no other daemon reads keeps none: `Ok(None)`.
    fn note(&self, id: &str) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send {
        let _ = id;
        std::future::ready(Ok(None))
    }

    /// Replace session `id`'s note (at most [`MAX_NOTE_BYTES`]). A store that no other
    /// daemon reads keeps none and does nothing.
    fn set_note(
        &self,
        id: &str,
        note: Vec<u8>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (id, note);
        std::future::ready(Ok(()))
    }
}

/// The largest note [`SessionStore::set_note`] keeps.
pub const MAX_NOTE_BYTES: usize = 256 * 1024;
