//! Message authentication: HMAC-SHA256 over the envelope's own bytes.
//!
//! **What is MACed.** The envelope's protobuf encoding exactly as sent, with every
//! top-level field-6 (`hmac`) record removed and every other byte kept, in order. A sender
//! encodes the envelope with `hmac` empty (proto3 then writes no field 6), computes the MAC
//! over those bytes, and appends one field-6 record (`0x32`, varint length 32, the MAC): a
//! protobuf reader merges a record appended at the end like any other. Because the MAC
//! covers the bytes, not a re-encoding, map order and encoder choices cannot break it.
//!
//! **Keys.** Each organization has a secret (any bytes, at least 16 of them). Its message
//! key is `HMAC-SHA256(key = secret, message = "tollgate/sp1/message-key/v1")`.
//! Comparison is constant-time.

use hmac::{Hmac, Mac};
use prost::Message;
use sha2::Sha256;

use crate::frame::{decode_envelope, FrameError, MAX_FRAME_LEN};
use crate::sp1::Envelope;

type HmacSha256 = Hmac<Sha256>;

/// The label a message key is derived with.
pub const KEY_LABEL: &[u8] = b"tollgate/sp1/message-key/v1";
/// The envelope's `hmac` field number.
const HMAC_FIELD: u64 = 6;

/// A 32-byte message-authentication key, derived from an organization secret.
#[derive(Clone)]
pub struct MessageKey([u8; 32]);

impl std::fmt::Debug for MessageKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MessageKey(..)")
    }
}

/// Why a message was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The bytes are not an envelope.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// No `hmac` field, or more than one.
    #[error("envelope carries {0} hmac fields; exactly one is required")]
    HmacCount(usize),
    /// The MAC does not match.
    #[error("message authentication failed")]
    BadMac,
}

impl MessageKey {
    /// Derive the message key of an organization secret.
    pub fn derive(org_secret: &[u8]) -> MessageKey {
        let mut out = [0u8; 32];
        // HMAC accepts keys of any length, so this cannot fail.
        if let Ok(mut mac) = HmacSha256::new_from_slice(org_secret) {
            mac.update(KEY_LABEL);
            out.copy_from_slice(&mac.finalize().into_bytes());
        }
        MessageKey(out)
    }

    /// A key from its raw 32 bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> MessageKey {
        MessageKey(bytes)
    }

    fn mac(&self) -> HmacSha256 {
        // A 32-byte key is always accepted; the fallback keeps this panic-free.
        HmacSha256::new_from_slice(&self.0).unwrap_or_else(|_| HmacSha256::new(&[0u8; 64].into()))
    }

    /// The MAC of already-stripped envelope bytes.
    pub fn tag(&self, stripped: &[u8]) -> [u8; 32] {
        let mut m = self.mac();
        m.update(stripped);
        m.finalize().into_bytes().into()
    }
}

/// A message whose MAC has been checked. Only [`Unverified::verify`] makes one.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified<T>(T);

impl<T> Verified<T> {
    /// The verified message.
    pub fn get(&self) -> &T {
        &self.0
    }

    /// Take the verified message.
    pub fn into_inner(self) -> T {
        self.0
    }
}

/// A decoded envelope whose MAC is not yet checked: read it to pick the key (by session or
/// organization), then verify.
#[derive(Debug, Clone)]
pub struct Unverified {
    envelope: Envelope,
    stripped: Vec<u8>,
    tag: Vec<u8>,
    hmac_fields: usize,
}

impl Unverified {
    /// Decode a frame body.
    pub fn decode(body: &[u8]) -> Result<Unverified, AuthError> {
        let envelope = decode_envelope(body)?;
        let (stripped, hmac_fields) = strip_hmac(body)?;
        Ok(Unverified {
            tag: envelope.hmac.clone(),
            envelope,
            stripped,
            hmac_fields,
        })
    }

    /// The envelope, to choose a key. Nothing it says is authenticated yet.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// Check the MAC with `key`, in constant time.
    pub fn verify(self, key: &MessageKey) -> Result<Verified<Envelope>, AuthError> {
        if self.hmac_fields != 1 {
            return Err(AuthError::HmacCount(self.hmac_fields));
        }
        let mut m = key.mac();
        m.update(&self.stripped);
        m.verify_slice(&self.tag).map_err(|_| AuthError::BadMac)?;
        Ok(Verified(self.envelope))
    }
}

/// Encode `envelope` with its MAC: the body of a frame.
pub fn seal(key: &MessageKey, envelope: &Envelope) -> Result<Vec<u8>, FrameError> {
    let mut unsigned = envelope.clone();
    unsigned.hmac.clear();
    let mut body = unsigned.encode_to_vec();
    let tag = key.tag(&body);
    // Field 6, wire type 2: tag byte 0x32, length 32, the MAC.
    body.push(0x32);
    body.push(32);
    body.extend_from_slice(&tag);
    if body.len() > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge {
            len: body.len() as u64,
            max: MAX_FRAME_LEN,
        });
    }
    Ok(body)
}

fn malformed(what: &str) -> AuthError {
    AuthError::Frame(FrameError::Malformed(what.to_owned()))
}

fn read_varint(bytes: &[u8], at: &mut usize) -> Result<u64, AuthError> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *bytes
            .get(*at)
            .ok_or_else(|| malformed("truncated varint"))?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(malformed("varint too long"))
}

