//! The gateway, tested as hosts use it: rmcp's client drives the real gateway process
//! (`tollgate-mcp-testkit gateway`, which runs exactly what `tollgate mcp` runs) over its
//! stdin and stdout; the gateway drives a real MCP server (`tollgate-mcp-testkit
//! upstream`, rmcp's server side) as a child process. No network: daemon mode uses a Unix
//! socket, Streamable HTTP uses 127.0.0.1.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_debug_implementations
)]

mod cancel;
mod daemon;
mod flows;
mod hitl;
mod http;
mod names;
mod policy;
mod policy_check;
mod replay;
mod robustness;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ElicitRequestParams,
    ElicitResult, ElicitationAction, ErrorData, Implementation, ProtocolVersion,
};
use rmcp::service::{RequestContext, RunningService, ServiceError};
use rmcp::{ClientHandler, RoleClient, ServiceExt};

pub const TESTKIT: &str = env!("CARGO_BIN_EXE_tollgate-mcp-testkit");

/// A gateway configuration in a temporary directory, with the testkit upstream.
pub struct Kit {
    pub dir: tempfile::TempDir,
}

impl Kit {
    /// One upstream `kit` (its `delete_everything` hidden), then `extra` TOML.
    pub fn new(extra: &str) -> Kit {
        Kit::with_upstreams(
            &format!(
                "[[upstream]]\nname = \"kit\"\ncommand = \"{TESTKIT}\"\nargs = [\"upstream\"]\n\
                 hide = [\"delete_everything\"]\n[upstream.env]\nTESTKIT_LOG = \"LOG\"\n"
            ),
            extra,
        )
    }

    /// Upstreams as given (the text `LOG` replaced by the invocation log's path).
    pub fn with_upstreams(upstreams: &str, extra: &str) -> Kit {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("invocations.log");
        let text = format!(
            "{extra}\n{}",
            upstreams.replace("\"LOG\"", &format!("{log:?}"))
        );
        std::fs::write(dir.path().join("mcp.toml"), text).unwrap();
        Kit { dir }
    }

    pub fn config(&self) -> PathBuf {
        self.dir.path().join("mcp.toml")
    }

