//! The published SP/1.0 conformance vector format, and a runner for it.
//!
//! A vector file is either the published shape, an object whose `fixtures` array holds the
//! vectors (other top-level keys are metadata and ignored), or a bare array of vectors.
//! Each vector has `name`, `config`, `state`, `call`, `expected_verdict` and
//! `expected_reason`, and optionally `canonical_hash` (SHA-256 of the canonical
//! `call.params`), `vector_hash` (SHA-256 of the canonical vector without that key),
//! `conformance_note`, `note` and `negative_control`. Two fields are ours, for vectors of
//! the extension layers: `now_ns` (the clock, default 0) and `rng` (the random draw,
//! default 1.0, which never draws a probabilistic denial).
//!
//! [`run_file`] reads, checks and decides every vector of a file; [`prepare_file`] reads
//! them and classifies their params once ([`Prepared`]), so a caller can decide them
//! repeatedly with nothing else in the loop (`tollgate conformance --bench`).
//!
//! Unknown keys are errors, so a typo cannot silently change what a vector tests.
//! Defaults for absent state: `budget_initial_usd` is the config's `budget_usd`, and
//! `budget_remaining_usd` is `budget_initial_usd`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::call::{Params, ToolCall};
use crate::config::{GuardConfig, Ratio};
use crate::decide::decide;
use crate::digest::Digest;
use crate::json::{self, Value};
use crate::state::{
    HumanDecision, PendingTransition, SessionState, SessionStatus, TransitionStatus,
};
use crate::types::{Decision, Money, Reason, Verdict};

/// A vector that cannot be read: where in it, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{path}`: {message}")]
pub struct VectorError {
    /// A dotted path into the vector (`state.seen_nonces[0]`).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

fn err<T>(path: &str, message: impl Into<String>) -> Result<T, VectorError> {
    Err(VectorError {
        path: path.to_owned(),
        message: message.into(),
    })
}

/// A file that holds no vectors in either accepted shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// Not JSON.
    #[error("not valid JSON: {0}")]
    Json(#[from] json::ParseError),
    /// JSON of the wrong shape.
    #[error("{0}")]
    Shape(String),
}

/// One vector, read.
#[derive(Debug, Clone)]
pub struct Vector {
    /// Its name.
    pub name: String,
    /// The policy.
    pub config: GuardConfig,
    /// The session state.
    pub state: SessionState,
    /// The call's params, as given.
    pub params: Value,
    /// The call's tool.
    pub tool_name: String,
    /// The call's nonce.
    pub nonce: Option<u64>,
    /// The call's estimated cost.
    pub estimated_cost: Money,
    /// Raw params text, if the vector gives one (else the canonical text is scanned).
    pub raw_params: Option<String>,
    /// The clock.
    pub now_ns: i64,
    /// The random draw.
    pub rng: f64,
    /// What the vector expects.
    pub expected_verdict: String,
    /// The reason it expects.
    pub expected_reason: String,
    /// The published params hash, if any.
    pub canonical_hash: Option<String>,
    /// The published vector seal, if any.
    pub vector_hash: Option<String>,
    /// The vector as parsed, for the seal.
    pub raw: Value,
}

/// One vector's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The vector's name (or `#index` when it has none).
    pub name: String,
    /// The expected verdict and reason, as written.
    pub expected: Option<(String, String)>,
    /// What `decide` returned, if the vector could be run.
    pub got: Option<Decision>,
    /// Everything wrong: mismatches, hash failures, unreadable fields. Empty means PASS.
    pub problems: Vec<String>,
}

impl Outcome {
    /// Whether the vector passed.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for Outcome {
    /// `PASS name`, or `FAIL name: ...` with each problem.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.passed() {
            write!(f, "PASS {}", self.name)
        } else {
            write!(f, "FAIL {}: {}", self.name, self.problems.join("; "))
        }
    }
}

/// Read every vector of a file and run it. A file that is not in either shape is an error;
/// a single bad vector is a failed [`Outcome`], and the others still run.
pub fn run_file(bytes: &[u8]) -> Result<Vec<Outcome>, FileError> {
    Ok(prepare_file(bytes)?
        .into_iter()
        .map(|item| match item {
            Ok(prepared) => prepared.check(),
            Err(unreadable) => unreadable,
        })
        .collect())
}

