//! The tail reader: the entries of a log directory from a given chain index on, checked
//! for structure, index continuity and links (and signatures, given a key), for a state
//! store that replays the log after its last snapshot.
//!
//! It is not a verifier: it starts at the file that holds `from_index` and takes that
//! file's header on trust (its own signature is checked, but not that it continues the
//! files before it). Use [`crate::verify_paths`] to verify a whole log.
//!
//! Bounded: it reads the headers of the newest files (170 bytes each, decompressing only
//! that much of a `.zst`) to find where to start, then one file at a time through
//! [`files::read_log_file`] (at most 1 GiB per file); it never holds more than one file.

use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;
use tollgate_core::Digest;

use crate::entry::{AuditEntry, Event};
use crate::files::{self, ReadError};
use crate::format::{self, FileHeader, Record, HEADER_LEN};
use crate::keys::KeyId;
use crate::verify::{self, Break, BreakKind};

/// Where the log ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailEnd {
    /// The index the next entry will get.
    pub next_index: u64,
    /// The record hash of entry `next_index - 1`, or the genesis hash for an empty log.
    /// (For a log whose last files hold no record, the continuation hash their header
    /// names.)
    pub last_hash: Digest,
}

/// Why the tail could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TailError {
    /// The directory cannot be listed, or a file cannot be opened or read (or is larger
    /// than 1 GiB).
    #[error("`{path}`: {error}")]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// The failure.
        error: std::io::Error,
    },
    /// `from_index` is past the end of the log (the index the next entry will get).
    #[error("index {from_index} is past the end of the log, whose next index is {next_index}")]
    BeyondEnd {
        /// What was asked for.
        from_index: u64,
        /// Where the log ends.
        next_index: u64,
    },
    /// `from_index` comes before the first file in the directory: the files that held
    /// it are missing (or were retired).
    #[error(
        "index {from_index} is before the log's oldest file, which starts at index {first_index}"
    )]
    BeforeStart {
        /// What was asked for.
        from_index: u64,
        /// The first index of the oldest file present.
        first_index: u64,
    },
    /// The log is not whole from the file holding `from_index` on: a bad header, a
    /// missing or reordered file, a torn or zero-filled last record, a malformed record,
    /// a missing or reordered entry, a broken link, a corrupt `.zst` archive, or (with a
    /// key) an unknown key or a bad signature. The [`Break`] says where. Entries before
    /// the break have already been visited.
    #[error("{0}")]
    Break(Break),
    /// `visit` returned an error for the entry at `index`; nothing after it was read.
    #[error("entry {index}: {message}")]
    Visit {
        /// The entry's index.
        index: u64,
        /// What `visit` said.
        message: String,
    },
}

/// The chain state while reading.
struct Tip {
    next_index: u64,
    last_hash: Digest,
    next_file_seq: u64,
    version: u16,
    /// The key that signs the next entry, once signatures are being checked.
    key: Option<VerifyingKey>,
}

/// Read the entries of the log in `dir` from chain index `from_index` on, calling `visit`
/// for each in chain order, and return where the log ends.
///
/// It finds the file holding `from_index` by the headers' `first_index` (`.log` and
/// `.log.zst` files alike), parses every record from the start of that file to the end of
/// the log, and checks index continuity and links all the way, and file numbers and
/// header continuity from that file on. With `key`, it also checks the signature of every
/// entry it visits: `key` is the key that signs entry `from_index` (the log's current key
/// after entry `from_index - 1`), and it follows hand-overs from there, as do the later
/// file headers it checks. Without `key`, only structure is checked.
///
/// `from_index` equal to the end visits nothing and returns the end. A directory without
/// log files is an empty log (end 0, genesis hash). A torn or zero-filled last record is
/// an error: the writer cuts those when it opens, so read after the writer opened.
pub fn read_tail(
    dir: &Path,
    from_index: u64,
    key: Option<&VerifyingKey>,
    visit: &mut dyn FnMut(&AuditEntry) -> Result<(), String>,
) -> Result<TailEnd, TailError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |error| TailError::Io { path, error }
    };
    let logs = files::list_log_files(dir).map_err(io(dir))?;
    if logs.is_empty() {
        if from_index == 0 {
            return Ok(TailEnd {
                next_index: 0,
                last_hash: format::genesis_hash(),
            });
        }
        return Err(TailError::BeyondEnd {
            from_index,
            next_index: 0,
        });
    }
    // The newest file whose first index is at or before `from_index` holds it.
    let mut start = None;
    let mut oldest_first = 0;
    for (i, f) in logs.iter().enumerate().rev() {
        let bytes =
            files::read_log_prefix(&f.path, HEADER_LEN).map_err(|e| read_error(&f.path, e))?;
        let header = FileHeader::decode(&bytes)
            .map_err(|e| header_break(&f.path, BreakKind::BadHeader(e)))?;
        if header.first_index <= from_index {
            start = Some(i);
            break;
        }
        oldest_first = header.first_index;
    }
    let Some(start) = start else {
        return Err(TailError::BeforeStart {
            from_index,
            first_index: oldest_first,
        });
    };
    let mut tip: Option<Tip> = None;
    for f in logs.get(start..).unwrap_or_default() {
        let bytes = files::read_log_file(&f.path).map_err(|e| read_error(&f.path, e))?;
        read_file(&f.path, &bytes, &mut tip, from_index, key, visit)?;
    }
    let Some(tip) = tip else {
        // Unreachable: the start file was read.
        return Err(TailError::BeyondEnd {
            from_index,
            next_index: 0,
        });
    };
    if from_index > tip.next_index {
        return Err(TailError::BeyondEnd {
            from_index,
            next_index: tip.next_index,
        });
    }
    Ok(TailEnd {
        next_index: tip.next_index,
        last_hash: tip.last_hash,
    })
}

