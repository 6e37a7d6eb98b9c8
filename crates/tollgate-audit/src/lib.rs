//! # tollgate-audit: the signed, chain-linked, append-only audit log
//!
//! Every change of a session's state (opened, verdict, settlement, human decision) is
//! written here, signed with Ed25519 and linked to the entry before it by SHA-256, before
//! it takes effect. Anyone with the public key can verify a log and learn exactly where
//! and how it breaks if it was changed, cut, reordered or spliced. The log is also the
//! session store's write-ahead log: the store replays it after its last snapshot with
//! [`read_tail`] and follows it live through the writer's tap
//! ([`Writer::open_with_tap`]). docs/audit-format.md is the byte-level specification.
//!
//! - [`format`](mod@format): the byte layout (pure): headers, records, signed bytes, hashes.
//! - [`verify`](mod@verify): the verifier (pure over bytes), plus [`verify_paths`] for files and
//!   directories.
//! - [`Writer`]: a dedicated thread that signs, chains, writes and fsyncs in batches
//!   (group commit), rotates and compresses files, writes checkpoints and recovers torn
//!   tails. Callers get a [`Pending`] they can `.await` or [`Pending::wait`] on.
//! - [`read_tail`]: the entries from a given index on, for replay.
//! - [`keys`], [`checkpoint`], [`export`]: key files, signed checkpoints, auditor export.
//! - [`params`]: what a verdict records of its call's params (`[audit] params`).
//!
//! What this crate does **not** do: it decides nothing (verdicts come from
//! `tollgate-core`), it has no async runtime dependency, and it never seeks back to write:
//! files are opened `O_APPEND`, and the only rewrite is cutting a torn tail on open, after
//! copying it aside. It does not lock the log directory: one writer per directory is the
//! caller's duty.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod chain;
pub mod checkpoint;
mod completion;
pub mod entry;
pub mod export;
pub mod files;
pub mod format;
pub mod keys;
pub mod params;
pub mod tail;
pub mod verify;
pub mod writer;

use std::io::Read as _;
use std::path::{Path, PathBuf};

pub use chain::{Chainer, Signed};
pub use checkpoint::Checkpoint;
pub use completion::{pair as pending_pair, Completer, Pending};
pub use ed25519_dalek::{SigningKey, VerifyingKey};
pub use entry::{
    is_recordable_upstream, recorded_upstream, AuditEntry, CloseReason, CloseRecord, CostStatus,
    DecisionRecord, Draw, Event, ParamsMode, PolicyEffect, PolicyNote, PolicySetCause,
    PolicySetRecord, RecordedParams, SessionEvent, SessionRecord, SettlementRecord, ShadowNote,
    VerdictRecord, VoidRecord, MAX_RECORDED_PARAMS, MAX_SHADOW_NOTES, MAX_UPSTREAM_BYTES,
    REDACTED_MARKER, SHADOW_SET_NAME,
};
pub use keys::KeyId;
pub use tail::{read_tail, TailEnd, TailError};
pub use verify::{verify, Break, BreakKind, Summary, Verifier, VerifyOptions};
pub use writer::{
    Appended, Clock, Committed, FsyncPolicy, Health, OpenError, OpenReport, Recovered, Stats,
    SystemClock, Tap, WriteError, Writer, WriterConfig,
};

/// Why files could not be verified.
#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    /// A file or directory could not be read (or a file is larger than 1 GiB).
    #[error("`{path}`: {error}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The failure (in the message, not a separate error source, so that a report
        /// that prints the chain does not print it twice).
        error: std::io::Error,
    },
    /// The log is not whole.
    #[error("{0}")]
    Break(Break),
}

