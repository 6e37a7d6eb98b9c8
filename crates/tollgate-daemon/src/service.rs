//! The protocol, independent of the transport: a verified request in, a response out.
//!
//! Every request is authenticated before anything else happens; every verdict is decided
//! by `tollgate_core::decide`, applied to the store atomically, written to the audit log,
//! and returned only once both the state change and the audit entry are durable.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tollgate_core::signals::has_error_signal;
use tollgate_core::{
    decide, Decision, Digest, HumanDecision, Money, Params, Reason, SessionState, SessionStatus,
    Successor, ToolCall, UnixNanos,
};
use tollgate_proto::auth::{self, AuthError, Unverified};
use tollgate_proto::sp1::{self, envelope::Payload, Envelope, ErrorCode};
use tollgate_proto::{MessageKey, Verified, SUPPORTED_VERSIONS};
use tollgate_store::{ops, Change, Policy, Session, SessionMeta, SessionStore};

use crate::config::{DaemonConfig, DEFAULT_ORG};
use crate::convert;
use crate::ratelimit::RateLimiter;

/// The longest tool name accepted. Tool names are stored in session state and written to
/// the audit log (whose string fields hold at most 1024 bytes), so they are bounded here,
/// before anything is decided or stored.
pub const MAX_TOOL_NAME_BYTES: usize = 256;

/// The daemon's version, reported at registration.
pub const DAEMON_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer {
    /// The peer's uid (Unix sockets), or 0 when unknown.
    pub uid: u32,
}

/// The daemon's clock: the sole time authority.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since the Unix epoch.
    fn now_ns(&self) -> UnixNanos;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> UnixNanos {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
    }
}

/// What the daemon remembers of a live session, beside the store: who it belongs to and
/// the policy it runs under (fixed when it was opened).
#[derive(Debug, Clone)]
struct SessionInfo {
    organization_id: String,
    agent_id: String,
    policy: Arc<Policy>,
}

/// The protocol engine.
pub struct Service<S> {
    config: Arc<DaemonConfig>,
    store: S,
    audit: Arc<tollgate_audit::Writer>,
    clock: Arc<dyn Clock>,
    /// The policy new sessions get: per configured agent, and the default.
    agent_policies: HashMap<String, Arc<Policy>>,
    default_policy: Arc<Policy>,
    /// Agents' keys, by organization.
    keys: HashMap<String, MessageKey>,
    /// Operators' keys, by organization: human decisions need one of these.
    operator_keys: HashMap<String, MessageKey>,
    sessions: Mutex<HashMap<String, SessionInfo>>,
    pre_exec_limits: Mutex<RateLimiter<String>>,
    register_limits: Mutex<RateLimiter<Peer>>,
}

impl<S> std::fmt::Debug for Service<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A failure answered with an `Error` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The Appendix B code (or one of ours).
    pub code: ErrorCode,
    /// A human-readable explanation.
    pub message: String,
    /// For RATE_LIMITED.
    pub retry_after_ms: u64,
}

fn refuse(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
        retry_after_ms: 0,
    }
}

/// What to send back, if anything.
#[derive(Debug)]
pub enum Reply {
    /// A response frame body (sealed when the peer authenticated).
    Frame(Vec<u8>),
    /// Nothing (post-exec is fire-and-forget).
    Nothing,
}

