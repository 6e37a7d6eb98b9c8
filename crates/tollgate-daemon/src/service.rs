//! The protocol, independent of the transport: an authenticated request in, a response out.
//!
//! Every transport (`crate::transport`) authenticates its peer first and names it as a
//! [`Caller`]; then it calls the one handler for the request here, so decisions, state,
//! audit and errors are the same whichever way a request came. Every verdict is decided and
//! applied by `tollgate_store::rules::decide` (the one decision path the library guard
//! shares: `tollgate_core::decide`, or, while a policy set is in force,
//! `tollgate_policy::compose::decide`, the guards and the policies together; with no set
//! the verdict is exactly the guards'), atomically in the store, and returned only once
//! its audit entry (the one durable record of the change) is durable.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use tollgate_audit::{CloseReason, PolicySetCause, PolicySetRecord};
use tollgate_core::signals::has_error_signal;
use tollgate_core::{
    Decision, Digest, Money, Params, Reason, SessionState, SessionStatus, ToolCall, UnixNanos,
};
use tollgate_policy::compose::Enforced;
use tollgate_policy::Actor;
use tollgate_proto::sp1::{self, ErrorCode};
use tollgate_proto::{MessageKey, SUPPORTED_VERSIONS};
use tollgate_store::rules::{self, Rules};
use tollgate_store::{ops, Change, Policy, Session, SessionMeta, SessionStore};

use crate::config::{DaemonConfig, DEFAULT_ORG};
use crate::convert;
use crate::ratelimit::RateLimiter;

/// Where a daemon's audit trail goes, as the service sees it beside the store's journal:
/// counters for `/metrics`, and a flush at shutdown. The file writer is one; the fleet's
/// PostgreSQL journal another.
pub trait AuditSink: Send + Sync + std::fmt::Debug + 'static {
    /// The sink's counters.
    fn stats(&self) -> tollgate_audit::Stats;
    /// Write out everything accepted, then refuse more. Idempotent.
    fn shutdown(&self) -> Result<(), tollgate_audit::WriteError>;
    /// Write a policy-set entry (record kind 9, audit format version 6); the handle
    /// completes once it is durable. `Err` when this sink cannot record one.
    fn policy_set(
        &self,
        record: PolicySetRecord,
    ) -> Result<tollgate_audit::Pending<tollgate_audit::Appended>, String>;
}

impl AuditSink for tollgate_audit::Writer {
    fn stats(&self) -> tollgate_audit::Stats {
        tollgate_audit::Writer::stats(self)
    }

    fn shutdown(&self) -> Result<(), tollgate_audit::WriteError> {
        tollgate_audit::Writer::shutdown(self)
    }

    fn policy_set(
        &self,
        record: PolicySetRecord,
    ) -> Result<tollgate_audit::Pending<tollgate_audit::Appended>, String> {
        Ok(self.submit_policy_set(record))
    }
}

impl AuditSink for tollgate_pg::PgJournal {
    fn stats(&self) -> tollgate_audit::Stats {
        tollgate_pg::PgJournal::stats(self)
    }

    fn shutdown(&self) -> Result<(), tollgate_audit::WriteError> {
        tollgate_pg::PgJournal::shutdown(self)
    }

    /// In the daemon's own chain (format version 6; a chain registered in an earlier
    /// version refuses it, naming the chain).
    fn policy_set(
        &self,
        record: PolicySetRecord,
    ) -> Result<tollgate_audit::Pending<tollgate_audit::Appended>, String> {
        Ok(self.submit_policy_set(record))
    }
}

/// The longest tool name accepted. Tool names are stored in session state and written to
/// the audit log (whose string fields hold at most 1024 bytes), so they are bounded here,
/// before anything is decided or stored.
pub const MAX_TOOL_NAME_BYTES: usize = 256;

/// The daemon's version, reported at registration.
pub const DAEMON_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Who is on the other end of a connection (registrations are rate-limited per
/// organization and peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer {
    /// The peer's uid (Unix sockets), or 0 when unknown.
    pub uid: u32,
    /// The SHA-256 of the peer's client certificate (gRPC): its identity, the key its
    /// registrations are limited by there. `None` on the Unix socket.
    pub certificate: Option<[u8; 32]>,
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

/// Who sent a request, as its transport authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// An agent of one organization: a socket message sealed with the organization's
    /// agents' key, or a gRPC client whose certificate maps to the organization.
    Agent {
        /// The organization.
        organization: String,
        /// The agent the credential names, when it names one (an enrolled agent's own
        /// socket secret, or a gRPC certificate naming `spiffe://ORG/AGENT`); `None` for
        /// the organization's agents' secret, whose holder's agent id is a claim.
        agent: Option<String>,
    },
    /// A human operator: a socket message sealed with an organization's operators' key
    /// (the operator id then comes from the request), or a control-plane token bound to
    /// organizations and to an operator id.
    Operator {
        /// The organizations whose sessions the operator may see and decide.
        organizations: Vec<String>,
        /// The operator's id, when the credential names one (it then overrides the one a
        /// request carries).
        operator_id: Option<String>,
    },
}

impl Caller {
    fn is_operator_of(&self, org: &str) -> bool {
        matches!(self, Caller::Operator { organizations, .. } if organizations.iter().any(|o| o == org))
    }
}

/// What the daemon remembers of a live session, beside the store: who it belongs to and
/// the policy it runs under (fixed when it was opened).
#[derive(Debug, Clone)]
pub(crate) struct SessionInfo {
    pub(crate) organization_id: String,
    pub(crate) agent_id: String,
    pub(crate) policy: Arc<Policy>,
    /// The session's principal in the policy set last in force for it, built once per
    /// session and set (building Cedar's entities costs more than most evaluations);
    /// shared by the clones of this info.
    actor: Arc<Mutex<Option<Arc<Actor>>>>,
}

impl SessionInfo {
    /// The session's principal (and the local resource) in `set`: the one built for it
    /// before, or a new one. `None` when the ids are too long for a principal (the call
    /// then fails closed).
    fn actor(&self, set: &Enforced) -> Option<Arc<Actor>> {
        let mut slot = lock(&self.actor);
        if let Some(a) = slot.as_ref().filter(|a| a.is_for(&set.policies)) {
            return Some(a.clone());
        }
        let a = Arc::new(set.policies.actor(
            &self.organization_id,
            &self.agent_id,
            tollgate_policy::LOCAL_UPSTREAM,
        )?);
        *slot = Some(a.clone());
        Some(a)
    }
}

