//! Rule 10 (SP/1.0.1 §3.2 rule 9): opaque context, a key-class × value-class product.
//!
//! The same classification reaches `decide` two ways: in process, `Params::json` walks the
//! params; through the daemon, the client sends only the params hash and the flag
//! `params_opaque_context`, which it computes as `Params::json(params).has_opaque_context()`
//! (crates/tollgate-client/src/daemon.rs, `DaemonClient::pre_exec`), and the daemon turns it
//! back into `Params::digest_with_opaque_context` (crates/tollgate-daemon/src/service.rs, `to_call`).
//! Both ways must reach the same verdict.

use tollgate_core::{decide, GuardConfig, Money, Params, Reason, SessionState, ToolCall, Verdict};

use crate::support::{params, usd};

const OPAQUE: (Verdict, Reason) = (Verdict::Hitl, Reason::OpaqueContext);
const ALLOW: (Verdict, Reason) = (Verdict::Allow, Reason::WithinThresholds);

/// Decide `text` in process and as the daemon would from the client's flag; both must be
/// `want`.
fn check(text: &str, want: (Verdict, Reason)) {
    let config = GuardConfig {
        budget: usd(1.0),
        max_repeat_calls: 3,
        ..GuardConfig::default()
    };
    let state = SessionState::new(config.budget, 0);
    let value = params(text);
    let in_process = Params::json(&value);
    let decide_with = |p: Params| {
        let call = ToolCall {
            nonce: Some(1),
            estimated_cost: Money::ZERO,
            ..ToolCall::new("click", p)
        };
        let d = decide(&config, &state, &call, 0, 1.0);
        (d.verdict, d.reason)
    };
    assert_eq!(decide_with(in_process), want, "in process: {text}");
    // What the client sends, and what the daemon rebuilds from it.
    let digest = in_process.canonical_digest().unwrap();
    let flag = in_process.has_opaque_context();
    let daemon_side = if flag {
        Params::digest_with_opaque_context(digest)
    } else {
        Params::digest(digest)
    };
    assert_eq!(flag, want == OPAQUE, "client flag: {text}");
    assert_eq!(decide_with(daemon_side), want, "through the daemon: {text}");
}

#[test]
fn a_marker_under_a_context_key_is_opaque() {
    for text in [
        r#"{"ctx":"opaque"}"#,
        r#"{"context":"unknown"}"#,
        r#"{"opaque":"opaque"}"#,
        r#"{"raw_context":"unevaluable"}"#,
        r#"{"blob":"untestable"}"#,
        r#"{" Context ":"  OPAQUE  "}"#,
        "{\"CTX\":\"Unknown\\t\"}",
    ] {
        check(text, OPAQUE);
    }
}

#[test]
fn lists_and_objects_under_a_context_key_are_walked_not_matched() {
    // The issue's two examples.
    check(r#"{"ctx":[42,"unknown"]}"#, ALLOW);
    check(r#"{"ctx":[{"context":"opaque"}]}"#, OPAQUE);
    // A bare marker string inside a list is not a binding, at any list depth.
    check(r#"{"opaque":["x","unknown"]}"#, ALLOW);
    check(r#"{"context":["opaque"]}"#, ALLOW);
    check(r#"{"ctx":[["unknown"]]}"#, ALLOW);
    // Objects inside lists are walked, at any list depth, under any key.
    check(r#"{"ctx":[[{"context":"unknown"}]]}"#, OPAQUE);
    check(r#"{"items":[{"a":1},{"blob":"untestable"}]}"#, OPAQUE);
    // An object under a context key is walked for context keys...
    check(r#"{"ctx":{"raw_context":"unevaluable"}}"#, OPAQUE);
    // ...and a marker under an ordinary key inside it is not a binding.
    check(r#"{"ctx":{"note":"opaque"}}"#, ALLOW);
    check(r#"{"ctx":{}}"#, ALLOW);
    check(r#"{"ctx":[]}"#, ALLOW);
}

#[test]
fn evaluable_values_and_ordinary_keys_are_not_opaque() {
    for text in [
        r#"{"ctx":42}"#,
        r#"{"ctx":0.5}"#,
        r#"{"ctx":null}"#,
        r#"{"ctx":true}"#,
        r#"{"ctx":""}"#,
        r#"{"context":"opaque context"}"#,
        r#"{"ctx":"unknownish"}"#,
        r#"{"note":"opaque"}"#,
        r#"{"contexts":"opaque"}"#,
        r#"{"context":"user asked about pricing"}"#,
    ] {
        check(text, ALLOW);
    }
}
