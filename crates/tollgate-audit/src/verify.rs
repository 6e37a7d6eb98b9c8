//! The verifier: a pure function over the bytes of one or more log files, in chain order.
//! It checks every header, signature, index and link, and stops at the first break with
//! its place and kind.

use std::fmt;

use ed25519_dalek::VerifyingKey;
use tollgate_core::Digest;

use crate::checkpoint::Checkpoint;
use crate::entry::{AuditEntry, Event};
use crate::format::{self, FileHeader, HeaderError, RecordError, HEADER_LEN};
use crate::keys::KeyId;

/// How far ahead the verifier looks to tell a deleted entry from a reordered one.
const LOOKAHEAD: usize = 4096;
/// Records parsed and signature-checked together (in parallel).
pub(crate) const WINDOW: usize = 4096;
/// Below this many records a window is checked on the calling thread.
const PARALLEL_MIN: usize = 256;

/// Check the signatures of a window of records, following key hand-overs inside it.
/// Uses the machine's cores for large windows; the result is in record order.
pub(crate) fn check_signatures(
    window: &[(usize, format::Record<'_>, usize)],
    start_key: VerifyingKey,
    anchor: Option<u64>,
) -> Vec<bool> {
    // The key each record must verify under: hand-overs are applied in order. (A
    // hand-over that is itself forged fails its own signature check first.)
    let mut keys = Vec::with_capacity(window.len());
    let mut key = start_key;
    for (_, r, _) in window {
        keys.push(key);
        if let Event::KeyHandover { new_public_key } = &r.entry.event {
            if let Some(k) = format::public_key(new_public_key) {
                key = k;
            }
        }
    }
    let check = |(_, r, _): &(usize, format::Record<'_>, usize), k: &VerifyingKey| {
        // Below the anchor (a checkpoint whose signature is checked, and whose last hash
        // the chain must reach), an entry is authenticated by its link alone; a key
        // hand-over is checked all the same, since it says which key signs what follows.
        if anchor.is_some_and(|a| r.entry.index < a)
            && !matches!(r.entry.event, Event::KeyHandover { .. })
        {
            return true;
        }
        let sig = ed25519_dalek::Signature::from_bytes(&r.entry.signature);
        k.verify_strict(&r.signed_bytes(), &sig).is_ok()
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(16));
    if threads < 2 || window.len() < PARALLEL_MIN {
        return window.iter().zip(&keys).map(|(r, k)| check(r, k)).collect();
    }
    let chunk = window.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = window
            .chunks(chunk)
            .zip(keys.chunks(chunk))
            .map(|(rs, ks)| {
                s.spawn(move || {
                    rs.iter()
                        .zip(ks)
                        .map(|(r, k)| check(r, k))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        // A checker thread that died (it cannot: no panics) counts as failures.
        handles
            .into_iter()
            .zip(window.chunks(chunk))
            .flat_map(|(h, rs)| h.join().unwrap_or_else(|_| vec![false; rs.len()]))
            .collect()
    })
}

/// What the verifier is told to trust and check.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// The public key the log must start with. Without it the key in the first file
    /// header is trusted on first use (and the summary says so).
    pub trusted_key: Option<VerifyingKey>,
    /// An earlier checkpoint: the log must reach it and agree with it.
    pub checkpoint: Option<Checkpoint>,
    /// Accept a first file that is not file 0 (older files retired by retention). The
    /// first file's continuation hash is then taken on trust.
    pub allow_head_gap: bool,
    /// Check Ed25519 signatures (on by default). The writer turns this off to scan the
    /// tail file quickly when it opens a log; never turn it off to verify.
    pub check_signatures: bool,
    /// Let `checkpoint` vouch for the entries it counts (off by default): their
    /// signatures are not checked, only their chain links, which end at the checkpoint's
    /// `last-hash` under the checkpoint's own signature (checked, with the key the checked
    /// hand-overs lead to). Key hand-overs, and every entry after the checkpoint, are
    /// checked as always. As strong as checking every signature: an entry changed, added
    /// or removed before the checkpoint breaks the chain of hashes that the checkpoint
    /// signs (docs/audit-format.md "Verification"). Without `checkpoint`, no effect.
    /// A [`Verifier`] fed directly names the first break it sees (a link after a changed
    /// entry); [`crate::verify_paths`] verifies a refused log again in full, so it names
    /// the changed entry itself.
    pub anchor_on_checkpoint: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            trusted_key: None,
            checkpoint: None,
            allow_head_gap: false,
            check_signatures: true,
            anchor_on_checkpoint: false,
        }
    }
}

/// The kind of a break in the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BreakKind {
    /// A file header is not a valid, self-signed header.
    #[error("bad file header: {0}")]
    BadHeader(HeaderError),
    /// An entry's signature does not verify: the entry was changed.
    #[error("bad signature: the entry was altered")]
    BadSignature,
    /// An entry does not link to the entry before it.
    #[error("broken link: previous-entry hash is {found}, expected {expected}")]
    BrokenLink {
        /// Hash of the record before.
        expected: Digest,
        /// What the entry says.
        found: Digest,
    },
    /// The file ends inside a record: inside its length prefix, or before the end its
    /// length prefix declares.
    #[error("torn record: the file ends inside a record ({available} of {} bytes present)", needed.map_or_else(|| "its 4 length-prefix".to_owned(), |n| n.to_string()))]
    TornRecord {
        /// Bytes present from the record start to the end of the file.
        available: usize,
        /// The record's whole size as its length prefix declares, when the prefix is
        /// whole.
        needed: Option<u64>,
    },
    /// Everything from a record start to the end of the file is zero bytes (a write that
    /// never reached the disk). Like a torn record, the writer moves it aside on open.
    #[error("zero-filled tail: the last {length} bytes of the file are all zero")]
    ZeroFilledTail {
        /// Bytes from the record start to the end of the file.
        length: usize,
    },
    /// A length prefix is under the smallest record, or disagrees with the record's
    /// fields.
    #[error("bad length prefix: it says {declared} bytes, the fields {}", actual.map_or_else(|| "cannot be read to their end".to_owned(), |a| format!("need {a}")))]
    BadLength {
        /// What the prefix says (bytes after the prefix).
        declared: u32,
        /// What the fields need (bytes after the prefix), when they can be read.
        actual: Option<usize>,
    },
    /// A length prefix declares a record over the size limit.
    #[error("record too large: the length prefix declares {0} bytes, over the 65536-byte limit")]
    TooLarge(u64),
    /// A compressed (`.log.zst`) file cannot be decompressed: the archive is damaged.
    #[error("corrupt archive: {0}")]
    CorruptArchive(String),
    /// A file of an older format version follows a file of a newer one.
    #[error("version downgrade: a format-version-{found} file follows a version-{previous} file")]
    VersionDowngrade {
        /// The previous file's version.
        previous: u16,
        /// This file's version.
        found: u16,
    },
    /// A record field holds an impossible value.
    #[error("malformed record: {0}")]
    Malformed(&'static str),
    /// Entries are missing: the chain skips from `expected` to `found`.
    #[error("missing entry: expected index {expected}, found {found} (entries deleted)")]
    MissingEntry {
        /// The index that should be here.
        expected: u64,
        /// The index that is here.
        found: u64,
    },
    /// Entries are out of order.
    #[error("reordered entry: expected index {expected}, found {found}")]
    ReorderedEntry {
        /// The index that should be here.
        expected: u64,
        /// The index that is here.
        found: u64,
    },
    /// A file of the sequence is missing.
    #[error("missing file: expected file number {expected}, found {found}")]
    MissingFile {
        /// The file number that should come next.
        expected: u64,
        /// The one that did.
        found: u64,
    },
    /// Files are out of order (or one is repeated).
    #[error("reordered file: expected file number {expected}, found {found}")]
    ReorderedFile {
        /// The file number that should come next.
        expected: u64,
        /// The one that did.
        found: u64,
    },
    /// Signed by a key that is not the log's current key.
    #[error("unknown key `{found}` (expected `{expected}`)")]
    UnknownKey {
        /// The key the chain expects.
        expected: KeyId,
        /// The key that signed.
        found: KeyId,
    },
    /// The log ends before the checkpoint's count: its tail was cut.
    #[error("truncated below checkpoint: the checkpoint counts {checkpoint} entries, the log holds {entries}")]
    TruncatedBelowCheckpoint {
        /// The checkpoint's count.
        checkpoint: u64,
        /// Entries present.
        entries: u64,
    },
    /// The entry the checkpoint names hashes differently: the log was rewritten.
    #[error("checkpoint mismatch: entry {index} does not hash to the checkpoint's last hash")]
    CheckpointMismatch {
        /// The entry's index.
        index: u64,
    },
    /// The checkpoint is not signed by the key it must be: the key current after entry
    /// `count - 1` (the key that signs entry `count`), or, for a checkpoint the log does
    /// not reach, any key of the log.
    #[error("checkpoint signature does not verify with the log's key at the checkpoint")]
    BadCheckpoint,
    /// Nothing to verify.
    #[error("no log files")]
    Empty,
}

/// Where the log breaks, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Break {
    /// The file's name as given to the verifier.
    pub file: String,
    /// The chain index of the broken entry, when known (the index it should have had).
    pub index: Option<u64>,
    /// Byte offset in the file (0 for header and log-level breaks).
    pub offset: u64,
    /// What is wrong.
    pub kind: BreakKind,
}

