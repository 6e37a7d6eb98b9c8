//! [`EmbeddedStore`]: sessions in memory, the audit log as their write-ahead log, and a
//! redb file of snapshots.
//!
//! Every durable change is one audit entry ([`crate::ops`]), so the audit log is the one
//! place a change becomes durable: the store writes nothing of its own on the path of a
//! change. A snapshot thread folds each entry the audit writer reports durable (its tap)
//! into a [`Ledger`] and, every few seconds, writes the sessions and budgets that changed
//! to the redb file, in one durable transaction with the chain position they reflect
//! (the index of the next entry and the hash of the last). Opening loads the snapshot and
//! folds the entries logged after it. So after a kill -9 at any instant the state is the
//! fold of the log, exactly: no change is durable in one place and missing from the other.

use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use tollgate_audit::{Committed, VerifyingKey};
use tollgate_core::{Digest, UnixNanos};

use crate::durable::Journal;
use crate::engine::Engine;
use crate::ledger::Ledger;
use crate::record;
use crate::session::{Budget, BudgetKey, Session};
use crate::StoreError;

const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
const BUDGETS: TableDefinition<&str, &[u8]> = TableDefinition::new("budgets");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// META key: the snapshot format.
const FORMAT_KEY: &str = "format";
/// The snapshot format this code writes and reads.
const FORMAT: &[u8] = b"tollgate-snapshot/1";
/// META key: the chain position: next index (u64 big-endian) then the last hash.
const POSITION_KEY: &str = "position";
/// META key: the public key that signs the entry at the position (32 bytes).
const KEY_KEY: &str = "key";

/// How to open an [`EmbeddedStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// Live sessions allowed; `create` fails with [`StoreError::SessionCap`] beyond it.
    /// Sessions loaded at open count toward it but are never refused.
    pub max_sessions: usize,
    /// The largest session record read back at open, in bytes; a bigger one is
    /// [`StoreError::Corrupt`].
    pub max_record_bytes: usize,
    /// Write a snapshot at most this often when something changed (default 5 s), ...
    pub snapshot_interval: Duration,
    /// ... or once this many entries were folded since the last one (default 100 000).
    /// Both bound how much of the log a restart replays.
    pub snapshot_entries: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_sessions: 100_000,
            max_record_bytes: 16 * 1024 * 1024,
            snapshot_interval: Duration::from_secs(5),
            snapshot_entries: 100_000,
        }
    }
}

/// What the snapshot thread is told.
enum Msg {
    /// Entries the audit writer made durable, in chain order.
    Entries(Vec<Committed>),
    /// Write a snapshot now (if anything changed), then answer.
    Snapshot(Sender<Result<SnapshotStats, StoreError>>),
    /// Fold what is queued, write a last snapshot, answer, and stop.
    Close(Sender<Result<SnapshotStats, StoreError>>),
    /// Answer with the fold so far (every session, with its shared budget loaded, and
    /// every shared budget): the live state to go on from after the journal recovered.
    Fold(Sender<Result<crate::engine::Fold, StoreError>>),
}

/// The audit writer's side of the tap: give [`Tap::into_fn`] to
/// `tollgate_audit::Writer::open_with_tap`.
#[derive(Debug)]
pub struct Tap(Sender<Msg>);

impl Tap {
    /// The callback the audit writer calls with each durable batch.
    pub fn into_fn(self) -> Box<dyn FnMut(Vec<Committed>) + Send> {
        let tx = self.0;
        Box::new(move |batch| {
            // A closed store no longer folds; the entries are in the log for next time.
            let _ = tx.send(Msg::Entries(batch));
        })
    }
}

/// The store's side of the tap: give it to [`EmbeddedStore::open`].
#[derive(Debug)]
pub struct TapReceiver {
    rx: Receiver<Msg>,
    tx: Sender<Msg>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Entries(_) => "Entries",
            Msg::Snapshot(_) => "Snapshot",
            Msg::Close(_) => "Close",
            Msg::Fold(_) => "Fold",
        })
    }
}

