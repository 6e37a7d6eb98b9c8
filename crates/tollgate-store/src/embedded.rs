//! [`EmbeddedStore`]: sessions in memory, persisted to a redb file by one group-committing
//! writer thread.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use redb::{Database, ReadableDatabase, ReadableTable};

use crate::durable::Durable;
use crate::engine::{Engine, EngineLimits, Journal, Pending};
use crate::record;
use crate::session::{Budget, BudgetKey, Session};
use crate::wal::{self, Dirty, BUDGETS, LOG, NONCES, SESSIONS};
use crate::{Change, SessionStore, StoreError};

/// Fold the log into the main tables after this many bytes of log at most.
const CHECKPOINT_BYTES: usize = 8 * 1024 * 1024;

/// When a [`Durable`] completes, relative to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Group commit with fsync: a `Durable` completes after the redb transaction holding
    /// its change has committed durably (redb `Durability::Immediate`: data and the
    /// commit record are fsynced). Survives kill -9 and power loss.
    #[default]
    Batch,
    /// Group commit without fsync (redb `Durability::None`): a `Durable` completes when
    /// its batch is committed in memory. Everything since the last durable commit is lost
    /// on a crash; [`SessionStore::close`] makes it durable. For tests and benchmarks.
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
    /// Group commits between checkpoints (folding the write-ahead log into the main
    /// tables; also done after 8 MiB of log and at `close`). More means fewer, larger
    /// checkpoints and a longer replay at open after a crash.
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
    /// Time spent encoding, writing and committing (fsync included).
    pub write_time: std::time::Duration,
    /// Checkpoints (log folded into the main tables).
    pub checkpoints: u64,
}

