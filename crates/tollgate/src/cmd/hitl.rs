//! `tollgate hitl list|decide`: resolve pending human decisions over the socket.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::Digest;
use tollgate_proto::sp1;

/// Where the daemon is and which organization to act for.
#[derive(Debug, clap::Args)]
pub struct Conn {
    /// The daemon's data directory (for the default socket and secret).
    #[arg(long, default_value = "tollgate-data")]
    pub data_dir: PathBuf,
    /// The socket (default: DATA_DIR/tollgate.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The organization.
    #[arg(long, default_value = "default")]
    pub org: String,
    /// A file holding the organization's operator secret (default:
    /// DATA_DIR/secrets/ORG.operator.secret). Agents' secrets cannot decide.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
}

/// `tollgate hitl`.
#[derive(Debug, clap::Subcommand)]
pub enum Args {
    /// List the held calls waiting for a human decision (one line each, with its call
    /// number: `tollgate hitl decide SESSION --call N`).
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Record a human decision on a session's pending call.
    Decide {
        #[command(flatten)]
        conn: Conn,
        /// The session.
        session: String,
        /// approve, reject, modify, defer or escalate.
        #[arg(value_parser = ["approve", "reject", "modify", "defer", "escalate"])]
        decision: String,
        /// Who decides (recorded in the audit log).
        #[arg(long)]
        operator: String,
        /// The held call to decide, by its call number (`tollgate hitl list` shows it).
        /// Without it, the session's one held call; refused when several are held.
        #[arg(long = "call")]
        call: Option<u64>,
        /// The human's words, at most 1024 bytes (recorded in the signed audit entry and
        /// written by `tollgate audit export`).
        #[arg(long, default_value = "")]
        note: String,
        /// For modify: the successor call's nonce.
        #[arg(long)]
        successor_nonce: Option<u64>,
        /// For modify: the successor's params, a JSON file (the daemon canonicalizes them,
        /// computes their digest and, without --successor-nonce, assigns a nonce; the
        /// agent gets them from AwaitDecision). Or give --successor-digest instead.
        #[arg(long, conflicts_with = "successor_digest")]
        successor_params: Option<std::path::PathBuf>,
        /// For modify: the successor's canonical params hash (64 hex digits).
        #[arg(long)]
        successor_digest: Option<String>,
    },
}

/// An operator's connection to the daemon (`tollgate policy reload` uses it too).
pub async fn connect(c: &Conn) -> anyhow::Result<DaemonClient> {
    let socket = c
        .socket
        .clone()
        .unwrap_or_else(|| c.data_dir.join("tollgate.sock"));
    let secret_path = c.secret_file.clone().unwrap_or_else(|| {
        c.data_dir
            .join("secrets")
            .join(format!("{}.operator.secret", c.org))
    });
    let secret = std::fs::read_to_string(&secret_path)
        .with_context(|| format!("reading {}", secret_path.display()))?;
    let cfg = ClientConfig::new(
        socket,
        &c.org,
        secret.trim().as_bytes(),
        "tollgate-operator",
    );
    Ok(DaemonClient::operator(cfg).await?)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Run.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match args {
            Args::List { conn } => {
                let client = connect(conn).await?;
                let pending = client.hitl_list().await?;
                if pending.is_empty() {
                    outln!("no pending decisions");
                }
                for p in pending {
                    let t = p.transition.unwrap_or_default();
                    outln!(
                        "{}\tcall={}\tagent={}\ttool={}\tnonce={}\tdigest={}\tdecision={}\tstatus={}",
                        p.session_id,
                        t.call_number,
                        p.agent_id,
                        t.tool_name,
                        t.original_nonce,
                        hex(&t.original_args_digest),
                        if t.decision.is_empty() {
                            "awaiting"
                        } else {
                            &t.decision
                        },
                        t.terminal_status
                    );
                }
                Ok(ExitCode::SUCCESS)
            }
            Args::Decide {
                conn,
                session,
                decision,
                operator,
                call,
                note,
                successor_nonce,
                successor_params,
                successor_digest,
            } => {
                if note.len() > 1024 {
                    anyhow::bail!("--note is over 1024 bytes");
                }
                let successor_params_json = match successor_params {
                    Some(p) => std::fs::read_to_string(p)?,
                    None => String::new(),
                };
                let client = connect(conn).await?;
                let digest = match successor_digest {
                    Some(d) => Digest::from_hex(d)?.0.to_vec(),
                    None => Vec::new(),
                };
                let r = client
                    .hitl_decide(sp1::HitlDecideRequest {
                        session_id: session.clone(),
                        decision: decision.clone(),
                        operator_id: operator.clone(),
                        successor_nonce: successor_nonce.unwrap_or(0),
                        successor_args_digest: digest,
                        note: note.clone(),
                        successor_params_json,
                        call_number: call.unwrap_or(0),
                    })
                    .await?;
                let decided = r.transition.as_ref().map_or(0, |t| t.call_number);
                outln!(
                    "{session} call {decided}: {decision} recorded by {operator} (audit entry {})",
                    r.audit_entry_id
                );
                if let Some(t) = r.transition.as_ref().filter(|_| decision == "modify") {
                    outln!(
                        "successor: nonce {} digest {}",
                        t.successor_nonce,
                        hex(&t.successor_args_digest)
                    );
                }
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}