/// A connected tap: the writer's end and the store's.
pub fn tap() -> (Tap, TapReceiver) {
    let (tx, rx) = mpsc::channel();
    (Tap(tx.clone()), TapReceiver { rx, tx })
}

/// What opening did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreReport {
    /// Sessions live after opening.
    pub sessions: usize,
    /// The chain position the snapshot held.
    pub snapshot_index: u64,
    /// Entries folded from the log after the snapshot.
    pub replayed: u64,
    /// The chain position the state reflects.
    pub next_index: u64,
}

/// What snapshots have been written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SnapshotStats {
    /// Snapshots written since open.
    pub snapshots: u64,
    /// Session records written since open.
    pub sessions_written: u64,
    /// The chain position of the last snapshot.
    pub position: u64,
}

/// A session store held in memory, made durable by the audit log, snapshotted to redb.
///
/// `apply` is two locks, the closure and a submit to the audit writer: microseconds, no
/// I/O of its own. The one durable write of a change is its audit entry; its
/// [`crate::Durable`] completes when that entry is durable.
#[derive(Debug)]
pub struct EmbeddedStore {
    pub(crate) engine: Engine,
    control: Sender<Msg>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl EmbeddedStore {
    /// Open (or create) the snapshot file `path`, fold the audit log in `log_dir` from
    /// the snapshot's position to its end, and start the snapshot thread on `tap`.
    /// `journal` is where changes are written: the audit writer of `log_dir`, opened with
    /// `tap`'s other end, before this; `key` is that writer's key (the log's current key).
    ///
    /// Signatures of the entries folded are checked with the key the snapshot recorded
    /// for its position (following hand-overs after it). A rebuild from the start of the
    /// log (no snapshot) checks structure and links only: `tollgate audit verify` checks
    /// a whole log's signatures.
    ///
    /// Refuses to open ([`StoreError::Corrupt`]) when the snapshot and the log disagree:
    /// the log ends before the snapshot's position, the entry at the position does not
    /// link to the snapshot's last hash, or an entry does not fold (see
    /// [`crate::ops::replay`]). A missing snapshot file is an empty snapshot at the start
    /// of the log, so a store can be rebuilt from its log alone.
    pub fn open(
        path: impl AsRef<Path>,
        log_dir: impl AsRef<Path>,
        key: Option<&VerifyingKey>,
        journal: Arc<dyn Journal>,
        tap: TapReceiver,
        options: StoreOptions,
        now: UnixNanos,
    ) -> Result<(EmbeddedStore, StoreReport), StoreError> {
        let path = path.as_ref();
        prepare_file(path)?;
        // redb's file lock is held until the snapshot thread ends (it owns the
        // `Database`): a second process fails here.
        let db = Database::create(path).map_err(|e| StoreError::Backend {
            op: "open",
            message: e.to_string(),
        })?;
        init(&db)?;
        let mut ledger = load(&db, &options)?;
        let snapshot_index = ledger.next_index;
        let corrupt = |reason: String| StoreError::Mismatch {
            state: path.display().to_string(),
            log: log_dir.as_ref().display().to_string(),
            reason,
        };
        let mut fold_error = None;
        let from_key =
            match ledger.key {
                Some(k) if snapshot_index > 0 => Some(VerifyingKey::from_bytes(&k).map_err(
                    |e| StoreError::Corrupt {
                        key: KEY_KEY.into(),
                        reason: e.to_string(),
                    },
                )?),
                _ => None,
            };
        let end = tollgate_audit::read_tail(
            log_dir.as_ref(),
            snapshot_index,
            from_key.as_ref(),
            &mut |e| {
                // The reader checks every link after the first; the first must link to the
                // snapshot. Record hashes are not handed out by the reader: the ledger's last
                // hash is set from the reader's end below.
                let prev = (e.index == snapshot_index).then_some(e.prev_hash);
                ledger
                    .fold(e.index, Digest::default(), prev, &e.event)
                    .map_err(|err| {
                        let text = err.to_string();
                        fold_error = Some(err);
                        text
                    })
            },
        );
        let end = match end {
            Ok(end) => end,
            Err(e) => {
                return Err(corrupt(match fold_error {
                    Some(f) => format!("the audit log does not fold onto the snapshot: {f}"),
                    None => format!(
                        "the audit log cannot be read from the snapshot's position {snapshot_index}: {e}"
                    ),
                }))
            }
        };
        if end.next_index != ledger.next_index {
            return Err(corrupt(format!(
                "the audit log ends at {} but folding stopped at {}",
                end.next_index, ledger.next_index
            )));
        }
        if ledger.next_index > snapshot_index || snapshot_index == 0 {
            ledger.last_hash = end.last_hash;
        } else if end.last_hash != ledger.last_hash {
            return Err(corrupt(format!(
                "the entry before position {snapshot_index} is not the one the snapshot recorded"
            )));
        }
        // The writer opened the log with `key`, which it checked is the log's current key.
        if let Some(k) = key {
            ledger.key = Some(k.to_bytes());
        }
        let replayed = ledger.next_index - snapshot_index;
        if replayed > 0 || from_key.is_none() {
            write_snapshot(&db, &mut ledger)?;
        }
        // After the audit writer recovered from a failure, the live state may hold changes
        // whose entries were lost; the engine then reloads the ledger's fold, which holds
        // exactly the durable entries (the tap delivers each before its completion, and
        // the writer's recovery finishes before its new generation shows).
        let reload_tx = tap.tx.clone();
        let reload = crate::engine::Reload(Box::new(move || {
            let (tx, rx) = mpsc::channel();
            reload_tx
                .send(Msg::Fold(tx))
                .map_err(|_| StoreError::Closed)?;
            rx.recv().map_err(|_| StoreError::Closed)?
        }));
        let engine = Engine::new(options.max_sessions, Some(journal)).with_reload(reload);
        let sessions = ledger.sessions.values().cloned().map(|mut s| {
            s.last_heartbeat_ns = now;
            s
        });
        engine.load(
            sessions,
            ledger.budgets.iter().map(|(k, b)| (k.clone(), *b)),
        )?;
        let report = StoreReport {
            sessions: engine.len(),
            snapshot_index,
            replayed,
            next_index: ledger.next_index,
        };
        let control = tap.tx.clone();
        let thread = std::thread::Builder::new()
            .name("tollgate-store-snapshot".into())
            .spawn({
                let path = path.to_owned();
                move || snapshot_loop(db, &path, ledger, &tap.rx, options)
            })
            .map_err(|e| StoreError::Backend {
                op: "spawn snapshot thread",
                message: e.to_string(),
            })?;
        Ok((
            EmbeddedStore {
                engine,
                control,
                thread: Mutex::new(Some(thread)),
            },
            report,
        ))
    }

    /// Write a snapshot of everything folded so far (if anything changed), and wait.
    pub fn snapshot(&self) -> Result<SnapshotStats, StoreError> {
        let (tx, rx) = mpsc::channel();
        self.control
            .send(Msg::Snapshot(tx))
            .map_err(|_| StoreError::Closed)?;
        rx.recv().map_err(|_| StoreError::Closed)?
    }

    /// [`crate::SessionStore::close`], without a future: refuse further changes, fold
    /// what the audit writer has reported, write a last snapshot, and stop the snapshot
    /// thread. Idempotent. Close the audit writer first, so that every entry has been
    /// reported.
    pub fn close_sync(&self) -> Result<(), StoreError> {
        self.engine.stop(StoreError::Closed);
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(handle) = handle else { return Ok(()) };
        let (tx, rx) = mpsc::channel();
        let sent = self.control.send(Msg::Close(tx)).is_ok();
        let outcome = if sent {
            rx.recv().unwrap_or(Err(StoreError::Closed))
        } else {
            Ok(SnapshotStats::default())
        };
        let joined = handle.join();
        outcome?;
        joined.map_err(|_| StoreError::Failed {
            message: "the snapshot thread panicked".into(),
        })
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        let _ = self.close_sync();
    }
}

crate::ready_session_store!(EmbeddedStore, EmbeddedStore::close_sync);

fn backend(op: &'static str) -> impl Fn(redb::Error) -> StoreError {
    move |e| StoreError::Backend {
        op,
        message: e.to_string(),
    }
}

/// Create the snapshot file with mode 0640 whatever the umask (redb would create it
/// with the umask's mode), or check that an existing one is safe to trust: a regular
/// file of this process's user that nobody else may write.
fn prepare_file(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let shown = || path.display().to_string();
    let io = |e: std::io::Error| StoreError::Backend {
        op: "open",
        message: format!("`{}`: {e}", path.display()),
    };
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o640)
                .open(path)
                .map_err(io)?;
            f.set_permissions(std::fs::Permissions::from_mode(0o640))
                .map_err(io)
        }
        Err(e) => Err(io(e)),
        Ok(m) => {
            let reason = if !m.file_type().is_file() {
                Some("is not a regular file".to_owned())
            } else if m.uid() != rustix::process::geteuid().as_raw() {
                Some(format!(
                    "is owned by uid {}, not by this process's",
                    m.uid()
                ))
            } else if m.mode() & 0o022 != 0 {
                Some(format!(
                    "may be written by users other than its owner (mode {:04o})",
                    m.mode() & 0o7777
                ))
            } else {
                None
            };
            match reason {
                Some(reason) => Err(StoreError::Unsafe {
                    path: shown(),
                    reason,
                }),
                None => Ok(()),
            }
        }
    }
}

