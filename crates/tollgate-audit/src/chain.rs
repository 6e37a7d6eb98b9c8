//! [`Chainer`]: the one code path that turns events into signed, chain-linked records.
//! The file [`Writer`](crate::Writer) and every other journal (the PostgreSQL sink) sign
//! and link through it, so a record means the same wherever it is stored.

use ed25519_dalek::SigningKey;
use tollgate_core::Digest;

use crate::entry::{self, Event};
use crate::format::{self, EncodeError, Position};
use crate::keys::KeyId;
use crate::writer::Appended;

/// The head of a chain being written: the signing key, the index the next record gets
/// and the hash it links to. [`Chainer::sign`] encodes, signs and links one event and
/// advances the head; nothing else changes it but [`Chainer::set_key`] (after a
/// hand-over entry) and [`Chainer::reset`] (a journal that lost a batch it had signed
/// goes back to what it knows is stored).
pub struct Chainer {
    key: SigningKey,
    key_id: KeyId,
    version: u16,
    next_index: u64,
    last_hash: Digest,
}

impl std::fmt::Debug for Chainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chainer")
            .field("key_id", &self.key_id)
            .field("version", &self.version)
            .field("next_index", &self.next_index)
            .field("last_hash", &self.last_hash)
            .finish_non_exhaustive()
    }
}

/// One signed record and where it lands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The record's bytes, length prefix through signature.
    pub record: Vec<u8>,
    /// Its index, entry id and hash.
    pub appended: Appended,
}

impl Chainer {
    /// A chain head that writes records of format `version`, signed by `key`, the next
    /// one at `next_index` linking to `last_hash` (a new chain: 0 and
    /// [`format::genesis_hash`]).
    pub fn new(key: SigningKey, version: u16, next_index: u64, last_hash: Digest) -> Chainer {
        Chainer {
            key_id: KeyId::of(key.verifying_key().as_bytes()),
            key,
            version,
            next_index,
            last_hash,
        }
    }

    /// The index the next record gets.
    pub const fn next_index(&self) -> u64 {
        self.next_index
    }

    /// The hash the next record links to.
    pub const fn last_hash(&self) -> Digest {
        self.last_hash
    }

    /// The signing key.
    pub const fn key(&self) -> &SigningKey {
        &self.key
    }

    /// The signing key's id.
    pub const fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// The format version of the records.
    pub const fn version(&self) -> u16 {
        self.version
    }

    /// Sign from now on with `key` (after a hand-over entry that names it).
    pub fn set_key(&mut self, key: SigningKey) {
        self.key_id = KeyId::of(key.verifying_key().as_bytes());
        self.key = key;
    }

    /// Continue from another head (what a journal knows is stored).
    pub fn reset(&mut self, next_index: u64, last_hash: Digest) {
        self.next_index = next_index;
        self.last_hash = last_hash;
    }

    /// Encode, sign and link `event` as the next record, with timestamp `ts`
    /// (nanoseconds since the Unix epoch) and a fresh UUIDv7 entry id; then advance the
    /// head. On error nothing changes.
    pub fn sign(&mut self, event: &Event, ts: i64) -> Result<Signed, EncodeError> {
        let mut random = [0u8; 10];
        if getrandom::fill(&mut random).is_err() {
            // Still unique within the log: the index is part of the chain position.
            for (slot, b) in random.iter_mut().zip(self.last_hash.0.iter()) {
                *slot = *b;
            }
        }
        let entry_id = entry::uuid_v7(ts, &random);
        let pos = Position {
            index: self.next_index,
            timestamp_ns: ts,
            entry_id,
            prev_hash: &self.last_hash,
        };
        let record =
            format::encode_record_version(self.version, pos, event, &self.key, self.key_id)?;
        let hash = format::sha256(&record);
        let appended = Appended {
            index: self.next_index,
            entry_id,
            hash,
        };
        self.last_hash = hash;
        self.next_index = self.next_index.saturating_add(1);
        Ok(Signed { record, appended })
    }
}
