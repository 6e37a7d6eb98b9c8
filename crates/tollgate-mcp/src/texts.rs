//! What the model and the human read: the text of a denied call's result, and the message
//! of an approval request. docs/mcp.md quotes these; a test pins each reason's text.

use tollgate_core::json::Value;
use tollgate_core::Money;

/// The facts a DENY text is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// The stable reason (`max_repeat_exceeded`, `fail_closed:daemon_unreachable`, ...).
    pub reason: String,
    /// For `max_repeat_exceeded`: how many times the call was made in a row.
    pub repeat_count: Option<u32>,
    /// The budget left after the verdict.
    pub budget_remaining: Option<Money>,
    /// The call's estimated cost.
    pub estimate: Money,
    /// The note of the human who refused the call (their reasons, for the model), or empty.
    pub note: String,
    /// For `hitl_transition:reject`: the refusal was of an earlier call, not of this one
    /// (with one held call per session, `max_held_calls = 1`, SP/1.0.1 §3.6 refuses the
    /// call after a refusal, though nobody was asked about it).
    pub refused_earlier: bool,
    /// When a policy decided: what it says (`refused by policy `no-shell``, ...), which
    /// replaces the generic words for the reason (`policy:<id>`, `policy_default_deny`).
    pub explanation: Option<String>,
}

fn usd(m: Money) -> String {
    #[allow(clippy::cast_precision_loss)]
    let v = m.0 as f64 / 1e9;
    format!("${v:.4}")
}

/// Why, in words, for a reason string.
pub fn explain(d: &Denial) -> String {
    if let Some(e) = d.explanation.as_deref().filter(|e| !e.trim().is_empty()) {
        return e.trim().to_owned();
    }
    let r = d.reason.as_str();
    match r {
        "max_repeat_exceeded" => match d.repeat_count {
            Some(n) => format!("this exact call was repeated {n} times"),
            None => "this exact call was repeated too many times".into(),
        },
        "circuit_open" => "an earlier call in this session was denied, which tripped the circuit \
                           breaker: no further tool call will run in this session"
            .into(),
        "budget_exhausted" => "the session's budget is spent".into(),
        "budget_overrun" => format!(
            "this call's estimated cost ({}) is more than the budget left{}",
            usd(d.estimate),
            d.budget_remaining
                .map(|m| format!(" ({})", usd(m)))
                .unwrap_or_default()
        ),
        "window_exceeded" => "this tool was called too often in the current time window".into(),
        "global_limit" => "the session's limit on tool calls is reached".into(),
        "timeout" => "the session's time limit has passed".into(),
        "policy_violation:malformed_input" => {
            "the arguments are not canonical JSON (too deep, or not an object)".into()
        }
        "policy_violation:duplicate_nonce" | "policy_violation:duplicate_resume_no_effect" => {
            "the call was a replay".into()
        }
        "hitl_transition:reject" if d.refused_earlier => {
            "nobody was asked about this call: a human refused an earlier call in this \
             session, and with one held call per session (max_held_calls = 1) that trips the \
             circuit breaker"
                .into()
        }
        "hitl_transition:reject" => "a human refused this call".into(),
        "hitl_transition:defer_escalate" => "another call is waiting for a human's decision".into(),
        "hitl:no_approver" => "this call needs a human's approval, and the host offers no way to \
                               ask one (MCP elicitation)"
            .into(),
        "fail_closed:hitl_timeout" => "nobody approved this call in time".into(),
        crate::gateway::CANCELLED => "the host cancelled this call before it was decided".into(),
        "fail_closed:daemon_unreachable" => {
            "the Tollgate daemon could not be reached, so nothing may run".into()
        }
        _ if r.starts_with("hitl_transition:") => {
            "the call does not match what a human approved".into()
        }
        _ if r.starts_with("fail_closed:") => {
            "Tollgate could not get a trustworthy decision, so nothing may run".into()
        }
        "policy_default_deny" => "no policy permits this tool (the policy set's default is \
                                  deny)"
            .into(),
        _ if r.starts_with("policy") => "a policy refuses this call".into(),
        _ => "the call is not allowed by the session's policy".into(),
    }
}