impl fmt::Display for Break {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(
                f,
                "entry {i} in `{}` at offset {}: {}",
                self.file, self.offset, self.kind
            ),
            None => write!(
                f,
                "`{}` at offset {}: {}",
                self.file, self.offset, self.kind
            ),
        }
    }
}

impl std::error::Error for Break {}

/// What a whole log looked like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Files read.
    pub files: u64,
    /// Entries checked.
    pub entries: u64,
    /// The index of the first entry (0 unless the head was retired).
    pub first_index: u64,
    /// The index the next entry would get.
    pub next_index: u64,
    /// Hash of the last record (or the continuation hash of an empty log).
    pub last_hash: Digest,
    /// The key that signs at the tip.
    pub key_id: KeyId,
    /// Whether the starting key came from `trusted_key` (false: trusted on first use).
    pub key_trusted: bool,
    /// Whether a checkpoint was given and matched.
    pub checkpoint_matched: bool,
}

/// The chain state after the last whole record: what the writer continues from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tip {
    /// The next index.
    pub next_index: u64,
    /// Hash of the last record.
    pub last_hash: Digest,
    /// The key that must sign next.
    pub key: VerifyingKey,
    /// The next file number.
    pub next_file_seq: u64,
    /// The last file's header.
    pub header: FileHeader,
    /// Where the last file's whole records end.
    pub valid_len: u64,
}

