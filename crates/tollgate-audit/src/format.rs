//! The byte layout of a log file: header, records, signed bytes, hashes. Pure functions
//! over bytes; docs/audit-format.md is the normative description and must agree with
//! this file. All integers are big-endian.

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::{Digest as _, Sha256};
use tollgate_core::labels::{Label, MAX_LABELS};
use tollgate_core::{Digest, HumanDecision, Money, Reason, Verdict};
use uuid::Uuid;

use crate::entry::{
    self, AuditEntry, CloseRecord, CostStatus, DecisionRecord, Draw, Event, ParamsMode,
    PolicyEffect, PolicyNote, PolicySetCause, PolicySetRecord, RecordedParams, SessionEvent,
    SessionRecord, SettlementRecord, ShadowNote, VerdictRecord, VoidRecord, MAX_RECORDED_PARAMS,
    MAX_SHADOW_NOTES, SHADOW_SET_NAME,
};
use crate::keys::KeyId;

/// The first 8 bytes of every log file.
pub const MAGIC: [u8; 8] = *b"TGAUDIT\0";
/// The format version the writers (the file writer and the PostgreSQL sink) write.
pub const FORMAT_VERSION: u16 = 8;
/// The newest format version this crate reads and can encode.
pub const NEWEST_VERSION: u16 = 8;
/// The oldest format version this crate reads. Version 1 has record kinds 1-3 and a
/// verdict payload without `session_seq`; version 2 adds kinds 4-6 and `session_seq`;
/// version 3 adds kind 7 (void); version 4 appends fields to the payloads of kinds 1, 4,
/// 5 and 7 (the shared budget's version; docs/audit-format.md, "Version 4"); version 5
/// adds kind 8 (session closed; "Version 5"); version 6 appends a policy note to kind 1
/// and the policy set's digest to kind 4, and adds kind 9 (policy set; "Version 6");
/// version 7 appends the shadow notes and the recorded params to kind 1 and the shadow
/// counts to kind 9 ("Version 7"); version 8 appends the call's upstream and the random
/// draw to kind 1 ("Version 8").
///
/// Adding to version 4: append the field at the end of its kind's payload in
/// `encode_record_version` and `parse_fields` (the blocks marked "version 4"), state its
/// rule in [`check_event`], list it in docs/audit-format.md ("Version 4"), and rebuild
/// `known-answer-v4.log` (`TOLLGATE_BLESS=1 cargo test -p tollgate-audit --test audit
/// known_answer`).
pub const OLDEST_VERSION: u16 = 1;
/// Size of a file header in bytes.
pub const HEADER_LEN: usize = 170;
/// Bytes of the header covered by its signature (everything before the signature).
const HEADER_SIGNED_LEN: usize = HEADER_LEN - 64;
/// Domain separation prefix of a header's signed bytes.
pub const HEADER_DOMAIN: &[u8] = b"tollgate-audit/v1 header\0";
/// Domain separation prefix of a record's signed bytes.
pub const ENTRY_DOMAIN: &[u8] = b"tollgate-audit/v1 entry\0";
/// The largest record, length prefix included.
pub const MAX_RECORD_LEN: usize = 64 * 1024;
/// The longest string field (`str`), in bytes of UTF-8.
pub const MAX_STR_LEN: usize = 1024;
/// The longest text field (`text`, format version 2), in bytes of UTF-8.
pub const MAX_TEXT_LEN: usize = 16 * 1024;
/// Bytes before the kind-specific payload: length prefix, kind, index, timestamp, entry
/// id, key id.
const RECORD_FIXED_PREFIX: usize = 4 + 1 + 8 + 8 + 16 + 8;
/// Bytes after the payload: previous hash and signature.
const RECORD_FIXED_SUFFIX: usize = 32 + 64;

/// The hash the first record of a new log links to: SHA-256 of the ASCII text
/// `tollgate-audit/v1 genesis`.
pub fn genesis_hash() -> Digest {
    sha256(b"tollgate-audit/v1 genesis")
}

/// SHA-256 of some bytes.
pub fn sha256(bytes: &[u8]) -> Digest {
    let mut out = [0u8; 32];
    out.copy_from_slice(&Sha256::digest(bytes));
    Digest(out)
}

/// A log file's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHeader {
    /// The format version of the file (and of every record in it).
    pub version: u16,
    /// Position of the file in the log, from 0.
    pub file_seq: u64,
    /// Chain index of the file's first record.
    pub first_index: u64,
    /// The hash the file continues from: genesis for file 0, else the hash of the last
    /// record of the previous file.
    pub prev_hash: Digest,
    /// Id of the key that signs this file's header and (until a handover) its records.
    pub key_id: KeyId,
    /// That key.
    pub public_key: [u8; 32],
    /// When the file was created, nanoseconds since the Unix epoch.
    pub created_ns: i64,
    /// Ed25519 signature over the header's signed bytes.
    pub signature: [u8; 64],
}

/// Why bytes are not a header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer bytes than a header.
    #[error("file is shorter than a header ({0} bytes)")]
    Short(usize),
    /// The magic is wrong: not a tollgate audit log.
    #[error("not a tollgate audit log (bad magic)")]
    Magic,
    /// A version this reader does not know.
    #[error("unsupported format version {0}")]
    Version(u16),
    /// The key id is not the id of the public key.
    #[error("header key id does not match its public key")]
    KeyId,
    /// The public key is not a valid Ed25519 point, or is of small order.
    #[error("header public key is not a valid Ed25519 key")]
    PublicKey,
    /// The header signature does not verify.
    #[error("header signature does not verify")]
    Signature,
}

impl FileHeader {
    /// Build and sign a header of the current [`FORMAT_VERSION`].
    pub fn new_signed(
        key: &SigningKey,
        file_seq: u64,
        first_index: u64,
        prev_hash: Digest,
        created_ns: i64,
    ) -> FileHeader {
        Self::new_signed_version(
            FORMAT_VERSION,
            key,
            file_seq,
            first_index,
            prev_hash,
            created_ns,
        )
    }

    /// Build and sign a header of a given version (the writer only writes
    /// [`FORMAT_VERSION`]; older versions are for tests and conversion tools).
    pub fn new_signed_version(
        version: u16,
        key: &SigningKey,
        file_seq: u64,
        first_index: u64,
        prev_hash: Digest,
        created_ns: i64,
    ) -> FileHeader {
        let public_key = key.verifying_key().to_bytes();
        let mut h = FileHeader {
            version,
            file_seq,
            first_index,
            prev_hash,
            key_id: KeyId::of(&public_key),
            public_key,
            created_ns,
            signature: [0u8; 64],
        };
        let msg = h.signed_bytes();
        h.signature = key.sign(&msg).to_bytes();
        h
    }

