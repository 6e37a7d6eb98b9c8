//! A real kill -9, at many points: a child process (this same test binary, re-run with an
//! environment variable) runs calls and settlements into an `EmbeddedStore` over its audit
//! log from four threads, printing each once its `Durable` completes; the parent SIGKILLs
//! it after a random number of acknowledgements, reopens, and checks that the state is
//! exactly the fold of the log (verified with the public key alone), that every
//! acknowledged change is in it, that each budget reconciles entry by entry, and that no
//! nonce was ever ALLOWed twice in a session. Each round's child first resends, with the
//! same nonce, the last call of every session of the round before (a client retrying the
//! call it never heard back about): the state remembers it, so it is refused.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_audit::{Event, SessionEvent};
use tollgate_core::{Money, Reason, Verdict};
use tollgate_store::{BudgetKey, StoreOptions};

use crate::support::{
    agent_session, block_on, fold_log, normalize, open_embedded, pre_exec, session, settle, Call,
};

const CHILD_ENV: &str = "TOLLGATE_STORE_CRASH_CHILD";
/// The round number, and the snapshot setting, for the child.
const ROUND_ENV: &str = "TOLLGATE_STORE_CRASH_ROUND";
const SNAPSHOT_ENV: &str = "TOLLGATE_STORE_CRASH_SNAPSHOT";
/// If set, the child makes this many changes from one thread and exits.
const SEQUENTIAL_ENV: &str = "TOLLGATE_STORE_CRASH_SEQUENTIAL";
/// If set, `fdatasync_precedes_every_acknowledgement` fails rather than skips when
/// `strace` is missing.
const STRACE_ENV: &str = "TOLLGATE_STORE_STRACE";
const THREADS: u64 = 4;
const BUDGET: i64 = 1_000_000_000_000;
const STEP: i64 = 10;

fn id(round: u64, t: u64) -> String {
    format!("r{round}s{t}")
}

fn nonce(round: u64, t: u64, k: u64) -> u64 {
    (round << 40) | (k << 8) | t
}

/// Open (or join) round `round`'s sessions: threads 0 and 1 share the agent budget
/// `crash-bot` (across rounds too), 2 and 3 have their own.
fn ensure_sessions(store: &tollgate_store::EmbeddedStore, round: u64) {
    for t in 0..THREADS {
        if store.get_sync(&id(round, t)).unwrap().is_none() {
            let s = if t < 2 {
                agent_session(&id(round, t), "crash-bot", BUDGET)
            } else {
                session(&id(round, t), BUDGET)
            };
            let (_, d) = store.create_sync(s, 1_000).unwrap();
            d.wait().unwrap();
        }
    }
}

/// One call of thread `t`: the next call number with its own nonce; every third call is
/// settled too, with a readable cost or, now and then, one the core cannot read.
fn one_change(store: &tollgate_store::EmbeddedStore, round: u64, t: u64) -> u64 {
    let sid = id(round, t);
    let k = store.get_sync(&sid).unwrap().unwrap().last_call_number + 1;
    let (_, d) = pre_exec(
        store,
        &sid,
        Call {
            tool: ["search", "fetch"][(k % 2) as usize],
            arg: (k % 5) as i64,
            nonce: nonce(round, t, k),
            cost: STEP,
            now: 10_000 + k as i64,
        },
    )
    .unwrap();
    block_on(d).unwrap();
    if k.is_multiple_of(3) {
        let reported = if k.is_multiple_of(7) { f64::NAN } else { 5e-9 };
        block_on(settle(store, &sid, k, reported).unwrap()).unwrap();
    }
    k
}

/// The child's body. Not a test of its own: it does nothing unless the parent set
/// `TOLLGATE_STORE_CRASH_CHILD` to the data directory.
#[test]
fn crash_child_process() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    // The test harness has printed `test ... ` without a newline: end that line first.
    println!();
    let round: u64 = std::env::var(ROUND_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let snapshot_entries = std::env::var(SNAPSHOT_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let options = StoreOptions {
        snapshot_entries,
        snapshot_interval: Duration::from_millis(50),
        ..StoreOptions::default()
    };
    let (_writer, store, _) = open_embedded(Path::new(&dir), options).unwrap();
    // The retry of a client that never heard back: the last call of each session of the
    // round before, resent with its nonce.
    if round > 0 {
        for t in 0..THREADS {
            let sid = id(round - 1, t);
            let Some(s) = store.get_sync(&sid).unwrap() else {
                continue;
            };
            let k = s.last_call_number;
            if k == 0 {
                // No call of that session reached the log: nothing to resend.
                println!("resend {t} none");
                continue;
            }
            let (d, durable) = pre_exec(
                &store,
                &sid,
                Call {
                    tool: "search",
                    arg: 0,
                    nonce: nonce(round - 1, t, k),
                    cost: STEP,
                    now: 9_000,
                },
            )
            .unwrap();
            durable.wait().unwrap();
            println!("resend {t} {} {}", d.verdict, d.reason);
        }
    }
    ensure_sessions(&store, round);
    println!("ready");
    if let Some(n) = std::env::var(SEQUENTIAL_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        // One change at a time, each acknowledged before the next is made.
        for _ in 0..n {
            let k = one_change(&store, round, 0);
            println!("ack 0 {k}");
        }
        return;
    }
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let store = &store;
            scope.spawn(move || loop {
                let k = one_change(store, round, t);
                println!("ack {t} {k}");
            });
        }
    });
}

