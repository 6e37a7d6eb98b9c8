//! The writer: one dedicated thread that assigns chain positions, signs, links, writes and
//! fsyncs entries in batches (group commit), rotates and compresses files, and writes
//! checkpoints. Callers submit from any thread and get a [`Pending`] completion that is
//! ready once the batch holding their entry is durable.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use tollgate_core::Digest;
use uuid::Uuid;

use crate::chain::{Chainer, Signed};
use crate::checkpoint::Checkpoint;
use crate::completion::{self, Completer, Pending};
use crate::entry::{Event, SessionEvent};
use crate::files::{self, LogFile, ARCHIVED_SUFFIX, CHECKPOINT_FILE, TORN_DIR};
use crate::format::{self, EncodeError, FileHeader};
use crate::keys::KeyId;
use crate::verify::{Break, BreakKind, Verifier, VerifyOptions};

/// When the writer calls fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// After every entry: one fsync each.
    Always,
    /// After every batch (group commit): one fsync shared by every entry in the batch.
    #[default]
    Batch,
    /// Never (the OS writes back when it likes). Entries complete once written.
    Never,
}

impl FromStr for FsyncPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "always" => Ok(FsyncPolicy::Always),
            "batch" => Ok(FsyncPolicy::Batch),
            "never" => Ok(FsyncPolicy::Never),
            other => Err(format!(
                "unknown fsync policy `{other}` (expected always, batch or never)"
            )),
        }
    }
}

/// The writer's source of "now", for rotation, checkpoints and system entries. Verdict
/// entries carry their own timestamp (the daemon's clock).
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Nanoseconds since the Unix epoch, UTC.
    fn now_ns(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
}

/// How the writer behaves.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// The log directory.
    pub dir: PathBuf,
    /// When to fsync (default: per batch).
    pub fsync: FsyncPolicy,
    /// Most entries in one batch (default 4096).
    pub max_batch: usize,
    /// Submissions that may wait for the writer before `submit` blocks (default 65536).
    pub queue_capacity: usize,
    /// Start a new file once the current one reaches this many bytes (default 64 MiB).
    pub rotate_bytes: u64,
    /// Start a new file when the UTC day changes (default true).
    pub rotate_daily: bool,
    /// zstd-compress files once rotated out (default true).
    pub compress_rotated: bool,
    /// Delete rotated files older than this many days, but only those marked archived
    /// (a `NAME.archived` file beside them). `None` keeps everything (default).
    pub retention_days: Option<u32>,
    /// Write a checkpoint after this many entries (0: not by count). Default 10 000.
    pub checkpoint_every: u64,
    /// Write a checkpoint when this much time has passed and there are new entries
    /// (default 60 s).
    pub checkpoint_interval: Duration,
    /// Check every signature of the tail file on open (default false: structure and
    /// links only, which is fast).
    pub verify_on_open: bool,
    /// After a write, sync or rotation failure (a full disk, no descriptor left, an I/O
    /// error) the writer refuses every entry, then tries to recover this often: see
    /// [`Writer::health`]. `None`: never (fail-stop: refuse until reopened). Default 1 s.
    pub heal_interval: Option<Duration>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
}

impl WriterConfig {
    /// Defaults for a log in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        WriterConfig {
            dir: dir.into(),
            fsync: FsyncPolicy::Batch,
            max_batch: 4096,
            queue_capacity: 65_536,
            rotate_bytes: 64 << 20,
            rotate_daily: true,
            compress_rotated: true,
            retention_days: None,
            checkpoint_every: 10_000,
            checkpoint_interval: Duration::from_secs(60),
            verify_on_open: false,
            heal_interval: Some(Duration::from_secs(1)),
            clock: Arc::new(SystemClock),
        }
    }
}

/// Why an entry was not written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// The entry cannot be encoded (a field is too long). Nothing was written.
    #[error("entry rejected: {0}")]
    Encode(#[from] EncodeError),
    /// Writing or syncing failed. The writer refuses every later submission until it
    /// has recovered (see [`Writer::health`]).
    #[error("audit write failed: {0}")]
    Io(String),
    /// The writer refuses entries after an earlier failure, until it has recovered.
    #[error("the audit log refuses entries after an earlier failure: {0}")]
    Failed(String),
    /// The entry was submitted with [`Writer::submit_at`] for a generation the writer has
    /// left: it was computed before the writer recovered from a failure, from a state
    /// that may hold changes the log lost. Nothing was written.
    #[error(
        "the entry was made before the audit log recovered from a failure; it was not written"
    )]
    Stale,
    /// The writer thread is gone (shut down, or it died).
    #[error("audit writer is shut down")]
    WriterGone,
    /// The journal refused the entry and wrote nothing: another daemon settled its place
    /// in its session's history first (it voided the change), or the store behind the
    /// journal did not take it. The change it records did not happen.
    #[error("audit entry refused: {0}")]
    Refused(String),
}

/// Why a log could not be opened for writing.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A file operation failed.
    #[error("`{path}`: {error}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The failure (in the message, not a separate error source, so that a report
        /// that prints the chain does not print it twice).
        error: std::io::Error,
    },
    /// A compressed file of the log cannot be decompressed.
    #[error("`{path}`: corrupt archive: {reason}")]
    CorruptArchive {
        /// The file.
        path: PathBuf,
        /// What the decompressor said.
        reason: String,
    },
    /// The tail file is broken in a way other than a torn tail: refuse to continue it.
    #[error("the log is broken: {0}")]
    Broken(Break),
    /// The log's current key is not the key given.
    #[error("the log is signed by key `{log}`, not by the given key `{given}` (rotate keys with a hand-over entry)")]
    KeyMismatch {
        /// The log's current key.
        log: KeyId,
        /// The given key.
        given: KeyId,
    },
}

/// Where an entry landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Its chain index.
    pub index: u64,
    /// Its UUIDv7.
    pub entry_id: Uuid,
    /// SHA-256 of its record.
    pub hash: Digest,
}

/// A torn tail found and moved aside on open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// The file it was cut from.
    pub file: PathBuf,
    /// Offset of the torn bytes.
    pub offset: u64,
    /// Their length.
    pub length: u64,
    /// Where they now are.
    pub moved_to: PathBuf,
    /// The index of the recovery entry that records this in the chain.
    pub entry_index: u64,
}

/// What opening found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReport {
    /// The file being appended to.
    pub file: PathBuf,
    /// The index the next entry gets.
    pub next_index: u64,
    /// Whether the log was created new.
    pub created: bool,
    /// A torn tail that was moved aside, if any.
    pub recovered: Option<Recovered>,
    /// The format version of the log's last file when it was older than
    /// [`format::FORMAT_VERSION`]: the writer left that file as it was and started a new
    /// file of the current version that continues the chain, as a rotation does.
    pub upgraded_from: Option<u16>,
}

/// An entry that is durable, as the tap sees it: its chain position, its record hash and
/// what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// Its chain index.
    pub index: u64,
    /// SHA-256 of its record.
    pub hash: Digest,
    /// What it records.
    pub event: Event,
}

/// The tap: a function the writer calls with every entry once it is durable. See
/// [`Writer::open_with_tap`].
pub type Tap = Box<dyn FnMut(Vec<Committed>) + Send>;

