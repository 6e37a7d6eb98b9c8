//! [`PgJournal`]: one daemon's signed chain in PostgreSQL, written by one task with group
//! commit; the [`Journal`] and [`Arbiter`] of a store whose state lives elsewhere.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use tollgate_audit::format::{self, FileHeader};
use tollgate_audit::{
    pending_pair, Appended, Chainer, Completer, Event, KeyId, PolicySetRecord, SessionEvent,
    SigningKey, VoidRecord, WriteError,
};
use tollgate_core::Digest;
use tollgate_store::{Arbiter, Durable, Journal, SettleFuture, Settled, StoreError, VoidBudget};

use crate::conn::{check_schema, connect, lock_key, PgSettings};
use crate::schema::{quoted, SCHEMA_VERSION};
use crate::PgError;

/// The format version of the records of a chain registered now (version 8: record kind
/// 7, void, the shared budget's version in the entries that write it (version 4), kind 8,
/// session closed (version 5), and kind 9, policy set, with the verdicts' policy notes
/// and the opening's policy-set digest (version 6), the verdicts' shadow notes and
/// recorded params with the policy sets' shadow counts (version 7), and the verdicts'
/// upstream and random draw (version 8)). A chain registered earlier keeps the version
/// its signed header names (3 to 7): its records go on in that version, and it
/// cannot record what a later version added ([`PgJournal::format_version`]).
pub const CHAIN_FORMAT_VERSION: u16 = 8;

/// The longest chain id, in bytes.
pub const MAX_CHAIN_ID_BYTES: usize = 256;

/// How often a batch that lost a race for a claim (or a deadlock) is tried again before
/// its entries fail.
const MAX_CONFLICT_RETRIES: usize = 8;

/// A chain id: 1-256 bytes, no control characters.
pub fn check_chain_id(chain_id: &str) -> Result<(), PgError> {
    if chain_id.is_empty()
        || chain_id.len() > MAX_CHAIN_ID_BYTES
        || chain_id.chars().any(char::is_control)
    {
        return Err(PgError::ChainId(chain_id.to_owned()));
    }
    Ok(())
}

/// One submission to the writer task.
enum Msg {
    Entry(Box<Event>, Completer<Appended>),
    Settle(
        String,
        u64,
        VoidBudget,
        oneshot::Sender<Result<Settled, StoreError>>,
    ),
    Shutdown(Completer<()>),
}

/// What the journal and its task share.
#[derive(Debug, Default)]
struct Shared {
    /// False from a database error until the task has reconnected and re-read the tail.
    healthy: AtomicBool,
    /// Set by shutdown: every later submission fails.
    closed: AtomicBool,
    last_error: Mutex<String>,
    entries: AtomicU64,
    voids: AtomicU64,
    batches: AtomicU64,
    commit_nanos: AtomicU64,
    failed_batches: AtomicU64,
    reconnects: AtomicU64,
    lost_acks: AtomicU64,
    conflicts: AtomicU64,
}

impl Shared {
    fn error(&self) -> String {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn fail(&self, message: String) {
        tracing::warn!(error = %message, "postgres audit journal unavailable");
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = message;
        self.healthy.store(false, Ordering::SeqCst);
    }
}

/// Counters of a [`PgJournal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PgStats {
    /// Entries committed (session entries and voids).
    pub entries: u64,
    /// Of them, voids.
    pub voids: u64,
    /// Transactions committed.
    pub batches: u64,
    /// Time spent in those transactions, in nanoseconds.
    pub commit_nanos: u64,
    /// Batches that failed on a database error.
    pub failed_batches: u64,
    /// Reconnections after an error.
    pub reconnects: u64,
    /// Failed batches found committed after reconnecting (the COMMIT's answer was lost).
    pub lost_acks: u64,
    /// Batches rolled back and tried again because another daemon held, or was taking,
    /// one of their places (or a deadlock).
    pub conflicts: u64,
    /// Whether the journal takes submissions now.
    pub healthy: bool,
}