/// Run round `round`'s child until it has acknowledged `acks` changes, SIGKILL it, and
/// return the highest acknowledged call per thread (including lines flushed before the
/// kill) and the resend verdicts it printed.
fn run_and_kill(
    dir: &Path,
    round: u64,
    acks: usize,
    snapshot_entries: u64,
) -> (BTreeMap<u64, u64>, Vec<String>) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["--exact", "crash::crash_child_process", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD_ENV, dir)
        .env(ROUND_ENV, round.to_string())
        .env(SNAPSHOT_ENV, snapshot_entries.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
    let mut resends = Vec::new();
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let take = |line: &str, acked: &mut BTreeMap<u64, u64>, resends: &mut Vec<String>| {
        if let Some(rest) = line.strip_prefix("ack ") {
            if let Some((t, k)) = rest.split_once(' ') {
                if let (Ok(t), Ok(k)) = (t.parse::<u64>(), k.parse::<u64>()) {
                    let e = acked.entry(t).or_default();
                    *e = (*e).max(k);
                    return true;
                }
            }
        } else if let Some(rest) = line.strip_prefix("resend ") {
            resends.push(rest.to_owned());
        }
        false
    };
    while seen < acks {
        assert!(Instant::now() < deadline, "child too slow");
        let Some(line) = lines.next() else {
            panic!("child exited early: {:?}", child.wait());
        };
        if take(&line.unwrap(), &mut acked, &mut resends) {
            seen += 1;
        }
    }
    // SIGKILL: no destructor, no close, no flush, no last snapshot.
    child.kill().unwrap();
    for line in lines {
        let Ok(line) = line else { break };
        take(&line, &mut acked, &mut resends);
    }
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child was killed, not finished");
    (acked, resends)
}

/// Entry by entry, per budget: each entry's `budget_before` is where the last one left
/// the budget, and the last `budget_after` is what the store holds. The ALLOWed nonces
/// of each session are distinct.
fn reconcile(dir: &Path) -> HashMap<String, Money> {
    let mut running: HashMap<String, Money> = HashMap::new();
    let mut scope_of: HashMap<String, String> = HashMap::new();
    let mut allowed: HashMap<String, HashSet<u64>> = HashMap::new();
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(crate::support::key().verifying_key()),
        ..Default::default()
    };
    tollgate_audit::verify_paths(&[dir.join("audit")], &opts, &mut |e| {
        let Event::Session(ev) = &e.event else { return };
        let budget_of = |sid: &str, scope_of: &HashMap<String, String>| {
            scope_of.get(sid).cloned().unwrap_or_else(|| sid.to_owned())
        };
        let (sid, before, after) = match ev {
            SessionEvent::Opened(o) => {
                let key = if o.budget_scope == tollgate_core::BudgetScope::PerAgent {
                    format!("agent:{}", o.agent_id)
                } else {
                    o.session_id.clone()
                };
                scope_of.insert(o.session_id.clone(), key.clone());
                running.entry(key).or_insert(o.budget_before);
                return;
            }
            SessionEvent::Verdict(v) => {
                if v.verdict == Verdict::Allow && v.nonce != 0 {
                    assert!(
                        allowed
                            .entry(v.session_id.clone())
                            .or_default()
                            .insert(v.nonce),
                        "nonce {} ALLOWed twice in {}",
                        v.nonce,
                        v.session_id
                    );
                }
                (&v.session_id, v.budget_before, v.budget_after)
            }
            SessionEvent::Settled(s) => (&s.session_id, s.budget_before, s.budget_after),
            SessionEvent::HumanDecision(_) | SessionEvent::Closed(_) => return,
        };
        let key = budget_of(sid, &scope_of);
        let r = running.get_mut(&key).unwrap();
        assert_eq!(*r, before, "entry {} of {sid}", e.index);
        *r = after;
    })
    .unwrap();
    running
}

