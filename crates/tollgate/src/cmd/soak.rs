//! `tollgate soak`: the session-churn soak benchmark (issue 17 §4). It starts `tollgate
//! serve` in its own process (this binary, a generated configuration in a temporary
//! directory), then opens `--sessions` sessions over time, keeping up to `--live` of them
//! open and never more: each session registers and makes `--calls` pre_exec calls, then
//! stays open until the pool is full and it is the oldest, when it is ended to make room:
//! closed by its agent (`CloseSession`), or, one in `--abandon`, left silent for the
//! daemon's idle sweep to end (`--idle-secs`; its place is held until then). Every `--every` sessions it prints one row: sessions opened so far, the rate,
//! the sessions live then (opened and not yet closed or idle-ended, as the load generator
//! counts them: never above `--live`),
//! the daemon's resident memory (`VmRSS` of its process), the snapshot file's size
//! (`state.redb`) and the audit log's. Memory and snapshot size should stay flat, bounded
//! by the live sessions, while the audit log (the record of every session) grows.
//!
//! What it does not do: check verdicts (a DENY is counted, not an error), or time
//! anything but the rows' rates.

use std::collections::VecDeque;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::json::Value;

use super::bench::Serve;

const ORG: &str = "soak";

/// Arguments of `tollgate soak`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sessions to open in all.
    #[arg(long, default_value_t = 1_000_000)]
    sessions: u64,
    /// Live sessions at most at any time (also the daemon's `max_sessions`).
    #[arg(long, default_value_t = 1_000)]
    live: usize,
    /// Sessions being driven at once (registering, calling, closing).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// pre_exec calls per session.
    #[arg(long, default_value_t = 1)]
    calls: u32,
    /// One session in this many is abandoned (left to the idle sweep); 0: none.
    #[arg(long, default_value_t = 20)]
    abandon: u64,
    /// The daemon's `session_idle_timeout_secs` (above the time a session waits in the
    /// pool, or the daemon ends pooled sessions too: their closes then fail).
    #[arg(long, default_value_t = 30)]
    idle_secs: u64,
    /// Print a row every this many sessions.
    #[arg(long, default_value_t = 20_000)]
    every: u64,
    /// Stop after this many seconds even if not every session was opened (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_secs: u64,
    /// Keep the temporary directory (its path is printed).
    #[arg(long)]
    keep: bool,
}

/// Run the soak.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.live >= args.concurrency,
        "--live must be at least --concurrency"
    );
    let dir = tempfile::Builder::new()
        .prefix("tollgate-soak-")
        .tempdir()
        .context("creating a temporary directory")?;
    let root = dir.path().to_owned();
    let secret = tollgate_daemon::org_secret(&root, ORG)?;
    let config = root.join("soak.toml");
    std::fs::write(
        &config,
        format!(
            "# Written by `tollgate soak`.\n\
             [limits]\n\
             pre_exec_per_second_per_session = 1000000\n\
             registrations_per_second_per_peer = 1000000\n\
             max_sessions = {live}\n\
             max_connections = {conns}\n\
             session_idle_timeout_secs = {idle}\n\
             \n\
             [audit]\n\
             fsync = \"batch\"\n\
             \n\
             [[organization]]\n\
             id = \"{ORG}\"\n\
             secret_file = \"secrets/{ORG}.secret\"\n\
             max_sessions = {live}\n\
             \n\
             [guard.default]\n\
             budget_usd = 1000000.0\n\
             max_repeat_calls = 0\n",
            live = args.live,
            conns = args.live.saturating_mul(2).saturating_add(512),
            idle = args.idle_secs,
        ),
    )
    .with_context(|| format!("writing {}", config.display()))?;
    let data = root.join("data");
    let socket = data.join("tollgate.sock");
    let log = root.join("serve.log");
    let mut serve = Serve::start(&config, &data, &log, Some("warn"))?;
    let outcome = (|| {
        serve.wait_listening(&socket)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the runtime")?;
        rt.block_on(drive(args, &socket, &secret, serve.id(), &data))
    })();
    let stopped = serve.stop();
    if args.keep {
        outln!("kept {}", dir.keep().display());
    }
    outcome?;
    stopped?;
    Ok(ExitCode::SUCCESS)
}

/// The daemon's resident set, in KiB (`VmRSS` of /proc/PID/status).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn size_of(path: &Path) -> u64 {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|d| d.flatten().map(|e| size_of(&e.path())).sum())
            .unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

