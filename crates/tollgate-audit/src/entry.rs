//! What an audit entry says: the session events the daemon submits (every change of a
//! session's state), the system events the writer adds itself, and the decoded entry as
//! the verifier sees it.

use tollgate_core::labels::Label;
use tollgate_core::{BudgetScope, DenyReason, Digest, HumanDecision, Money, Reason, Verdict};
use uuid::Uuid;

use crate::keys::KeyId;

/// One verdict, as the daemon submits it to the writer (record kind 1).
///
/// The writer adds what only it can know: the chain position (index), the entry id, the
/// previous entry's hash, the signing key id and the signature. Fields 1–13 of SP/1.0 §7.1
/// are all here; the fields after `operator_id` are additions an auditor needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerdictRecord {
    /// Daemon time of the decision, nanoseconds since the Unix epoch (UTC).
    pub timestamp_ns: i64,
    /// The session the call belongs to.
    pub session_id: String,
    /// The agent that proposed the call.
    pub agent_id: String,
    /// The agent's organization.
    pub organization_id: String,
    /// The call's number within its session.
    pub call_number: u64,
    /// The tool the agent wanted to run.
    pub tool_name: String,
    /// SHA-256 of the canonical JSON of the tool's parameters.
    pub params_hash: Digest,
    /// ALLOW, DENY or HITL.
    pub verdict: Verdict,
    /// The coarse deny reason (DENY only).
    pub deny_reason: Option<DenyReason>,
    /// Addition: the stable, fine-grained reason string (§3.5).
    pub reason: Reason,
    /// Addition: whether a DENY came from the probabilistic layer.
    pub probabilistic: bool,
    /// Budget remaining before the call, exact.
    pub budget_before: Money,
    /// Budget remaining after the call, exact.
    pub budget_after: Money,
    /// The operator whose human decision released this call. In format version 2 it
    /// may be present only when `reason` is `hitl_transition:approve` or
    /// `hitl_transition:modify_successor` (and should be, when the writer knows who);
    /// a version-1 file used it loosely for "the human whose HITL decision this
    /// records".
    pub operator_id: Option<String>,
    /// Addition: the call's estimated cost, exact.
    pub estimated_cost: Money,
    /// Addition: the call's anti-replay nonce.
    pub nonce: u64,
    /// Addition: digest of the guard configuration that decided, if the daemon knows it.
    pub config_digest: Option<Digest>,
    /// The session's state version after this entry (at least 1). A verdict read from a
    /// version-1 file, which has no such field, has 0.
    pub session_seq: u64,
    /// Format version 4: the version of the shared budget this change wrote (see
    /// [`SessionEvent::budget_version`]); 0 when it wrote none.
    pub budget_version: u64,
    /// Format version 6: what the daemon's policy set made of the call; `None` when no
    /// set was in force (and in older versions). When the note says the policy decided,
    /// `reason` is [`Reason::PolicyDeny`] or [`Reason::PolicyHold`] and the reason on
    /// the wire is [`PolicyNote::reason`].
    pub policy: Option<PolicyNote>,
    /// Format version 7: the would-be outcome of every shadow candidate of the set in
    /// force (a `@shadow` policy, or the whole set in shadow mode), in set order; at most
    /// [`MAX_SHADOW_NOTES`]. Never enforced: the verdict above is what the agent was told.
    pub shadow: Vec<ShadowNote>,
    /// Format version 7: the call's params as the daemon's `[audit] params` setting
    /// records them; `None` when it records hashes only (the default), or when the call
    /// carried no params that hash to `params_hash`.
    pub params: Option<RecordedParams>,
    /// Format version 8: the upstream whose tool was called (the policies' resource
    /// `Upstream::"NAME"`: the MCP gateway's library mode names the tool's upstream);
    /// `None` for the local resource `Upstream::"local"` (the daemon, `Guard::check`,
    /// and every older version).
    pub upstream: Option<String>,
    /// Format version 8: the random draw in [0, 1) the decision was made with, when the
    /// session's guard has the probabilistic layer on (`probabilistic_deny`), so a replay
    /// decides with the very draw; `None` otherwise (and in older versions).
    pub draw: Option<Draw>,
}

/// A random draw in [0, 1) (format version 8): the probabilistic layer's `rng`, kept as
/// the 64 bits of its IEEE 754 binary64 encoding, exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Draw(u64);

impl Draw {
    /// The draw `value`, when it is in [0, 1) (not NaN, not negative zero).
    pub fn new(value: f64) -> Option<Draw> {
        Draw::from_bits(value.to_bits())
    }

    /// The draw whose binary64 bits are `bits`, when they encode a value in [0, 1) (not
    /// NaN, not negative zero).
    pub fn from_bits(bits: u64) -> Option<Draw> {
        let v = f64::from_bits(bits);
        (bits >> 63 == 0 && (0.0..1.0).contains(&v)).then_some(Draw(bits))
    }

