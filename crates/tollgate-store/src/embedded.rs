//! [`EmbeddedStore`]: sessions in memory, persisted to a redb file by one group-committing
//! writer thread.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use redb::{Database, ReadableDatabase, ReadableTable};

#[cfg(doc)]
use crate::durable::Durable;
use crate::engine::{Engine, EngineLimits, Journal, Pending};
use crate::record;
use crate::session::{Budget, BudgetKey, Session};
use crate::wal::{self, Dirty, BUDGETS, FOLDED_SEQ, META, NONCES, SESSIONS};
#[cfg(doc)]
use crate::SessionStore;
use crate::StoreError;

/// Fold the log into the main tables after this many bytes of log at most.
const CHECKPOINT_BYTES: usize = 8 * 1024 * 1024;

/// The write-ahead log of the store at `db`: `<db>.wal`.
fn wal_path(db: &Path) -> PathBuf {
    let mut p = OsString::from(db.as_os_str());
    p.push(".wal");
    PathBuf::from(p)
}

/// Where a new log is written before it is renamed over the old one.
fn wal_tmp_path(wal: &Path) -> PathBuf {
    let mut p = OsString::from(wal.as_os_str());
    p.push(".tmp");
    PathBuf::from(p)
}

fn io_error(op: &'static str) -> impl Fn(std::io::Error) -> StoreError {
    move |e| StoreError::Backend {
        op,
        message: e.to_string(),
    }
}

/// When a [`Durable`] completes, relative to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Group commit with fsync: a `Durable` completes after the log record holding its
    /// change has been written to the write-ahead log file and `fdatasync`ed. Survives
    /// kill -9 and power loss.
    #[default]
    Batch,
    /// Group commit without fsync: a `Durable` completes once its batch is written to the
    /// log file (in the page cache). That survives kill -9 of the process, not power loss
    /// or an OS crash: those lose everything since the last checkpoint (checkpoints and
    /// [`SessionStore::close`] are durable), and may leave a log that opens only as
    /// [`StoreError::Corrupt`] (pages written back out of order). For tests and
    /// benchmarks.
    Never,
}

/// How to open an [`EmbeddedStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// Live sessions allowed; `create` fails with [`StoreError::SessionCap`] beyond it.
    /// Sessions loaded at open count toward it but are never refused (lowering the cap
    /// below what is stored only blocks new sessions).
    pub max_sessions: usize,
    /// When writes count as done.
    pub durability: Durability,
    /// The largest record read back at open, in bytes; a bigger one is
    /// [`StoreError::Corrupt`].
    pub max_record_bytes: usize,
    /// The most entries (seen nonces + reservations + per-tool counts) one session's
    /// state may hold; a commit beyond it is [`StoreError::StateTooLarge`]. Keeps every
    /// record well under `max_record_bytes`.
    pub max_state_entries: usize,
    /// Group commits between checkpoints (folding the write-ahead log file into the redb
    /// tables in one durable transaction, then starting a new, empty log file; also done
    /// after 8 MiB of log and at `close`). More means fewer, larger checkpoints and a
    /// longer replay at open after a crash.
    pub checkpoint_entries: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_sessions: 100_000,
            durability: Durability::Batch,
            max_record_bytes: 16 * 1024 * 1024,
            max_state_entries: 200_000,
            checkpoint_entries: 1024,
        }
    }
}

impl StoreOptions {
    pub(crate) fn limits(&self) -> EngineLimits {
        EngineLimits {
            max_sessions: self.max_sessions,
            max_state_entries: self.max_state_entries,
        }
    }
}

fn backend(op: &'static str) -> impl Fn(redb::Error) -> StoreError {
    move |e| StoreError::Backend {
        op,
        message: e.to_string(),
    }
}