/// One daemon's signed audit chain in PostgreSQL. Create it with [`PgJournal::open`]
/// inside a tokio runtime; share it (`Arc<PgJournal>`) as the store's [`Journal`] and
/// [`Arbiter`].
#[derive(Debug)]
pub struct PgJournal {
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
    chain_id: String,
    key_id: KeyId,
    version: u16,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl PgJournal {
    /// Open chain `chain_id` signed by `key`: take the chain's advisory lock on the
    /// writer's own connection (a second journal with the same chain id gets
    /// [`PgError::ChainLocked`]), register the chain (key id, public key, a signed
    /// header of [`CHAIN_FORMAT_VERSION`]) or check that it is registered with this key
    /// (its records go on in the version its header names), and resume
    /// from its last row. The schema must be migrated ([`crate::migrate`]).
    pub async fn open(
        settings: PgSettings,
        key: SigningKey,
        chain_id: &str,
    ) -> Result<PgJournal, PgError> {
        check_schema(&settings.schema)?;
        check_chain_id(chain_id)?;
        let mut client = connect(&settings).await?;
        let lock = chain_lock(&settings.schema, chain_id);
        take_lock(&client, lock, chain_id).await?;
        check_version(&client, &settings.schema).await?;
        let version = register(&mut client, &settings.schema, chain_id, &key).await?;
        let (next, last) = read_tail(&client, &settings.schema, chain_id, &key, version).await?;
        let key_id = KeyId::of(key.verifying_key().as_bytes());
        let shared = Arc::new(Shared::default());
        shared.healthy.store(true, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel(settings.queue.max(1));
        let task = Task {
            s: quoted(&settings.schema),
            lock,
            chain_id: chain_id.to_owned(),
            chainer: Chainer::new(key, version, next, last),
            client: Some(client),
            insert: None,
            shared: shared.clone(),
            rx,
            settings,
            last_batch: 0,
        };
        let handle = crate::conn::runtime()?.spawn(task.run());
        Ok(PgJournal {
            tx,
            shared,
            chain_id: chain_id.to_owned(),
            key_id,
            version,
            task: Mutex::new(Some(handle)),
        })
    }

    /// The chain's id.
    pub fn chain_id(&self) -> &str {
        &self.chain_id
    }

    /// The signing key's id.
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// The format version of the chain's records: the one its signed header names
    /// ([`CHAIN_FORMAT_VERSION`] for a chain registered by this build; 3 to 7 for one
    /// registered earlier, which cannot record what a later version added).
    pub fn format_version(&self) -> u16 {
        self.version
    }

    /// Write a policy-set entry (record kind 9, format version 6): a daemon's Cedar
    /// policy set coming into force. It holds no place in a session's history, so it
    /// takes no claim; it is signed and linked like every entry, in the order submitted.
    /// The handle completes once its transaction committed. A chain of a version before
    /// 6 cannot hold one: refused ([`WriteError::Refused`]), nothing written.
    pub fn submit_policy_set(&self, record: PolicySetRecord) -> tollgate_audit::Pending<Appended> {
        let event = Event::PolicySet(record);
        if !format::kind_in_version(event.kind(), self.version) {
            let (c, p) = pending_pair();
            c.complete(Err(WriteError::Refused(format!(
                "chain `{}` is format version {}, which cannot record a policy set (version 6); \
                 give the daemon a new chain_id (or key) to start a version-{CHAIN_FORMAT_VERSION} chain",
                self.chain_id, self.version
            ))));
            return p;
        }
        if format::check_event(&event, self.version).is_err() {
            let (c, p) = pending_pair();
            c.complete(Err(WriteError::Refused(format!(
                "chain `{}` is format version {}, which cannot record shadow policies (version 7); \
                 give the daemon a new chain_id (or key) to start a version-{CHAIN_FORMAT_VERSION} chain",
                self.chain_id, self.version
            ))));
            return p;
        }
        self.submit_event(event)
    }

    fn submit_event(&self, event: Event) -> tollgate_audit::Pending<Appended> {
        let (c, p) = pending_pair();
        if let Some(e) = self.refusal() {
            c.complete(Err(e));
            return p;
        }
        let (refused, error) = match self.tx.try_send(Msg::Entry(Box::new(event), c)) {
            Ok(()) => return p,
            Err(mpsc::error::TrySendError::Full(m)) => (
                m,
                WriteError::Failed("the postgres audit journal's queue is full".to_owned()),
            ),
            Err(mpsc::error::TrySendError::Closed(m)) => (m, WriteError::WriterGone),
        };
        // The message handed back is the one just sent: its completer answers.
        if let Msg::Entry(_, c) = refused {
            c.complete(Err(error));
        }
        p
    }

    /// The counters, as the file writer reports them (`syncs` counts commits).
    pub fn stats(&self) -> tollgate_audit::Stats {
        let s = self.pg_stats();
        tollgate_audit::Stats {
            entries: s.entries,
            batches: s.batches,
            syncs: s.batches,
            sync_nanos: s.commit_nanos,
        }
    }

    /// All counters.
    pub fn pg_stats(&self) -> PgStats {
        let s = &self.shared;
        PgStats {
            entries: s.entries.load(Ordering::Relaxed),
            voids: s.voids.load(Ordering::Relaxed),
            batches: s.batches.load(Ordering::Relaxed),
            commit_nanos: s.commit_nanos.load(Ordering::Relaxed),
            failed_batches: s.failed_batches.load(Ordering::Relaxed),
            reconnects: s.reconnects.load(Ordering::Relaxed),
            lost_acks: s.lost_acks.load(Ordering::Relaxed),
            conflicts: s.conflicts.load(Ordering::Relaxed),
            healthy: s.healthy.load(Ordering::SeqCst),
        }
    }

    /// Whether submissions are taken now (false while reconnecting and after shutdown).
    pub fn is_healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::SeqCst) && !self.shared.closed.load(Ordering::SeqCst)
    }

    /// Write out everything accepted, then refuse more; releases the chain's lock.
    /// Blocks the calling thread: call it from a multi-threaded runtime's worker (or
    /// outside the runtime), never from a current-thread runtime; async code can use
    /// [`PgJournal::close`]. Idempotent.
    pub fn shutdown(&self) -> Result<(), WriteError> {
        match self.begin_shutdown() {
            Some(p) => p.wait().or_else(gone_is_ok),
            None => Ok(()),
        }
    }