/// A session store in one redb file.
///
/// Live sessions are held in memory (the authoritative copy), so `apply` is two locks, a
/// copy of the session without its nonce set, the closure, and one walk over the nonce
/// set to find what the closure changed: microseconds, no I/O. Every committed change is
/// queued for a single writer thread, which **group-commits**: it takes everything queued
/// (only the latest state of each session and budget, plus the nonces added and removed),
/// appends it as one entry to a write-ahead log table in one redb write transaction,
/// commits it durably, then completes every [`Durable`] of that batch. While one batch is
/// being fsynced the next one fills, so any number of concurrent sessions share one fsync.
/// With one call in flight per session, durable throughput is about
/// `sessions in flight / (2 × commit time)`: the sessions fall into two cohorts that
/// alternate between filling a batch and waiting for one.
///
/// On disk (redb tables): `log` (batch number → entry, see the `wal` module), and the
/// main tables `sessions` (id → session record without nonces, see [`crate::record`]),
/// `nonces` ((id, nonce) → ()) and `budgets` (budget key → amounts). Every
/// [`StoreOptions::checkpoint_entries`] group commits (or 8 MiB of log, or at `close`)
/// the writer folds the log into the main tables and empties it in one transaction; at
/// open, a log left by a crash is replayed the same way before anything is loaded.
///
/// Guarantees:
/// - *Atomicity per change*: a session and its shared budget are written in the same
///   transaction; a reader after a crash sees each change entirely or not at all.
/// - *Order*: batches commit in order, so when a change's `Durable` completes, every
///   change made before it (to any session) is durable too; after a crash the store holds
///   exactly the state after some prefix of the committed changes, a consistent cut
///   (never a state that skips a change and keeps a later one).
/// - *Failure is sticky*: if a batch fails to commit, its `Durable`s report the error and
///   every later change is refused with [`StoreError::Failed`]; reopen to recover the
///   last committed state.
/// - Opening takes redb's file lock: a second process opening the same file fails.
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
    /// Open (or create) the store at `path` and load every session and budget back.
    ///
    /// Fails if the file is locked by another process, cannot be read, or holds a record
    /// that does not decode (reported with its key; nothing is skipped: a store that
    /// silently forgot a tripped circuit would fail open).
    pub fn open(
        path: impl AsRef<Path>,
        options: StoreOptions,
    ) -> Result<EmbeddedStore, StoreError> {
        let db = Database::create(path.as_ref()).map_err(|e| StoreError::Backend {
            op: "open",
            message: e.to_string(),
        })?;
        // Make sure both tables exist, so reads below never meet a missing table.
        let init = || -> Result<(), redb::Error> {
            let txn = db.begin_write()?;
            txn.open_table(SESSIONS)?;
            txn.open_table(BUDGETS)?;
            txn.open_table(NONCES)?;
            txn.open_table(LOG)?;
            txn.commit()?;
            Ok(())
        };
        init().map_err(backend("initialize"))?;
        recover(&db)?;
        let (sessions, budgets) = load(&db, &options)?;
        let engine = Arc::new(Engine::new(options.limits(), Some(Journal::new())));
        engine.load(sessions, budgets)?;
        let writer_engine = Arc::clone(&engine);
        let durability = options.durability;
        let checkpoint_entries = options.checkpoint_entries.max(1);
        let writer = std::thread::Builder::new()
            .name("tollgate-store-writer".into())
            .spawn(move || writer_loop(&db, &writer_engine, durability, checkpoint_entries))
            .map_err(|e| StoreError::Backend {
                op: "spawn writer",
                message: e.to_string(),
            })?;
        Ok(EmbeddedStore {
            engine,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// How many sessions are live.
    pub fn len(&self) -> usize {
        self.engine.len()
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
        }
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// [`SessionStore::create`], without a future.
    pub fn create_sync(&self, session: Session) -> Result<Durable, StoreError> {
        self.engine.create(session)
    }

    /// [`SessionStore::apply`], without a future.
    pub fn apply_sync<R>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Session) -> Change<R>,
    ) -> Result<(R, Durable), StoreError> {
        self.engine.apply(id, f)
    }

    /// [`SessionStore::get`], without a future.
    pub fn get_sync(&self, id: &str) -> Result<Option<Session>, StoreError> {
        self.engine.get(id)
    }

    /// [`SessionStore::remove`], without a future.
    pub fn remove_sync(&self, id: &str) -> Result<Durable, StoreError> {
        self.engine.remove(id)
    }

    /// [`SessionStore::list`], without a future.
    pub fn list_sync(&self, org: Option<&str>) -> Result<Vec<Session>, StoreError> {
        self.engine
            .list(|s| org.is_none_or(|o| s.meta.organization_id == o))
    }

    /// [`SessionStore::budget`], without a future.
    pub fn budget_sync(&self, key: &BudgetKey) -> Result<Option<Budget>, StoreError> {
        self.engine.budget(key)
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

/// Replay the write-ahead log left by a crash into the main tables (one transaction,
/// durable), so that loading reads only the main tables.
fn recover(db: &Database) -> Result<(), StoreError> {
    let read = || -> Result<Vec<(u64, Vec<u8>)>, redb::Error> {
        let txn = db.begin_read()?;
        let log = txn.open_table(LOG)?;
        let mut out = Vec::new();
        for row in log.iter()? {
            let (k, v) = row?;
            out.push((k.value(), v.value().to_vec()));
        }
        Ok(out)
    };
    let entries = read().map_err(backend("read log"))?;
    if entries.is_empty() {
        return Ok(());
    }
    let mut dirty = Dirty::default();
    for (seq, bytes) in entries {
        let batch = wal::decode_batch(&bytes).map_err(|e| StoreError::Corrupt {
            key: format!("log/{seq}"),
            reason: e.to_string(),
        })?;
        dirty.absorb(batch);
    }
    checkpoint(db, &dirty, redb::Durability::Immediate).map_err(backend("replay log"))
}

/// Fold `dirty` into the main tables and empty the log, in one transaction.
fn checkpoint(
    db: &Database,
    dirty: &Dirty,
    durability: redb::Durability,
) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(durability)?;
    {
        let mut sessions = txn.open_table(SESSIONS)?;
        let mut nonces = txn.open_table(NONCES)?;
        let mut budgets = txn.open_table(BUDGETS)?;
        dirty.apply(&mut sessions, &mut nonces, &mut budgets)?;
        let mut log = txn.open_table(LOG)?;
        log.retain(|_, _| false)?;
    }
    txn.commit()?;
    Ok(())
}

/// The writer thread's state: the changes logged since the last checkpoint.
struct Writer<'d> {
    db: &'d Database,
    durability: Durability,
    dirty: Dirty,
    next_seq: u64,
    log_entries: u64,
    log_bytes: usize,
    checkpoint_entries: u64,
}