/// Streaming verifier: feed files in order, then [`Verifier::finish`].
#[derive(Debug)]
pub struct Verifier {
    opts: VerifyOptions,
    tip: Option<Tip>,
    first_index: u64,
    files: u64,
    entries: u64,
    keys_seen: Vec<VerifyingKey>,
    checkpoint_matched: bool,
    /// The name of the last file fed, for log-level breaks found at the end.
    last_file: String,
}

impl Verifier {
    /// A verifier that has seen nothing.
    pub fn new(opts: VerifyOptions) -> Self {
        let keys_seen = opts.trusted_key.iter().copied().collect();
        Verifier {
            opts,
            tip: None,
            first_index: 0,
            files: 0,
            entries: 0,
            keys_seen,
            checkpoint_matched: false,
            last_file: String::new(),
        }
    }

    /// The chain state after the last whole record fed so far.
    pub fn tip(&self) -> Option<&Tip> {
        self.tip.as_ref()
    }

    /// Verify the next file. `visit` sees every entry that passed all checks, in order.
    pub fn feed_file(
        &mut self,
        name: &str,
        bytes: &[u8],
        visit: &mut dyn FnMut(&AuditEntry),
    ) -> Result<(), Break> {
        let brk = |index: Option<u64>, offset: usize, kind: BreakKind| Break {
            file: name.to_owned(),
            index,
            offset: offset as u64,
            kind,
        };
        self.last_file = name.to_owned();
        let header =
            FileHeader::decode(bytes).map_err(|e| brk(None, 0, BreakKind::BadHeader(e)))?;
        let header_key = header
            .verifying_key()
            .map_err(|e| brk(None, 0, BreakKind::BadHeader(e)))?;
        let mut tip = match self.tip.take() {
            None => {
                if let Some(trusted) = &self.opts.trusted_key {
                    if *trusted != header_key {
                        return Err(brk(
                            None,
                            0,
                            BreakKind::UnknownKey {
                                expected: KeyId::of(trusted.as_bytes()),
                                found: header.key_id,
                            },
                        ));
                    }
                }
                if !self.opts.allow_head_gap {
                    if header.file_seq != 0 {
                        return Err(brk(
                            None,
                            0,
                            BreakKind::MissingFile {
                                expected: 0,
                                found: header.file_seq,
                            },
                        ));
                    }
                    if header.first_index != 0 {
                        return Err(brk(
                            Some(0),
                            0,
                            BreakKind::MissingEntry {
                                expected: 0,
                                found: header.first_index,
                            },
                        ));
                    }
                    if header.prev_hash != format::genesis_hash() {
                        return Err(brk(
                            Some(0),
                            0,
                            BreakKind::BrokenLink {
                                expected: format::genesis_hash(),
                                found: header.prev_hash,
                            },
                        ));
                    }
                }
                if !self.keys_seen.contains(&header_key) {
                    self.keys_seen.push(header_key);
                }
                self.first_index = header.first_index;
                Tip {
                    next_index: header.first_index,
                    last_hash: header.prev_hash,
                    key: header_key,
                    next_file_seq: header.file_seq,
                    header: header.clone(),
                    valid_len: HEADER_LEN as u64,
                }
            }
            Some(tip) => {
                let next = tip.next_file_seq;
                let expected_key = KeyId::of(tip.key.as_bytes());
                let r = if header.file_seq > next {
                    Err(BreakKind::MissingFile {
                        expected: next,
                        found: header.file_seq,
                    })
                } else if header.file_seq < next {
                    Err(BreakKind::ReorderedFile {
                        expected: next,
                        found: header.file_seq,
                    })
                } else if header.version < tip.header.version {
                    Err(BreakKind::VersionDowngrade {
                        previous: tip.header.version,
                        found: header.version,
                    })
                } else if header.key_id != expected_key {
                    Err(BreakKind::UnknownKey {
                        expected: expected_key,
                        found: header.key_id,
                    })
                } else if header.first_index > tip.next_index {
                    Err(BreakKind::MissingEntry {
                        expected: tip.next_index,
                        found: header.first_index,
                    })
                } else if header.first_index < tip.next_index {
                    Err(BreakKind::ReorderedEntry {
                        expected: tip.next_index,
                        found: header.first_index,
                    })
                } else if header.prev_hash != tip.last_hash {
                    Err(BreakKind::BrokenLink {
                        expected: tip.last_hash,
                        found: header.prev_hash,
                    })
                } else {
                    Ok(())
                };
                let index = Some(tip.next_index);
                self.tip = Some(tip.clone());
                r.map_err(|k| brk(index, 0, k))?;
                Tip {
                    header: header.clone(),
                    valid_len: HEADER_LEN as u64,
                    ..tip
                }
            }
        };
        self.files += 1;
        tip.next_file_seq = header.file_seq.saturating_add(1);

        let mut offset = HEADER_LEN;
        // The tip is updated in place record by record, so that a caller sees the state
        // after the last whole record even when a later one breaks.
        self.tip = Some(tip);
        let Some(tip) = self.tip.as_mut() else {
            return Ok(());
        };
        let mut tip_key_id = KeyId::of(tip.key.as_bytes());
        while offset < bytes.len() {
            // Parse a window of records, check their signatures in parallel, then walk
            // them in order. The first break in chain order is the one reported.
            let mut window = Vec::with_capacity(WINDOW);
            let mut parse_error = None;
            let mut at = offset;
            while at < bytes.len() && window.len() < WINDOW {
                let rest = bytes.get(at..).unwrap_or_default();
                match format::parse_record_version(header.version, rest) {
                    Ok((record, used)) => {
                        window.push((at, record, used));
                        at = at.saturating_add(used);
                    }
                    Err(e) => {
                        parse_error = Some((at, e));
                        break;
                    }
                }
            }
            let anchor = self
                .opts
                .checkpoint
                .as_ref()
                .filter(|_| self.opts.anchor_on_checkpoint)
                .map(|c| c.count);
            let signatures_ok = if self.opts.check_signatures {
                check_signatures(&window, tip.key, anchor)
            } else {
                vec![true; window.len()]
            };
            for ((rec_offset, record, used), sig_ok) in window.iter().zip(signatures_ok) {
                let rec_offset = *rec_offset;
                let expected = tip.next_index;
                let e = &record.entry;
                if e.key_id != tip_key_id {
                    return Err(brk(
                        Some(expected),
                        rec_offset,
                        BreakKind::UnknownKey {
                            expected: tip_key_id,
                            found: e.key_id,
                        },
                    ));
                }
                if !sig_ok {
                    return Err(brk(Some(expected), rec_offset, BreakKind::BadSignature));
                }
                if let Err(kind) = check_place(
                    header.version,
                    bytes.get(rec_offset..).unwrap_or_default(),
                    *used,
                    e,
                    expected,
                    tip.last_hash,
                ) {
                    return Err(brk(Some(expected), rec_offset, kind));
                }
                let hash = record.hash();
                if let Event::KeyHandover { new_public_key } = &e.event {
                    // The parser accepted the key, so it is valid.
                    let new_key = format::public_key(new_public_key).ok_or_else(|| {
                        brk(
                            Some(expected),
                            rec_offset,
                            BreakKind::Malformed("hand-over names an invalid public key"),
                        )
                    })?;
                    tip.key = new_key;
                    tip_key_id = KeyId::of(new_key.as_bytes());
                    if !self.keys_seen.contains(&new_key) {
                        self.keys_seen.push(new_key);
                    }
                }
                if let Some(cp) = &self.opts.checkpoint {
                    if cp.count == expected.saturating_add(1) {
                        // INVARIANT (checkpoint-key): a checkpoint is signed by the key
                        // current after its last counted entry (after a hand-over at
                        // `count - 1`, the new key). The writer signs with that key.
                        if !cp.verify_with(&tip.key) {
                            return Err(brk(Some(expected), rec_offset, BreakKind::BadCheckpoint));
                        }
                        if cp.last_hash != hash {
                            return Err(brk(
                                Some(expected),
                                rec_offset,
                                BreakKind::CheckpointMismatch { index: expected },
                            ));
                        }
                        self.checkpoint_matched = true;
                    }
                }
                visit(e);
                tip.last_hash = hash;
                tip.next_index = expected.saturating_add(1);
                tip.valid_len = rec_offset.saturating_add(*used) as u64;
                self.entries += 1;
            }
            if let Some((at, e)) = parse_error {
                return Err(brk(Some(tip.next_index), at, record_break(e)));
            }
            offset = at;
        }
        Ok(())
    }

