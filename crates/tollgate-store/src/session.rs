//! What a store keeps: sessions (metadata, decision state, call numbering) and shared
//! budgets.

use std::sync::Arc;

use tollgate_core::labels::LabelSet;
use tollgate_core::{json, BudgetScope, Digest, GuardConfig, Money, SessionState, UnixNanos};

use crate::StoreError;

/// A guard configuration with its canonical JSON and digest, computed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The configuration.
    pub config: GuardConfig,
    /// Its canonical JSON ([`GuardConfig::to_canonical_json`]), as the session-opened
    /// entry records it.
    pub json: String,
    /// SHA-256 of `json`: the `config_digest` of every entry of a session under it.
    pub digest: Digest,
}

impl Policy {
    /// The policy of a configuration.
    pub fn new(config: GuardConfig) -> Policy {
        let json = config.to_canonical_json();
        let digest = Digest::of(json.as_bytes());
        Policy {
            config,
            json,
            digest,
        }
    }

    /// Read a policy from a session-opened entry's `config` text. The digest is that of
    /// the text; the text must be exactly what [`Policy::new`] writes for the
    /// configuration it holds.
    pub fn from_json(text: &str) -> Result<Policy, String> {
        let v = json::parse_str(text).map_err(|e| format!("config is not JSON: {e}"))?;
        let config = GuardConfig::from_json(&v).map_err(|e| e.to_string())?;
        let policy = Policy::new(config);
        if policy.json != text {
            return Err("config is not in canonical form".to_owned());
        }
        Ok(policy)
    }
}

/// The longest session, agent or organization id a store accepts, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// Who a session belongs to and how its budget is shared. Fixed at creation: a closure
/// given to [`crate::SessionStore::apply`] must not change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionMeta {
    /// The session's id (the store's key).
    pub session_id: String,
    /// The agent the session runs.
    pub agent_id: String,
    /// The organization the agent belongs to.
    pub organization_id: String,
    /// Whose budget the session spends.
    pub budget_scope: BudgetScope,
    /// When the session was registered.
    pub created_at_ns: UnixNanos,
}

impl SessionMeta {
    /// The key of the budget this session spends.
    pub fn budget_key(&self) -> BudgetKey {
        match self.budget_scope {
            BudgetScope::PerSession => BudgetKey::Session(self.session_id.clone()),
            BudgetScope::PerAgent => {
                BudgetKey::Agent(self.organization_id.clone(), self.agent_id.clone())
            }
            BudgetScope::PerOrganization => BudgetKey::Organization(self.organization_id.clone()),
        }
    }

    /// The key of the shared budget record, or `None` for a per-session budget (which
    /// lives in the session's own state).
    pub fn shared_budget_key(&self) -> Option<BudgetKey> {
        match self.budget_key() {
            BudgetKey::Session(_) => None,
            k => Some(k),
        }
    }

    /// Every id is 1 to [`MAX_ID_BYTES`] bytes with no control character
    /// ([`StoreError::InvalidId`] otherwise): what every store checks at `create`.
    pub fn validate(&self) -> Result<(), StoreError> {
        check_id("session_id", &self.session_id)?;
        check_id("agent_id", &self.agent_id)?;
        check_id("organization_id", &self.organization_id)?;
        Ok(())
    }
}

/// `id` is 1 to [`MAX_ID_BYTES`] bytes with no control character, else
/// [`StoreError::InvalidId`] naming `field`.
pub fn check_id(field: &'static str, id: &str) -> Result<(), StoreError> {
    let reason = if id.is_empty() {
        "empty"
    } else if id.len() > MAX_ID_BYTES {
        "longer than 256 bytes"
    } else if id.chars().any(char::is_control) {
        "contains a control character"
    } else {
        return Ok(());
    };
    Err(StoreError::InvalidId { field, reason })
}