#[test]
fn kill_9_at_many_points_leaves_the_state_the_fold_of_the_log() {
    let dir = tempfile::tempdir().unwrap();
    // Kill points and snapshot settings: kills land before, during and after snapshots
    // (every entry, every few entries, and rarely).
    let rounds: [(usize, u64); 8] = [
        (37, 100_000),
        (211, 1),
        (5, 7),
        (390, 3),
        (1, 100_000),
        (150, 1),
        (64, 13),
        (300, 100_000),
    ];
    let mut floor: BTreeMap<String, u64> = BTreeMap::new();
    for (round, (acks, snapshot_entries)) in rounds.into_iter().enumerate() {
        let round = round as u64;
        let (acked, resends) = run_and_kill(dir.path(), round, acks, snapshot_entries);
        // Every resent call was a replay of a call the state remembers.
        if round > 0 {
            assert_eq!(
                resends.len(),
                THREADS as usize,
                "round {round}: {resends:?}"
            );
            for r in &resends {
                assert!(
                    r.ends_with(&format!("DENY {}", Reason::DuplicateNonce))
                        || r.ends_with(&format!("DENY {}", Reason::CircuitOpen))
                        || r.ends_with(" none"),
                    "round {round}: resend {r}"
                );
            }
        }
        let (writer, store, report) = open_embedded(dir.path(), StoreOptions::default()).unwrap();
        // The state is exactly the fold of the log, read with the public key alone.
        let ledger = fold_log(dir.path());
        assert_eq!(report.next_index, ledger.next_index, "round {round}");
        let (sessions, budgets) = tollgate_store::dump(&store);
        assert_eq!(sessions.len(), ledger.sessions.len());
        for s in &sessions {
            let folded = ledger.session(&s.meta.session_id).unwrap();
            assert_eq!(normalize(folded), normalize(s.clone()), "round {round}");
        }
        for (k, b) in &budgets {
            assert_eq!(ledger.budgets.get(k), Some(b), "round {round}: {k:?}");
        }
        // Every acknowledged call is there.
        for (t, k) in &acked {
            let s = store.get_sync(&id(round, *t)).unwrap().unwrap();
            assert!(
                s.last_call_number >= *k,
                "round {round}: acknowledged call {k} of thread {t} lost (state has {})",
                s.last_call_number
            );
        }
        // Budgets reconcile entry by entry with what the store holds.
        let reconciled = reconcile(dir.path());
        let shared = store
            .budget_sync(&BudgetKey::Agent("org-1".into(), "crash-bot".into()))
            .unwrap()
            .unwrap();
        assert_eq!(reconciled["agent:crash-bot"], shared.remaining);
        for s in &sessions {
            if s.meta.shared_budget_key().is_none() {
                assert_eq!(reconciled[&s.meta.session_id], s.state.budget_remaining);
            }
            // Nothing ever goes back.
            let f = floor.entry(s.meta.session_id.clone()).or_default();
            assert!(s.last_call_number >= *f);
            *f = s.last_call_number;
        }
        writer.shutdown().unwrap();
        store.close_sync().unwrap();
    }
}

/// What kill -9 cannot show: that the audit log is fsynced before a change is
/// acknowledged (the page cache outlives a killed process, so a missing `fdatasync`
/// loses nothing there). The child runs under `strace`, one change at a time; at each
/// acknowledgement (its write to stdout) every audit log file descriptor must have been
/// `fdatasync`ed, and the call returned, since the last write to it.
#[test]
fn fdatasync_precedes_every_acknowledgement() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.txt");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let exe = std::env::current_exe().unwrap();
    let status = Command::new("strace")
        .args(["-f", "-qq", "-s", "8", "-e", "signal=none"])
        .args(["-e", "trace=openat,write,fdatasync,fsync,close", "-o"])
        .arg(&trace)
        .arg(exe)
        .args(["--exact", "crash::crash_child_process", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD_ENV, &data)
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
    // fd -> written since its last completed sync
    let mut dirty: BTreeMap<i64, bool> = BTreeMap::new();
    // pid -> the log fd of a sync in progress
    let mut syncing: BTreeMap<&str, i64> = BTreeMap::new();
    let (mut acks, mut syncs) = (0, 0);
    let fd_arg =
        |rest: &str| -> i64 { rest.split([',', ')', ' ']).next().unwrap().parse().unwrap() };
    for line in text.lines() {
        let (pid, call) = line.split_once(' ').unwrap();
        let call = call.trim_start();
        let sync = call
            .strip_prefix("fdatasync(")
            .or_else(|| call.strip_prefix("fsync("));
        if let Some(rest) = call.strip_prefix("openat(") {
            // Audit log files (and the temporary name a new one is written under).
            if rest.contains("/audit-") && !rest.contains("ENOENT") {
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
        } else if let Some(rest) = sync {
            let fd = fd_arg(rest);
            if let Some(d) = dirty.get_mut(&fd) {
                if rest.contains("<unfinished") {
                    syncing.insert(pid, fd);
                } else if rest.contains("= 0") {
                    *d = false;
                    syncs += 1;
                }
            }
        } else if (call.starts_with("<... fdatasync resumed>")
            || call.starts_with("<... fsync resumed>"))
            && call.contains("= 0")
        {
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