/// What the writer thread has done since the store was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriterStats {
    /// Transactions committed (group commits).
    pub batches: u64,
    /// Session records written (after coalescing: one per session per batch).
    pub sessions_written: u64,
    /// Shared budget records written.
    pub budgets_written: u64,
    /// Time spent encoding, writing and committing (fsync and checkpoints included).
    pub write_time: std::time::Duration,
    /// Checkpoints (log folded into the main tables).
    pub checkpoints: u64,
    /// `fdatasync`s of the write-ahead log: one per batch under [`Durability::Batch`],
    /// none under [`Durability::Never`]. Counted before the batch's `Durable`s complete.
    pub log_syncs: u64,
}

/// A session store in one redb file and a write-ahead log file beside it.
///
/// Live sessions are held in memory (the authoritative copy), so `apply` is two locks, a
/// copy of the session without its nonce set, the closure, and one walk over the nonce
/// set to find what the closure changed: microseconds, no I/O. Every committed change is
/// queued for a single writer thread, which **group-commits**: it takes everything queued
/// (only the latest state of each session and budget, plus the nonces added and removed),
/// appends it as one checksummed record to the write-ahead log file `<path>.wal` with one
/// `write`, `fdatasync`s it, then completes every [`Durable`] of that batch. While one
/// batch is being fsynced the next one fills, so any number of concurrent sessions share
/// one fsync. With one call in flight per session, durable throughput is about
/// `sessions in flight / (2 × commit time)`: the sessions fall into two cohorts that
/// alternate between filling a batch and waiting for one.
///
/// On disk: the log file (a header, then one record per batch; format in the `wal`
/// module), and the redb tables `sessions` (id → session record without nonces, see
/// [`crate::record`]), `nonces` ((id, nonce) → ()), `budgets` (budget key → amounts)
/// and `meta` (the number of the last batch folded into the tables). Every
/// [`StoreOptions::checkpoint_entries`] group commits (or 8 MiB of log, or at `close`)
/// the writer folds the logged batches into the tables in one durable redb transaction,
/// then replaces the log with a new, empty one (written beside, fsynced, renamed over,
/// directory fsynced). At open, the batches in the log after the folded one are verified,
/// replayed and folded the same way before anything is loaded; a torn last record (a
/// write a crash cut short, never acknowledged) is cut off and logged, and copied to
/// `<path>.wal.torn`; damage anywhere else is [`StoreError::Corrupt`].
///
/// Guarantees:
/// - *Atomicity per change*: a session and its shared budget are written in the same
///   log record; a reader after a crash sees each change entirely or not at all.
/// - *Order*: batches commit in order, so when a change's `Durable` completes, every
///   change made before it (to any session) is durable too; after a crash the store holds
///   exactly the state after some prefix of the committed changes, a consistent cut
///   (never a state that skips a change and keeps a later one).
/// - *Failure is sticky*: if a batch fails to commit, its `Durable`s report the error and
///   every later change is refused with [`StoreError::Failed`]; reopen to recover the
///   last committed state.
/// - Opening takes redb's file lock, held until the store is closed: a second process
///   opening the same store fails. The log is only touched while the lock is held.
///
/// The trait methods do their work when called and return futures that are already
/// ready (only [`Durable`] ever waits); the `*_sync` methods are the same without a
/// future. Nothing here blocks on I/O except `close`, `open` and [`Durable::wait`].
#[derive(Debug)]
pub struct EmbeddedStore {
    engine: Arc<Engine>,
    writer: Mutex<Option<JoinHandle<Result<(), StoreError>>>>,
}

