//! Typed envelopes, built from JSON values that already passed the schema.
//!
//! Extraction never trusts the schema blindly: a value of the wrong shape is an error string
//! (reported as HO-SCHEMA), never a panic.

use std::collections::BTreeMap;

use tollgate_core::json::{Number, Value};

/// A party: an agent by id, or a principal by subject (the role is descriptive only).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Party {
    /// An agent, compared by id.
    Agent(String),
    /// A principal, compared by subject; the role never takes part in a comparison.
    Principal {
        /// `subject:<issuer>:<hex>`.
        subject: String,
        /// The descriptive role.
        role: String,
    },
}

impl Party {
    /// The comparison key: agent id or principal subject, tagged by kind.
    pub fn key(&self) -> (bool, &str) {
        match self {
            Party::Agent(id) => (false, id),
            Party::Principal { subject, .. } => (true, subject),
        }
    }

    /// Same party (by agent id or principal subject).
    pub fn same(&self, other: &Party) -> bool {
        self.key() == other.key()
    }

    /// Whether this is a principal.
    pub fn is_principal(&self) -> bool {
        matches!(self, Party::Principal { .. })
    }

    /// Whether this is the agent with id `id`.
    pub fn is_agent(&self, id: &str) -> bool {
        matches!(self, Party::Agent(a) if a == id)
    }

    /// Short text for messages.
    pub fn show(&self) -> String {
        match self {
            Party::Agent(id) => format!("agent `{id}`"),
            Party::Principal { subject, .. } => format!("principal `{subject}`"),
        }
    }
}

/// The six message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    /// delegate
    Delegate,
    /// return
    Return,
    /// challenge
    Challenge,
    /// escalate
    Escalate,
    /// decision-request
    DecisionRequest,
    /// decision-record
    DecisionRecord,
}

impl MessageType {
    fn parse(s: &str) -> Option<MessageType> {
        Some(match s {
            "delegate" => MessageType::Delegate,
            "return" => MessageType::Return,
            "challenge" => MessageType::Challenge,
            "escalate" => MessageType::Escalate,
            "decision-request" => MessageType::DecisionRequest,
            "decision-record" => MessageType::DecisionRecord,
            _ => return None,
        })
    }

    /// The name as written in envelopes.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageType::Delegate => "delegate",
            MessageType::Return => "return",
            MessageType::Challenge => "challenge",
            MessageType::Escalate => "escalate",
            MessageType::DecisionRequest => "decision-request",
            MessageType::DecisionRecord => "decision-record",
        }
    }

    /// The payload key this type carries, if any.
    pub fn payload_key(self) -> Option<&'static str> {
        match self {
            MessageType::Delegate => None,
            MessageType::Return => Some("verdict"),
            MessageType::Challenge => Some("challenge"),
            MessageType::Escalate => Some("escalation"),
            MessageType::DecisionRequest => Some("decision_request"),
            MessageType::DecisionRecord => Some("decision_record"),
        }
    }
}

/// Every payload key, in envelope order.
pub const PAYLOAD_KEYS: [&str; 5] = [
    "verdict",
    "challenge",
    "escalation",
    "decision_request",
    "decision_record",
];

/// Envelope status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// dispatched
    Dispatched,
    /// completed
    Completed,
    /// escalated
    Escalated,
    /// stopped
    Stopped,
}

/// Approval state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    /// not-required
    NotRequired,
    /// pending-human-review
    Pending,
    /// approved
    Approved,
    /// rejected
    Rejected,
}

/// Stop reasons, as bits of a `u8`.
pub mod stop {
    /// delegation-depth-exceeded
    pub const DEPTH: u8 = 1;
    /// deadline-passed
    pub const DEADLINE: u8 = 1 << 1;
    /// budget-exhausted
    pub const BUDGET: u8 = 1 << 2;
    /// missing-evidence
    pub const MISSING_EVIDENCE: u8 = 1 << 3;
    /// live-guard-intent
    pub const LIVE_GUARD: u8 = 1 << 4;
    /// conflicting-instructions
    pub const CONFLICTING: u8 = 1 << 5;
    /// routing-loop
    pub const ROUTING_LOOP: u8 = 1 << 6;
    /// challenge-rounds-exceeded
    pub const ROUNDS: u8 = 1 << 7;

