//! Shared helpers.

use tollgate_core::json::{self, Value};
use tollgate_core::{
    apply_decision, decide, Decision, GuardConfig, Money, Params, SessionState, ToolCall, UnixNanos,
};

pub fn usd(x: f64) -> Money {
    Money::from_usd(x).unwrap()
}

pub fn params(text: &str) -> Value {
    json::parse_str(text).unwrap()
}

/// Decide and apply, as the runtime does; returns the decision.
pub fn step(
    config: &GuardConfig,
    state: &mut SessionState,
    call: &ToolCall<'_>,
    call_number: u64,
    now: UnixNanos,
) -> Decision {
    let d = decide(config, state, call, now, 1.0);
    apply_decision(config, state, call, &d, call_number, now);
    d
}

pub fn call<'a>(tool: &'a str, p: &Value, nonce: u64, cost: Money) -> ToolCall<'a> {
    ToolCall {
        tool_name: tool,
        params: Params::json(p),
        nonce: Some(nonce),
        estimated_cost: cost,
        raw_params: None,
    }
}