    /// `HEADER_DOMAIN` followed by the first 106 bytes of the encoded header.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let enc = self.encode();
        let mut msg = Vec::with_capacity(HEADER_DOMAIN.len() + HEADER_SIGNED_LEN);
        msg.extend_from_slice(HEADER_DOMAIN);
        msg.extend_from_slice(enc.get(..HEADER_SIGNED_LEN).unwrap_or_default());
        msg
    }

    /// The 170 header bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_LEN);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&self.version.to_be_bytes());
        b.extend_from_slice(&self.file_seq.to_be_bytes());
        b.extend_from_slice(&self.first_index.to_be_bytes());
        b.extend_from_slice(&self.prev_hash.0);
        b.extend_from_slice(&self.key_id.0);
        b.extend_from_slice(&self.public_key);
        b.extend_from_slice(&self.created_ns.to_be_bytes());
        b.extend_from_slice(&self.signature);
        b
    }

    /// Parse a header and check its own consistency and signature (against the key it
    /// names; whether that key is trusted is the verifier's question).
    ///
    /// Checked in this order: length, magic, version, key id, key, signature.
    pub fn decode(bytes: &[u8]) -> Result<FileHeader, HeaderError> {
        if bytes.len() < HEADER_LEN {
            return Err(HeaderError::Short(bytes.len()));
        }
        let mut c = Cur::new(bytes);
        let short = |_| HeaderError::Short(bytes.len());
        if c.arr::<8>().map_err(short)? != MAGIC {
            return Err(HeaderError::Magic);
        }
        let version = c.u16().map_err(short)?;
        if !(OLDEST_VERSION..=NEWEST_VERSION).contains(&version) {
            return Err(HeaderError::Version(version));
        }
        let h = FileHeader {
            version,
            file_seq: c.u64().map_err(short)?,
            first_index: c.u64().map_err(short)?,
            prev_hash: Digest(c.arr().map_err(short)?),
            key_id: KeyId(c.arr().map_err(short)?),
            public_key: c.arr().map_err(short)?,
            created_ns: c.i64().map_err(short)?,
            signature: c.arr().map_err(short)?,
        };
        if KeyId::of(&h.public_key) != h.key_id {
            return Err(HeaderError::KeyId);
        }
        let vk = h.verifying_key()?;
        let sig = ed25519_dalek::Signature::from_bytes(&h.signature);
        vk.verify_strict(&h.signed_bytes(), &sig)
            .map_err(|_| HeaderError::Signature)?;
        Ok(h)
    }

    /// The header's public key.
    pub fn verifying_key(&self) -> Result<VerifyingKey, HeaderError> {
        public_key(&self.public_key).ok_or(HeaderError::PublicKey)
    }
}

/// A usable Ed25519 public key: 32 bytes that decompress to a curve point that is not of
/// small order (strict verification would reject every signature under such a key).
pub fn public_key(bytes: &[u8; 32]) -> Option<VerifyingKey> {
    VerifyingKey::from_bytes(bytes)
        .ok()
        .filter(|k| !k.is_weak())
}

/// Why bytes at a record position are not a whole record. docs/audit-format.md
/// ("Reading a record") gives the order in which these are checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Everything from the record start to the end of the file is zero bytes: what a
    /// crash leaves on some file systems where a write never reached the disk.
    #[error("zero-filled tail: the last {length} bytes of the file are all zero")]
    ZeroFilled {
        /// Bytes from the record start to the end of the file.
        length: usize,
    },
    /// The file ends inside the record: inside its length prefix (`needed` is `None`),
    /// or before the end the prefix declares.
    #[error("torn record: the file ends inside it ({available} of {} bytes present)", needed.map_or_else(|| "its 4 length-prefix".to_owned(), |n| n.to_string()))]
    Torn {
        /// Bytes from the record start to the end of the file.
        available: usize,
        /// The whole record's size, as its length prefix declares, when the prefix is
        /// whole.
        needed: Option<u64>,
    },
    /// The length prefix declares a record larger than [`MAX_RECORD_LEN`].
    #[error("length prefix declares a record of {0} bytes, over the 65536-byte limit")]
    TooLarge(u64),
    /// The length prefix declares less than the smallest record, or the record's fields
    /// end somewhere other than where the prefix says.
    #[error("length prefix says {declared} bytes but the fields {}", actual.map_or_else(|| "cannot be read to their end".to_owned(), |a| format!("need {a}")))]
    LengthMismatch {
        /// What the prefix says (bytes after the prefix).
        declared: u32,
        /// What the fields need (bytes after the prefix), parsed from the same start
        /// without regard to the prefix, when they can be read within the file and the
        /// size limit.
        actual: Option<usize>,
    },
    /// A field holds a value the format does not allow.
    #[error("malformed record: {0}")]
    Malformed(&'static str),
}

/// A parsed record: the entry, its raw extent and what is needed to check it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// The decoded entry.
    pub entry: AuditEntry,
    /// All bytes of the record, length prefix through signature.
    pub raw: &'a [u8],
}

impl Record<'_> {
    /// The bytes the signature covers: `ENTRY_DOMAIN` followed by the record without its
    /// last 64 bytes.
    pub fn signed_bytes(&self) -> Vec<u8> {
        signed_message(self.raw)
    }

    /// SHA-256 of the whole record: what the next record's previous hash must be.
    pub fn hash(&self) -> Digest {
        sha256(self.raw)
    }
}

fn signed_message(raw: &[u8]) -> Vec<u8> {
    let body = raw.get(..raw.len().saturating_sub(64)).unwrap_or_default();
    let mut msg = Vec::with_capacity(ENTRY_DOMAIN.len() + body.len());
    msg.extend_from_slice(ENTRY_DOMAIN);
    msg.extend_from_slice(body);
    msg
}

/// An entry that cannot be encoded. Nothing is written for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A string or text field is longer than its limit.
    #[error("field `{field}` is {len} bytes; the limit is {max}")]
    FieldTooLong {
        /// The field's name.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The entry breaks a rule of the format (the verifier would call it malformed).
    #[error("entry breaks a format rule: {0}")]
    Invalid(&'static str),
    /// The format version is not one this crate writes or reads.
    #[error("unknown format version {0}")]
    Version(u16),
    /// The record kind does not exist in the file's format version.
    #[error("record kind {kind} does not exist in format version {version}")]
    KindNotInVersion {
        /// The kind.
        kind: u8,
        /// The version.
        version: u16,
    },
    /// The whole record would exceed [`MAX_RECORD_LEN`] (cannot happen within the field
    /// limits; checked anyway).
    #[error("record of {0} bytes exceeds the 65536-byte limit")]
    TooLarge(usize),
}

/// What the writer knows about an entry before it is signed.
#[derive(Debug, Clone, Copy)]
pub struct Position<'a> {
    /// Chain index.
    pub index: u64,
    /// Entry timestamp.
    pub timestamp_ns: i64,
    /// Entry id.
    pub entry_id: Uuid,
    /// Hash of the previous record.
    pub prev_hash: &'a Digest,
}

/// Encode and sign one record of the current [`FORMAT_VERSION`]; returns its bytes
/// (length prefix through signature).
pub fn encode_record(
    pos: Position<'_>,
    event: &Event,
    key: &SigningKey,
    key_id: KeyId,
) -> Result<Vec<u8>, EncodeError> {
    encode_record_version(FORMAT_VERSION, pos, event, key, key_id)
}