    /// Its value.
    pub fn value(self) -> f64 {
        f64::from_bits(self.0)
    }

    /// Its binary64 bits.
    pub fn bits(self) -> u64 {
        self.0
    }
}

/// The longest upstream name a verdict records (format version 8), in bytes: a
/// resource's name ([`tollgate_core::MAX_UPSTREAM_BYTES`]).
pub const MAX_UPSTREAM_BYTES: usize = tollgate_core::MAX_UPSTREAM_BYTES;

/// The upstream a verdict records for a call to a tool of `upstream` (format version 8):
/// `None` for the local resource (`local`), and for a name no record may hold (empty,
/// longer than [`MAX_UPSTREAM_BYTES`], with a control character). The policy layer names no
/// resource for such a name (`tollgate_policy::model::is_upstream_name`), so a call naming
/// one is refused as malformed and replayed as malformed; the gateway never names an
/// upstream so, its names being checked when mcp.toml is read.
pub fn recorded_upstream(upstream: &str) -> Option<String> {
    is_recordable_upstream(upstream).then(|| upstream.to_owned())
}

/// Whether a verdict may record `upstream` (format version 8).
pub fn is_recordable_upstream(upstream: &str) -> bool {
    upstream != "local" && tollgate_core::is_upstream_name(upstream)
}

/// The most shadow notes on one verdict (format version 7): a set holds at most this many
/// `@shadow` policies (or is one set in shadow mode).
pub const MAX_SHADOW_NOTES: usize = 16;

/// The name of the shadow candidate that is a whole set in shadow mode (`[policy] mode =
/// "shadow"`): not a policy id (ids never hold `*`).
pub const SHADOW_SET_NAME: &str = "*";

/// What one shadow candidate would have made of a call (format version 7): a `@shadow`
/// policy, with the verdict the call would have had were that policy enforced with the
/// rest of the set, or a set in shadow mode, with the verdict it would have had under
/// that set. Recorded, never enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowNote {
    /// The `@shadow` policy's id, or [`SHADOW_SET_NAME`] for a set in shadow mode.
    pub name: String,
    /// The would-be verdict.
    pub verdict: Verdict,
    /// The would-be reason, as the agent would have been sent it: `policy:<id>`,
    /// `policy_error:<id>`, ..., `policy_default_deny`, or the guards' reason.
    pub reason: String,
    /// The policy the would-be outcome names (the deciding policy, or for an ALLOW the
    /// first matching permit); `None` when none does.
    pub policy_id: Option<String>,
}

impl ShadowNote {
    /// Whether the would-be verdict is the enforced one.
    pub fn agrees(&self, enforced: Verdict) -> bool {
        self.verdict == enforced
    }
}

/// How `[audit] params` records a call's params (format version 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ParamsMode {
    /// Only their hash (`params_hash`): nothing more is recorded.
    #[default]
    Hash,
    /// Their canonical JSON, exactly the bytes `params_hash` is the SHA-256 of.
    Full,
    /// Their canonical JSON with secrets replaced by [`REDACTED_MARKER`].
    Redacted,
}

impl ParamsMode {
    /// `hash`, `full` or `redacted`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ParamsMode::Hash => "hash",
            ParamsMode::Full => "full",
            ParamsMode::Redacted => "redacted",
        }
    }

    /// The mode a word names.
    pub fn from_word(w: &str) -> Option<ParamsMode> {
        match w {
            "hash" => Some(ParamsMode::Hash),
            "full" => Some(ParamsMode::Full),
            "redacted" => Some(ParamsMode::Redacted),
            _ => None,
        }
    }
}

/// The string a redacted value is replaced with (a JSON string in the recorded text).
pub const REDACTED_MARKER: &str = "[REDACTED]";

/// The longest recorded params text, in bytes: longer params are recorded as
/// [`RecordedParams::TooLarge`], never cut.
pub const MAX_RECORDED_PARAMS: usize = crate::format::MAX_TEXT_LEN;

/// A call's params as recorded (format version 7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordedParams {
    /// The canonical JSON of the params: its SHA-256 is the entry's `params_hash`.
    Full(String),
    /// The canonical JSON with the values at the configured paths, and the values that
    /// look like secrets, replaced by [`REDACTED_MARKER`]; `params_hash` is still the hash
    /// of the true params.
    Redacted(String),
    /// The text this mode would record is longer than [`MAX_RECORDED_PARAMS`]: not
    /// recorded; `len` is its length in bytes.
    TooLarge {
        /// [`ParamsMode::Full`] or [`ParamsMode::Redacted`].
        mode: ParamsMode,
        /// The length of the text that was not recorded.
        len: u32,
    },
}