impl EmbeddedStore {
    /// Open (or create) the store at `path` (and its log, `<path>.wal`), replay the log,
    /// and load every session and budget back.
    ///
    /// Fails if the file is locked by another process, cannot be read, holds a record
    /// that does not decode (reported with its key), or the log is missing or damaged
    /// anywhere but in its last record (nothing is skipped: a store that silently forgot
    /// a tripped circuit would fail open).
    pub fn open(
        path: impl AsRef<Path>,
        options: StoreOptions,
    ) -> Result<EmbeddedStore, StoreError> {
        let path = path.as_ref();
        // redb's file lock is taken here and held until the writer thread ends (it owns
        // the `Database`). The log file and its temporary sibling are only read or
        // written between those two points, so the lock covers them too: a second
        // process fails here, before it looks at the log.
        let db = Database::create(path).map_err(|e| StoreError::Backend {
            op: "open",
            message: e.to_string(),
        })?;
        // Make sure every table exists, so reads below never meet a missing table.
        let init = || -> Result<(), redb::Error> {
            let txn = db.begin_write()?;
            txn.open_table(SESSIONS)?;
            txn.open_table(BUDGETS)?;
            txn.open_table(NONCES)?;
            txn.open_table(META)?;
            txn.commit()?;
            Ok(())
        };
        init().map_err(backend("initialize"))?;
        let wal = wal_path(path);
        let (folded, log) = recover(&db, &wal)?;
        let (sessions, budgets) = load(&db, &options)?;
        let engine = Arc::new(Engine::new(options.limits(), Some(Journal::new())));
        engine.load(sessions, budgets)?;
        let writer_engine = Arc::clone(&engine);
        let durability = options.durability;
        let checkpoint_entries = options.checkpoint_entries.max(1);
        let writer = std::thread::Builder::new()
            .name("tollgate-store-writer".into())
            .spawn(move || {
                let writer = Writer {
                    db: &db,
                    wal,
                    log,
                    durability,
                    dirty: Dirty::default(),
                    next_seq: folded.saturating_add(1),
                    log_entries: 0,
                    log_bytes: 0,
                    checkpoint_entries,
                };
                writer_loop(writer, &writer_engine)
            })
            .map_err(|e| StoreError::Backend {
                op: "spawn writer",
                message: e.to_string(),
            })?;
        Ok(EmbeddedStore {
            engine,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// The writer's counters so far (for metrics and benchmarks).
    pub fn writer_stats(&self) -> WriterStats {
        let Some(j) = self.engine.journal() else {
            return WriterStats::default();
        };
        let st = &j.stats;
        WriterStats {
            batches: st.batches.load(Ordering::Relaxed),
            sessions_written: st.sessions.load(Ordering::Relaxed),
            budgets_written: st.budgets.load(Ordering::Relaxed),
            write_time: std::time::Duration::from_nanos(st.write_nanos.load(Ordering::Relaxed)),
            checkpoints: st.checkpoints.load(Ordering::Relaxed),
            log_syncs: st.log_syncs.load(Ordering::Relaxed),
        }
    }

    /// [`SessionStore::close`], without a future: stop taking changes, write everything
    /// queued durably, and stop the writer. Idempotent.
    pub fn close_sync(&self) -> Result<(), StoreError> {
        if let Some(j) = self.engine.journal() {
            j.close();
        }
        let handle = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match handle {
            Some(h) => h.join().unwrap_or_else(|_| {
                Err(StoreError::Failed {
                    message: "the writer thread panicked".into(),
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        let _ = self.close_sync();
    }
}

/// Everything read back at open.
type Loaded = (Vec<Session>, Vec<(BudgetKey, Budget)>);

fn load(db: &Database, options: &StoreOptions) -> Result<Loaded, StoreError> {
    let max_record_bytes = options.max_record_bytes;
    let read = || -> Result<_, redb::Error> {
        let txn = db.begin_read()?;
        let sessions = txn.open_table(SESSIONS)?;
        let mut out = Vec::new();
        for row in sessions.iter()? {
            let (k, v) = row?;
            out.push((k.value().to_owned(), v.value().to_vec()));
        }
        let budgets = txn.open_table(BUDGETS)?;
        let mut bout = Vec::new();
        for row in budgets.iter()? {
            let (k, v) = row?;
            bout.push((k.value().to_owned(), v.value().to_vec()));
        }
        let nonces = txn.open_table(NONCES)?;
        let mut nout: HashMap<String, BTreeSet<u64>> = HashMap::new();
        for row in nonces.iter()? {
            let (k, _) = row?;
            let (id, n) = k.value();
            match nout.get_mut(id) {
                Some(set) => {
                    set.insert(n);
                }
                None => {
                    nout.insert(id.to_owned(), BTreeSet::from([n]));
                }
            }
        }
        Ok((out, bout, nout))
    };
    let (raw_sessions, raw_budgets, mut nonces) = read().map_err(backend("load"))?;
    let corrupt = |key: &str, reason: String| StoreError::Corrupt {
        key: key.chars().take(300).collect(),
        reason,
    };
    let mut sessions = Vec::with_capacity(raw_sessions.len());
    for (k, v) in raw_sessions {
        let s =
            record::decode_session(&v, max_record_bytes).map_err(|e| corrupt(&k, e.to_string()))?;
        if s.meta.session_id != k {
            return Err(corrupt(&k, "record names another session".into()));
        }
        let mut s = s;
        if let Some(set) = nonces.remove(&k) {
            if s.state.seen_nonces.is_empty() {
                s.state.seen_nonces = set.into();
            } else {
                s.state.seen_nonces.extend(set);
            }
        }
        if s.state_entries() > options.max_state_entries {
            return Err(corrupt(
                &k,
                format!(
                    "state holds {} entries, over the limit of {}",
                    s.state_entries(),
                    options.max_state_entries
                ),
            ));
        }
        sessions.push(s);
    }
    if let Some(id) = nonces.keys().next() {
        return Err(corrupt(
            id,
            "nonces of a session that does not exist".into(),
        ));
    }
    let mut budgets = Vec::with_capacity(raw_budgets.len());
    for (k, v) in raw_budgets {
        let key = record::parse_budget_key(&k).map_err(|e| corrupt(&k, e.to_string()))?;
        let b = record::decode_budget(&v).map_err(|e| corrupt(&k, e.to_string()))?;
        budgets.push((key, b));
    }
    Ok((sessions, budgets))
}

/// Replay the write-ahead log file left by a crash into the main tables (one durable
/// transaction), so that loading reads only the main tables, then start a new, empty log.
/// Returns the last batch number in the tables and the new log, open for appending.
///
/// Crash safety: the log is replaced only after the fold is durable, and the fold
/// records the last folded batch number in the same transaction as the changes, so a
/// crash anywhere leaves either the old log (whose batches up to that number are skipped
/// on the next open) or the new one.
fn recover(db: &Database, wal: &Path) -> Result<(u64, File), StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        key: wal.display().to_string(),
        reason,
    };
    let read_meta = || -> Result<Option<u64>, redb::Error> {
        let txn = db.begin_read()?;
        let meta = txn.open_table(META)?;
        Ok(meta.get(FOLDED_SEQ)?.map(|v| v.value()))
    };
    let stored = read_meta().map_err(backend("read log position"))?;
    // Stores written before the log moved to its own file kept it in a table (and have
    // no log position); one a crash left unreplayed cannot be read here, and must not be
    // dropped.
    if stored.is_none() && old_log_entries(db).map_err(backend("read log"))? > 0 {
        return Err(StoreError::Corrupt {
            key: "log".into(),
            reason: "an unreplayed log table of an older version of the store; \
                     open and close the file with that version first"
                .into(),
        });
    }
    let mut folded = stored.unwrap_or(0);
    let bytes = match File::open(wal) {
        Ok(mut f) => {
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes).map_err(io_error("read log"))?;
            Some(bytes)
        }
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(io_error("read log")(e)),
    };
    match bytes {
        Some(bytes) => {
            let log = wal::read_log(&bytes, folded).map_err(|e| corrupt(e.to_string()))?;
            if let Some(at) = log.torn_at {
                let tail = bytes.get(at..).unwrap_or_default();
                let aside = {
                    let mut p = OsString::from(wal.as_os_str());
                    p.push(".torn");
                    PathBuf::from(p)
                };
                // Session data: mode 0600, like the log.
                let saved = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&aside)
                    .and_then(|mut f| f.write_all(tail));
                tracing::warn!(
                    log = %wal.display(),
                    offset = at,
                    bytes = tail.len(),
                    copy = %aside.display(),
                    copied = saved.is_ok(),
                    "store log ends with a torn record (a write cut short by a crash); \
                     cutting it off"
                );
            }
            if log.replayed > 0 || stored.is_none() {
                // (Without a stored position: a crash during the first open, after the
                // log was made; record the position now.)
                folded = folded.max(log.last_seq);
                checkpoint(db, &log.dirty, folded).map_err(backend("replay log"))?;
            }
            Ok((folded, new_log(wal, folded.saturating_add(1))?))
        }
        // Tables that have had a log, without it: acknowledged changes may be gone.
        None if stored.is_some() => Err(corrupt("the write-ahead log file is missing".into())),
        None => {
            // A new store: the log first, then the mark that says there is one.
            let file = new_log(wal, 1)?;
            checkpoint(db, &Dirty::default(), 0).map_err(backend("initialize"))?;
            Ok((0, file))
        }
    }
}

/// Entries in the `log` table of a store written by an older version (0 if none).
fn old_log_entries(db: &Database) -> Result<u64, redb::Error> {
    const OLD_LOG: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log");
    let txn = db.begin_read()?;
    match txn.open_table(OLD_LOG) {
        Ok(t) => Ok(redb::ReadableTableMetadata::len(&t)?),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// Start a new, empty log whose first record will be batch `base`, atomically replacing
/// any log at `wal`: write it beside, fsync it, rename it over, fsync the directory. The
/// returned file appends (`O_APPEND`), mode 0600.
fn new_log(wal: &Path, base: u64) -> Result<File, StoreError> {
    let err = io_error("start log");
    let tmp = wal_tmp_path(wal);
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != ErrorKind::NotFound => return Err(err(e)),
        _ => {}
    }
    let mut file = OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(&err)?;
    file.write_all(&wal::header(base)).map_err(&err)?;
    file.sync_all().map_err(&err)?;
    std::fs::rename(&tmp, wal).map_err(&err)?;
    let dir = match wal.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir).and_then(|d| d.sync_all()).map_err(&err)?;
    Ok(file)
}

/// Fold `dirty` into the main tables and record `folded_seq` as the last batch folded,
/// in one durable transaction.
fn checkpoint(db: &Database, dirty: &Dirty, folded_seq: u64) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    {
        let mut sessions = txn.open_table(SESSIONS)?;
        let mut nonces = txn.open_table(NONCES)?;
        let mut budgets = txn.open_table(BUDGETS)?;
        dirty.apply(&mut sessions, &mut nonces, &mut budgets)?;
        txn.open_table(META)?.insert(FOLDED_SEQ, folded_seq)?;
    }
    txn.commit()?;
    Ok(())
}

/// The writer thread's state: the log file and the changes logged since the last
/// checkpoint.
struct Writer<'d> {
    db: &'d Database,
    wal: PathBuf,
    /// INVARIANT (log-tail): holds exactly the batches after the last folded one, up to
    /// `next_seq - 1`; only appended to (`O_APPEND`), replaced whole at a checkpoint.
    log: File,
    durability: Durability,
    dirty: Dirty,
    next_seq: u64,
    log_entries: u64,
    log_bytes: usize,
    checkpoint_entries: u64,
}

impl Writer<'_> {
    /// Append the batch to the log file with one write and (under [`Durability::Batch`])
    /// one `fdatasync`, however many sessions it holds. Then checkpoint if the log has
    /// grown.
    fn commit(
        &mut self,
        batch: &Pending,
        stats: &crate::engine::WriterStats,
    ) -> Result<(), StoreError> {
        let (entry, changes) = wal::encode_batch(batch);
        let seq = self.next_seq;
        let record = wal::frame(seq, &entry).ok_or_else(|| StoreError::Backend {
            op: "commit",
            message: format!(
                "a batch of {} bytes is over the log's limit of {} bytes",
                entry.len(),
                wal::MAX_ENTRY_BYTES
            ),
        })?;
        // INVARIANT (log-tail): a failed or partial write fails the store (the caller
        // stops writing), so at most a torn record is left at the end, cut off at open.
        self.log.write_all(&record).map_err(io_error("write log"))?;
        if self.durability == Durability::Batch {
            self.log.sync_data().map_err(io_error("sync log"))?;
            stats.log_syncs.fetch_add(1, Ordering::Relaxed);
        }
        self.next_seq = seq.saturating_add(1);
        self.dirty.absorb(changes);
        self.log_entries += 1;
        self.log_bytes = self.log_bytes.saturating_add(record.len());
        if self.log_entries >= self.checkpoint_entries || self.log_bytes >= CHECKPOINT_BYTES {
            self.checkpoint()?;
            stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Fold the logged changes into the tables durably, then start a new, empty log.
    fn checkpoint(&mut self) -> Result<(), StoreError> {
        if self.log_entries == 0 {
            return Ok(());
        }
        let last = self.next_seq.saturating_sub(1);
        checkpoint(self.db, &self.dirty, last).map_err(backend("checkpoint"))?;
        // INVARIANT (log-tail): every batch in the old log is now folded; the new one
        // starts at the next batch.
        self.log = new_log(&self.wal, self.next_seq)?;
        self.dirty = Dirty::default();
        self.log_entries = 0;
        self.log_bytes = 0;
        Ok(())
    }
}

fn writer_loop(mut writer: Writer<'_>, engine: &Engine) -> Result<(), StoreError> {
    let Some(journal) = engine.journal() else {
        return Ok(());
    };
    /// Completes the batch in hand and the one filling with an error if the writer
    /// unwinds, so that no `Durable` waits forever on a dead thread.
    struct OnUnwind<'j>(&'j Journal, Option<Arc<crate::durable::Batch>>);
    impl Drop for OnUnwind<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let e = StoreError::Failed {
                    message: "the writer thread panicked".into(),
                };
                if let Some(b) = self.1.take() {
                    b.complete(Err(e.clone()));
                }
                self.0.abandon(e);
            }
        }
    }
    let mut guard = OnUnwind(journal, None);
    let mut failed: Option<StoreError> = None;
    while let Some(batch) = journal.take() {
        guard.1 = Some(Arc::clone(&batch.batch));
        // After a failure nothing more is written: a later batch on disk without the
        // failed one would break the prefix guarantee.
        let outcome = match &failed {
            Some(e) => Err(StoreError::Failed {
                message: e.to_string(),
            }),
            None => {
                let t0 = std::time::Instant::now();
                let st = &journal.stats;
                let r = writer.commit(&batch, st);
                st.batches.fetch_add(1, Ordering::Relaxed);
                st.sessions
                    .fetch_add(batch.sessions.len() as u64, Ordering::Relaxed);
                st.budgets
                    .fetch_add(batch.budgets.len() as u64, Ordering::Relaxed);
                let nanos = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                st.write_nanos.fetch_add(nanos, Ordering::Relaxed);
                r
            }
        };
        // Release the snapshots before waking anyone.
        let Pending { batch: done, .. } = batch;
        if let Err(e) = &outcome {
            journal.fail(e.clone());
            failed.get_or_insert_with(|| e.clone());
        }
        done.complete(outcome);
        guard.1 = None;
    }
    if let Some(e) = failed {
        return Err(e);
    }
    // Graceful stop: fold the log into the tables, durably (this also makes everything
    // a `Durability::Never` store wrote without fsync durable).
    writer.checkpoint()
}

crate::ready_session_store!(EmbeddedStore, |s: &EmbeddedStore| s.close_sync());