/// Make sure every table exists and the file is a snapshot file of this format.
fn init(db: &Database) -> Result<(), StoreError> {
    let check = || -> Result<Option<Vec<u8>>, redb::Error> {
        let txn = db.begin_write()?;
        let found = {
            let mut meta = txn.open_table(META)?;
            let found = meta.get(FORMAT_KEY)?.map(|v| v.value().to_vec());
            let empty = meta.is_empty()?;
            if empty {
                meta.insert(FORMAT_KEY, FORMAT)?;
            }
            txn.open_table(SESSIONS)?;
            txn.open_table(BUDGETS)?;
            if empty {
                None
            } else {
                Some(found.unwrap_or_default())
            }
        };
        txn.commit()?;
        Ok(found)
    };
    match check().map_err(|e| match e {
        // An older store's tables have other value types.
        redb::Error::TableTypeMismatch { .. } => StoreError::Incompatible {
            found: "a store written by tollgate 0.1 (its own write-ahead log)".into(),
        },
        other => backend("initialize")(other),
    })? {
        None => Ok(()),
        Some(f) if f == FORMAT => Ok(()),
        Some(f) => Err(StoreError::Incompatible {
            found: String::from_utf8_lossy(&f).chars().take(80).collect(),
        }),
    }
}

/// The snapshot as a ledger.
fn load(db: &Database, options: &StoreOptions) -> Result<Ledger, StoreError> {
    type Rows = Vec<(String, Vec<u8>)>;
    type Meta = (Option<Vec<u8>>, Option<Vec<u8>>);
    let read = || -> Result<(Rows, Rows, Meta), redb::Error> {
        let txn = db.begin_read()?;
        let mut sessions = Vec::new();
        for row in txn.open_table(SESSIONS)?.iter()? {
            let (k, v) = row?;
            sessions.push((k.value().to_owned(), v.value().to_vec()));
        }
        let mut budgets = Vec::new();
        for row in txn.open_table(BUDGETS)?.iter()? {
            let (k, v) = row?;
            budgets.push((k.value().to_owned(), v.value().to_vec()));
        }
        let meta = txn.open_table(META)?;
        let position = meta.get(POSITION_KEY)?.map(|v| v.value().to_vec());
        let key = meta.get(KEY_KEY)?.map(|v| v.value().to_vec());
        Ok((sessions, budgets, (position, key)))
    };
    let (sessions, budgets, (position, key)) = read().map_err(backend("load"))?;
    let corrupt = |key: &str, reason: String| StoreError::Corrupt {
        key: key.chars().take(300).collect(),
        reason,
    };
    let mut ledger = Ledger::new();
    if let Some(p) = position {
        let (index, hash) = p
            .split_first_chunk::<8>()
            .and_then(|(i, h)| Some((u64::from_be_bytes(*i), Digest::from_slice(h)?)))
            .ok_or_else(|| corrupt(POSITION_KEY, "not 40 bytes".into()))?;
        ledger.next_index = index;
        ledger.last_hash = hash;
    }
    if let Some(k) = key {
        let k = <[u8; 32]>::try_from(k.as_slice())
            .map_err(|_| corrupt(KEY_KEY, "not 32 bytes".into()))?;
        ledger.key = Some(k);
    }
    for (k, v) in sessions {
        let s = record::decode_session(&v, options.max_record_bytes, 0)
            .map_err(|e| corrupt(&k, e.to_string()))?;
        if s.meta.session_id != k {
            return Err(corrupt(&k, "record names another session".into()));
        }
        ledger.sessions.insert(k, s);
    }
    for (k, v) in budgets {
        let key = record::parse_budget_key(&k).map_err(|e| corrupt(&k, e.to_string()))?;
        let b = record::decode_budget(&v).map_err(|e| corrupt(&k, e.to_string()))?;
        ledger.budgets.insert(key, b);
    }
    for s in ledger.sessions.values() {
        if let Some(k) = s.meta.shared_budget_key() {
            if !ledger.budgets.contains_key(&k) {
                return Err(StoreError::BudgetMissing { key: k });
            }
        }
    }
    ledger.take_dirty();
    Ok(ledger)
}