impl RecordedParams {
    /// The mode that recorded these params.
    pub fn mode(&self) -> ParamsMode {
        match self {
            RecordedParams::Full(_) => ParamsMode::Full,
            RecordedParams::Redacted(_) => ParamsMode::Redacted,
            RecordedParams::TooLarge { mode, .. } => *mode,
        }
    }

    /// The recorded text, when there is one.
    pub fn text(&self) -> Option<&str> {
        match self {
            RecordedParams::Full(t) | RecordedParams::Redacted(t) => Some(t),
            RecordedParams::TooLarge { .. } => None,
        }
    }
}

/// What a policy set made of one call (format version 6): the verdict entry's policy
/// note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyNote {
    /// The digest of the set that evaluated the call (`tollgate_policy::Policies::digest`).
    pub set_digest: Digest,
    /// The policies' effect.
    pub effect: PolicyEffect,
    /// The policy the effect names: the deciding one, or for an ALLOW the first
    /// matching permit. Present exactly for the effects that name one
    /// ([`PolicyEffect::names_policy`]).
    pub policy_id: Option<String>,
    /// Whether the effect decided the verdict (its reason is the policy's); else the
    /// guards' verdict and reason stand.
    pub decided: bool,
    /// Whether this policy DENY tripped the session's circuit (the daemon's
    /// `trip_on_refusal`). A policy DENY that does not trip changes no state.
    pub tripped: bool,
    /// The flow labels this ALLOW attached to the session (those it did not carry yet,
    /// in label order): the session's labels are the union over its ALLOWs.
    pub labels: Vec<Label>,
}

/// The effect of a policy set on a call, as a verdict entry records it (one byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyEffect {
    /// No policy decided (default allow and no permit matched).
    Pass,
    /// A permit matched; the guards decided.
    Permit,
    /// A `@hitl` permit matched.
    Hitl,
    /// A `forbid` matched.
    Forbid,
    /// A policy failed to evaluate.
    Error,
    /// A policy reads `context.args` and no params were sent.
    ParamsRequired,
    /// A policy reads an argument that has no Cedar value.
    Unrepresentable,
    /// The permits' labels would pass the session's bound.
    LabelLimit,
    /// Default deny, and no permit matched.
    DefaultDeny,
    /// The guards decided before the policies were consulted (rules 1-3, or a refused
    /// human transition).
    NotEvaluated,
}

impl PolicyEffect {
    /// Every effect, in code order.
    pub const ALL: [PolicyEffect; 10] = [
        PolicyEffect::Pass,
        PolicyEffect::Permit,
        PolicyEffect::Hitl,
        PolicyEffect::Forbid,
        PolicyEffect::Error,
        PolicyEffect::ParamsRequired,
        PolicyEffect::Unrepresentable,
        PolicyEffect::LabelLimit,
        PolicyEffect::DefaultDeny,
        PolicyEffect::NotEvaluated,
    ];

    /// The byte in the record: 0 to 9.
    pub const fn code(self) -> u8 {
        match self {
            PolicyEffect::Pass => 0,
            PolicyEffect::Permit => 1,
            PolicyEffect::Hitl => 2,
            PolicyEffect::Forbid => 3,
            PolicyEffect::Error => 4,
            PolicyEffect::ParamsRequired => 5,
            PolicyEffect::Unrepresentable => 6,
            PolicyEffect::LabelLimit => 7,
            PolicyEffect::DefaultDeny => 8,
            PolicyEffect::NotEvaluated => 9,
        }
    }

    /// The effect of a code, if any.
    pub const fn from_code(c: u8) -> Option<PolicyEffect> {
        match c {
            0 => Some(PolicyEffect::Pass),
            1 => Some(PolicyEffect::Permit),
            2 => Some(PolicyEffect::Hitl),
            3 => Some(PolicyEffect::Forbid),
            4 => Some(PolicyEffect::Error),
            5 => Some(PolicyEffect::ParamsRequired),
            6 => Some(PolicyEffect::Unrepresentable),
            7 => Some(PolicyEffect::LabelLimit),
            8 => Some(PolicyEffect::DefaultDeny),
            9 => Some(PolicyEffect::NotEvaluated),
            _ => None,
        }
    }