/// One session as stored: its metadata, the policy it runs under, the decision state
/// `decide` reads, and what the daemon needs besides.
///
/// For a shared budget (per agent or organization), `state.budget_initial`,
/// `budget_remaining` and `budget_spent` are the shared record's amounts whenever a store
/// hands out a `Session` (in `apply`, `get`, `list`), and writing them in `apply` writes
/// the shared record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Who the session belongs to.
    pub meta: SessionMeta,
    /// The policy the session runs under, fixed when it was opened (and recorded, whole,
    /// in its session-opened audit entry): a later change of the daemon's configuration
    /// applies to new sessions only.
    pub policy: Arc<Policy>,
    /// The decision state.
    pub state: SessionState,
    /// The number of the last call taken.
    ///
    /// INVARIANT (call-numbers-increase): never decreases, across restarts too; a store
    /// refuses a commit that would lower it.
    pub last_call_number: u64,
    /// The session's state version: how many audit entries have changed its durable
    /// state (the session-opened entry is 1). Each such entry carries the version it
    /// produced (`session_seq`), so the state is exactly the fold of its entries.
    ///
    /// INVARIANT (seq-follows-entries): increased by exactly one by every change that
    /// produces an audit entry (`crate::ops`), by nothing else.
    pub seq: u64,
    /// The last heartbeat (or registration), for stale detection. Not durable: a restart
    /// gives every session a fresh heartbeat window.
    pub last_heartbeat_ns: UnixNanos,
    /// The session's flow labels (issue 18): the union of the labels its ALLOWed calls'
    /// permits attached, each recorded in that verdict's audit entry, so they are the
    /// fold of the log like the rest of the state. Only grow; at most
    /// [`tollgate_core::labels::MAX_LABELS`].
    pub labels: LabelSet,
    /// The digest of the policy set in force when the session was opened (format
    /// version 6: its session-opened entry records it); `None` when none was. Set before
    /// the store opens the session; informational after (each verdict's entry names the
    /// set that evaluated it).
    pub policy_set: Option<Digest>,
}

impl Session {
    /// A new session under `policy`: fresh state with the guard's budget, started at `now`,
    /// not yet opened (version 0; opening it records version 1).
    pub fn new(meta: SessionMeta, policy: Arc<Policy>, now: UnixNanos) -> Session {
        Session {
            state: SessionState::new(policy.config.budget, now),
            meta,
            policy,
            last_call_number: 0,
            seq: 0,
            last_heartbeat_ns: now,
            labels: LabelSet::new(),
            policy_set: None,
        }
    }

    /// When the session last showed life (its last heartbeat or registration, or its
    /// last call, whichever is later), or `None` while a held call of it still awaits a
    /// human (it is then waiting, not silent: the HITL timeout decides the call first).
    /// A session whose value is at or before `now - timeout` has been silent for
    /// `timeout`; [`crate::SessionStore::quiet`] finds those.
    pub fn quiet_since(&self) -> Option<UnixNanos> {
        let held = self
            .state
            .pending
            .iter()
            .chain(&self.state.more_pending)
            .any(tollgate_core::transition::is_undecided);
        (!held).then(|| self.last_heartbeat_ns.max(self.state.last_activity_ns))
    }

    /// How many entries the state's collections hold (nonces, reservations, per-tool
    /// counts). The nonce window and the reservations are bounded by the guard; the
    /// per-tool window counts grow with the distinct tools used inside one window.
    pub fn state_entries(&self) -> usize {
        let s = &self.state;
        s.seen_nonces.len() + s.reservations.len() + s.repeat_counts.len() + s.window_counts.len()
    }
}

/// Whose budget a record is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BudgetKey {
    /// One session's own budget (kept in the session's state, not in a shared record).
    Session(String),
    /// Shared by every session of one agent: (organization, agent).
    Agent(String, String),
    /// Shared by every session of one organization.
    Organization(String),
}

/// A budget's amounts, exact in nano-dollars.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budget {
    /// What the budget started with.
    pub initial: Money,
    /// What is left, net of outstanding reservations.
    pub remaining: Money,
    /// What settled calls have been charged.
    pub spent: Money,
}

impl Budget {
    /// The amounts in a session state.
    pub fn of(state: &SessionState) -> Budget {
        Budget {
            initial: state.budget_initial,
            remaining: state.budget_remaining,
            spent: state.budget_spent,
        }
    }

    /// Put these amounts into a session state.
    pub fn load_into(self, state: &mut SessionState) {
        state.budget_initial = self.initial;
        state.budget_remaining = self.remaining;
        state.budget_spent = self.spent;
    }
}