    pub(crate) fn parse(s: &str) -> Option<u8> {
        Some(match s {
            "delegation-depth-exceeded" => DEPTH,
            "deadline-passed" => DEADLINE,
            "budget-exhausted" => BUDGET,
            "missing-evidence" => MISSING_EVIDENCE,
            "live-guard-intent" => LIVE_GUARD,
            "conflicting-instructions" => CONFLICTING,
            "routing-loop" => ROUTING_LOOP,
            "challenge-rounds-exceeded" => ROUNDS,
            _ => return None,
        })
    }
}

/// The actions a board agent may be authorized, as bits of a `u16`.
pub const BOARD_ACTIONS: u16 = 0b1_1111;

fn action_bit(s: &str) -> Option<u16> {
    let i = [
        "read",
        "analyze",
        "recommend",
        "challenge",
        "escalate",
        "execute",
        "mutate",
        "deploy",
        "approve",
        "pay",
        "communicate-externally",
        "delete",
        "grant-access",
    ]
    .iter()
    .position(|a| *a == s)?;
    Some(1u16 << i)
}

fn flag_bit(s: &str) -> Option<u8> {
    let i = [
        "financial",
        "regulatory",
        "security-critical",
        "external-communication",
        "personal-data",
        "irreversible",
    ]
    .iter()
    .position(|a| *a == s)?;
    Some(1u8 << i)
}

/// Budget counters. Limits and spent counters per dimension: tool calls, tokens, cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// ISO-style currency code.
    pub currency: String,
    /// Limits: tool calls, tokens, cost in minor units.
    pub limits: [u64; 3],
    /// Spent counters in the same order.
    pub spent: [u64; 3],
}

/// Decision classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionClass {
    /// architecture
    Architecture,
    /// security
    Security,
    /// automation-investment
    AutomationInvestment,
}

impl DecisionClass {
    fn parse(s: &str) -> Option<DecisionClass> {
        Some(match s {
            "architecture" => DecisionClass::Architecture,
            "security" => DecisionClass::Security,
            "automation-investment" => DecisionClass::AutomationInvestment,
            _ => return None,
        })
    }

    /// The name as written.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionClass::Architecture => "architecture",
            DecisionClass::Security => "security",
            DecisionClass::AutomationInvestment => "automation-investment",
        }
    }
}

/// A challenge payload.
#[derive(Debug, Clone)]
pub struct ChallengeP {
    /// The envelope under challenge.
    pub proposal_task_id: String,
    /// The declared round.
    pub round: u64,
    /// A HARD gate.
    pub hard_gate: bool,
    /// sustained, withdrawn or unresolved.
    pub outcome: String,
}

/// A decision-request payload (the parts the rules read).
#[derive(Debug, Clone)]
pub struct RequestP {
    /// The decision class.
    pub decision_class: DecisionClass,
    /// The proposing agent's id.
    pub proposer_agent: String,
    /// Number of alternatives recorded.
    pub alternatives: usize,
    /// Attached challenge ids.
    pub challenge_task_ids: Vec<String>,
    /// Challenge ids that have a dissent entry.
    pub dissent_ids: Vec<String>,
    /// approve, conditional-approve, reject, redesign, escalate.
    pub recommended_outcome: String,
    /// The request this one supersedes.
    pub supersedes_task_id: Option<String>,
    /// Whether a value case is present.
    pub has_value_case: bool,
}