fn name_of(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn header_break(path: &Path, kind: BreakKind) -> TailError {
    TailError::Break(Break {
        file: name_of(path),
        index: None,
        offset: 0,
        kind,
    })
}

fn read_error(path: &Path, e: ReadError) -> TailError {
    match e {
        ReadError::CorruptArchive(reason) => header_break(path, BreakKind::CorruptArchive(reason)),
        other => TailError::Io {
            path: path.to_owned(),
            error: other.into_io(),
        },
    }
}

/// Read one file's header and records, continuing `tip`.
fn read_file(
    path: &Path,
    bytes: &[u8],
    tip: &mut Option<Tip>,
    from_index: u64,
    key: Option<&VerifyingKey>,
    visit: &mut dyn FnMut(&AuditEntry) -> Result<(), String>,
) -> Result<(), TailError> {
    let name = name_of(path);
    let brk = |index: Option<u64>, offset: usize, kind: BreakKind| {
        TailError::Break(Break {
            file: name.clone(),
            index,
            offset: offset as u64,
            kind,
        })
    };
    let header = FileHeader::decode(bytes).map_err(|e| brk(None, 0, BreakKind::BadHeader(e)))?;
    let tip = match tip {
        None => tip.insert(Tip {
            next_index: header.first_index,
            last_hash: header.prev_hash,
            next_file_seq: header.file_seq,
            version: header.version,
            key: None,
        }),
        Some(t) => {
            let kind = if header.file_seq > t.next_file_seq {
                Some(BreakKind::MissingFile {
                    expected: t.next_file_seq,
                    found: header.file_seq,
                })
            } else if header.file_seq < t.next_file_seq {
                Some(BreakKind::ReorderedFile {
                    expected: t.next_file_seq,
                    found: header.file_seq,
                })
            } else if header.version < t.version {
                Some(BreakKind::VersionDowngrade {
                    previous: t.version,
                    found: header.version,
                })
            } else if let Some(k) = t.key.filter(|k| KeyId::of(k.as_bytes()) != header.key_id) {
                Some(BreakKind::UnknownKey {
                    expected: KeyId::of(k.as_bytes()),
                    found: header.key_id,
                })
            } else if header.first_index > t.next_index {
                Some(BreakKind::MissingEntry {
                    expected: t.next_index,
                    found: header.first_index,
                })
            } else if header.first_index < t.next_index {
                Some(BreakKind::ReorderedEntry {
                    expected: t.next_index,
                    found: header.first_index,
                })
            } else if header.prev_hash != t.last_hash {
                Some(BreakKind::BrokenLink {
                    expected: t.last_hash,
                    found: header.prev_hash,
                })
            } else {
                None
            };
            if let Some(kind) = kind {
                return Err(brk(Some(t.next_index), 0, kind));
            }
            t.version = header.version;
            t
        }
    };
    tip.next_file_seq = header.file_seq.saturating_add(1);

    let mut offset = HEADER_LEN;
    while offset < bytes.len() {
        // A window of records, parsed; the signatures of those being visited are checked
        // together (in parallel when there are many).
        let mut window: Vec<(usize, Record<'_>, usize)> = Vec::new();
        let mut parse_error = None;
        let mut at = offset;
        while at < bytes.len() && window.len() < verify::WINDOW {
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
        // Records before `from_index` are not signature-checked; the first visited one
        // starts the key at `key`.
        let first_visited = window
            .iter()
            .position(|(_, r, _)| r.entry.index >= from_index)
            .unwrap_or(window.len());
        let checks = match key {
            Some(k) if first_visited < window.len() => {
                let start_key = *tip.key.get_or_insert(*k);
                let visited = window.get(first_visited..).unwrap_or_default();
                verify::check_signatures(visited, start_key, None)
            }
            _ => Vec::new(),
        };
        for (i, (rec_offset, record, used)) in window.iter().enumerate() {
            let rec_offset = *rec_offset;
            let expected = tip.next_index;
            let e = &record.entry;
            let visiting = e.index >= from_index;
            if visiting {
                if let Some(current) = tip.key {
                    let current_id = KeyId::of(current.as_bytes());
                    if e.key_id != current_id {
                        return Err(brk(
                            Some(expected),
                            rec_offset,
                            BreakKind::UnknownKey {
                                expected: current_id,
                                found: e.key_id,
                            },
                        ));
                    }
                    let sig_ok = i
                        .checked_sub(first_visited)
                        .and_then(|j| checks.get(j))
                        .copied()
                        .unwrap_or(false);
                    if !sig_ok {
                        return Err(brk(Some(expected), rec_offset, BreakKind::BadSignature));
                    }
                }
            }
            if let Err(kind) = verify::check_place(
                header.version,
                bytes.get(rec_offset..).unwrap_or_default(),
                *used,
                e,
                expected,
                tip.last_hash,
            ) {
                return Err(brk(Some(expected), rec_offset, kind));
            }
            if visiting {
                if let (Some(_), Event::KeyHandover { new_public_key }) = (tip.key, &e.event) {
                    // The parser accepted the key, so it is valid.
                    tip.key = format::public_key(new_public_key);
                }
                visit(e).map_err(|message| TailError::Visit {
                    index: e.index,
                    message,
                })?;
            }
            tip.last_hash = record.hash();
            tip.next_index = expected.saturating_add(1);
        }
        if let Some((at, e)) = parse_error {
            return Err(brk(Some(tip.next_index), at, verify::record_break(e)));
        }
        offset = at;
    }
    Ok(())
}