/// The log files named by `paths`, in chain order: a directory stands for its log files
/// in file-number order; files are taken in the order given.
pub fn collect_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, PathsError> {
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(|error| PathsError::Io {
            path: p.clone(),
            error,
        })?;
        if meta.is_dir() {
            let listed = files::list_log_files(p).map_err(|error| PathsError::Io {
                path: p.clone(),
                error,
            })?;
            out.extend(listed.into_iter().map(|f| f.path));
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Verify the log files named by `paths` (see [`collect_files`]), showing every verified
/// entry to `visit`. A `.zst` file that does not decompress is a break of kind
/// [`BreakKind::CorruptArchive`] (the log is damaged), not an I/O error.
pub fn verify_paths(
    paths: &[PathBuf],
    opts: &VerifyOptions,
    visit: &mut dyn FnMut(&AuditEntry),
) -> Result<Summary, PathsError> {
    verify_paths_watched(paths, opts, visit, &mut |_, _| {})
}

/// [`verify_paths`], telling `on_file` each file (its path, and its bytes as read and
/// decompressed) before its entries are verified: what a progress display needs.
///
/// Anchored on a checkpoint ([`VerifyOptions::anchor_on_checkpoint`]), a changed entry
/// below the anchor is caught at a link or at the checkpoint's hash, not at its own
/// signature; so a log refused that way is verified again with every signature checked,
/// and the break named is the one a full verification names (the changed entry itself).
pub fn verify_paths_watched(
    paths: &[PathBuf],
    opts: &VerifyOptions,
    visit: &mut dyn FnMut(&AuditEntry),
    on_file: &mut dyn FnMut(&Path, &[u8]),
) -> Result<Summary, PathsError> {
    match verify_paths_once(paths, opts, visit, on_file) {
        Err(PathsError::Break(anchored)) if opts.anchor_on_checkpoint => {
            let full = VerifyOptions {
                anchor_on_checkpoint: false,
                ..opts.clone()
            };
            match verify_paths_once(paths, &full, &mut |_| {}, &mut |_, _| {}) {
                Err(e) => Err(e),
                // (Cannot be: anchoring is as strong as checking every signature.)
                Ok(_) => Err(PathsError::Break(anchored)),
            }
        }
        other => other,
    }
}

fn verify_paths_once(
    paths: &[PathBuf],
    opts: &VerifyOptions,
    visit: &mut dyn FnMut(&AuditEntry),
    on_file: &mut dyn FnMut(&Path, &[u8]),
) -> Result<Summary, PathsError> {
    let mut v = Verifier::new(opts.clone());
    for path in collect_files(paths)? {
        let bytes = files::read_log_file(&path).map_err(|e| match e {
            files::ReadError::CorruptArchive(reason) => PathsError::Break(Break {
                file: display_name(&path),
                index: None,
                offset: 0,
                kind: BreakKind::CorruptArchive(reason),
            }),
            other => PathsError::Io {
                path: path.clone(),
                error: other.into_io(),
            },
        })?;
        on_file(&path, &bytes);
        v.feed_file(&display_name(&path), &bytes, visit)
            .map_err(PathsError::Break)?;
    }
    v.finish().map_err(PathsError::Break)
}

/// Why a checkpoint file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadCheckpointError {
    /// The file could not be read.
    #[error("`{path}`: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure (in the message only, so that it is not printed twice).
        error: std::io::Error,
    },
    /// The file is larger than [`checkpoint::MAX_CHECKPOINT_BYTES`]: not a checkpoint.
    #[error("`{path}`: larger than 4096 bytes, not a checkpoint")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file is not a checkpoint.
    #[error("`{path}`: {error}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (in the message only).
        error: checkpoint::CheckpointError,
    },
}

/// The latest checkpoint of a log directory (or a checkpoint file), read and parsed. Its
/// signature is not checked here: see [`Checkpoint::verify_with`].
pub fn read_checkpoint(path: &Path) -> Result<Checkpoint, ReadCheckpointError> {
    let file = if path.is_dir() {
        path.join(files::CHECKPOINT_FILE)
    } else {
        path.to_owned()
    };
    let io = |error| ReadCheckpointError::Io {
        path: file.clone(),
        error,
    };
    let mut text = String::new();
    std::fs::File::open(&file)
        .and_then(|f| {
            f.take(checkpoint::MAX_CHECKPOINT_BYTES + 1)
                .read_to_string(&mut text)
        })
        .map_err(io)?;
    if text.len() as u64 > checkpoint::MAX_CHECKPOINT_BYTES {
        return Err(ReadCheckpointError::TooLarge { path: file });
    }
    Checkpoint::parse(&text).map_err(|error| ReadCheckpointError::Parse { path: file, error })
}

fn display_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