/// The envelope bytes without their top-level `hmac` records, and how many there were.
pub fn strip_hmac(body: &[u8]) -> Result<(Vec<u8>, usize), AuthError> {
    let mut out = Vec::with_capacity(body.len());
    let mut at = 0usize;
    let mut count = 0usize;
    while at < body.len() {
        let start = at;
        let key = read_varint(body, &mut at)?;
        let field = key >> 3;
        match key & 7 {
            0 => {
                read_varint(body, &mut at)?;
            }
            1 => at += 8,
            2 => {
                let len = usize::try_from(read_varint(body, &mut at)?)
                    .map_err(|_| malformed("length out of range"))?;
                at = at
                    .checked_add(len)
                    .ok_or_else(|| malformed("length out of range"))?;
            }
            5 => at += 4,
            _ => return Err(malformed("unsupported wire type")),
        }
        if at > body.len() {
            return Err(malformed("truncated field"));
        }
        if field == HMAC_FIELD {
            count += 1;
        } else {
            out.extend_from_slice(body.get(start..at).unwrap_or_default());
        }
    }
    Ok((out, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sp1::{envelope::Payload, PreExecRequest};

    fn envelope() -> Envelope {
        let mut tags = std::collections::HashMap::new();
        tags.insert("b".to_owned(), "2".to_owned());
        tags.insert("a".to_owned(), "1".to_owned());
        Envelope {
            protocol_version: "1.0.0".into(),
            message_id: "0190-abc".into(),
            payload: Some(Payload::PreExec(PreExecRequest {
                session_id: "s_01".into(),
                call_number: 1,
                tool_name: "web_search".into(),
                tool_params_hash: vec![0xde; 32],
                estimated_cost_usd: 0.002,
                nonce: 42,
                tags,
                ..PreExecRequest::default()
            })),
            ..Envelope::default()
        }
    }

    #[test]
    fn sealed_messages_verify_with_the_right_key_only() {
        let key = MessageKey::derive(b"org secret of at least 16 bytes");
        let body = seal(&key, &envelope()).unwrap();
        let v = Unverified::decode(&body).unwrap().verify(&key).unwrap();
        assert_eq!(v.get().payload, envelope().payload);
        let other = MessageKey::derive(b"another org's secret value");
        assert_eq!(
            Unverified::decode(&body).unwrap().verify(&other),
            Err(AuthError::BadMac)
        );
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let key = MessageKey::derive(b"org secret of at least 16 bytes");
        let body = seal(&key, &envelope()).unwrap();
        for i in 0..body.len() {
            let mut bad = body.clone();
            bad[i] ^= 0x01;
            let accepted = Unverified::decode(&bad)
                .and_then(|u| u.verify(&key))
                .is_ok();
            assert!(!accepted, "flip at byte {i} accepted");
        }
    }

    #[test]
    fn missing_or_doubled_hmac_is_refused() {
        let key = MessageKey::derive(b"org secret of at least 16 bytes");
        let plain = envelope().encode_to_vec();
        assert_eq!(
            Unverified::decode(&plain).unwrap().verify(&key),
            Err(AuthError::HmacCount(0))
        );
        let mut twice = seal(&key, &envelope()).unwrap();
        let tail = twice[twice.len() - 34..].to_vec();
        twice.extend_from_slice(&tail);
        assert_eq!(
            Unverified::decode(&twice).unwrap().verify(&key),
            Err(AuthError::HmacCount(2))
        );
    }

    #[test]
    fn the_mac_covers_bytes_as_sent_not_a_re_encoding() {
        // A sender may order fields differently from prost: MAC its bytes, append field 6.
        let key = MessageKey::derive(b"org secret of at least 16 bytes");
        let mut body = Vec::new();
        // message_id (field 2) before protocol_version (field 1): legal protobuf.
        body.extend_from_slice(&[0x12, 0x01, b'm']);
        body.extend_from_slice(&[0x0a, 0x05]);
        body.extend_from_slice(b"1.0.0");
        let tag = key.tag(&body);
        body.extend_from_slice(&[0x32, 32]);
        body.extend_from_slice(&tag);
        let v = Unverified::decode(&body).unwrap().verify(&key).unwrap();
        assert_eq!(v.get().message_id, "m");
    }

    #[test]
    fn known_answer_from_docs_protocol_md() {
        // docs/protocol.md's worked example, computed with Python's hmac module.
        let body = hex_bytes("0a05312e302e3012026d31");
        let key = MessageKey::derive(b"secret");
        let tag = key.tag(&body);
        let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "84a51d6a81137fbdd149d644ad51a2402852226819e07e8b460f526123d0a7a4"
        );
        let sealed = hex_bytes("0a05312e302e3012026d31322084a51d6a81137fbdd149d644ad51a2402852226819e07e8b460f526123d0a7a4");
        let v = Unverified::decode(&sealed).unwrap().verify(&key).unwrap();
        assert_eq!(
            (
                v.get().protocol_version.as_str(),
                v.get().message_id.as_str()
            ),
            ("1.0.0", "m1")
        );
        // And our own sealing of the same envelope produces exactly those bytes.
        let env = Envelope {
            protocol_version: "1.0.0".into(),
            message_id: "m1".into(),
            ..Envelope::default()
        };
        assert_eq!(seal(&key, &env).unwrap(), sealed);
    }

    fn hex_bytes(h: &str) -> Vec<u8> {
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn key_derivation_is_fixed() {
        // Known answer, computed with Python's hmac module:
        // hmac.new(b"secret", b"tollgate/sp1/message-key/v1", hashlib.sha256).hexdigest()
        let k = MessageKey::derive(b"secret");
        let hex: String = k.0.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5ae61e6c217b231e03ef56b9d7b0f70a672c3d47f9ccfbdd29b034b91d093b58"
        );
    }
}