    /// [`PgJournal::shutdown`] for async code.
    pub async fn close(&self) -> Result<(), WriteError> {
        let r = match self.begin_shutdown() {
            Some(p) => p.await.or_else(gone_is_ok),
            None => Ok(()),
        };
        let handle = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(h) = handle {
            let _ = h.await;
        }
        r
    }

    fn begin_shutdown(&self) -> Option<tollgate_audit::Pending<()>> {
        self.shared.closed.store(true, Ordering::SeqCst);
        let (c, p) = pending_pair();
        self.tx.try_send(Msg::Shutdown(c)).ok().map(|()| p)
    }

    fn refusal(&self) -> Option<WriteError> {
        if self.shared.closed.load(Ordering::SeqCst) {
            return Some(WriteError::WriterGone);
        }
        if !self.shared.healthy.load(Ordering::SeqCst) {
            return Some(WriteError::Failed(self.shared.error()));
        }
        None
    }
}

fn gone_is_ok(e: WriteError) -> Result<(), WriteError> {
    match e {
        WriteError::WriterGone => Ok(()),
        other => Err(other),
    }
}

impl Journal for PgJournal {
    fn submit(&self, event: SessionEvent) -> Durable {
        Durable::of(self.submit_event(Event::Session(event)))
    }
}

fn journal_error(message: impl Into<String>) -> StoreError {
    StoreError::Journal {
        message: message.into(),
    }
}

impl Arbiter for PgJournal {
    fn settle<'a>(
        &'a self,
        session_id: &'a str,
        session_seq: u64,
        budget: VoidBudget,
    ) -> SettleFuture<'a> {
        Box::pin(async move {
            if let Some(e) = self.refusal() {
                return Err(journal_error(e.to_string()));
            }
            let (tx, rx) = oneshot::channel();
            self.tx
                .try_send(Msg::Settle(session_id.to_owned(), session_seq, budget, tx))
                .map_err(|_| journal_error("the postgres audit journal is busy or shut down"))?;
            rx.await
                .map_err(|_| journal_error(WriteError::WriterGone.to_string()))?
        })
    }
}

fn chain_lock(schema: &str, chain_id: &str) -> i64 {
    lock_key(&["tollgate-chain", schema, chain_id])
}

async fn take_lock(client: &Client, lock: i64, chain_id: &str) -> Result<(), PgError> {
    let row = client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&lock])
        .await
        .map_err(PgError::db("chain lock"))?;
    let got: bool = row.try_get(0).map_err(PgError::db("chain lock"))?;
    if got {
        Ok(())
    } else {
        Err(PgError::ChainLocked(chain_id.to_owned()))
    }
}