impl Writer<'_> {
    fn redb_durability(&self) -> redb::Durability {
        match self.durability {
            Durability::Batch => redb::Durability::Immediate,
            Durability::Never => redb::Durability::None,
        }
    }

    /// Append the batch to the log and commit: one small write however many sessions it
    /// holds. Then checkpoint if the log has grown.
    fn commit(
        &mut self,
        batch: &Pending,
        stats: &crate::engine::WriterStats,
    ) -> Result<(), StoreError> {
        let (entry, changes) = wal::encode_batch(batch);
        let seq = self.next_seq;
        let append = || -> Result<(), redb::Error> {
            let mut txn = self.db.begin_write()?;
            txn.set_durability(self.redb_durability())?;
            txn.open_table(LOG)?.insert(seq, entry.as_slice())?;
            txn.commit()?;
            Ok(())
        };
        append().map_err(backend("commit"))?;
        self.next_seq = seq.saturating_add(1);
        self.dirty.absorb(changes);
        self.log_entries += 1;
        self.log_bytes = self.log_bytes.saturating_add(entry.len());
        if self.log_entries >= self.checkpoint_entries || self.log_bytes >= CHECKPOINT_BYTES {
            // Without fsync: until the next durable commit, a crash finds the log intact
            // and replays it; after it, the checkpoint is durable too.
            self.checkpoint(redb::Durability::None)?;
            stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn checkpoint(&mut self, durability: redb::Durability) -> Result<(), StoreError> {
        checkpoint(self.db, &self.dirty, durability).map_err(backend("checkpoint"))?;
        self.dirty = Dirty::default();
        self.log_entries = 0;
        self.log_bytes = 0;
        Ok(())
    }
}

fn writer_loop(
    db: &Database,
    engine: &Engine,
    durability: Durability,
    checkpoint_entries: u64,
) -> Result<(), StoreError> {
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
    let mut writer = Writer {
        db,
        durability,
        dirty: Dirty::default(),
        next_seq: 1,
        log_entries: 0,
        log_bytes: 0,
        checkpoint_entries,
    };
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
    // a `Durability::Never` store committed without fsync durable).
    writer.checkpoint(redb::Durability::Immediate)
}

impl SessionStore for EmbeddedStore {
    fn create(
        &self,
        session: Session,
    ) -> impl std::future::Future<Output = Result<Durable, StoreError>> + Send {
        std::future::ready(self.create_sync(session))
    }

    fn get(
        &self,
        id: &str,
    ) -> impl std::future::Future<Output = Result<Option<Session>, StoreError>> + Send {
        std::future::ready(self.get_sync(id))
    }

    fn apply<R: Send + 'static>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Session) -> Change<R> + Send,
    ) -> impl std::future::Future<Output = Result<(R, Durable), StoreError>> + Send {
        std::future::ready(self.apply_sync(id, f))
    }

    fn remove(
        &self,
        id: &str,
    ) -> impl std::future::Future<Output = Result<Durable, StoreError>> + Send {
        std::future::ready(self.remove_sync(id))
    }

    fn list(
        &self,
        org: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Vec<Session>, StoreError>> + Send {
        std::future::ready(self.list_sync(org))
    }

    fn pending_hitl(
        &self,
        org: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Vec<Session>, StoreError>> + Send {
        std::future::ready(
            self.engine.list(|s| {
                s.state.pending.is_some() && org.is_none_or(|o| s.meta.organization_id == o)
            }),
        )
    }

    fn budget(
        &self,
        key: &BudgetKey,
    ) -> impl std::future::Future<Output = Result<Option<Budget>, StoreError>> + Send {
        std::future::ready(self.budget_sync(key))
    }

    fn close(&self) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(self.close_sync())
    }
}