/// Encode and sign one record for a file of format `version`. The entry is checked
/// against the same rules the verifier applies, so a record this returns always parses.
pub fn encode_record_version(
    version: u16,
    pos: Position<'_>,
    event: &Event,
    key: &SigningKey,
    key_id: KeyId,
) -> Result<Vec<u8>, EncodeError> {
    if !(OLDEST_VERSION..=NEWEST_VERSION).contains(&version) {
        return Err(EncodeError::Version(version));
    }
    if !kind_in_version(event.kind(), version) {
        return Err(EncodeError::KindNotInVersion {
            kind: event.kind(),
            version,
        });
    }
    check_event(event, version).map_err(EncodeError::Invalid)?;
    let mut b = Vec::with_capacity(256);
    b.extend_from_slice(&[0u8; 4]);
    b.push(event.kind());
    b.extend_from_slice(&pos.index.to_be_bytes());
    b.extend_from_slice(&pos.timestamp_ns.to_be_bytes());
    b.extend_from_slice(pos.entry_id.as_bytes());
    b.extend_from_slice(&key_id.0);
    match event {
        Event::Session(SessionEvent::Verdict(v)) => encode_verdict(&mut b, v, version)?,
        Event::Session(SessionEvent::Opened(o)) => encode_opened(&mut b, o, version)?,
        Event::Session(SessionEvent::Settled(s)) => encode_settlement(&mut b, s, version)?,
        Event::Session(SessionEvent::HumanDecision(d)) => encode_decision(&mut b, d)?,
        Event::Session(SessionEvent::Closed(r)) => {
            put_str(&mut b, "session_id", &r.session_id)?;
            put_str(&mut b, "agent_id", &r.agent_id)?;
            put_str(&mut b, "organization_id", &r.organization_id)?;
            put_str(&mut b, "reason", r.reason.as_str())?;
            put_money(&mut b, r.budget_remaining);
            put_u64(&mut b, r.session_seq);
        }
        Event::KeyHandover { new_public_key } => b.extend_from_slice(new_public_key),
        Event::Recovery {
            file,
            offset,
            length,
            sha256,
            moved_to,
        } => {
            put_str(&mut b, "file", file)?;
            b.extend_from_slice(&offset.to_be_bytes());
            b.extend_from_slice(&length.to_be_bytes());
            b.extend_from_slice(&sha256.0);
            put_str(&mut b, "moved_to", moved_to)?;
        }
        Event::PolicySet(p) => {
            b.extend_from_slice(&p.digest.0);
            b.extend_from_slice(&p.policies.to_be_bytes());
            put_u8(&mut b, u8::from(p.default_deny));
            put_u8(&mut b, u8::from(p.trip_on_refusal));
            put_str(&mut b, "cause", p.cause.as_str())?;
            if version >= 7 {
                // Version 7: the shadow counts.
                b.extend_from_slice(&p.shadow_policies.to_be_bytes());
                put_u8(&mut b, u8::from(p.shadow_set));
            }
        }
        Event::Void(v) => {
            put_str(&mut b, "session_id", &v.session_id)?;
            put_u64(&mut b, v.session_seq);
            put_str(&mut b, "chain_id", &v.chain_id)?;
            put_str(&mut b, "reason", &v.reason)?;
            if version >= 4 {
                // Version 4, appended in this order.
                put_u64(&mut b, v.budget_version);
                put_money(&mut b, v.budget_before);
                put_money(&mut b, v.budget_after);
                put_u64(&mut b, v.revert_version);
            }
        }
    }
    b.extend_from_slice(&pos.prev_hash.0);
    let total = b.len() + 64;
    if total > MAX_RECORD_LEN {
        return Err(EncodeError::TooLarge(total));
    }
    // The length covers everything after the prefix, signature included.
    let prefix = u32::try_from(total - 4)
        .map_err(|_| EncodeError::TooLarge(total))?
        .to_be_bytes();
    for (slot, p) in b.iter_mut().zip(prefix) {
        *slot = p;
    }
    let mut msg = Vec::with_capacity(ENTRY_DOMAIN.len() + b.len());
    msg.extend_from_slice(ENTRY_DOMAIN);
    msg.extend_from_slice(&b);
    let sig = key.sign(&msg);
    b.extend_from_slice(&sig.to_bytes());
    Ok(b)
}

/// Whether record `kind` exists in format `version`.
pub const fn kind_in_version(kind: u8, version: u16) -> bool {
    match kind {
        1..=3 => true,
        4..=6 => version >= 2,
        7 => version >= 3,
        8 => version >= 5,
        9 => version >= 6,
        _ => false,
    }
}

fn put_u8(b: &mut Vec<u8>, v: u8) {
    b.push(v);
}

fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_be_bytes());
}

fn put_money(b: &mut Vec<u8>, v: Money) {
    b.extend_from_slice(&v.0.to_be_bytes());
}

fn put_opt_str(b: &mut Vec<u8>, field: &'static str, v: Option<&str>) -> Result<(), EncodeError> {
    match v {
        None => b.push(0),
        Some(s) => {
            b.push(1);
            put_str(b, field, s)?;
        }
    }
    Ok(())
}

fn encode_verdict(b: &mut Vec<u8>, v: &VerdictRecord, version: u16) -> Result<(), EncodeError> {
    put_str(b, "session_id", &v.session_id)?;
    put_str(b, "agent_id", &v.agent_id)?;
    put_str(b, "organization_id", &v.organization_id)?;
    put_u64(b, v.call_number);
    put_str(b, "tool_name", &v.tool_name)?;
    b.extend_from_slice(&v.params_hash.0);
    put_u8(b, entry::verdict_code(v.verdict));
    put_u8(b, entry::deny_code(v.deny_reason));
    put_str(b, "reason", v.reason.as_str())?;
    put_u8(b, u8::from(v.probabilistic));
    put_money(b, v.budget_before);
    put_money(b, v.budget_after);
    put_opt_str(b, "operator_id", v.operator_id.as_deref())?;
    put_money(b, v.estimated_cost);
    put_u64(b, v.nonce);
    match &v.config_digest {
        None => b.push(0),
        Some(d) => {
            b.push(1);
            b.extend_from_slice(&d.0);
        }
    }
    if version >= 2 {
        put_u64(b, v.session_seq);
    }
    if version >= 4 {
        // Version 4, appended in this order.
        put_u64(b, v.budget_version);
    }
    if version >= 6 {
        // Version 6: the policy note.
        match &v.policy {
            None => b.push(0),
            Some(n) => {
                b.push(1);
                b.extend_from_slice(&n.set_digest.0);
                put_u8(b, n.effect.code());
                put_opt_str(b, "policy_id", n.policy_id.as_deref())?;
                put_u8(b, u8::from(n.decided));
                put_u8(b, u8::from(n.tripped));
                let count = u8::try_from(n.labels.len())
                    .map_err(|_| EncodeError::Invalid("more than 32 labels"))?;
                put_u8(b, count);
                for l in &n.labels {
                    put_str(b, "label", l.as_str())?;
                }
            }
        }
    }
    if version >= 7 {
        // Version 7: the shadow notes, then the recorded params.
        let count = u8::try_from(v.shadow.len())
            .map_err(|_| EncodeError::Invalid("more than 16 shadow notes"))?;
        put_u8(b, count);
        for n in &v.shadow {
            put_str(b, "shadow_name", &n.name)?;
            put_u8(b, entry::verdict_code(n.verdict));
            put_str(b, "shadow_reason", &n.reason)?;
            put_opt_str(b, "shadow_policy_id", n.policy_id.as_deref())?;
        }
        match &v.params {
            None => put_u8(b, 0),
            Some(p) => {
                put_u8(b, params_mode_code(p.mode()));
                match p {
                    RecordedParams::Full(t) | RecordedParams::Redacted(t) => {
                        put_u8(b, 1);
                        put_text(b, "params", t)?;
                    }
                    RecordedParams::TooLarge { len, .. } => {
                        put_u8(b, 0);
                        b.extend_from_slice(&len.to_be_bytes());
                    }
                }
            }
        }
    }
    if version >= 8 {
        // Version 8: the upstream, then the draw.
        put_opt_str(b, "upstream", v.upstream.as_deref())?;
        match v.draw {
            None => b.push(0),
            Some(d) => {
                b.push(1);
                put_u64(b, d.bits());
            }
        }
    }
    Ok(())
}