impl<S: SessionStore> Service<S> {
    /// A service over `store`, whose journal is `audit` (the store writes every change's
    /// entry there; the service uses the writer for shutdown and metrics), with message
    /// keys derived from the organizations' secrets: `secrets` for agents and
    /// `operator_secrets` for the humans who decide, one each per organization id.
    pub fn new(
        config: Arc<DaemonConfig>,
        store: S,
        audit: Arc<tollgate_audit::Writer>,
        clock: Arc<dyn Clock>,
        secrets: &HashMap<String, Vec<u8>>,
        operator_secrets: &HashMap<String, Vec<u8>>,
    ) -> Service<S> {
        let derive = |m: &HashMap<String, Vec<u8>>| -> HashMap<String, MessageKey> {
            m.iter()
                .map(|(org, secret)| (org.clone(), MessageKey::derive(secret)))
                .collect()
        };
        let keys = derive(secrets);
        let operator_keys = derive(operator_secrets);
        let limits = &config.limits;
        let agent_policies = config
            .agent_guards
            .iter()
            .map(|(agent, g)| (agent.clone(), Arc::new(Policy::new(g.clone()))))
            .collect();
        let default_policy = Arc::new(Policy::new(config.default_guard.clone()));
        Service {
            agent_policies,
            default_policy,
            pre_exec_limits: Mutex::new(RateLimiter::new(limits.pre_exec_per_second_per_session)),
            register_limits: Mutex::new(RateLimiter::new(limits.registrations_per_second_per_peer)),
            config,
            store,
            audit,
            clock,
            keys,
            operator_keys,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The audit writer.
    pub fn audit(&self) -> &tollgate_audit::Writer {
        &self.audit
    }

    /// The policy a new session of `agent` runs under.
    fn policy_for(&self, agent: &str) -> Arc<Policy> {
        self.agent_policies
            .get(agent)
            .unwrap_or(&self.default_policy)
            .clone()
    }

    /// Handle one frame body from `peer`.
    pub async fn handle(&self, body: &[u8], peer: Peer) -> Reply {
        let received_ns = self.clock.now_ns();
        let unverified = match Unverified::decode(body) {
            Ok(u) => u,
            Err(e) => {
                return self.error_reply(
                    None,
                    "",
                    received_ns,
                    refuse(ErrorCode::MalformedMessage, e.to_string()),
                )
            }
        };
        let message_id = unverified.envelope().message_id.clone();
        let keys = match self.keys_for(unverified.envelope()).await {
            Ok(k) => k,
            Err(r) => return self.error_reply(None, &message_id, received_ns, r),
        };
        let mut outcome = Err(AuthError::BadMac);
        for k in &keys {
            outcome = unverified.clone().verify(k).map(|v| (v, k.clone()));
            if outcome.is_ok() {
                break;
            }
        }
        let (verified, key) = match outcome {
            Ok(v) => v,
            Err(e) => {
                let message = match e {
                    AuthError::BadMac => "message authentication failed".to_owned(),
                    other => other.to_string(),
                };
                tracing::warn!(%message_id, "authentication failed: {message}");
                return self.error_reply(
                    None,
                    &message_id,
                    received_ns,
                    refuse(ErrorCode::AuthenticationFailed, message),
                );
            }
        };
        let result = self.dispatch(verified, peer, received_ns).await;
        match result {
            Ok(Some(payload)) => self.reply(&key, &message_id, received_ns, payload),
            Ok(None) => Reply::Nothing,
            Err(r) => self.error_reply(Some(&key), &message_id, received_ns, r),
        }
    }

    fn reply(
        &self,
        key: &MessageKey,
        correlation: &str,
        received_ns: i64,
        payload: Payload,
    ) -> Reply {
        match auth::seal(key, &reply_envelope(correlation, received_ns, payload)) {
            Ok(body) => Reply::Frame(body),
            Err(e) => {
                tracing::error!("response too large to send: {e}");
                Reply::Nothing
            }
        }
    }

    /// An error reply: sealed with the peer's key once it is authenticated, plain before.
    fn error_reply(
        &self,
        key: Option<&MessageKey>,
        correlation: &str,
        received_ns: i64,
        r: Refusal,
    ) -> Reply {
        let payload = Payload::Error(sp1::Error {
            code: r.code as i32,
            message: r.message,
            retry_after_ms: r.retry_after_ms,
        });
        match key {
            Some(k) => self.reply(k, correlation, received_ns, payload),
            None => Reply::Frame(unsealed(correlation, received_ns, payload)),
        }
    }

    /// The keys one of which must have sealed this envelope: its organization's agent key,
    /// or operator key for human decisions, or either for reading a session's state.
    async fn keys_for(&self, env: &Envelope) -> Result<Vec<MessageKey>, Refusal> {
        #[derive(PartialEq)]
        enum Who {
            Agent,
            Operator,
            Either,
        }
        let who = match &env.payload {
            Some(Payload::HitlList(_) | Payload::HitlDecide(_)) => Who::Operator,
            Some(Payload::GetSessionState(_)) => Who::Either,
            _ => Who::Agent,
        };
        let org = match &env.payload {
            Some(Payload::Register(r)) => {
                if r.organization_id.is_empty() {
                    DEFAULT_ORG.to_owned()
                } else {
                    r.organization_id.clone()
                }
            }
            Some(Payload::HitlList(r)) => {
                if r.organization_id.is_empty() {
                    DEFAULT_ORG.to_owned()
                } else {
                    r.organization_id.clone()
                }
            }
            Some(Payload::PreExec(r)) => self.session_info(&r.session_id).await?.organization_id,
            Some(Payload::PostExec(r)) => self.session_info(&r.session_id).await?.organization_id,
            Some(Payload::Heartbeat(r)) => self.session_info(&r.session_id).await?.organization_id,
            Some(Payload::GetSessionState(r)) => {
                self.session_info(&r.session_id).await?.organization_id
            }
            Some(Payload::HitlDecide(r)) => self.session_info(&r.session_id).await?.organization_id,
            Some(_) => {
                return Err(refuse(
                    ErrorCode::InvalidRequest,
                    "the daemon does not accept responses",
                ))
            }
            None => {
                return Err(refuse(
                    ErrorCode::MalformedMessage,
                    "envelope has no payload",
                ))
            }
        };
        let mut keys = Vec::with_capacity(2);
        if who != Who::Operator {
            keys.extend(self.keys.get(&org).cloned());
        }
        if who != Who::Agent {
            keys.extend(self.operator_keys.get(&org).cloned());
        }
        if keys.is_empty() {
            // Same answer as a bad MAC: do not reveal which organizations exist.
            return Err(refuse(
                ErrorCode::AuthenticationFailed,
                "message authentication failed",
            ));
        }
        Ok(keys)
    }

    async fn session_info(&self, id: &str) -> Result<SessionInfo, Refusal> {
        if let Some(info) = lock(&self.sessions).get(id) {
            return Ok(info.clone());
        }
        let not_found = || {
            refuse(
                ErrorCode::SessionNotFound,
                format!("unknown session `{id}`"),
            )
        };
        if id.is_empty() || id.len() > 128 {
            return Err(not_found());
        }
        let session = self
            .store
            .get(id)
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?
            .ok_or_else(not_found)?;
        let info = info_for(&session);
        lock(&self.sessions).insert(id.to_owned(), info.clone());
        Ok(info)
    }

    async fn dispatch(
        &self,
        env: Verified<Envelope>,
        peer: Peer,
        now: i64,
    ) -> Result<Option<Payload>, Refusal> {
        let env = env.into_inner();
        if !matches!(env.payload, Some(Payload::Register(_))) {
            check_major(&env.protocol_version)?;
        }
        match env.payload {
            Some(Payload::Register(r)) => self
                .register(r, &env.protocol_version, peer, now)
                .await
                .map(Some),
            Some(Payload::PreExec(r)) => self.pre_exec(r, now).await.map(Some),
            Some(Payload::PostExec(r)) => {
                self.post_exec(r, now).await?;
                Ok(None)
            }
            Some(Payload::Heartbeat(r)) => self.heartbeat(r, now).await.map(Some),
            Some(Payload::GetSessionState(r)) => self.get_state(&r.session_id, now).await.map(Some),
            Some(Payload::HitlList(r)) => self.hitl_list(r).await.map(Some),
            Some(Payload::HitlDecide(r)) => self.hitl_decide(r, now).await.map(Some),
            _ => Err(refuse(ErrorCode::InvalidRequest, "not a request")),
        }
    }

    async fn register(
        &self,
        r: sp1::RegisterRequest,
        envelope_version: &str,
        peer: Peer,
        now: i64,
    ) -> Result<Payload, Refusal> {
        if let Err(wait) = lock(&self.register_limits).check(&peer, Instant::now()) {
            return Err(Refusal {
                code: ErrorCode::RateLimited,
                message: "too many registrations from this peer".into(),
                retry_after_ms: wait,
            });
        }
        let negotiated = negotiate(envelope_version, &r.supported_versions)?;
        let org = if r.organization_id.is_empty() {
            DEFAULT_ORG.to_owned()
        } else {
            r.organization_id.clone()
        };
        if r.agent_id.is_empty() || r.agent_id.len() > 128 {
            return Err(refuse(
                ErrorCode::InvalidRequest,
                "agent_id must be 1 to 128 bytes",
            ));
        }
        let store_err =
            |e: tollgate_store::StoreError| refuse(ErrorCode::DaemonUnavailable, e.to_string());

        // Resume: the session must exist and belong to this organization and agent.
        if !r.session_id.is_empty() {
            let info = self.session_info(&r.session_id).await?;
            if info.organization_id != org || info.agent_id != r.agent_id {
                return Err(refuse(
                    ErrorCode::SessionNotFound,
                    format!("unknown session `{}`", r.session_id),
                ));
            }
            let ((state, last), _) = self
                .store
                .apply(&r.session_id, move |s: &mut Session| {
                    s.last_heartbeat_ns = now;
                    if s.state.status == SessionStatus::Stale {
                        s.state.status = live_status(&s.state);
                    }
                    Change::Touch((s.state.clone(), s.last_call_number))
                })
                .await
                .map_err(store_err)?;
            let id = convert::Identity {
                session_id: &r.session_id,
                agent_id: &info.agent_id,
                organization_id: &info.organization_id,
            };
            return Ok(Payload::RegisterResponse(sp1::RegisterResponse {
                session_id: r.session_id.clone(),
                daemon_version: DAEMON_VERSION.into(),
                negotiated_protocol: negotiated,
                active_config: Some(convert::guard(&info.policy.config)),
                daemon_time_ns: now,
                resumed: true,
                state: Some(convert::session_state(
                    id,
                    &state,
                    &info.policy.config,
                    last,
                )),
            }));
        }

        let policy = self.policy_for(&r.agent_id);
        let session_id = new_session_id();
        let meta = SessionMeta {
            session_id: session_id.clone(),
            agent_id: r.agent_id.clone(),
            organization_id: org.clone(),
            budget_scope: policy.config.budget_scope,
            created_at_ns: now,
        };
        let session = Session::new(meta, policy.clone(), now);
        let info = info_for(&session);
        let (state, durable) = self.store.create(session, now).await.map_err(|e| match e {
            tollgate_store::StoreError::SessionCap { .. } => {
                refuse(ErrorCode::OrganizationQuotaExceeded, e.to_string())
            }
            other => refuse(ErrorCode::DaemonUnavailable, other.to_string()),
        })?;
        // The session exists once its session-opened entry is durable.
        durable.await.map_err(store_err)?;
        lock(&self.sessions).insert(session_id.clone(), info);
        tracing::info!(%session_id, agent = %r.agent_id, %org, "session registered");
        let id = convert::Identity {
            session_id: &session_id,
            agent_id: &r.agent_id,
            organization_id: &org,
        };
        Ok(Payload::RegisterResponse(sp1::RegisterResponse {
            session_id: session_id.clone(),
            daemon_version: DAEMON_VERSION.into(),
            negotiated_protocol: negotiated,
            active_config: Some(convert::guard(&policy.config)),
            daemon_time_ns: now,
            resumed: false,
            state: Some(convert::session_state(id, &state, &policy.config, 0)),
        }))
    }

    fn stale_after_ns(&self) -> i64 {
        let l = &self.config.limits;
        let ns = l.heartbeat_interval.as_nanos() * u128::from(l.missed_heartbeats_for_stale);
        i64::try_from(ns).unwrap_or(i64::MAX)
    }

    async fn pre_exec(&self, r: sp1::PreExecRequest, now: i64) -> Result<Payload, Refusal> {
        self.session_info(&r.session_id).await?;
        if let Err(wait) = lock(&self.pre_exec_limits).check(&r.session_id, Instant::now()) {
            return Err(Refusal {
                code: ErrorCode::RateLimited,
                message: "too many pre_exec requests for this session".into(),
                retry_after_ms: wait,
            });
        }
        if r.tool_name.is_empty() || r.tool_name.len() > MAX_TOOL_NAME_BYTES {
            return Err(refuse(
                ErrorCode::InvalidRequest,
                format!("tool_name must be 1 to {MAX_TOOL_NAME_BYTES} bytes"),
            ));
        }
        let rng = random_unit();
        let stale_after = self.stale_after_ns();
        // The call is read from the request once, outside the session lock; the closure
        // borrows it.
        let call = to_call(&r);
        let digest = call.params.canonical_digest().ok();
        let call_number = r.call_number;
        let (outcome, durable) = self
            .store
            .apply(&r.session_id, move |s: &mut Session| {
                if now.saturating_sub(s.last_heartbeat_ns) > stale_after {
                    if s.state.status == SessionStatus::Stale {
                        return Change::Keep(Err(PreExecRefusal::Stale));
                    }
                    s.state.status = SessionStatus::Stale;
                    return Change::Touch(Err(PreExecRefusal::Stale));
                }
                if s.state.status == SessionStatus::Stale {
                    return Change::Keep(Err(PreExecRefusal::Stale));
                }
                if call_number <= s.last_call_number {
                    return Change::Keep(Err(PreExecRefusal::CallNumber(s.last_call_number)));
                }
                let repeat = s.state.repeat_count_for(call.tool_name, digest);
                let d = decide(&s.policy.config, &s.state, &call, now, rng);
                let record = ops::verdict(s, &call, &d, call_number, now);
                let decided = Decided {
                    decision: d,
                    after: record.budget_after,
                    repeat,
                };
                Change::Commit(Ok(decided), record.into())
            })
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?;
        let decided = match outcome {
            Ok(d) => d,
            Err(PreExecRefusal::Stale) => {
                return Err(refuse(
                    ErrorCode::SessionStale,
                    "session is stale: it missed its heartbeats; send a heartbeat to resume",
                ));
            }
            Err(PreExecRefusal::CallNumber(last)) => {
                return Err(refuse(
                    ErrorCode::InvalidRequest,
                    format!("call_number {} is not greater than {last}", r.call_number),
                ))
            }
        };
        // The verdict is sent only once its audit entry (the one durable record of the
        // state change) is durable.
        let entry = durable
            .await
            .map_err(|e| {
                refuse(
                    ErrorCode::DaemonUnavailable,
                    format!("verdict not durable: {e}"),
                )
            })?
            .ok_or_else(|| refuse(ErrorCode::DaemonUnavailable, "verdict not journaled"))?;
        let d = decided.decision;
        Ok(Payload::PreExecResponse(sp1::PreExecResponse {
            session_id: r.session_id,
            call_number: r.call_number,
            verdict: convert::verdict(d.verdict) as i32,
            deny_reason: convert::deny_reason(d.deny_reason) as i32,
            human_readable_reason: explain(&d),
            budget_remaining_usd: decided.after.to_usd(),
            repeat_count: i32::try_from(decided.repeat).unwrap_or(i32::MAX),
            daemon_time_ns: now,
            probabilistic_deny: d.probabilistic,
            reason: d.reason.as_str().to_owned(),
            budget_remaining_nanos: decided.after.0,
            audit_entry_id: entry.entry_id.to_string(),
        }))
    }

    async fn post_exec(&self, r: sp1::PostExecNotification, now: i64) -> Result<(), Refusal> {
        self.session_info(&r.session_id).await?;
        // The reported cost is settled as sent: a cost the core cannot read (NaN, ±∞,
        // negative) is charged as the estimate and flagged in the entry, never refunded.
        let error = !r.success || !r.error_message.is_empty();
        let error_signal = error && has_error_signal(&r.error_message);
        let (_, durable) = self
            .store
            .apply(&r.session_id, move |s: &mut Session| {
                let record = ops::settle(
                    s,
                    r.call_number,
                    r.actual_cost_usd,
                    r.success,
                    error_signal,
                    now,
                );
                Change::Commit((), record.into())
            })
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?;
        durable
            .await
            .map(|_| ())
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))
    }