/// Whether the writer takes entries, as [`Writer::health`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// How many times the writer has recovered since it was opened. An entry submitted
    /// with [`Writer::submit_at`] is written only at the generation it names.
    pub generation: u64,
    /// Why the writer refuses entries now; `None` when it takes them.
    pub failure: Option<String>,
    /// The failure will not go away by itself: the log changed under the writer (cut,
    /// edited, removed) or recovery is off. Only a restart, after an operator has looked,
    /// gets the writer going again.
    pub permanent: bool,
    /// The chain position (the index of the next entry) everything durable reached when
    /// the writer last opened or recovered.
    pub recovered_at: u64,
    /// Failures so far.
    pub failures: u64,
}

/// What the writer thread shares with every handle: its health, read without a lock on
/// the hot path.
#[derive(Debug, Default)]
struct Shared {
    failed: AtomicBool,
    permanent: AtomicBool,
    generation: AtomicU64,
    recovered_at: AtomicU64,
    failures: AtomicU64,
    message: Mutex<Option<String>>,
}

impl Shared {
    fn message(&self) -> String {
        self.message
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_default()
    }

    fn set_message(&self, m: Option<String>) {
        *self.message.lock().unwrap_or_else(PoisonError::into_inner) = m;
    }
}

/// A durable point of the log: where the writer knows every byte before is on disk
/// (synced, or written under `never`). A recovery cuts the current file back to it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mark {
    path: PathBuf,
    file_seq: u64,
    len: u64,
    next_index: u64,
    last_hash: Digest,
}

impl Mark {
    /// Whether `self` is at or past `other` in the log.
    fn reaches(&self, other: &Mark) -> bool {
        (self.file_seq, self.len) >= (other.file_seq, other.len)
    }
}

/// Why a recovery attempt did not succeed.
#[derive(Debug)]
enum Unhealed {
    /// The cause is still there (no space, no descriptor): try again later.
    Retry(String),
    /// The log is not what the writer wrote: only an operator can say what happened.
    Permanent(String),
}

enum Msg {
    Entry(Box<Event>, i64, Option<u64>, Completer<Appended>),
    Flush(Completer<()>),
    Checkpoint(Completer<Checkpoint>),
    RotateKey(Box<SigningKey>, Completer<Appended>),
    Shutdown(Completer<()>),
}

/// The audit log writer. Share it (`Arc<Writer>`) between threads or tasks.
#[derive(Debug)]
pub struct Writer {
    tx: SyncSender<Msg>,
    thread: Mutex<Option<JoinHandle<()>>>,
    stats: Arc<Counters>,
    shared: Arc<Shared>,
}

/// Counters the writer thread keeps (for metrics and benchmarks).
#[derive(Debug, Default)]
struct Counters {
    entries: AtomicU64,
    batches: AtomicU64,
    syncs: AtomicU64,
    sync_nanos: AtomicU64,
}

impl Counters {
    /// fsync `file`, counting the call and the time it took.
    fn sync(&self, file: &File) -> std::io::Result<()> {
        let t = std::time::Instant::now();
        let r = file.sync_data();
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.sync_nanos.fetch_add(ns, Ordering::Relaxed);
        r
    }
}

/// A snapshot of the writer's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Entries written.
    pub entries: u64,
    /// Writes of one or more entries.
    pub batches: u64,
    /// fsync calls on log files.
    pub syncs: u64,
    /// Time spent in those fsync calls, in nanoseconds.
    pub sync_nanos: u64,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Entry(..) => "Entry",
            Msg::Flush(_) => "Flush",
            Msg::Checkpoint(_) => "Checkpoint",
            Msg::RotateKey(..) => "RotateKey",
            Msg::Shutdown(_) => "Shutdown",
        })
    }
}

impl Writer {
    /// Open (or create) the log in `config.dir` and start the writer thread. A torn tail
    /// is moved into `torn/` and a recovery entry records it; any other break refuses.
    /// A last file of an older format version is left as it is and continued in a new
    /// file (see [`OpenReport::upgraded_from`]).
    pub fn open(config: WriterConfig, key: SigningKey) -> Result<(Writer, OpenReport), OpenError> {
        Self::start(config, key, None)
    }

    /// [`Writer::open`], with a tap: `tap` is called with every entry written after this
    /// returns (session events, key hand-overs; every kind), once it is durable under the
    /// fsync policy (after the fsync that covers it; under `never`, once written), in
    /// chain order, with no entry skipped or repeated, and before the completions of
    /// those entries fire. It runs on whichever writer thread made the entries durable
    /// (the fsync thread under `batch`, the writer thread otherwise), so it must not
    /// block for long: every later entry waits for it. It must never wait on this
    /// writer (a completion, a flush, a shutdown): that would deadlock.
    ///
    /// Not tapped: the entries already in the log when this returns, including a
    /// recovery entry written by the open itself (see [`OpenReport::recovered`]); read
    /// those with [`crate::read_tail`] before submitting. After a write or sync failure
    /// nothing more is tapped (the failed entries' completions report the error; some
    /// of them may still have reached the file, where the next open finds them).
    pub fn open_with_tap(
        config: WriterConfig,
        key: SigningKey,
        tap: Tap,
    ) -> Result<(Writer, OpenReport), OpenError> {
        Self::start(config, key, Some(tap))
    }

    fn start(
        config: WriterConfig,
        key: SigningKey,
        tap: Option<Tap>,
    ) -> Result<(Writer, OpenReport), OpenError> {
        let (mut state, report) = State::open(config, key)?;
        let stats = state.stats.clone();
        let shared = state.shared.clone();
        shared
            .recovered_at
            .store(state.chain.next_index(), Ordering::Release);
        state.tapping = tap.is_some();
        if state.cfg.fsync == FsyncPolicy::Batch {
            let syncer = Syncer::start(stats.clone(), tap).map_err(|error| OpenError::Io {
                path: PathBuf::from("<fsync thread>"),
                error,
            })?;
            *syncer
                .durable
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(state.mark.clone());
            state.syncer = Some(syncer);
        } else {
            state.tap = tap;
        }
        let (tx, rx) = mpsc::sync_channel(state.cfg.queue_capacity.max(1));
        let thread = std::thread::Builder::new()
            .name("tollgate-audit-writer".into())
            .spawn(move || state.run(&rx))
            .map_err(|error| OpenError::Io {
                path: PathBuf::from("<writer thread>"),
                error,
            })?;
        Ok((
            Writer {
                tx,
                thread: Mutex::new(Some(thread)),
                stats,
                shared,
            },
            report,
        ))
    }

    fn send<T>(&self, make: impl FnOnce(Completer<T>) -> Msg) -> Pending<T> {
        let (c, p) = completion::pair();
        // A failed send drops the message and with it the completer: the pending
        // result becomes WriterGone.
        let _ = self.tx.send(make(c));
        p
    }

    /// Submit a session event (a verdict, a session opened, a settlement or a human
    /// decision). The writer assigns its index, id, previous hash and signature; the
    /// entry's timestamp is the event's. Blocks only when `queue_capacity` submissions
    /// are already waiting.
    pub fn submit(&self, event: impl Into<SessionEvent>) -> Pending<Appended> {
        let event = event.into();
        let ts = event.timestamp_ns();
        self.send(|c| Msg::Entry(Box::new(Event::Session(event)), ts, None, c))
    }