const fn params_mode_code(m: ParamsMode) -> u8 {
    match m {
        ParamsMode::Hash => 0,
        ParamsMode::Full => 1,
        ParamsMode::Redacted => 2,
    }
}

fn encode_opened(b: &mut Vec<u8>, o: &SessionRecord, version: u16) -> Result<(), EncodeError> {
    put_str(b, "session_id", &o.session_id)?;
    put_str(b, "agent_id", &o.agent_id)?;
    put_str(b, "organization_id", &o.organization_id)?;
    put_u8(b, entry::scope_code(o.budget_scope));
    put_money(b, o.budget_initial);
    put_money(b, o.budget_before);
    b.extend_from_slice(&o.config_digest.0);
    put_text(b, "config", &o.config)?;
    put_u64(b, o.session_seq);
    if version >= 4 {
        // Version 4, appended in this order.
        put_u64(b, o.budget_version);
    }
    if version >= 6 {
        // Version 6: the policy set in force.
        match &o.policy_set {
            None => b.push(0),
            Some(d) => {
                b.push(1);
                b.extend_from_slice(&d.0);
            }
        }
    }
    Ok(())
}

fn encode_settlement(
    b: &mut Vec<u8>,
    s: &SettlementRecord,
    version: u16,
) -> Result<(), EncodeError> {
    put_str(b, "session_id", &s.session_id)?;
    put_str(b, "agent_id", &s.agent_id)?;
    put_str(b, "organization_id", &s.organization_id)?;
    put_u64(b, s.call_number);
    put_u8(b, u8::from(s.success));
    put_u64(b, s.reported_cost_bits);
    put_u8(b, s.cost_status.code());
    put_money(b, s.actual_cost);
    put_money(b, s.estimated_cost);
    put_u8(b, u8::from(s.reserved));
    put_money(b, s.charged);
    put_money(b, s.budget_before);
    put_money(b, s.budget_after);
    put_u8(b, u8::from(s.error_signal));
    put_u64(b, s.session_seq);
    if version >= 4 {
        // Version 4, appended in this order.
        put_u64(b, s.budget_version);
    }
    Ok(())
}

fn encode_decision(b: &mut Vec<u8>, d: &DecisionRecord) -> Result<(), EncodeError> {
    put_str(b, "session_id", &d.session_id)?;
    put_str(b, "agent_id", &d.agent_id)?;
    put_str(b, "organization_id", &d.organization_id)?;
    put_u64(b, d.call_number);
    put_str(b, "operator_id", &d.operator_id)?;
    put_str(b, "decision", d.decision.as_str())?;
    put_str(b, "note", &d.note)?;
    put_str(b, "tool_name", &d.tool_name)?;
    put_u64(b, d.original_nonce);
    b.extend_from_slice(&d.original_args_digest.0);
    match &d.successor {
        None => b.extend_from_slice(&[0, 0]),
        Some((nonce, digest)) => {
            b.push(1);
            put_u64(b, *nonce);
            b.push(1);
            b.extend_from_slice(&digest.0);
        }
    }
    put_money(b, d.budget_remaining);
    put_u64(b, d.session_seq);
    Ok(())
}

fn put_str(b: &mut Vec<u8>, field: &'static str, s: &str) -> Result<(), EncodeError> {
    let len = s.len();
    let too_long = EncodeError::FieldTooLong {
        field,
        len,
        max: MAX_STR_LEN,
    };
    if len > MAX_STR_LEN {
        return Err(too_long);
    }
    b.extend_from_slice(&u16::try_from(len).map_err(|_| too_long)?.to_be_bytes());
    b.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_text(b: &mut Vec<u8>, field: &'static str, s: &str) -> Result<(), EncodeError> {
    let len = s.len();
    let too_long = EncodeError::FieldTooLong {
        field,
        len,
        max: MAX_TEXT_LEN,
    };
    if len > MAX_TEXT_LEN {
        return Err(too_long);
    }
    b.extend_from_slice(&u32::try_from(len).map_err(|_| too_long)?.to_be_bytes());
    b.extend_from_slice(s.as_bytes());
    Ok(())
}

/// The rules on an entry's values that the encoder and the verifier share (field
/// lengths, codes and UTF-8 are checked where the bytes are read or written). The error
/// says which rule broke.
pub fn check_event(event: &Event, version: u16) -> Result<(), &'static str> {
    match event {
        Event::Session(SessionEvent::Verdict(v)) => {
            if version >= 2 {
                if v.session_seq == 0 {
                    return Err("session_seq is 0");
                }
                let releases = matches!(
                    v.reason,
                    Reason::TransitionApprove | Reason::TransitionModifySuccessor
                );
                if v.operator_id.is_some() && !releases {
                    return Err("operator_id on a verdict that releases no human-approved call");
                }
            }
            check_policy_note(v, version)?;
            check_shadow_and_params(v, version)?;
            check_upstream_and_draw(v, version)
        }
        Event::Session(SessionEvent::Opened(o)) => {
            if o.session_seq != 1 {
                return Err("session_seq of a session-opened entry is not 1");
            }
            if sha256(o.config.as_bytes()) != o.config_digest {
                return Err("config_digest is not the SHA-256 of config");
            }
            if version < 6 && o.policy_set.is_some() {
                return Err("a policy set digest before format version 6");
            }
            Ok(())
        }
        Event::Session(SessionEvent::Settled(s)) => {
            if s.session_seq == 0 {
                return Err("session_seq is 0");
            }
            if s.cost_status != CostStatus::Readable && s.actual_cost != Money::ZERO {
                return Err("actual_cost is not 0 though the cost was not readable");
            }
            if !s.reserved && s.estimated_cost != Money::ZERO {
                return Err("estimated_cost is not 0 though nothing was reserved");
            }
            Ok(())
        }
        Event::Session(SessionEvent::HumanDecision(d)) => {
            if d.session_seq == 0 {
                return Err("session_seq is 0");
            }
            if entry::decision_from_word(d.decision.as_str()).is_none() {
                return Err("decision is not approve, reject, modify, defer, escalate or expire");
            }
            if (d.decision == HumanDecision::Modify) != d.successor.is_some() {
                return Err("successor present without modify, or modify without successor");
            }
            Ok(())
        }
        Event::Session(SessionEvent::Closed(r)) => {
            if r.session_seq < 2 {
                return Err("session_seq of a session-closed entry is below 2");
            }
            Ok(())
        }
        Event::KeyHandover { new_public_key } => match public_key(new_public_key) {
            Some(_) => Ok(()),
            None => Err("hand-over names an invalid public key"),
        },
        Event::Recovery { .. } => Ok(()),
        Event::PolicySet(p) => {
            if version < 7 && (p.shadow_policies != 0 || p.shadow_set) {
                return Err("shadow policies before format version 7");
            }
            if p.shadow_policies > p.policies {
                return Err("more shadow policies than policies");
            }
            if p.shadow_set && p.shadow_policies != p.policies {
                return Err("a set in shadow mode whose policies are not all in shadow");
            }
            Ok(())
        }
        Event::Void(v) => {
            if v.session_seq == 0 {
                return Err("session_seq is 0");
            }
            if v.chain_id.is_empty() {
                return Err("chain_id of a void is empty");
            }
            if v.reason.is_empty() {
                return Err("reason of a void is empty");
            }
            if version >= 4 {
                if v.budget_version == 0
                    && (v.budget_before != Money::ZERO
                        || v.budget_after != Money::ZERO
                        || v.revert_version != 0)
                {
                    return Err("a void that names no budget version names budget amounts");
                }
                if v.revert_version != 0 && v.revert_version <= v.budget_version {
                    return Err("a void's revert_version is not after its budget_version");
                }
            }
            Ok(())
        }
    }
}