    async fn heartbeat(&self, r: sp1::Heartbeat, now: i64) -> Result<Payload, Refusal> {
        self.session_info(&r.session_id).await?;
        let local = Money::from_usd(r.local_budget_remaining).ok();
        let ((remaining, status), _) = self
            .store
            .apply(&r.session_id, move |s: &mut Session| {
                s.last_heartbeat_ns = now;
                s.state.last_activity_ns = now;
                if s.state.status == SessionStatus::Stale {
                    s.state.status = live_status(&s.state);
                }
                Change::Touch((s.state.budget_remaining, s.state.status))
            })
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?;
        Ok(Payload::HeartbeatAck(sp1::HeartbeatAck {
            session_id: r.session_id,
            daemon_budget_remaining: remaining.to_usd(),
            drift_detected: local != Some(remaining),
            daemon_time_ns: now,
            status: convert::status(status) as i32,
        }))
    }

    async fn get_state(&self, id: &str, now: i64) -> Result<Payload, Refusal> {
        let info = self.session_info(id).await?;
        let mut s = self
            .store
            .get(id)
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?
            .ok_or_else(|| {
                refuse(
                    ErrorCode::SessionNotFound,
                    format!("unknown session `{id}`"),
                )
            })?;
        // Staleness is recorded when the session next calls; report it as of now.
        if now.saturating_sub(s.last_heartbeat_ns) > self.stale_after_ns() {
            s.state.status = SessionStatus::Stale;
        }
        let ident = convert::Identity {
            session_id: id,
            agent_id: &info.agent_id,
            organization_id: &info.organization_id,
        };
        Ok(Payload::SessionState(convert::session_state(
            ident,
            &s.state,
            &info.policy.config,
            s.last_call_number,
        )))
    }

