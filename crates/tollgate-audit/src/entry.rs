//! What an audit entry says: the verdict record the daemon submits, the system events the
//! writer adds itself, and the decoded entry as the verifier sees it.

use tollgate_core::{DenyReason, Digest, Money, Reason, Verdict};
use uuid::Uuid;

use crate::keys::KeyId;

/// One verdict, as the daemon submits it to the writer.
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
    /// The human operator whose HITL decision this records, if any.
    pub operator_id: Option<String>,
    /// Addition: the call's estimated cost, exact.
    pub estimated_cost: Money,
    /// Addition: the call's anti-replay nonce.
    pub nonce: u64,
    /// Addition: digest of the guard configuration that decided, if the daemon knows it.
    pub config_digest: Option<Digest>,
}

/// What an entry records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A verdict (record kind 1).
    Verdict(VerdictRecord),
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
}

impl Event {
    /// The record kind byte.
    pub const fn kind(&self) -> u8 {
        match self {
            Event::Verdict(_) => 1,
            Event::KeyHandover { .. } => 2,
            Event::Recovery { .. } => 3,
        }
    }

    /// A short name for the kind: `verdict`, `key_handover`, `recovery`.
    pub const fn kind_name(&self) -> &'static str {
        match self {
            Event::Verdict(_) => "verdict",
            Event::KeyHandover { .. } => "key_handover",
            Event::Recovery { .. } => "recovery",
        }
    }
}

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

/// Make a UUIDv7 from a timestamp and ten random bytes. Timestamps before the epoch are
/// clamped to 0 (UUIDv7 cannot express them).
pub(crate) fn uuid_v7(timestamp_ns: i64, random: &[u8; 10]) -> Uuid {
    let millis = u64::try_from(timestamp_ns / 1_000_000).unwrap_or(0);
    uuid::Builder::from_unix_timestamp_millis(millis, random).into_uuid()
}
