//! Where verdicts come from: the in-process [`Guard`] (library mode) or one session with
//! `tollgate serve` (daemon mode). The gateway decides nothing itself: it asks, as an agent
//! would, and forwards only what was allowed.

use std::sync::Arc;
use std::time::Duration;

use tollgate_client::{
    AuditIdentity, ClientConfig, ClientError, DaemonClient, Guard, HumanWait, ShareParams,
};
use tollgate_core::json::Value;
use tollgate_core::{HumanDecision, Money, Verdict};

use crate::config::{DaemonSettings, LibrarySettings};
use crate::texts::Denial;

/// Why the decider could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DeciderError {
    /// A file could not be read.
    #[error("cannot read `{path}`: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The audit signing key is not a key.
    #[error("`{path}` is not an audit signing key: {message}")]
    Key {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        message: String,
    },
    /// The local audit log could not be opened or written.
    #[error("local audit log: {0}")]
    Audit(String),
    /// `[policy]`'s set could not be loaded (every finding, `file:line:col: ...`, one per
    /// line) or put in force.
    #[error("{0}")]
    Policy(String),
}

/// How to settle a call that ran.
#[derive(Debug, Clone)]
pub enum Ticket {
    /// Library mode: the call's number in the guard's session.
    Library(u64),
    /// Daemon mode: the client that was told ALLOW, and the call number.
    Daemon(Arc<DaemonClient>, u64),
}

/// The answer to "may this call run?".
#[derive(Debug, Clone)]
pub enum Checked {
    /// Run it, with these arguments (a daemon operator's modify may have changed them).
    Allow {
        /// The arguments to send upstream.
        params: Value,
        /// How to settle it afterwards.
        ticket: Ticket,
    },
    /// Do not run it.
    Deny(Denial),
    /// Library mode: a human must decide first. `nonce` re-dispatches the held call.
    Held {
        /// The held call's nonce.
        nonce: u64,
        /// The held call's number (what its decision names: several may be held at once).
        call_number: u64,
        /// Why it was held (`hitl_all_calls`, `budget_threshold`, `policy:<id>`, ...).
        reason: String,
        /// When a policy held it: what the policy says (its `@hitl` text).
        explanation: Option<String>,
    },
}

/// Library or daemon mode.
#[derive(Debug)]
pub enum Decider {
    /// In process.
    Library(Library),
    /// Through the daemon (boxed: it is the larger by far).
    Daemon(Box<Daemon>),
}

fn read_key(key_path: &std::path::Path) -> Result<tollgate_audit::SigningKey, DeciderError> {
    let text = std::fs::read_to_string(key_path).map_err(|source| DeciderError::Read {
        path: key_path.to_owned(),
        source,
    })?;
    tollgate_audit::keys::parse_secret_key(&text).map_err(|e| DeciderError::Key {
        path: key_path.to_owned(),
        message: e.to_string(),
    })
}

/// Library mode: one guard.
#[derive(Debug)]
pub struct Library {
    guard: Arc<Guard>,
    /// The guard's repeat limit (for the denial text).
    repeat_limit: u32,
}

/// Daemon mode: one session, resumed after a lost connection, never replaced.
#[derive(Debug)]
pub struct Daemon {
    config: ClientConfig,
    wait: HumanWait,
    client: tokio::sync::Mutex<Option<Arc<DaemonClient>>>,
    /// The session, once registered: a reconnection resumes it (a new session would
    /// start with a fresh budget and a closed circuit).
    session: std::sync::Mutex<Option<String>>,
}

fn money(usd: f64) -> Money {
    Money::from_usd(usd).unwrap_or(Money::ZERO)
}