/// Read every vector of a file and classify its params, deciding nothing yet. A file that
/// is not in either shape is an error; a vector that cannot be read is its failed
/// [`Outcome`] (`invalid vector: ...`), in file order with the others.
pub fn prepare_file(bytes: &[u8]) -> Result<Vec<Result<Prepared, Outcome>>, FileError> {
    let doc = json::parse(bytes, json::Limits::default())?;
    let items = match &doc {
        Value::Array(items) => items.as_slice(),
        Value::Object(map) => match map.get("fixtures") {
            Some(Value::Array(items)) => items.as_slice(),
            Some(other) => {
                return Err(FileError::Shape(format!(
                    "`fixtures` is {}, not an array",
                    other.type_name()
                )))
            }
            None => {
                return Err(FileError::Shape(
                    "expected an array of vectors or an object with a `fixtures` array".into(),
                ))
            }
        },
        other => {
            return Err(FileError::Shape(format!(
                "expected an array or object, found {}",
                other.type_name()
            )))
        }
    };
    Ok(items
        .iter()
        .enumerate()
        .map(|(i, v)| prepare_value(i, v))
        .collect())
}

fn prepare_value(index: usize, v: &Value) -> Result<Prepared, Outcome> {
    match Vector::from_value(v) {
        Ok(vector) => Ok(Prepared::new(vector)),
        Err(e) => Err(Outcome {
            name: v
                .get("name")
                .and_then(Value::as_str)
                .map_or_else(|| format!("#{index}"), str::to_owned),
            expected: None,
            got: None,
            problems: vec![format!("invalid vector: {e}")],
        }),
    }
}

/// Run one vector: check its hashes, decide, compare.
pub fn run(v: &Vector) -> Outcome {
    Prepared::new(v.clone()).check()
}

/// A vector with its params classified ([`Params::json`]) and its call built once, so that
/// [`decide`] can be run on it any number of times with nothing else in the loop (what
/// `tollgate conformance --bench` times).
#[derive(Debug, Clone)]
pub struct Prepared {
    vector: Vector,
    params: Params,
    /// The canonical params text, scanned for error signals when the vector gives no
    /// `raw_params`.
    canonical_text: Option<String>,
}

impl Prepared {
    /// Classify `vector`'s params.
    pub fn new(vector: Vector) -> Prepared {
        let params = Params::json(&vector.params);
        let canonical_text = json::to_canonical_vec(&vector.params)
            .ok()
            .and_then(|b| String::from_utf8(b).ok());
        Prepared {
            vector,
            params,
            canonical_text,
        }
    }

    /// The vector.
    pub fn vector(&self) -> &Vector {
        &self.vector
    }

    /// The `call` argument of [`decide`].
    pub fn call(&self) -> ToolCall<'_> {
        let v = &self.vector;
        ToolCall {
            tool_name: &v.tool_name,
            params: self.params,
            nonce: v.nonce,
            estimated_cost: v.estimated_cost,
            raw_params: v.raw_params.as_deref().or(self.canonical_text.as_deref()),
        }
    }

    /// Decide the vector's call once.
    pub fn decide(&self) -> Decision {
        let v = &self.vector;
        decide(&v.config, &v.state, &self.call(), v.now_ns, v.rng)
    }

    /// Check the vector's hashes, decide, and compare with what it expects.
    pub fn check(&self) -> Outcome {
        let v = &self.vector;
        let mut problems = Vec::new();
        if let Some(want) = &v.canonical_hash {
            match json::canonical_hash(&v.params) {
                Ok(got) if got.to_string() == want.trim().to_ascii_lowercase() => {}
                Ok(got) => problems.push(format!(
                    "canonical_hash mismatch: vector says {want}, params hash to {got}"
                )),
                Err(e) => problems.push(format!("canonical_hash cannot be computed: {e}")),
            }
        }
        if let Some(want) = &v.vector_hash {
            match vector_seal(&v.raw) {
                Ok(got) if got.to_string() == want.trim().to_ascii_lowercase() => {}
                Ok(got) => problems.push(format!(
                    "vector_hash mismatch: vector says {want}, vector hashes to {got}"
                )),
                Err(e) => problems.push(format!("vector_hash cannot be computed: {e}")),
            }
        }
        let got = self.decide();
        let verdict_ok = v
            .expected_verdict
            .parse::<Verdict>()
            .is_ok_and(|e| e == got.verdict);
        if !verdict_ok || got.reason.as_str() != v.expected_reason {
            problems.push(format!(
                "expected {} {}, got {} {}",
                v.expected_verdict, v.expected_reason, got.verdict, got.reason
            ));
        }
        Outcome {
            name: v.name.clone(),
            expected: Some((v.expected_verdict.clone(), v.expected_reason.clone())),
            got: Some(got),
            problems,
        }
    }
}

