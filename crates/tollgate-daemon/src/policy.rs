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

use std::path::Path;

use tollgate_audit::{PolicyEffect, PolicyNote, PolicySetCause, PolicySetRecord};
use tollgate_core::json::{self, Limits, Value};
use tollgate_core::{Digest, Params, Verdict};
use tollgate_policy::compose::{Composed, Enforced};
use tollgate_policy::{DefaultEffect, DenyCause, Effect, Options, Source};
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
/// [`PolicyError::Refused`] with every finding.
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

/// The configured set as the service enforces it.
pub fn enforced(settings: &PolicySettings) -> Result<Enforced, PolicyError> {
    Ok(Enforced {
        policies: load(settings)?,
        trip_on_refusal: settings.trip_on_refusal,
    })
}

/// The policy-set entry (record kind 9) of `set`, written at `now` for `cause`.
pub fn set_record(set: &Enforced, cause: PolicySetCause, now: i64) -> PolicySetRecord {
    PolicySetRecord {
        timestamp_ns: now,
        digest: set.policies.digest(),
        policies: u32::try_from(set.policies.len()).unwrap_or(u32::MAX),
        default_deny: set.policies.default_effect() == DefaultEffect::Deny,
        trip_on_refusal: set.trip_on_refusal,
        cause,
    }
}

/// The verdict entry's policy note for what `c` decided under the set of digest `set`.
/// Its [`PolicyNote::reason`] is `c.reason()` whenever the policy decided (tested).
pub fn note(c: &Composed, set: Digest) -> PolicyNote {
    let (effect, policy_id) = match &c.policy {
        None => (PolicyEffect::NotEvaluated, None),
        Some(e) => (
            match e {
                Effect::Pass => PolicyEffect::Pass,
                Effect::Permit { .. } => PolicyEffect::Permit,
                Effect::Hitl { .. } => PolicyEffect::Hitl,
                Effect::DefaultDeny => PolicyEffect::DefaultDeny,
                Effect::Deny { cause, .. } => match cause {
                    DenyCause::Forbid => PolicyEffect::Forbid,
                    DenyCause::ParamsRequired => PolicyEffect::ParamsRequired,
                    DenyCause::Unrepresentable { .. } => PolicyEffect::Unrepresentable,
                    DenyCause::Error(_) => PolicyEffect::Error,
                    DenyCause::LabelLimit => PolicyEffect::LabelLimit,
                },
            },
            e.policy().map(ToString::to_string),
        ),
    };
    PolicyNote {
        set_digest: set,
        effect,
        policy_id,
        decided: c.policy_decided,
        tripped: c.policy_decided && c.verdict == Verdict::Deny && c.trips,
        labels: c.labels.clone(),
    }
}

/// What a person reads for a verdict a policy decided (the reason string names the
/// policy too).
pub(crate) fn explain(c: &PolicyNote, hold_message: Option<&str>) -> String {
    let id = c.policy_id.as_deref().unwrap_or_default();
    match c.effect {
        PolicyEffect::Forbid => format!("refused by policy `{id}`"),
        PolicyEffect::Hitl => match hold_message {
            Some(m) if !m.is_empty() => format!("policy `{id}` holds this call for a human: {m}"),
            _ => format!("policy `{id}` holds this call for a human"),
        },
        PolicyEffect::Error => format!("policy `{id}` failed to evaluate; the call is refused"),
        PolicyEffect::ParamsRequired => {
            format!("policy `{id}` reads the call's arguments, and none were sent (tool_params)")
        }
        PolicyEffect::Unrepresentable => {
            format!("policy `{id}` reads an argument that has no exact Cedar value")
        }
        PolicyEffect::LabelLimit => {
            format!(
                "allowing this call would give the session more than {} flow labels (policy `{id}`)",
                tollgate_core::labels::MAX_LABELS
            )
        }
        PolicyEffect::DefaultDeny => "no policy permits this call (default deny)".to_owned(),
        PolicyEffect::Pass | PolicyEffect::Permit | PolicyEffect::NotEvaluated => String::new(),
    }
}

/// What a pre_exec request's `tool_params` say about its hash.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SentParams {
    /// None sent (or the client itself said its params are not canonical).
    None,
    /// Sent, and their canonical form hashes to `tool_params_hash`: the params, parsed
    /// once (the policies read them as `context.args`).
    Match(Value),
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
        (Some(d), Some(h)) if d == h => SentParams::Match(value),
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
        assert!(matches!(sent_params(&ok).unwrap(), SentParams::Match(_)));
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