fn from_guard(
    c: tollgate_client::Checked,
    params: Value,
    repeat_limit: u32,
    estimate: Money,
) -> Checked {
    // `c.reason` names the deciding policy (`policy:<id>`, ...) when one decided, else
    // it is the guards' reason.
    match c.decision.verdict {
        Verdict::Allow => Checked::Allow {
            params,
            ticket: Ticket::Library(c.call_number),
        },
        Verdict::Hitl => Checked::Held {
            nonce: c.nonce,
            call_number: c.call_number,
            reason: c.reason,
            explanation: c.policy_explanation,
        },
        Verdict::Deny => Checked::Deny(Denial {
            reason: c.reason,
            repeat_count: Some(repeat_limit),
            budget_remaining: Some(c.budget_remaining),
            estimate,
            note: String::new(),
            refused_earlier: false,
            explanation: c.policy_explanation,
        }),
    }
}

/// `[policy]`'s set, loaded as `tollgate serve` loads one; the loader's warnings are logged.
fn load_policies(
    p: &tollgate_policy::files::Settings,
) -> Result<tollgate_policy::compose::Enforced, DeciderError> {
    let (set, warnings) =
        tollgate_policy::files::enforced(p).map_err(|e| DeciderError::Policy(e.to_string()))?;
    for w in &warnings {
        tracing::warn!("{w}");
    }
    Ok(set)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

impl Library {
    /// Check what [`Library::open`] would read (the signing key), writing nothing: no
    /// audit log is opened (`tollgate mcp --check`).
    pub fn check_settings(settings: &LibrarySettings) -> Result<(), DeciderError> {
        if let Some(p) = &settings.policy {
            load_policies(p)?;
        }
        match &settings.audit_key {
            Some(path) => read_key(path).map(|_| ()),
            None => Ok(()),
        }
    }

    /// A guard for `settings`, with its policy set and its local audit log when
    /// configured (the set first, so the session's opening names it).
    pub fn open(settings: &LibrarySettings) -> Result<Library, DeciderError> {
        let who = AuditIdentity {
            session_id: settings.session_id.clone(),
            agent_id: settings.agent_id.clone(),
            organization_id: settings.organization_id.clone(),
        };
        // Named from the start: the policies' principal is `[library]`'s ids with or
        // without a local audit log.
        let guard = Guard::new_as(settings.guard.clone(), who.clone())
            .with_params(settings.audit_params.clone());
        let guard = match &settings.policy {
            Some(p) => guard
                .with_policies(load_policies(p)?)
                .map_err(|e| DeciderError::Policy(format!("policy: {e}")))?,
            None => guard,
        };
        let guard = match (&settings.audit_dir, &settings.audit_key) {
            (Some(dir), Some(key_path)) => {
                let key = read_key(key_path)?;
                let (writer, _) =
                    tollgate_audit::Writer::open(tollgate_audit::WriterConfig::new(dir), key)
                        .map_err(|e| DeciderError::Audit(e.to_string()))?;
                guard
                    .with_audit(writer, who)
                    .map_err(|e| DeciderError::Audit(e.to_string()))?
            }
            _ => guard,
        };
        Ok(Library {
            guard: Arc::new(guard),
            repeat_limit: settings.guard.max_repeat_calls,
        })
    }

    /// The guard (for tests and `--check`).
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Which of `upstream`'s `tools` (its own names) the policy set refuses the guard's
    /// principal whatever the arguments and the session (`tools/list` leaves them out);
    /// none without a set. A principal the set cannot name is refused everything.
    pub fn denied_unconditionally(&self, upstream: &str, tools: &[&str]) -> Vec<bool> {
        tools
            .iter()
            .map(|t| self.guard.denies_unconditionally(upstream, t))
            .collect()
    }

    async fn check(&self, upstream: &str, tool: &str, params: Value, cost_usd: f64) -> Checked {
        let guard = self.guard.clone();
        let tool = tool.to_owned();
        let upstream = upstream.to_owned();
        let estimate = money(cost_usd);
        let limit = self.repeat_limit;
        blocking(move || {
            let c = guard.check_in(&upstream, &tool, &params, estimate, None);
            match from_guard(c, params, limit, estimate) {
                // A first dispatch was never held, so nobody was asked about it: a reject
                // here is of an earlier call (one held call per session, SP/1.0.1 §3.6).
                Checked::Deny(mut d) if d.reason == "hitl_transition:reject" => {
                    d.refused_earlier = true;
                    Checked::Deny(d)
                }
                checked => checked,
            }
        })
        .await
        .unwrap_or_else(|| {
            Checked::Deny(Denial {
                reason: "fail_closed:internal".into(),
                repeat_count: None,
                budget_remaining: None,
                estimate,
                note: String::new(),
                refused_earlier: false,
                explanation: None,
            })
        })
    }

    /// Record `operator`'s approval of held call `call_number`, then re-dispatch it with
    /// its nonce: the guard releases exactly that call, once.
    #[allow(clippy::too_many_arguments)]
    pub async fn approve(
        &self,
        upstream: &str,
        tool: &str,
        params: Value,
        cost_usd: f64,
        nonce: u64,
        call_number: u64,
        operator: &str,
    ) -> Checked {
        let guard = self.guard.clone();
        let tool = tool.to_owned();
        let upstream = upstream.to_owned();
        let operator = operator.to_owned();
        let estimate = money(cost_usd);
        let limit = self.repeat_limit;
        blocking(move || {
            if let Err(e) = guard.decide_human_call(
                Some(call_number),
                HumanDecision::Approve,
                None,
                &operator,
                "",
            ) {
                return Checked::Deny(Denial {
                    reason: format!("fail_closed:{e}"),
                    repeat_count: None,
                    budget_remaining: None,
                    estimate,
                    note: String::new(),
                    refused_earlier: false,
                    explanation: None,
                });
            }
            let c = guard.check_in(&upstream, &tool, &params, estimate, Some(nonce));
            from_guard(c, params, limit, estimate)
        })
        .await
        .unwrap_or_else(|| {
            Checked::Deny(Denial {
                reason: "fail_closed:internal".into(),
                repeat_count: None,
                budget_remaining: None,
                estimate,
                note: String::new(),
                refused_earlier: false,
                explanation: None,
            })
        })
    }

    /// Record `operator`'s refusal of held call `call_number` (that call only: the
    /// session and its other calls go on).
    pub async fn reject(&self, call_number: u64, operator: &str) {
        let guard = self.guard.clone();
        let operator = operator.to_owned();
        blocking(move || {
            guard.decide_human_call(
                Some(call_number),
                HumanDecision::Reject,
                None,
                &operator,
                "",
            )
        })
        .await;
    }

    /// Expire held call `call_number`: nobody answered in time.
    pub async fn expire(&self, call_number: u64) {
        let guard = self.guard.clone();
        blocking(move || guard.expire_call(Some(call_number))).await;
    }
}

impl Daemon {
    /// A daemon-mode decider; it connects on first use.
    pub fn new(settings: &DaemonSettings, hitl_timeout: Duration) -> Result<Daemon, DeciderError> {
        let secret = std::fs::read_to_string(&settings.secret_file).map_err(|source| {
            DeciderError::Read {
                path: settings.secret_file.clone(),
                source,
            }
        })?;
        let mut config = ClientConfig::new(
            &settings.socket,
            &settings.organization,
            secret.trim().as_bytes(),
            &settings.agent_id,
        );
        config.timeout = settings.timeout;
        config.framework = "mcp".into();
        Ok(Daemon {
            config,
            wait: HumanWait {
                timeout: hitl_timeout,
                share_params: if settings.share_params {
                    ShareParams::All
                } else {
                    ShareParams::Never
                },
            },
            client: tokio::sync::Mutex::new(None),
            session: std::sync::Mutex::new(None),
        })
    }

    /// The session id, once registered.
    pub fn session_id(&self) -> Option<String> {
        self.session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The connected client: connect (the first time) or resume the session.
    pub async fn client(&self) -> Result<Arc<DaemonClient>, ClientError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let known = self.session_id();
        let c = match &known {
            Some(id) => DaemonClient::resume(self.config.clone(), id).await?,
            None => DaemonClient::connect(self.config.clone()).await?,
        };
        let c = Arc::new(c);
        *self
            .session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(c.session_id().to_owned());
        c.spawn_heartbeats(Duration::from_secs(10));
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn forget(&self) {
        *self.client.lock().await = None;
    }

    async fn check(&self, tool: &str, params: Value, cost_usd: f64) -> Checked {
        let estimate = money(cost_usd);
        let deny =
            |reason: String, r: Option<&tollgate_proto::sp1::PreExecResponse>, note: String| {
                Checked::Deny(Denial {
                    reason,
                    repeat_count: r.and_then(|r| u32::try_from(r.repeat_count).ok()),
                    budget_remaining: r.map(|r| Money(r.budget_remaining_nanos)),
                    estimate,
                    note,
                    refused_earlier: false,
                    explanation: None,
                })
            };
        let client = match self.client().await {
            Ok(c) => c,
            Err(e) => return deny(e.reason(), None, String::new()),
        };
        let released = client
            .pre_exec_or_wait(tool, &params, cost_usd, self.wait)
            .await;
        if released.allowed() {
            return Checked::Allow {
                params: released.params.unwrap_or(params),
                ticket: Ticket::Daemon(client, released.verdict.call_number),
            };
        }
        if matches!(released.verdict.error, Some(ClientError::Unreachable(_))) {
            // The connection is gone: the next call reconnects and resumes the session.
            self.forget().await;
        }
        let reason = released.verdict.reason.clone();
        let refused_earlier = reason == "hitl_transition:reject" && released.decision.is_empty();
        // A policy's verdict: the daemon's text for it names the policy.
        let explanation = released
            .verdict
            .response
            .as_ref()
            .filter(|_| reason.starts_with("policy"))
            .map(|r| r.human_readable_reason.clone());
        match deny(
            reason,
            released.verdict.response.as_ref(),
            released.note.clone(),
        ) {
            // No human decided this call (`decision` is empty): the reject is of an earlier
            // one (one held call per session, SP/1.0.1 §3.6).
            Checked::Deny(mut d) => {
                d.refused_earlier = refused_earlier;
                d.explanation = explanation;
                Checked::Deny(d)
            }
            checked => checked,
        }
    }
}

/// The tool a call is for, by each of its names.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The name the host sees (and daemon mode decides by: the daemon knows no upstream).
    pub public: &'a str,
    /// Its upstream's name: the policies' resource (`Upstream::"NAME"`) in library mode.
    pub upstream: &'a str,
    /// The upstream's own name for it: what library mode decides by (the policies'
    /// action), which adding an upstream does not change.
    pub own: &'a str,
}

impl Decider {
    /// Decide the call of `target` with `params` at the estimated `cost_usd`.
    pub async fn check(&self, target: Target<'_>, params: Value, cost_usd: f64) -> Checked {
        match self {
            Decider::Library(l) => l.check(target.upstream, target.own, params, cost_usd).await,
            Decider::Daemon(d) => d.check(target.public, params, cost_usd).await,
        }
    }

    /// Settle a call that ran: its actual cost in dollars (NaN when unreadable: charged as
    /// the estimate) and its error text when it failed.
    pub async fn settle(&self, ticket: Ticket, cost_usd: f64, error: Option<String>) {
        match (self, ticket) {
            (Decider::Library(l), Ticket::Library(n)) => {
                let guard = l.guard.clone();
                blocking(move || guard.post_exec(n, cost_usd, error.as_deref())).await;
            }
            (_, Ticket::Daemon(client, n)) => {
                let _ = client
                    .post_exec(n, cost_usd, error.is_none(), error.as_deref().unwrap_or(""))
                    .await;
            }
            (Decider::Daemon(_), Ticket::Library(_)) => {}
        }
    }
}