/// SHA-256 of the canonical vector without its `vector_hash` key.
pub fn vector_seal(raw: &Value) -> Result<Digest, json::NonFinite> {
    match raw {
        Value::Object(map) => {
            let mut without = map.clone();
            without.remove("vector_hash");
            json::canonical_hash(&Value::Object(without))
        }
        other => json::canonical_hash(other),
    }
}

// ---------------------------------------------------------------------------------------
// Reading vectors
// ---------------------------------------------------------------------------------------

struct Obj<'a> {
    path: &'a str,
    map: &'a BTreeMap<String, Value>,
}

impl<'a> Obj<'a> {
    fn new(path: &'a str, v: &'a Value, allowed: &[&str]) -> Result<Obj<'a>, VectorError> {
        let Some(map) = v.as_object() else {
            return err(path, format!("expected an object, found {}", v.type_name()));
        };
        if let Some(k) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return err(&join(path, k), "unknown field");
        }
        Ok(Obj { path, map })
    }

    /// A present, non-null member.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn path(&self, key: &str) -> String {
        join(self.path, key)
    }

    fn string(&self, key: &str) -> Result<Option<String>, VectorError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => err(
                &self.path(key),
                format!("expected a string, found {}", v.type_name()),
            ),
        }
    }

    fn required_string(&self, key: &str) -> Result<String, VectorError> {
        self.string(key)?
            .map_or_else(|| err(&self.path(key), "missing"), Ok)
    }

    fn bool(&self, key: &str) -> Result<bool, VectorError> {
        match self.get(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => err(
                &self.path(key),
                format!("expected a boolean, found {}", v.type_name()),
            ),
        }
    }

    fn u64(&self, key: &str) -> Result<Option<u64>, VectorError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| VectorError {
                path: self.path(key),
                message: format!("expected a non-negative integer, found {}", v.type_name()),
            }),
        }
    }

    fn u32(&self, key: &str) -> Result<u32, VectorError> {
        match self.u64(key)? {
            None => Ok(0),
            Some(n) => u32::try_from(n).or_else(|_| err(&self.path(key), "out of range")),
        }
    }

    fn i64(&self, key: &str) -> Result<i64, VectorError> {
        match self.get(key) {
            None => Ok(0),
            Some(v) => v.as_i64().ok_or_else(|| VectorError {
                path: self.path(key),
                message: format!("expected an integer, found {}", v.type_name()),
            }),
        }
    }

    fn f64(&self, key: &str) -> Result<Option<f64>, VectorError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| VectorError {
                path: self.path(key),
                message: format!("expected a number, found {}", v.type_name()),
            }),
        }
    }

    fn money(&self, key: &str) -> Result<Option<Money>, VectorError> {
        match self.f64(key)? {
            None => Ok(None),
            Some(f) => Money::from_usd(f)
                .map(Some)
                .or_else(|e| err(&self.path(key), e.to_string())),
        }
    }

    fn ratio(&self, key: &str) -> Result<Ratio, VectorError> {
        match self.f64(key)? {
            None => Ok(Ratio::default()),
            Some(f) => Ratio::from_f64(f).or_else(|e| err(&self.path(key), e.to_string())),
        }
    }

    fn word<T>(&self, key: &str) -> Result<T, VectorError>
    where
        T: std::str::FromStr + Default,
        T::Err: fmt::Display,
    {
        match self.string(key)? {
            None => Ok(T::default()),
            Some(s) => s
                .parse()
                .or_else(|e: T::Err| err(&self.path(key), e.to_string())),
        }
    }

    fn digest(&self, key: &str) -> Result<Option<Digest>, VectorError> {
        match self.string(key)? {
            None => Ok(None),
            Some(s) => Digest::from_hex(&s)
                .map(Some)
                .or_else(|e| err(&self.path(key), e.to_string())),
        }
    }

    fn counts(&self, key: &str) -> Result<BTreeMap<String, u32>, VectorError> {
        let Some(v) = self.get(key) else {
            return Ok(BTreeMap::new());
        };
        let path = self.path(key);
        let Some(map) = v.as_object() else {
            return err(
                &path,
                format!("expected an object, found {}", v.type_name()),
            );
        };
        map.iter()
            .map(|(k, n)| {
                let n = n
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| VectorError {
                        path: join(&path, k),
                        message: "expected a count".into(),
                    })?;
                Ok((k.clone(), n))
            })
            .collect()
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

