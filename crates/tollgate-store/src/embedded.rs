//! [`EmbeddedStore`]: sessions in memory, persisted to a redb file by one group-committing
//! writer thread.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::durable::Durable;
use crate::engine::{Engine, EngineLimits, Journal, Pending, SessionChange};
use crate::record;
use crate::session::{Budget, BudgetKey, Session};
use crate::{Change, SessionStore, StoreError};

const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
const BUDGETS: TableDefinition<&str, &[u8]> = TableDefinition::new("budgets");
/// Seen nonces, one key each: `(session_id, nonce)`.
const NONCES: TableDefinition<(&str, u64), ()> = TableDefinition::new("nonces");

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
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_sessions: 100_000,
            durability: Durability::Batch,
            max_record_bytes: 16 * 1024 * 1024,
            max_state_entries: 200_000,
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
}

/// A session store in one redb file.
///
/// Live sessions are held in memory (the authoritative copy), so `apply` is two locks, a
/// copy of the session without its nonce set, the closure, and one walk over the nonce
/// set to find what the closure changed: microseconds, no I/O. Every committed change is
/// queued for a single writer thread, which **group-commits**: it takes everything queued
/// (only the latest state of each session and budget, plus the nonces added and removed),
/// writes it in one redb write transaction, commits it durably, then completes every
/// [`Durable`] of that batch. While one batch is being fsynced the next one fills, so any
/// number of concurrent sessions share one fsync. With one call in flight per session,
/// durable throughput is about `sessions in flight / (2 × commit time)`: the sessions
/// fall into two cohorts that alternate between filling a batch and waiting for one.
///
/// On disk (redb tables): `sessions` (id → session record without nonces, see
/// [`crate::record`]), `nonces` ((id, nonce) → ()), `budgets` (budget key → amounts).
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
            txn.commit()?;
            Ok(())
        };
        init().map_err(backend("initialize"))?;
        let (sessions, budgets) = load(&db, &options)?;
        let engine = Arc::new(Engine::new(options.limits(), Some(Journal::new())));
        engine.load(sessions, budgets)?;
        let writer_engine = Arc::clone(&engine);
        let durability = options.durability;
        let writer = std::thread::Builder::new()
            .name("tollgate-store-writer".into())
            .spawn(move || writer_loop(&db, &writer_engine, durability))
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
                s.state.seen_nonces = set;
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

fn writer_loop(db: &Database, engine: &Engine, durability: Durability) -> Result<(), StoreError> {
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
                let r = write_batch(db, &batch, durability);
                let st = &journal.stats;
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
    if durability == Durability::Never {
        // Make everything committed without fsync durable before stopping.
        let flush = || -> Result<(), redb::Error> {
            let mut txn = db.begin_write()?;
            txn.set_durability(redb::Durability::Immediate)?;
            txn.commit()?;
            Ok(())
        };
        flush().map_err(backend("final flush"))?;
    }
    Ok(())
}

fn write_batch(db: &Database, batch: &Pending, durability: Durability) -> Result<(), StoreError> {
    // Encode outside the transaction; the snapshots are immutable.
    let sessions: Vec<(&str, Option<Vec<u8>>, &SessionChange)> = batch
        .sessions
        .iter()
        .map(|(id, c)| {
            let record = c
                .snapshot
                .as_deref()
                .map(record::encode_session_without_nonces);
            (id.as_str(), record, c)
        })
        .collect();
    let budgets: Vec<(String, Vec<u8>)> = batch
        .budgets
        .iter()
        .map(|(k, b)| (record::budget_key_string(k), record::encode_budget(b)))
        .collect();
    let write = || -> Result<(), redb::Error> {
        let mut txn = db.begin_write()?;
        txn.set_durability(match durability {
            Durability::Batch => redb::Durability::Immediate,
            Durability::Never => redb::Durability::None,
        })?;
        {
            let mut t = txn.open_table(SESSIONS)?;
            let mut nt = txn.open_table(NONCES)?;
            for (id, record, change) in &sessions {
                if change.reset {
                    nt.retain_in((*id, 0)..=(*id, u64::MAX), |_, ()| false)?;
                }
                for n in &change.removed {
                    nt.remove((*id, *n))?;
                }
                for n in &change.added {
                    nt.insert((*id, *n), ())?;
                }
                match record {
                    Some(b) => {
                        t.insert(*id, b.as_slice())?;
                    }
                    None => {
                        t.remove(*id)?;
                    }
                }
            }
            let mut t = txn.open_table(BUDGETS)?;
            for (k, b) in &budgets {
                t.insert(k.as_str(), b.as_slice())?;
            }
        }
        txn.commit()?;
        Ok(())
    };
    write().map_err(backend("commit"))
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