async fn drive(
    args: &Args,
    socket: &Path,
    secret: &[u8],
    pid: u32,
    data: &Path,
) -> anyhow::Result<()> {
    let live = Arc::new(tokio::sync::Semaphore::new(args.live));
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let failures = Failures {
        failed: Arc::new(AtomicU64::new(0)),
        first: Arc::default(),
    };
    let pool: Arc<Mutex<VecDeque<Open>>> = Arc::default();
    let started = Instant::now();
    let deadline = (args.max_secs > 0).then(|| started + Duration::from_secs(args.max_secs));
    outln!(
        "soak: {} sessions, at most {} live, {} at once, {} call(s) each, 1 in {} left to the idle sweep ({} s)",
        args.sessions, args.live, args.concurrency, args.calls, args.abandon, args.idle_secs
    );
    outln!(
        "{:>10} {:>10} {:>9} {:>12} {:>14} {:>14}",
        "sessions",
        "per_sec",
        "live",
        "rss_kib",
        "snapshot_bytes",
        "audit_bytes"
    );
    let row = |n: u64, at: Instant, since: u64| {
        let secs = at.elapsed().as_secs_f64().max(1e-9);
        #[allow(clippy::cast_precision_loss)]
        let rate = (n - since) as f64 / secs;
        outln!(
            "{:>10} {:>10.0} {:>9} {:>12} {:>14} {:>14}",
            n,
            rate,
            args.live.saturating_sub(live.available_permits()),
            rss_kib(pid),
            size_of(&data.join("state.redb")),
            size_of(&data.join("audit")),
        );
    };
    row(0, Instant::now(), 0);
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (pool, live, next, done, denied, fail) = (
            pool.clone(),
            live.clone(),
            next.clone(),
            done.clone(),
            denied.clone(),
            failures.clone(),
        );
        let mut cfg = ClientConfig::new(socket, ORG, secret, "soak-agent");
        cfg.timeout = Duration::from_secs(10);
        let (total, calls, abandon, idle) =
            (args.sessions, args.calls, args.abandon, args.idle_secs);
        workers.push(tokio::spawn(async move {
            loop {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return;
                }
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    return;
                }
                // A place among the live sessions: a free one, or the oldest's.
                let permit = loop {
                    if let Ok(p) = live.clone().try_acquire_owned() {
                        break p;
                    }
                    let oldest = pool
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .pop_front();
                    match oldest {
                        Some(old) => retire(old, idle, &fail).await,
                        None => match live.clone().acquire_owned().await {
                            Ok(p) => break p,
                            Err(_) => return,
                        },
                    }
                };
                let mut cfg = cfg.clone();
                cfg.agent_id = format!("soak-{}", n % 64);
                let client = match DaemonClient::connect(cfg).await {
                    Ok(c) => c,
                    Err(e) => {
                        fail.note(format!("register: {e}"));
                        continue;
                    }
                };
                for c in 0..calls {
                    let p = Value::Object([("n".to_owned(), Value::from(i64::from(c)))].into());
                    if !client.pre_exec("soak", &p, 0.0).await.allowed() {
                        denied.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let abandoned = abandon > 0 && n % abandon == abandon - 1;
                pool.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push_back(Open {
                        client,
                        permit,
                        abandoned,
                    });
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut last_row = 0u64;
    let mut at = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let n = done.load(Ordering::Relaxed);
        if n >= last_row + args.every {
            row(n, at, last_row);
            last_row = n;
            at = Instant::now();
        }
        if workers.iter().all(tokio::task::JoinHandle::is_finished) {
            break;
        }
    }
    for w in workers {
        w.await.context("a soak worker")?;
    }
    let n = done.load(Ordering::Relaxed);
    if n > last_row {
        row(n, at, last_row);
    }
    // End what is still open the same way.
    loop {
        let oldest = pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        let Some(old) = oldest else { break };
        retire(old, args.idle_secs, &failures).await;
    }
    // The abandoned ones end by the idle sweep: wait for it, then the last row.
    tokio::time::sleep(Duration::from_secs(args.idle_secs + 3)).await;
    row(n, Instant::now(), n);
    outln!(
        "soak: {n} sessions in {:.1} s; {} calls denied, {} requests failed",
        started.elapsed().as_secs_f64(),
        denied.load(Ordering::Relaxed),
        failures.failed.load(Ordering::Relaxed)
    );
    if let Some(e) = failures
        .first
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
    {
        outln!("soak: the first failure: {e}");
    }
    Ok(())
}

/// An open session of the pool, holding its place among the live ones.
struct Open {
    client: DaemonClient,
    permit: tokio::sync::OwnedSemaphorePermit,
    abandoned: bool,
}

/// Failures counted, the first one kept.
#[derive(Clone)]
struct Failures {
    failed: Arc<AtomicU64>,
    first: Arc<Mutex<Option<String>>>,
}

impl Failures {
    fn note(&self, e: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.first
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(e);
    }
}

/// End an open session: closed by its agent (its place is free at once), or abandoned
/// (its place is held until the daemon's idle sweep has ended it).
async fn retire(open: Open, idle_secs: u64, fail: &Failures) {
    let Open {
        client,
        permit,
        abandoned,
    } = open;
    if abandoned {
        drop(client);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(idle_secs + 2)).await;
            drop(permit);
        });
    } else {
        if let Err(e) = client.close().await {
            fail.note(format!("close: {e}"));
        }
        drop(permit);
    }
}
