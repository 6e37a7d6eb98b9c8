//! The daemon's side of Cedar policies (issue 18): the `[policy]` set loaded at start and
//! on reload, the call's params on the wire (`PreExecRequest.tool_params`,
//! docs/protocol.md §4.3.1), and what the audit log records of a policy's verdict.
//!
//! Loading and validation are `tollgate-policy`'s ([`tollgate_policy::load()`]), the same
//! loader and the same `file:line:col` messages as `tollgate policy check`; this module
//! reads the files, bounded. Deciding is `tollgate_policy::compose::decide`, called by the
//! service core (`Service::pre_exec`) for every call while a set is in force; [`note`]
//! turns its result into the verdict entry's policy note (audit format version 6,
//! docs/audit-format.md), from which replay folds the session's labels and knows that a
//! policy's DENY did not trip.
//!
//! Reload ([`crate::Service::reload_policies`]: SIGHUP, or `tollgate policy reload` over
//! the socket) reads the same files again; a set that does not load is refused and the
//! set in force stays. A set that loads is recorded (a policy-set entry, record kind 9)
//! before it decides anything, and decides every session's next call.
//!
//! In a fleet (Redis state, PostgreSQL audit) each daemon loads its own `[policy]` and
//! records its policy-set entries in its own chain (format version 6); the session's flow
//! labels travel in its Redis record.

use tollgate_core::json::{self, Limits, Value};
use tollgate_core::{Digest, Params};
use tollgate_policy::compose::Enforced;
use tollgate_policy::files::FilesError;
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
    /// The set loaded, but its policy-set entry could not be written to the audit log, so
    /// it decides nothing (on reload, the set in force stays).
    #[error("policy set {digest} not recorded in the audit log: {message}")]
    NotRecorded {
        /// The set's digest.
        digest: Digest,
        /// Why.
        message: String,
    },
    /// No `[policy]` is configured: there is nothing to reload.
    #[error("no [policy] is configured: nothing to reload")]
    NotConfigured,
}

pub use tollgate_policy::files::read_source;

/// Load the configured set with `tollgate-policy`'s loader (`tollgate_policy::files`, as
/// every configuration does), logging its warnings. A set that does not load is
/// [`PolicyError::Refused`] with every finding.
pub fn load(settings: &PolicySettings) -> Result<tollgate_policy::Policies, PolicyError> {
    let (policies, warnings) = tollgate_policy::files::load(settings).map_err(|e| match e {
        FilesError::Read(m) => PolicyError::Read(m),
        FilesError::Refused(m) => PolicyError::Refused(m),
    })?;
    for w in &warnings {
        tracing::warn!("policy: {w}");
    }
    Ok(policies)
}

/// The configured set as the service enforces it.
pub fn enforced(settings: &PolicySettings) -> Result<Enforced, PolicyError> {
    Ok(Enforced {
        policies: load(settings)?,
        trip_on_refusal: settings.trip_on_refusal,
    })
}

// The policy-set entry, the verdict's policy note and its explanation are the store's
// (`tollgate_store::rules`), shared with the library guard.
pub use tollgate_store::rules::{explain, note, set_record};

