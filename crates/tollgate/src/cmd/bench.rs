//! `tollgate bench`: the load generator. N sessions, C concurrent clients, for a duration;
//! reports throughput and p50/p99/p99.9 of pre_exec round trips. Without `--socket` it
//! starts its own daemon in a temporary directory (audit fsync per batch, every verdict
//! signed and durable before it is answered).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::json::{Number, Value};
use tollgate_core::Money;
use tollgate_daemon::config::Organization;
use tollgate_daemon::{Daemon, DaemonConfig};

/// Arguments of `tollgate bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sessions (one client connection each).
    #[arg(long, default_value_t = 64)]
    pub sessions: usize,
    /// Requests in flight at once across all sessions (at most one per session).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// An external daemon's socket (default: start one in a temporary directory).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// With --socket: the organization.
    #[arg(long, default_value = "default")]
    pub org: String,
    /// With --socket: the organization's secret file.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// For the daemon the bench starts: fsync policy of the audit log (the one durable
    /// write of a verdict)
    /// (`batch`: every verdict durable before its reply; `never`: written, not synced).
    #[arg(long, default_value = "batch", value_parser = ["batch", "never"])]
    pub fsync: String,
    /// The agent id to register as.
    #[arg(long, default_value = "bench-agent")]
    pub agent: String,
}

const SECRET: &[u8] = b"bench organization secret, not for production";

/// Run the load.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.sessions > 0 && args.concurrency > 0,
        "sessions and concurrency must be positive"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(load(args))?;
    Ok(ExitCode::SUCCESS)
}

async fn load(args: &Args) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("tollgate-bench-")
        .tempdir()?;
    let mut server = None;
    let (socket, org, secret) = match &args.socket {
        Some(s) => {
            let path = args
                .secret_file
                .clone()
                .context("--socket needs --secret-file")?;
            let secret = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            (
                s.clone(),
                args.org.clone(),
                secret.trim().as_bytes().to_vec(),
            )
        }
        None => {
            let mut config = DaemonConfig {
                data_dir: dir.path().to_owned(),
                organizations: vec![Organization {
                    id: "bench".into(),
                    secret: Some(SECRET.to_vec()),
                    operator_secret: None,
                }],
                ..DaemonConfig::default()
            };
            config.audit.fsync = args.fsync.clone();
            config.limits.pre_exec_per_second_per_session = 1_000_000;
            config.limits.registrations_per_second_per_peer = 1_000_000;
            let mut guard = config.default_guard.clone();
            guard.budget = Money::ZERO; // unlimited: measure the path, not the policy
            guard.max_repeat_calls = 3;
            config.agent_guards.insert(args.agent.clone(), guard);
            let daemon = Daemon::start(config).await?;
            let socket = daemon.socket().to_owned();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let handle = tokio::spawn(daemon.run(async {
                let _ = rx.await;
            }));
            server = Some((tx, handle));
            (socket, "bench".to_owned(), SECRET.to_vec())
        }
    };

    let mut clients = Vec::new();
    for _ in 0..args.sessions {
        let cfg = ClientConfig::new(&socket, &org, &secret, &args.agent);
        clients.push(Arc::new(
            DaemonClient::connect(cfg)
                .await
                .context("registering a session")?,
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(args.duration);
    let workers = args.concurrency.min(args.sessions);
    let mut tasks = Vec::new();
    for w in 0..workers {
        let mine: Vec<Arc<DaemonClient>> =
            clients.iter().skip(w).step_by(workers).cloned().collect();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 16);
            let mut denied = 0u64;
            let mut i: i64 = 0;
            while Instant::now() < deadline {
                for c in &mine {
                    i += 1;
                    let params = Value::Object(
                        [("i".to_owned(), Value::Number(Number::Int(i128::from(i))))]
                            .into_iter()
                            .collect(),
                    );
                    let t = Instant::now();
                    let v = c.pre_exec("search", &params, 0.0).await;
                    lat.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
                    if !v.allowed() {
                        denied += 1;
                    }
                }
            }
            (lat, denied)
        }));
    }
    let started = Instant::now();
    let mut all = Vec::new();
    let mut denied = 0;
    for t in tasks {
        let (lat, d) = t.await?;
        all.extend(lat);
        denied += d;
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| -> u32 {
        if all.is_empty() {
            return 0;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let idx = ((all.len() as f64 - 1.0) * p).round() as usize;
        all.get(idx).copied().unwrap_or(0)
    };
    #[allow(clippy::cast_precision_loss)]
    let rate = all.len() as f64 / elapsed;
    println!(
        "sessions {}  concurrency {}  duration {:.1}s  requests {}  denied {}",
        args.sessions,
        workers,
        elapsed,
        all.len(),
        denied
    );
    let how = if args.socket.is_some() {
        "as the external daemon is configured"
    } else if args.fsync == "batch" {
        "each verdict signed, audited and fsync'd before the reply"
    } else {
        "each verdict signed and audited; no fsync"
    };
    println!("throughput {rate:.0} pre_exec/s ({how})");
    println!(
        "latency us: p50 {}  p99 {}  p99.9 {}  max {}",
        pct(0.50),
        pct(0.99),
        pct(0.999),
        all.last().copied().unwrap_or(0)
    );
    drop(clients);
    if let Some((tx, handle)) = server {
        let _ = tx.send(());
        handle.await??;
    }
    Ok(())
}
