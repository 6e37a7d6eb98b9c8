//! A lossless, versioned encoding of [`SessionState`] as canonical JSON.
//!
//! Stores persist session state with this codec; it is pure (bytes in, values out) and
//! lives in the core so that every store, and the fuzzer, use one definition.
//!
//! The document is one JSON object, written by the canonical writer (keys sorted, no
//! whitespace), with every integer exact: money in nano-dollars, times in nanoseconds,
//! nonces and call numbers as unsigned 64-bit integers. No floats appear anywhere.
//!
//! ```text
//! {"budget_initial":500000000,"budget_remaining":498000000,"budget_spent":2000000,
//!  "circuit_trip_reason":null,"circuit_tripped":false,"circuit_tripped_at_ns":0,
//!  "last_activity_ns":..,"last_error_signal":false,"last_params_hash":"ab12..",
//!  "last_tool_name":"search","pending":null,"repeat_counts":{"search":1},
//!  "reservations":[[1,2000000,2000000]],"seen_nonces":[7],"started_at_ns":..,
//!  "status":"ACTIVE","total_calls":1,"v":1,"window_counts":{},"window_start_ns":0}
//! ```
//!
//! Decoding is strict: the version must be [`VERSION`], every key must be present, no
//! other key may appear, every value must have its exact type and range, list entries
//! (reservations, nonces) must be strictly increasing (so there is exactly one encoding
//! of each state), and the input is bounded by [`DecodeLimits`]. Decoding never panics.
//!
//! Words that the core keeps open-ended ([`HumanDecision::Unknown`],
//! [`TransitionStatus::Other`]) are written as `{"other":"word"}`, so that an unknown
//! word that happens to spell a known one still round-trips exactly.

use std::collections::BTreeMap;

use crate::digest::Digest;
use crate::json::{self, Limits, Number, Value};
use crate::state::{
    HumanDecision, NonceWindow, PendingTransition, Reservation, SessionState, SessionStatus,
    TransitionStatus,
};
use crate::types::{Money, Reason};

/// The encoding version this code writes and the only one it reads.
pub const VERSION: u64 = 2;

/// Bounds for one decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Maximum encoded size in bytes.
    pub max_bytes: usize,
}

impl Default for DecodeLimits {
    /// 16 MiB: room for about half a million seen nonces.
    fn default() -> Self {
        DecodeLimits {
            max_bytes: 16 * 1024 * 1024,
        }
    }
}

/// The nesting a state document needs: state, pending, a reservation, plus headroom for
/// an enclosing record (a store's session envelope).
pub const MAX_DEPTH: usize = 8;

