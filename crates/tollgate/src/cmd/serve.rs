//! `tollgate serve [--config FILE]`: run the daemon.

use std::path::{Path, PathBuf};
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
        // The handlers are installed before the socket exists: a SIGTERM sent as soon as
        // the socket answers is a clean shutdown, not the default action.
        let shutdown = shutdown_signal()?;
        let daemon = Daemon::start(config).await?;
        print_banner(&daemon, args.config.as_deref());
        daemon.run(shutdown).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Where a generated secret lives: the file name `Daemon::start` gives it
/// (`tollgate_daemon::org_secret`): `<data_dir>/secrets/<name>.secret`.
fn generated_secret(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join("secrets").join(format!("{name}.secret"))
}

/// One line of the banner on standard output. The daemon goes on serving when nobody
/// reads it (a closed pipe is not a reason to stop deciding).
macro_rules! banner {
    ($($arg:tt)*) => {{
        let _ = $crate::out::stdout_lossy(format_args!("{}\n", format_args!($($arg)*)));
    }};
}

/// Print where everything is and the settings in force: never a secret's value, only
/// where it is kept.
fn print_banner(d: &Daemon, config_file: Option<&Path>) {
    let c = d.config();
    let g = &c.default_guard;
    banner!(
        "tollgate {} listening on {}",
        env!("CARGO_PKG_VERSION"),
        d.socket().display()
    );
    let configured = match config_file {
        Some(f) => format!("in the configuration file {}", f.display()),
        None => "in the configuration".to_owned(),
    };
    match config_file {
        Some(f) => banner!("  configuration: {}", f.display()),
        None => banner!("  configuration: embedded defaults"),
    }
    banner!("  data directory: {}", c.data_dir.display());
    if let Some(addr) = d.grpc_addr() {
        banner!("  gRPC (mutual TLS): {addr}");
    }
    for o in &c.organizations {
        let place = |given: bool, name: String| {
            if given {
                configured.clone()
            } else {
                generated_secret(&c.data_dir, &name).display().to_string()
            }
        };
        banner!("  organization `{}`:", o.id);
        banner!(
            "    agents' secret: {}",
            place(o.secret.is_some(), o.id.clone())
        );
        banner!(
            "    operator secret: {}",
            place(o.operator_secret.is_some(), format!("{}.operator", o.id))
        );
    }
    banner!(
        "  default guard: budget ${} ({}), max_repeat_calls {}, hitl_mode {}, settlement {:?}",
        g.budget,
        g.budget_scope.as_str(),
        g.max_repeat_calls,
        g.hitl_mode,
        g.settlement
    );
    let l = &c.limits;
    banner!(
        "  limits: {} pre_exec/s per session, {} registrations/s per peer, {} sessions, {} connections, heartbeat {:?} x{}",
        l.pre_exec_per_second_per_session,
        l.registrations_per_second_per_peer,
        l.max_sessions,
        l.max_connections,
        l.heartbeat_interval,
        l.missed_heartbeats_for_stale
    );
    banner!(
        "  timeouts: sign-in {:?}, idle {:?} between frames, {:?} per frame from its first byte; {} bad frames close a connection",
        l.auth_timeout,
        l.idle_timeout,
        l.frame_timeout,
        l.max_bad_frames
    );
    banner!("  descriptors: {}", d.descriptors().describe());
    match d.control_addr() {
        Some(addr) => banner!(
            "  control plane: {}://{addr}/ (console, /v1/control, /metrics), {} operator(s)",
            if d.control_tls() { "https" } else { "http" },
            c.operators.len()
        ),
        None => banner!("  control plane: off (no [control] section)"),
    }
    if let tollgate_daemon::config::StateBackend::Redis(r) = &c.state.backend {
        banner!(
            "  state: redis {} (key prefix `{}`, durability {:?})",
            tollgate_daemon::config::redact_url(&r.url),
            r.key_prefix,
            r.durability
        );
    }
    for w in d.warnings() {
        banner!("  WARNING: {w}");
    }
    // The audit line is the banner's last.
    match (&c.audit.sink, d.chain_id()) {
        (tollgate_daemon::config::AuditSink::Postgres(p), Some(chain)) => banner!(
            "  audit: postgres {} (schema `{}`), chain `{chain}`",
            tollgate_daemon::config::redact_url(&p.url),
            p.schema
        ),
        _ => banner!(
            "  audit: fsync {}, log {}",
            c.audit.fsync,
            c.audit
                .dir
                .clone()
                .unwrap_or_else(|| c.data_dir.join("audit"))
                .display()
        ),
    }
}

/// Install the SIGTERM and SIGINT handlers now; the future resolves on either.
pub fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutdown requested");
    })
}