/// Write what changed in `ledger` since the last snapshot, and its position, in one
/// durable transaction.
fn write_snapshot(db: &Database, ledger: &mut Ledger) -> Result<u64, StoreError> {
    let (sessions, budgets) = ledger.take_dirty();
    let write = || -> Result<u64, redb::Error> {
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::Immediate)?;
        let mut written = 0u64;
        {
            let mut table = txn.open_table(SESSIONS)?;
            for id in &sessions {
                if let Some(s) = ledger.sessions.get(id) {
                    table.insert(id.as_str(), record::encode_session(s).as_slice())?;
                    written += 1;
                } else {
                    // Closed since the last snapshot: the snapshot forgets it too.
                    table.remove(id.as_str())?;
                }
            }
            let mut table = txn.open_table(BUDGETS)?;
            for k in &budgets {
                if let Some(b) = ledger.budgets.get(k) {
                    table.insert(
                        record::budget_key_string(k).as_str(),
                        record::encode_budget(b).as_slice(),
                    )?;
                }
            }
            let mut position = ledger.next_index.to_be_bytes().to_vec();
            position.extend_from_slice(ledger.last_hash.as_bytes());
            let mut meta = txn.open_table(META)?;
            meta.insert(POSITION_KEY, position.as_slice())?;
            if let Some(k) = &ledger.key {
                meta.insert(KEY_KEY, k.as_slice())?;
            }
        }
        txn.commit()?;
        Ok(written)
    };
    write().map_err(|e| {
        // Nothing was written: what changed is still to be written by the next snapshot
        // (else it would record a position past changes it does not hold).
        ledger.restore_dirty(sessions, budgets);
        backend("snapshot")(e)
    })
}