/// The most of a human's note a denial text quotes (the daemon takes at most 1024 bytes).
pub const MAX_NOTE: usize = 1024;

/// The text of a denied call's tool result: `denied: REASON; WHY. ...`, and, when the
/// human who refused it left a note, ` The human said: NOTE`.
pub fn denied(tool: &str, d: &Denial) -> String {
    let advice = match d.reason.as_str() {
        "max_repeat_exceeded" => " Do not repeat it: change the arguments or stop.",
        "circuit_open" | "budget_exhausted" | "global_limit" | "timeout" => {
            " Stop calling tools and tell the user."
        }
        _ => "",
    };
    let mut text = format!(
        "denied: {}; {}. Tollgate did not run `{tool}`.{advice}",
        d.reason,
        explain(d)
    );
    let note = d.note.trim();
    if !note.is_empty() {
        let mut cut = note.len().min(MAX_NOTE);
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        text.push_str(" The human said: ");
        text.push_str(note.get(..cut).unwrap_or_default());
    }
    text
}

/// The most of a held call's arguments an approval request shows (longer ones are cut,
/// and the message says so).
pub const MAX_SHOWN_ARGUMENTS: usize = 4096;

/// The message of the elicitation that asks the host's user to approve a held call.
pub fn approval_request(tool: &str, arguments: &Value, why: &str, estimate: Money) -> String {
    let mut args = tollgate_core::json::to_canonical_vec(arguments)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_else(|| "(unreadable)".into());
    if args.len() > MAX_SHOWN_ARGUMENTS {
        let mut cut = MAX_SHOWN_ARGUMENTS;
        while !args.is_char_boundary(cut) {
            cut -= 1;
        }
        args.truncate(cut);
        args.push_str(" … (cut: the arguments are longer than 4 KiB)");
    }
    format!(
        "Tollgate holds a tool call for your approval.\n\
         Tool: {tool}\n\
         Arguments: {args}\n\
         Held because: {why}\n\
         Estimated cost: {}\n\
         Accept to run it once, with exactly these arguments. Decline to refuse it.",
        usd(estimate)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(reason: &str) -> Denial {
        Denial {
            reason: reason.into(),
            repeat_count: Some(3),
            budget_remaining: Some(Money(250_000_000)),
            estimate: Money(400_000_000),
            note: String::new(),
            refused_earlier: false,
            explanation: None,
        }
    }

    #[test]
    fn the_issue_s_example_text() {
        assert_eq!(
            denied("search", &d("max_repeat_exceeded")),
            "denied: max_repeat_exceeded; this exact call was repeated 3 times. Tollgate did \
             not run `search`. Do not repeat it: change the arguments or stop."
        );
        assert!(denied("pay", &d("budget_overrun"))
            .contains("estimated cost ($0.4000) is more than the budget left ($0.2500)"));
        assert!(denied("x", &d("fail_closed:bad_mac")).starts_with("denied: fail_closed:bad_mac; "));
        let refused = Denial {
            note: "over the monthly limit".into(),
            ..d("hitl_transition:reject")
        };
        assert_eq!(
            denied("pay", &refused),
            "denied: hitl_transition:reject; a human refused this call. Tollgate did not run \
             `pay`. The human said: over the monthly limit"
        );
    }

    #[test]
    fn long_arguments_are_cut_on_a_character_boundary() {
        let long =
            tollgate_core::json::parse_str(&format!(r#"{{"s":"{}"}}"#, "é".repeat(5000))).unwrap();
        let m = approval_request("t", &long, "hitl_all_calls", Money::ZERO);
        assert!(m.contains("(cut: the arguments are longer than 4 KiB)"));
    }
}