/// Why bytes are not a state this codec wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateCodecError {
    /// The bytes are not JSON within the limits.
    #[error("state is not valid json: {0}")]
    Json(#[from] json::ParseError),
    /// The version field is missing or names a version this code does not read.
    #[error("state version `{found}` is not supported (expected {VERSION})")]
    Version {
        /// The version found, as written.
        found: String,
    },
    /// A key this version does not have.
    #[error("unknown key `{key}` in {within}")]
    UnknownKey {
        /// The key.
        key: String,
        /// Which object (`state`, `pending`, ...).
        within: &'static str,
    },
    /// A required key is absent.
    #[error("missing key `{key}` in {within}")]
    MissingKey {
        /// The key.
        key: &'static str,
        /// Which object.
        within: &'static str,
    },
    /// A value has the wrong type or is out of range.
    #[error("`{field}` must be {expected}")]
    Invalid {
        /// The field (dotted path).
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// A list that must be strictly increasing is not (duplicates or disorder).
    #[error("`{field}` must be strictly increasing")]
    NotIncreasing {
        /// The field.
        field: &'static str,
    },
}

/// The state as a JSON value (the form [`encode`] writes).
pub fn to_value(state: &SessionState) -> Value {
    let mut m = BTreeMap::new();
    put(&mut m, "v", uint(VERSION));
    put(&mut m, "status", Value::from(status_str(state.status)));
    put(&mut m, "budget_initial", int(state.budget_initial.0));
    put(&mut m, "budget_remaining", int(state.budget_remaining.0));
    put(&mut m, "budget_spent", int(state.budget_spent.0));
    put(
        &mut m,
        "reservations",
        Value::Array(
            state
                .reservations
                .iter()
                .map(|(call, r)| {
                    Value::Array(vec![uint(*call), int(r.estimated.0), int(r.deducted.0)])
                })
                .collect(),
        ),
    );
    put(&mut m, "total_calls", uint(state.total_calls));
    put(&mut m, "repeat_counts", counts(&state.repeat_counts));
    put(&mut m, "window_counts", counts(&state.window_counts));
    put(&mut m, "window_start_ns", int(state.window_start_ns));
    put(
        &mut m,
        "circuit_tripped",
        Value::Bool(state.circuit_tripped),
    );
    put(
        &mut m,
        "circuit_trip_reason",
        state
            .circuit_trip_reason
            .map_or(Value::Null, |r| Value::from(r.as_str())),
    );
    put(
        &mut m,
        "circuit_tripped_at_ns",
        int(state.circuit_tripped_at_ns),
    );
    put(
        &mut m,
        "seen_nonces",
        Value::Array(state.seen_nonces.iter().map(|n| uint(*n)).collect()),
    );
    put(
        &mut m,
        "last_tool_name",
        opt_str(state.last_tool_name.as_deref()),
    );
    put(
        &mut m,
        "last_params_hash",
        opt_digest(state.last_params_hash),
    );
    put(
        &mut m,
        "last_error_signal",
        Value::Bool(state.last_error_signal),
    );
    put(
        &mut m,
        "pending",
        state.pending.as_ref().map_or(Value::Null, pending_value),
    );
    // The parallel-holds extension's further held calls; absent when there are none, so a
    // state holding at most one call encodes as before the extension existed.
    if !state.more_pending.is_empty() {
        put(
            &mut m,
            "more_pending",
            Value::Array(state.more_pending.iter().map(pending_value).collect()),
        );
    }
    put(&mut m, "started_at_ns", int(state.started_at_ns));
    put(&mut m, "last_activity_ns", int(state.last_activity_ns));
    Value::Object(m)
}

/// The canonical bytes of the state: [`to_value`] through the canonical writer.
pub fn encode(state: &SessionState) -> Vec<u8> {
    let mut out = Vec::with_capacity(512 + 21 * state.seen_nonces.len());
    write_canonical(state, &mut out);
    out
}

/// Append the canonical bytes of the state ([`encode`]'s) to `out`, written member by
/// member rather than through a [`Value`] tree: a fleet writes a session record on every
/// decision. The members are in canonical (byte) order; the tests check the bytes against
/// [`to_value`] through the canonical writer.
pub fn write_canonical(state: &SessionState, out: &mut Vec<u8>) {
    let mut o = json::ObjectWriter::new(out);
    o.int("budget_initial", state.budget_initial.0);
    o.int("budget_remaining", state.budget_remaining.0);
    o.int("budget_spent", state.budget_spent.0);
    match state.circuit_trip_reason {
        Some(r) => o.str("circuit_trip_reason", r.as_str()),
        None => o.null("circuit_trip_reason"),
    }
    o.bool("circuit_tripped", state.circuit_tripped);
    o.int("circuit_tripped_at_ns", state.circuit_tripped_at_ns);
    o.int("last_activity_ns", state.last_activity_ns);
    o.bool("last_error_signal", state.last_error_signal);
    match state.last_params_hash {
        Some(d) => o.str("last_params_hash", &d.to_string()),
        None => o.null("last_params_hash"),
    }
    match state.last_tool_name.as_deref() {
        Some(t) => o.str("last_tool_name", t),
        None => o.null("last_tool_name"),
    }
    // The parallel-holds extension's further held calls; absent when there are none.
    if !state.more_pending.is_empty() {
        let out = o.key("more_pending");
        out.push(b'[');
        for (i, p) in state.more_pending.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            // Held calls are rare and small: through the value tree.
            let _ = json::write_canonical(&pending_value(p), out);
        }
        out.push(b']');
    }
    match &state.pending {
        Some(p) => {
            let _ = o.value("pending", &pending_value(p));
        }
        None => o.null("pending"),
    }
    o.object("repeat_counts", |c| {
        for (k, n) in &state.repeat_counts {
            c.int(k, *n);
        }
    });
    {
        let out = o.key("reservations");
        out.push(b'[');
        for (i, (call, r)) in state.reservations.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.push(b'[');
            json::write_canonical_int(i128::from(*call), out);
            out.push(b',');
            json::write_canonical_int(i128::from(r.estimated.0), out);
            out.push(b',');
            json::write_canonical_int(i128::from(r.deducted.0), out);
            out.push(b']');
        }
        out.push(b']');
    }
    {
        let out = o.key("seen_nonces");
        out.push(b'[');
        for (i, n) in state.seen_nonces.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json::write_canonical_int(i128::from(*n), out);
        }
        out.push(b']');
    }
    o.int("started_at_ns", state.started_at_ns);
    o.str("status", status_str(state.status));
    o.int("total_calls", state.total_calls);
    o.int("v", VERSION);
    o.object("window_counts", |c| {
        for (k, n) in &state.window_counts {
            c.int(k, *n);
        }
    });
    o.int("window_start_ns", state.window_start_ns);
    o.end();
}

