//! Added latency per `tools/call`: p50 and p99 of one call's round trip as the host sees
//! it, against calling the same upstream directly.
//!
//! `cargo bench -p tollgate-mcp --bench latency` (`TOLLGATE_MCP_BENCH_CALLS=N` calls per
//! row, default 2000, after N/10 untimed). Rows:
//! - direct: rmcp's client → the testkit upstream (a child process on stdio);
//! - library: client → `tollgate mcp` (library mode, no audit log) → the same upstream;
//! - library + audit: the same with the local signed audit log (each verdict and each
//!   settlement durable before the call goes on);
//! - daemon: client → gateway → a daemon (`tollgate_daemon`, as `tollgate serve` runs it,
//!   in its own process: this bench binary re-run as a child; a temporary socket, audit
//!   fsync per batch) → upstream.
//!
//! Every call is `add` with new arguments (`{"a": i, "b": 1}`), so no repeat rule applies;
//! the guards have no budget and no repeat limit, so every call is allowed and forwarded.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_debug_implementations
)]

use std::path::Path;
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};

const TESTKIT: &str = env!("CARGO_BIN_EXE_tollgate-mcp-testkit");

async fn connect(args: &[&str]) -> (RunningService<RoleClient, ()>, tokio::process::Child) {
    let mut child = tokio::process::Command::new(TESTKIT)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let inp = child.stdin.take().unwrap();
    let client = ().serve((out, inp)).await.unwrap();
    (client, child)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn measure(name: &str, args: &[&str], calls: usize) -> (Duration, Duration) {
    let (client, _child) = connect(args).await;
    let warm = calls / 10;
    let mut times = Vec::with_capacity(calls);
    for i in 0..(warm + calls) {
        let mut p = CallToolRequestParams::new("add");
        p.arguments = serde_json::json!({"a": i, "b": 1}).as_object().cloned();
        let t = Instant::now();
        let r = client.call_tool(p).await.unwrap();
        let took = t.elapsed();
        assert_eq!(r.is_error, Some(false), "{name}: {r:?}");
        if i >= warm {
            times.push(took);
        }
    }
    times.sort();
    let (p50, p99) = (percentile(&times, 0.50), percentile(&times, 0.99));
    println!(
        "{name:<18} {calls:>6} calls   p50 {:>7.1} µs   p99 {:>7.1} µs",
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
    let _ = client.cancel().await;
    (p50, p99)
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_owned()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Some(data) = std::env::var_os(DAEMON_ENV) {
        return run_daemon(data.into()).await;
    }
    let calls: usize = std::env::var("TOLLGATE_MCP_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    let upstream =
        format!("[[upstream]]\nname = \"kit\"\ncommand = \"{TESTKIT}\"\nargs = [\"upstream\"]\n");
    let unlimited = "[guard]\nbudget_usd = 0.0\nmax_repeat_calls = 0\n";
    let library = write(
        dir.path(),
        "library.toml",
        &format!("{unlimited}{upstream}"),
    );
    let key = tollgate_audit::keys::generate().unwrap();
    std::fs::write(
        dir.path().join("audit.key"),
        tollgate_audit::keys::secret_key_text(&key),
    )
    .unwrap();
    let audited = write(
        dir.path(),
        "audited.toml",
        &format!(
            "{unlimited}[library]\naudit_dir = \"audit\"\naudit_key = \"audit.key\"\n{upstream}"
        ),
    );

    // The daemon, in its own process (this binary, re-run), as users run it.
    let data = dir.path().join("daemon");
    let secret = DAEMON_SECRET;
    let mut daemon = std::process::Command::new(std::env::current_exe().unwrap())
        .env(DAEMON_ENV, &data)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(daemon.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let socket = std::path::PathBuf::from(line.trim());
    std::fs::write(dir.path().join("agents.secret"), secret).unwrap();
    let daemon_cfg = write(
        dir.path(),
        "daemon.toml",
        &format!(
            "[gateway]\nmode = \"daemon\"\n[daemon]\nsocket = {socket:?}\n\
             secret_file = \"agents.secret\"\norganization = \"bench\"\n{upstream}"
        ),
    );

    println!("tools/call round trips, as the host sees them ({calls} calls per row)");
    let (d50, d99) = measure("direct", &["upstream"], calls).await;
    for (name, cfg) in [
        ("library", &library),
        ("library + audit", &audited),
        ("daemon", &daemon_cfg),
    ] {
        let (p50, p99) = measure(name, &["gateway", cfg], calls).await;
        println!(
            "{:<18} added       p50 {:>7.1} µs   p99 {:>7.1} µs",
            "",
            (p50.as_secs_f64() - d50.as_secs_f64()) * 1e6,
            (p99.as_secs_f64() - d99.as_secs_f64()) * 1e6
        );
    }
    drop(daemon.stdin.take());
    assert!(daemon.wait().unwrap().success());
}

/// Set (to the data directory) in the child that runs the daemon.
const DAEMON_ENV: &str = "TOLLGATE_MCP_BENCH_DAEMON";
const DAEMON_SECRET: &[u8] = b"the bench organization's agents' secret";

/// The child: run the daemon until the parent closes our stdin; print its socket first.
async fn run_daemon(data: std::path::PathBuf) {
    let mut config = tollgate_daemon::DaemonConfig {
        data_dir: data,
        organizations: vec![tollgate_daemon::config::Organization {
            id: "bench".into(),
            secret: Some(DAEMON_SECRET.to_vec()),
            operator_secret: None,
        }],
        ..tollgate_daemon::DaemonConfig::default()
    };
    config.limits.pre_exec_per_second_per_session = 1_000_000;
    let mut g = config.default_guard.clone();
    g.budget = tollgate_core::Money::ZERO;
    g.max_repeat_calls = 0;
    config.agent_guards.insert("mcp-gateway".into(), g);
    let daemon = tollgate_daemon::Daemon::start(config).await.unwrap();
    println!("{}", daemon.socket().display());
    daemon
        .run(async {
            let mut sink = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
        })
        .await
        .unwrap();
}