/// The protocol engine.
pub struct Service<S> {
    pub(crate) config: Arc<DaemonConfig>,
    pub(crate) store: S,
    audit: Arc<dyn AuditSink>,
    clock: Arc<dyn Clock>,
    /// The policy new sessions get: per configured agent, and the default.
    agent_policies: HashMap<String, Arc<Policy>>,
    default_policy: Arc<Policy>,
    /// Agents' keys, by organization (the socket binding's credential).
    pub(crate) keys: HashMap<String, MessageKey>,
    /// Operators' keys, by organization: human decisions over the socket need one.
    pub(crate) operator_keys: HashMap<String, MessageKey>,
    /// Enrolled agents' own keys, by organization and agent (agents with a socket secret).
    pub(crate) agent_keys: HashMap<(String, String), MessageKey>,
    sessions: Mutex<HashMap<String, SessionInfo>>,
    /// Live sessions by organization, for `[[organization]] max_sessions`: a registration
    /// reserves its place here before the store opens the session, and an end gives it
    /// back. Counted from the store at start ([`Service::recount`]).
    live: Mutex<HashMap<String, usize>>,
    pre_exec_limits: Mutex<RateLimiter<String>>,
    /// Registrations per organization and peer (a socket peer's uid, a gRPC peer's
    /// certificate identity): one organization's burst does not spend another's.
    register_limits: Mutex<RateLimiter<(String, Peer)>>,
    /// Held calls' params and modify successors' params (in memory: a restart forgets them,
    /// and the console then shows the digest alone).
    pub(crate) held: Mutex<crate::hitl::HeldMap>,
    /// HITL events for operators' consoles and waiting agents.
    pub(crate) events: tokio::sync::broadcast::Sender<crate::hitl::HitlEvent>,
    /// The policy set in force (`[policy]`), if any: every call reads it once, so a
    /// reload decides every session's next call.
    policies: RwLock<Option<Arc<Enforced>>>,
    /// Reloads one at a time (each reads the files, records the set, then swaps it in).
    reloading: tokio::sync::Mutex<()>,
    /// The recent part of the audit log, indexed for consoles (sessions' last calls, the
    /// decisions' history), and agents' stated purposes.
    pub(crate) activity: Arc<crate::activity::Activity>,
}

impl<S> std::fmt::Debug for Service<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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

pub(crate) fn refuse(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
        retry_after_ms: 0,
    }
}