/// Decode bytes written by [`encode`].
pub fn decode(bytes: &[u8], limits: DecodeLimits) -> Result<SessionState, StateCodecError> {
    let v = json::parse(
        bytes,
        Limits {
            max_bytes: limits.max_bytes,
            max_depth: MAX_DEPTH,
        },
    )?;
    from_value(&v)
}

/// The state from a JSON value of the form [`to_value`] builds.
pub fn from_value(v: &Value) -> Result<SessionState, StateCodecError> {
    let o = Obj::new(v, "state", STATE_KEYS)?;
    let version = o.take("v")?;
    if version.as_u64() != Some(VERSION) {
        return Err(StateCodecError::Version {
            found: json::to_canonical_vec(version)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_default()
                .chars()
                .take(40)
                .collect(),
        });
    }
    let status = parse_status(o.take("status")?)?;
    let budget_initial = Money(get_i64(o.take("budget_initial")?, "budget_initial")?);
    let budget_remaining = Money(get_i64(o.take("budget_remaining")?, "budget_remaining")?);
    let budget_spent = Money(get_i64(o.take("budget_spent")?, "budget_spent")?);

    let mut reservations = BTreeMap::new();
    let mut last_call: Option<u64> = None;
    for item in get_array(o.take("reservations")?, "reservations")? {
        let bad = StateCodecError::Invalid {
            field: "reservations",
            expected: "an array of [call_number, estimated, deducted] integer triples",
        };
        let [call, est, ded] = item.as_array().ok_or_else(|| bad.clone())? else {
            return Err(bad);
        };
        let call = call.as_u64().ok_or_else(|| bad.clone())?;
        let estimated = Money(est.as_i64().ok_or_else(|| bad.clone())?);
        let deducted = Money(ded.as_i64().ok_or_else(|| bad.clone())?);
        if last_call.is_some_and(|p| p >= call) {
            return Err(StateCodecError::NotIncreasing {
                field: "reservations",
            });
        }
        last_call = Some(call);
        reservations.insert(
            call,
            Reservation {
                estimated,
                deducted,
            },
        );
    }

    let total_calls = get_u64(o.take("total_calls")?, "total_calls")?;
    let repeat_counts = parse_counts(o.take("repeat_counts")?, "repeat_counts")?;
    let window_counts = parse_counts(o.take("window_counts")?, "window_counts")?;
    let window_start_ns = get_i64(o.take("window_start_ns")?, "window_start_ns")?;
    let circuit_tripped = get_bool(o.take("circuit_tripped")?, "circuit_tripped")?;
    let circuit_trip_reason = match o.take("circuit_trip_reason")? {
        Value::Null => None,
        Value::String(s) => Some(s.parse::<Reason>().map_err(|_| StateCodecError::Invalid {
            field: "circuit_trip_reason",
            expected: "null or a known reason string",
        })?),
        _ => {
            return Err(StateCodecError::Invalid {
                field: "circuit_trip_reason",
                expected: "null or a known reason string",
            })
        }
    };
    let circuit_tripped_at_ns = get_i64(o.take("circuit_tripped_at_ns")?, "circuit_tripped_at_ns")?;

    let mut seen_nonces = NonceWindow::new();
    let nonces = get_array(o.take("seen_nonces")?, "seen_nonces")?;
    for item in nonces {
        let n = get_u64(item, "seen_nonces")?;
        // Oldest first, each once: a repeated nonce has no place in a window.
        seen_nonces.insert(n, usize::MAX);
    }
    if seen_nonces.len() != nonces.len() {
        return Err(StateCodecError::Invalid {
            field: "seen_nonces",
            expected: "distinct nonces, oldest first",
        });
    }

    let last_tool_name = get_opt_str(o.take("last_tool_name")?, "last_tool_name")?;
    let last_params_hash = get_opt_digest(o.take("last_params_hash")?, "last_params_hash")?;
    let last_error_signal = get_bool(o.take("last_error_signal")?, "last_error_signal")?;
    let pending = match o.take("pending")? {
        Value::Null => None,
        p => Some(parse_pending(p)?),
    };
    let more_pending = match o.map.get("more_pending") {
        None => Vec::new(),
        Some(Value::Array(items)) if pending.is_some() && !items.is_empty() => items
            .iter()
            .map(parse_pending)
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            return Err(StateCodecError::Invalid {
                field: "more_pending",
                expected: "a non-empty array of transitions, beside a pending one",
            })
        }
    };
    let started_at_ns = get_i64(o.take("started_at_ns")?, "started_at_ns")?;
    let last_activity_ns = get_i64(o.take("last_activity_ns")?, "last_activity_ns")?;

    Ok(SessionState {
        status,
        budget_initial,
        budget_remaining,
        budget_spent,
        reservations,
        total_calls,
        repeat_counts,
        window_counts,
        window_start_ns,
        circuit_tripped,
        circuit_trip_reason,
        circuit_tripped_at_ns,
        seen_nonces,
        last_tool_name,
        last_params_hash,
        last_error_signal,
        pending,
        more_pending,
        started_at_ns,
        last_activity_ns,
    })
}