/// A decision-record payload.
#[derive(Debug, Clone)]
pub struct RecordP {
    /// The request it binds.
    pub request_task_id: String,
    /// `sha256:` + 64 hex.
    pub request_digest: String,
    /// approve, conditional-approve, reject, redesign.
    pub outcome: String,
    /// The decider.
    pub decided_by: Party,
    /// The second approver, if named.
    pub second_approver: Option<Party>,
    /// For a co-signing record: the decider's record it co-signs.
    pub co_signs_task_id: Option<String>,
    /// Whether risk_acceptance_ref is present.
    pub has_risk_acceptance: bool,
}

/// One envelope, typed.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// message_type
    pub message_type: MessageType,
    /// task_id
    pub task_id: String,
    /// correlation_id
    pub correlation_id: String,
    /// parent_task_id
    pub parent_task_id: Option<String>,
    /// hop_count
    pub hop_count: u64,
    /// max_hops
    pub max_hops: u64,
    /// sent_at (string order is time order)
    pub sent_at: String,
    /// deadline
    pub deadline: String,
    /// source
    pub source: Party,
    /// destination
    pub destination: Party,
    /// objective
    pub objective: String,
    /// Labels of evidence_refs.
    pub evidence_labels: Vec<String>,
    /// Whether any missing_evidence item is blocking.
    pub blocking_gap: bool,
    /// data_classification as 0 (public) ..= 3 (restricted).
    pub classification: u8,
    /// subject_risk_tier as 0 ..= 5.
    pub tier: u8,
    /// materiality_flags as bits.
    pub flags: u8,
    /// authorized_actions as bits.
    pub actions: u16,
    /// do_not_do_list
    pub prohibitions: Vec<String>,
    /// budget
    pub budget: Budget,
    /// approval_state
    pub approval: Approval,
    /// status
    pub status: Status,
    /// stop_reasons as bits.
    pub stop_reasons: u8,
    /// Whether stop_note is present.
    pub has_stop_note: bool,
    /// decision_class (root only in practice).
    pub decision_class: Option<DecisionClass>,
    /// decision_owner (root only in practice).
    pub decision_owner: Option<Party>,
    /// Which payload keys are present.
    pub payloads: Vec<&'static str>,
    /// verdict.outcome, for returns.
    pub verdict_outcome: Option<String>,
    /// challenge payload.
    pub challenge: Option<ChallengeP>,
    /// decision_request payload.
    pub request: Option<RequestP>,
    /// decision_record payload.
    pub record: Option<RecordP>,
    /// For decision-requests: `sha256:<hex>` of the canonical envelope.
    pub digest: Option<String>,
}

impl Envelope {
    /// Whether any stop reason is declared or the status says the work stopped or escalated.
    pub fn declares_stop(&self) -> bool {
        self.stop_reasons != 0 || matches!(self.status, Status::Stopped | Status::Escalated)
    }

    /// Whether the envelope declares `reason` with status stopped or escalated.
    pub fn stopped_for(&self, reason: u8) -> bool {
        self.stop_reasons & reason != 0
            && matches!(self.status, Status::Stopped | Status::Escalated)
    }
}

type Obj = BTreeMap<String, Value>;

fn field<'a>(o: &'a Obj, k: &str) -> Result<&'a Value, String> {
    o.get(k).ok_or_else(|| format!("missing field `{k}`"))
}

fn string(o: &Obj, k: &str) -> Result<String, String> {
    field(o, k)?
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("field `{k}` is not a string"))
}

fn opt_string(o: &Obj, k: &str) -> Result<Option<String>, String> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_str()
            .map(|s| Some(s.to_owned()))
            .ok_or_else(|| format!("field `{k}` is not a string")),
    }
}

fn uint(o: &Obj, k: &str) -> Result<u64, String> {
    match field(o, k)? {
        Value::Number(Number::Int(i)) => u64::try_from(*i).ok(),
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Value::Number(Number::Float(f)) if f.fract() == 0.0 && *f >= 0.0 && *f < 1.8e19 => {
            Some(*f as u64)
        }
        _ => None,
    }
    .ok_or_else(|| format!("field `{k}` is not a non-negative integer"))
}

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Obj, String> {
    v.as_object()
        .ok_or_else(|| format!("`{what}` is not an object"))
}