    async fn hitl_list(&self, r: sp1::HitlListRequest) -> Result<Payload, Refusal> {
        let org = if r.organization_id.is_empty() {
            DEFAULT_ORG.to_owned()
        } else {
            r.organization_id
        };
        let sessions = self
            .store
            .pending_hitl(Some(&org))
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?;
        let pending = sessions
            .iter()
            .filter_map(|s| {
                s.state.pending.as_ref().map(|p| sp1::HitlPending {
                    session_id: s.meta.session_id.clone(),
                    agent_id: s.meta.agent_id.clone(),
                    organization_id: s.meta.organization_id.clone(),
                    transition: Some(convert::pending(p)),
                })
            })
            .collect();
        Ok(Payload::HitlListResponse(sp1::HitlListResponse { pending }))
    }

    async fn hitl_decide(&self, r: sp1::HitlDecideRequest, now: i64) -> Result<Payload, Refusal> {
        self.session_info(&r.session_id).await?;
        if r.operator_id.trim().is_empty() || r.operator_id.len() > 256 {
            return Err(refuse(
                ErrorCode::InvalidRequest,
                "operator_id must be 1 to 256 bytes",
            ));
        }
        let decision = HumanDecision::parse(&r.decision);
        let successor = match decision {
            HumanDecision::Modify => {
                let digest = Digest::from_slice(&r.successor_args_digest).ok_or_else(|| {
                    refuse(
                        ErrorCode::HitlRefused,
                        "modify needs a 32-byte successor_args_digest",
                    )
                })?;
                Some(Successor {
                    nonce: r.successor_nonce,
                    args_digest: digest,
                })
            }
            _ => None,
        };
        let operator = r.operator_id.clone();
        let (outcome, durable) = self
            .store
            .apply(
                &r.session_id,
                move |s: &mut Session| match ops::human_decision(
                    s, decision, successor, &operator, now,
                ) {
                    Ok(record) => Change::Commit(Ok(s.state.pending.clone()), record.into()),
                    Err(e) => Change::Keep(Err(e)),
                },
            )
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?;
        let pending = outcome.map_err(|e| refuse(ErrorCode::HitlRefused, e.to_string()))?;
        let entry = durable
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?
            .ok_or_else(|| refuse(ErrorCode::DaemonUnavailable, "decision not journaled"))?;
        tracing::info!(session = %r.session_id, operator = %r.operator_id, decision = %r.decision, "human decision recorded");
        Ok(Payload::HitlDecideResponse(sp1::HitlDecideResponse {
            session_id: r.session_id,
            transition: pending.as_ref().map(convert::pending),
            audit_entry_id: entry.entry_id.to_string(),
        }))
    }
}