/// Whether `s` is a policy id: 1 to 128 bytes of ASCII letters, digits and `. _ - : /`.
fn is_policy_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/'))
}

/// Whether `reason` is a reason a verdict of `verdict` can be sent with: a guards' reason
/// string (not the two a policy's verdict is recorded with), or a policy's
/// (`policy:<id>` on a DENY or HITL, the other `policy_*:<id>` and `policy_default_deny`
/// on a DENY).
fn is_sent_reason(reason: &str, verdict: Verdict) -> bool {
    if let Ok(r) = reason.parse::<Reason>() {
        return !r.is_policy();
    }
    if reason == "policy_default_deny" {
        return verdict == Verdict::Deny;
    }
    if let Some(id) = reason.strip_prefix("policy:") {
        return verdict != Verdict::Allow && is_policy_id(id);
    }
    [
        "policy_error:",
        "policy_params_required:",
        "policy_unrepresentable:",
        "policy_label_limit:",
    ]
    .iter()
    .any(|p| {
        reason
            .strip_prefix(p)
            .is_some_and(|id| verdict == Verdict::Deny && is_policy_id(id))
    })
}

/// The rules on a verdict's upstream and draw (format version 8).
fn check_upstream_and_draw(v: &VerdictRecord, version: u16) -> Result<(), &'static str> {
    if version < 8 {
        if v.upstream.is_some() {
            return Err("an upstream before format version 8");
        }
        if v.draw.is_some() {
            return Err("a draw before format version 8");
        }
        return Ok(());
    }
    if v.upstream
        .as_deref()
        .is_some_and(|u| !entry::is_recordable_upstream(u))
    {
        return Err("an upstream that is empty, `local`, longer than 256 bytes or holds a control character");
    }
    // (A draw outside [0, 1) cannot be: `Draw::from_bits`, its only constructor, refuses
    // one when the record is parsed.)
    Ok(())
}

/// The rules on a verdict's shadow notes and recorded params (format version 7).
fn check_shadow_and_params(v: &VerdictRecord, version: u16) -> Result<(), &'static str> {
    if version < 7 {
        if !v.shadow.is_empty() {
            return Err("shadow notes before format version 7");
        }
        if v.params.is_some() {
            return Err("recorded params before format version 7");
        }
        return Ok(());
    }
    if v.shadow.len() > MAX_SHADOW_NOTES {
        return Err("more than 16 shadow notes");
    }
    if !v.shadow.is_empty() && v.policy.is_none() {
        return Err("shadow notes on a verdict without a policy note");
    }
    for n in &v.shadow {
        if n.name != SHADOW_SET_NAME && !is_policy_id(&n.name) {
            return Err("a shadow note's name is neither a policy id nor `*`");
        }
        if n.policy_id.as_deref().is_some_and(|id| !is_policy_id(id)) {
            return Err("a shadow note's policy_id is not a policy id");
        }
        if !is_sent_reason(&n.reason, n.verdict) {
            return Err("a shadow note's reason is not one its verdict can be sent with");
        }
    }
    for (i, n) in v.shadow.iter().enumerate() {
        if v.shadow.iter().skip(i + 1).any(|m| m.name == n.name) {
            return Err("two shadow notes name the same candidate");
        }
    }
    match &v.params {
        Some(RecordedParams::Full(t)) if sha256(t.as_bytes()) != v.params_hash => {
            Err("recorded full params do not hash to params_hash")
        }
        Some(RecordedParams::TooLarge { mode, .. }) if *mode == ParamsMode::Hash => {
            Err("params too large for mode hash")
        }
        Some(RecordedParams::TooLarge { len, .. })
            if usize::try_from(*len).is_ok_and(|l| l <= MAX_RECORDED_PARAMS) =>
        {
            Err("params recorded as too large though they fit")
        }
        _ => Ok(()),
    }
}

/// The rules on a verdict's policy note (format version 6), and on the two reasons a
/// policy's verdict is applied with.
fn check_policy_note(v: &VerdictRecord, version: u16) -> Result<(), &'static str> {
    let Some(n) = &v.policy else {
        if v.reason.is_policy() {
            return Err("a policy reason on a verdict without a policy note");
        }
        return Ok(());
    };
    if version < 6 {
        return Err("a policy note before format version 6");
    }
    if n.effect.names_policy() != n.policy_id.is_some() {
        return Err(
            "policy_id present for an effect that names no policy, or absent for one that does",
        );
    }
    if n.decided {
        let ok = match v.verdict {
            Verdict::Deny => n.effect.refuses() && v.reason == Reason::PolicyDeny,
            Verdict::Hitl => n.effect == PolicyEffect::Hitl && v.reason == Reason::PolicyHold,
            Verdict::Allow => false,
        };
        if !ok {
            return Err("a policy-decided verdict whose verdict, effect and reason disagree");
        }
    } else if n.effect.refuses() || v.reason.is_policy() {
        return Err("a policy refusal or reason on a verdict the policy did not decide");
    }
    if n.tripped && !(n.decided && v.verdict == Verdict::Deny) {
        return Err("tripped on a verdict that is not a policy DENY");
    }
    if !n.labels.is_empty() {
        if v.verdict != Verdict::Allow
            || !matches!(n.effect, PolicyEffect::Pass | PolicyEffect::Permit)
        {
            return Err("labels on a verdict that is not an ALLOW a policy let through");
        }
        if n.labels.len() > MAX_LABELS {
            return Err("more than 32 labels");
        }
        if n.labels.windows(2).any(|w| matches!(w, [a, b] if a >= b)) {
            return Err("labels not strictly increasing");
        }
    }
    Ok(())
}