    /// The tools the upstream actually ran, in order.
    pub fn invocations(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("invocations.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// A signing key in the directory (for `[library] audit_key = "audit.key"`).
    pub fn make_audit_key(&self) {
        let key = tollgate_audit::keys::generate().unwrap();
        std::fs::write(
            self.dir.path().join("audit.key"),
            tollgate_audit::keys::secret_key_text(&key),
        )
        .unwrap();
        std::fs::write(
            self.dir.path().join("audit.pub"),
            tollgate_audit::keys::public_key_text(&key.verifying_key()),
        )
        .unwrap();
    }

    /// Every entry of the local audit log in `audit/`, verified with `audit.pub` (what
    /// `tollgate audit verify --key audit.pub audit` checks), as session events.
    pub fn audited(&self) -> Vec<tollgate_audit::SessionEvent> {
        let public = std::fs::read_to_string(self.dir.path().join("audit.pub")).unwrap();
        let opts = tollgate_audit::VerifyOptions {
            trusted_key: Some(tollgate_audit::keys::parse_public_key(&public).unwrap()),
            ..Default::default()
        };
        let mut out = Vec::new();
        tollgate_audit::verify_paths(&[self.dir.path().join("audit")], &opts, &mut |e| {
            if let tollgate_audit::Event::Session(ev) = &e.event {
                out.push(ev.clone());
            }
        })
        .expect("the local audit log verifies");
        out
    }
}

/// The host: answers elicitations as told, and remembers what it was asked.
#[derive(Clone)]
pub struct Host {
    /// Declare the elicitation capability.
    pub elicitation: bool,
    /// How to answer; `None`: never answer.
    pub answer: Option<ElicitationAction>,
    /// The protocol revision the host asks for.
    pub version: ProtocolVersion,
    /// The messages it was asked to approve.
    pub asked: Arc<Mutex<Vec<String>>>,
    /// The progress messages it was sent.
    pub progress: Arc<Mutex<Vec<String>>>,
    /// How to answer each request, by its message (instead of `answer`).
    pub answer_by: Option<fn(&str) -> ElicitationAction>,
    /// Answer nothing until this many requests are open at once, then answer them
    /// newest first (0: answer each at once).
    pub hold_until: usize,
    /// The requests open now, and the order they came in (for `hold_until`).
    pub open: Arc<(Mutex<Vec<usize>>, tokio::sync::Notify)>,
}

impl Default for Host {
    fn default() -> Self {
        Host {
            elicitation: false,
            answer: None,
            version: ProtocolVersion::V_2025_11_25,
            asked: Arc::default(),
            progress: Arc::default(),
            answer_by: None,
            hold_until: 0,
            open: Arc::default(),
        }
    }
}

impl ClientHandler for Host {
    fn get_info(&self) -> ClientConfig {
        let caps: ClientCapabilities = if self.elicitation {
            serde_json::from_value(serde_json::json!({"elicitation": {"form": {}}})).unwrap()
        } else {
            ClientCapabilities::default()
        };
        ClientConfig::new(caps, Implementation::new("test-host", "1"))
            .with_protocol_version(self.version.clone())
    }

    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.progress
            .lock()
            .unwrap()
            .push(params.message.unwrap_or_default());
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let message = match request {
            ElicitRequestParams::FormElicitationParams { message, .. } => message,
            _ => String::new(),
        };
        let me = {
            let mut asked = self.asked.lock().unwrap();
            asked.push(message.clone());
            asked.len()
        };
        if self.hold_until > 0 {
            // Wait until `hold_until` requests are open, then answer the newest open one
            // first: the gateway must have asked about every call before any is decided,
            // and decisions come in the reverse order.
            let (open, changed) = &*self.open;
            open.lock().unwrap().push(me);
            changed.notify_waiters();
            loop {
                let notified = changed.notified();
                {
                    let open = open.lock().unwrap();
                    let all_asked = self.asked.lock().unwrap().len() >= self.hold_until;
                    if all_asked && open.last() == Some(&me) {
                        break;
                    }
                }
                notified.await;
            }
            open.lock().unwrap().retain(|n| *n != me);
            changed.notify_waiters();
        }
        if let Some(by) = self.answer_by {
            return Ok(ElicitResult::new(by(&message)));
        }
        match &self.answer {
            Some(a) => Ok(ElicitResult::new(a.clone())),
            None => std::future::pending().await,
        }
    }
}

/// A running gateway process and the host's session with it.
pub struct Session {
    pub client: RunningService<RoleClient, Host>,
    pub child: tokio::process::Child,
}

impl Session {
    /// Call `tool` with `args`.
    pub async fn call(
        &self,
        tool: &str,
        args: serde_json::Value,
    ) -> Result<CallToolResult, ServiceError> {
        let serde_json::Value::Object(args) = args else {
            panic!("arguments must be an object")
        };
        let mut p = CallToolRequestParams::new(tool.to_owned());
        p.arguments = Some(args);
        self.client.call_tool(p).await
    }

    /// Call and expect a result (not a JSON-RPC error).
    pub async fn ok(&self, tool: &str, args: serde_json::Value) -> CallToolResult {
        self.call(tool, args).await.unwrap()
    }

    /// Hang up (EOF on the gateway's stdin) and wait for the gateway to exit.
    pub async fn close(mut self) -> std::process::ExitStatus {
        let _ = self.client.cancel().await;
        tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("the gateway exits when the host hangs up")
            .unwrap()
    }
}

/// The first text of a result.
pub fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .find_map(|c| c.as_text().map(|t| t.text.clone()))
        .unwrap_or_default()
}

pub fn denied(r: &CallToolResult) -> bool {
    r.is_error == Some(true) && text(r).starts_with("denied: ")
}

/// Start the gateway on `config` and connect `host` to it.
pub async fn start(config: &Path, host: Host) -> Session {
    let mut child = tokio::process::Command::new(TESTKIT)
        .arg("gateway")
        .arg(config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let client = tokio::time::timeout(Duration::from_secs(20), host.serve((stdout, stdin)))
        .await
        .expect("the gateway initializes")
        .unwrap();
    Session { client, child }
}
