//! `tollgate demo`: start a daemon on a temporary socket, run SP/1.0 Appendix A through the
//! client, print each exchange, then verify the audit log with the public key alone.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::{json, Money};
use tollgate_daemon::config::Organization;
use tollgate_daemon::{Daemon, DaemonConfig};

/// Arguments of `tollgate demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Keep the temporary data directory (and print where it is).
    #[arg(long)]
    pub keep: bool,
}

const SECRET: &[u8] = b"demo organization secret, not for production";

/// Run the demo.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let dir = tempfile::Builder::new()
        .prefix("tollgate-demo-")
        .tempdir()?;
    let data = dir.path().to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let ok = rt.block_on(flow(data.clone()))?;
    if args.keep {
        let kept = dir.keep();
        outln!("data directory kept at {}", kept.display());
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn line(dir: &str, text: impl std::fmt::Display) {
    outln!("{dir} {text}");
}

async fn flow(data: std::path::PathBuf) -> anyhow::Result<bool> {
    let mut config = DaemonConfig {
        data_dir: data.clone(),
        organizations: vec![Organization {
            id: "acme".into(),
            secret: Some(SECRET.to_vec()),
            operator_secret: None,
        }],
        ..DaemonConfig::default()
    };
    let mut guard = config.default_guard.clone();
    guard.budget = Money::from_usd(0.50)?;
    guard.max_repeat_calls = 3;
    config.agent_guards.insert("research-bot".into(), guard);

    let daemon = Daemon::start(config).await?;
    let socket = daemon.socket().to_owned();
    outln!("daemon listening on {}", socket.display());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(daemon.run(async {
        let _ = stop_rx.await;
    }));

    let mut cfg = ClientConfig::new(&socket, "acme", SECRET, "research-bot");
    cfg.framework = "crewai".into();
    line(
        "1.  agent  -> daemon:",
        "REGISTER(agent_id=\"research-bot\", framework=\"crewai\")",
    );
    let client = Arc::new(DaemonClient::connect(cfg).await.context("registering")?);
    let reg = client.registration();
    let ac = reg.active_config.clone().unwrap_or_default();
    line(
        "2.  daemon -> agent: ",
        format!(
            "REGISTER_RESPONSE(session_id=\"{}\", config={{budget:{}, max_repeat:{}}}, protocol={})",
            reg.session_id, Money(ac.budget_nanos), ac.max_repeat_calls, reg.negotiated_protocol
        ),
    );

    let params = json::parse_str(r#"{"query":"circuit breakers for AI agents"}"#)?;
    let hash = tollgate_core::Params::json(&params)
        .canonical_digest()
        .map(|d| d.to_string())
        .unwrap_or_default();
    let short = hash.get(..8).unwrap_or("");
    let mut step = 3;
    let mut all_as_written = true;
    for n in 1..=4u64 {
        line(
            &format!("{step:<3} agent  -> daemon:"),
            format!("PRE_EXEC(call={n}, tool=\"web_search\", hash=0x{short}…, cost=0.002)"),
        );
        let v = client.pre_exec("web_search", &params, 0.002).await;
        let r = v.response.clone().unwrap_or_default();
        line(
            &format!("{:<3} daemon -> agent: ", step + 1),
            format!(
                "PRE_EXEC_RESPONSE(verdict={}, reason={}, budget_remaining={}, repeat_count={})",
                v.verdict,
                v.reason,
                Money(r.budget_remaining_nanos),
                r.repeat_count
            ),
        );
        let want_allow = n < 4;
        all_as_written &= v.allowed() == want_allow;
        if v.allowed() {
            line("    agent:", "[executes web_search]");
            client.post_exec(v.call_number, 0.0015, true, "").await?;
            line(
                "    agent  -> daemon:",
                format!("POST_EXEC(call={n}, actual_cost=0.0015, success=true)"),
            );
        }
        step += 2;
    }
    let state = client.session_state().await?;
    line(
        "    daemon:",
        format!(
            "[audit entry written; circuit tripped = {} ({})]",
            state.circuit_tripped, state.circuit_trip_reason
        ),
    );
    let v = client
        .pre_exec(
            "read_file",
            &json::parse_str(r#"{"path":"notes.txt"}"#)?,
            0.0,
        )
        .await;
    line(
        "    after:",
        format!("any further call -> {} {}", v.verdict, v.reason),
    );
    all_as_written &= v.reason == "circuit_open";

    let _ = stop_tx.send(());
    server.await.context("daemon task")??;

    // Verify the audit log with the public key alone.
    let public = std::fs::read_to_string(data.join("audit.pub"))?;
    let key = tollgate_audit::keys::parse_public_key(&public)?;
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(key),
        ..Default::default()
    };
    let mut verdicts = Vec::new();
    let (mut opened, mut settled) = (0, Vec::new());
    let summary = tollgate_audit::verify_paths(&[data.join("audit")], &opts, &mut |e| {
        use tollgate_audit::SessionEvent;
        match &e.event {
            tollgate_audit::Event::Session(SessionEvent::Verdict(v)) => {
                verdicts.push(format!("{} {} {}", v.call_number, v.verdict, v.reason));
            }
            tollgate_audit::Event::Session(SessionEvent::Opened(_)) => opened += 1,
            tollgate_audit::Event::Session(SessionEvent::Settled(s)) => {
                settled.push(format!("{} charged {}", s.call_number, s.charged));
            }
            _ => {}
        }
    })
    .map_err(|e| anyhow::anyhow!("audit log verification failed: {e}"))?;
    outln!(
        "audit log verified with the public key: {} entries: {opened} session opened, {} verdicts [{}], {} settlements [{}]",
        summary.entries,
        verdicts.len(),
        verdicts.join("; "),
        settled.len(),
        settled.join("; ")
    );
    outln!(
        "{}",
        if all_as_written {
            "Appendix A flow: as written"
        } else {
            "Appendix A flow: DIFFERS"
        }
    );
    Ok(all_as_written)
}