const VECTOR_KEYS: &[&str] = &[
    "name",
    "config",
    "state",
    "call",
    "canonical_hash",
    "expected_verdict",
    "expected_reason",
    "vector_hash",
    "conformance_note",
    "note",
    "negative_control",
    "now_ns",
    "rng",
];
const CONFIG_KEYS: &[&str] = &[
    "budget_usd",
    "budget_scope",
    "max_repeat_calls",
    "error_amplification",
    "timeout_seconds",
    "window_duration_s",
    "window_max_calls",
    "max_total_calls",
    "probabilistic_deny",
    "deny_jitter_ratio",
    "hitl_mode",
    "hitl_budget_threshold",
    "settlement",
    "parent_guard_id",
    "max_held_calls",
];
const STATE_KEYS: &[&str] = &[
    "status",
    "budget_initial_usd",
    "budget_remaining_usd",
    "budget_spent_usd",
    "total_calls",
    "repeat_counts",
    "window_counts",
    "window_start_ns",
    "circuit_tripped",
    "circuit_trip_reason",
    "circuit_tripped_at_ns",
    "seen_nonces",
    "last_tool_name",
    "last_tool_params_hash",
    "last_error_signal",
    "pending_transition",
    "held_transitions",
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
];
const CALL_KEYS: &[&str] = &[
    "tool_name",
    "params",
    "estimated_cost_usd",
    "nonce",
    "note",
    "raw_params",
];

impl Vector {
    /// Read one vector from its JSON value.
    pub fn from_value(v: &Value) -> Result<Vector, VectorError> {
        let top = Obj::new("", v, VECTOR_KEYS)?;
        let name = top.required_string("name")?;
        let config = read_config(&Obj::new(
            "config",
            top.get("config").unwrap_or(&Value::Null),
            CONFIG_KEYS,
        )?)?;
        let state = read_state(
            &Obj::new(
                "state",
                top.get("state").unwrap_or(&Value::Null),
                STATE_KEYS,
            )?,
            &config,
        )?;
        let call = Obj::new("call", top.get("call").unwrap_or(&Value::Null), CALL_KEYS)?;
        let Some(params) = call.map.get("params") else {
            return err("call.params", "missing");
        };
        let rng = top.f64("rng")?.unwrap_or(1.0);
        Ok(Vector {
            name,
            tool_name: call.required_string("tool_name")?,
            params: params.clone(),
            nonce: call.u64("nonce")?,
            estimated_cost: call.money("estimated_cost_usd")?.unwrap_or(Money::ZERO),
            raw_params: call.string("raw_params")?,
            config,
            state,
            now_ns: top.i64("now_ns")?,
            rng,
            expected_verdict: top.required_string("expected_verdict")?,
            expected_reason: top.required_string("expected_reason")?,
            canonical_hash: top.string("canonical_hash")?,
            vector_hash: top.string("vector_hash")?,
            raw: v.clone(),
        })
    }
}

fn read_config(c: &Obj<'_>) -> Result<GuardConfig, VectorError> {
    Ok(GuardConfig {
        budget: c.money("budget_usd")?.unwrap_or(Money::ZERO),
        budget_scope: c.word("budget_scope")?,
        max_repeat_calls: c.u32("max_repeat_calls")?,
        error_amplification: c.bool("error_amplification")?,
        timeout_seconds: c.u32("timeout_seconds")?,
        window_duration_s: c.u32("window_duration_s")?,
        window_max_calls: c.u32("window_max_calls")?,
        max_total_calls: c.u64("max_total_calls")?.unwrap_or(0),
        probabilistic_deny: c.bool("probabilistic_deny")?,
        deny_jitter_ratio: c.ratio("deny_jitter_ratio")?,
        hitl_mode: c.word("hitl_mode")?,
        hitl_budget_threshold: c.ratio("hitl_budget_threshold")?,
        settlement: c.word("settlement")?,
        parent_guard_id: c.string("parent_guard_id")?,
        nonce_window: crate::config::DEFAULT_NONCE_WINDOW,
        max_reservations: crate::config::DEFAULT_MAX_RESERVATIONS,
        // The published vectors are SP/1.0.1 exactly: one pending transition. A vector may
        // opt into the parallel-holds extension with `max_held_calls` (Tollgate's own).
        max_held_calls: c.u32("max_held_calls")?.max(1),
    })
}