fn array<'a>(o: &'a Obj, k: &str) -> Result<&'a [Value], String> {
    field(o, k)?
        .as_array()
        .ok_or_else(|| format!("field `{k}` is not an array"))
}

fn party(v: &Value, what: &str) -> Result<Party, String> {
    let o = object(v, what)?;
    match string(o, "kind")?.as_str() {
        "agent" => Ok(Party::Agent(string(o, "id")?)),
        "principal" => Ok(Party::Principal {
            subject: string(o, "subject")?,
            role: string(o, "role")?,
        }),
        k => Err(format!("`{what}` has unknown kind `{k}`")),
    }
}

fn rank(v: &str, words: &[&str], what: &str) -> Result<u8, String> {
    words
        .iter()
        .position(|w| *w == v)
        .and_then(|i| u8::try_from(i).ok())
        .ok_or_else(|| format!("`{what}` has unknown value `{v}`"))
}

/// Build an envelope from a message that passed the schema.
pub fn envelope(v: &Value) -> Result<Envelope, String> {
    let o = object(v, "message")?;
    let mt = string(o, "message_type")?;
    let message_type =
        MessageType::parse(&mt).ok_or_else(|| format!("unknown message_type `{mt}`"))?;

    let mut evidence_labels = Vec::new();
    for e in array(o, "evidence_refs")? {
        evidence_labels.push(string(object(e, "evidence_refs")?, "label")?);
    }
    let mut blocking_gap = false;
    for m in array(o, "missing_evidence")? {
        if field(object(m, "missing_evidence")?, "blocking")?.as_bool() == Some(true) {
            blocking_gap = true;
        }
    }
    let mut flags = 0u8;
    for f in array(o, "materiality_flags")? {
        flags |= f
            .as_str()
            .and_then(flag_bit)
            .ok_or("unknown materiality flag")?;
    }
    let mut actions = 0u16;
    for a in array(o, "authorized_actions")? {
        actions |= a.as_str().and_then(action_bit).ok_or("unknown action")?;
    }
    let mut prohibitions = Vec::new();
    for p in array(o, "do_not_do_list")? {
        prohibitions.push(p.as_str().ok_or("do_not_do_list item")?.to_owned());
    }
    let mut stop_reasons = 0u8;
    for r in array(o, "stop_reasons")? {
        stop_reasons |= r
            .as_str()
            .and_then(stop::parse)
            .ok_or("unknown stop reason")?;
    }
    let b = object(field(o, "budget")?, "budget")?;
    let budget = Budget {
        currency: string(b, "currency")?,
        limits: [
            uint(b, "limit_tool_calls")?,
            uint(b, "limit_tokens")?,
            uint(b, "limit_cost_minor")?,
        ],
        spent: [
            uint(b, "spent_tool_calls")?,
            uint(b, "spent_tokens")?,
            uint(b, "spent_cost_minor")?,
        ],
    };
    let approval = match string(o, "approval_state")?.as_str() {
        "not-required" => Approval::NotRequired,
        "pending-human-review" => Approval::Pending,
        "approved" => Approval::Approved,
        "rejected" => Approval::Rejected,
        s => return Err(format!("unknown approval_state `{s}`")),
    };
    let status = match string(o, "status")?.as_str() {
        "dispatched" => Status::Dispatched,
        "completed" => Status::Completed,
        "escalated" => Status::Escalated,
        "stopped" => Status::Stopped,
        s => return Err(format!("unknown status `{s}`")),
    };
    let decision_class = match opt_string(o, "decision_class")? {
        Some(c) => Some(DecisionClass::parse(&c).ok_or_else(|| format!("unknown class `{c}`"))?),
        None => None,
    };
    let decision_owner = match o.get("decision_owner") {
        Some(p) => Some(party(p, "decision_owner")?),
        None => None,
    };
    let payloads: Vec<&'static str> = PAYLOAD_KEYS
        .iter()
        .copied()
        .filter(|k| o.contains_key(*k))
        .collect();

    let verdict_outcome = match o.get("verdict") {
        Some(p) => Some(string(object(p, "verdict")?, "outcome")?),
        None => None,
    };
    let challenge = match o.get("challenge") {
        Some(p) => {
            let c = object(p, "challenge")?;
            Some(ChallengeP {
                proposal_task_id: string(c, "proposal_task_id")?,
                round: uint(c, "round")?,
                hard_gate: field(c, "hard_gate")?.as_bool().ok_or("hard_gate")?,
                outcome: string(c, "outcome")?,
            })
        }
        None => None,
    };
    let request = match o.get("decision_request") {
        Some(p) => {
            let r = object(p, "decision_request")?;
            let class = string(r, "decision_class")?;
            let mut challenge_task_ids = Vec::new();
            for c in array(r, "challenge_task_ids")? {
                challenge_task_ids.push(c.as_str().ok_or("challenge_task_ids")?.to_owned());
            }
            let mut dissent_ids = Vec::new();
            for d in array(r, "dissent")? {
                dissent_ids.push(string(object(d, "dissent")?, "challenge_task_id")?);
            }
            Some(RequestP {
                decision_class: DecisionClass::parse(&class)
                    .ok_or_else(|| format!("unknown class `{class}`"))?,
                proposer_agent: string(r, "proposer_agent")?,
                alternatives: array(r, "alternatives")?.len(),
                challenge_task_ids,
                dissent_ids,
                recommended_outcome: string(r, "recommended_outcome")?,
                supersedes_task_id: opt_string(r, "supersedes_task_id")?,
                has_value_case: r.contains_key("value_case"),
            })
        }
        None => None,
    };
    let record = match o.get("decision_record") {
        Some(p) => {
            let r = object(p, "decision_record")?;
            Some(RecordP {
                request_task_id: string(r, "request_task_id")?,
                request_digest: string(r, "request_digest")?,
                outcome: string(r, "outcome")?,
                decided_by: party(field(r, "decided_by")?, "decided_by")?,
                second_approver: match r.get("second_approver") {
                    Some(p) => Some(party(p, "second_approver")?),
                    None => None,
                },
                co_signs_task_id: opt_string(r, "co_signs_task_id")?,
                has_risk_acceptance: r.contains_key("risk_acceptance_ref"),
            })
        }
        None => None,
    };
    let digest = if message_type == MessageType::DecisionRequest {
        let d = tollgate_core::json::canonical_hash(v)
            .map_err(|_| "the envelope holds a number that cannot be digested".to_owned())?;
        Some(format!("sha256:{d}"))
    } else {
        None
    };

    Ok(Envelope {
        message_type,
        task_id: string(o, "task_id")?,
        correlation_id: string(o, "correlation_id")?,
        parent_task_id: opt_string(o, "parent_task_id")?,
        hop_count: uint(o, "hop_count")?,
        max_hops: uint(o, "max_hops")?,
        sent_at: string(o, "sent_at")?,
        deadline: string(o, "deadline")?,
        source: party(field(o, "source")?, "source")?,
        destination: party(field(o, "destination")?, "destination")?,
        objective: string(o, "objective")?,
        evidence_labels,
        blocking_gap,
        classification: rank(
            &string(o, "data_classification")?,
            &["public", "internal", "confidential", "restricted"],
            "data_classification",
        )?,
        tier: rank(
            &string(o, "subject_risk_tier")?,
            &["R0", "R1", "R2", "R3", "R4", "R5"],
            "subject_risk_tier",
        )?,
        flags,
        actions,
        prohibitions,
        budget,
        approval,
        status,
        stop_reasons,
        has_stop_note: o.contains_key("stop_note"),
        decision_class,
        decision_owner,
        payloads,
        verdict_outcome,
        challenge,
        request,
        record,
        digest,
    })
}