/// Parse the record that starts at the beginning of `bytes` (which may run on to the end
/// of the file) in a file of the current [`FORMAT_VERSION`]. See
/// [`parse_record_version`].
pub fn parse_record(bytes: &[u8]) -> Result<(Record<'_>, usize), RecordError> {
    parse_record_version(FORMAT_VERSION, bytes)
}

/// Parse the record that starts at the beginning of `bytes` (which may run on to the end
/// of the file) in a file of format `version`. Returns the record and how many bytes it
/// occupies. Checks structure and values only: signatures and links are the verifier's
/// job. Reads at most [`MAX_RECORD_LEN`] bytes past the start (and scans ahead for
/// non-zero bytes only until it finds one).
///
/// The checks come in the order docs/audit-format.md gives: a torn length prefix, a
/// zero-filled tail, a length prefix over the limit or under the minimum, a record the file
/// ends inside, then the fields inside the declared extent (a field that would cross its
/// end, or fields that end before it, is a length mismatch), then the values.
pub fn parse_record_version(
    version: u16,
    bytes: &[u8],
) -> Result<(Record<'_>, usize), RecordError> {
    let Some(prefix) = bytes.get(..4) else {
        return Err(RecordError::Torn {
            available: bytes.len(),
            needed: None,
        });
    };
    if bytes.iter().all(|&b| b == 0) {
        return Err(RecordError::ZeroFilled {
            length: bytes.len(),
        });
    }
    let declared =
        u32::from_be_bytes(<[u8; 4]>::try_from(prefix).map_err(|_| RecordError::Torn {
            available: bytes.len(),
            needed: None,
        })?);
    let total = u64::from(declared) + 4;
    if total > MAX_RECORD_LEN as u64 {
        return Err(RecordError::TooLarge(total));
    }
    // total <= 65536 fits in usize.
    let total = usize::try_from(total).unwrap_or(MAX_RECORD_LEN);
    let mismatch = || RecordError::LengthMismatch {
        declared,
        actual: fields_len(version, bytes),
    };
    if total < MIN_RECORD_LEN {
        return Err(mismatch());
    }
    let Some(raw) = bytes.get(..total) else {
        return Err(RecordError::Torn {
            available: bytes.len(),
            needed: Some(total as u64),
        });
    };
    let mut c = Cur::new(raw);
    let entry = match parse_fields(version, &mut c) {
        Err(Stop::Short) => return Err(mismatch()),
        Err(Stop::Malformed(what)) => return Err(RecordError::Malformed(what)),
        Ok(_) if c.pos != total => return Err(mismatch()),
        Ok(Err(what)) => return Err(RecordError::Malformed(what)),
        Ok(Ok(e)) => e,
    };
    Ok((Record { entry, raw }, total))
}

/// Where the fields of the record at the start of `bytes` end (bytes after the length
/// prefix), ignoring the prefix, if they can be read within the file and the size limit.
fn fields_len(version: u16, bytes: &[u8]) -> Option<usize> {
    let window = bytes.get(..MAX_RECORD_LEN).unwrap_or(bytes);
    let mut c = Cur::new(window);
    match parse_fields(version, &mut c) {
        Ok(_) => c.pos.checked_sub(4),
        Err(_) => None,
    }
}

/// Why reading the fields stopped before their end.
#[derive(Debug)]
enum Stop {
    /// A field would cross the end of the bytes.
    Short,
    /// A kind or presence flag that leaves the rest of the structure unknown.
    Malformed(&'static str),
}

/// The structure was read whole; the inner result says whether the values are valid.
type Parsed<T> = Result<Result<T, &'static str>, Stop>;

fn parse_fields(version: u16, c: &mut Cur<'_>) -> Parsed<AuditEntry> {
    let _declared = c.u32()?;
    let kind = c.u8()?;
    let index = c.u64()?;
    let timestamp_ns = c.i64()?;
    let entry_id = Uuid::from_bytes(c.arr()?);
    let key_id = KeyId(c.arr()?);
    if !kind_in_version(kind, version) {
        return Err(Stop::Malformed(if (4..=6).contains(&kind) {
            "record kind 4, 5 or 6 in a format-version-1 file"
        } else {
            // Kind 7 in a version-1 or -2 file is unknown there, as it always was.
            "unknown record kind"
        }));
    }
    let event = match kind {
        1 => parse_verdict(c, timestamp_ns, version)?.map(Event::from),
        2 => Ok(Event::KeyHandover {
            new_public_key: c.arr()?,
        }),
        3 => {
            let file = c.str()?;
            let offset = c.u64()?;
            let length = c.u64()?;
            let sha256 = Digest(c.arr()?);
            let moved_to = c.str()?;
            (|| {
                Ok(Event::Recovery {
                    file: utf8(file)?,
                    offset,
                    length,
                    sha256,
                    moved_to: utf8(moved_to)?,
                })
            })()
        }
        4 => parse_opened(c, timestamp_ns, version)?,
        5 => parse_settlement(c, timestamp_ns, version)?,
        6 => parse_decision(c, timestamp_ns)?,
        7 => parse_void(c, timestamp_ns, version)?,
        8 => parse_closed(c, timestamp_ns)?,
        _ => parse_policy_set(c, timestamp_ns, version)?,
    };
    let prev_hash = Digest(c.arr()?);
    let signature = c.arr()?;
    Ok(event
        .and_then(|event| check_event(&event, version).map(|()| event))
        .map(|event| AuditEntry {
            index,
            timestamp_ns,
            entry_id,
            key_id,
            event,
            prev_hash,
            signature,
        }))
}

/// A presence flag. Any value but 0 or 1 stops the parse as malformed: the structure
/// after it is unknown.
fn flag(c: &mut Cur<'_>, what: &'static str) -> Result<bool, Stop> {
    match c.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Stop::Malformed(what)),
    }
}

fn bool_value(b: u8, what: &'static str) -> Result<bool, &'static str> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(what),
    }
}

fn utf8(raw: &[u8]) -> Result<String, &'static str> {
    if raw.len() > MAX_STR_LEN {
        return Err("string longer than 1024 bytes");
    }
    std::str::from_utf8(raw)
        .map(str::to_owned)
        .map_err(|_| "string is not UTF-8")
}

fn utf8_text(raw: &[u8]) -> Result<String, &'static str> {
    if raw.len() > MAX_TEXT_LEN {
        return Err("text longer than 16384 bytes");
    }
    std::str::from_utf8(raw)
        .map(str::to_owned)
        .map_err(|_| "text is not UTF-8")
}

