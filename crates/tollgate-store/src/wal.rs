//! The embedded store's write-ahead log: each group commit appends one entry (every
//! change of the batch, encoded below) to the redb table `log`, which costs a few
//! contiguous pages however many sessions the batch touched. Every so often the writer
//! folds the accumulated changes into the main tables (`sessions`, `nonces`, `budgets`)
//! and empties the log in one transaction (a checkpoint). Opening replays the log.
//!
//! Entry format (all integers little-endian; a decoder error is a corrupt log):
//!
//! ```text
//! entry   := u32 n_sessions, session*, u32 n_budgets, budget*
//! session := bytes id, u8 flags (1 = reset nonces first, 2 = has record),
//!            [bytes record], u32 n_added, u64*, u32 n_removed, u64*
//! budget  := bytes key, bytes record
//! bytes   := u32 length, that many bytes
//! ```

use std::collections::{BTreeSet, HashMap};

use redb::{Table, TableDefinition};

use crate::engine::Pending;
use crate::record;

pub(crate) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
pub(crate) const BUDGETS: TableDefinition<&str, &[u8]> = TableDefinition::new("budgets");
/// Seen nonces, one key each: `(session_id, nonce)`.
pub(crate) const NONCES: TableDefinition<(&str, u64), ()> = TableDefinition::new("nonces");
/// The write-ahead log: batch number → entry.
pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");

/// The net effect on disk of one or more changes to a session.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct SessionOps {
    /// Delete every stored nonce of the session first.
    pub reset: bool,
    /// The record to store; `None` deletes it.
    pub record: Option<Vec<u8>>,
    /// Nonces to store.
    pub added: BTreeSet<u64>,
    /// Nonces to delete.
    pub removed: BTreeSet<u64>,
}

impl SessionOps {
    /// Fold a later change into this one.
    fn then(&mut self, later: SessionOps) {
        if later.reset {
            *self = later;
            return;
        }
        self.record = later.record;
        for n in later.removed {
            if !self.added.remove(&n) {
                self.removed.insert(n);
            }
        }
        for n in later.added {
            if !self.removed.remove(&n) {
                self.added.insert(n);
            }
        }
    }
}

/// Changes not yet folded into the main tables.
#[derive(Debug, Default)]
pub(crate) struct Dirty {
    pub sessions: HashMap<String, SessionOps>,
    pub budgets: HashMap<String, Vec<u8>>,
}

impl Dirty {
    /// Fold one batch (decoded or fresh) into the accumulated changes.
    pub(crate) fn absorb(&mut self, batch: Dirty) {
        for (id, ops) in batch.sessions {
            match self.sessions.get_mut(&id) {
                Some(d) => d.then(ops),
                None => {
                    self.sessions.insert(id, ops);
                }
            }
        }
        self.budgets.extend(batch.budgets);
    }

    /// Write everything into the main tables.
    pub(crate) fn apply(
        &self,
        sessions: &mut Table<'_, &'static str, &'static [u8]>,
        nonces: &mut Table<'_, (&'static str, u64), ()>,
        budgets: &mut Table<'_, &'static str, &'static [u8]>,
    ) -> Result<(), redb::Error> {
        for (id, ops) in &self.sessions {
            let id = id.as_str();
            if ops.reset {
                nonces.retain_in((id, 0)..=(id, u64::MAX), |_, ()| false)?;
            }
            for n in &ops.removed {
                nonces.remove((id, *n))?;
            }
            for n in &ops.added {
                nonces.insert((id, *n), ())?;
            }
            match &ops.record {
                Some(r) => {
                    sessions.insert(id, r.as_slice())?;
                }
                None => {
                    sessions.remove(id)?;
                }
            }
        }
        for (k, r) in &self.budgets {
            budgets.insert(k.as_str(), r.as_slice())?;
        }
        Ok(())
    }
}

/// A batch of the journal as log-entry bytes and as the changes it makes.
pub(crate) fn encode_batch(batch: &Pending) -> (Vec<u8>, Dirty) {
    let mut out = Vec::with_capacity(1024 * batch.sessions.len().max(1));
    let mut dirty = Dirty::default();
    put_u32(&mut out, batch.sessions.len());
    for (id, c) in &batch.sessions {
        let record = c
            .snapshot
            .as_deref()
            .map(record::encode_session_without_nonces);
        put_bytes(&mut out, id.as_bytes());
        let flags = u8::from(c.reset) | (u8::from(record.is_some()) << 1);
        out.push(flags);
        if let Some(r) = &record {
            put_bytes(&mut out, r);
        }
        put_u32(&mut out, c.added.len());
        for n in &c.added {
            out.extend_from_slice(&n.to_le_bytes());
        }
        put_u32(&mut out, c.removed.len());
        for n in &c.removed {
            out.extend_from_slice(&n.to_le_bytes());
        }
        dirty.sessions.insert(
            id.clone(),
            SessionOps {
                reset: c.reset,
                record,
                added: c.added.clone(),
                removed: c.removed.clone(),
            },
        );
    }
    put_u32(&mut out, batch.budgets.len());
    for (k, b) in &batch.budgets {
        let key = record::budget_key_string(k);
        let rec = record::encode_budget(b);
        put_bytes(&mut out, key.as_bytes());
        put_bytes(&mut out, &rec);
        dirty.budgets.insert(key, rec);
    }
    (out, dirty)
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    // Lengths and counts here are bounded far below 4 GiB by the store's limits.
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len());
    out.extend_from_slice(b);
}