// ---------------------------------------------------------------------------------------
// Pieces
// ---------------------------------------------------------------------------------------

fn put(m: &mut BTreeMap<String, Value>, k: &str, v: Value) {
    m.insert(k.to_owned(), v);
}

fn int(i: i64) -> Value {
    Value::Number(Number::Int(i128::from(i)))
}

fn uint(u: u64) -> Value {
    Value::Number(Number::Int(i128::from(u)))
}

fn opt_str(s: Option<&str>) -> Value {
    s.map_or(Value::Null, Value::from)
}

fn opt_u64(n: Option<u64>) -> Value {
    n.map_or(Value::Null, uint)
}

fn opt_digest(d: Option<Digest>) -> Value {
    d.map_or(Value::Null, |d| Value::String(d.to_string()))
}

fn counts(m: &BTreeMap<String, u32>) -> Value {
    Value::Object(
        m.iter()
            .map(|(k, c)| (k.clone(), uint(u64::from(*c))))
            .collect(),
    )
}

/// A known word as a string; an open-ended one as `{"other": word}`.
fn word(known: Option<&str>, other: &str) -> Value {
    match known {
        Some(w) => Value::from(w),
        None => {
            let mut m = BTreeMap::new();
            m.insert("other".to_owned(), Value::from(other));
            Value::Object(m)
        }
    }
}

const fn status_str(s: SessionStatus) -> &'static str {
    s.as_str()
}

fn parse_status(v: &Value) -> Result<SessionStatus, StateCodecError> {
    match v.as_str() {
        Some("ACTIVE") => Ok(SessionStatus::Active),
        Some("PAUSED") => Ok(SessionStatus::Paused),
        Some("TERMINATED") => Ok(SessionStatus::Terminated),
        Some("STALE") => Ok(SessionStatus::Stale),
        _ => Err(StateCodecError::Invalid {
            field: "status",
            expected: "one of ACTIVE, PAUSED, TERMINATED, STALE",
        }),
    }
}

fn pending_value(p: &PendingTransition) -> Value {
    let decision = match &p.decision {
        HumanDecision::Unknown(w) => word(None, w),
        d => word(Some(d.as_str()), ""),
    };
    let status = match &p.terminal_status {
        TransitionStatus::Other(w) => word(None, w),
        s => word(Some(s.as_str()), ""),
    };
    let mut m = BTreeMap::new();
    put(&mut m, "decision", decision);
    put(&mut m, "original_nonce", opt_u64(p.original_nonce));
    put(
        &mut m,
        "original_args_digest",
        opt_digest(p.original_args_digest),
    );
    put(&mut m, "successor_nonce", opt_u64(p.successor_nonce));
    put(
        &mut m,
        "successor_args_digest",
        opt_digest(p.successor_args_digest),
    );
    put(&mut m, "terminal_status", status);
    put(&mut m, "resume_attempt", Value::Bool(p.resume_attempt));
    put(&mut m, "tool_name", opt_str(p.tool_name.as_deref()));
    put(&mut m, "requested_at_ns", int(p.requested_at_ns));
    put(&mut m, "call_number", uint(p.call_number));
    put(&mut m, "operator_id", opt_str(p.operator_id.as_deref()));
    put(
        &mut m,
        "held_reason",
        p.held_reason
            .map_or(Value::Null, |r| Value::from(r.as_str())),
    );
    put(&mut m, "estimated_cost", int(p.estimated_cost.0));
    Value::Object(m)
}

