//! Ed25519 keys, key ids and the key file format.
//!
//! A key file is one line of text (a trailing newline is allowed, and lines starting with
//! `#` are comments):
//!
//! ```text
//! tollgate-ed25519-secret-v1 <64 lowercase hex digits: the 32-byte seed>
//! tollgate-ed25519-public-v1 <64 lowercase hex digits: the 32-byte public key>
//! ```
//!
//! The key id is the first 8 bytes of SHA-256 over the 32 public key bytes.

use std::fmt;

use ed25519_dalek::{SigningKey, VerifyingKey};
use sha2::{Digest as _, Sha256};

/// The tag of a secret key file line.
pub const SECRET_TAG: &str = "tollgate-ed25519-secret-v1";
/// The tag of a public key file line.
pub const PUBLIC_TAG: &str = "tollgate-ed25519-public-v1";

/// The first 8 bytes of SHA-256 over a public key. Displayed as 16 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 8]);

impl KeyId {
    /// The id of a public key.
    pub fn of(public: &[u8; 32]) -> KeyId {
        let h = Sha256::digest(public);
        let mut id = [0u8; 8];
        for (slot, b) in id.iter_mut().zip(h.iter()) {
            *slot = *b;
        }
        KeyId(id)
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// A key file that cannot be read as a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyFileError {
    /// No line with the expected tag.
    #[error("no `{expected}` line found")]
    MissingTag {
        /// The tag that was expected.
        expected: &'static str,
    },
    /// The hex after the tag is not 64 hex digits.
    #[error("key material is not 64 hex digits")]
    BadHex,
    /// The 32 bytes are not a valid Ed25519 public key.
    #[error("not a valid Ed25519 public key")]
    BadPublicKey,
}

/// A fresh signing key from the operating system's random source.
pub fn generate() -> Result<SigningKey, getrandom::Error> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed)?;
    Ok(SigningKey::from_bytes(&seed))
}

/// The key id of a verifying key.
pub fn key_id(key: &VerifyingKey) -> KeyId {
    KeyId::of(key.as_bytes())
}

/// The text of a secret key file.
pub fn secret_key_text(key: &SigningKey) -> String {
    format!(
        "# tollgate audit signing key, key id {}; keep secret (mode 0600)\n{SECRET_TAG} {}\n",
        key_id(&key.verifying_key()),
        hex(key.as_bytes())
    )
}

/// The text of a public key file.
pub fn public_key_text(key: &VerifyingKey) -> String {
    format!(
        "# tollgate audit public key, key id {}\n{PUBLIC_TAG} {}\n",
        key_id(key),
        hex(key.as_bytes())
    )
}

/// Read a secret key file.
pub fn parse_secret_key(text: &str) -> Result<SigningKey, KeyFileError> {
    let bytes = tagged_hex(text, SECRET_TAG)?;
    Ok(SigningKey::from_bytes(&bytes))
}

/// Read a public key file. A secret key file is accepted too (its public half is used).
pub fn parse_public_key(text: &str) -> Result<VerifyingKey, KeyFileError> {
    match tagged_hex(text, PUBLIC_TAG) {
        Ok(bytes) => VerifyingKey::from_bytes(&bytes).map_err(|_| KeyFileError::BadPublicKey),
        // Neither tag: say the one a public key file has (what was asked for).
        Err(KeyFileError::MissingTag { .. }) => match parse_secret_key(text) {
            Ok(k) => Ok(k.verifying_key()),
            Err(KeyFileError::MissingTag { .. }) => Err(KeyFileError::MissingTag {
                expected: PUBLIC_TAG,
            }),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}

fn tagged_hex(text: &str, tag: &'static str) -> Result<[u8; 32], KeyFileError> {
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix(tag) {
            if !rest.starts_with(' ') {
                continue;
            }
            return unhex32(rest.trim()).ok_or(KeyFileError::BadHex);
        }
    }
    Err(KeyFileError::MissingTag { expected: tag })
}

/// Lowercase hex of some bytes.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// 64 hex digits to 32 bytes.
pub(crate) fn unhex32(text: &str) -> Option<[u8; 32]> {
    let v = unhex(text)?;
    <[u8; 32]>::try_from(v.as_slice()).ok()
}

/// Hex digits (either case, even count) to bytes.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if !t.len().is_multiple_of(2) {
        return None;
    }
    t.chunks_exact(2)
        .map(|pair| {
            let hi = hex_val(*pair.first()?)?;
            let lo = hex_val(*pair.get(1)?)?;
            Some((hi << 4) | lo)
        })
        .collect()
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_round_trip() {
        let k = SigningKey::from_bytes(&[7u8; 32]);
        let secret = secret_key_text(&k);
        let public = public_key_text(&k.verifying_key());
        assert_eq!(parse_secret_key(&secret).unwrap().to_bytes(), k.to_bytes());
        assert_eq!(parse_public_key(&public).unwrap(), k.verifying_key());
        assert_eq!(parse_public_key(&secret).unwrap(), k.verifying_key());
        assert!(matches!(
            parse_secret_key(&public),
            Err(KeyFileError::MissingTag { .. })
        ));
        assert_eq!(
            parse_secret_key(&format!("{SECRET_TAG} abc")),
            Err(KeyFileError::BadHex)
        );
        // A file that is no key at all (a policy given as `--key`): the public tag is
        // what is said missing, since a public key is what was asked for.
        assert_eq!(
            parse_public_key("forbid (principal, action, resource);\n")
                .unwrap_err()
                .to_string(),
            "no `tollgate-ed25519-public-v1` line found"
        );
    }

    #[test]
    fn key_id_is_sha256_prefix() {
        // SHA-256 of 32 zero bytes starts 66687aadf862bd77.
        assert_eq!(KeyId::of(&[0u8; 32]).to_string(), "66687aadf862bd77");
    }
}