async fn check_version(client: &Client, schema: &str) -> Result<(), PgError> {
    let s = quoted(schema);
    let row = client
        .query_one(
            &format!("SELECT COALESCE(max(version), 0) FROM {s}.schema_migrations"),
            &[],
        )
        .await
        .map_err(|e| {
            if e.code() == Some(&SqlState::UNDEFINED_TABLE) {
                PgError::NotMigrated(schema.to_owned())
            } else {
                PgError::db("schema version")(e)
            }
        })?;
    let v: i32 = row.try_get(0).map_err(PgError::db("schema version"))?;
    if v == SCHEMA_VERSION {
        Ok(())
    } else if v < SCHEMA_VERSION {
        Err(PgError::NotMigrated(schema.to_owned()))
    } else {
        Err(PgError::SchemaTooNew {
            found: v,
            known: SCHEMA_VERSION,
        })
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Register the chain (or find it registered with this key): the format version its
/// header names, which its records are written in.
async fn register(
    client: &mut Client,
    schema: &str,
    chain_id: &str,
    key: &SigningKey,
) -> Result<u16, PgError> {
    let s = quoted(schema);
    let public = key.verifying_key().to_bytes();
    let key_id = KeyId::of(&public);
    let header = FileHeader::new_signed_version(
        CHAIN_FORMAT_VERSION,
        key,
        0,
        0,
        format::genesis_hash(),
        now_ns(),
    )
    .encode();
    client
        .execute(
            &format!(
                "INSERT INTO {s}.chains (chain_id, key_id, public_key, format_version, header)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (chain_id) DO NOTHING"
            ),
            &[
                &chain_id,
                &key_id.to_string(),
                &public.as_slice(),
                &i16::try_from(CHAIN_FORMAT_VERSION).unwrap_or(i16::MAX),
                &header,
            ],
        )
        .await
        .map_err(PgError::db("register chain"))?;
    let row = client
        .query_one(
            &format!("SELECT public_key, header FROM {s}.chains WHERE chain_id = $1"),
            &[&chain_id],
        )
        .await
        .map_err(PgError::db("register chain"))?;
    let registered: Vec<u8> = row.try_get(0).map_err(PgError::db("register chain"))?;
    let header: Vec<u8> = row.try_get(1).map_err(PgError::db("register chain"))?;
    if registered != public {
        return Err(PgError::KeyMismatch {
            chain_id: chain_id.to_owned(),
            registered: <[u8; 32]>::try_from(registered.as_slice())
                .map_or_else(|_| "(not a key)".to_owned(), |k| KeyId::of(&k).to_string()),
            given: key_id.to_string(),
        });
    }
    // The signed header, not the table's column, says which version the records are in.
    let header = FileHeader::decode(&header).map_err(|e| PgError::Broken {
        chain_id: chain_id.to_owned(),
        what: format!("its registered header: {e}"),
    })?;
    Ok(header.version)
}

/// The chain's head after its last row: (next index, hash of the last record). The last
/// record must parse, stand at its row's index and be signed by `key`.
async fn read_tail(
    client: &Client,
    schema: &str,
    chain_id: &str,
    key: &SigningKey,
    version: u16,
) -> Result<(u64, Digest), PgError> {
    let s = quoted(schema);
    let row = client
        .query_opt(
            &format!(
                "SELECT idx, record FROM {s}.entries WHERE chain_id = $1 ORDER BY idx DESC LIMIT 1"
            ),
            &[&chain_id],
        )
        .await
        .map_err(PgError::db("read chain tail"))?;
    let Some(row) = row else {
        return Ok((0, format::genesis_hash()));
    };
    let idx: i64 = row.try_get(0).map_err(PgError::db("read chain tail"))?;
    let record: Vec<u8> = row.try_get(1).map_err(PgError::db("read chain tail"))?;
    let broken = |what: String| PgError::Broken {
        chain_id: chain_id.to_owned(),
        what,
    };
    let (parsed, used) = format::parse_record_version(version, &record)
        .map_err(|e| broken(format!("last row {idx}: {e}")))?;
    let idx = u64::try_from(idx).map_err(|_| broken(format!("negative index {idx}")))?;
    if used != record.len() || parsed.entry.index != idx {
        return Err(broken(format!(
            "last row {idx} holds entry {} ({used} of {} bytes)",
            parsed.entry.index,
            record.len()
        )));
    }
    let key_id = KeyId::of(key.verifying_key().as_bytes());
    if parsed.entry.key_id != key_id {
        return Err(broken(format!(
            "last row {idx} is signed by `{}`, not by `{key_id}`",
            parsed.entry.key_id
        )));
    }
    let sig = tollgate_audit::format::Record::signed_bytes(&parsed);
    let signature = ed25519_dalek_signature(&parsed.entry.signature);
    if key.verifying_key().verify_strict(&sig, &signature).is_err() {
        return Err(broken(format!("last row {idx}: bad signature")));
    }
    Ok((idx.saturating_add(1), format::sha256(&record)))
}

fn ed25519_dalek_signature(bytes: &[u8; 64]) -> ed25519_dalek::Signature {
    ed25519_dalek::Signature::from_bytes(bytes)
}

/// A batch item and what became of it.
enum Outcome {
    Entry(Result<Appended, WriteError>),
    Settle(Result<Settled, String>),
}

/// Why a batch did not commit.
enum BatchError {
    /// It raced another daemon for a claim (or deadlocked): try again.
    Conflict,
    /// Anything else: the connection is suspect.
    Db(String),
}

impl From<tokio_postgres::Error> for BatchError {
    fn from(e: tokio_postgres::Error) -> Self {
        let conflict = e.code().is_some_and(|c| {
            *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::T_R_SERIALIZATION_FAILURE
                || (*c == SqlState::UNIQUE_VIOLATION
                    && e.as_db_error()
                        .and_then(|d| d.constraint())
                        .is_some_and(|n| n == "claims_pkey"))
        });
        if conflict {
            BatchError::Conflict
        } else {
            BatchError::Db(describe(&e))
        }
    }
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("postgres: {}: {}", d.code().code(), d.message()),
        None => format!("postgres: {e}"),
    }
}

/// The writer task: owns the connection (and with it the chain's lock) and the chain head.
struct Task {
    settings: PgSettings,
    s: String,
    lock: i64,
    chain_id: String,
    chainer: Chainer,
    client: Option<Client>,
    /// The batch statement, prepared on `client` when first needed; reset by `reconnect`,
    /// which alone replaces `client` (nothing uses it while `client` is `None`).
    insert: Option<tokio_postgres::Statement>,
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Msg>,
    /// How many items the previous batch held ([`Task::linger`]).
    last_batch: usize,
}

/// The smallest previous batch that makes the next one wait for company
/// ([`PgSettings::commit_linger`]).
const LINGER_FROM: usize = 4;

enum Item {
    Entry(Box<Event>, Completer<Appended>),
    Settle(
        String,
        u64,
        VoidBudget,
        oneshot::Sender<Result<Settled, StoreError>>,
    ),
}

impl Item {
    /// The place in a session's history the item takes (and claims): none for an entry
    /// that is not a session event (a policy set).
    fn key(&self) -> Option<(&str, u64)> {
        match self {
            Item::Entry(e, _) => match &**e {
                Event::Session(e) => Some((e.session_id(), e.session_seq())),
                _ => None,
            },
            Item::Settle(s, q, _, _) => Some((s, *q)),
        }
    }

    fn fail(self, e: &WriteError) {
        match self {
            Item::Entry(_, c) => c.complete(Err(e.clone())),
            Item::Settle(_, _, _, tx) => {
                let _ = tx.send(Err(journal_error(e.to_string())));
            }
        }
    }
}

impl Task {
    async fn run(mut self) {
        let max = self.settings.max_batch.max(1);
        loop {
            let Some(first) = self.rx.recv().await else {
                // The journal was dropped without a shutdown: release the lock and stop.
                if let Some(c) = self.client.take() {
                    let _ = c
                        .execute("SELECT pg_advisory_unlock($1)", &[&self.lock])
                        .await;
                }
                return;
            };
            let mut msgs = vec![first];
            while msgs.len() < max {
                match self.rx.try_recv() {
                    Ok(m) => msgs.push(m),
                    Err(_) => break,
                }
            }
            self.linger(&mut msgs, max).await;
            self.last_batch = msgs.len();
            let mut items = Vec::with_capacity(msgs.len());
            let mut shutdown = None;
            for m in msgs {
                match m {
                    Msg::Entry(e, c) => items.push(Item::Entry(e, c)),
                    Msg::Settle(s, q, b, tx) => items.push(Item::Settle(s, q, b, tx)),
                    Msg::Shutdown(c) => shutdown = Some(c),
                }
            }
            if !items.is_empty() {
                self.process(items).await;
            }
            if let Some(c) = shutdown {
                self.finish(c).await;
                return;
            }
        }
    }

    /// Group commit under load: when the previous batch held at least [`LINGER_FROM`]
    /// entries (other sessions were committing at the same time), wait up to
    /// `commit_linger` for this batch to hold as many before committing it. Each commit
    /// costs the server a fixed share (its WAL flush, the statement) whatever its size, so
    /// fewer, fuller commits cost less per entry; a lone session (batches of one) never
    /// waits. A shutdown ends the wait.
    async fn linger(&mut self, msgs: &mut Vec<Msg>, max: usize) {
        let linger = self.settings.commit_linger;
        let want = self.last_batch.min(max);
        if linger.is_zero() || self.last_batch < LINGER_FROM || msgs.len() >= want {
            return;
        }
        let deadline = tokio::time::Instant::now() + linger;
        while msgs.len() < want && !matches!(msgs.last(), Some(Msg::Shutdown(_))) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(m)) => msgs.push(m),
                Ok(None) | Err(_) => break,
            }
        }
    }

    /// Write what is still queued, then stop (dropping the connection releases the lock).
    async fn finish(&mut self, done: Completer<()>) {
        self.rx.close();
        let mut items = Vec::new();
        while let Ok(m) = self.rx.try_recv() {
            match m {
                Msg::Entry(e, c) => items.push(Item::Entry(e, c)),
                Msg::Settle(s, q, b, tx) => items.push(Item::Settle(s, q, b, tx)),
                Msg::Shutdown(c) => c.complete(Ok(())),
            }
        }
        if !items.is_empty() && self.client.is_some() {
            self.process(items).await;
        } else {
            let e = WriteError::WriterGone;
            items.into_iter().for_each(|i| i.fail(&e));
        }
        // Release the chain's lock now: the server would release it only when the
        // backend exits, a moment after the connection closes, and a journal opened
        // right after this one would find it still held.
        if let Some(c) = self.client.take() {
            let _ = c
                .execute("SELECT pg_advisory_unlock($1)", &[&self.lock])
                .await;
        }
        self.shared.healthy.store(false, Ordering::SeqCst);
        done.complete(Ok(()));
    }

    async fn process(&mut self, items: Vec<Item>) {
        if self.client.is_none() {
            let e = WriteError::Failed(self.shared.error());
            items.into_iter().for_each(|i| i.fail(&e));
            return;
        }
        // A connection the driver already knows is gone (the server restarted while the
        // journal was idle): replace it before the batch rather than fail the batch.
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.client = None;
            if let Err(e) = self.reconnect(None).await {
                self.shared.failed_batches.fetch_add(1, Ordering::Relaxed);
                self.shared.fail(e.to_string());
                let e = WriteError::Io(e.to_string());
                items.into_iter().for_each(|i| i.fail(&e));
                self.recover(None).await;
                return;
            }
            self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        let head = (self.chainer.next_index(), self.chainer.last_hash());
        for attempt in 0..MAX_CONFLICT_RETRIES {
            let started = Instant::now();
            let mut signed_first = None;
            // The first attempt assumes no place of the batch is held (the common case:
            // one round trip less); one that loses a race reads the claims first.
            match self.try_batch(&items, attempt > 0, &mut signed_first).await {
                Ok(outcomes) => {
                    let sh = &self.shared;
                    sh.batches.fetch_add(1, Ordering::Relaxed);
                    let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    sh.commit_nanos.fetch_add(ns, Ordering::Relaxed);
                    for (item, outcome) in items.into_iter().zip(outcomes) {
                        complete(sh, item, outcome);
                    }
                    return;
                }
                Err(BatchError::Conflict) => {
                    self.shared.conflicts.fetch_add(1, Ordering::Relaxed);
                    self.chainer.reset(head.0, head.1);
                }
                Err(BatchError::Db(message)) => {
                    self.chainer.reset(head.0, head.1);
                    self.shared.failed_batches.fetch_add(1, Ordering::Relaxed);
                    self.shared.fail(message.clone());
                    let e = WriteError::Io(message);
                    items.into_iter().for_each(|i| i.fail(&e));
                    self.recover(signed_first).await;
                    return;
                }
            }
        }
        self.chainer.reset(head.0, head.1);
        let e = WriteError::Failed("the batch kept losing races for claims".to_owned());
        items.into_iter().for_each(|i| i.fail(&e));
    }

    /// One transaction: read the claims of the batch's places (when `check_claims`),
    /// sign what may be written, insert entries and claims (one statement), commit. A
    /// place already held makes the insert fail with a unique violation: a
    /// [`BatchError::Conflict`], tried again with `check_claims`. `signed_first` gets the
    /// first signed record's index and hash (to tell after an error whether the commit
    /// happened).
    ///
    /// Without `check_claims` (the common case) the transaction is that one statement,
    /// prepared once per connection and sent alone: PostgreSQL runs a statement outside
    /// `BEGIN` as a transaction of its own, so its entries and claims commit together or
    /// not at all (the deferred foreign key is checked at that commit), in one round trip
    /// instead of four (`BEGIN`, parse, execute, `COMMIT`).
    async fn try_batch(
        &mut self,
        items: &[Item],
        check_claims: bool,
        signed_first: &mut Option<(u64, Digest)>,
    ) -> Result<Vec<Outcome>, BatchError> {
        let s = &self.s;
        let Some(client) = self.client.as_mut() else {
            return Err(BatchError::Db("not connected".to_owned()));
        };
        let insert = match &self.insert {
            Some(st) => st.clone(),
            None => {
                let st = client.prepare(&insert_sql(s)).await?;
                self.insert = Some(st.clone());
                st
            }
        };
        if !check_claims {
            let (rows, outcomes) = sign_batch(
                &mut self.chainer,
                &self.chain_id,
                items,
                HashMap::new(),
                signed_first,
            )?;
            if !rows.e_idx.is_empty() {
                client
                    .execute(&insert, &rows.params(&self.chain_id))
                    .await?;
            }
            self.count(&rows);
            return Ok(outcomes);
        }
        let tx = client.transaction().await?;
        let mut sids: Vec<&str> = Vec::with_capacity(items.len());
        let mut seqs: Vec<i64> = Vec::with_capacity(items.len());
        for it in items {
            let Some((sid, seq)) = it.key() else {
                continue;
            };
            if let Ok(q) = i64::try_from(seq) {
                sids.push(sid);
                seqs.push(q);
            }
        }
        let rows = tx
            .query(
                &format!(
                    "SELECT c.session_id, c.session_seq, c.kind FROM {s}.claims c
                     JOIN unnest($1::text[], $2::bigint[]) AS k(s, q)
                       ON c.session_id = k.s AND c.session_seq = k.q"
                ),
                &[&sids, &seqs],
            )
            .await?;
        // (session, seq) -> whether an entry (true) or a void (false) holds it.
        let mut held: HashMap<(String, i64), bool> = HashMap::new();
        for r in rows {
            let sid: String = r.try_get(0)?;
            let seq: i64 = r.try_get(1)?;
            let kind: String = r.try_get(2)?;
            held.insert((sid, seq), kind == "entry");
        }
        let (rows, outcomes) =
            sign_batch(&mut self.chainer, &self.chain_id, items, held, signed_first)?;
        if !rows.e_idx.is_empty() {
            tx.execute(&insert, &rows.params(&self.chain_id)).await?;
        }
        tx.commit().await?;
        self.count(&rows);
        Ok(outcomes)
    }

    fn count(&self, rows: &Rows) {
        self.shared
            .entries
            .fetch_add(rows.e_idx.len() as u64, Ordering::Relaxed);
        self.shared.voids.fetch_add(rows.voids, Ordering::Relaxed);
    }

    /// After a database error: reconnect with backoff (failing whatever arrives
    /// meanwhile), retake the chain's lock, and continue from the tail as stored. When
    /// the failed batch is found committed (its COMMIT's answer was lost), it is counted
    /// and not written again: the head is the stored tail.
    async fn recover(&mut self, signed_first: Option<(u64, Digest)>) {
        self.client = None;
        let mut wait = self.settings.reconnect_min;
        loop {
            // Shutting down: stop trying (what is queued fails; see `finish`).
            if !self.drain_failing() || self.shared.closed.load(Ordering::SeqCst) {
                return;
            }
            match self.reconnect(signed_first).await {
                Ok(()) => {
                    self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
                    self.shared.healthy.store(true, Ordering::SeqCst);
                    tracing::info!(chain = %self.chain_id, next = self.chainer.next_index(), "postgres audit journal reconnected");
                    return;
                }
                Err(e) => {
                    self.shared.fail(e.to_string());
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2)
                .min(self.settings.reconnect_max)
                .max(Duration::from_millis(1));
        }
    }

    /// Fail everything queued; false when asked to shut down (the task then stops).
    fn drain_failing(&mut self) -> bool {
        let e = WriteError::Failed(self.shared.error());
        while let Ok(m) = self.rx.try_recv() {
            match m {
                Msg::Entry(_, c) => c.complete(Err(e.clone())),
                Msg::Settle(_, _, _, tx) => {
                    let _ = tx.send(Err(journal_error(e.to_string())));
                }
                Msg::Shutdown(c) => {
                    self.rx.close();
                    while let Ok(m) = self.rx.try_recv() {
                        drop(m);
                    }
                    c.complete(Ok(()));
                    return false;
                }
            }
        }
        true
    }

    async fn reconnect(&mut self, signed_first: Option<(u64, Digest)>) -> Result<(), PgError> {
        let client = connect(&self.settings).await?;
        take_lock(&client, self.lock, &self.chain_id).await?;
        let (next, last) = read_tail(
            &client,
            &self.settings.schema,
            &self.chain_id,
            self.chainer.key(),
            self.chainer.version(),
        )
        .await?;
        if let Some((idx, hash)) = signed_first {
            if next > idx {
                let row = client
                    .query_opt(
                        &format!(
                            "SELECT entry_hash FROM {}.entries WHERE chain_id = $1 AND idx = $2",
                            self.s
                        ),
                        &[&self.chain_id, &i64::try_from(idx).unwrap_or(i64::MAX)],
                    )
                    .await
                    .map_err(PgError::db("reconnect"))?;
                let stored: Option<Vec<u8>> = row
                    .map(|r| r.try_get(0))
                    .transpose()
                    .map_err(PgError::db("reconnect"))?;
                if stored.as_deref() == Some(hash.0.as_slice()) {
                    self.shared.lost_acks.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(chain = %self.chain_id, index = idx, "a failed batch was committed (its answer was lost); it is not written again");
                } else {
                    return Err(PgError::Broken {
                        chain_id: self.chain_id.clone(),
                        what: format!("entry {idx} was written by someone else"),
                    });
                }
            }
        }
        self.chainer.reset(next, last);
        self.client = Some(client);
        self.insert = None;
        Ok(())
    }
}