    /// The effect's word in exports: `pass`, `permit`, `hitl`, `forbid`, `error`,
    /// `params_required`, `unrepresentable`, `label_limit`, `default_deny`,
    /// `not_evaluated`.
    pub const fn as_str(self) -> &'static str {
        match self {
            PolicyEffect::Pass => "pass",
            PolicyEffect::Permit => "permit",
            PolicyEffect::Hitl => "hitl",
            PolicyEffect::Forbid => "forbid",
            PolicyEffect::Error => "error",
            PolicyEffect::ParamsRequired => "params_required",
            PolicyEffect::Unrepresentable => "unrepresentable",
            PolicyEffect::LabelLimit => "label_limit",
            PolicyEffect::DefaultDeny => "default_deny",
            PolicyEffect::NotEvaluated => "not_evaluated",
        }
    }

    /// Whether the effect names a policy (permit, hold, and every refusal but the
    /// default's).
    pub const fn names_policy(self) -> bool {
        matches!(
            self,
            PolicyEffect::Permit
                | PolicyEffect::Hitl
                | PolicyEffect::Forbid
                | PolicyEffect::Error
                | PolicyEffect::ParamsRequired
                | PolicyEffect::Unrepresentable
                | PolicyEffect::LabelLimit
        )
    }

    /// Whether the effect refuses the call.
    pub const fn refuses(self) -> bool {
        matches!(
            self,
            PolicyEffect::Forbid
                | PolicyEffect::Error
                | PolicyEffect::ParamsRequired
                | PolicyEffect::Unrepresentable
                | PolicyEffect::LabelLimit
                | PolicyEffect::DefaultDeny
        )
    }
}

impl PolicyNote {
    /// The reason string the verdict was sent with when the policy decided it:
    /// `policy:<id>` (a forbid, a hold), `policy_error:<id>`,
    /// `policy_params_required:<id>`, `policy_unrepresentable:<id>`,
    /// `policy_label_limit:<id>`, `policy_default_deny`. `None` when the guards'
    /// reason stands.
    pub fn reason(&self) -> Option<String> {
        if !self.decided {
            return None;
        }
        let id = self.policy_id.as_deref().unwrap_or_default();
        Some(match self.effect {
            PolicyEffect::Forbid | PolicyEffect::Hitl => format!("policy:{id}"),
            PolicyEffect::Error => format!("policy_error:{id}"),
            PolicyEffect::ParamsRequired => format!("policy_params_required:{id}"),
            PolicyEffect::Unrepresentable => format!("policy_unrepresentable:{id}"),
            PolicyEffect::LabelLimit => format!("policy_label_limit:{id}"),
            PolicyEffect::DefaultDeny => "policy_default_deny".to_owned(),
            PolicyEffect::Pass | PolicyEffect::Permit | PolicyEffect::NotEvaluated => return None,
        })
    }
}

/// Why a policy-set entry (record kind 9) was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicySetCause {
    /// The daemon started with the set.
    Start,
    /// The set was reloaded (SIGHUP, `tollgate policy reload`).
    Reload,
}

impl PolicySetCause {
    /// `start` or `reload`.
    pub const fn as_str(self) -> &'static str {
        match self {
            PolicySetCause::Start => "start",
            PolicySetCause::Reload => "reload",
        }
    }

    /// The cause a word names.
    pub fn from_word(w: &str) -> Option<PolicySetCause> {
        match w {
            "start" => Some(PolicySetCause::Start),
            "reload" => Some(PolicySetCause::Reload),
            _ => None,
        }
    }
}

/// A policy set coming into force (record kind 9, format version 6), for every session,
/// once this entry is durable: no verdict evaluated with it comes before it in the chain,
/// but a verdict already being decided with the old set may follow it (each verdict's
/// policy note names the digest of the set that actually evaluated it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySetRecord {
    /// Daemon time of the change.
    pub timestamp_ns: i64,
    /// The set's digest (`tollgate_policy::Policies::digest`: files, schema, default).
    pub digest: Digest,
    /// How many policies the set holds.
    pub policies: u32,
    /// Whether a call no permit matches is refused (`default = "deny"`).
    pub default_deny: bool,
    /// Whether a policy's refusal trips the session's circuit.
    pub trip_on_refusal: bool,
    /// Why the entry was written.
    pub cause: PolicySetCause,
    /// Format version 7: how many of `policies` run in shadow (evaluated and recorded,
    /// never enforced); 0 in older versions.
    pub shadow_policies: u32,
    /// Format version 7: the whole set runs in shadow (`[policy] mode = "shadow"`): no
    /// policy is enforced and `shadow_policies` equals `policies`.
    pub shadow_set: bool,
}

/// A session was opened (record kind 4): everything needed to rebuild its starting state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// Daemon time the session was opened, nanoseconds since the Unix epoch (UTC).
    pub timestamp_ns: i64,
    /// The new session.
    pub session_id: String,
    /// Its agent.
    pub agent_id: String,
    /// Its agent's organization.
    pub organization_id: String,
    /// Whose budget the session spends: its own, its agent's or its organization's.
    pub budget_scope: BudgetScope,
    /// The budget the session's configuration gives.
    pub budget_initial: Money,
    /// What the session starts with: its own budget, or what remains of the shared
    /// budget it joins.
    pub budget_before: Money,
    /// SHA-256 of `config`'s bytes.
    pub config_digest: Digest,
    /// The canonical JSON of the guard configuration the session runs under for its
    /// whole life (at most [`crate::format::MAX_TEXT_LEN`] bytes).
    pub config: String,
    /// Always 1: the session's first state.
    pub session_seq: u64,
    /// Format version 4: the version of the shared budget this opening wrote (1 when it
    /// created the budget); 0 when it wrote none (it joined a budget, or has its own).
    pub budget_version: u64,
    /// Format version 6: the digest of the policy set in force when the session opened;
    /// `None` when none was (and in older versions).
    pub policy_set: Option<Digest>,
}