/// The snapshot thread: fold every reported entry; snapshot on time, on count, on
/// request and at close. A fold that fails stops snapshots (the live state has left the
/// log's, which is a bug to report, not to persist): the next open replays from the last
/// good snapshot and names the entry.
fn snapshot_loop(
    db: Database,
    path: &Path,
    mut ledger: Ledger,
    rx: &Receiver<Msg>,
    options: StoreOptions,
) {
    // redb refuses everything after an I/O error (a full disk) until the database is
    // opened again: a failed snapshot closes it, and the next one reopens it.
    let db = std::cell::RefCell::new(Some(db));
    let mut stats = SnapshotStats {
        position: ledger.next_index,
        ..SnapshotStats::default()
    };
    let mut broken: Option<StoreError> = None;
    let mut since = 0u64;
    let mut last = Instant::now();
    let interval = options.snapshot_interval.max(Duration::from_millis(10));
    let snap = |ledger: &mut Ledger,
                stats: &mut SnapshotStats,
                broken: &Option<StoreError>|
     -> Result<SnapshotStats, StoreError> {
        if let Some(e) = broken {
            return Err(e.clone());
        }
        if ledger.is_dirty() || stats.position != ledger.next_index {
            let mut slot = db.borrow_mut();
            if slot.is_none() {
                let reopened = Database::create(path).map_err(|e| StoreError::Backend {
                    op: "reopen",
                    message: e.to_string(),
                })?;
                init(&reopened)?;
                *slot = Some(reopened);
            }
            let Some(open) = slot.as_ref() else {
                return Err(StoreError::Closed);
            };
            let n = match write_snapshot(open, ledger) {
                Ok(n) => n,
                Err(e) => {
                    *slot = None;
                    return Err(e);
                }
            };
            stats.snapshots += 1;
            stats.sessions_written += n;
            stats.position = ledger.next_index;
        }
        Ok(*stats)
    };
    loop {
        let wait = interval.saturating_sub(last.elapsed());
        match rx.recv_timeout(wait) {
            Ok(Msg::Entries(batch)) => {
                if broken.is_some() {
                    continue;
                }
                for c in batch {
                    if let Err(e) = ledger.fold(c.index, c.hash, None, &c.event) {
                        tracing::error!("state snapshots stopped: {e}");
                        broken = Some(StoreError::Failed {
                            message: format!("folding the audit log: {e}"),
                        });
                        break;
                    }
                    since += 1;
                }
                if since >= options.snapshot_entries.max(1) {
                    if let Err(e) = snap(&mut ledger, &mut stats, &broken) {
                        tracing::error!("state snapshot failed: {e}");
                    }
                    since = 0;
                    last = Instant::now();
                }
            }
            Ok(Msg::Snapshot(reply)) => {
                let _ = reply.send(snap(&mut ledger, &mut stats, &broken));
                since = 0;
                last = Instant::now();
            }
            Ok(Msg::Fold(reply)) => {
                let fold = match &broken {
                    Some(e) => Err(e.clone()),
                    None => Ok((
                        ledger
                            .sessions
                            .keys()
                            .filter_map(|id| ledger.session(id))
                            .collect(),
                        ledger
                            .budgets
                            .iter()
                            .map(|(k, b)| (k.clone(), *b))
                            .collect(),
                    )),
                };
                let _ = reply.send(fold);
            }
            Ok(Msg::Close(reply)) => {
                // Everything reported before the close was sent is already queued ahead
                // of it; fold it, then write the last snapshot.
                while let Ok(m) = rx.try_recv() {
                    if let Msg::Entries(batch) = m {
                        for c in batch {
                            if broken.is_none() {
                                if let Err(e) = ledger.fold(c.index, c.hash, None, &c.event) {
                                    broken = Some(StoreError::Failed {
                                        message: format!("folding the audit log: {e}"),
                                    });
                                }
                            }
                        }
                    }
                }
                let _ = reply.send(snap(&mut ledger, &mut stats, &broken));
                return;
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = snap(&mut ledger, &mut stats, &broken) {
                    if broken.is_none() {
                        tracing::error!("state snapshot failed: {e}");
                    }
                }
                since = 0;
                last = Instant::now();
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Every session and budget of `store`'s live state: for tests that compare the live
/// state with the fold of the log.
#[doc(hidden)]
pub fn dump(store: &EmbeddedStore) -> (Vec<Session>, Vec<(BudgetKey, Budget)>) {
    store.engine.dump()
}
