//! # tollgate-mcp: the MCP gateway
//!
//! `tollgate mcp` sits between an MCP host (a desktop assistant, a coding agent, an IDE)
//! and the MCP servers it uses. The host sees one server whose tools are the upstreams'
//! (named `UPSTREAM__TOOL` when there are several, always as hosts accept them: see
//! [`names`]; minus hidden ones); every
//! `tools/call` is first a Tollgate `pre_exec`, in process ([`tollgate_client::Guard`],
//! with an optional local signed audit log) or through `tollgate serve`
//! ([`tollgate_client::DaemonClient`], one session for the gateway's life). Only an ALLOW
//! is forwarded; its result goes back unchanged and settles the call (`post_exec`). A DENY
//! is a tool result with `isError` and a text the model can act on; a HITL asks a human
//! (MCP elicitation in library mode, the daemon's operators in daemon mode).
//!
//! What it does **not** do: decide. Every verdict is the guard's or the daemon's; the
//! gateway never allows a call on its own, and anything it cannot complete (an upstream
//! that crashes, hangs or breaks the protocol; a daemon it cannot reach) is an error
//! result or a DENY, never a hang and never a silent pass. It does not decide resources
//! or prompts (reading them runs no tool); it does not pass an upstream's requests to the
//! host (sampling, elicitation, roots): an upstream cannot ask the host's user anything
//! in Tollgate's name.
//!
//! Layout: [`config`] (mcp.toml), [`lines`] (bounded stdio framing), [`upstream`]
//! (starting and restarting upstreams), [`decider`] (guard or daemon), [`gateway`] (the
//! MCP server), [`values`] (the JSON the gateway reads itself), [`texts`] (what the model
//! and the human read), [`http`] (Streamable HTTP on a loopback address), [`replay`] (the
//! candidate `tollgate policy replay --mcp` replays a library-mode log under).

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod config;
pub mod decider;
pub mod gateway;
pub mod http;
pub mod lines;
pub mod names;
pub mod policy_check;
pub mod replay;
pub mod texts;
pub mod upstream;
pub mod values;

use std::sync::Arc;

use rmcp::ServiceExt;
use tokio::io::{AsyncRead, AsyncWrite};

pub use config::{Config, ConfigError};
pub use gateway::{Core, Gateway};

/// Why the gateway stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The configuration is not usable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The guard, its audit log or the daemon settings could not be set up.
    #[error(transparent)]
    Decider(#[from] decider::DeciderError),
    /// The HTTP listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The host's MCP session ended with an error.
    #[error("host session: {0}")]
    Host(String),
    /// The async runtime could not be started.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

/// `tollgate mcp --config PATH [--check]`, start to end: the process exit code (0: the
/// host hung up, or `--check` found every upstream; 1: `--check` found a problem).
pub fn main_entry(config_path: &std::path::Path, check_only: bool) -> Result<u8, GatewayError> {
    let config = Config::load(config_path)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(GatewayError::Runtime)?;
    let code = rt.block_on(async {
        if check_only {
            let mut out = String::new();
            let ok = check(&config, &mut out).await;
            print!("{out}");
            return Ok(if ok { 0 } else { 1 });
        }
        let shutdown = async {
            use tokio::signal::unix::{signal, SignalKind};
            match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => std::future::pending::<()>().await,
            }
        };
        run(config, tokio::io::stdin(), tokio::io::stdout(), shutdown)
            .await
            .map(|()| 0)
    });
    // Standard input is read by a blocking thread that cannot be interrupted.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// rustls needs one process-wide crypto provider for HTTPS upstreams: ring (the
/// workspace's; no aws-lc-rs).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Serve one host on `read`/`write` (the process's stdin and stdout), and on the
/// configured HTTP address, until the stdio host hangs up (or, when `listen` is set, until
/// `shutdown` completes).
pub async fn run<R, W>(
    config: Config,
    read: R,
    write: W,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), GatewayError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let listen = config.listen;
    let max = config.max_message_bytes;
    let core = Arc::new(Core::new(config)?);
    if !core.config().tools.is_empty() {
        // Per-tool settings are checked against what the upstreams offer before the host
        // is served: a cost that silently matches nothing is a budget that does not apply.
        let catalog = core.catalog().await;
        if let Some((key, message)) = unmatched_settings(&core, &catalog).into_iter().next() {
            return Err(GatewayError::Config(ConfigError::Invalid { key, message }));
        }
    }
    let ct = tokio_util::sync::CancellationToken::new();
    if let Some(addr) = listen {
        let bound = http::serve(core.clone(), addr, ct.clone())
            .await
            .map_err(|source| GatewayError::Listen { addr, source })?;
        tracing::info!("Streamable HTTP: http://{bound}/mcp");
    }
    let transport = lines::LineTransport::host(read, write, max);
    let stdio = async {
        match Gateway(core.clone()).serve(transport).await {
            Ok(running) => running
                .waiting()
                .await
                .map(|_| ())
                .map_err(|e| GatewayError::Host(e.to_string())),
            // A host that hangs up before `initialize` (a host probing the command, or one
            // that gave up) is a host that hung up: exit 0, as after a session.
            Err(
                rmcp::service::ServerInitializeError::ConnectionClosed(_)
                | rmcp::service::ServerInitializeError::ExpectedInitializeRequest(None),
            ) => Ok(()),
            Err(e) => Err(GatewayError::Host(e.to_string())),
        }
    };
    let result = if listen.is_some() {
        // The HTTP endpoint outlives a stdio host that never came or went away.
        let (r, ()) = tokio::join!(stdio, shutdown);
        if let Err(e) = r {
            tracing::info!("stdio: {e}");
        }
        Ok(())
    } else {
        tokio::select! {
            r = stdio => r,
            () = shutdown => Ok(()),
        }
    };
    ct.cancel();
    // Stop the upstreams (killed and reaped) rather than leave them to the process's exit:
    // an orphan's zombie waits for an init that, in a container, may never reap it.
    for u in core.upstreams() {
        u.reset().await;
    }
    result
}