/// The statement that writes a batch: its entries and their claims, one row each, as
/// arrays (one statement whatever the batch's size).
fn insert_sql(s: &str) -> String {
    format!(
        "WITH e AS (
           INSERT INTO {s}.entries (chain_id, idx, record, entry_hash, session_id, session_seq, kind)
           SELECT $1, u.i, u.r, u.h, u.s, u.q, u.k
           FROM unnest($2::bigint[], $3::bytea[], $4::bytea[], $5::text[], $6::bigint[], $7::smallint[])
             AS u(i, r, h, s, q, k)
         )
         INSERT INTO {s}.claims (session_id, session_seq, kind, chain_id, idx)
         SELECT u.s, u.q, u.k, $1, u.i
         FROM unnest($8::text[], $9::bigint[], $10::text[], $11::bigint[]) AS u(s, q, k, i)"
    )
}

/// The columns of a batch's rows, in the order the chain gives them.
#[derive(Default)]
struct Rows {
    e_idx: Vec<i64>,
    e_rec: Vec<Vec<u8>>,
    e_hash: Vec<Vec<u8>>,
    e_sid: Vec<Option<String>>,
    e_seq: Vec<Option<i64>>,
    e_kind: Vec<i16>,
    c_kind: Vec<&'static str>,
    c_sid: Vec<String>,
    c_seq: Vec<i64>,
    c_idx: Vec<i64>,
    voids: u64,
}