fn read_state(s: &Obj<'_>, config: &GuardConfig) -> Result<SessionState, VectorError> {
    let initial = s.money("budget_initial_usd")?.unwrap_or(config.budget);
    let remaining = s.money("budget_remaining_usd")?.unwrap_or(initial);
    let mut seen_nonces = BTreeSet::new();
    if let Some(v) = s.get("seen_nonces") {
        let Some(items) = v.as_array() else {
            return err("state.seen_nonces", "expected an array");
        };
        for (i, n) in items.iter().enumerate() {
            let n = n.as_u64().ok_or_else(|| VectorError {
                path: format!("state.seen_nonces[{i}]"),
                message: "expected a non-negative integer".into(),
            })?;
            seen_nonces.insert(n);
        }
    }
    let status = match s.string("status")?.as_deref().map(str::trim) {
        None => SessionStatus::Active,
        Some(t) if t.eq_ignore_ascii_case("active") => SessionStatus::Active,
        Some(t) if t.eq_ignore_ascii_case("paused") => SessionStatus::Paused,
        Some(t) if t.eq_ignore_ascii_case("terminated") => SessionStatus::Terminated,
        Some(t) if t.eq_ignore_ascii_case("stale") => SessionStatus::Stale,
        Some(t) => return err("state.status", format!("unknown status `{t}`")),
    };
    let pending = match s.get("pending_transition") {
        None => None,
        Some(p) => Some(read_pending(&Obj::new(
            "state.pending_transition",
            p,
            PENDING_KEYS,
        )?)?),
    };
    // Tollgate's extension (parallel holds): the session's further held calls.
    let mut more_pending = Vec::new();
    if let Some(v) = s.get("held_transitions") {
        let Some(items) = v.as_array() else {
            return err("state.held_transitions", "expected an array");
        };
        if pending.is_none() && !items.is_empty() {
            return err(
                "state.held_transitions",
                "needs a pending_transition (the oldest held call)",
            );
        }
        for p in items {
            more_pending.push(read_pending(&Obj::new(
                "state.held_transitions[]",
                p,
                PENDING_KEYS,
            )?)?);
        }
    }
    Ok(SessionState {
        more_pending,
        status,
        budget_initial: initial,
        budget_remaining: remaining,
        budget_spent: s.money("budget_spent_usd")?.unwrap_or(Money::ZERO),
        reservations: BTreeMap::new(),
        total_calls: s.u64("total_calls")?.unwrap_or(0),
        repeat_counts: s.counts("repeat_counts")?,
        window_counts: s.counts("window_counts")?,
        window_start_ns: s.i64("window_start_ns")?,
        circuit_tripped: s.bool("circuit_tripped")?,
        // Free text in the published vectors ("prior_deny"); kept only when it names one
        // of our reasons. It is informational: `decide` reads only `circuit_tripped`.
        circuit_trip_reason: s
            .string("circuit_trip_reason")?
            .and_then(|r| r.parse::<Reason>().ok()),
        circuit_tripped_at_ns: s.i64("circuit_tripped_at_ns")?,
        seen_nonces: seen_nonces.into(),
        last_tool_name: s.string("last_tool_name")?,
        last_params_hash: s.digest("last_tool_params_hash")?,
        last_error_signal: s.bool("last_error_signal")?,
        pending,
        started_at_ns: s.i64("started_at_ns")?,
        last_activity_ns: s.i64("last_activity_ns")?,
    })
}

fn read_pending(p: &Obj<'_>) -> Result<PendingTransition, VectorError> {
    Ok(PendingTransition {
        decision: HumanDecision::parse(&p.string("decision")?.unwrap_or_default()),
        original_nonce: p.u64("original_nonce")?,
        original_args_digest: p.digest("original_args_digest")?,
        successor_nonce: p.u64("successor_nonce")?,
        successor_args_digest: p.digest("successor_args_digest")?,
        terminal_status: TransitionStatus::parse(&p.string("terminal_status")?.unwrap_or_default()),
        resume_attempt: p.bool("resume_attempt")?,
        tool_name: p.string("tool_name")?,
        requested_at_ns: p.i64("requested_at_ns")?,
        call_number: 0,
        operator_id: None,
        held_reason: None,
        estimated_cost: Money::ZERO,
    })
}
