//! The daemon, tested as agents use it: a real daemon on a temporary Unix socket, real
//! clients, a real store and audit log in a temporary directory.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_debug_implementations
)]

mod bounds;
mod console;
mod control;
mod ending;
mod flows;
mod grpc;
mod hitl;
mod hostile;
mod identity;
mod lifecycle;
mod policy;
mod recorded;
mod settlement;
mod shadow;

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::Money;
use tollgate_daemon::config::Organization;
use tollgate_daemon::{Daemon, DaemonConfig};

pub const ORG: &str = "acme";
pub const SECRET: &[u8] = b"a test organization secret of some length";
pub const OPERATOR_SECRET: &[u8] = b"the operators' own secret, not the agents'";

/// A daemon running in this process.
pub struct Running {
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// The control plane's address, when configured.
    pub control: Option<std::net::SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), tollgate_daemon::DaemonError>>>,
}

impl Running {
    /// Stop gracefully and wait.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }
}

/// A configuration in `dir`: org `acme`, agent `research-bot` with budget 0.50 and repeat
/// limit 3 (Appendix A), agent `reviewed` with HITL always.
pub fn config(dir: &Path) -> DaemonConfig {
    let mut c = DaemonConfig {
        data_dir: dir.to_owned(),
        organizations: vec![Organization {
            id: ORG.into(),
            secret: Some(SECRET.to_vec()),
            operator_secret: Some(OPERATOR_SECRET.to_vec()),
        }],
        ..DaemonConfig::default()
    };
    let mut g = c.default_guard.clone();
    g.budget = Money::from_usd(0.50).unwrap();
    g.max_repeat_calls = 3;
    c.agent_guards.insert("research-bot".into(), g.clone());
    let mut reviewed = g;
    reviewed.budget = Money::from_usd(10.0).unwrap();
    reviewed.hitl_mode = tollgate_core::HitlMode::Always;
    c.agent_guards.insert("reviewed".into(), reviewed);
    c
}

pub async fn start(config: DaemonConfig) -> Running {
    run(Daemon::start(config).await.unwrap())
}

/// Run a started daemon in this process.
pub fn run(daemon: Daemon) -> Running {
    let dir = daemon.config().data_dir.clone();
    let socket = daemon.socket().to_owned();
    let control = daemon.control_addr();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(daemon.run(async {
        let _ = rx.await;
    }));
    Running {
        dir,
        socket,
        control,
        stop: Some(tx),
        task: Some(task),
    }
}

pub fn client_config(socket: &Path, agent: &str) -> ClientConfig {
    let mut c = ClientConfig::new(socket, ORG, SECRET, agent);
    c.timeout = Duration::from_secs(5);
    c
}

/// An operator's connection (sealed with the operator secret; no session).
pub async fn operator(socket: &Path) -> DaemonClient {
    let mut c = ClientConfig::new(socket, ORG, OPERATOR_SECRET, "operator");
    c.timeout = Duration::from_secs(5);
    DaemonClient::operator(c).await.unwrap()
}

pub async fn connect(socket: &Path, agent: &str) -> DaemonClient {
    DaemonClient::connect(client_config(socket, agent))
        .await
        .unwrap()
}

/// The verdict entries in the daemon's audit log, verified with its public key.
pub fn audited(dir: &Path) -> Vec<tollgate_audit::VerdictRecord> {
    session_events(dir)
        .into_iter()
        .filter_map(|e| match e {
            tollgate_audit::SessionEvent::Verdict(v) => Some(v),
            _ => None,
        })
        .collect()
}

/// Every session entry in the daemon's audit log, verified with its public key.
pub fn session_events(dir: &Path) -> Vec<tollgate_audit::SessionEvent> {
    let public = std::fs::read_to_string(dir.join("audit.pub")).unwrap();
    let key = tollgate_audit::keys::parse_public_key(&public).unwrap();
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(key),
        ..Default::default()
    };
    let mut out = Vec::new();
    tollgate_audit::verify_paths(&[dir.join("audit")], &opts, &mut |e| {
        if let tollgate_audit::Event::Session(ev) = &e.event {
            out.push(ev.clone());
        }
    })
    .unwrap();
    out
}

/// The agent of every session opening in the daemon's audit log, in order.
pub fn opened_agents(dir: &Path) -> Vec<String> {
    session_events(dir)
        .into_iter()
        .filter_map(|e| match e {
            tollgate_audit::SessionEvent::Opened(s) => Some(s.agent_id),
            _ => None,
        })
        .collect()
}
