//! The embedded store's write-ahead log: a file beside the redb file (`<db path>.wal`)
//! to which each group commit appends one record (every change of the batch, encoded
//! below) with one `write` and one `fdatasync`. Every so often the writer folds the
//! accumulated changes into the redb tables (`sessions`, `nonces`, `budgets`) in one
//! durable transaction that also records the last folded batch number (table `meta`), and
//! then replaces the log with a new empty one (a checkpoint). Opening replays the log.
//!
//! File format (integers in the framing big-endian):
//!
//! ```text
//! file    := header, record*
//! header  := "TGSTWAL1", u64 base, [32] SHA-256("TGSTWAL1" || base)
//!            (base: the batch number the first record must carry)
//! record  := u32 n, u64 seq, [n] entry, [32] SHA-256(seq || entry)
//!            (seq: base for the first record, then one more for each; n <= 1 GiB)
//! ```
//!
//! Entry format (integers little-endian; an entry that does not decode although its
//! checksum holds is a corrupt log):
//!
//! ```text
//! entry   := u32 n_sessions, session*, u32 n_budgets, budget*
//! session := bytes id, u8 flags (1 = reset nonces first, 2 = has record),
//!            [bytes record], u32 n_added, u64*, u32 n_removed, u64*
//! budget  := bytes key, bytes record
//! bytes   := u32 length, that many bytes
//! ```
//!
//! Reading ([`read_log`]) is a pure function over the file's bytes: it never panics and
//! allocates no more than the bytes hold. A record that fails its checksum (or whose
//! length runs past the end) is a crash artifact when no whole record follows it (a torn
//! tail, cut off at open); followed by a whole record it is corruption, reported, never
//! skipped.

use std::collections::{BTreeSet, HashMap};

use redb::{Table, TableDefinition};
use sha2::{Digest, Sha256};

use crate::engine::Pending;
use crate::record;

pub(crate) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
pub(crate) const BUDGETS: TableDefinition<&str, &[u8]> = TableDefinition::new("budgets");
/// Seen nonces, one key each: `(session_id, nonce)`.
pub(crate) const NONCES: TableDefinition<(&str, u64), ()> = TableDefinition::new("nonces");
/// Small facts about the files: [`FOLDED_SEQ`] → the last batch folded into the tables.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The key in [`META`] of the last batch number folded into the main tables. Its
/// presence also says that the store has a log file.
pub(crate) const FOLDED_SEQ: &str = "wal_folded_seq";

/// The first bytes of a log file.
pub(crate) const MAGIC: &[u8; 8] = b"TGSTWAL1";
/// Header length: magic, base, checksum.
pub(crate) const HEADER_BYTES: usize = 8 + 8 + 32;
/// Record overhead: length, sequence number, checksum.
pub(crate) const RECORD_OVERHEAD: usize = 4 + 8 + 32;
/// The largest entry a record may hold. The writer refuses a bigger batch (the store
/// then fails, see `StoreError::Failed`) rather than write one the reader would reject.
pub(crate) const MAX_ENTRY_BYTES: usize = 1 << 30;

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

/// A new log file's header: records start at batch number `base`.
pub(crate) fn header(base: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&base.to_be_bytes());
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}