fn parse_pending(v: &Value) -> Result<PendingTransition, StateCodecError> {
    let o = Obj::new(v, "pending", PENDING_KEYS)?;
    let decision = match o.take("decision")? {
        Value::String(s) => match s.as_str() {
            "" => HumanDecision::Awaiting,
            "approve" => HumanDecision::Approve,
            "reject" => HumanDecision::Reject,
            "modify" => HumanDecision::Modify,
            "defer" => HumanDecision::Defer,
            "escalate" => HumanDecision::Escalate,
            "expire" => HumanDecision::Expire,
            _ => return Err(bad_decision()),
        },
        other => HumanDecision::Unknown(parse_other(other, bad_decision)?.into()),
    };
    let original_nonce = get_opt_u64(o.take("original_nonce")?, "pending.original_nonce")?;
    let original_args_digest = get_opt_digest(
        o.take("original_args_digest")?,
        "pending.original_args_digest",
    )?;
    let successor_nonce = get_opt_u64(o.take("successor_nonce")?, "pending.successor_nonce")?;
    let successor_args_digest = get_opt_digest(
        o.take("successor_args_digest")?,
        "pending.successor_args_digest",
    )?;
    let terminal_status = match o.take("terminal_status")? {
        Value::String(s) => match s.as_str() {
            "pending" => TransitionStatus::Pending,
            "rejected" => TransitionStatus::Rejected,
            "superseded" => TransitionStatus::Superseded,
            "consumed" => TransitionStatus::Consumed,
            "executed" => TransitionStatus::Executed,
            "expired" => TransitionStatus::Expired,
            "revoked" => TransitionStatus::Revoked,
            "cancelled" => TransitionStatus::Cancelled,
            _ => return Err(bad_status()),
        },
        other => TransitionStatus::Other(parse_other(other, bad_status)?.into()),
    };
    let resume_attempt = get_bool(o.take("resume_attempt")?, "pending.resume_attempt")?;
    let tool_name = get_opt_str(o.take("tool_name")?, "pending.tool_name")?;
    let requested_at_ns = get_i64(o.take("requested_at_ns")?, "pending.requested_at_ns")?;
    let call_number = get_u64(o.take("call_number")?, "pending.call_number")?;
    let operator_id = get_opt_str(o.take("operator_id")?, "pending.operator_id")?;
    let held_reason = match o.take("held_reason")? {
        Value::Null => None,
        Value::String(s) => Some(s.parse::<Reason>().map_err(|_| StateCodecError::Invalid {
            field: "pending.held_reason",
            expected: "null or a known reason string",
        })?),
        _ => {
            return Err(StateCodecError::Invalid {
                field: "pending.held_reason",
                expected: "null or a known reason string",
            })
        }
    };
    let estimated_cost = Money(get_i64(
        o.take("estimated_cost")?,
        "pending.estimated_cost",
    )?);
    Ok(PendingTransition {
        held_reason,
        estimated_cost,
        call_number,
        operator_id,
        decision,
        original_nonce,
        original_args_digest,
        successor_nonce,
        successor_args_digest,
        terminal_status,
        resume_attempt,
        tool_name,
        requested_at_ns,
    })
}

fn bad_decision() -> StateCodecError {
    StateCodecError::Invalid {
        field: "pending.decision",
        expected: "a known decision word or {\"other\": word}",
    }
}

fn bad_status() -> StateCodecError {
    StateCodecError::Invalid {
        field: "pending.terminal_status",
        expected: "a known status word or {\"other\": word}",
    }
}

fn parse_other(v: &Value, bad: fn() -> StateCodecError) -> Result<String, StateCodecError> {
    let m = v.as_object().ok_or_else(bad)?;
    if m.len() != 1 {
        return Err(bad());
    }
    m.get("other")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(bad)
}

fn parse_counts(v: &Value, field: &'static str) -> Result<BTreeMap<String, u32>, StateCodecError> {
    let m = v.as_object().ok_or(StateCodecError::Invalid {
        field,
        expected: "an object of tool name to unsigned 32-bit count",
    })?;
    m.iter()
        .map(|(k, c)| {
            let c =
                c.as_u64()
                    .and_then(|c| u32::try_from(c).ok())
                    .ok_or(StateCodecError::Invalid {
                        field,
                        expected: "an object of tool name to unsigned 32-bit count",
                    })?;
            Ok((k.clone(), c))
        })
        .collect()
}

fn get_i64(v: &Value, field: &'static str) -> Result<i64, StateCodecError> {
    v.as_i64().ok_or(StateCodecError::Invalid {
        field,
        expected: "a signed 64-bit integer",
    })
}

fn get_u64(v: &Value, field: &'static str) -> Result<u64, StateCodecError> {
    v.as_u64().ok_or(StateCodecError::Invalid {
        field,
        expected: "an unsigned 64-bit integer",
    })
}