/// How the cost an agent reported after a call was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CostStatus {
    /// A finite, non-negative amount within range: `actual_cost` is it, exactly.
    Readable,
    /// NaN, infinite or negative: charged as the estimate; `actual_cost` is 0.
    Unreadable,
    /// Finite but beyond the i64 nano-dollar range: saturates; `actual_cost` is 0.
    OverRange,
}

impl CostStatus {
    /// The one-byte code in the record: 0, 1, 2.
    pub const fn code(self) -> u8 {
        match self {
            CostStatus::Readable => 0,
            CostStatus::Unreadable => 1,
            CostStatus::OverRange => 2,
        }
    }

    /// The status of a code; `None` for any other byte.
    pub const fn from_code(c: u8) -> Option<CostStatus> {
        match c {
            0 => Some(CostStatus::Readable),
            1 => Some(CostStatus::Unreadable),
            2 => Some(CostStatus::OverRange),
            _ => None,
        }
    }

    /// `readable`, `unreadable`, `over_range`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CostStatus::Readable => "readable",
            CostStatus::Unreadable => "unreadable",
            CostStatus::OverRange => "over_range",
        }
    }
}

/// A post-execution report settled against the call's reservation (record kind 5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettlementRecord {
    /// Daemon time of the settlement, nanoseconds since the Unix epoch (UTC).
    pub timestamp_ns: i64,
    /// The session.
    pub session_id: String,
    /// Its agent.
    pub agent_id: String,
    /// Its agent's organization.
    pub organization_id: String,
    /// The settled call's number.
    pub call_number: u64,
    /// Whether the agent reported success.
    pub success: bool,
    /// The IEEE 754 binary64 bits of the `actual_cost_usd` the agent sent, exactly as
    /// sent. Never interpreted by a verifier.
    pub reported_cost_bits: u64,
    /// How that cost was read.
    pub cost_status: CostStatus,
    /// The reported cost, exact, when `cost_status` is readable; else 0.
    pub actual_cost: Money,
    /// The reservation's estimate; 0 without a reservation.
    pub estimated_cost: Money,
    /// Whether a reservation existed.
    pub reserved: bool,
    /// What the call was charged in the end.
    pub charged: Money,
    /// Budget remaining before the settlement.
    pub budget_before: Money,
    /// Budget remaining after it (higher than before for a refund).
    pub budget_after: Money,
    /// Whether the outcome carried an error signal.
    pub error_signal: bool,
    /// The session's state version after this entry (at least 1).
    pub session_seq: u64,
    /// Format version 4: the version of the shared budget this settlement wrote; 0 when
    /// it wrote none.
    pub budget_version: u64,
}

/// A human decided a held call (record kind 6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionRecord {
    /// Daemon time of the decision, nanoseconds since the Unix epoch (UTC).
    pub timestamp_ns: i64,
    /// The session.
    pub session_id: String,
    /// Its agent.
    pub agent_id: String,
    /// Its agent's organization.
    pub organization_id: String,
    /// The held call's own number.
    pub call_number: u64,
    /// The operator who decided.
    pub operator_id: String,
    /// Approve, reject, modify, defer, escalate, or the runtime's expire (`Awaiting` and `Unknown` cannot be
    /// recorded: the writer refuses them).
    pub decision: HumanDecision,
    /// The operator's note on the decision (why), as given; empty when none was.
    pub note: String,
    /// The held call's tool.
    pub tool_name: String,
    /// The held call's nonce.
    pub original_nonce: u64,
    /// The held call's canonical params hash.
    pub original_args_digest: Digest,
    /// For modify (and only modify): the successor's nonce and params hash.
    pub successor: Option<(u64, Digest)>,
    /// Budget remaining when the decision was recorded.
    pub budget_remaining: Money,
    /// The session's state version after this entry (at least 1).
    pub session_seq: u64,
}