    /// [`Writer::submit`], but written only if the writer is still at `generation` (from
    /// [`Writer::generation`]) when it takes the entry; otherwise it fails with
    /// [`WriteError::Stale`]. A store that computed the change from its memory uses it:
    /// after a recovery its memory may hold changes whose entries were lost, and a change
    /// computed on them must not reach the log (the store reloads the fold of the log
    /// first, see `tollgate_store`).
    pub fn submit_at(&self, event: impl Into<SessionEvent>, generation: u64) -> Pending<Appended> {
        let event = event.into();
        let ts = event.timestamp_ns();
        self.send(|c| Msg::Entry(Box::new(Event::Session(event)), ts, Some(generation), c))
    }

    /// Submit a policy-set entry (record kind 9): the set in force from here on, at the
    /// daemon's start or after a reload. Like a session event, it takes its place in the
    /// chain in submission order, and its completion says when it is durable.
    pub fn submit_policy_set(&self, record: crate::entry::PolicySetRecord) -> Pending<Appended> {
        let ts = record.timestamp_ns;
        self.send(|c| Msg::Entry(Box::new(Event::PolicySet(record)), ts, None, c))
    }

    /// The generation the writer takes entries at, or why it refuses them now. Cheap (two
    /// atomic loads): for every change a store makes.
    pub fn generation(&self) -> Result<u64, String> {
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(self.shared.message());
        }
        Ok(self.shared.generation.load(Ordering::Acquire))
    }

    /// Whether the writer takes entries, why not, and how often it has recovered.
    ///
    /// After a failure to write, sync or rotate (`ENOSPC`, `EMFILE`, `EIO`), every entry
    /// is refused (callers fail closed) and the writer tries to recover every
    /// [`WriterConfig::heal_interval`]: it settles every batch already handed to fsync,
    /// moves what was written after the last durable point (never acknowledged) into
    /// `torn/` and cuts the file back to that point, re-reads the file and checks that
    /// it ends exactly where, and with exactly the record hash, the writer knows, records
    /// the cut with a signed recovery entry, and then takes entries again at the next
    /// generation. If the file is not what the writer wrote (shorter than what was
    /// acknowledged, another record hash, files it did not write), it stays refused:
    /// [`Health::permanent`].
    pub fn health(&self) -> Health {
        let failed = self.shared.failed.load(Ordering::Acquire);
        Health {
            generation: self.shared.generation.load(Ordering::Acquire),
            failure: failed.then(|| self.shared.message()),
            permanent: failed && self.shared.permanent.load(Ordering::Acquire),
            recovered_at: self.shared.recovered_at.load(Ordering::Acquire),
            failures: self.shared.failures.load(Ordering::Acquire),
        }
    }

    /// Like [`Writer::submit`] but fails instead of blocking when the queue is full,
    /// handing the event back.
    pub fn try_submit(
        &self,
        event: impl Into<SessionEvent>,
    ) -> Result<Pending<Appended>, Box<SessionEvent>> {
        let event = event.into();
        let (c, p) = completion::pair();
        let ts = event.timestamp_ns();
        match self
            .tx
            .try_send(Msg::Entry(Box::new(Event::Session(event)), ts, None, c))
        {
            Ok(()) => Ok(p),
            Err(TrySendError::Full(Msg::Entry(ev, _, _, _))) => match *ev {
                Event::Session(e) => Err(Box::new(e)),
                _ => Ok(p),
            },
            // The writer is gone: the dropped completer makes `p` report it.
            Err(_) => Ok(p),
        }
    }

    /// The writer's counters so far.
    pub fn stats(&self) -> Stats {
        Stats {
            entries: self.stats.entries.load(Ordering::Relaxed),
            batches: self.stats.batches.load(Ordering::Relaxed),
            syncs: self.stats.syncs.load(Ordering::Relaxed),
            sync_nanos: self.stats.sync_nanos.load(Ordering::Relaxed),
        }
    }

    /// Submit and wait.
    pub fn append(&self, event: impl Into<SessionEvent>) -> Result<Appended, WriteError> {
        self.submit(event).wait()
    }

    /// Ready once everything submitted before it is durable.
    pub fn flush(&self) -> Pending<()> {
        self.send(Msg::Flush)
    }

    /// Write a checkpoint now (after making everything before it durable).
    pub fn checkpoint(&self) -> Pending<Checkpoint> {
        self.send(Msg::Checkpoint)
    }

    /// Hand over to a new signing key: a hand-over entry naming `new_key`, signed by the
    /// current key; every later entry is signed by `new_key`.
    pub fn rotate_key(&self, new_key: SigningKey) -> Pending<Appended> {
        self.send(|c| Msg::RotateKey(Box::new(new_key), c))
    }

    /// Drain everything submitted, write a final checkpoint, and stop the thread.
    /// Later submissions fail with [`WriteError::WriterGone`].
    pub fn shutdown(&self) -> Result<(), WriteError> {
        let r = self.send(Msg::Shutdown).wait();
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        match r {
            // A second shutdown finds the thread gone: that is fine.
            Err(WriteError::WriterGone) => Ok(()),
            other => other,
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// The writer thread's state.
struct State {
    cfg: WriterConfig,
    /// The chain head: key, next index, last hash.
    chain: Chainer,
    file: Arc<File>,
    file_path: PathBuf,
    file_seq: u64,
    file_day: i64,
    file_len: u64,
    last_checkpoint_count: u64,
    last_checkpoint_ns: i64,
    failed: Option<String>,
    background: Vec<JoinHandle<()>>,
    buf: Vec<u8>,
    done: Vec<(Completer<Appended>, Appended)>,
    flushes: Vec<Completer<()>>,
    /// The staged entries, for the tap (empty when there is no tap).
    // INVARIANT (tap-order): `committed` holds exactly the entries whose bytes are in
    // `buf`, in chain order; it is handed to the tap only after those bytes are durable,
    // and before `done` completes.
    committed: Vec<Committed>,
    /// Whether there is a tap (here or in the fsync stage): entries are kept for it.
    tapping: bool,
    /// The tap, when this thread delivers (policies `always` and `never`).
    tap: Option<Tap>,
    stats: Arc<Counters>,
    /// The fsync stage of the pipeline (batch policy only).
    syncer: Option<Syncer>,
    /// Health, shared with the handles.
    shared: Arc<Shared>,
    /// The last durable point, when there is no fsync stage (which keeps its own).
    mark: Mark,
    /// The generation entries are taken at (the number of recoveries).
    generation: u64,
    /// When the next recovery attempt may run.
    next_heal: Instant,
    /// A failure no recovery attempt will fix.
    permanent: bool,
}

/// The fsync stage: while it syncs one batch, the writer thread signs and writes the
/// next. Completions fire here, after the sync that covers their bytes.
#[derive(Debug)]
struct Syncer {
    tx: mpsc::Sender<SyncJob>,
    thread: JoinHandle<()>,
    failed: Arc<Mutex<Option<String>>>,
    /// The last durable point: the end of the last job synced without error.
    durable: Arc<Mutex<Option<Mark>>>,
}

/// Written bytes waiting for a sync.
#[derive(Debug)]
struct SyncJob {
    file: Arc<File>,
    path: PathBuf,
    done: Vec<(Completer<Appended>, Appended)>,
    flushes: Vec<Completer<()>>,
    committed: Vec<Committed>,
    /// Where the log ends once this job's bytes are synced.
    mark: Mark,
}

impl Syncer {
    fn start(stats: Arc<Counters>, mut tap: Option<Tap>) -> std::io::Result<Syncer> {
        let (tx, rx) = mpsc::channel::<SyncJob>();
        let failed = Arc::new(Mutex::new(None::<String>));
        let shared = failed.clone();
        let durable = Arc::new(Mutex::new(None::<Mark>));
        let durable_here = durable.clone();
        let thread = std::thread::Builder::new()
            .name("tollgate-audit-fsync".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut jobs = vec![first];
                    jobs.extend(rx.try_iter());
                    // One sync per distinct file covers every job written before it.
                    let mut synced: Vec<&Arc<File>> = Vec::new();
                    let mut error = shared
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone();
                    for job in &jobs {
                        if error.is_some() {
                            break;
                        }
                        if synced.iter().any(|f| Arc::ptr_eq(f, &job.file)) {
                            continue;
                        }
                        if let Err(e) = stats.sync(&job.file) {
                            error = Some(format!("`{}`: {e}", job.path.display()));
                        }
                        synced.push(&job.file);
                    }
                    if let Some(e) = &error {
                        let mut f = shared.lock().unwrap_or_else(PoisonError::into_inner);
                        if f.is_none() {
                            *f = Some(e.clone());
                        }
                    } else if let Some(last) = jobs.last() {
                        // INVARIANT (durable-mark): the mark moves only past bytes a sync
                        // covered without error; a recovery cuts back to it.
                        let mut d = durable_here.lock().unwrap_or_else(PoisonError::into_inner);
                        if d.as_ref().is_none_or(|m| last.mark.reaches(m)) {
                            *d = Some(last.mark.clone());
                        }
                    }
                    for job in jobs {
                        // INVARIANT (tap-order): jobs arrive in chain order; each is
                        // tapped after the sync that covers it, before it completes.
                        if error.is_none() && !job.committed.is_empty() {
                            if let Some(tap) = tap.as_mut() {
                                tap(job.committed);
                            }
                        }
                        for (c, a) in job.done {
                            c.complete(match &error {
                                Some(e) => Err(WriteError::Io(e.clone())),
                                None => Ok(a),
                            });
                        }
                        for c in job.flushes {
                            c.complete(match &error {
                                Some(e) => Err(WriteError::Io(e.clone())),
                                None => Ok(()),
                            });
                        }
                    }
                }
            })?;
        Ok(Syncer {
            tx,
            thread,
            failed,
            durable,
        })
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> OpenError + '_ {
    move |error| OpenError::Io {
        path: path.to_owned(),
        error,
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("file_path", &self.file_path)
            .field("next_index", &self.chain.next_index())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl State {
    fn open(cfg: WriterConfig, key: SigningKey) -> Result<(State, OpenReport), OpenError> {
        let dir = cfg.dir.clone();
        files::create_dir_with_mode(&dir, 0o750).map_err(io_err(&dir))?;
        remove_stale_tmp(&dir);
        let key_id = KeyId::of(key.verifying_key().as_bytes());
        let now = cfg.clock.now_ns();
        let logs = files::list_log_files(&dir).map_err(io_err(&dir))?;
        let Some(last) = logs.last().cloned() else {
            let header = FileHeader::new_signed(&key, 0, 0, format::genesis_hash(), now);
            let (file, path) = create_log_file(&dir, &header).map_err(io_err(&dir))?;
            let state = State::new(
                cfg,
                key,
                file,
                path.clone(),
                &header,
                format::HEADER_LEN as u64,
            );
            let report = OpenReport {
                file: path,
                next_index: 0,
                created: true,
                recovered: None,
                upgraded_from: None,
            };
            return Ok((state, report));
        };
        // Leftovers of a crash during compression: a .zst beside its .log.
        for f in &logs {
            let zst = zst_path(&f.path);
            if !f.compressed && zst.exists() {
                let _ = fs::remove_file(&zst);
            }
        }
        let bytes = files::read_log_file(&last.path).map_err(|e| match e {
            files::ReadError::CorruptArchive(reason) => OpenError::CorruptArchive {
                path: last.path.clone(),
                reason,
            },
            other => OpenError::Io {
                path: last.path.clone(),
                error: other.into_io(),
            },
        })?;
        let mut v = Verifier::new(VerifyOptions {
            allow_head_gap: true,
            check_signatures: cfg.verify_on_open,
            ..VerifyOptions::default()
        });
        let name = last.path.display().to_string();
        let result = v.feed_file(&name, &bytes, &mut |_| {});
        let mut torn = None;
        match result {
            Ok(()) => {}
            Err(Break {
                kind: BreakKind::TornRecord { .. } | BreakKind::ZeroFilledTail { .. },
                offset,
                ..
            }) if !last.compressed => torn = Some(offset),
            Err(b) => return Err(OpenError::Broken(b)),
        }
        let Some(tip) = v.tip().cloned() else {
            return Err(OpenError::Broken(Break {
                file: name,
                index: None,
                offset: 0,
                kind: BreakKind::Empty,
            }));
        };
        let tip_key = KeyId::of(tip.key.as_bytes());
        if tip_key != key_id {
            return Err(OpenError::KeyMismatch {
                log: tip_key,
                given: key_id,
            });
        }
        let mut moved = None;
        if let Some(offset) = torn {
            let tail = bytes
                .get(usize::try_from(offset).unwrap_or(usize::MAX)..)
                .unwrap_or_default();
            let torn_dir = dir.join(TORN_DIR);
            files::create_dir_with_mode(&torn_dir, 0o750).map_err(io_err(&torn_dir))?;
            let file_name = last
                .path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("log");
            let rel = format!("{TORN_DIR}/{file_name}.{offset}.{now}.torn");
            let torn_path = dir.join(&rel);
            write_new_file(&torn_path, tail).map_err(io_err(&torn_path))?;
            sync_dir(&torn_dir).map_err(io_err(&torn_dir))?;
            let f = OpenOptions::new()
                .write(true)
                .open(&last.path)
                .map_err(io_err(&last.path))?;
            f.set_len(offset).map_err(io_err(&last.path))?;
            f.sync_all().map_err(io_err(&last.path))?;
            moved = Some((
                Event::Recovery {
                    file: file_name.to_owned(),
                    offset,
                    length: tail.len() as u64,
                    sha256: format::sha256(tail),
                    moved_to: rel,
                },
                torn_path,
                offset,
                tail.len() as u64,
            ));
        }
        let old_version = tip.header.version;
        let upgraded_from = (old_version < format::FORMAT_VERSION).then_some(old_version);
        let (file, path, len, header) = if last.compressed || upgraded_from.is_some() {
            // Every file we would append to is uncompressed and of the current version.
            // A compressed tail means the current file was lost after rotation; an older
            // version is left as written. Either way, continue in a fresh file, as a
            // rotation would.
            let header =
                FileHeader::new_signed(&key, tip.next_file_seq, tip.next_index, tip.last_hash, now);
            let (file, path) = create_log_file(&dir, &header).map_err(io_err(&dir))?;
            (file, path, format::HEADER_LEN as u64, header)
        } else {
            let file = OpenOptions::new()
                .append(true)
                .open(&last.path)
                .map_err(io_err(&last.path))?;
            (file, last.path.clone(), tip.valid_len, tip.header.clone())
        };
        let mut state = State::new(cfg, key, file, path.clone(), &header, len);
        state.chain.reset(tip.next_index, tip.last_hash);
        state.mark = state.written_mark();
        state.last_checkpoint_count = tip.next_index;
        // Files left uncompressed by a crash during compression.
        if state.cfg.compress_rotated {
            for f in logs.iter().filter(|f| !f.compressed && f.path != path) {
                state.spawn_compress(f.path.clone());
            }
        }
        let mut report = OpenReport {
            file: path,
            next_index: state.chain.next_index(),
            created: false,
            recovered: None,
            upgraded_from,
        };
        if let Some((event, moved_to, offset, length)) = moved {
            let appended = state.append_system(event).map_err(|e| OpenError::Io {
                path: state.file_path.clone(),
                error: std::io::Error::other(e.to_string()),
            })?;
            report.recovered = Some(Recovered {
                file: last.path,
                offset,
                length,
                moved_to,
                entry_index: appended.index,
            });
            report.next_index = state.chain.next_index();
        }
        Ok((state, report))
    }

    fn new(
        cfg: WriterConfig,
        key: SigningKey,
        file: File,
        path: PathBuf,
        header: &FileHeader,
        len: u64,
    ) -> State {
        let now = cfg.clock.now_ns();
        let mark = Mark {
            path: path.clone(),
            file_seq: header.file_seq,
            len,
            next_index: header.first_index,
            last_hash: header.prev_hash,
        };
        State {
            chain: Chainer::new(
                key,
                format::FORMAT_VERSION,
                header.first_index,
                header.prev_hash,
            ),
            file: Arc::new(file),
            file_path: path,
            file_seq: header.file_seq,
            file_day: files::day_of(header.created_ns),
            file_len: len,
            last_checkpoint_count: header.first_index,
            last_checkpoint_ns: now,
            failed: None,
            background: Vec::new(),
            buf: Vec::with_capacity(1 << 16),
            done: Vec::new(),
            flushes: Vec::new(),
            committed: Vec::new(),
            tapping: false,
            tap: None,
            stats: Arc::new(Counters::default()),
            syncer: None,
            shared: Arc::new(Shared::default()),
            mark,
            generation: 0,
            next_heal: Instant::now(),
            permanent: false,
            cfg,
        }
    }

    /// The end of what has been written (everything staged must be written).
    fn written_mark(&self) -> Mark {
        Mark {
            path: self.file_path.clone(),
            file_seq: self.file_seq,
            len: self.file_len,
            next_index: self.chain.next_index(),
            last_hash: self.chain.last_hash(),
        }
    }

    /// Everything written so far is durable.
    fn set_durable(&mut self) {
        let mark = self.written_mark();
        if let Some(s) = &self.syncer {
            *s.durable.lock().unwrap_or_else(PoisonError::into_inner) = Some(mark.clone());
        }
        self.mark = mark;
    }

    /// The last durable point: the fsync stage's (all its jobs must be settled), or ours.
    fn durable_mark(&self) -> Mark {
        let staged = self.syncer.as_ref().and_then(|s| {
            s.durable
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        });
        match staged {
            Some(m) if m.reaches(&self.mark) => m,
            _ => self.mark.clone(),
        }
    }

    /// Refuse every entry from now on, until a recovery (the first failure's message
    /// wins).
    fn fail(&mut self, message: String) {
        if self.failed.is_some() {
            return;
        }
        self.shared.failures.fetch_add(1, Ordering::Relaxed);
        self.shared.set_message(Some(message.clone()));
        self.shared.failed.store(true, Ordering::Release);
        self.failed = Some(message);
        self.next_heal = Instant::now() + self.cfg.heal_interval.unwrap_or_default();
    }

    /// Try to recover, if failed and due.
    fn maybe_heal(&mut self) {
        let Some(reason) = self.failed.clone() else {
            return;
        };
        let Some(interval) = self.cfg.heal_interval else {
            return;
        };
        if self.permanent || Instant::now() < self.next_heal {
            return;
        }
        match self.heal() {
            Ok(()) => {
                self.generation = self.generation.saturating_add(1);
                self.shared
                    .recovered_at
                    .store(self.chain.next_index(), Ordering::Release);
                self.shared.set_message(None);
                self.shared.permanent.store(false, Ordering::Release);
                self.shared
                    .generation
                    .store(self.generation, Ordering::Release);
                self.shared.failed.store(false, Ordering::Release);
            }
            Err(Unhealed::Retry(why)) => {
                self.next_heal = Instant::now() + interval;
                // The writer may have failed anew while recovering: keep the newest cause.
                let first = self.failed.clone().unwrap_or(reason);
                self.shared
                    .set_message(Some(format!("{first} (not recovered yet: {why})")));
            }
            Err(Unhealed::Permanent(why)) => {
                self.permanent = true;
                self.shared.set_message(Some(format!(
                    "{reason}; it will not recover by itself: {why}. See `Fail-stop` in docs/audit-format.md"
                )));
                self.shared.permanent.store(true, Ordering::Release);
            }
        }
    }

    /// One recovery attempt; see [`Writer::health`] for what it does and why.
    fn heal(&mut self) -> Result<(), Unhealed> {
        let retry = |what: &str, p: &Path| {
            let (what, p) = (what.to_owned(), p.to_owned());
            move |e: std::io::Error| Unhealed::Retry(format!("{what} `{}`: {e}", p.display()))
        };
        // 1. Every batch handed to the fsync stage is settled (synced and acknowledged,
        // or failed and its callers told), so the durable mark is final.
        if let Some(s) = &self.syncer {
            let (c, p) = completion::pair();
            let barrier = SyncJob {
                file: self.file.clone(),
                path: self.file_path.clone(),
                done: Vec::new(),
                flushes: vec![c],
                committed: Vec::new(),
                mark: self.mark.clone(),
            };
            if s.tx.send(barrier).is_err() {
                return Err(Unhealed::Permanent("the fsync thread is gone".into()));
            }
            let _ = p.wait();
        }
        // Anything staged or waiting was completed with the failure already.
        self.buf.clear();
        self.complete_all();
        let mark = self.durable_mark();
        let dir = self.cfg.dir.clone();
        let foreign = |what: String| Unhealed::Permanent(what);

        // 2. Files after the mark's: only a half-done rotation's new file (its header
        // alone, continuing the chain from the mark) may be there; it is adopted.
        let logs = files::list_log_files(&dir).map_err(retry("listing", &dir))?;
        let mut next_file: Option<(PathBuf, FileHeader)> = None;
        for f in logs.iter().filter(|f| f.seq > mark.file_seq) {
            let bytes = files::read_log_file(&f.path)
                .map_err(|e| Unhealed::Retry(format!("reading `{}`: {e}", f.path.display())))?;
            let header = bytes
                .get(..format::HEADER_LEN)
                .and_then(|h| FileHeader::decode(h).ok());
            let continues = header.as_ref().is_some_and(|h| {
                h.first_index == mark.next_index
                    && h.prev_hash == mark.last_hash
                    && h.key_id == self.chain.key_id()
                    && h.version == format::FORMAT_VERSION
            });
            if f.seq != mark.file_seq.saturating_add(1)
                || f.compressed
                || bytes.len() != format::HEADER_LEN
                || !continues
                || next_file.is_some()
            {
                return Err(foreign(format!(
                    "`{}` follows the file being written and is not a new file this writer started",
                    f.path.display()
                )));
            }
            if let Some(h) = header {
                next_file = Some((f.path.clone(), h));
            }
        }

        // 3. The mark's file holds at least what was durable; what it holds beyond was
        // written but never acknowledged (a failed write's partial record, batches whose
        // sync failed): copied to `torn/`, then cut.
        let len = match fs::metadata(&mark.path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(foreign(format!(
                    "`{}` was removed while the writer had it open",
                    mark.path.display()
                )))
            }
            Err(e) => return Err(retry("reading", &mark.path)(e)),
        };
        if len < mark.len {
            return Err(foreign(format!(
                "`{}` holds {len} bytes, fewer than the {} already durable: it was cut while the writer ran",
                mark.path.display(),
                mark.len
            )));
        }
        let file_name = mark
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("log")
            .to_owned();
        let mut cut = None;
        if len > mark.len {
            let bytes = files::read_log_file(&mark.path)
                .map_err(|e| Unhealed::Retry(format!("reading `{}`: {e}", mark.path.display())))?;
            let tail = bytes
                .get(usize::try_from(mark.len).unwrap_or(usize::MAX)..)
                .unwrap_or_default();
            let torn_dir = dir.join(TORN_DIR);
            files::create_dir_with_mode(&torn_dir, 0o750).map_err(retry("creating", &torn_dir))?;
            let now = self.cfg.clock.now_ns();
            let rel = format!("{TORN_DIR}/{file_name}.{}.{now}.torn", mark.len);
            let torn_path = dir.join(&rel);
            write_new_file(&torn_path, tail).map_err(retry("writing", &torn_path))?;
            sync_dir(&torn_dir).map_err(retry("syncing", &torn_dir))?;
            let f = OpenOptions::new()
                .write(true)
                .open(&mark.path)
                .map_err(retry("opening", &mark.path))?;
            f.set_len(mark.len)
                .and_then(|()| f.sync_all())
                .map_err(retry("cutting", &mark.path))?;
            cut = Some(Event::Recovery {
                file: file_name.clone(),
                offset: mark.len,
                length: tail.len() as u64,
                sha256: format::sha256(tail),
                moved_to: rel,
            });
        }

        // 4. Re-read the file: structure and links from its header must end exactly at
        // the mark, with the mark's record hash. The writer computed that hash when it
        // signed the record, and each record links to the one before, so every byte of
        // the file is the writer's own.
        let bytes = files::read_log_file(&mark.path)
            .map_err(|e| Unhealed::Retry(format!("reading `{}`: {e}", mark.path.display())))?;
        let mut v = Verifier::new(VerifyOptions {
            allow_head_gap: true,
            check_signatures: false,
            ..VerifyOptions::default()
        });
        let name = mark.path.display().to_string();
        v.feed_file(&name, &bytes, &mut |_| {}).map_err(|b| {
            foreign(format!(
                "`{name}` no longer reads as the writer wrote it: {b}"
            ))
        })?;
        let tip = v
            .tip()
            .cloned()
            .ok_or_else(|| foreign(format!("`{name}` is empty")))?;
        if tip.next_index != mark.next_index
            || tip.last_hash != mark.last_hash
            || tip.valid_len != mark.len
        {
            return Err(foreign(format!(
                "`{name}` ends at entry {} ({} bytes), not at entry {} ({} bytes) as written: it was changed while the writer ran",
                tip.next_index, tip.valid_len, mark.next_index, mark.len
            )));
        }

        // 5. Go on from the mark on a fresh descriptor (one whose write-back failed may
        // report the failure again, or never).
        sync_dir(&dir).map_err(retry("syncing", &dir))?;
        let (path, file_seq, file_len, created_ns) = match next_file {
            Some((p, h)) => (p, h.file_seq, format::HEADER_LEN as u64, h.created_ns),
            None => (
                mark.path.clone(),
                mark.file_seq,
                mark.len,
                tip.header.created_ns,
            ),
        };
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(retry("opening", &path))?;
        if path != mark.path && self.cfg.compress_rotated {
            self.spawn_compress(mark.path.clone());
        }
        self.file = Arc::new(file);
        self.file_path = path;
        self.file_seq = file_seq;
        self.file_len = file_len;
        self.file_day = files::day_of(created_ns);
        self.chain.reset(mark.next_index, mark.last_hash);
        self.last_checkpoint_count = self.last_checkpoint_count.min(mark.next_index);
        self.failed = None;
        if let Some(s) = &self.syncer {
            *s.failed.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
        self.set_durable();

        // 6. The cut is part of the chain's history: a signed recovery entry says what
        // was moved where, before any new entry.
        if let Some(event) = cut {
            if let Err(e) = self.append_system(event) {
                return Err(Unhealed::Retry(format!("recording the cut: {e}")));
            }
        }
        Ok(())
    }

    fn run(mut self, rx: &Receiver<Msg>) {
        let max_batch = self.cfg.max_batch.max(1);
        let tick = self.cfg.checkpoint_interval.min(Duration::from_secs(1));
        let mut batch = Vec::with_capacity(max_batch);
        loop {
            let mut wait = tick;
            if self.failed.is_some() && !self.permanent && self.cfg.heal_interval.is_some() {
                wait = wait.min(self.next_heal.saturating_duration_since(Instant::now()));
            }
            match rx.recv_timeout(wait.max(Duration::from_millis(10))) {
                Ok(m) => batch.push(m),
                Err(RecvTimeoutError::Timeout) => {
                    self.maybe_heal();
                    self.maybe_checkpoint();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = self.finish();
                    return;
                }
            }
            while batch.len() < max_batch {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            self.maybe_heal();
            if self.process(&mut batch) {
                let _ = self.finish();
                return;
            }
        }
    }

    /// Handle one batch; true when asked to shut down.
    fn process(&mut self, batch: &mut Vec<Msg>) -> bool {
        self.take_sync_failure();
        let mut shutdown = None;
        for msg in batch.drain(..) {
            match msg {
                Msg::Entry(event, ts, generation, c) => {
                    if let Some(f) = &self.failed {
                        c.complete(Err(WriteError::Failed(f.clone())));
                        continue;
                    }
                    // INVARIANT (generation): an entry computed before a recovery, from a
                    // state that may hold lost changes, never reaches the log.
                    if generation.is_some_and(|g| g != self.generation) {
                        c.complete(Err(WriteError::Stale));
                        continue;
                    }
                    match self.stage(*event, ts) {
                        Ok(a) => self.done.push((c, a)),
                        Err(e) => c.complete(Err(e)),
                    }
                    if self.cfg.fsync == FsyncPolicy::Always {
                        self.commit_durable();
                    }
                }
                Msg::Flush(c) => self.flushes.push(c),
                Msg::Checkpoint(c) => {
                    self.commit_durable();
                    let r = match &self.failed {
                        Some(f) => Err(WriteError::Failed(f.clone())),
                        None => self.write_checkpoint(),
                    };
                    c.complete(r);
                }
                Msg::RotateKey(new_key, c) => {
                    let event = Event::KeyHandover {
                        new_public_key: new_key.verifying_key().to_bytes(),
                    };
                    let r = self.append_system(event);
                    if r.is_ok() {
                        self.chain.set_key(*new_key);
                    }
                    c.complete(r);
                }
                Msg::Shutdown(c) => shutdown = Some(c),
            }
        }
        self.commit();
        self.maybe_checkpoint();
        if let Some(c) = shutdown {
            let r = self.finish();
            c.complete(r);
            return true;
        }
        false
    }

    /// Sign and chain one entry into the batch buffer (rotating first if due).
    fn stage(&mut self, event: Event, ts: i64) -> Result<Appended, WriteError> {
        self.maybe_rotate();
        if let Some(f) = &self.failed {
            return Err(WriteError::Failed(f.clone()));
        }
        let Signed {
            record,
            appended: a,
        } = self.chain.sign(&event, ts)?;
        let hash = a.hash;
        self.buf.extend_from_slice(&record);
        if self.tapping {
            self.committed.push(Committed {
                index: a.index,
                hash,
                event,
            });
        }
        Ok(a)
    }

    /// Append a system entry (recovery, hand-over) and make it durable at once.
    fn append_system(&mut self, event: Event) -> Result<Appended, WriteError> {
        if let Some(f) = &self.failed {
            return Err(WriteError::Failed(f.clone()));
        }
        let now = self.cfg.clock.now_ns();
        let a = self.stage(event, now)?;
        self.commit_durable();
        match &self.failed {
            Some(f) => Err(WriteError::Io(f.clone())),
            None => Ok(a),
        }
    }

    /// Adopt a failure the fsync stage found: from now on every entry fails.
    fn take_sync_failure(&mut self) {
        if self.failed.is_none() {
            let found = self.syncer.as_ref().and_then(|s| {
                s.failed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            });
            if let Some(f) = found {
                self.fail(f);
            }
        }
    }

    /// Write the staged bytes with one `write`. False if that failed (or had failed).
    fn write_out(&mut self) -> bool {
        self.take_sync_failure();
        if !self.buf.is_empty() && self.failed.is_none() {
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
            match (&*self.file).write_all(&self.buf) {
                Ok(()) => {
                    self.file_len = self.file_len.saturating_add(self.buf.len() as u64);
                    self.stats
                        .entries
                        .fetch_add(self.done.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    // After a failed write the file's end is unknown: refuse until a
                    // recovery has cut it back to the last durable point.
                    self.fail(format!("`{}`: {e}", self.file_path.display()));
                }
            }
        }
        self.buf.clear();
        self.failed.is_none()
    }

    /// Hand the written entries to the tap (unless writing failed), then complete staged
    /// entries and flushes with `Ok` (or the failure). Called once they are durable.
    fn complete_all(&mut self) {
        let committed = std::mem::take(&mut self.committed);
        // INVARIANT (tap-order): tapped before the completions fire, only when written.
        if self.failed.is_none() && !committed.is_empty() {
            if let Some(tap) = self.tap.as_mut() {
                tap(committed);
            }
        }
        for (c, a) in self.done.drain(..) {
            c.complete(match &self.failed {
                Some(f) => Err(WriteError::Io(f.clone())),
                None => Ok(a),
            });
        }
        for c in self.flushes.drain(..) {
            c.complete(match &self.failed {
                Some(f) => Err(WriteError::Io(f.clone())),
                None => Ok(()),
            });
        }
    }

    /// Write the staged entries and make them durable per the policy. Under `batch`, the
    /// sync happens in the fsync stage, which completes them; the writer goes on signing.
    fn commit(&mut self) {
        if self.cfg.fsync != FsyncPolicy::Batch || self.syncer.is_none() {
            if self.cfg.fsync == FsyncPolicy::Never {
                if self.write_out() {
                    self.set_durable();
                }
                self.complete_all();
            } else {
                self.commit_durable();
            }
            return;
        }
        if !self.write_out() {
            self.complete_all();
            return;
        }
        if self.done.is_empty() && self.flushes.is_empty() && self.committed.is_empty() {
            return;
        }
        let job = SyncJob {
            file: self.file.clone(),
            path: self.file_path.clone(),
            done: std::mem::take(&mut self.done),
            flushes: std::mem::take(&mut self.flushes),
            committed: std::mem::take(&mut self.committed),
            mark: self.written_mark(),
        };
        if let Some(s) = &self.syncer {
            // If the fsync stage is gone, the job's completers report WriterGone.
            let _ = s.tx.send(job);
        }
    }

    /// Write the staged entries and make them durable before returning (system entries,
    /// checkpoints, `always`). Under `batch` they go through the fsync stage like any
    /// batch, and this waits for it: that keeps the tap and the completions in chain
    /// order. Otherwise one sync here covers everything written before it.
    fn commit_durable(&mut self) {
        if self.syncer.is_some() {
            let (c, p) = completion::pair();
            self.flushes.push(c);
            self.commit();
            // The result is also in the fsync stage's failure, adopted here.
            let _ = p.wait();
            self.take_sync_failure();
            return;
        }
        if self.write_out() {
            let synced = if self.cfg.fsync == FsyncPolicy::Never {
                Ok(())
            } else {
                self.stats.sync(&self.file)
            };
            match synced {
                Ok(()) => self.set_durable(),
                Err(e) => self.fail(format!("`{}`: {e}", self.file_path.display())),
            }
        }
        self.complete_all();
    }

    fn maybe_rotate(&mut self) {
        let now = self.cfg.clock.now_ns();
        let pending = self.buf.len() as u64;
        let len = self.file_len.saturating_add(pending);
        // A file holding only its header is never rotated for size.
        let by_size = len >= self.cfg.rotate_bytes && len > format::HEADER_LEN as u64;
        let by_day = self.cfg.rotate_daily && files::day_of(now) != self.file_day;
        if !(by_size || by_day) {
            return;
        }
        // Everything staged so far belongs to the old file, and is durable (settled by
        // the fsync stage) before the next file continues from it.
        self.commit_durable();
        if self.failed.is_some() {
            return;
        }
        match self.rotate(now) {
            Ok(()) => self.set_durable(),
            Err(e) => self.fail(format!("rotation failed: {e}")),
        }
    }

    fn rotate(&mut self, now: i64) -> std::io::Result<()> {
        self.file.sync_all()?;
        let header = FileHeader::new_signed(
            self.chain.key(),
            self.file_seq.saturating_add(1),
            self.chain.next_index(),
            self.chain.last_hash(),
            now,
        );
        let (file, path) = create_log_file(&self.cfg.dir, &header)?;
        let old = std::mem::replace(&mut self.file_path, path);
        self.file = Arc::new(file);
        self.file_seq = header.file_seq;
        self.file_day = files::day_of(now);
        self.file_len = format::HEADER_LEN as u64;
        if self.cfg.compress_rotated {
            self.spawn_compress(old);
        }
        self.apply_retention(now);
        Ok(())
    }

    fn spawn_compress(&mut self, path: PathBuf) {
        self.background.retain(|h| !h.is_finished());
        let spawned = std::thread::Builder::new()
            .name("tollgate-audit-zstd".into())
            .spawn(move || {
                // A failure leaves the uncompressed file in place; the next open retries.
                let _ = compress_file(&path);
            });
        if let Ok(h) = spawned {
            self.background.push(h);
        }
    }

    /// Delete rotated files older than the retention, only when marked archived.
    fn apply_retention(&mut self, now: i64) {
        let Some(days) = self.cfg.retention_days else {
            return;
        };
        let Ok(logs) = files::list_log_files(&self.cfg.dir) else {
            return;
        };
        let today = files::day_of(now);
        for f in logs {
            if f.path == self.file_path || f.seq >= self.file_seq {
                continue;
            }
            let Some(day) = file_day(&f) else { continue };
            if today.saturating_sub(day) <= i64::from(days) {
                continue;
            }
            // The marker may name the file before or after compression.
            let mut markers = vec![archived_marker(&f.path)];
            if f.compressed {
                if let Some(plain) = f.path.to_str().and_then(|p| p.strip_suffix(".zst")) {
                    markers.push(archived_marker(Path::new(plain)));
                }
            }
            // INVARIANT (retention-archived): a file is deleted only when its archived
            // marker exists.
            if markers.iter().any(|m| m.exists()) && fs::remove_file(&f.path).is_ok() {
                for m in &markers {
                    let _ = fs::remove_file(m);
                }
            }
        }
        let _ = sync_dir(&self.cfg.dir);
    }

    fn maybe_checkpoint(&mut self) {
        if self.failed.is_some() || self.chain.next_index() == self.last_checkpoint_count {
            return;
        }
        let now = self.cfg.clock.now_ns();
        let by_count = self.cfg.checkpoint_every > 0
            && self
                .chain
                .next_index()
                .saturating_sub(self.last_checkpoint_count)
                >= self.cfg.checkpoint_every;
        let interval = i64::try_from(self.cfg.checkpoint_interval.as_nanos()).unwrap_or(i64::MAX);
        let by_time = now.saturating_sub(self.last_checkpoint_ns) >= interval;
        if by_count || by_time {
            let _ = self.write_checkpoint();
        }
    }

    /// Write the latest checkpoint (everything staged must already be written). The
    /// current file is synced first, so a checkpoint never counts an entry that is not
    /// durable (files rotated out were synced when they were closed).
    fn write_checkpoint(&mut self) -> Result<Checkpoint, WriteError> {
        if self.syncer.is_some() {
            // Through the fsync stage, so that the checkpoint counts only entries it
            // acknowledged (a sync here could take a write-back error the stage then
            // misses, and acknowledge entries that are not on disk).
            self.commit_durable();
            if let Some(f) = &self.failed {
                return Err(WriteError::Failed(f.clone()));
            }
        } else if self.cfg.fsync != FsyncPolicy::Never {
            if let Err(e) = self.file.sync_data() {
                let msg = format!("`{}`: {e}", self.file_path.display());
                self.fail(msg.clone());
                return Err(WriteError::Io(msg));
            }
        }
        let now = self.cfg.clock.now_ns();
        let cp = Checkpoint::new_signed(
            self.chain.key(),
            self.chain.next_index(),
            self.chain.last_hash(),
            now,
        );
        let path = self.cfg.dir.join(CHECKPOINT_FILE);
        let tmp = self.cfg.dir.join(format!("{CHECKPOINT_FILE}.tmp"));
        let r = write_new_file(&tmp, cp.to_text().as_bytes())
            .and_then(|()| fs::rename(&tmp, &path))
            .and_then(|()| sync_dir(&self.cfg.dir));
        match r {
            Ok(()) => {
                self.last_checkpoint_count = self.chain.next_index();
                self.last_checkpoint_ns = now;
                Ok(cp)
            }
            Err(e) => Err(WriteError::Io(format!("`{}`: {e}", path.display()))),
        }
    }

    fn finish(&mut self) -> Result<(), WriteError> {
        self.commit();
        // Drain the fsync stage: every queued job is synced and completed.
        if let Some(s) = self.syncer.take() {
            drop(s.tx);
            let _ = s.thread.join();
            if self.failed.is_none() {
                self.failed = s
                    .failed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
            }
        }
        let r = match &self.failed {
            Some(f) => Err(WriteError::Failed(f.clone())),
            None => {
                let sync = self
                    .file
                    .sync_all()
                    .map_err(|e| WriteError::Io(e.to_string()));
                if self.chain.next_index() != self.last_checkpoint_count {
                    self.write_checkpoint().map(|_| ()).and(sync)
                } else {
                    sync
                }
            }
        };
        for h in self.background.drain(..) {
            let _ = h.join();
        }
        r
    }
}

fn file_day(f: &LogFile) -> Option<i64> {
    let name = f.path.file_name()?.to_str()?;
    let date = name.strip_prefix("audit-")?.split_once('-')?.1.get(..8)?;
    let y = date.get(..4)?.parse().ok()?;
    let m = date.get(4..6)?.parse().ok()?;
    let d = date.get(6..8)?.parse().ok()?;
    Some(files::days_from_civil(y, m, d))
}

/// The path of the archived marker of a log file.
pub fn archived_marker(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(ARCHIVED_SUFFIX);
    PathBuf::from(s)
}

fn zst_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".zst");
    PathBuf::from(s)
}

/// Create a log file with its header: written to a temporary name, synced, renamed, and
/// the directory synced, so a file either has a whole header or does not exist. Returns
/// the file opened for appending (O_APPEND) and its path.
fn create_log_file(dir: &Path, header: &FileHeader) -> std::io::Result<(File, PathBuf)> {
    let name = files::log_file_name(header.file_seq, files::day_of(header.created_ns));
    let path = dir.join(&name);
    let tmp = dir.join(format!("{name}.tmp"));
    write_new_file(&tmp, &header.encode())?;
    fs::rename(&tmp, &path)?;
    sync_dir(dir)?;
    let file = OpenOptions::new().append(true).open(&path)?;
    Ok((file, path))
}

/// Create (or replace) a file with mode 0640, write it and sync it.
fn write_new_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .open(path)?;
    f.set_permissions(fs::Permissions::from_mode(0o640))?;
    f.write_all(bytes)?;
    f.sync_all()
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn remove_stale_tmp(dir: &Path) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for ent in rd.flatten() {
        let name = ent.file_name();
        if name.to_str().is_some_and(|n| n.ends_with(".tmp")) {
            let _ = fs::remove_file(ent.path());
        }
    }
}

/// Compress a rotated file to `NAME.zst` (one zstd frame with a content checksum,
/// checked by decompressing), then remove it.
pub fn compress_file(path: &Path) -> std::io::Result<PathBuf> {
    let data = fs::read(path)?;
    // One frame with a content checksum, so that a damaged archive is reported as one
    // (a corrupt archive) rather than as whatever the damaged bytes decode to.
    let mut zc = zstd::bulk::Compressor::new(3)?;
    zc.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
    let compressed = zc.compress(&data)?;
    let back = zstd::bulk::decompress(&compressed, data.len())?;
    if back != data {
        return Err(std::io::Error::other("zstd round trip differs"));
    }
    let out = zst_path(path);
    let mut tmp = out.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    write_new_file(&tmp, &compressed)?;
    fs::rename(&tmp, &out)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    sync_dir(dir)?;
    fs::remove_file(path)?;
    sync_dir(dir)?;
    Ok(out)
}
