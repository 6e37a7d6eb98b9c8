//! A real kill -9: a child process (this same test binary, re-run with an environment
//! variable) streams changes into an `EmbeddedStore` from four threads and prints each
//! change once its `Durable` completes; the parent SIGKILLs it mid-stream, reopens the
//! file, and checks that every acknowledged change is there and that the state is a
//! consistent cut (no gaps, budgets balance to the nano-dollar).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_core::state::Reservation;
use tollgate_core::{Money, PendingTransition, Reason};
use tollgate_store::{BudgetKey, Change, EmbeddedStore, Session, StoreOptions};

use crate::support::{agent_session, session};

const CHILD_ENV: &str = "TOLLGATE_STORE_CRASH_CHILD";
/// Group commits between checkpoints in the child (small, so kills land around them).
const CHECKPOINT_ENV: &str = "TOLLGATE_STORE_CRASH_CHECKPOINT";
/// If set, the child makes this many changes from one thread and exits.
const SEQUENTIAL_ENV: &str = "TOLLGATE_STORE_CRASH_SEQUENTIAL";
/// If set, `fdatasync_precedes_every_acknowledgement` fails rather than skips when
/// `strace` is missing.
const STRACE_ENV: &str = "TOLLGATE_STORE_STRACE";
const THREADS: u64 = 4;
const BUDGET: i64 = 1_000_000_000_000;
const STEP: i64 = 10;
/// Session `s3` trips its circuit at this change.
const TRIP_AT: u64 = 10;

fn id(t: u64) -> String {
    format!("s{t}")
}

fn nonce(t: u64, k: u64) -> u64 {
    k * THREADS + t
}

/// Change `k` of thread `t`: one call number, one nonce, one reservation of `STEP`,
/// a pending transition on every fifth change (cleared on the others), and `s3`'s
/// circuit trips at change `TRIP_AT`.
fn change(t: u64, s: &mut Session) -> u64 {
    let k = s.next_call_number();
    s.state.seen_nonces.insert(nonce(t, k));
    s.state.reservations.insert(
        k,
        Reservation {
            estimated: Money(STEP),
            deducted: Money(STEP),
        },
    );
    s.state.budget_remaining = s.state.budget_remaining.saturating_sub(Money(STEP));
    s.state.pending = k.is_multiple_of(5).then(|| PendingTransition {
        original_nonce: Some(nonce(t, k)),
        ..PendingTransition::default()
    });
    if t == 3 && k == TRIP_AT {
        s.state.circuit_tripped = true;
        s.state.circuit_trip_reason = Some(Reason::BudgetOverrun);
        s.state.circuit_tripped_at_ns = i64::try_from(k).unwrap();
    }
    s.last_heartbeat_ns = i64::try_from(k).unwrap();
    k
}

/// The child's body. Not a test of its own: it does nothing unless the parent set
/// `TOLLGATE_STORE_CRASH_CHILD` to the store's path.
#[test]
fn crash_child_process() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let checkpoint_entries = std::env::var(CHECKPOINT_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(StoreOptions::default().checkpoint_entries);
    let options = StoreOptions {
        checkpoint_entries,
        ..StoreOptions::default()
    };
    let store = EmbeddedStore::open(&path, options).unwrap();
    for t in 0..THREADS {
        // s0 and s1 share an agent budget; s2 and s3 have their own.
        let s = if t < 2 {
            agent_session(&id(t), "crash-bot", BUDGET)
        } else {
            session(&id(t), BUDGET)
        };
        if store.get_sync(&id(t)).unwrap().is_none() {
            store.create_sync(s).unwrap().wait().unwrap();
        }
    }
    println!("ready");
    if let Some(n) = std::env::var(SEQUENTIAL_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        // One change at a time, each acknowledged before the next is made.
        for _ in 0..n {
            let (k, durable) = store
                .apply_sync(&id(0), |s| Change::Commit(change(0, s)))
                .unwrap();
            durable.wait().unwrap();
            println!("ack 0 {k}");
        }
        return;
    }
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let store = &store;
            scope.spawn(move || loop {
                let (k, durable) = store
                    .apply_sync(&id(t), |s| Change::Commit(change(t, s)))
                    .unwrap();
                durable.wait().unwrap();
                println!("ack {t} {k}");
            });
        }
    });
}