    /// Finish: check the checkpoint against the whole log and summarise.
    pub fn finish(self) -> Result<Summary, Break> {
        let Some(tip) = self.tip else {
            return Err(Break {
                file: String::new(),
                index: None,
                offset: 0,
                kind: BreakKind::Empty,
            });
        };
        let last_file = self.last_file;
        if let Some(cp) = &self.opts.checkpoint {
            if !self.checkpoint_matched {
                if !self.keys_seen.iter().any(|k| cp.verify_with(k)) {
                    return Err(Break {
                        file: last_file,
                        index: None,
                        offset: 0,
                        kind: BreakKind::BadCheckpoint,
                    });
                }
                if tip.next_index < cp.count {
                    return Err(Break {
                        file: last_file,
                        index: Some(tip.next_index),
                        offset: tip.valid_len,
                        kind: BreakKind::TruncatedBelowCheckpoint {
                            checkpoint: cp.count,
                            entries: tip.next_index,
                        },
                    });
                }
            }
        }
        Ok(Summary {
            files: self.files,
            entries: self.entries,
            first_index: self.first_index,
            next_index: tip.next_index,
            last_hash: tip.last_hash,
            key_id: KeyId::of(tip.key.as_bytes()),
            key_trusted: self.opts.trusted_key.is_some(),
            checkpoint_matched: self.checkpoint_matched,
        })
    }
}