/// Why a log entry does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// The entry ends inside a field.
    #[error("log entry is truncated")]
    Truncated,
    /// Bytes remain after the last field.
    #[error("log entry has trailing bytes")]
    Trailing,
    /// An id or key is not UTF-8.
    #[error("log entry holds a key that is not utf-8")]
    NotUtf8,
    /// A flags byte with unknown bits.
    #[error("log entry has unknown flags `{0}`")]
    Flags(u8),
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], LogError> {
        if n > self.rest.len() {
            return Err(LogError::Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, LogError> {
        self.take(1)?.first().copied().ok_or(LogError::Truncated)
    }

    fn u32(&mut self) -> Result<usize, LogError> {
        let b: [u8; 4] = self.take(4)?.try_into().map_err(|_| LogError::Truncated)?;
        usize::try_from(u32::from_le_bytes(b)).map_err(|_| LogError::Truncated)
    }

    fn u64(&mut self) -> Result<u64, LogError> {
        let b: [u8; 8] = self.take(8)?.try_into().map_err(|_| LogError::Truncated)?;
        Ok(u64::from_le_bytes(b))
    }

    fn bytes(&mut self) -> Result<&'a [u8], LogError> {
        let n = self.u32()?;
        self.take(n)
    }

    fn text(&mut self) -> Result<String, LogError> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_owned)
            .map_err(|_| LogError::NotUtf8)
    }

    fn nonces(&mut self) -> Result<BTreeSet<u64>, LogError> {
        let n = self.u32()?;
        // Each nonce takes 8 bytes: a count the entry cannot hold is truncation, found
        // before anything is allocated.
        if n.saturating_mul(8) > self.rest.len() {
            return Err(LogError::Truncated);
        }
        (0..n).map(|_| self.u64()).collect()
    }
}

/// Decode a log entry into the changes it makes. Never panics; allocation is bounded by
/// the entry's size.
pub(crate) fn decode_batch(bytes: &[u8]) -> Result<Dirty, LogError> {
    let mut r = Reader { rest: bytes };
    let mut dirty = Dirty::default();
    let n = r.u32()?;
    for _ in 0..n {
        let id = r.text()?;
        let flags = r.u8()?;
        if flags & !3 != 0 {
            return Err(LogError::Flags(flags));
        }
        let record = if flags & 2 != 0 {
            Some(r.bytes()?.to_vec())
        } else {
            None
        };
        let added = r.nonces()?;
        let removed = r.nonces()?;
        let ops = SessionOps {
            reset: flags & 1 != 0,
            record,
            added,
            removed,
        };
        match dirty.sessions.get_mut(&id) {
            Some(d) => d.then(ops),
            None => {
                dirty.sessions.insert(id, ops);
            }
        }
    }
    let n = r.u32()?;
    for _ in 0..n {
        let key = r.text()?;
        let rec = r.bytes()?.to_vec();
        dirty.budgets.insert(key, rec);
    }
    if !r.rest.is_empty() {
        return Err(LogError::Trailing);
    }
    Ok(dirty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_entries_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_batch(&bytes);
        }

        #[test]
        fn folding_changes_gives_the_net_change(
            start in proptest::collection::btree_set(0_u64..40, 0..15),
            steps in proptest::collection::vec(
                (any::<bool>(), proptest::collection::btree_set(0_u64..40, 0..15)), 1..6),
        ) {
            // Each step either replaces the set wholesale (reset) or edits it.
            let mut folded = SessionOps::default();
            let mut cur = start.clone();
            for (reset, next) in &steps {
                let ops = if *reset {
                    SessionOps { reset: true, record: None, added: next.clone(), removed: BTreeSet::new() }
                } else {
                    SessionOps {
                        reset: false,
                        record: None,
                        added: next.difference(&cur).copied().collect(),
                        removed: cur.difference(next).copied().collect(),
                    }
                };
                folded.then(ops);
                cur = next.clone();
            }
            let mut disk = if folded.reset { BTreeSet::new() } else { start.clone() };
            for n in &folded.removed {
                disk.remove(n);
            }
            disk.extend(folded.added.iter().copied());
            prop_assert_eq!(&disk, steps.last().map(|(_, s)| s).unwrap());
        }
    }

    #[test]
    fn entries_round_trip_and_truncation_is_caught() {
        let mut p = Pending::empty_for_tests();
        p.sessions.insert(
            "s".into(),
            crate::engine::SessionChange {
                snapshot: None,
                reset: true,
                added: [1, 2].into(),
                removed: [3].into(),
            },
        );
        let (bytes, dirty) = encode_batch(&p);
        let back = decode_batch(&bytes).unwrap();
        assert_eq!(back.sessions, dirty.sessions);
        for cut in 0..bytes.len() {
            assert!(decode_batch(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert_eq!(decode_batch(&extra).unwrap_err(), LogError::Trailing);
    }
}