/// An unauthenticated reply body: only ever an `Error`, sent before the daemon knows which
/// key to seal with (clients treat it as a failure, never a verdict).
fn unsealed(correlation: &str, received_ns: i64, payload: Payload) -> Vec<u8> {
    prost::Message::encode_to_vec(&reply_envelope(correlation, received_ns, payload))
}

/// The envelope of every reply: our version, a fresh id, the request's id as correlation.
fn reply_envelope(correlation: &str, received_ns: i64, payload: Payload) -> Envelope {
    Envelope {
        protocol_version: SUPPORTED_VERSIONS
            .first()
            .copied()
            .unwrap_or("1.0.0")
            .to_owned(),
        message_id: uuid::Uuid::now_v7().to_string(),
        correlation_id: correlation.to_owned(),
        client_timestamp_ns: 0,
        server_timestamp_ns: received_ns,
        hmac: Vec::new(),
        payload: Some(payload),
    }
}

/// The body of an unsealed `Error` reply, for the transport's own refusals (oversize
/// frames, timeouts, too many connections), which come before any request is read.
pub fn transport_error(code: ErrorCode, message: &str) -> Vec<u8> {
    unsealed(
        "",
        0,
        Payload::Error(sp1::Error {
            code: code as i32,
            message: message.to_owned(),
            retry_after_ms: 0,
        }),
    )
}