fn parse_verdict(c: &mut Cur<'_>, timestamp_ns: i64, version: u16) -> Parsed<VerdictRecord> {
    let session_id = c.str()?;
    let agent_id = c.str()?;
    let organization_id = c.str()?;
    let call_number = c.u64()?;
    let tool_name = c.str()?;
    let params_hash = Digest(c.arr()?);
    let verdict = c.u8()?;
    let deny = c.u8()?;
    let reason = c.str()?;
    let probabilistic = c.u8()?;
    let budget_before = Money(c.i64()?);
    let budget_after = Money(c.i64()?);
    let operator_id = match flag(c, "bad operator_id presence flag")? {
        false => None,
        true => Some(c.str()?),
    };
    let estimated_cost = Money(c.i64()?);
    let nonce = c.u64()?;
    let config_digest = match flag(c, "bad config_digest presence flag")? {
        false => None,
        true => Some(Digest(c.arr()?)),
    };
    let session_seq = if version >= 2 { c.u64()? } else { 0 };
    // Version 4, appended in this order.
    let budget_version = v4_u64(c, version)?;
    // Version 6: the policy note.
    let note = if version >= 6 && flag(c, "bad policy note presence flag")? {
        let set_digest = Digest(c.arr()?);
        let effect = c.u8()?;
        let policy_id = match flag(c, "bad policy_id presence flag")? {
            false => None,
            true => Some(c.str()?),
        };
        let decided = c.u8()?;
        let tripped = c.u8()?;
        let count = c.u8()?;
        if usize::from(count) > MAX_LABELS {
            return Err(Stop::Malformed("more than 32 labels"));
        }
        let mut labels = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            labels.push(c.str()?);
        }
        Some((set_digest, effect, policy_id, decided, tripped, labels))
    } else {
        None
    };
    // Version 7: the shadow notes, then the recorded params.
    let mut shadow_raw = Vec::new();
    let mut params_raw = None;
    if version >= 7 {
        let count = c.u8()?;
        if usize::from(count) > MAX_SHADOW_NOTES {
            return Err(Stop::Malformed("more than 16 shadow notes"));
        }
        for _ in 0..count {
            let name = c.str()?;
            let verdict = c.u8()?;
            let reason = c.str()?;
            let policy_id = match flag(c, "bad shadow policy_id presence flag")? {
                false => None,
                true => Some(c.str()?),
            };
            shadow_raw.push((name, verdict, reason, policy_id));
        }
        let mode = c.u8()?;
        if mode != 0 {
            let mode = match mode {
                1 => ParamsMode::Full,
                2 => ParamsMode::Redacted,
                _ => return Err(Stop::Malformed("unknown params mode code")),
            };
            params_raw = Some(match flag(c, "bad params recorded flag")? {
                true => (mode, Ok(c.text()?)),
                false => (mode, Err(c.u32()?)),
            });
        }
    }
    // Version 8: the upstream, then the draw.
    let mut upstream_raw = None;
    let mut draw_bits = None;
    if version >= 8 {
        if flag(c, "bad upstream presence flag")? {
            upstream_raw = Some(c.str()?);
        }
        if flag(c, "bad draw presence flag")? {
            draw_bits = Some(c.u64()?);
        }
    }
    Ok((|| {
        let policy = match note {
            None => None,
            Some((set_digest, effect, policy_id, decided, tripped, labels)) => Some(PolicyNote {
                set_digest,
                effect: PolicyEffect::from_code(effect).ok_or("unknown policy effect code")?,
                policy_id: policy_id.map(utf8).transpose()?,
                decided: bool_value(decided, "bad decided flag")?,
                tripped: bool_value(tripped, "bad tripped flag")?,
                labels: labels
                    .into_iter()
                    .map(|l| {
                        utf8(l).and_then(|t| Label::parse(&t).map_err(|_| "label is not a label"))
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            }),
        };
        let shadow = shadow_raw
            .into_iter()
            .map(|(name, verdict, reason, policy_id)| {
                Ok(ShadowNote {
                    name: utf8(name)?,
                    verdict: entry::verdict_from_code(verdict)
                        .ok_or("unknown shadow verdict code")?,
                    reason: utf8(reason)?,
                    policy_id: policy_id.map(utf8).transpose()?,
                })
            })
            .collect::<Result<Vec<_>, &'static str>>()?;
        let params = match params_raw {
            None => None,
            Some((mode, Ok(text))) => {
                let text = utf8_text(text)?;
                Some(match mode {
                    ParamsMode::Redacted => RecordedParams::Redacted(text),
                    _ => RecordedParams::Full(text),
                })
            }
            Some((mode, Err(len))) => Some(RecordedParams::TooLarge { mode, len }),
        };
        let upstream = upstream_raw.map(utf8).transpose()?;
        let draw = match draw_bits {
            None => None,
            Some(bits) => Some(Draw::from_bits(bits).ok_or("a draw outside [0, 1)")?),
        };
        Ok(VerdictRecord {
            timestamp_ns,
            session_id: utf8(session_id)?,
            agent_id: utf8(agent_id)?,
            organization_id: utf8(organization_id)?,
            call_number,
            tool_name: utf8(tool_name)?,
            params_hash,
            verdict: entry::verdict_from_code(verdict).ok_or("unknown verdict code")?,
            deny_reason: entry::deny_from_code(deny).map_err(|()| "unknown deny reason code")?,
            reason: utf8(reason)?
                .parse::<Reason>()
                .map_err(|_| "unknown reason string")?,
            probabilistic: bool_value(probabilistic, "bad probabilistic flag")?,
            budget_before,
            budget_after,
            operator_id: operator_id.map(utf8).transpose()?,
            estimated_cost,
            nonce,
            config_digest,
            session_seq,
            budget_version,
            policy,
            shadow,
            params,
            upstream,
            draw,
        })
    })())
}

/// A `u64` field that version 4 appended (0 in older versions, which lack it).
fn v4_u64(c: &mut Cur<'_>, version: u16) -> Result<u64, Stop> {
    if version >= 4 {
        c.u64()
    } else {
        Ok(0)
    }
}

fn parse_opened(c: &mut Cur<'_>, timestamp_ns: i64, version: u16) -> Parsed<Event> {
    let session_id = c.str()?;
    let agent_id = c.str()?;
    let organization_id = c.str()?;
    let scope = c.u8()?;
    let budget_initial = Money(c.i64()?);
    let budget_before = Money(c.i64()?);
    let config_digest = Digest(c.arr()?);
    let config = c.text()?;
    let session_seq = c.u64()?;
    // Version 4, appended in this order.
    let budget_version = v4_u64(c, version)?;
    // Version 6: the policy set in force.
    let policy_set = if version >= 6 && flag(c, "bad policy_set presence flag")? {
        Some(Digest(c.arr()?))
    } else {
        None
    };
    Ok((|| {
        Ok(Event::Session(SessionEvent::Opened(SessionRecord {
            timestamp_ns,
            session_id: utf8(session_id)?,
            agent_id: utf8(agent_id)?,
            organization_id: utf8(organization_id)?,
            budget_scope: entry::scope_from_code(scope).ok_or("unknown budget_scope code")?,
            budget_initial,
            budget_before,
            config_digest,
            config: utf8_text(config)?,
            session_seq,
            budget_version,
            policy_set,
        })))
    })())
}

fn parse_settlement(c: &mut Cur<'_>, timestamp_ns: i64, version: u16) -> Parsed<Event> {
    let session_id = c.str()?;
    let agent_id = c.str()?;
    let organization_id = c.str()?;
    let call_number = c.u64()?;
    let success = c.u8()?;
    let reported_cost_bits = c.u64()?;
    let cost_status = c.u8()?;
    let actual_cost = Money(c.i64()?);
    let estimated_cost = Money(c.i64()?);
    let reserved = c.u8()?;
    let charged = Money(c.i64()?);
    let budget_before = Money(c.i64()?);
    let budget_after = Money(c.i64()?);
    let error_signal = c.u8()?;
    let session_seq = c.u64()?;
    // Version 4, appended in this order.
    let budget_version = v4_u64(c, version)?;
    Ok((|| {
        Ok(Event::Session(SessionEvent::Settled(SettlementRecord {
            timestamp_ns,
            session_id: utf8(session_id)?,
            agent_id: utf8(agent_id)?,
            organization_id: utf8(organization_id)?,
            call_number,
            success: bool_value(success, "bad success flag")?,
            reported_cost_bits,
            cost_status: CostStatus::from_code(cost_status).ok_or("unknown cost_status code")?,
            actual_cost,
            estimated_cost,
            reserved: bool_value(reserved, "bad reserved flag")?,
            charged,
            budget_before,
            budget_after,
            error_signal: bool_value(error_signal, "bad error_signal flag")?,
            session_seq,
            budget_version,
        })))
    })())
}

fn parse_decision(c: &mut Cur<'_>, timestamp_ns: i64) -> Parsed<Event> {
    let session_id = c.str()?;
    let agent_id = c.str()?;
    let organization_id = c.str()?;
    let call_number = c.u64()?;
    let operator_id = c.str()?;
    let decision = c.str()?;
    let note = c.str()?;
    let tool_name = c.str()?;
    let original_nonce = c.u64()?;
    let original_args_digest = Digest(c.arr()?);
    let successor_nonce = match flag(c, "bad successor_nonce presence flag")? {
        false => None,
        true => Some(c.u64()?),
    };
    let successor_digest = match flag(c, "bad successor_args_digest presence flag")? {
        false => None,
        true => Some(Digest(c.arr()?)),
    };
    let budget_remaining = Money(c.i64()?);
    let session_seq = c.u64()?;
    Ok((|| {
        let successor = match (successor_nonce, successor_digest) {
            (Some(n), Some(d)) => Some((n, d)),
            (None, None) => None,
            _ => return Err("only one of successor_nonce and successor_args_digest present"),
        };
        Ok(Event::Session(SessionEvent::HumanDecision(
            DecisionRecord {
                timestamp_ns,
                session_id: utf8(session_id)?,
                agent_id: utf8(agent_id)?,
                organization_id: utf8(organization_id)?,
                call_number,
                operator_id: utf8(operator_id)?,
                decision: entry::decision_from_word(&utf8(decision)?)
                    .ok_or("decision is not approve, reject, modify, defer, escalate or expire")?,
                note: utf8(note)?,
                tool_name: utf8(tool_name)?,
                original_nonce,
                original_args_digest,
                successor,
                budget_remaining,
                session_seq,
            },
        )))
    })())
}

fn parse_closed(c: &mut Cur<'_>, timestamp_ns: i64) -> Parsed<Event> {
    let session_id = c.str()?;
    let agent_id = c.str()?;
    let organization_id = c.str()?;
    let reason = c.str()?;
    let budget_remaining = Money(c.i64()?);
    let session_seq = c.u64()?;
    Ok((|| {
        Ok(Event::Session(SessionEvent::Closed(CloseRecord {
            timestamp_ns,
            session_id: utf8(session_id)?,
            agent_id: utf8(agent_id)?,
            organization_id: utf8(organization_id)?,
            reason: entry::CloseReason::from_word(&utf8(reason)?)
                .ok_or("reason of a session-closed entry is not agent or idle")?,
            budget_remaining,
            session_seq,
        })))
    })())
}

fn parse_policy_set(c: &mut Cur<'_>, timestamp_ns: i64, version: u16) -> Parsed<Event> {
    let digest = Digest(c.arr()?);
    let policies = c.u32()?;
    let default_deny = c.u8()?;
    let trip = c.u8()?;
    let cause = c.str()?;
    // Version 7: the shadow counts.
    let (shadow_policies, shadow_set) = if version >= 7 {
        (c.u32()?, c.u8()?)
    } else {
        (0, 0)
    };
    Ok((|| {
        Ok(Event::PolicySet(PolicySetRecord {
            timestamp_ns,
            digest,
            policies,
            default_deny: bool_value(default_deny, "bad default_deny flag")?,
            trip_on_refusal: bool_value(trip, "bad trip_on_refusal flag")?,
            cause: PolicySetCause::from_word(&utf8(cause)?)
                .ok_or("cause of a policy-set entry is not start or reload")?,
            shadow_policies,
            shadow_set: bool_value(shadow_set, "bad shadow_set flag")?,
        }))
    })())
}

fn parse_void(c: &mut Cur<'_>, timestamp_ns: i64, version: u16) -> Parsed<Event> {
    let session_id = c.str()?;
    let session_seq = c.u64()?;
    let chain_id = c.str()?;
    let reason = c.str()?;
    // Version 4, appended in this order.
    let budget_version = v4_u64(c, version)?;
    let budget_before = Money(if version >= 4 { c.i64()? } else { 0 });
    let budget_after = Money(if version >= 4 { c.i64()? } else { 0 });
    let revert_version = v4_u64(c, version)?;
    Ok((|| {
        Ok(Event::Void(VoidRecord {
            timestamp_ns,
            session_id: utf8(session_id)?,
            session_seq,
            chain_id: utf8(chain_id)?,
            reason: utf8(reason)?,
            budget_version,
            budget_before,
            budget_after,
            revert_version,
        }))
    })())
}

/// A bounds-checked reader over a byte slice.
struct Cur<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cur<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Cur { buf, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        let end = self.pos.checked_add(n).ok_or(Stop::Short)?;
        let s = self.buf.get(self.pos..end).ok_or(Stop::Short)?;
        self.pos = end;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self) -> Result<[u8; N], Stop> {
        <[u8; N]>::try_from(self.take(N)?).map_err(|_| Stop::Short)
    }

    fn u8(&mut self) -> Result<u8, Stop> {
        Ok(u8::from_be_bytes(self.arr()?))
    }

    fn u16(&mut self) -> Result<u16, Stop> {
        Ok(u16::from_be_bytes(self.arr()?))
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        Ok(u32::from_be_bytes(self.arr()?))
    }

    fn u64(&mut self) -> Result<u64, Stop> {
        Ok(u64::from_be_bytes(self.arr()?))
    }

    fn i64(&mut self) -> Result<i64, Stop> {
        Ok(i64::from_be_bytes(self.arr()?))
    }

    /// A `str`: u16 length, then that many bytes (their value is checked later).
    fn str(&mut self) -> Result<&'a [u8], Stop> {
        let len = usize::from(self.u16()?);
        self.take(len)
    }

    /// A `text`: u32 length, then that many bytes (their value is checked later). The
    /// record is at most 64 KiB, so a longer length is simply a field that does not fit.
    fn text(&mut self) -> Result<&'a [u8], Stop> {
        let len = usize::try_from(self.u32()?).map_err(|_| Stop::Short)?;
        self.take(len)
    }
}

/// The smallest possible record, for bounds in docs and tests.
pub const MIN_RECORD_LEN: usize = RECORD_FIXED_PREFIX + RECORD_FIXED_SUFFIX;
