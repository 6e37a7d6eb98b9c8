//! The daemon's side of Cedar policies (issue 18): the `[policy]` set loaded at start, and
//! the call's params on the wire (`PreExecRequest.tool_params`, docs/protocol.md §4.3.1).
//!
//! Loading and validation are `tollgate-policy`'s ([`tollgate_policy::load()`]), the same
//! loader and the same `file:line:col` messages as `tollgate policy check`; this module
//! only reads the files, bounded.
//!
//! **Not done yet:** deciding with the set (`tollgate_policy::compose::decide` in the
//! service core). A policy's non-tripping DENY, its HITL, a verdict's deciding policy id,
//! the session's flow labels and the set's digest have no place in the audit format
//! (version 4), and the session state is the fold of that log, so enforcing needs a new
//! format version first. Until then a daemon configured with a valid `[policy]` set
//! refuses to start ([`load`]) rather than run without the rules it was given.

use std::path::Path;

use tollgate_core::json::{self, Limits};
use tollgate_core::{Digest, Params};
use tollgate_policy::{Options, Source};
use tollgate_proto::sp1;
use tollgate_proto::MAX_TOOL_PARAMS_BYTES;

use crate::config::PolicySettings;
use crate::service::{refuse, Refusal};
use tollgate_proto::sp1::ErrorCode;

/// Why a `[policy]` set does not start a daemon.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A file cannot be read (or is not UTF-8).
    #[error("policy: {0}")]
    Read(String),
    /// The loader refused the set: every finding, one per line, `file:line:col:
    /// error[code]: message` (then a help line), as `tollgate policy check` prints them.
    #[error("policy set refused:\n{0}")]
    Refused(String),
    /// The set is valid, but this daemon does not enforce policies yet.
    #[error("policy set loaded ({policies} policies, digest {digest}), but `tollgate serve` does not enforce policies yet (the audit log cannot record policy verdicts, labels or the set's digest): refusing to start rather than run without them; remove [policy] to run without policies, or use `tollgate policy check` to validate the files")]
    NotEnforced {
        /// How many policies the set holds.
        policies: usize,
        /// The set's digest.
        digest: Digest,
    },
}

/// A file's text as a [`Source`] named by its path: at most
/// [`tollgate_policy::load::MAX_FILE_BYTES`] + 1 bytes are read (the loader then reports
/// the file as too large), and text that is not UTF-8 is an error. `tollgate policy check`
/// reads its files with this too.
pub fn read_source(path: &Path) -> Result<Source, String> {
    use std::io::Read as _;
    let limit = u64::try_from(tollgate_policy::load::MAX_FILE_BYTES).unwrap_or(u64::MAX);
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limit.saturating_add(1)).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| format!("`{}` is not UTF-8 text: {e}", path.display()))?;
    Ok(Source::new(path.display().to_string(), text))
}

/// Load the configured set with `tollgate-policy`'s loader. A set that does not load is
/// [`PolicyError::Refused`] with every finding; one that loads is, for now,
/// [`PolicyError::NotEnforced`] (see the module's documentation).
pub fn load(settings: &PolicySettings) -> Result<tollgate_policy::Policies, PolicyError> {
    let sources = settings
        .files
        .iter()
        .map(|p| read_source(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(PolicyError::Read)?;
    let schema = settings
        .schema
        .as_deref()
        .map(read_source)
        .transpose()
        .map_err(PolicyError::Read)?;
    let options = Options {
        default: settings.default,
        schema,
    };
    let loaded = tollgate_policy::load(&sources, &options).map_err(|e| {
        let lines: Vec<String> = e.findings.iter().map(ToString::to_string).collect();
        PolicyError::Refused(lines.join("\n"))
    })?;
    for w in &loaded.warnings {
        tracing::warn!("policy: {w}");
    }
    Ok(loaded.policies)
}

/// Check the set at start: loads it, then refuses it as not enforced yet.
pub(crate) fn check_at_start(settings: &PolicySettings) -> Result<(), PolicyError> {
    let set = load(settings)?;
    Err(PolicyError::NotEnforced {
        policies: set.len(),
        digest: set.digest(),
    })
}

/// What a pre_exec request's `tool_params` say about its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SentParams {
    /// None sent (or the client itself said its params are not canonical).
    None,
    /// Sent, and their canonical form hashes to `tool_params_hash`.
    Match,
    /// Sent, and they are not JSON, not canonicalizable, or hash to something else: the
    /// client's params and hash disagree. The call is decided as malformed input, a DENY
    /// that trips the session's circuit.
    Mismatch,
}

/// Check `r.tool_params` against `r.tool_params_hash`. Params longer than
/// [`MAX_TOOL_PARAMS_BYTES`] are `INVALID_REQUEST` (nothing is decided).
pub(crate) fn sent_params(r: &sp1::PreExecRequest) -> Result<SentParams, Refusal> {
    if r.tool_params.is_empty() || r.params_noncanonical {
        return Ok(SentParams::None);
    }
    if r.tool_params.len() > MAX_TOOL_PARAMS_BYTES {
        return Err(refuse(
            ErrorCode::InvalidRequest,
            format!(
                "tool_params is {} bytes; at most {MAX_TOOL_PARAMS_BYTES}",
                r.tool_params.len()
            ),
        ));
    }
    let limits = Limits {
        max_bytes: MAX_TOOL_PARAMS_BYTES,
        ..Limits::default()
    };
    let digest = json::parse(&r.tool_params, limits)
        .ok()
        .and_then(|v| Params::json(&v).canonical_digest().ok());
    Ok(match (digest, Digest::from_slice(&r.tool_params_hash)) {
        (Some(d), Some(h)) if d == h => SentParams::Match,
        _ => SentParams::Mismatch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(params: &[u8], hash_of: &str) -> sp1::PreExecRequest {
        let v = json::parse_str(hash_of).unwrap();
        sp1::PreExecRequest {
            tool_params_hash: json::canonical_hash(&v).unwrap().0.to_vec(),
            tool_params: params.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn params_must_hash_to_the_hash_sent() {
        let ok = request(
            br#"{"amount":100.5,"to":"x"}"#,
            r#"{"to":"x","amount":100.50}"#,
        );
        assert_eq!(sent_params(&ok).unwrap(), SentParams::Match);
        let other = request(br#"{"amount":1}"#, r#"{"amount":2}"#);
        assert_eq!(sent_params(&other).unwrap(), SentParams::Mismatch);
        let not_json = request(b"{\"amount\":", r#"{"amount":2}"#);
        assert_eq!(sent_params(&not_json).unwrap(), SentParams::Mismatch);
        let none = request(b"", r#"{"amount":2}"#);
        assert_eq!(sent_params(&none).unwrap(), SentParams::None);
        let mut short_hash = request(br#"{"amount":2}"#, r#"{"amount":2}"#);
        short_hash.tool_params_hash.truncate(31);
        assert_eq!(sent_params(&short_hash).unwrap(), SentParams::Mismatch);
    }

    #[test]
    fn params_are_bounded() {
        let big = format!("[{}1]", "1,".repeat(MAX_TOOL_PARAMS_BYTES / 2));
        let r = request(big.as_bytes(), "[1]");
        assert_eq!(sent_params(&r).unwrap_err().code, ErrorCode::InvalidRequest);
    }
}