/// What a pre-exec closure decided.
#[derive(Debug, Clone, Copy)]
struct Decided {
    decision: Decision,
    after: Money,
    repeat: u32,
}

fn info_for(session: &Session) -> SessionInfo {
    SessionInfo {
        organization_id: session.meta.organization_id.clone(),
        agent_id: session.meta.agent_id.clone(),
        policy: session.policy.clone(),
    }
}

#[derive(Debug, Clone, Copy)]
enum PreExecRefusal {
    Stale,
    CallNumber(u64),
}

/// The status a session returns to when it heartbeats again.
fn live_status(s: &SessionState) -> SessionStatus {
    if s.pending.is_some() {
        SessionStatus::Paused
    } else {
        SessionStatus::Active
    }
}

/// The core's view of a wire request. Inputs the core cannot trust are mapped to
/// `Params::unreadable()`, which `decide` denies as malformed input.
fn to_call(r: &sp1::PreExecRequest) -> ToolCall<'_> {
    let cost = Money::from_usd_non_negative(r.estimated_cost_usd);
    let params = match (Digest::from_slice(&r.tool_params_hash), &cost) {
        _ if r.params_noncanonical => Params::unreadable(),
        (Some(d), Ok(_)) => {
            if r.params_opaque_context {
                Params::digest_with_opaque_context(d)
            } else {
                Params::digest(d)
            }
        }
        _ => Params::unreadable(),
    };
    ToolCall {
        tool_name: &r.tool_name,
        params,
        nonce: (r.nonce != 0).then_some(r.nonce),
        estimated_cost: cost.unwrap_or(Money::ZERO),
        raw_params: None,
    }
}