/// Run the child until it has acknowledged `acks` changes, SIGKILL it, and return the
/// highest acknowledged change per thread (including lines flushed before the kill).
fn run_and_kill(path: &Path, acks: usize, checkpoint_entries: u64) -> BTreeMap<u64, u64> {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "crash::crash_child_process", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD_ENV, path)
        .env(CHECKPOINT_ENV, checkpoint_entries.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen < acks {
        assert!(Instant::now() < deadline, "child too slow");
        let Some(line) = lines.next() else {
            panic!("child exited early: {:?}", child.wait());
        };
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("ack ") {
            let (t, k) = rest.split_once(' ').unwrap();
            let (t, k): (u64, u64) = (t.parse().unwrap(), k.parse().unwrap());
            let e = acked.entry(t).or_default();
            *e = (*e).max(k);
            seen += 1;
        }
    }
    // SIGKILL: no destructor, no close, no flush.
    child.kill().unwrap();
    // Lines the child printed before it died were acknowledged too.
    for line in lines {
        let Ok(line) = line else { break };
        if let Some(rest) = line.strip_prefix("ack ") {
            if let Some((t, k)) = rest.split_once(' ') {
                if let (Ok(t), Ok(k)) = (t.parse::<u64>(), k.parse::<u64>()) {
                    let e = acked.entry(t).or_default();
                    *e = (*e).max(k);
                }
            }
        }
    }
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child was killed, not finished");
    acked
}

/// Reopen and check every acknowledged change is present and the state is consistent.
fn verify(path: &Path, acked: &BTreeMap<u64, u64>) -> BTreeMap<u64, u64> {
    let store = EmbeddedStore::open(path, StoreOptions::default()).unwrap();
    let mut have = BTreeMap::new();
    let mut shared_reserved = 0;
    for t in 0..THREADS {
        let s = store.get_sync(&id(t)).unwrap().unwrap();
        let k_max = s.last_call_number;
        let acked_k = acked.get(&t).copied().unwrap_or(0);
        assert!(
            k_max >= acked_k,
            "{}: acknowledged change {acked_k} lost (disk has {k_max})",
            id(t)
        );
        // A consistent prefix: exactly changes 1..=k_max, nothing skipped.
        let want_nonces: Vec<u64> = (1..=k_max).map(|k| nonce(t, k)).collect();
        assert_eq!(
            s.state.seen_nonces.iter().copied().collect::<Vec<_>>(),
            want_nonces
        );
        assert_eq!(
            s.state.reservations.keys().copied().collect::<Vec<_>>(),
            (1..=k_max).collect::<Vec<_>>()
        );
        assert_eq!(
            s.state.pending.as_ref().and_then(|p| p.original_nonce),
            (k_max.is_multiple_of(5) && k_max > 0).then(|| nonce(t, k_max))
        );
        let want_heartbeat = if k_max == 0 {
            1_000
        } else {
            i64::try_from(k_max).unwrap()
        };
        assert_eq!(s.last_heartbeat_ns, want_heartbeat);
        if t == 3 {
            assert_eq!(s.state.circuit_tripped, k_max >= TRIP_AT);
        }
        let reserved = i64::try_from(k_max).unwrap() * STEP;
        if t < 2 {
            shared_reserved += reserved;
        } else {
            assert_eq!(s.state.budget_remaining, Money(BUDGET - reserved));
        }
        have.insert(t, k_max);
    }
    // The shared budget balances exactly with both sessions' reservations.
    let b = store
        .budget_sync(&BudgetKey::Agent("org-1".into(), "crash-bot".into()))
        .unwrap()
        .unwrap();
    assert_eq!(b.remaining, Money(BUDGET - shared_reserved));
    store.close_sync().unwrap();
    have
}