/// The break a record that does not parse is.
pub(crate) fn record_break(e: RecordError) -> BreakKind {
    match e {
        RecordError::Torn { available, needed } => BreakKind::TornRecord { available, needed },
        RecordError::ZeroFilled { length } => BreakKind::ZeroFilledTail { length },
        RecordError::LengthMismatch { declared, actual } => {
            BreakKind::BadLength { declared, actual }
        }
        RecordError::TooLarge(n) => BreakKind::TooLarge(n),
        RecordError::Malformed(what) => BreakKind::Malformed(what),
    }
}

/// Whether a record with index `wanted` appears after the record at the start of `rest`
/// (which is `used` bytes long): that tells a reorder from a deletion.
/// Whether entry `e`, parsed from the start of `rest` (its `used` bytes), stands where
/// entry `expected` must, right after the entry whose hash is `last_hash`: else the break.
/// A wrong index is a missing entry when the expected one does not appear in the next
/// records of the file, and a reordering when it does (or when the index went back).
pub(crate) fn check_place(
    version: u16,
    rest: &[u8],
    used: usize,
    e: &AuditEntry,
    expected: u64,
    last_hash: Digest,
) -> Result<(), BreakKind> {
    if e.index != expected {
        return Err(
            if e.index > expected && !index_appears_later(version, rest, used, expected) {
                BreakKind::MissingEntry {
                    expected,
                    found: e.index,
                }
            } else {
                BreakKind::ReorderedEntry {
                    expected,
                    found: e.index,
                }
            },
        );
    }
    if e.prev_hash != last_hash {
        return Err(BreakKind::BrokenLink {
            expected: last_hash,
            found: e.prev_hash,
        });
    }
    Ok(())
}

pub(crate) fn index_appears_later(version: u16, rest: &[u8], used: usize, wanted: u64) -> bool {
    let mut off = used;
    for _ in 0..LOOKAHEAD {
        let Some(tail) = rest.get(off..) else {
            return false;
        };
        match format::parse_record_version(version, tail) {
            Ok((r, n)) => {
                if r.entry.index == wanted {
                    return true;
                }
                off = off.saturating_add(n);
            }
            Err(_) => return false,
        }
    }
    false
}

/// Verify whole files given in chain order, each as `(name, bytes)`.
pub fn verify(files: &[(&str, &[u8])], opts: &VerifyOptions) -> Result<Summary, Break> {
    verify_visit(files, opts, &mut |_| {})
}

/// [`verify`], showing every verified entry to `visit`.
pub fn verify_visit(
    files: &[(&str, &[u8])],
    opts: &VerifyOptions,
    visit: &mut dyn FnMut(&AuditEntry),
) -> Result<Summary, Break> {
    let mut v = Verifier::new(opts.clone());
    for (name, bytes) in files {
        v.feed_file(name, bytes, visit)?;
    }
    v.finish()
}