fn explain(d: &Decision) -> String {
    let what = match d.reason {
        Reason::WithinThresholds => "within every configured limit",
        Reason::CircuitOpen => "the session's circuit is open after an earlier denial",
        Reason::BudgetExhausted if d.probabilistic => "budget exhausted",
        Reason::BudgetExhausted => "budget exhausted",
        Reason::BudgetOverrun => "the estimated cost exceeds the remaining budget",
        Reason::MaxRepeatExceeded => "the same call repeated past the limit",
        Reason::MalformedInput => "the call's inputs cannot be canonicalized",
        Reason::DuplicateNonce => "the nonce was already used (replay)",
        Reason::DuplicateResumeNoEffect => "re-dispatch of a decided transition has no effect",
        Reason::TransitionApprove => "released by a human approval",
        Reason::TransitionModifySuccessor => "released as the human-modified call",
        Reason::TransitionReject => "a human rejected the call",
        Reason::TransitionSupersededOriginal => {
            "a human modified the call; the original cannot run"
        }
        Reason::TransitionTerminalNoEffect => "the approval was already used or withdrawn",
        Reason::TransitionNonceMismatch => "not the call a human approved (nonce)",
        Reason::TransitionDigestMismatch => "not the arguments a human approved",
        Reason::TransitionUnboundAuthorization => "the approval binds no call",
        Reason::TransitionUnknownDecision => "the human decision is not understood",
        Reason::TransitionDeferEscalate => "awaiting a human decision",
        Reason::HitlAllCalls => "every call needs a human decision",
        Reason::BudgetThreshold => "budget at or below the human-review threshold",
        Reason::OpaqueContext => "context cannot be evaluated; a human must decide",
        Reason::WindowExceeded => "too many calls of this tool in the current window",
        Reason::GlobalLimit => "the session's call limit is reached",
        Reason::Timeout => "the session's time limit has passed",
    };
    what.to_owned()
}