impl Rows {
    /// One signed entry's row of `entries` (`place`: its session id and seq, none for an
    /// entry that holds no place), noting the batch's first signed entry. Returns it with
    /// its index as the row holds it.
    fn entry(
        &mut self,
        signed: tollgate_audit::Signed,
        kind: u8,
        place: Option<(&str, i64)>,
        signed_first: &mut Option<(u64, Digest)>,
    ) -> Result<(Appended, i64), BatchError> {
        let a = signed.appended;
        if signed_first.is_none() {
            *signed_first = Some((a.index, a.hash));
        }
        let idx = i64::try_from(a.index).map_err(|_| BatchError::Db("index overflow".into()))?;
        self.e_idx.push(idx);
        self.e_rec.push(signed.record);
        self.e_hash.push(a.hash.0.to_vec());
        self.e_sid.push(place.map(|(sid, _)| sid.to_owned()));
        self.e_seq.push(place.map(|(_, seq)| seq));
        self.e_kind.push(i16::from(kind));
        Ok((a, idx))
    }

    fn params<'a>(
        &'a self,
        chain_id: &'a String,
    ) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 11] {
        [
            chain_id,
            &self.e_idx,
            &self.e_rec,
            &self.e_hash,
            &self.e_sid,
            &self.e_seq,
            &self.e_kind,
            &self.c_sid,
            &self.c_seq,
            &self.c_kind,
            &self.c_idx,
        ]
    }
}

