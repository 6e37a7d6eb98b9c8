//! Signed checkpoints: "the log held `count` entries, the last of which hashed to
//! `last_hash`", signed by the log's key. A verifier that kept an older checkpoint detects
//! a log cut back below it.
//!
//! Text form (one field a line, in this order, `\n` line ends):
//!
//! ```text
//! tollgate-audit-checkpoint-v1
//! count 1234
//! last-hash <64 hex>
//! time-ns 1764484800000000000
//! key-id <16 hex>
//! signature <128 hex>
//! ```

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use tollgate_core::Digest;

use crate::keys::{hex, unhex, KeyId};

/// The largest checkpoint file a reader accepts (one is about 330 bytes).
pub const MAX_CHECKPOINT_BYTES: u64 = 4096;
/// The first line of a checkpoint file.
pub const CHECKPOINT_TAG: &str = "tollgate-audit-checkpoint-v1";
/// Domain separation prefix of a checkpoint's signed bytes.
pub const CHECKPOINT_DOMAIN: &[u8] = b"tollgate-audit/v1 checkpoint\0";

/// A signed statement of the log's length and tip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Entries in the chain (the next index to be written).
    pub count: u64,
    /// Hash of the entry at index `count - 1`.
    pub last_hash: Digest,
    /// When the checkpoint was made, nanoseconds since the Unix epoch.
    pub time_ns: i64,
    /// The key that signed it.
    pub key_id: KeyId,
    /// Ed25519 signature over [`Checkpoint::signed_bytes`].
    pub signature: [u8; 64],
}

/// Text that is not a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// A line is missing or not what was expected.
    #[error("checkpoint line {line}: expected `{expected}`")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What should be there.
        expected: &'static str,
    },
}

impl Checkpoint {
    /// Make and sign a checkpoint.
    pub fn new_signed(key: &SigningKey, count: u64, last_hash: Digest, time_ns: i64) -> Self {
        let mut c = Checkpoint {
            count,
            last_hash,
            time_ns,
            key_id: KeyId::of(key.verifying_key().as_bytes()),
            signature: [0u8; 64],
        };
        c.signature = key.sign(&c.signed_bytes()).to_bytes();
        c
    }

    /// `CHECKPOINT_DOMAIN || count (u64 BE) || last_hash (32) || time_ns (i64 BE) ||
    /// key_id (8)`.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut m = Vec::with_capacity(CHECKPOINT_DOMAIN.len() + 56);
        m.extend_from_slice(CHECKPOINT_DOMAIN);
        m.extend_from_slice(&self.count.to_be_bytes());
        m.extend_from_slice(&self.last_hash.0);
        m.extend_from_slice(&self.time_ns.to_be_bytes());
        m.extend_from_slice(&self.key_id.0);
        m
    }

    /// Whether `key` signed this checkpoint.
    pub fn verify_with(&self, key: &VerifyingKey) -> bool {
        KeyId::of(key.as_bytes()) == self.key_id
            && key
                .verify_strict(
                    &self.signed_bytes(),
                    &ed25519_dalek::Signature::from_bytes(&self.signature),
                )
                .is_ok()
    }

    /// The text form.
    pub fn to_text(&self) -> String {
        format!(
            "{CHECKPOINT_TAG}\ncount {}\nlast-hash {}\ntime-ns {}\nkey-id {}\nsignature {}\n",
            self.count,
            self.last_hash,
            self.time_ns,
            self.key_id,
            hex(&self.signature)
        )
    }

    /// Parse the text form (the signature is not checked here). Lines may end in `\n`
    /// or `\r\n` and carry surrounding spaces; after the six lines only blank lines may
    /// follow.
    pub fn parse(text: &str) -> Result<Checkpoint, CheckpointError> {
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let bad = |line: usize, expected: &'static str| CheckpointError::Line { line, expected };
        let field = |i: usize, name: &'static str| -> Result<&str, CheckpointError> {
            lines
                .get(i)
                .and_then(|l| l.strip_prefix(name))
                .and_then(|r| r.strip_prefix(' '))
                .map(str::trim)
                .ok_or(bad(i + 1, name))
        };
        if lines.first() != Some(&CHECKPOINT_TAG) {
            return Err(bad(1, CHECKPOINT_TAG));
        }
        let count = field(1, "count")?.parse().map_err(|_| bad(2, "count"))?;
        let last_hash =
            Digest::from_hex(field(2, "last-hash")?).map_err(|_| bad(3, "last-hash"))?;
        let time_ns = field(3, "time-ns")?
            .parse()
            .map_err(|_| bad(4, "time-ns"))?;
        let key_id = unhex(field(4, "key-id")?)
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map(KeyId)
            .ok_or(bad(5, "key-id"))?;
        let signature = unhex(field(5, "signature")?)
            .and_then(|v| <[u8; 64]>::try_from(v.as_slice()).ok())
            .ok_or(bad(6, "signature"))?;
        if let Some(extra) = lines.iter().skip(6).position(|l| !l.is_empty()) {
            return Err(bad(extra + 7, "end of checkpoint"));
        }
        Ok(Checkpoint {
            count,
            last_hash,
            time_ns,
            key_id,
            signature,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip_and_signature() {
        let k = SigningKey::from_bytes(&[3u8; 32]);
        let c = Checkpoint::new_signed(&k, 42, Digest([9u8; 32]), 1_000);
        let parsed = Checkpoint::parse(&c.to_text()).unwrap();
        assert_eq!(parsed, c);
        assert!(parsed.verify_with(&k.verifying_key()));
        let mut forged = parsed.clone();
        forged.count = 43;
        assert!(!forged.verify_with(&k.verifying_key()));
        assert!(Checkpoint::parse("nonsense").is_err());
        assert!(Checkpoint::parse(&c.to_text().replace("count 42", "count x")).is_err());
    }
}