/// A change's place in its session's history is held by a void (record kind 7, format
/// version 3): the change a daemon applied to a shared session state never got its own
/// entry, and the daemon that settled the place (`chain_id`) says so. The session is back
/// at the state before the change; the version `session_seq` stays used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoidRecord {
    /// Daemon time of the settlement, nanoseconds since the Unix epoch (UTC).
    pub timestamp_ns: i64,
    /// The session.
    pub session_id: String,
    /// The voided state version (at least 1).
    pub session_seq: u64,
    /// The chain (daemon) that settled the place, and signs this entry.
    pub chain_id: String,
    /// Why, as a short word: [`VoidRecord::UNCONFIRMED_AT_SETTLE`] for a change found
    /// unconfirmed and with no entry when it was settled.
    pub reason: String,
    /// Format version 4: the version of the shared budget the voided change wrote; 0 when
    /// it wrote none (then the next three fields are 0 too).
    pub budget_version: u64,
    /// Format version 4: the shared budget's remaining amount before the voided change.
    pub budget_before: Money,
    /// Format version 4: the shared budget's remaining amount after the voided change.
    pub budget_after: Money,
    /// Format version 4: the version of the shared budget whose write gave the voided
    /// change's amounts back (greater than `budget_version`); 0 when nothing was to be
    /// given back (the change moved neither the remaining nor the spent amount).
    pub revert_version: u64,
}

impl VoidRecord {
    /// The reason of a void written because a change had no entry when it was settled.
    pub const UNCONFIRMED_AT_SETTLE: &'static str = "unconfirmed_at_settle";
}

/// Why a session ended (a session-closed entry, record kind 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// Its agent closed it (`CloseSession`).
    Agent,
    /// It was silent past the daemon's idle limit (`limits.session_idle_timeout_secs`).
    Idle,
}

impl CloseReason {
    /// The word the record carries: `agent` or `idle`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CloseReason::Agent => "agent",
            CloseReason::Idle => "idle",
        }
    }

    /// The reason a word names, if any.
    pub fn from_word(w: &str) -> Option<CloseReason> {
        match w {
            "agent" => Some(CloseReason::Agent),
            "idle" => Some(CloseReason::Idle),
            _ => None,
        }
    }
}

/// A session ended (record kind 8, format version 5): nothing more is decided on it, it
/// cannot be resumed, and a fold of the log forgets it (its shared budget, if any, stays:
/// it is its agent's or organization's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseRecord {
    /// Daemon time of the close, nanoseconds since the Unix epoch (UTC).
    pub timestamp_ns: i64,
    /// The session.
    pub session_id: String,
    /// Its agent.
    pub agent_id: String,
    /// Its agent's organization.
    pub organization_id: String,
    /// Why it ended.
    pub reason: CloseReason,
    /// The budget remaining when it ended (the shared budget's, for a shared one).
    pub budget_remaining: Money,
    /// The session's state version after this entry (at least 2: the opening is 1).
    pub session_seq: u64,
}

/// Every entry that changes a session's state (kinds 4, 1, 5, 6, 8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// The session was opened (kind 4).
    Opened(SessionRecord),
    /// A verdict (kind 1).
    Verdict(VerdictRecord),
    /// A post-execution report was settled (kind 5).
    Settled(SettlementRecord),
    /// A human decided a held call (kind 6).
    HumanDecision(DecisionRecord),
    /// The session ended (kind 8, format version 5).
    Closed(CloseRecord),
}

impl SessionEvent {
    /// The record kind byte: 4, 1, 5, 6 or 8.
    pub const fn kind(&self) -> u8 {
        match self {
            SessionEvent::Opened(_) => 4,
            SessionEvent::Verdict(_) => 1,
            SessionEvent::Settled(_) => 5,
            SessionEvent::HumanDecision(_) => 6,
            SessionEvent::Closed(_) => 8,
        }
    }

    /// The session the entry belongs to.
    pub fn session_id(&self) -> &str {
        match self {
            SessionEvent::Opened(r) => &r.session_id,
            SessionEvent::Verdict(r) => &r.session_id,
            SessionEvent::Settled(r) => &r.session_id,
            SessionEvent::HumanDecision(r) => &r.session_id,
            SessionEvent::Closed(r) => &r.session_id,
        }
    }

    /// The session's state version after this entry.
    pub const fn session_seq(&self) -> u64 {
        match self {
            SessionEvent::Opened(r) => r.session_seq,
            SessionEvent::Verdict(r) => r.session_seq,
            SessionEvent::Settled(r) => r.session_seq,
            SessionEvent::HumanDecision(r) => r.session_seq,
            SessionEvent::Closed(r) => r.session_seq,
        }
    }

    /// Format version 4: the version of the shared (per-agent or per-organization)
    /// budget this change wrote, from the store that holds the budget (Redis's write
    /// version of the budget, in a fleet): versions are unique per budget and count
    /// every write of it, so an auditor orders a budget's changes across every chain by
    /// them. 0: the change wrote no shared budget (a per-session budget, a change that
    /// moved no amount, a human decision, or a store that does not version budgets).
    pub const fn budget_version(&self) -> u64 {
        match self {
            SessionEvent::Opened(r) => r.budget_version,
            SessionEvent::Verdict(r) => r.budget_version,
            SessionEvent::Settled(r) => r.budget_version,
            SessionEvent::HumanDecision(_) | SessionEvent::Closed(_) => 0,
        }
    }