/// Sign the batch's items onto the chain, in order: an entry whose place `held` names
/// is refused, a settlement of a held place answered from it, a settlement of a free
/// place becomes a void; an entry that is not a session event (a policy set) holds no
/// place and takes no claim. Returns the rows to insert and each item's outcome.
fn sign_batch(
    chainer: &mut Chainer,
    chain_id: &str,
    items: &[Item],
    mut held: HashMap<(String, i64), bool>,
    signed_first: &mut Option<(u64, Digest)>,
) -> Result<(Rows, Vec<Outcome>), BatchError> {
    let mut rows = Rows::default();
    let mut outcomes = Vec::with_capacity(items.len());
    for it in items {
        let Some((sid, seq)) = it.key() else {
            if let Item::Entry(event, _) = it {
                outcomes.push(Outcome::Entry(sign_unclaimed(
                    chainer,
                    event,
                    &mut rows,
                    signed_first,
                )?));
            }
            continue;
        };
        let Ok(seq_i) = i64::try_from(seq) else {
            outcomes.push(match it {
                Item::Entry(..) => Outcome::Entry(Err(WriteError::Refused(format!(
                    "session_seq {seq} is beyond the database's range"
                )))),
                Item::Settle(..) => Outcome::Settle(Err(format!(
                    "session_seq {seq} is beyond the database's range"
                ))),
            });
            continue;
        };
        let place = (sid.to_owned(), seq_i);
        let void;
        let event: &Event = match (it, held.get(&place)) {
            (Item::Entry(..), Some(entry)) => {
                let by = if *entry { "another entry" } else { "a void" };
                outcomes.push(Outcome::Entry(Err(WriteError::Refused(format!(
                    "session `{sid}` version {seq} is already held by {by}"
                )))));
                continue;
            }
            (Item::Settle(..), Some(entry)) => {
                outcomes.push(Outcome::Settle(Ok(if *entry {
                    Settled::Entry
                } else {
                    Settled::Void
                })));
                continue;
            }
            (Item::Entry(ev, _), None) => ev,
            (Item::Settle(_, _, b, _), None) => {
                void = Event::Void(VoidRecord {
                    timestamp_ns: now_ns(),
                    session_id: sid.to_owned(),
                    session_seq: seq,
                    chain_id: chain_id.to_owned(),
                    reason: VoidRecord::UNCONFIRMED_AT_SETTLE.to_owned(),
                    budget_version: b.budget_version,
                    budget_before: b.budget_before,
                    budget_after: b.budget_after,
                    revert_version: b.revert_version,
                });
                &void
            }
        };
        let signed = match chainer.sign(event, signing_time(event)) {
            Ok(x) => x,
            Err(e) => {
                outcomes.push(match it {
                    Item::Entry(..) => Outcome::Entry(Err(WriteError::Encode(e))),
                    // A place whose id is too long to encode never held an entry
                    // either, but no void can say so: the caller must not go on.
                    Item::Settle(..) => Outcome::Settle(Err(format!("cannot write a void: {e}"))),
                });
                continue;
            }
        };
        let (a, idx) = rows.entry(signed, event.kind(), Some((sid, seq_i)), signed_first)?;
        let is_entry = matches!(it, Item::Entry(..));
        rows.c_sid.push(sid.to_owned());
        rows.c_seq.push(seq_i);
        rows.c_kind.push(if is_entry { "entry" } else { "void" });
        rows.c_idx.push(idx);
        held.insert(place, is_entry);
        outcomes.push(if is_entry {
            Outcome::Entry(Ok(a))
        } else {
            rows.voids += 1;
            Outcome::Settle(Ok(Settled::Void))
        });
    }
    Ok((rows, outcomes))
}

