//! A SHA-256 digest with hex text form.

use std::fmt;

/// A SHA-256 digest: the params hash of SP/1.0 and the board protocol's request digest.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Digest(pub [u8; 32]);

/// Text that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a SHA-256 digest (64 hex digits)")]
pub struct BadDigest(pub String);

impl Digest {
    /// Parse 64 hex digits (either case). Surrounding whitespace is ignored.
    pub fn from_hex(text: &str) -> Result<Digest, BadDigest> {
        let t = text.trim().as_bytes();
        let bad = || BadDigest(text.chars().take(80).collect());
        if t.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (slot, pair) in out.iter_mut().zip(t.chunks_exact(2)) {
            let hi = hex_val(pair.first().copied()).ok_or_else(bad)?;
            let lo = hex_val(pair.get(1).copied()).ok_or_else(bad)?;
            *slot = (hi << 4) | lo;
        }
        Ok(Digest(out))
    }

    /// The digest from raw bytes, if there are exactly 32.
    pub fn from_slice(bytes: &[u8]) -> Option<Digest> {
        <[u8; 32]>::try_from(bytes).ok().map(Digest)
    }

    /// SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        use sha2::Digest as _;
        Digest(sha2::Sha256::digest(bytes).into())
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

fn hex_val(b: Option<u8>) -> Option<u8> {
    match b? {
        b @ b'0'..=b'9' => Some(b - b'0'),
        b @ b'a'..=b'f' => Some(b - b'a' + 10),
        b @ b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let text = "f487a46f520575a76a1537f2235bd32acdefa067fc54a69d7e85962650ac7efc";
        let d = Digest::from_hex(text).unwrap();
        assert_eq!(d.to_string(), text);
        assert_eq!(Digest::from_hex(&text.to_uppercase()).unwrap(), d);
        assert!(Digest::from_hex(&text[1..]).is_err());
        assert!(Digest::from_hex(&text.replace('f', "g")).is_err());
        assert_eq!(Digest::from_slice(&d.0), Some(d));
        assert_eq!(Digest::from_slice(&[0; 31]), None);
    }
}