#[test]
fn kill_9_loses_no_acknowledged_change() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    // Three rounds, each child continuing from what the last left on disk: with the
    // default checkpoint interval (the kill finds a long write-ahead log to replay), and
    // with checkpoints every few group commits (kills land before, during and after
    // checkpoints).
    let mut floor: BTreeMap<u64, u64> = BTreeMap::new();
    for (round, checkpoint_entries) in [1024, 3, 1].into_iter().enumerate() {
        let acked = run_and_kill(&path, 400, checkpoint_entries);
        assert_eq!(acked.len(), THREADS as usize, "round {round}: {acked:?}");
        let have = verify(&path, &acked);
        for (t, k) in &have {
            assert!(*k >= floor.get(t).copied().unwrap_or(0));
            assert!(*k > 0);
        }
        floor = have;
    }
    // Enough changes to have tripped s3's circuit and crossed pending transitions.
    assert!(floor.get(&3).copied().unwrap_or(0) >= TRIP_AT);
}

/// What kill -9 cannot show: that the log is fsynced before a change is acknowledged
/// (the page cache outlives a killed process, so a missing `fdatasync` loses nothing
/// there). The child runs under `strace`, one change at a time; at each acknowledgement
/// (its write to stdout) every log file descriptor must have been `fdatasync`ed, and the
/// call returned, since the last write to it.
#[test]
fn fdatasync_precedes_every_acknowledgement() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seq.redb");
    let trace = dir.path().join("trace.txt");
    let exe = std::env::current_exe().unwrap();
    let status = Command::new("strace")
        .args(["-f", "-qq", "-s", "8", "-e", "signal=none"])
        .args(["-e", "trace=openat,write,fdatasync,close", "-o"])
        .arg(&trace)
        .arg(exe)
        .args(["--exact", "crash::crash_child_process", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD_ENV, &path)
        .env(SEQUENTIAL_ENV, "40")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let status = match status {
        Ok(s) => s,
        Err(e) if std::env::var_os(STRACE_ENV).is_none() => {
            eprintln!("skipped: cannot run strace ({e}); set {STRACE_ENV} to require it");
            return;
        }
        Err(e) => panic!("strace: {e}"),
    };
    assert!(status.success());
    let text = std::fs::read_to_string(&trace).unwrap();
    // fd -> written since its last completed fdatasync
    let mut dirty: BTreeMap<i64, bool> = BTreeMap::new();
    // pid -> the log fd of an fdatasync in progress
    let mut syncing: BTreeMap<&str, i64> = BTreeMap::new();
    let (mut acks, mut syncs) = (0, 0);
    let fd_arg =
        |rest: &str| -> i64 { rest.split([',', ')', ' ']).next().unwrap().parse().unwrap() };
    for line in text.lines() {
        let (pid, call) = line.split_once(' ').unwrap();
        let call = call.trim_start();
        if let Some(rest) = call.strip_prefix("openat(") {
            if rest.contains(".wal.tmp\"") && !rest.contains("ENOENT") {
                if let Some((_, fd)) = rest.rsplit_once("= ") {
                    if let Ok(fd) = fd.trim().parse::<i64>() {
                        dirty.insert(fd, false);
                    }
                }
            }
        } else if let Some(rest) = call.strip_prefix("close(") {
            dirty.remove(&fd_arg(rest));
        } else if let Some(rest) = call.strip_prefix("write(") {
            let fd = fd_arg(rest);
            if let Some(d) = dirty.get_mut(&fd) {
                *d = true;
            } else if fd == 1 && rest.starts_with("1, \"ack") {
                acks += 1;
                assert!(
                    dirty.values().all(|d| !d),
                    "acknowledged before the log was synced: {line}"
                );
            }
        } else if let Some(rest) = call.strip_prefix("fdatasync(") {
            let fd = fd_arg(rest);
            if let Some(d) = dirty.get_mut(&fd) {
                if rest.contains("<unfinished") {
                    syncing.insert(pid, fd);
                } else if rest.contains("= 0") {
                    *d = false;
                    syncs += 1;
                }
            }
        } else if call.starts_with("<... fdatasync resumed>") && call.contains("= 0") {
            if let Some(fd) = syncing.remove(pid) {
                dirty.insert(fd, false);
                syncs += 1;
            }
        }
    }
    assert_eq!(acks, 40, "acknowledgements seen");
    assert!(
        syncs >= acks,
        "{syncs} log syncs for {acks} acknowledgements"
    );
}
