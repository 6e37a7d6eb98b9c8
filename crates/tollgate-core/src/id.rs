//! Identifiers: agent, organization and session ids, one rule everywhere.
//!
//! An id is 1 to [`MAX_ID_BYTES`] bytes, each an ASCII letter or digit or one of
//! `. _ - : / @ +`. Nothing else: no space or other whitespace, no control character, no
//! non-ASCII byte (so no invisible or look-alike character such as U+00A0, U+2028 or
//! U+3000 can make two ids that read the same differ). Ids are compared exactly, byte for
//! byte: `Bot` and `bot` are two ids.
//!
//! Every transport (the Unix socket, gRPC, the in-process library, the MCP gateway's
//! configuration) and the daemon's configuration check ids with [`check_id`], so an id
//! that one of them accepts is an id every other accepts too.

use std::fmt;

/// The longest id, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// The longest upstream name (the policies' resource `Upstream::"NAME"`), in bytes.
pub const MAX_UPSTREAM_BYTES: usize = 256;

/// Whether `name` may name an upstream: 1 to [`MAX_UPSTREAM_BYTES`] bytes, no control
/// character. The one rule the policies' resources (`tollgate-policy`) and the audit
/// log's recorded upstreams (`tollgate-audit`, format version 8) share, so a replay
/// decides a call for the resource it was decided for.
pub fn is_upstream_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_UPSTREAM_BYTES && !name.chars().any(char::is_control)
}

/// The punctuation an id may contain besides ASCII letters and digits.
pub const ID_PUNCTUATION: &str = "._-:/@+";

/// Why an id is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdError {
    /// The id is empty.
    Empty,
    /// The id is longer than [`MAX_ID_BYTES`] bytes (its length).
    TooLong(usize),
    /// The id holds a character outside the set, at this byte offset (the character, or
    /// for a byte that is not the start of one, U+FFFD).
    BadCharacter {
        /// Byte offset of the character.
        at: usize,
        /// The character.
        found: char,
    },
}

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdError::Empty => f.write_str("is empty (an id is 1 to 128 bytes)"),
            IdError::TooLong(n) => {
                write!(f, "is {n} bytes long (an id is at most {MAX_ID_BYTES} bytes)")
            }
            IdError::BadCharacter { at, found } => write!(
                f,
                "holds {} at byte {at} (an id is ASCII letters, digits and `{ID_PUNCTUATION}` only)",
                found.escape_unicode()
            ),
        }
    }
}

impl std::error::Error for IdError {}

/// Whether `b` may appear in an id.
pub const fn is_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/' | b'@' | b'+')
}

/// Check an id against the one rule (see the module documentation).
pub fn check_id(id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty);
    }
    if id.len() > MAX_ID_BYTES {
        return Err(IdError::TooLong(id.len()));
    }
    match id
        .char_indices()
        .find(|&(_, c)| u8::try_from(c).map_or(true, |b| !is_id_byte(b)))
    {
        None => Ok(()),
        Some((at, found)) => Err(IdError::BadCharacter { at, found }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set() {
        for ok in [
            "a",
            "research-bot",
            "pa-0",
            "acme.example:bot/1@x+y_z",
            &"x".repeat(128),
        ] {
            assert_eq!(check_id(ok), Ok(()), "{ok:?}");
        }
        assert_eq!(check_id(""), Err(IdError::Empty));
        assert_eq!(check_id(&"x".repeat(129)), Err(IdError::TooLong(129)));
        for bad in [
            "research-bot ",
            " bot",
            "a b",
            "a\tb",
            "a\nb",
            "a\u{0}b",
            "a\u{7f}b",
            "bot\u{a0}",
            "bot\u{2028}",
            "bot\u{3000}",
            "bot\u{200b}",
            "bo\u{0442}",
            "a\"b",
            "a\\b",
            "a,b",
            "a#b",
        ] {
            assert!(
                matches!(check_id(bad), Err(IdError::BadCharacter { .. })),
                "{bad:?}"
            );
        }
        let e = check_id("research-bot ").unwrap_err();
        assert_eq!(e, IdError::BadCharacter { at: 12, found: ' ' });
        assert!(e.to_string().contains("\\u{20}"), "{e}");
    }
}
