//! `tollgate serve [--config FILE]`: run the daemon.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tollgate_daemon::{Daemon, DaemonConfig};

/// Arguments of `tollgate serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A TOML configuration file. Without one the daemon runs on embedded defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override the data directory.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Override the socket path.
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

/// Run until SIGTERM or SIGINT, then shut down gracefully.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut config = match &args.config {
        Some(path) => DaemonConfig::load(path)?,
        None => DaemonConfig::default(),
    };
    if let Some(d) = &args.data_dir {
        config.data_dir = d.clone();
    }
    if let Some(s) = &args.socket {
        config.socket = Some(s.clone());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let daemon = Daemon::start(config).await?;
        print_banner(&daemon, args.config.is_none());
        daemon.run(shutdown_signal()).await
    })?;
    Ok(ExitCode::SUCCESS)
}

fn print_banner(d: &Daemon, embedded: bool) {
    let c = d.config();
    let g = &c.default_guard;
    println!(
        "tollgate {} listening on {}",
        env!("CARGO_PKG_VERSION"),
        d.socket().display()
    );
    println!(
        "  configuration: {}",
        if embedded {
            "embedded defaults"
        } else {
            "from file"
        }
    );
    println!("  data directory: {}", c.data_dir.display());
    for o in &c.organizations {
        let src = if o.secret.is_some() {
            "from configuration".to_owned()
        } else {
            format!(
                "{}",
                c.data_dir
                    .join("secrets")
                    .join(format!("{}.secret", o.id))
                    .display()
            )
        };
        println!("  organization `{}`: secret {src}", o.id);
    }
    println!(
        "  default guard: budget ${} ({}), max_repeat_calls {}, hitl_mode {}, settlement {:?}",
        g.budget,
        g.budget_scope.as_str(),
        g.max_repeat_calls,
        g.hitl_mode,
        g.settlement
    );
    let l = &c.limits;
    println!(
        "  limits: {} pre_exec/s per session, {} registrations/s per peer, {} sessions, {} connections, heartbeat {:?} x{}",
        l.pre_exec_per_second_per_session,
        l.registrations_per_second_per_peer,
        l.max_sessions,
        l.max_connections,
        l.heartbeat_interval,
        l.missed_heartbeats_for_stale
    );
    println!(
        "  audit: fsync {}, log {}",
        c.audit.fsync,
        c.audit
            .dir
            .clone()
            .unwrap_or_else(|| c.data_dir.join("audit"))
            .display()
    );
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutdown requested");
}