/// The entry time an event is signed with: the record's own for a session event and a
/// policy set, else now (a void is made just before it is signed).
fn signing_time(event: &Event) -> i64 {
    match event {
        Event::Session(e) => e.timestamp_ns(),
        Event::PolicySet(r) => r.timestamp_ns,
        _ => now_ns(),
    }
}

/// Sign an entry that holds no place in a session's history (a policy set): a row of
/// `entries` without session columns, and no claim.
fn sign_unclaimed(
    chainer: &mut Chainer,
    event: &Event,
    rows: &mut Rows,
    signed_first: &mut Option<(u64, Digest)>,
) -> Result<Result<Appended, WriteError>, BatchError> {
    let signed = match chainer.sign(event, signing_time(event)) {
        Ok(x) => x,
        Err(e) => return Ok(Err(WriteError::Encode(e))),
    };
    rows.entry(signed, event.kind(), None, signed_first)
        .map(|(a, _)| Ok(a))
}

fn complete(shared: &Shared, item: Item, outcome: Outcome) {
    let _ = shared;
    match (item, outcome) {
        (Item::Entry(_, c), Outcome::Entry(r)) => c.complete(r),
        (Item::Settle(_, _, _, tx), Outcome::Settle(s)) => {
            let _ = tx.send(s.map_err(journal_error));
        }
        (item, _) => item.fail(&WriteError::Failed("internal: outcome mismatch".to_owned())),
    }
}