/// The `[tools.UPSTREAM."TOOL"]` keys that name no tool their upstream offers, with why,
/// for the upstreams that could be listed (the others' keys cannot be checked yet).
pub fn unmatched_settings(core: &Core, catalog: &gateway::Catalog) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (upstream, own) in core.config().tools.keys() {
        let Some(i) = core
            .upstreams()
            .iter()
            .position(|u| u.config.name == *upstream)
        else {
            continue;
        };
        let Some(Ok(tools)) = catalog.lists.get(i) else {
            continue;
        };
        if !tools.iter().any(|t| t.name == own.as_str()) {
            let mut offered: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
            offered.truncate(20);
            out.push((
                format!("tools.{upstream}.\"{own}\""),
                format!(
                    "upstream `{upstream}` offers no tool `{own}` (it offers: {}); key settings \
                     by the upstream's own tool name",
                    if offered.is_empty() {
                        "none".to_owned()
                    } else {
                        offered.join(", ")
                    }
                ),
            ));
        }
    }
    out
}

/// `tollgate mcp --check`: check the configuration, start every upstream and list what it
/// offers, one line each, into `out`: each tool's own name, the name the host sees, and
/// its settings. True when every upstream answered and every per-tool setting matches an
/// offered tool. Writes nothing anywhere: no audit log is opened, no daemon is asked.
pub async fn check(config: &Config, out: &mut String) -> bool {
    use std::fmt::Write;
    let mut ok = true;
    let _ = match &config.mode {
        config::Mode::Library(l) => writeln!(
            out,
            "mode: library (budget ${:.4}, max_repeat_calls {}, hitl_mode {}, audit log {}, \
             policy {})",
            l.guard.budget.0 as f64 / 1e9,
            l.guard.max_repeat_calls,
            l.guard.hitl_mode.as_str(),
            l.audit_dir
                .as_ref()
                .map_or("none".into(), |d| d.display().to_string()),
            l.policy.as_ref().map_or("none".into(), |p| format!(
                "{} files, default {}",
                p.files.len(),
                p.default.as_str()
            ))
        ),
        config::Mode::Daemon(d) => writeln!(
            out,
            "mode: daemon (socket {}, organization {}, agent {})",
            d.socket.display(),
            d.organization,
            d.agent_id
        ),
    };
    // The same gateway, minus what writes: a library guard without its audit log (the key
    // is still read and checked); in daemon mode the secret file is read, nothing sent.
    let mut quiet = config.clone();
    if let config::Mode::Library(l) = &mut quiet.mode {
        if let Err(e) = decider::Library::check_settings(l) {
            let _ = writeln!(out, "error: {e}");
            return false;
        }
        l.audit_dir = None;
        l.audit_key = None;
    }
    let core = match Core::new(quiet) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(out, "error: {e}");
            return false;
        }
    };
    let catalog = core.catalog().await;
    for (i, u) in core.upstreams().iter().enumerate() {
        match catalog.lists.get(i) {
            Some(Ok(tools)) => {
                let _ = writeln!(out, "upstream {}: {} tools", u.config.name, tools.len());
                let denied = core.denied_by_policy(i, tools);
                for (t, denied) in tools.iter().zip(denied) {
                    let public = catalog.names.public(i, &t.name).unwrap_or("?");
                    let s = config.tool(&u.config.name, &t.name);
                    let renamed = if public == t.name.as_ref() {
                        String::new()
                    } else {
                        format!("\t(its own name: {})", t.name)
                    };
                    let by_policy = if denied {
                        "\t(refused by the policy set: not listed)"
                    } else {
                        ""
                    };
                    let _ = writeln!(out, "  {public}\tcost ${}{renamed}{by_policy}", s.cost_usd);
                }
                for h in &u.config.hide {
                    let _ = writeln!(out, "  {h} (hidden)");
                }
            }
            Some(Err(e)) => {
                ok = false;
                let _ = writeln!(
                    out,
                    "upstream {}: error: {e} (its [tools.{}.*] settings are not checked)",
                    u.config.name, u.config.name
                );
            }
            None => {}
        }
        u.reset().await;
    }
    for (key, message) in unmatched_settings(&core, &catalog) {
        ok = false;
        let _ = writeln!(out, "error: [{key}]: {message}");
    }
    ok
}