fn get_bool(v: &Value, field: &'static str) -> Result<bool, StateCodecError> {
    v.as_bool().ok_or(StateCodecError::Invalid {
        field,
        expected: "true or false",
    })
}

fn get_array<'v>(v: &'v Value, field: &'static str) -> Result<&'v [Value], StateCodecError> {
    v.as_array().ok_or(StateCodecError::Invalid {
        field,
        expected: "an array",
    })
}

fn get_opt_str(v: &Value, field: &'static str) -> Result<Option<String>, StateCodecError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        _ => Err(StateCodecError::Invalid {
            field,
            expected: "null or a string",
        }),
    }
}

fn get_opt_u64(v: &Value, field: &'static str) -> Result<Option<u64>, StateCodecError> {
    match v {
        Value::Null => Ok(None),
        v => get_u64(v, field)
            .map(Some)
            .map_err(|_| StateCodecError::Invalid {
                field,
                expected: "null or an unsigned 64-bit integer",
            }),
    }
}

fn get_opt_digest(v: &Value, field: &'static str) -> Result<Option<Digest>, StateCodecError> {
    let bad = StateCodecError::Invalid {
        field,
        expected: "null or 64 lowercase hex digits",
    };
    match v {
        Value::Null => Ok(None),
        Value::String(s) => {
            // Only the exact form `encode` writes: lowercase, no whitespace.
            if s.len() != 64 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return Err(bad);
            }
            Digest::from_hex(s).map(Some).map_err(|_| bad)
        }
        _ => Err(bad),
    }
}

/// An object being taken apart key by key. Unknown keys are rejected up front, so a
/// misspelled key is reported as unknown rather than as a missing one.
struct Obj<'v> {
    map: &'v BTreeMap<String, Value>,
    within: &'static str,
}

impl<'v> Obj<'v> {
    fn new(v: &'v Value, within: &'static str, known: &[&str]) -> Result<Obj<'v>, StateCodecError> {
        let Some(map) = v.as_object() else {
            return Err(StateCodecError::Invalid {
                field: within,
                expected: "an object",
            });
        };
        if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(StateCodecError::UnknownKey {
                key: k.chars().take(80).collect(),
                within,
            });
        }
        Ok(Obj { map, within })
    }

    fn take(&self, key: &'static str) -> Result<&'v Value, StateCodecError> {
        self.map.get(key).ok_or(StateCodecError::MissingKey {
            key,
            within: self.within,
        })
    }
}

const STATE_KEYS: &[&str] = &[
    "v",
    "status",
    "budget_initial",
    "budget_remaining",
    "budget_spent",
    "reservations",
    "total_calls",
    "repeat_counts",
    "window_counts",
    "window_start_ns",
    "circuit_tripped",
    "circuit_trip_reason",
    "circuit_tripped_at_ns",
    "seen_nonces",
    "last_tool_name",
    "last_params_hash",
    "last_error_signal",
    "pending",
    "more_pending",
    "started_at_ns",
    "last_activity_ns",
];

