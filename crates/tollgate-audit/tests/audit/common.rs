//! Helpers shared by the test modules.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use tollgate_audit::format::{self, HEADER_LEN};
use tollgate_audit::{
    verify_paths, Appended, AuditEntry, BreakKind, Clock, Event, FsyncPolicy, PathsError,
    SessionEvent, Summary, VerdictRecord, VerifyOptions, Writer, WriterConfig,
};
use tollgate_core::{DenyReason, Digest, Money, Reason, Verdict};

/// 2026-11-30T12:00:00Z.
pub const NOON: i64 = 1_796_040_000 * 1_000_000_000;

pub fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

/// A clock the test sets.
#[derive(Debug)]
pub struct TestClock(pub AtomicI64);

impl TestClock {
    pub fn at(ns: i64) -> Arc<TestClock> {
        Arc::new(TestClock(AtomicI64::new(ns)))
    }
    pub fn set(&self, ns: i64) {
        self.0.store(ns, Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn now_ns(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

pub fn config(dir: &Path) -> WriterConfig {
    let mut cfg = WriterConfig::new(dir);
    cfg.clock = TestClock::at(NOON);
    cfg
}

pub fn record(i: u64) -> VerdictRecord {
    let deny = i % 3 == 1;
    VerdictRecord {
        timestamp_ns: NOON + i64::try_from(i).unwrap() * 1_000_000,
        session_id: format!("sess-{}", i % 4),
        agent_id: "agent-7".into(),
        organization_id: "org-acme".into(),
        call_number: i,
        tool_name: format!("tool_{}", i % 5),
        params_hash: format::sha256(&i.to_be_bytes()),
        verdict: if deny { Verdict::Deny } else { Verdict::Allow },
        deny_reason: deny.then_some(DenyReason::BudgetExhausted),
        reason: if deny {
            Reason::BudgetOverrun
        } else {
            Reason::WithinThresholds
        },
        probabilistic: false,
        budget_before: Money(10_000_000_000 - i64::try_from(i).unwrap() * 1_500_000),
        budget_after: Money(10_000_000_000 - i64::try_from(i + 1).unwrap() * 1_500_000),
        operator_id: None,
        estimated_cost: Money(1_500_000),
        nonce: 1000 + i,
        config_digest: Some(Digest([0xab; 32])),
        session_seq: i + 1,
        budget_version: 0,
        policy: None,
        shadow: Vec::new(),
        params: None,
        upstream: None,
        draw: None,
    }
}

/// A verdict as the event of an entry.
pub fn ev(r: VerdictRecord) -> Event {
    Event::Session(SessionEvent::Verdict(r))
}

/// Write `n` entries (indices 0..n) through a fresh writer and shut it down.
pub fn write_log(cfg: WriterConfig, k: &SigningKey, n: u64) -> Vec<Appended> {
    let (w, _) = Writer::open(cfg, k.clone()).unwrap();
    let out = (0..n).map(|i| w.append(record(i)).unwrap()).collect();
    w.shutdown().unwrap();
    out
}

/// The log files of a directory, in order.
pub fn log_files(dir: &Path) -> Vec<PathBuf> {
    tollgate_audit::files::list_log_files(dir)
        .unwrap()
        .into_iter()
        .map(|f| f.path)
        .collect()
}

pub fn only_file(dir: &Path) -> PathBuf {
    let files = log_files(dir);
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

pub fn opts(k: &SigningKey) -> VerifyOptions {
    VerifyOptions {
        trusted_key: Some(k.verifying_key()),
        ..VerifyOptions::default()
    }
}

pub fn verify_dir(dir: &Path, o: &VerifyOptions) -> Result<(Summary, Vec<AuditEntry>), PathsError> {
    let mut entries = Vec::new();
    let s = verify_paths(&[dir.to_owned()], o, &mut |e| entries.push(e.clone()))?;
    Ok((s, entries))
}

/// The break found, as (index, kind).
pub fn break_of(dir: &Path, o: &VerifyOptions) -> (Option<u64>, BreakKind) {
    match verify_dir(dir, o) {
        Err(PathsError::Break(b)) => (b.index, b.kind),
        Err(e) => panic!("io error {e}"),
        Ok((s, _)) => panic!("log verified whole: {s:?}"),
    }
}

/// (offset, length) of every record in a log file's bytes.
pub fn record_spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut off = HEADER_LEN;
    while off < bytes.len() {
        let (_, n) = format::parse_record(&bytes[off..]).unwrap();
        out.push((off, n));
        off += n;
    }
    out
}

pub fn fast(mut cfg: WriterConfig) -> WriterConfig {
    cfg.fsync = FsyncPolicy::Never;
    cfg
}

/// Run a future to completion on this thread.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// A tmpfs of `kib` KiB mounted for one test (unmounted when dropped), or `None` when
/// this machine cannot mount one (not root, no mount(8)): the test is then skipped, said
/// on standard error, and under `TOLLGATE_CI=1` the skip is a failure.
pub struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    pub fn mount(kib: u64) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={kib}k,mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir)),
            other => {
                let why = match other {
                    Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
                    Err(e) => e.to_string(),
                };
                assert!(
                    std::env::var("TOLLGATE_CI").as_deref() != Ok("1"),
                    "TOLLGATE_CI=1 and a tmpfs cannot be mounted: {why}"
                );
                eprintln!("SKIPPED: cannot mount a tmpfs (needs root and mount(8)): {why}");
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Fill the file system with `path` until writing fails, then give back `free`
    /// bytes (the file system then has about that much room). Returns the file's length.
    pub fn fill(&self, path: &Path, free: u64) -> u64 {
        use std::io::Write;
        let mut f = std::fs::File::create(path).unwrap();
        let chunk = vec![0x5au8; 4096];
        let mut len = 0u64;
        while f.write_all(&chunk).is_ok() {
            len += 4096;
        }
        let keep = len.saturating_sub(free);
        f.set_len(keep).unwrap();
        keep
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}