/// What a pre_exec request's `tool_params` say about its hash.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SentParams {
    /// None sent (or the client itself said its params are not canonical).
    None,
    /// Sent, and their canonical form hashes to `tool_params_hash`: the params, parsed
    /// once (the policies read them as `context.args`), and that digest (what
    /// `[audit] params` records them under).
    Match(Value, Digest),
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
    let Ok(value) = json::parse(&r.tool_params, limits) else {
        return Ok(SentParams::Mismatch);
    };
    let digest = Params::json(&value).canonical_digest().ok();
    Ok(match (digest, Digest::from_slice(&r.tool_params_hash)) {
        (Some(d), Some(h)) if d == h => SentParams::Match(value, d),
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
        assert!(matches!(sent_params(&ok).unwrap(), SentParams::Match(..)));
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

    /// The note's reason is the composed verdict's, for every effect a policy decides,
    /// and the entry it goes in is one the format accepts.
    #[test]
    fn the_note_names_what_decided() {
        use tollgate_core::labels::LabelSet;
        use tollgate_core::{GuardConfig, Money, SessionState, ToolCall};
        use tollgate_policy::compose::{decide, Input};
        use tollgate_policy::{DefaultEffect, Options, Source};
        let text = r#"
            @id("no-shell") forbid (principal, action == Action::"shell", resource);
            @id("big-pay") @hitl permit (principal, action == Action::"pay", resource)
              when { context.args.amount.greaterThan(decimal("100.0")) };
            @id("pay") permit (principal, action == Action::"pay", resource);
            @id("reads") @label("customer-data") permit (principal, action == Action::"crm", resource);
        "#;
        let set = Enforced {
            policies: tollgate_policy::load(
                &[Source::new("t.cedar", text)],
                &Options {
                    default: DefaultEffect::Deny,
                    schema: None,
                },
            )
            .unwrap()
            .policies,
            trip_on_refusal: false,
        };
        let actor = set.policies.actor("acme", "bot", "local").unwrap();
        let config = GuardConfig {
            budget: Money(10_000_000_000),
            ..GuardConfig::default()
        };
        let state = SessionState::new(config.budget, 0);
        let labels = LabelSet::new();
        let cases = [
            ("shell", Some("{}"), Some("policy:no-shell")),
            ("pay", Some(r#"{"amount":250.5}"#), Some("policy:big-pay")),
            ("pay", None, Some("policy_params_required:big-pay")),
            (
                "pay",
                Some(r#"{"amount":250}"#),
                Some("policy_error:big-pay"),
            ),
            (
                "pay",
                Some(r#"{"amount":0.12345}"#),
                Some("policy_unrepresentable:big-pay"),
            ),
            ("other", Some("{}"), Some("policy_default_deny")),
            ("pay", Some(r#"{"amount":5.5}"#), None),
            ("crm", Some("{}"), None),
        ];
        for (tool, args, reason) in cases {
            let args = args.map(|a| json::parse_str(a).unwrap());
            let params = args
                .as_ref()
                .map_or_else(|| Params::digest(Digest([1; 32])), Params::json);
            let call = ToolCall {
                nonce: Some(7),
                ..ToolCall::new(tool, params)
            };
            let input = Input {
                actor: &actor,
                args: args.as_ref(),
                labels: &labels,
            };
            let c = decide(&config, Some(&set), &state, &call, input, 1, 0.5);
            let n = note(&c, set.policies.digest());
            assert_eq!(n.reason().as_deref(), reason, "{tool}: {c:?}");
            if reason.is_some() {
                assert_eq!(n.reason().unwrap(), c.reason());
            }
            let d = c.applied();
            let record = tollgate_audit::VerdictRecord {
                timestamp_ns: 1,
                session_id: "s".into(),
                agent_id: "bot".into(),
                organization_id: "acme".into(),
                call_number: 1,
                tool_name: tool.into(),
                params_hash: Digest([1; 32]),
                verdict: d.verdict,
                deny_reason: d.deny_reason,
                reason: d.reason,
                probabilistic: false,
                budget_before: Money(0),
                budget_after: Money(0),
                operator_id: None,
                estimated_cost: Money(0),
                nonce: 7,
                config_digest: None,
                session_seq: 2,
                budget_version: 0,
                policy: Some(n.clone()),
                shadow: Vec::new(),
                params: None,
                upstream: None,
                draw: None,
            };
            tollgate_audit::format::check_event(&record.into(), 6).unwrap();
            if tool == "crm" {
                assert_eq!(n.labels.len(), 1);
                assert_eq!(n.policy_id.as_deref(), Some("reads"));
            }
        }
    }

    #[test]
    fn params_are_bounded() {
        let big = format!("[{}1]", "1,".repeat(MAX_TOOL_PARAMS_BYTES / 2));
        let r = request(big.as_bytes(), "[1]");
        assert_eq!(sent_params(&r).unwrap_err().code, ErrorCode::InvalidRequest);
    }
}