/// Batch `seq`'s entry framed as one record, or `None` if the entry is too large.
pub(crate) fn frame(seq: u64, entry: &[u8]) -> Option<Vec<u8>> {
    if entry.len() > MAX_ENTRY_BYTES {
        return None;
    }
    let n = u32::try_from(entry.len()).ok()?;
    let mut out = Vec::with_capacity(entry.len().saturating_add(RECORD_OVERHEAD));
    out.extend_from_slice(&n.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(entry);
    out.extend_from_slice(&record_sum(seq, entry));
    Some(out)
}

fn record_sum(seq: u64, entry: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(seq.to_be_bytes());
    h.update(entry);
    h.finalize().into()
}

/// Why a log file cannot be replayed. Each carries the byte offset it was found at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WalError {
    /// The header is short, has the wrong magic, or fails its checksum.
    #[error("bad header: {0}")]
    Header(&'static str),
    /// The records start after a batch that was never folded: batches are missing.
    #[error("starts at batch {base}, but only batches up to {folded} were folded")]
    Gap {
        /// The header's first batch number.
        base: u64,
        /// The last batch in the tables.
        folded: u64,
    },
    /// A record fails its checksum (or its length is impossible) and more follows it.
    #[error("record at byte {offset} is damaged and is not the last one")]
    Damaged {
        /// Where the record starts.
        offset: usize,
    },
    /// A whole, checksummed record carries the wrong batch number.
    #[error("record at byte {offset} holds batch {seq}, expected {expected}")]
    Sequence {
        /// Where the record starts.
        offset: usize,
        /// Its number.
        seq: u64,
        /// The number it should carry.
        expected: u64,
    },
    /// A whole, checksummed record whose entry does not decode.
    #[error("record at byte {offset} (batch {seq}): {source}")]
    Entry {
        /// Where the record starts.
        offset: usize,
        /// Its number.
        seq: u64,
        /// Why it does not decode.
        source: LogError,
    },
}

/// What a log file holds.
#[derive(Debug, Default)]
pub(crate) struct LogContents {
    /// Every change of the batches after the folded one, folded together.
    pub dirty: Dirty,
    /// The last batch number in the file (whether folded already or not); the header's
    /// base minus one for a file without records.
    pub last_seq: u64,
    /// Batches replayed (those after the folded one).
    pub replayed: u64,
    /// Where a torn or damaged last record starts, if the file ends with one: the bytes
    /// from here on are a crash artifact, to be cut off.
    pub torn_at: Option<usize>,
}

/// Read a log file's bytes: verify the header and every record, skip batches up to
/// `folded` (already in the tables), and fold the others, which must follow `folded`
/// without a gap. A damaged record (checksum mismatch, or a length running past the end)
/// that no whole record follows is a torn tail ([`LogContents::torn_at`]); a damaged
/// record followed by a whole one is an error. Never panics.
pub(crate) fn read_log(bytes: &[u8], folded: u64) -> Result<LogContents, WalError> {
    let (head, mut rest) = split(bytes, HEADER_BYTES).ok_or(WalError::Header("short"))?;
    let (magic, head_rest) = split(head, 8).ok_or(WalError::Header("short"))?;
    let (base_bytes, sum) = split(head_rest, 8).ok_or(WalError::Header("short"))?;
    if magic != MAGIC {
        return Err(WalError::Header("not a tollgate store log"));
    }
    let mut h = Sha256::new();
    h.update(magic);
    h.update(base_bytes);
    if h.finalize().as_slice() != sum {
        return Err(WalError::Header("checksum mismatch"));
    }
    let base = u64::from_be_bytes(
        base_bytes
            .try_into()
            .map_err(|_| WalError::Header("short"))?,
    );
    if base == 0 || base > folded.saturating_add(1) {
        return Err(WalError::Gap { base, folded });
    }
    let mut out = LogContents {
        last_seq: base - 1,
        ..LogContents::default()
    };
    let mut offset = HEADER_BYTES;
    while !rest.is_empty() {
        match parse_record(rest) {
            Some((seq, entry, tail)) => {
                let expected = out.last_seq.saturating_add(1);
                if seq != expected {
                    return Err(WalError::Sequence {
                        offset,
                        seq,
                        expected,
                    });
                }
                if seq > folded {
                    let batch = decode_batch(entry).map_err(|source| WalError::Entry {
                        offset,
                        seq,
                        source,
                    })?;
                    out.dirty.absorb(batch);
                    out.replayed += 1;
                }
                out.last_seq = seq;
                offset = offset.saturating_add(rest.len() - tail.len());
                rest = tail;
            }
            None => {
                if !good_record_follows(rest, out.last_seq) {
                    out.torn_at = Some(offset);
                    return Ok(out);
                }
                return Err(WalError::Damaged { offset });
            }
        }
    }
    Ok(out)
}

/// `(seq, entry, rest)` if `bytes` starts with a whole record whose checksum holds.
fn parse_record(bytes: &[u8]) -> Option<(u64, &[u8], &[u8])> {
    let (n, rest) = split(bytes, 4)?;
    let n = usize::try_from(u32::from_be_bytes(n.try_into().ok()?)).ok()?;
    if n > MAX_ENTRY_BYTES {
        return None;
    }
    let (seq, rest) = split(rest, 8)?;
    let seq = u64::from_be_bytes(seq.try_into().ok()?);
    let (entry, rest) = split(rest, n)?;
    let (sum, rest) = split(rest, 32)?;
    (record_sum(seq, entry).as_slice() == sum).then_some((seq, entry, rest))
}

/// Whether a whole record numbered after `last` starts anywhere in `bytes` past its first
/// byte: the damaged record at the start of `bytes` is then followed by good ones, and is
/// corruption rather than a torn tail. (Its own length field cannot be trusted to find
/// the next record, so every offset is tried; a candidate is hashed only if its number
/// is plausible and its length fits, so a tail of junk costs one pass.)
fn good_record_follows(bytes: &[u8], last: u64) -> bool {
    let most = last.saturating_add(1 + (bytes.len() / RECORD_OVERHEAD) as u64);
    (1..bytes.len()).any(|j| {
        let Some(cand) = bytes.get(j..) else {
            return false;
        };
        let Some((_, rest)) = split(cand, 4) else {
            return false;
        };
        let Some((seq, _)) = split(rest, 8) else {
            return false;
        };
        let seq = seq.try_into().map(u64::from_be_bytes).unwrap_or(0);
        seq > last && seq <= most && parse_record(cand).is_some()
    })
}

fn split(bytes: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
    (n <= bytes.len()).then(|| bytes.split_at(n))
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

    /// A log of `k` batches from 1 (batch `i` adds nonce `i` to session `s{i % 3}`), and
    /// where each record starts.
    fn log_of(k: u64) -> (Vec<u8>, Vec<usize>) {
        let mut out = header(1);
        let mut starts = Vec::new();
        for seq in 1..=k {
            let mut p = Pending::empty_for_tests();
            p.sessions.insert(
                format!("s{}", seq % 3),
                crate::engine::SessionChange {
                    snapshot: None,
                    reset: false,
                    added: [seq].into(),
                    removed: BTreeSet::new(),
                },
            );
            let (entry, _) = encode_batch(&p);
            starts.push(out.len());
            out.extend(frame(seq, &entry).unwrap());
        }
        (out, starts)
    }

    fn nonces(log: &LogContents) -> BTreeSet<u64> {
        log.dirty
            .sessions
            .values()
            .flat_map(|o| o.added.iter().copied())
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_logs_never_panic(
            body in proptest::collection::vec(any::<u8>(), 0..400),
            with_header in any::<bool>(),
            folded in 0_u64..4,
        ) {
            let mut bytes = if with_header { header(1) } else { Vec::new() };
            bytes.extend(body);
            let _ = read_log(&bytes, folded);
        }

        #[test]
        fn a_cut_anywhere_keeps_the_whole_records_before_it(k in 1_u64..6, cut in any::<prop::sample::Index>()) {
            let (bytes, starts) = log_of(k);
            let at = HEADER_BYTES + cut.index(bytes.len() - HEADER_BYTES + 1);
            let log = read_log(&bytes[..at], 0).unwrap();
            let whole = starts.iter().skip(1).chain([&bytes.len()]).filter(|e| **e <= at).count() as u64;
            prop_assert_eq!(log.replayed, whole);
            prop_assert_eq!(log.last_seq, whole);
            prop_assert_eq!(nonces(&log), (1..=whole).collect::<BTreeSet<_>>());
            let boundary = at == HEADER_BYTES || starts.contains(&at) || at == bytes.len();
            prop_assert_eq!(log.torn_at.is_none(), boundary);
        }

        #[test]
        fn a_flipped_byte_is_a_torn_tail_only_in_the_last_record(
            k in 1_u64..6,
            pos in any::<prop::sample::Index>(),
            bit in 0_u8..8,
        ) {
            let (mut bytes, starts) = log_of(k);
            let at = pos.index(bytes.len());
            bytes[at] ^= 1 << bit;
            let r = read_log(&bytes, 0);
            let last = *starts.last().unwrap();
            if at < HEADER_BYTES {
                prop_assert!(matches!(r, Err(WalError::Header(_))), "{:?}", r);
            } else if at >= last {
                let log = r.unwrap();
                prop_assert_eq!(log.replayed, k - 1);
                prop_assert_eq!(log.torn_at, Some(last));
            } else {
                prop_assert!(r.is_err(), "byte {} of {}", at, bytes.len());
            }
        }

        #[test]
        fn folded_batches_are_checked_but_not_replayed(k in 1_u64..6, folded in 0_u64..8) {
            let (bytes, _) = log_of(k);
            let log = read_log(&bytes, folded).unwrap();
            prop_assert_eq!(log.replayed, k.saturating_sub(folded));
            prop_assert_eq!(nonces(&log), (folded + 1..=k).collect::<BTreeSet<_>>());
        }
    }

    #[test]
    fn headers_and_numbers_are_checked() {
        // A log starting after batch 5 with only 3 folded: 4 and 5 are missing.
        let mut bytes = header(6);
        assert_eq!(
            read_log(&bytes, 3).unwrap_err(),
            WalError::Gap { base: 6, folded: 3 }
        );
        assert_eq!(read_log(&bytes, 5).unwrap().last_seq, 5);
        // A whole record with the wrong number.
        bytes.extend(frame(7, &[0, 0, 0, 0, 0, 0, 0, 0]).unwrap());
        assert_eq!(
            read_log(&bytes, 5).unwrap_err(),
            WalError::Sequence {
                offset: HEADER_BYTES,
                seq: 7,
                expected: 6
            }
        );
        // A whole record whose entry does not decode.
        let mut bytes = header(1);
        bytes.extend(frame(1, &[1, 0, 0]).unwrap());
        assert!(matches!(
            read_log(&bytes, 0),
            Err(WalError::Entry {
                source: LogError::Truncated,
                ..
            })
        ));
        assert!(matches!(read_log(b"TGSTWAL1", 0), Err(WalError::Header(_))));
        assert!(matches!(read_log(&[0; 48], 0), Err(WalError::Header(_))));
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