impl<S: SessionStore> Service<S> {
    /// A service over `store`, whose journal is `audit` (the store writes every change's
    /// entry there; the service uses the writer for shutdown and metrics), with message
    /// keys derived from the organizations' secrets: `secrets` for agents and
    /// `operator_secrets` for the humans who decide, one each per organization id.
    pub fn new(
        config: Arc<DaemonConfig>,
        store: S,
        audit: Arc<dyn AuditSink>,
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
        let agent_keys = config
            .enrollment
            .iter()
            .flat_map(|(org, e)| {
                e.agents.iter().filter_map(move |(agent, secret)| {
                    secret
                        .as_ref()
                        .map(|s| ((org.clone(), agent.clone()), MessageKey::derive(s)))
                })
            })
            .collect();
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
            agent_keys,
            sessions: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            events: tokio::sync::broadcast::channel(1024).0,
            policies: RwLock::new(None),
            reloading: tokio::sync::Mutex::new(()),
            activity: Arc::new(crate::activity::Activity::unavailable()),
        }
    }

    /// The service, with `activity` as its index of the audit log (fed by the caller: the
    /// log's tail at start, then the writer's tap).
    pub fn with_activity(mut self, activity: Arc<crate::activity::Activity>) -> Service<S> {
        self.activity = activity;
        self
    }

    /// The configuration key of the guard a session of `agent` was opened under, by the
    /// guard's digest: `[guard.agents.AGENT]`, `[guard.default]`, or neither (the
    /// configuration changed since).
    pub(crate) fn guard_key(&self, agent: &str, digest: &Digest) -> Option<String> {
        match self.agent_policies.get(agent) {
            Some(p) if p.digest == *digest => Some(format!("[guard.agents.{agent}]")),
            None if self.default_policy.digest == *digest => Some("[guard.default]".into()),
            _ => None,
        }
    }

    /// `PolicyReload`: an operator asks the daemon to reload its `[policy]` set
    /// ([`Service::reload_policies`]). Refused for agents; a set that does not load is
    /// `INVALID_REQUEST` with the loader's findings, and the set in force stays.
    pub async fn policy_reload(
        &self,
        caller: &Caller,
    ) -> Result<sp1::PolicyReloadResponse, Refusal> {
        if !matches!(caller, Caller::Operator { .. }) {
            return Err(refuse(
                ErrorCode::AuthenticationFailed,
                "only an operator may reload the policy set",
            ));
        }
        match self.reload_policies().await {
            Ok(set) => Ok(sp1::PolicyReloadResponse {
                digest: set.policies.digest().to_string(),
                policies: u32::try_from(set.policies.len()).unwrap_or(u32::MAX),
            }),
            Err(e @ crate::policy::PolicyError::NotRecorded { .. }) => {
                Err(refuse(ErrorCode::DaemonUnavailable, e.to_string()))
            }
            Err(e) => Err(refuse(ErrorCode::InvalidRequest, e.to_string())),
        }
    }

    /// The policy set in force, if any.
    pub fn policies(&self) -> Option<Arc<Enforced>> {
        self.policies
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Put `set` in force after recording it (a policy-set entry of `cause`, durable
    /// before the set decides anything), and return it. On error nothing changes.
    pub async fn install_policies(
        &self,
        set: Enforced,
        cause: PolicySetCause,
    ) -> Result<Arc<Enforced>, crate::policy::PolicyError> {
        let record = crate::policy::set_record(&set, cause, self.now());
        let digest = record.digest;
        let not_recorded =
            |message: String| crate::policy::PolicyError::NotRecorded { digest, message };
        self.audit
            .policy_set(record)
            .map_err(not_recorded)?
            .await
            .map_err(|e| not_recorded(e.to_string()))?;
        let set = Arc::new(set);
        *self
            .policies
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(set.clone());
        tracing::info!(%digest, ?cause, "policy set in force");
        Ok(set)
    }

    /// Reload `[policy]` (SIGHUP, `tollgate policy reload`): read and load the same files
    /// again; a set that does not load, or cannot be recorded, is refused and the set in
    /// force stays. A set that loads is recorded and decides every session's next call.
    /// Returns the set now in force.
    pub async fn reload_policies(&self) -> Result<Arc<Enforced>, crate::policy::PolicyError> {
        let Some(settings) = self.config.policy.clone() else {
            return Err(crate::policy::PolicyError::NotConfigured);
        };
        let _one = self.reloading.lock().await;
        let set = tokio::task::spawn_blocking(move || crate::policy::enforced(&settings))
            .await
            .map_err(|e| crate::policy::PolicyError::Read(e.to_string()))??;
        self.install_policies(set, PolicySetCause::Reload).await
    }

    /// The daemon's clock reading.
    pub fn now(&self) -> UnixNanos {
        self.clock.now_ns()
    }

    /// The configuration in force.
    pub fn config(&self) -> &DaemonConfig {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Where the audit trail is written.
    pub fn audit(&self) -> &dyn AuditSink {
        &*self.audit
    }

    /// The policy a new session of `agent` runs under.
    fn policy_for(&self, agent: &str) -> Arc<Policy> {
        self.agent_policies
            .get(agent)
            .unwrap_or(&self.default_policy)
            .clone()
    }

    /// The session's organization, for a transport choosing how to authenticate a request
    /// about it. `SESSION_NOT_FOUND` for an unknown session.
    pub async fn session_organization(&self, id: &str) -> Result<String, Refusal> {
        Ok(self.session_info(id).await?.organization_id)
    }

    /// The session's organization and agent, for a transport choosing which key seals a
    /// request about it (an enrolled agent's own). `SESSION_NOT_FOUND` for an unknown
    /// session.
    pub async fn session_owner(&self, id: &str) -> Result<(String, String), Refusal> {
        let info = self.session_info(id).await?;
        Ok((info.organization_id, info.agent_id))
    }

    /// Whether `agent` is enrolled in `org` (`[[organization.agent]]`).
    pub fn is_enrolled(&self, org: &str, agent: &str) -> bool {
        self.config
            .enrollment
            .get(org)
            .is_some_and(|e| e.agents.contains_key(agent))
    }

    /// May `caller` act as agent `agent` of `org`? Its credential must be one of the
    /// organization's agents'; a credential that names an agent acts as that agent only;
    /// an enrolled agent only with its own credential; and, where the organization
    /// requires enrollment, only enrolled agents with their own credentials. The refusal
    /// says which, as `AUTHENTICATION_FAILED`.
    pub(crate) fn authorize_agent(
        &self,
        caller: &Caller,
        org: &str,
        agent: &str,
    ) -> Result<(), Refusal> {
        let auth = |m: String| refuse(ErrorCode::AuthenticationFailed, m);
        let Caller::Agent {
            organization,
            agent: named,
        } = caller
        else {
            return Err(auth("message authentication failed".into()));
        };
        if organization != org {
            return Err(auth("message authentication failed".into()));
        }
        let required = self.config.enrollment.get(org).is_some_and(|e| e.required);
        let enrolled = self.is_enrolled(org, agent);
        match named {
            Some(n) if n != agent => Err(auth(format!(
                "this credential is agent `{n}`'s; it cannot act as `{agent}`"
            ))),
            Some(_) if required && !enrolled => Err(auth(format!(
                "organization `{org}` requires enrolled agents, and `{agent}` is not enrolled"
            ))),
            Some(_) => Ok(()),
            None if enrolled => Err(auth(format!(
                "agent `{agent}` is enrolled: only its own credential may act as it"
            ))),
            None if required => Err(auth(format!(
                "organization `{org}` requires enrolled agents, each with its own credential; `{agent}` is not enrolled"
            ))),
            None => Ok(()),
        }
    }

    /// The session, if `caller` may act on it as an agent: an agent of its organization.
    /// Anyone else is told the session does not exist (an agent of another organization
    /// learns nothing about it).
    pub(crate) async fn agent_session(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<SessionInfo, Refusal> {
        let info = self.session_info(id).await?;
        if self
            .authorize_agent(caller, &info.organization_id, &info.agent_id)
            .is_err()
        {
            return Err(not_found(id));
        }
        Ok(info)
    }

    /// The session, if `caller` operates its organization.
    pub(crate) async fn operated_session(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<SessionInfo, Refusal> {
        let info = self.session_info(id).await?;
        if !caller.is_operator_of(&info.organization_id) {
            return Err(not_found(id));
        }
        Ok(info)
    }

    pub(crate) async fn session_info(&self, id: &str) -> Result<SessionInfo, Refusal> {
        if let Some(info) = lock(&self.sessions).get(id) {
            return Ok(info.clone());
        }
        valid_id("session_id", id)?;
        let session = self
            .store
            .get(id)
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?
            .ok_or_else(|| not_found(id))?;
        let info = info_for(&session);
        lock(&self.sessions).insert(id.to_owned(), info.clone());
        Ok(info)
    }

    /// `register`: a new session, or the resumption of one. `caller` must be an agent of
    /// the organization the request names (an empty name: the caller's).
    pub async fn register(
        &self,
        caller: &Caller,
        r: sp1::RegisterRequest,
        envelope_version: &str,
        peer: Peer,
        now: i64,
    ) -> Result<sp1::RegisterResponse, Refusal> {
        let negotiated = negotiate(envelope_version, &r.supported_versions)?;
        valid_id("agent_id", &r.agent_id)?;
        if !r.organization_id.is_empty() {
            valid_id("organization_id", &r.organization_id)?;
        }
        if !r.session_id.is_empty() {
            valid_id("session_id", &r.session_id)?;
        }
        let org = match (r.organization_id.is_empty(), caller) {
            (false, _) => r.organization_id.clone(),
            (true, Caller::Agent { organization, .. }) => organization.clone(),
            (true, Caller::Operator { .. }) => DEFAULT_ORG.to_owned(),
        };
        // The guard and the per_agent budget follow the authenticated id: an enrolled
        // agent's id only with its own credential, a credential naming an agent only as it.
        self.authorize_agent(caller, &org, &r.agent_id)?;
        // Limited per organization and peer, once the caller is known to be the
        // organization's: one organization's burst cannot spend another's allowance.
        if let Err(wait) = lock(&self.register_limits).check(&(org.clone(), peer), Instant::now()) {
            return Err(Refusal {
                code: ErrorCode::RateLimited,
                message: format!("too many registrations from this peer for organization `{org}`"),
                retry_after_ms: wait,
            });
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
                .map_err(|e| self.store_refusal(&r.session_id, e))?;
            if let Some(p) = r.metadata.get("purpose") {
                self.activity.set_purpose(&r.session_id, p);
            }
            let id = convert::Identity {
                session_id: &r.session_id,
                agent_id: &info.agent_id,
                organization_id: &info.organization_id,
            };
            return Ok(sp1::RegisterResponse {
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
            });
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
        let mut session = Session::new(meta, policy.clone(), now);
        if let Some(set) = self.policies() {
            if set
                .policies
                .actor(&org, &r.agent_id, tollgate_policy::LOCAL_UPSTREAM)
                .is_none()
            {
                return Err(refuse(
                    ErrorCode::InvalidRequest,
                    "organization and agent ids are too long for the policies' principal",
                ));
            }
            session.policy_set = Some(set.policies.digest());
        }
        let info = info_for(&session);
        let place = self.reserve_place(&org)?;
        let (state, durable) = self.store.create(session, now).await.map_err(|e| match e {
            tollgate_store::StoreError::SessionCap { .. } => {
                refuse(ErrorCode::OrganizationQuotaExceeded, e.to_string())
            }
            other => refuse(ErrorCode::DaemonUnavailable, other.to_string()),
        })?;
        // The session exists once its session-opened entry is durable.
        durable.await.map_err(store_err)?;
        place.keep();
        lock(&self.sessions).insert(session_id.clone(), info);
        if let Some(p) = r.metadata.get("purpose") {
            self.activity.set_purpose(&session_id, p);
        }
        tracing::info!(%session_id, agent = %r.agent_id, %org, "session registered");
        let id = convert::Identity {
            session_id: &session_id,
            agent_id: &r.agent_id,
            organization_id: &org,
        };
        Ok(sp1::RegisterResponse {
            session_id: session_id.clone(),
            daemon_version: DAEMON_VERSION.into(),
            negotiated_protocol: negotiated,
            active_config: Some(convert::guard(&policy.config)),
            daemon_time_ns: now,
            resumed: false,
            state: Some(convert::session_state(id, &state, &policy.config, 0)),
        })
    }

    pub(crate) fn stale_after_ns(&self) -> i64 {
        let l = &self.config.limits;
        let ns = l.heartbeat_interval.as_nanos() * u128::from(l.missed_heartbeats_for_stale);
        i64::try_from(ns).unwrap_or(i64::MAX)
    }

    /// `pre_exec`: decide a proposed call. `caller` must be an agent of the session's
    /// organization.
    pub async fn pre_exec(
        &self,
        caller: &Caller,
        r: sp1::PreExecRequest,
        now: i64,
    ) -> Result<sp1::PreExecResponse, Refusal> {
        let _timer = crate::metrics::pre_exec_timer();
        let info = self.agent_session(caller, &r.session_id).await?;
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
        // Params sent beside their hash must be the params hashed: else the client lied,
        // and the call is malformed input (a DENY that trips the circuit). Parsed once:
        // the policies read them as `context.args`.
        let (lied, args, digest) = match crate::policy::sent_params(&r)? {
            crate::policy::SentParams::Mismatch => (true, None, None),
            crate::policy::SentParams::Match(v, d) => (false, Some(v), Some(d)),
            crate::policy::SentParams::None => (false, None, None),
        };
        // What the verdict records of the params (`[audit] params`), computed outside the
        // session lock, with the digest `sent_params` checked them against; recorded only
        // on an entry whose params_hash is that digest.
        let recorded = args
            .as_ref()
            .zip(digest)
            .and_then(|(a, d)| Some((d, self.config.audit.params.record(a)?)));
        // The set in force for this call (a reload decides the next one), and the
        // session's principal in it (built outside the session lock).
        let enforced = self.policies();
        let actor = enforced.as_ref().and_then(|e| info.actor(e));
        // The call is read from the request once, outside the session lock; the closure
        // borrows it.
        let mut call = to_call(&r);
        if lied {
            call.params = Params::unreadable();
        }
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
                // The held call a release spends (its own number, for consoles and the
                // daemon's record of its params).
                let released = s
                    .state
                    .answering_transition(s.policy.config.parallel_holds(), call.nonce)
                    .map_or(call_number, |p| p.call_number);
                // A principal the set cannot name (ids too long: registration refuses
                // them) is refused by `rules::decide` itself.
                let rules = enforced.as_deref().map(|set| Rules {
                    set,
                    actor: actor.as_deref(),
                });
                let out = rules::decide(s, rules, &call, args.as_ref(), call_number, now, rng);
                let decided = Decided {
                    decision: out.decision,
                    after: out.record.budget_after,
                    repeat,
                    released,
                    policy_reason: out.policy_reason(),
                    policy_text: out.policy_explanation(),
                    shadow: out.record.shadow.clone(),
                };
                let mut record = out.record;
                record.params = recorded
                    .as_ref()
                    .filter(|(digest, _)| *digest == record.params_hash)
                    .map(|(_, p)| p.clone());
                Change::Commit(Ok(decided), record.into())
            })
            .await
            .map_err(|e| self.store_refusal(&r.session_id, e))?;
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
        crate::metrics::verdict(d.verdict, d.reason);
        crate::metrics::shadow(d.verdict, &decided.shadow);
        let released_by_human = matches!(
            d.reason,
            Reason::TransitionApprove | Reason::TransitionModifySuccessor
        );
        if d.verdict == tollgate_core::Verdict::Hitl {
            if let Some(p) = r.tags.get("purpose") {
                self.activity
                    .set_call_purpose(&r.session_id, r.call_number, p);
            }
            self.announce_held(&info, &r.session_id, r.call_number)
                .await;
        } else if released_by_human {
            {
                let mut held = lock(&self.held);
                if let Some(calls) = held.get_mut(&r.session_id) {
                    calls.remove(&decided.released);
                    if calls.is_empty() {
                        held.remove(&r.session_id);
                    }
                }
            }
            let _ = self.events.send(crate::hitl::HitlEvent::Resolved {
                organization_id: info.organization_id.clone(),
                session_id: r.session_id.clone(),
                call_number: decided.released,
                outcome: "released".into(),
                operator_id: String::new(),
            });
        }
        Ok(sp1::PreExecResponse {
            session_id: r.session_id,
            call_number: r.call_number,
            verdict: convert::verdict(d.verdict) as i32,
            deny_reason: convert::deny_reason(d.deny_reason) as i32,
            human_readable_reason: if lied && d.reason == Reason::MalformedInput {
                "tool_params do not hash to tool_params_hash".to_owned()
            } else if let Some(text) = decided.policy_text {
                text
            } else {
                explain(&d)
            },
            budget_remaining_usd: decided.after.to_usd(),
            repeat_count: i32::try_from(decided.repeat).unwrap_or(i32::MAX),
            daemon_time_ns: now,
            probabilistic_deny: d.probabilistic,
            // A policy's verdict names the policy (`policy:<id>`, ...), as its audit
            // entry's note does.
            reason: decided
                .policy_reason
                .unwrap_or_else(|| d.reason.as_str().to_owned()),
            budget_remaining_nanos: decided.after.0,
            audit_entry_id: entry.entry_id.to_string(),
        })
    }

    /// `post_exec`: settle a call's reported cost. `caller` must be an agent of the
    /// session's organization.
    pub async fn post_exec(
        &self,
        caller: &Caller,
        r: sp1::PostExecNotification,
        now: i64,
    ) -> Result<(), Refusal> {
        self.agent_session(caller, &r.session_id).await?;
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
            .map_err(|e| self.store_refusal(&r.session_id, e))?;
        durable
            .await
            .map(|_| ())
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))
    }

    /// `heartbeat`: the session is alive; report the daemon's budget. `caller` must be an
    /// agent of the session's organization.
    pub async fn heartbeat(
        &self,
        caller: &Caller,
        r: sp1::Heartbeat,
        now: i64,
    ) -> Result<sp1::HeartbeatAck, Refusal> {
        self.agent_session(caller, &r.session_id).await?;
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
            .map_err(|e| self.store_refusal(&r.session_id, e))?;
        Ok(sp1::HeartbeatAck {
            session_id: r.session_id,
            daemon_budget_remaining: remaining.to_usd(),
            drift_detected: local != Some(remaining),
            daemon_time_ns: now,
            status: convert::status(status) as i32,
        })
    }

    /// `get_session_state`: the daemon's view of a session, for an agent or an operator of
    /// its organization.
    pub async fn session_state(
        &self,
        caller: &Caller,
        id: &str,
        now: i64,
    ) -> Result<sp1::SessionState, Refusal> {
        let info = self.session_info(id).await?;
        let as_agent = self
            .authorize_agent(caller, &info.organization_id, &info.agent_id)
            .is_ok();
        if !as_agent && !caller.is_operator_of(&info.organization_id) {
            return Err(not_found(id));
        }
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
        Ok(convert::session_state(
            ident,
            &s.state,
            &info.policy.config,
            s.last_call_number,
        ))
    }
}

/// A place among an organization's live sessions, given back when dropped unless kept.
struct Place<'a> {
    live: Option<(&'a Mutex<HashMap<String, usize>>, String)>,
}

impl Place<'_> {
    fn keep(mut self) {
        self.live = None;
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if let Some((live, org)) = self.live.take() {
            let mut m = lock(live);
            if let Some(n) = m.get_mut(&org) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

impl<S: SessionStore> Service<S> {
    /// Count the store's live sessions by organization (at start, before serving).
    pub async fn recount(&self) -> Result<(), tollgate_store::StoreError> {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for s in self.store.list(None).await? {
            *counts.entry(s.meta.organization_id).or_default() += 1;
        }
        *lock(&self.live) = counts;
        Ok(())
    }

    /// Live sessions of `org`, as counted here.
    pub fn live_sessions(&self, org: &str) -> usize {
        lock(&self.live).get(org).copied().unwrap_or(0)
    }

    /// Reserve a place for a new session of `org` under its quota
    /// (`ORGANIZATION_QUOTA_EXCEEDED` when full).
    fn reserve_place(&self, org: &str) -> Result<Place<'_>, Refusal> {
        let mut live = lock(&self.live);
        let n = live.entry(org.to_owned()).or_default();
        if let Some(max) = self.config.session_quotas.get(org) {
            if *n >= *max {
                return Err(refuse(
                    ErrorCode::OrganizationQuotaExceeded,
                    format!(
                        "organization `{org}` has {max} live sessions, its quota: close one first"
                    ),
                ));
            }
        }
        *n += 1;
        Ok(Place {
            live: Some((&self.live, org.to_owned())),
        })
    }

    /// What the daemon keeps of an ended session goes: its cached identity, its held
    /// calls' params (operators and waiting agents are told), its place in its
    /// organization's quota.
    fn forget_session(&self, id: &str, organization_id: &str, held_calls: &[u64]) {
        // Called exactly once per session: after the change that ended it.
        self.forget_cached(id);
        if let Some(n) = lock(&self.live).get_mut(organization_id) {
            *n = n.saturating_sub(1);
        }
        for &call_number in held_calls {
            let _ = self.events.send(crate::hitl::HitlEvent::Resolved {
                organization_id: organization_id.to_owned(),
                session_id: id.to_owned(),
                call_number,
                outcome: "closed".into(),
                operator_id: String::new(),
            });
        }
    }

    /// A store error about session `id`: an unknown session (ended meanwhile, maybe by
    /// another daemon) is `SESSION_NOT_FOUND`, and the daemon forgets what it cached of it.
    pub(crate) fn store_refusal(&self, id: &str, e: tollgate_store::StoreError) -> Refusal {
        match e {
            tollgate_store::StoreError::NotFound { .. } => {
                self.forget_cached(id);
                not_found(id)
            }
            other => refuse(ErrorCode::DaemonUnavailable, other.to_string()),
        }
    }

    /// Drop what this daemon caches of session `id`: its identity and its held calls'
    /// params.
    fn forget_cached(&self, id: &str) {
        lock(&self.sessions).remove(id);
        lock(&self.held).remove(id);
    }

    /// `close_session`: the agent ends its session. Audited (a session-closed entry,
    /// reason `agent`) before the answer; then nothing more is decided on it, it cannot
    /// be resumed, and it leaves the store, the snapshot and its organization's quota. A
    /// held call of it is withdrawn with it (operators and waiting agents are told).
    pub async fn close_session(
        &self,
        caller: &Caller,
        r: sp1::CloseSessionRequest,
        now: i64,
    ) -> Result<sp1::CloseSessionResponse, Refusal> {
        let info = self.agent_session(caller, &r.session_id).await?;
        let ((remaining, held), durable) = self
            .store
            .apply(&r.session_id, move |s: &mut Session| {
                let held = held_calls(&s.state);
                let record = ops::close(s, CloseReason::Agent, now);
                Change::End((record.budget_remaining, held), record.into())
            })
            .await
            .map_err(|e| self.store_refusal(&r.session_id, e))?;
        let entry = durable
            .await
            .map_err(|e| {
                refuse(
                    ErrorCode::DaemonUnavailable,
                    format!("close not durable: {e}"),
                )
            })?
            .ok_or_else(|| refuse(ErrorCode::DaemonUnavailable, "close not journaled"))?;
        self.forget_session(&r.session_id, &info.organization_id, &held);
        tracing::info!(session_id = %r.session_id, "session closed by its agent");
        Ok(sp1::CloseSessionResponse {
            session_id: r.session_id,
            audit_entry_id: entry.entry_id.to_string(),
            budget_remaining_nanos: remaining.0,
        })
    }

    /// End every session silent for `limits.session_idle_timeout` as of `now` (audited as
    /// closed, reason `idle`), except one with a held call still awaiting a human (the
    /// HITL timeout decides it first). The store's quiet index names the candidates
    /// ([`SessionStore::quiet`]: the cost follows the sessions that expire, not those
    /// live); whether a session is silent is decided again inside its check-and-apply, so
    /// a request that reaches it first keeps it. Returns how many ended. `Daemon::run`
    /// calls it every second on the embedded store; a fleet does not (its daemons do not
    /// share liveness: a heartbeat through one daemon is not seen by another's sweep).
    pub async fn close_idle(&self, now: i64) -> usize {
        let idle =
            i64::try_from(self.config.limits.session_idle_timeout.as_nanos()).unwrap_or(i64::MAX);
        if idle == 0 {
            return 0;
        }
        // Silent for `idle`: `now - last >= idle`, that is `last <= now - idle`; when
        // `now - idle` is below `i64::MIN`, no `last` is that early.
        let Some(cutoff) = now.checked_sub(idle) else {
            return 0;
        };
        let silent = |s: &Session| s.quiet_since().is_some_and(|last| last <= cutoff);
        let Ok(ids) = self.store.quiet(cutoff).await else {
            return 0;
        };
        let mut ended = 0;
        for id in &ids {
            let outcome = self
                .store
                .apply(id, |s: &mut Session| {
                    if !silent(s) {
                        return Change::Keep(None);
                    }
                    let held = held_calls(&s.state);
                    let org = s.meta.organization_id.clone();
                    let record = ops::close(s, CloseReason::Idle, now);
                    Change::End(Some((held, org)), record.into())
                })
                .await;
            let Ok((Some((held, org)), durable)) = outcome else {
                continue;
            };
            if durable.await.is_ok() {
                self.forget_session(id, &org, &held);
                ended += 1;
                tracing::info!(session_id = %id, "session ended: idle");
            }
        }
        ended
    }
}

/// The call numbers of a session's held calls.
fn held_calls(s: &SessionState) -> Vec<u64> {
    s.pending
        .iter()
        .chain(&s.more_pending)
        .map(|p| p.call_number)
        .collect()
}

/// What a pre-exec closure decided.
#[derive(Debug, Clone)]
struct Decided {
    decision: Decision,
    after: Money,
    repeat: u32,
    /// The held call a release spent (else the call's own number).
    released: u64,
    /// The reason string of a verdict a policy decided (`policy:<id>`, ...).
    policy_reason: Option<String>,
    /// Its explanation for people.
    policy_text: Option<String>,
    /// The shadow candidates' would-be verdicts (for the metrics).
    shadow: Vec<tollgate_audit::ShadowNote>,
}

pub(crate) fn not_found(id: &str) -> Refusal {
    refuse(
        ErrorCode::SessionNotFound,
        format!("unknown session `{id}`"),
    )
}

fn info_for(session: &Session) -> SessionInfo {
    SessionInfo {
        organization_id: session.meta.organization_id.clone(),
        agent_id: session.meta.agent_id.clone(),
        policy: session.policy.clone(),
        actor: Arc::default(),
    }
}

#[derive(Debug, Clone, Copy)]
enum PreExecRefusal {
    Stale,
    CallNumber(u64),
}

/// The status a session returns to when it heartbeats again.
pub(crate) fn live_status(s: &SessionState) -> SessionStatus {
    if s.pending.is_some() {
        SessionStatus::Paused
    } else {
        SessionStatus::Active
    }
}

/// The core's view of a wire request. Inputs the core cannot trust are mapped to
/// `Params::unreadable()`, which `decide` denies as malformed input.
/// An id field of a request, checked with the one rule (`tollgate_core::check_id`):
/// `INVALID_REQUEST` naming the field, before anything is looked up, decided or stored.
pub(crate) fn valid_id(field: &str, id: &str) -> Result<(), Refusal> {
    tollgate_core::check_id(id)
        .map_err(|e| refuse(ErrorCode::InvalidRequest, format!("{field} {e}")))
}

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
        Reason::PolicyDeny => "refused by a policy",
        Reason::PolicyHold => "a policy holds this call for a human",
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

pub(crate) fn check_major(version: &str) -> Result<(), Refusal> {
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
    use std::sync::atomic::{AtomicI64, Ordering};
    use tollgate_audit::{SigningKey, Writer, WriterConfig};

    const SEC: i64 = 1_000_000_000;
    /// The key the tests' audit writers sign with.
    const TEST_KEY: [u8; 32] = [7; 32];

    /// A clock the test moves by hand.
    struct TestClock(AtomicI64);
    impl Clock for TestClock {
        fn now_ns(&self) -> UnixNanos {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// The real audit writer in `dir/audit` (fsync off: nothing here is about durability).
    fn test_writer(dir: &std::path::Path) -> Arc<Writer> {
        let mut wc = WriterConfig::new(dir.join("audit"));
        wc.fsync = tollgate_audit::FsyncPolicy::Never;
        Arc::new(
            Writer::open(wc, SigningKey::from_bytes(&TEST_KEY))
                .unwrap()
                .0,
        )
    }

    /// A service of `config` over `store`, auditing to `writer`, with the default
    /// organization's secret and a clock at 1,000 s; and an agent of that organization
    /// (its caller and its peer).
    fn test_service<S: SessionStore>(
        config: DaemonConfig,
        store: S,
        writer: Arc<Writer>,
    ) -> (Service<S>, Arc<TestClock>, Caller, Peer) {
        let clock = Arc::new(TestClock(AtomicI64::new(1_000 * SEC)));
        let secrets = [(DEFAULT_ORG.to_owned(), b"0123456789abcdef0123".to_vec())]
            .into_iter()
            .collect();
        let service = Service::new(
            Arc::new(config),
            store,
            writer,
            clock.clone(),
            &secrets,
            &HashMap::new(),
        );
        let caller = Caller::Agent {
            organization: DEFAULT_ORG.into(),
            agent: None,
        };
        let peer = Peer {
            uid: 1,
            certificate: None,
        };
        (service, clock, caller, peer)
    }

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

    /// A model of sessions ending, over random orders of register, resume, pre-exec,
    /// heartbeat, close, idle sweep and the clock moving on, against the real service over
    /// a memory store with a recording journal: the service agrees with the model at every
    /// step (who is live, what is refused, what the sweep ends, the organization's quota),
    /// and at the end the journal's fold holds exactly the live sessions and nothing was
    /// journaled for a session after its close.
    mod ending_model {
        use super::*;
        use proptest::prelude::*;
        use tollgate_audit::SessionEvent;
        use tollgate_store::MemoryStore;

        const IDLE: i64 = 10 * SEC;
        const QUOTA: usize = 3;

        #[derive(Debug, Clone)]
        enum Op {
            Register,
            Resume(usize),
            PreExec(usize),
            Heartbeat(usize),
            Close(usize),
            Sweep,
            Advance(i64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                2 => Just(Op::Register),
                1 => (0..6usize).prop_map(Op::Resume),
                3 => (0..6usize).prop_map(Op::PreExec),
                2 => (0..6usize).prop_map(Op::Heartbeat),
                2 => (0..6usize).prop_map(Op::Close),
                2 => Just(Op::Sweep),
                3 => (0..15i64).prop_map(Op::Advance),
            ]
        }

        /// One session as the model sees it.
        struct Model {
            id: String,
            live: bool,
            last: i64,
            calls: u64,
        }

        fn code<T>(r: Result<T, Refusal>) -> Option<ErrorCode> {
            r.err().map(|e| e.code)
        }

        fn run(ops: &[Op]) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut config = DaemonConfig::default();
            config.limits.session_idle_timeout = std::time::Duration::from_nanos(IDLE as u64);
            config.limits.heartbeat_interval = std::time::Duration::from_secs(3600);
            config.limits.registrations_per_second_per_peer = 1_000_000;
            config.default_guard.max_repeat_calls = 0;
            config.session_quotas.insert(DEFAULT_ORG.into(), QUOTA);
            let dir = tempfile::tempdir().unwrap();
            let writer = test_writer(dir.path());
            let store = MemoryStore::new(100, Some(writer.clone()));
            let (service, clock, caller, peer) = test_service(config, store, writer.clone());
            let mut model: Vec<Model> = Vec::new();
            rt.block_on(async {
                for op in ops {
                    let now = clock.now_ns();
                    let live = model.iter().filter(|m| m.live).count();
                    match op {
                        Op::Register => {
                            let r = service
                                .register(
                                    &caller,
                                    sp1::RegisterRequest {
                                        agent_id: "bot".into(),
                                        ..Default::default()
                                    },
                                    "1.0.0",
                                    peer,
                                    now,
                                )
                                .await;
                            if live < QUOTA {
                                let r = r.unwrap();
                                model.push(Model {
                                    id: r.session_id,
                                    live: true,
                                    last: now,
                                    calls: 0,
                                });
                            } else {
                                assert_eq!(code(r), Some(ErrorCode::OrganizationQuotaExceeded));
                            }
                        }
                        Op::Resume(i) | Op::PreExec(i) | Op::Heartbeat(i) | Op::Close(i) => {
                            let Some(m) = model.get_mut(*i) else { continue };
                            let id = m.id.clone();
                            let got = match op {
                                Op::Resume(_) => code(
                                    service
                                        .register(
                                            &caller,
                                            sp1::RegisterRequest {
                                                agent_id: "bot".into(),
                                                session_id: id.clone(),
                                                ..Default::default()
                                            },
                                            "1.0.0",
                                            peer,
                                            now,
                                        )
                                        .await,
                                ),
                                Op::PreExec(_) => code(
                                    service
                                        .pre_exec(
                                            &caller,
                                            sp1::PreExecRequest {
                                                session_id: id.clone(),
                                                call_number: m.calls + 1,
                                                tool_name: "t".into(),
                                                tool_params_hash: vec![7; 32],
                                                nonce: m.calls + 1,
                                                ..Default::default()
                                            },
                                            now,
                                        )
                                        .await,
                                ),
                                Op::Heartbeat(_) => code(
                                    service
                                        .heartbeat(
                                            &caller,
                                            sp1::Heartbeat {
                                                session_id: id.clone(),
                                                ..Default::default()
                                            },
                                            now,
                                        )
                                        .await,
                                ),
                                _ => code(
                                    service
                                        .close_session(
                                            &caller,
                                            sp1::CloseSessionRequest {
                                                session_id: id.clone(),
                                            },
                                            now,
                                        )
                                        .await,
                                ),
                            };
                            if m.live {
                                assert_eq!(got, None, "{op:?} on a live session");
                                m.last = now;
                                if matches!(op, Op::PreExec(_)) {
                                    m.calls += 1;
                                }
                                if matches!(op, Op::Close(_)) {
                                    m.live = false;
                                }
                            } else {
                                assert_eq!(got, Some(ErrorCode::SessionNotFound), "{op:?}");
                            }
                        }
                        Op::Sweep => {
                            let ended = service.close_idle(now).await;
                            let mut expected = 0;
                            for m in model.iter_mut().filter(|m| m.live) {
                                if now - m.last >= IDLE {
                                    m.live = false;
                                    expected += 1;
                                }
                            }
                            assert_eq!(ended, expected);
                        }
                        Op::Advance(s) => {
                            clock.0.fetch_add(s * SEC, Ordering::SeqCst);
                        }
                    }
                    let live = model.iter().filter(|m| m.live).count();
                    assert_eq!(service.store().len(), live);
                    assert_eq!(service.live_sessions(DEFAULT_ORG), live);
                }
            });
            writer.shutdown().unwrap();
            let opts = tollgate_audit::VerifyOptions {
                trusted_key: Some(SigningKey::from_bytes(&TEST_KEY).verifying_key()),
                ..Default::default()
            };
            let mut events = Vec::new();
            tollgate_audit::verify_paths(&[dir.path().join("audit")], &opts, &mut |e| {
                if let tollgate_audit::Event::Session(ev) = &e.event {
                    events.push(ev.clone());
                }
            })
            .unwrap();
            let mut closed = std::collections::HashSet::new();
            for e in &events {
                assert!(
                    !closed.contains(e.session_id()),
                    "an entry after a close: {e:?}"
                );
                if matches!(e, SessionEvent::Closed(_)) {
                    closed.insert(e.session_id().to_owned());
                }
            }
            let mut ledger = tollgate_store::Ledger::new();
            for (i, e) in events.iter().enumerate() {
                ledger
                    .fold(
                        i as u64,
                        Digest::default(),
                        None,
                        &tollgate_audit::Event::Session(e.clone()),
                    )
                    .unwrap();
            }
            let mut folded: Vec<&String> = ledger.sessions.keys().collect();
            folded.sort();
            let mut live: Vec<&String> = model.iter().filter(|m| m.live).map(|m| &m.id).collect();
            live.sort();
            assert_eq!(folded, live);
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            #[test]
            fn sessions_end_as_the_model_says(ops in proptest::collection::vec(op(), 1..60)) {
                run(&ops);
            }
        }

        /// A request that reaches a silent session before the sweep's check-and-apply keeps
        /// it: the sweep decides silence inside the apply, at its own `now`.
        #[test]
        fn a_request_at_the_sweeps_instant_keeps_the_session() {
            run(&[
                Op::Register,
                Op::Advance(10),
                Op::PreExec(0),
                Op::Sweep,
                Op::Advance(9),
                Op::Sweep,
                Op::Advance(1),
                Op::Sweep,
                Op::PreExec(0),
                Op::Resume(0),
                Op::Register,
            ]);
        }
    }

    #[test]
    fn random_draws_are_in_range() {
        for _ in 0..1000 {
            let x = random_unit();
            assert!((0.0..1.0).contains(&x));
        }
    }

    /// The idle sweep's cost follows the sessions that expire, not those live (the old
    /// sweep copied and sorted every live session once a second): over a store that
    /// counts every session it hands out or applies to, a sweep of 1,000 live sessions of
    /// which 3 went silent reads 3 ids and applies to those 3, and nothing else.
    mod sweep_cost {
        use super::*;
        use std::future::Future;
        use std::sync::atomic::AtomicUsize;
        use tollgate_store::{BudgetKey, Durable, MemoryStore, StoreError};

        /// A memory store that counts the sessions it hands out or applies to.
        struct Counting {
            inner: MemoryStore,
            read: AtomicUsize,
        }

        impl Counting {
            fn count<T>(&self, r: Result<Vec<T>, StoreError>) -> Result<Vec<T>, StoreError> {
                if let Ok(v) = &r {
                    self.read.fetch_add(v.len(), Ordering::SeqCst);
                }
                r
            }
        }

        impl SessionStore for Counting {
            fn create(
                &self,
                session: Session,
                now: UnixNanos,
            ) -> impl Future<Output = Result<(SessionState, Durable), StoreError>> + Send
            {
                self.inner.create(session, now)
            }

            fn get(
                &self,
                id: &str,
            ) -> impl Future<Output = Result<Option<Session>, StoreError>> + Send {
                self.read.fetch_add(1, Ordering::SeqCst);
                self.inner.get(id)
            }

            fn apply<R: Send + 'static>(
                &self,
                id: &str,
                f: impl FnMut(&mut Session) -> Change<R> + Send,
            ) -> impl Future<Output = Result<(R, Durable), StoreError>> + Send {
                self.read.fetch_add(1, Ordering::SeqCst);
                self.inner.apply(id, f)
            }

            fn list(
                &self,
                org: Option<&str>,
            ) -> impl Future<Output = Result<Vec<Session>, StoreError>> + Send {
                std::future::ready(self.count(self.inner.list_sync(org)))
            }

            async fn pending_hitl(&self, org: Option<&str>) -> Result<Vec<Session>, StoreError> {
                self.count(self.inner.pending_hitl(org).await)
            }

            fn budget(
                &self,
                key: &BudgetKey,
            ) -> impl Future<Output = Result<Option<tollgate_store::Budget>, StoreError>> + Send
            {
                self.inner.budget(key)
            }

            fn close(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
                self.inner.close()
            }

            fn quiet(
                &self,
                cutoff: UnixNanos,
            ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send {
                std::future::ready(self.count(self.inner.quiet_sync(cutoff)))
            }
        }

        #[test]
        fn the_sweep_reads_only_the_sessions_that_expire() {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut config = DaemonConfig::default();
            config.limits.session_idle_timeout = std::time::Duration::from_secs(10);
            config.limits.heartbeat_interval = std::time::Duration::from_secs(3600);
            config.limits.registrations_per_second_per_peer = 1_000_000;
            let dir = tempfile::tempdir().unwrap();
            let writer = test_writer(dir.path());
            let store = Counting {
                inner: MemoryStore::new(2_000, Some(writer.clone())),
                read: AtomicUsize::new(0),
            };
            let (service, clock, caller, peer) = test_service(config, store, writer.clone());
            rt.block_on(async {
                let mut ids = Vec::new();
                for _ in 0..1_000 {
                    let r = service
                        .register(
                            &caller,
                            sp1::RegisterRequest {
                                agent_id: "bot".into(),
                                ..Default::default()
                            },
                            "1.0.0",
                            peer,
                            clock.now_ns(),
                        )
                        .await
                        .unwrap();
                    ids.push(r.session_id);
                }
                // 5 s on, all but three heartbeat; 6 s later only those three have been
                // silent for 10 s.
                clock.0.fetch_add(5 * SEC, Ordering::SeqCst);
                for id in &ids[3..] {
                    service
                        .heartbeat(
                            &caller,
                            sp1::Heartbeat {
                                session_id: id.clone(),
                                ..Default::default()
                            },
                            clock.now_ns(),
                        )
                        .await
                        .unwrap();
                }
                clock.0.fetch_add(6 * SEC, Ordering::SeqCst);
                service.store().read.store(0, Ordering::SeqCst);
                assert_eq!(service.close_idle(clock.now_ns()).await, 3);
                // Three ids from the index, three check-and-applies: nothing else.
                assert_eq!(service.store().read.load(Ordering::SeqCst), 6);
                assert_eq!(service.store().inner.len(), 997);
                for id in &ids[..3] {
                    assert_eq!(service.store().inner.get_sync(id).unwrap(), None);
                }
                // A sweep with nothing silent reads nothing.
                service.store().read.store(0, Ordering::SeqCst);
                assert_eq!(service.close_idle(clock.now_ns()).await, 0);
                assert_eq!(service.store().read.load(Ordering::SeqCst), 0);
            });
            writer.shutdown().unwrap();
        }
    }
}