/// SemVer negotiation: the same MAJOR is compatible, and the lower of the two versions is
/// spoken. The client offers `supported` (or just its envelope's version).
fn negotiate(envelope_version: &str, supported: &[String]) -> Result<String, Refusal> {
    let offered: Vec<&str> = if supported.is_empty() {
        vec![envelope_version]
    } else {
        supported.iter().map(String::as_str).collect()
    };
    let mut best: Option<(u64, u64, u64)> = None;
    for o in &offered {
        let Some(theirs) = parse_semver(o) else {
            continue;
        };
        for ours in SUPPORTED_VERSIONS.iter().filter_map(|v| parse_semver(v)) {
            if theirs.0 == ours.0 {
                let pick = theirs.min(ours);
                if best.is_none_or(|b| pick > b) {
                    best = Some(pick);
                }
            }
        }
    }
    best.map(|(a, b, c)| format!("{a}.{b}.{c}")).ok_or_else(|| {
        refuse(
            ErrorCode::ProtocolVersionMismatch,
            format!(
                "no common protocol version: offered {offered:?}, daemon speaks {SUPPORTED_VERSIONS:?}"
            ),
        )
    })
}

fn check_major(version: &str) -> Result<(), Refusal> {
    let ours = SUPPORTED_VERSIONS.iter().filter_map(|v| parse_semver(v));
    match parse_semver(version) {
        Some(v) if ours.clone().any(|o| o.0 == v.0) => Ok(()),
        _ => Err(refuse(
            ErrorCode::ProtocolVersionMismatch,
            format!("protocol version `{version}` is not spoken here"),
        )),
    }
}

fn parse_semver(v: &str) -> Option<(u64, u64, u64)> {
    let mut it = v.trim().splitn(3, '.');
    let a = it.next()?.parse().ok()?;
    let b = it.next()?.parse().ok()?;
    let c = it.next()?.split(['-', '+']).next()?.parse().ok()?;
    Some((a, b, c))
}

fn new_session_id() -> String {
    let mut b = [0u8; 16];
    let _ = getrandom::fill(&mut b);
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("s_{hex}")
}

/// A uniform draw in [0, 1) for the probabilistic layer. If the system cannot supply
/// randomness the draw is 0.0, which denies whenever the layer is armed (fail closed).
fn random_unit() -> f64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        return 0.0;
    }
    tollgate_core::draw_from_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_negotiation() {
        assert_eq!(negotiate("1.0.0", &[]).unwrap(), "1.0.0");
        assert_eq!(negotiate("1.2.0", &[]).unwrap(), "1.0.0");
        assert_eq!(
            negotiate("x", &["2.0.0".into(), "1.1.0".into()]).unwrap(),
            "1.0.0"
        );
        assert_eq!(
            negotiate("2.0.0", &[]).unwrap_err().code,
            ErrorCode::ProtocolVersionMismatch
        );
        assert_eq!(
            negotiate("garbage", &[]).unwrap_err().code,
            ErrorCode::ProtocolVersionMismatch
        );
        assert!(check_major("1.9.3").is_ok());
        assert!(check_major("").is_err());
    }

    #[test]
    fn random_draws_are_in_range() {
        for _ in 0..1000 {
            let x = random_unit();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
