//! [`Ledger`]: the fold of an audit log into sessions and shared budgets.
//!
//! The ledger is what the log says the state is, as of a chain position: every session
//! and shared budget after the entries `0 .. next_index`. It is single-threaded and takes
//! entries strictly in chain order. A store opens by loading a snapshot of a ledger and
//! folding the entries logged after it; while running, it keeps folding every entry the
//! audit writer reports durable, and writes the sessions and budgets that changed to a new
//! snapshot now and then. Because every entry is folded by the same functions that made
//! it ([`crate::ops`]), the ledger equals the live state minus the changes whose entries
//! are not yet durable.

use std::collections::{BTreeSet, HashMap};

use tollgate_audit::{Event, SessionEvent};
use tollgate_core::Digest;

use crate::ops::{self, FoldError};
use crate::session::{Budget, BudgetKey, Session};

/// Sessions and shared budgets as of a chain position.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    /// Every live session, by id (a closed one is gone).
    pub sessions: HashMap<String, Session>,
    /// Every shared (per-agent, per-organization) budget.
    pub budgets: HashMap<BudgetKey, Budget>,
    /// The index of the next entry to fold (the number of entries folded).
    pub next_index: u64,
    /// The record hash of entry `next_index - 1` (the genesis hash before any entry).
    pub last_hash: Digest,
    /// The public key that signs entry `next_index` (the log's key after the hand-overs
    /// folded so far), when known: what reading on from here checks signatures with.
    pub key: Option<[u8; 32]>,
    /// Sessions changed since [`Ledger::take_dirty`] was last called.
    dirty_sessions: BTreeSet<String>,
    /// Shared budgets changed since then.
    dirty_budgets: BTreeSet<BudgetKey>,
}

/// Why an entry could not be folded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The entry is not the next one in the chain.
    #[error("entry {found} does not follow entry {expected_prev} (the ledger is at {next})")]
    Gap {
        /// The index the ledger expected.
        next: u64,
        /// `next - 1`.
        expected_prev: i128,
        /// The entry's index.
        found: u64,
    },
    /// The entry does not link to the ledger's last hash.
    #[error("entry {index} does not link to the entry before it")]
    Link {
        /// The entry's index.
        index: u64,
    },
    /// The entry does not fold onto the state.
    #[error("entry {index}: {source}")]
    Fold {
        /// The entry's index.
        index: u64,
        /// What is wrong.
        source: FoldError,
    },
    /// The entry is a void (record kind 7): this log was written by a journal that
    /// settles changes of a shared state, not by this store's writer.
    #[error("entry {index} is a void: this store does not replay logs of a shared state")]
    Foreign {
        /// The entry's index.
        index: u64,
    },
}

impl Ledger {
    /// An empty ledger at the start of a log (position 0, the genesis hash).
    pub fn new() -> Ledger {
        Ledger {
            last_hash: tollgate_audit::format::genesis_hash(),
            ..Ledger::default()
        }
    }

    /// Fold entry `index`, whose record hash is `hash` and whose `prev_hash` is `prev`.
    /// Entries before the ledger's position are skipped (already folded); anything but the
    /// next entry is an error, and so is an entry that does not fold: the ledger is then
    /// unchanged... except for a failed fold, after which it must not be used (the session
    /// may be half-changed).
    pub fn fold(
        &mut self,
        index: u64,
        hash: Digest,
        prev: Option<Digest>,
        event: &Event,
    ) -> Result<(), LedgerError> {
        if index < self.next_index {
            return Ok(());
        }
        if index > self.next_index {
            return Err(LedgerError::Gap {
                next: self.next_index,
                expected_prev: i128::from(self.next_index) - 1,
                found: index,
            });
        }
        if prev.is_some_and(|p| p != self.last_hash) {
            return Err(LedgerError::Link { index });
        }
        match event {
            Event::Session(e) => self
                .apply(e)
                .map_err(|source| LedgerError::Fold { index, source })?,
            Event::KeyHandover { new_public_key } => self.key = Some(*new_public_key),
            // The policy set in force (format version 6) changes no session's state: each
            // verdict's own entry carries what the set made of it.
            Event::Recovery { .. } | Event::PolicySet(_) => {}
            // A void (format version 3) is written only by journals that settle changes
            // of a shared state (the PostgreSQL sink); the embedded store's log never
            // holds one, and a log that did would not be this store's to replay.
            Event::Void(_) => return Err(LedgerError::Foreign { index }),
        }
        self.next_index = index.saturating_add(1);
        self.last_hash = hash;
        Ok(())
    }

    fn apply(&mut self, event: &SessionEvent) -> Result<(), FoldError> {
        let id = event.session_id();
        if let SessionEvent::Opened(r) = event {
            let s = ops::reopen(&self.sessions, r, |s| {
                if let Some(key) = s.meta.shared_budget_key() {
                    let b = *self
                        .budgets
                        .entry(key.clone())
                        .or_insert_with(|| Budget::of(&s.state));
                    b.load_into(&mut s.state);
                    self.dirty_budgets.insert(key);
                }
            })?;
            self.dirty_sessions.insert(id.to_owned());
            self.sessions.insert(id.to_owned(), s);
            return Ok(());
        }
        let s = ops::opened(&mut self.sessions, id)?;
        let key = s.meta.shared_budget_key();
        if let Some(k) = &key {
            if let Some(b) = self.budgets.get(k) {
                b.load_into(&mut s.state);
            }
        }
        ops::replay(s, event)?;
        if let Some(k) = key {
            self.budgets.insert(k.clone(), Budget::of(&s.state));
            self.dirty_budgets.insert(k);
        }
        // INVARIANT (ended-sessions-go): a closed session leaves the fold (and, being
        // dirty and absent, the next snapshot), so no restart brings it back.
        if matches!(event, SessionEvent::Closed(_)) {
            self.sessions.remove(id);
        }
        self.dirty_sessions.insert(id.to_owned());
        Ok(())
    }

    /// The sessions and budgets changed since the last call, and forget them.
    pub fn take_dirty(&mut self) -> (BTreeSet<String>, BTreeSet<BudgetKey>) {
        (
            std::mem::take(&mut self.dirty_sessions),
            std::mem::take(&mut self.dirty_budgets),
        )
    }

    /// Mark again what [`Ledger::take_dirty`] returned (a snapshot that failed).
    pub fn restore_dirty(&mut self, sessions: BTreeSet<String>, budgets: BTreeSet<BudgetKey>) {
        self.dirty_sessions.extend(sessions);
        self.dirty_budgets.extend(budgets);
    }

    /// Whether anything changed since [`Ledger::take_dirty`].
    pub fn is_dirty(&self) -> bool {
        !self.dirty_sessions.is_empty() || !self.dirty_budgets.is_empty()
    }

    /// A session with its shared budget loaded.
    pub fn session(&self, id: &str) -> Option<Session> {
        let mut s = self.sessions.get(id)?.clone();
        if let Some(b) = s
            .meta
            .shared_budget_key()
            .and_then(|k| self.budgets.get(&k))
        {
            b.load_into(&mut s.state);
        }
        Some(s)
    }
}