const PENDING_KEYS: &[&str] = &[
    "decision",
    "original_nonce",
    "original_args_digest",
    "successor_nonce",
    "successor_args_digest",
    "terminal_status",
    "resume_attempt",
    "tool_name",
    "requested_at_ns",
    "call_number",
    "operator_id",
    "held_reason",
    "estimated_cost",
];

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::collection::btree_map;
    use proptest::prelude::*;

    fn digest() -> impl Strategy<Value = Digest> {
        any::<[u8; 32]>().prop_map(Digest)
    }

    fn decision() -> impl Strategy<Value = HumanDecision> {
        prop_oneof![
            Just(HumanDecision::Awaiting),
            Just(HumanDecision::Approve),
            Just(HumanDecision::Reject),
            Just(HumanDecision::Modify),
            Just(HumanDecision::Defer),
            Just(HumanDecision::Escalate),
            Just(HumanDecision::Expire),
            // Including words that spell known ones: they must stay `Unknown`.
            prop_oneof![Just("approve".to_owned()), Just(String::new()), ".{0,12}"]
                .prop_map(|w| HumanDecision::Unknown(w.into())),
        ]
    }

    fn transition_status() -> impl Strategy<Value = TransitionStatus> {
        prop_oneof![
            Just(TransitionStatus::Pending),
            Just(TransitionStatus::Rejected),
            Just(TransitionStatus::Superseded),
            Just(TransitionStatus::Consumed),
            Just(TransitionStatus::Executed),
            Just(TransitionStatus::Expired),
            Just(TransitionStatus::Revoked),
            Just(TransitionStatus::Cancelled),
            prop_oneof![Just("pending".to_owned()), ".{0,12}"]
                .prop_map(|w| TransitionStatus::Other(w.into())),
        ]
    }

    prop_compose! {
        fn pending()(
            decision in decision(),
            original_nonce in proptest::option::of(any::<u64>()),
            original_args_digest in proptest::option::of(digest()),
            successor_nonce in proptest::option::of(any::<u64>()),
            successor_args_digest in proptest::option::of(digest()),
            terminal_status in transition_status(),
            resume_attempt in any::<bool>(),
            tool_name in proptest::option::of(".{0,16}"),
            requested_at_ns in any::<i64>(),
            call_number in any::<u64>(),
            operator_id in proptest::option::of(".{0,8}"),
            held_reason in proptest::option::of(proptest::sample::select(Reason::ALL)),
            estimated_cost in any::<i64>(),
        ) -> PendingTransition {
            PendingTransition {
                decision, original_nonce, original_args_digest, successor_nonce,
                successor_args_digest, terminal_status, resume_attempt, tool_name,
                requested_at_ns, call_number, operator_id, held_reason,
                estimated_cost: Money(estimated_cost),
            }
        }
    }

    prop_compose! {
        fn state()(
            status in prop_oneof![
                Just(SessionStatus::Active), Just(SessionStatus::Paused),
                Just(SessionStatus::Terminated), Just(SessionStatus::Stale),
            ],
            budget in any::<[i64; 3]>(),
            reservations in btree_map(any::<u64>(), any::<(i64, i64)>(), 0..6),
            total_calls in any::<u64>(),
            repeat_counts in btree_map(".{0,10}", any::<u32>(), 0..4),
            window_counts in btree_map(".{0,10}", any::<u32>(), 0..4),
            times in any::<[i64; 4]>(),
            circuit_tripped in any::<bool>(),
            reason in proptest::option::of(proptest::sample::select(Reason::ALL)),
            seen_nonces in proptest::collection::vec(any::<u64>(), 0..20),
            last_tool_name in proptest::option::of(".{0,16}"),
            last_params_hash in proptest::option::of(digest()),
            last_error_signal in any::<bool>(),
            pending in proptest::option::of(pending()),
            more in proptest::collection::vec(pending(), 0..3),
        ) -> SessionState {
            // Further held calls only beside a first one (the codec's invariant).
            let more_pending = if pending.is_some() { more } else { Vec::new() };
            let [budget_initial, budget_remaining, budget_spent] = budget;
            let [window_start_ns, circuit_tripped_at_ns, started_at_ns, last_activity_ns] = times;
            SessionState {
                status,
                budget_initial: Money(budget_initial),
                budget_remaining: Money(budget_remaining),
                budget_spent: Money(budget_spent),
                reservations: reservations
                    .into_iter()
                    .map(|(k, (e, d))| (k, Reservation { estimated: Money(e), deducted: Money(d) }))
                    .collect(),
                total_calls,
                repeat_counts,
                window_counts,
                window_start_ns,
                circuit_tripped,
                circuit_trip_reason: reason,
                circuit_tripped_at_ns,
                seen_nonces: seen_nonces.into_iter().collect(),
                last_tool_name,
                last_params_hash,
                last_error_signal,
                pending,
                more_pending,
                started_at_ns,
                last_activity_ns,
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn round_trips_exactly(s in state()) {
            let bytes = encode(&s);
            let back = decode(&bytes, DecodeLimits::default()).unwrap();
            prop_assert_eq!(&back, &s);
            // One encoding per state: re-encoding gives the same bytes.
            prop_assert_eq!(encode(&back), bytes);
        }

        #[test]
        fn the_direct_writer_writes_the_value_trees_bytes(s in state()) {
            prop_assert_eq!(encode(&s), json::to_canonical_vec(&to_value(&s)).unwrap());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode(&bytes, DecodeLimits::default());
        }

        #[test]
        fn mutated_encodings_never_panic_and_reencode(
            s in state(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = encode(&s);
            for (i, b) in flips {
                let at = i.index(bytes.len());
                bytes[at] = b;
            }
            // Whatever still decodes is a state with exactly one encoding.
            if let Ok(t) = decode(&bytes, DecodeLimits::default()) {
                let again = encode(&t);
                prop_assert_eq!(decode(&again, DecodeLimits::default()).unwrap(), t);
            }
        }
    }

    fn with(s: &SessionState, edit: impl FnOnce(&mut BTreeMap<String, Value>)) -> Vec<u8> {
        let mut v = to_value(s);
        if let Value::Object(m) = &mut v {
            edit(m);
        }
        json::to_canonical_vec(&v).unwrap()
    }

    fn err(bytes: &[u8]) -> StateCodecError {
        decode(bytes, DecodeLimits::default()).unwrap_err()
    }

    #[test]
    fn default_state_round_trips_and_reads_plainly() {
        let s = SessionState::new(Money(500_000_000), 7);
        let text = String::from_utf8(encode(&s)).unwrap();
        assert!(text.starts_with("{\"budget_initial\":500000000,"), "{text}");
        assert!(text.contains("\"v\":2"), "{text}");
        assert_eq!(decode(text.as_bytes(), DecodeLimits::default()).unwrap(), s);
    }

    #[test]
    fn nonces_keep_their_order() {
        let mut s = SessionState::new(Money(1), 2);
        for n in [9, 3, 7] {
            s.seen_nonces.insert(n, 10);
        }
        let text = String::from_utf8(encode(&s)).unwrap();
        assert!(text.contains("\"seen_nonces\":[9,3,7]"), "{text}");
        assert_eq!(decode(text.as_bytes(), DecodeLimits::default()).unwrap(), s);
    }

    #[test]
    fn unknown_and_missing_keys_are_named() {
        let s = SessionState::default();
        let e = err(&with(&s, |m| {
            m.insert("extra".into(), Value::Null);
        }));
        assert_eq!(e.to_string(), "unknown key `extra` in state");
        let e = err(&with(&s, |m| {
            m.remove("seen_nonces");
        }));
        assert_eq!(e.to_string(), "missing key `seen_nonces` in state");
        let mut p = s.clone();
        p.pending = Some(PendingTransition::default());
        let e = err(&with(&p, |m| {
            if let Some(Value::Object(pm)) = m.get_mut("pending") {
                pm.insert("nonce".into(), Value::Null);
            }
        }));
        assert_eq!(e.to_string(), "unknown key `nonce` in pending");
    }

    #[test]
    fn version_is_checked() {
        let s = SessionState::default();
        let e = err(&with(&s, |m| {
            m.insert("v".into(), Value::from(1_i64));
        }));
        assert_eq!(
            e.to_string(),
            "state version `1` is not supported (expected 2)"
        );
        let e = err(&with(&s, |m| {
            m.insert("v".into(), Value::from("2"));
        }));
        assert!(matches!(e, StateCodecError::Version { .. }), "{e}");
        let e = err(&with(&s, |m| {
            m.remove("v");
        }));
        assert!(
            matches!(e, StateCodecError::MissingKey { key: "v", .. }),
            "{e}"
        );
    }

    #[test]
    fn values_are_typed_and_ranged() {
        let s = SessionState::default();
        let cases: [(&str, Value); 8] = [
            ("budget_spent", Value::from(0.5)),
            ("budget_spent", Value::from("1")),
            ("total_calls", Value::from(-1_i64)),
            ("status", Value::from("active")),
            ("circuit_trip_reason", Value::from("nope")),
            ("last_params_hash", Value::from("AB".repeat(32).as_str())),
            ("repeat_counts", {
                let mut m = BTreeMap::new();
                m.insert("t".to_owned(), Value::from(i64::from(u32::MAX) + 1));
                Value::Object(m)
            }),
            (
                "seen_nonces",
                Value::Array(vec![Value::from(2_i64), Value::from(2_i64)]),
            ),
        ];
        for (key, bad) in cases {
            let bytes = with(&s, |m| {
                m.insert(key.into(), bad.clone());
            });
            assert!(
                decode(&bytes, DecodeLimits::default()).is_err(),
                "{key} = {bad:?}"
            );
        }
        let dup = with(&s, |m| {
            m.insert(
                "reservations".into(),
                Value::Array(vec![
                    Value::Array(vec![
                        Value::from(1_i64),
                        Value::from(1_i64),
                        Value::from(1_i64),
                    ]),
                    Value::Array(vec![
                        Value::from(1_i64),
                        Value::from(2_i64),
                        Value::from(2_i64),
                    ]),
                ]),
            );
        });
        assert_eq!(
            err(&dup),
            StateCodecError::NotIncreasing {
                field: "reservations"
            }
        );
    }

    #[test]
    fn input_is_bounded() {
        let s = SessionState::default();
        let bytes = encode(&s);
        let e = decode(
            &bytes,
            DecodeLimits {
                max_bytes: bytes.len() - 1,
            },
        )
        .unwrap_err();
        assert!(matches!(e, StateCodecError::Json(_)), "{e}");
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(matches!(err(deep.as_bytes()), StateCodecError::Json(_)));
    }
}
