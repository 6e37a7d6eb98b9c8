//! The byte layout of a log file: header, records, signed bytes, hashes. Pure functions
//! over bytes; docs/audit-format.md is the normative description and must agree with
//! this file. All integers are big-endian.

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::{Digest as _, Sha256};
use tollgate_core::{Digest, Money, Reason};
use uuid::Uuid;

use crate::entry::{self, AuditEntry, Event, VerdictRecord};
use crate::keys::KeyId;

/// The first 8 bytes of every log file.
pub const MAGIC: [u8; 8] = *b"TGAUDIT\0";
/// The format version this crate writes and reads.
pub const FORMAT_VERSION: u16 = 1;
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
/// The longest string field, in bytes of UTF-8.
pub const MAX_STR_LEN: usize = 1024;
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
    /// The public key is not a valid Ed25519 point.
    #[error("header public key is not a valid Ed25519 key")]
    PublicKey,
    /// The header signature does not verify.
    #[error("header signature does not verify")]
    Signature,
}

impl FileHeader {
    /// Build and sign a header.
    pub fn new_signed(
        key: &SigningKey,
        file_seq: u64,
        first_index: u64,
        prev_hash: Digest,
        created_ns: i64,
    ) -> FileHeader {
        let public_key = key.verifying_key().to_bytes();
        let mut h = FileHeader {
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
        b.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
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
    pub fn decode(bytes: &[u8]) -> Result<FileHeader, HeaderError> {
        let mut c = Cur::new(bytes);
        let short = |_| HeaderError::Short(bytes.len());
        if c.arr::<8>().map_err(short)? != MAGIC {
            return Err(HeaderError::Magic);
        }
        let version = c.u16().map_err(short)?;
        if version != FORMAT_VERSION {
            return Err(HeaderError::Version(version));
        }
        let h = FileHeader {
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
        VerifyingKey::from_bytes(&self.public_key).map_err(|_| HeaderError::PublicKey)
    }
}

/// Why bytes at a record position are not a whole record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The file ends inside the record (or only zero bytes follow): a torn write.
    #[error("torn record: the file ends inside it ({available} bytes present)")]
    Torn {
        /// Bytes from the record start to the end of the file.
        available: usize,
    },
    /// The length prefix disagrees with the length of the record's contents.
    #[error("length prefix says {declared} bytes but the record holds {actual}")]
    LengthMismatch {
        /// What the prefix says.
        declared: u32,
        /// What the contents need.
        actual: usize,
    },
    /// The record is longer than `MAX_RECORD_LEN`.
    #[error("record of {0} bytes exceeds the 64 KiB limit")]
    TooLarge(usize),
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

/// An entry that cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A string field is longer than `MAX_STR_LEN` bytes.
    #[error("field `{field}` is {len} bytes; the limit is 1024")]
    FieldTooLong {
        /// The field's name.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
    },
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

/// Encode and sign one record; returns its bytes (length prefix through signature).
pub fn encode_record(
    pos: Position<'_>,
    event: &Event,
    key: &SigningKey,
    key_id: KeyId,
) -> Result<Vec<u8>, EncodeError> {
    let mut b = Vec::with_capacity(256);
    b.extend_from_slice(&[0u8; 4]);
    b.push(event.kind());
    b.extend_from_slice(&pos.index.to_be_bytes());
    b.extend_from_slice(&pos.timestamp_ns.to_be_bytes());
    b.extend_from_slice(pos.entry_id.as_bytes());
    b.extend_from_slice(&key_id.0);
    match event {
        Event::Verdict(v) => encode_verdict(&mut b, v)?,
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
    }
    b.extend_from_slice(&pos.prev_hash.0);
    // The length covers everything after the prefix, signature included.
    let body_len = b.len() - 4 + 64;
    // Bounded by MAX_STR_LEN per field: a record is at most a few KiB.
    let prefix = u32::try_from(body_len).unwrap_or(u32::MAX).to_be_bytes();
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

fn encode_verdict(b: &mut Vec<u8>, v: &VerdictRecord) -> Result<(), EncodeError> {
    put_str(b, "session_id", &v.session_id)?;
    put_str(b, "agent_id", &v.agent_id)?;
    put_str(b, "organization_id", &v.organization_id)?;
    b.extend_from_slice(&v.call_number.to_be_bytes());
    put_str(b, "tool_name", &v.tool_name)?;
    b.extend_from_slice(&v.params_hash.0);
    b.push(entry::verdict_code(v.verdict));
    b.push(entry::deny_code(v.deny_reason));
    put_str(b, "reason", v.reason.as_str())?;
    b.push(u8::from(v.probabilistic));
    b.extend_from_slice(&v.budget_before.0.to_be_bytes());
    b.extend_from_slice(&v.budget_after.0.to_be_bytes());
    match &v.operator_id {
        None => b.push(0),
        Some(op) => {
            b.push(1);
            put_str(b, "operator_id", op)?;
        }
    }
    b.extend_from_slice(&v.estimated_cost.0.to_be_bytes());
    b.extend_from_slice(&v.nonce.to_be_bytes());
    match &v.config_digest {
        None => b.push(0),
        Some(d) => {
            b.push(1);
            b.extend_from_slice(&d.0);
        }
    }
    Ok(())
}

fn put_str(b: &mut Vec<u8>, field: &'static str, s: &str) -> Result<(), EncodeError> {
    let len = s.len();
    if len > MAX_STR_LEN {
        return Err(EncodeError::FieldTooLong { field, len });
    }
    // len <= 1024 fits in u16.
    b.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes());
    b.extend_from_slice(s.as_bytes());
    Ok(())
}

/// Parse the record that starts at the beginning of `bytes` (which may run on to the end
/// of the file). Returns the record and how many bytes it occupies. Checks structure only:
/// signatures and links are the verifier's job.
///
/// The contents are self-delimiting, so the length prefix is checked against them: a
/// changed prefix is reported as [`RecordError::LengthMismatch`], not misread.
pub fn parse_record(bytes: &[u8]) -> Result<(Record<'_>, usize), RecordError> {
    let torn = || RecordError::Torn {
        available: bytes.len(),
    };
    let window = bytes.get(..MAX_RECORD_LEN).unwrap_or(bytes);
    let mut c = Cur::new(window);
    let result = parse_fields(&mut c);
    let (declared, entry) = match result {
        Ok(v) => v,
        Err(Short) if window.len() == bytes.len() => return Err(torn()),
        Err(Short) => return Err(RecordError::TooLarge(MAX_RECORD_LEN + 1)),
    };
    let entry = match entry {
        Ok(e) => e,
        Err(what) => {
            // A run of zero bytes to the end of the file is what a crash leaves on some
            // file systems: that is a torn tail, not a tampered record.
            if bytes.iter().all(|&b| b == 0) {
                return Err(torn());
            }
            return Err(RecordError::Malformed(what));
        }
    };
    let actual = c.pos;
    if usize::try_from(declared)
        .ok()
        .and_then(|d| d.checked_add(4))
        != Some(actual)
    {
        return Err(RecordError::LengthMismatch {
            declared,
            actual: actual.saturating_sub(4),
        });
    }
    let raw = bytes.get(..actual).ok_or_else(torn)?;
    Ok((Record { entry, raw }, actual))
}

/// Too few bytes.
#[derive(Debug)]
struct Short;

type Fields = (u32, Result<AuditEntry, &'static str>);

fn parse_fields(c: &mut Cur<'_>) -> Result<Fields, Short> {
    let declared = c.u32()?;
    let kind = c.u8()?;
    let index = c.u64()?;
    let timestamp_ns = c.i64()?;
    let entry_id = Uuid::from_bytes(c.arr()?);
    let key_id = KeyId(c.arr()?);
    let event = match kind {
        1 => parse_verdict(c, timestamp_ns)?.map(Event::Verdict),
        2 => Ok(Event::KeyHandover {
            new_public_key: c.arr()?,
        }),
        3 => (|| {
            let file = c.str()?;
            let offset = c.u64()?;
            let length = c.u64()?;
            let sha256 = Digest(c.arr()?);
            let moved_to = c.str()?;
            Ok(match (file, moved_to) {
                (Ok(file), Ok(moved_to)) => Ok(Event::Recovery {
                    file,
                    offset,
                    length,
                    sha256,
                    moved_to,
                }),
                (Err(e), _) | (_, Err(e)) => Err(e),
            })
        })()?,
        _ => Err("unknown record kind"),
    };
    let event = match event {
        Ok(e) => e,
        Err(what) => return Ok((declared, Err(what))),
    };
    let prev_hash = Digest(c.arr()?);
    let signature = c.arr()?;
    Ok((
        declared,
        Ok(AuditEntry {
            index,
            timestamp_ns,
            entry_id,
            key_id,
            event,
            prev_hash,
            signature,
        }),
    ))
}

fn parse_verdict(
    c: &mut Cur<'_>,
    timestamp_ns: i64,
) -> Result<Result<VerdictRecord, &'static str>, Short> {
    let session_id = c.str()?;
    let agent_id = c.str()?;
    let organization_id = c.str()?;
    let call_number = c.u64()?;
    let tool_name = c.str()?;
    let params_hash = Digest(c.arr()?);
    let verdict = entry::verdict_from_code(c.u8()?);
    let deny = entry::deny_from_code(c.u8()?);
    let reason = c.str()?;
    let probabilistic = c.u8()?;
    let budget_before = Money(c.i64()?);
    let budget_after = Money(c.i64()?);
    let operator_id = match c.u8()? {
        0 => Ok(None),
        1 => c.str()?.map(Some),
        _ => Err("bad operator_id presence flag"),
    };
    let estimated_cost = Money(c.i64()?);
    let nonce = c.u64()?;
    let config_digest = match c.u8()? {
        0 => Ok(None),
        1 => Ok(Some(Digest(c.arr()?))),
        _ => Err("bad config_digest presence flag"),
    };
    Ok((|| {
        Ok(VerdictRecord {
            timestamp_ns,
            session_id: session_id?,
            agent_id: agent_id?,
            organization_id: organization_id?,
            call_number,
            tool_name: tool_name?,
            params_hash,
            verdict: verdict.ok_or("unknown verdict code")?,
            deny_reason: deny.map_err(|()| "unknown deny reason code")?,
            reason: reason?
                .parse::<Reason>()
                .map_err(|_| "unknown reason string")?,
            probabilistic: match probabilistic {
                0 => false,
                1 => true,
                _ => return Err("bad probabilistic flag"),
            },
            budget_before,
            budget_after,
            operator_id: operator_id?,
            estimated_cost,
            nonce,
            config_digest: config_digest?,
        })
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

    fn take(&mut self, n: usize) -> Result<&'a [u8], Short> {
        let end = self.pos.checked_add(n).ok_or(Short)?;
        let s = self.buf.get(self.pos..end).ok_or(Short)?;
        self.pos = end;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self) -> Result<[u8; N], Short> {
        <[u8; N]>::try_from(self.take(N)?).map_err(|_| Short)
    }

    fn u8(&mut self) -> Result<u8, Short> {
        Ok(u8::from_be_bytes(self.arr()?))
    }

    fn u16(&mut self) -> Result<u16, Short> {
        Ok(u16::from_be_bytes(self.arr()?))
    }

    fn u32(&mut self) -> Result<u32, Short> {
        Ok(u32::from_be_bytes(self.arr()?))
    }

    fn u64(&mut self) -> Result<u64, Short> {
        Ok(u64::from_be_bytes(self.arr()?))
    }

    fn i64(&mut self) -> Result<i64, Short> {
        Ok(i64::from_be_bytes(self.arr()?))
    }

    /// A u16-prefixed UTF-8 string; the inner error is a malformed value.
    fn str(&mut self) -> Result<Result<String, &'static str>, Short> {
        let len = usize::from(self.u16()?);
        let bytes = self.take(len)?;
        if len > MAX_STR_LEN {
            return Ok(Err("string longer than 1024 bytes"));
        }
        Ok(std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| "string is not UTF-8"))
    }
}

/// The smallest possible record, for bounds in docs and tests.
pub const MIN_RECORD_LEN: usize = RECORD_FIXED_PREFIX + RECORD_FIXED_SUFFIX;