    /// Set [`SessionEvent::budget_version`] (the store does, when it knows the version
    /// its write produces). A human decision never writes a budget: unchanged.
    pub fn set_budget_version(&mut self, version: u64) {
        match self {
            SessionEvent::Opened(r) => r.budget_version = version,
            SessionEvent::Verdict(r) => r.budget_version = version,
            SessionEvent::Settled(r) => r.budget_version = version,
            SessionEvent::HumanDecision(_) | SessionEvent::Closed(_) => {}
        }
    }

    /// The entry's daemon time, nanoseconds since the Unix epoch.
    pub const fn timestamp_ns(&self) -> i64 {
        match self {
            SessionEvent::Opened(r) => r.timestamp_ns,
            SessionEvent::Verdict(r) => r.timestamp_ns,
            SessionEvent::Settled(r) => r.timestamp_ns,
            SessionEvent::HumanDecision(r) => r.timestamp_ns,
            SessionEvent::Closed(r) => r.timestamp_ns,
        }
    }

    /// A short name for the kind: `session_opened`, `verdict`, `settlement`,
    /// `human_decision`, `session_closed`.
    pub const fn kind_name(&self) -> &'static str {
        match self {
            SessionEvent::Opened(_) => "session_opened",
            SessionEvent::Verdict(_) => "verdict",
            SessionEvent::Settled(_) => "settlement",
            SessionEvent::HumanDecision(_) => "human_decision",
            SessionEvent::Closed(_) => "session_closed",
        }
    }
}

impl From<CloseRecord> for SessionEvent {
    fn from(r: CloseRecord) -> Self {
        SessionEvent::Closed(r)
    }
}

impl From<VerdictRecord> for SessionEvent {
    fn from(r: VerdictRecord) -> Self {
        SessionEvent::Verdict(r)
    }
}

impl From<SessionRecord> for SessionEvent {
    fn from(r: SessionRecord) -> Self {
        SessionEvent::Opened(r)
    }
}

impl From<SettlementRecord> for SessionEvent {
    fn from(r: SettlementRecord) -> Self {
        SessionEvent::Settled(r)
    }
}

impl From<DecisionRecord> for SessionEvent {
    fn from(r: DecisionRecord) -> Self {
        SessionEvent::HumanDecision(r)
    }
}

/// What an entry records.
// Nearly every entry is a session event, the large variant (a verdict with its policy
// note): boxing it would allocate for every entry to save space in the rare small ones.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A change of a session's state (record kinds 4, 1, 5, 6).
    Session(SessionEvent),
    /// The signing key changes (record kind 2). Signed by the old key; every later entry
    /// and file header is signed by `new_public_key`.
    KeyHandover {
        /// The Ed25519 public key that signs from the next entry on.
        new_public_key: [u8; 32],
    },
    /// The writer found a torn tail when it opened the log and moved it aside (record
    /// kind 3).
    Recovery {
        /// The log file the torn bytes were cut from.
        file: String,
        /// Their offset in that file.
        offset: u64,
        /// How many bytes were moved aside.
        length: u64,
        /// SHA-256 of the moved bytes.
        sha256: Digest,
        /// Where they were moved, relative to the log directory.
        moved_to: String,
    },
    /// A change's place in its session's history is void (record kind 7, format
    /// version 3 only).
    Void(VoidRecord),
    /// A policy set coming into force (record kind 9, format version 6).
    PolicySet(PolicySetRecord),
}

impl Event {
    /// The record kind byte.
    pub const fn kind(&self) -> u8 {
        match self {
            Event::Session(e) => e.kind(),
            Event::KeyHandover { .. } => 2,
            Event::Recovery { .. } => 3,
            Event::Void(_) => 7,
            Event::PolicySet(_) => 9,
        }
    }

    /// A short name for the kind: `session_opened`, `verdict`, `settlement`,
    /// `human_decision`, `key_handover`, `recovery`, `void`, `policy_set`.
    pub const fn kind_name(&self) -> &'static str {
        match self {
            Event::Session(e) => e.kind_name(),
            Event::KeyHandover { .. } => "key_handover",
            Event::Recovery { .. } => "recovery",
            Event::Void(_) => "void",
            Event::PolicySet(_) => "policy_set",
        }
    }

    /// The session event, if this is one.
    pub const fn as_session(&self) -> Option<&SessionEvent> {
        match self {
            Event::Session(e) => Some(e),
            Event::KeyHandover { .. }
            | Event::Recovery { .. }
            | Event::Void(_)
            | Event::PolicySet(_) => None,
        }
    }
}

impl From<PolicySetRecord> for Event {
    fn from(r: PolicySetRecord) -> Self {
        Event::PolicySet(r)
    }
}

impl From<VoidRecord> for Event {
    fn from(r: VoidRecord) -> Self {
        Event::Void(r)
    }
}

impl From<SessionEvent> for Event {
    fn from(e: SessionEvent) -> Self {
        Event::Session(e)
    }
}

macro_rules! event_from_record {
    ($($t:ty),*) => {$(
        impl From<$t> for Event {
            fn from(r: $t) -> Self {
                Event::Session(r.into())
            }
        }
    )*};
}

event_from_record!(
    VerdictRecord,
    SessionRecord,
    SettlementRecord,
    DecisionRecord
);

/// A whole entry as stored: the event plus what the writer added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// Position in the chain, from 0 across all files.
    pub index: u64,
    /// Daemon time, nanoseconds since the Unix epoch (for a verdict, the decision time).
    pub timestamp_ns: i64,
    /// UUIDv7 made from the timestamp.
    pub entry_id: Uuid,
    /// The key that signed this entry.
    pub key_id: KeyId,
    /// What happened.
    pub event: Event,
    /// SHA-256 of the whole previous record (or the file header's continuation hash).
    pub prev_hash: Digest,
    /// Ed25519 signature over the record's signed bytes.
    pub signature: [u8; 64],
}

/// The one-byte code of a verdict in the record.
pub(crate) const fn verdict_code(v: Verdict) -> u8 {
    match v {
        Verdict::Allow => 1,
        Verdict::Deny => 2,
        Verdict::Hitl => 3,
    }
}

pub(crate) const fn verdict_from_code(c: u8) -> Option<Verdict> {
    match c {
        1 => Some(Verdict::Allow),
        2 => Some(Verdict::Deny),
        3 => Some(Verdict::Hitl),
        _ => None,
    }
}

/// The one-byte code of a deny reason (0 = none).
pub(crate) const fn deny_code(d: Option<DenyReason>) -> u8 {
    match d {
        None => 0,
        Some(DenyReason::CircuitOpen) => 1,
        Some(DenyReason::BudgetExhausted) => 2,
        Some(DenyReason::MaxRepeatExceeded) => 3,
        Some(DenyReason::WindowExceeded) => 4,
        Some(DenyReason::GlobalLimit) => 5,
        Some(DenyReason::PolicyViolation) => 6,
        Some(DenyReason::AuthFailed) => 7,
        Some(DenyReason::Timeout) => 8,
    }
}

/// `Err(())` for a code that names no deny reason.
pub(crate) const fn deny_from_code(c: u8) -> Result<Option<DenyReason>, ()> {
    Ok(match c {
        0 => None,
        1 => Some(DenyReason::CircuitOpen),
        2 => Some(DenyReason::BudgetExhausted),
        3 => Some(DenyReason::MaxRepeatExceeded),
        4 => Some(DenyReason::WindowExceeded),
        5 => Some(DenyReason::GlobalLimit),
        6 => Some(DenyReason::PolicyViolation),
        7 => Some(DenyReason::AuthFailed),
        8 => Some(DenyReason::Timeout),
        _ => return Err(()),
    })
}

/// The one-byte code of a budget scope: 1, 2, 3.
pub(crate) const fn scope_code(s: BudgetScope) -> u8 {
    match s {
        BudgetScope::PerSession => 1,
        BudgetScope::PerAgent => 2,
        BudgetScope::PerOrganization => 3,
    }
}

pub(crate) const fn scope_from_code(c: u8) -> Option<BudgetScope> {
    match c {
        1 => Some(BudgetScope::PerSession),
        2 => Some(BudgetScope::PerAgent),
        3 => Some(BudgetScope::PerOrganization),
        _ => None,
    }
}

/// The decision words a record may hold.
pub(crate) fn decision_from_word(w: &str) -> Option<HumanDecision> {
    Some(match w {
        "approve" => HumanDecision::Approve,
        "reject" => HumanDecision::Reject,
        "modify" => HumanDecision::Modify,
        "defer" => HumanDecision::Defer,
        "escalate" => HumanDecision::Escalate,
        "expire" => HumanDecision::Expire,
        _ => return None,
    })
}

/// Make a UUIDv7 from a timestamp and ten random bytes. Timestamps before the epoch are
/// clamped to 0 (UUIDv7 cannot express them).
pub(crate) fn uuid_v7(timestamp_ns: i64, random: &[u8; 10]) -> Uuid {
    let millis = u64::try_from(timestamp_ns / 1_000_000).unwrap_or(0);
    uuid::Builder::from_unix_timestamp_millis(millis, random).into_uuid()
}
