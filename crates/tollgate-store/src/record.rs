//! The bytes a persistent store writes: session records, budget records and budget keys,
//! all canonical JSON with exact integers, decoded strictly and within bounds.
//!
//! ```text
//! session  {"v":2,"session_id":..,"agent_id":..,"organization_id":..,
//!           "budget_scope":"per_agent","created_at_ns":..,"policy":"{guard json}",
//!           "last_call_number":..,"seq":..,"state":{state_codec}
//!           [,"labels":["customer-data",..]][,"policy_set":"<hex digest>"]}
//! budget   {"v":2,"initial":..,"remaining":..,"spent":..}
//! key      ["agent","org-1","agent-7"] | ["organization","org-1"] | ["session","s-1"]
//! ```
//!
//! `labels` (the session's flow labels, issue 18) is written only when the session has
//! some: a strictly increasing list of at most 32 labels; a record without it has none, so
//! the records of sessions without labels are what they were before labels existed.
//! `policy_set` (the digest of the policy set in force when the session opened) likewise
//! only when there was one.
//!
//! A session's state is bounded by its policy (the nonce window, the reservation cap), so
//! a record is small whatever the session's history; the embedded store writes records
//! only in snapshots, off the path of any verdict. The heartbeat is not recorded (a
//! reopened store gives every session a fresh heartbeat window).

use std::collections::BTreeMap;

use tollgate_core::json::{self, Limits, Number, Value};
use tollgate_core::labels::{Label, LabelSet, MAX_LABELS};
use tollgate_core::state_codec;
use tollgate_core::{BudgetScope, Digest, Money};

use std::sync::Arc;

use crate::session::{Budget, BudgetKey, Policy, Session, SessionMeta};

/// The record format version.
pub const RECORD_VERSION: u64 = 2;

/// Why stored bytes are not a record (the store wraps this with the record's key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not JSON within the limits.
    #[error("not valid json: {0}")]
    Json(#[from] json::ParseError),
    /// The session state inside is not valid.
    #[error("state: {0}")]
    State(#[from] state_codec::StateCodecError),
    /// The record version is not one this code reads.
    #[error("record version is not {RECORD_VERSION}")]
    Version,
    /// A key this version does not have.
    #[error("unknown key `{0}`")]
    UnknownKey(String),
    /// A required key is missing.
    #[error("missing key `{0}`")]
    MissingKey(&'static str),
    /// A value of the wrong type or range.
    #[error("`{0}` has the wrong type or is out of range")]
    Invalid(&'static str),
    /// The policy is not a guard configuration in canonical form.
    #[error("policy: {0}")]
    Policy(String),
}

fn int(i: i64) -> Value {
    Value::Number(Number::Int(i128::from(i)))
}

fn uint(u: u64) -> Value {
    Value::Number(Number::Int(i128::from(u)))
}

fn scope_str(s: BudgetScope) -> &'static str {
    s.as_str()
}

fn canonical(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    // Records hold no floats, so the canonical writer cannot fail.
    let _ = json::write_canonical(v, &mut out);
    out
}

/// The record bytes of a session: `session_value`'s canonical bytes, written member by
/// member (a fleet writes one on every decision; the tests check the bytes are the same).
pub fn encode_session(s: &Session) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024 + 21 * s.state.seen_nonces.len());
    encode_session_into(s, &mut out);
    out
}

/// [`encode_session`], appended to `out` (so a caller framing the record writes it in
/// place).
pub fn encode_session_into(s: &Session, out: &mut Vec<u8>) {
    let mut o = json::ObjectWriter::new(out);
    o.str("agent_id", s.meta.agent_id.as_str());
    o.str("budget_scope", scope_str(s.meta.budget_scope));
    o.int("created_at_ns", s.meta.created_at_ns);
    if !s.labels.is_empty() {
        let out = o.key("labels");
        out.push(b'[');
        for (i, l) in s.labels.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json::write_canonical_str(l.as_str(), out);
        }
        out.push(b']');
    }
    o.int("last_call_number", s.last_call_number);
    o.str("organization_id", s.meta.organization_id.as_str());
    o.str("policy", s.policy.json.as_str());
    if let Some(d) = &s.policy_set {
        o.str("policy_set", &d.to_string());
    }
    o.int("seq", s.seq);
    o.str("session_id", s.meta.session_id.as_str());
    state_codec::write_canonical(&s.state, o.key("state"));
    o.int("v", RECORD_VERSION);
    o.end();
}

/// The session record as a value: the reference [`encode_session`]'s bytes are checked
/// against.
#[cfg(test)]
fn session_value(s: &Session) -> Value {
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_owned(), v);
    };
    put("v", uint(RECORD_VERSION));
    put("session_id", Value::from(s.meta.session_id.as_str()));
    put("agent_id", Value::from(s.meta.agent_id.as_str()));
    put(
        "organization_id",
        Value::from(s.meta.organization_id.as_str()),
    );
    put("budget_scope", Value::from(scope_str(s.meta.budget_scope)));
    put("created_at_ns", int(s.meta.created_at_ns));
    put("policy", Value::from(s.policy.json.as_str()));
    put("last_call_number", uint(s.last_call_number));
    put("seq", uint(s.seq));
    put("state", state_codec::to_value(&s.state));
    if !s.labels.is_empty() {
        put(
            "labels",
            Value::Array(s.labels.iter().map(|l| Value::from(l.as_str())).collect()),
        );
    }
    if let Some(d) = &s.policy_set {
        put("policy_set", Value::from(d.to_string().as_str()));
    }
    Value::Object(m)
}

const SESSION_KEYS: &[&str] = &[
    "v",
    "session_id",
    "agent_id",
    "organization_id",
    "budget_scope",
    "created_at_ns",
    "policy",
    "last_call_number",
    "seq",
    "state",
    "labels",
    "policy_set",
];

/// A record's `labels`: absent (none), or a non-empty, strictly increasing list of at most
/// [`MAX_LABELS`] labels.
fn labels_of(v: Option<&Value>) -> Result<LabelSet, RecordError> {
    let Some(v) = v else {
        return Ok(LabelSet::new());
    };
    let bad = RecordError::Invalid("labels");
    let items = v.as_array().ok_or(bad.clone())?;
    if items.is_empty() || items.len() > MAX_LABELS {
        return Err(bad);
    }
    let mut labels = Vec::with_capacity(items.len());
    for item in items {
        let l = item
            .as_str()
            .and_then(|t| Label::parse(t).ok())
            .ok_or(bad.clone())?;
        if labels.last().is_some_and(|p: &Label| *p >= l) {
            return Err(bad);
        }
        labels.push(l);
    }
    LabelSet::new().with(&labels).map_err(|_| bad)
}

/// Decode a session record of at most `max_bytes`; its heartbeat is set to `now`.
pub fn decode_session(bytes: &[u8], max_bytes: usize, now: i64) -> Result<Session, RecordError> {
    let v = parse(bytes, max_bytes)?;
    let m = fields(&v, SESSION_KEYS)?;
    let get = |k: &'static str| m.get(k).ok_or(RecordError::MissingKey(k));
    let string = |k: &'static str| -> Result<String, RecordError> {
        get(k)?
            .as_str()
            .map(str::to_owned)
            .ok_or(RecordError::Invalid(k))
    };
    let i64_of = |k: &'static str| get(k)?.as_i64().ok_or(RecordError::Invalid(k));
    let budget_scope = match get("budget_scope")?.as_str() {
        Some("per_session") => BudgetScope::PerSession,
        Some("per_agent") => BudgetScope::PerAgent,
        Some("per_organization") => BudgetScope::PerOrganization,
        _ => return Err(RecordError::Invalid("budget_scope")),
    };
    let policy = Policy::from_json(&string("policy")?).map_err(RecordError::Policy)?;
    let u64_of = |k: &'static str| get(k)?.as_u64().ok_or(RecordError::Invalid(k));
    Ok(Session {
        meta: SessionMeta {
            session_id: string("session_id")?,
            agent_id: string("agent_id")?,
            organization_id: string("organization_id")?,
            budget_scope,
            created_at_ns: i64_of("created_at_ns")?,
        },
        policy: Arc::new(policy),
        last_call_number: u64_of("last_call_number")?,
        seq: u64_of("seq")?,
        last_heartbeat_ns: now,
        state: state_codec::from_value(get("state")?)?,
        labels: labels_of(m.get("labels"))?,
        policy_set: match m.get("policy_set") {
            None => None,
            Some(v) => Some(
                v.as_str()
                    .and_then(|t| Digest::from_hex(t).ok().filter(|d| d.to_string() == t))
                    .ok_or(RecordError::Invalid("policy_set"))?,
            ),
        },
    })
}

/// The record bytes of a budget.
pub fn encode_budget(b: &Budget) -> Vec<u8> {
    let mut m = BTreeMap::new();
    m.insert("v".to_owned(), uint(RECORD_VERSION));
    m.insert("initial".to_owned(), int(b.initial.0));
    m.insert("remaining".to_owned(), int(b.remaining.0));
    m.insert("spent".to_owned(), int(b.spent.0));
    canonical(&Value::Object(m))
}

/// Decode a budget record.
pub fn decode_budget(bytes: &[u8]) -> Result<Budget, RecordError> {
    let v = parse(bytes, 4096)?;
    let m = fields(&v, &["v", "initial", "remaining", "spent"])?;
    let money = |k: &'static str| {
        m.get(k)
            .ok_or(RecordError::MissingKey(k))?
            .as_i64()
            .map(Money)
            .ok_or(RecordError::Invalid(k))
    };
    Ok(Budget {
        initial: money("initial")?,
        remaining: money("remaining")?,
        spent: money("spent")?,
    })
}

/// The text key of a budget record: a canonical JSON array, unambiguous for any ids.
pub fn budget_key_string(k: &BudgetKey) -> String {
    let parts: Vec<Value> = match k {
        BudgetKey::Session(s) => vec!["session".into(), s.as_str().into()],
        BudgetKey::Agent(o, a) => vec!["agent".into(), o.as_str().into(), a.as_str().into()],
        BudgetKey::Organization(o) => vec!["organization".into(), o.as_str().into()],
    };
    String::from_utf8(canonical(&Value::Array(parts))).unwrap_or_default()
}

/// Parse a key written by [`budget_key_string`].
pub fn parse_budget_key(text: &str) -> Result<BudgetKey, RecordError> {
    let v = parse(text.as_bytes(), 4096)?;
    let bad = RecordError::Invalid("budget key");
    let items = v.as_array().ok_or(bad.clone())?;
    let strs: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
    match strs.ok_or(bad.clone())?.as_slice() {
        ["session", s] => Ok(BudgetKey::Session((*s).to_owned())),
        ["agent", o, a] => Ok(BudgetKey::Agent((*o).to_owned(), (*a).to_owned())),
        ["organization", o] => Ok(BudgetKey::Organization((*o).to_owned())),
        _ => Err(bad),
    }
}

fn parse(bytes: &[u8], max_bytes: usize) -> Result<Value, RecordError> {
    Ok(json::parse(
        bytes,
        Limits {
            max_bytes,
            max_depth: state_codec::MAX_DEPTH,
        },
    )?)
}

/// The record's object after checking its version and that it has no unknown key.
fn fields<'v>(v: &'v Value, known: &[&str]) -> Result<&'v BTreeMap<String, Value>, RecordError> {
    let m = v.as_object().ok_or(RecordError::Invalid("record"))?;
    if let Some(k) = m.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(RecordError::UnknownKey(k.chars().take(80).collect()));
    }
    match m.get("v") {
        None => Err(RecordError::MissingKey("v")),
        Some(v) if v.as_u64() == Some(RECORD_VERSION) => Ok(m),
        Some(_) => Err(RecordError::Version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{GuardConfig, PendingTransition};

    fn session() -> Session {
        let mut s = Session::new(
            SessionMeta {
                session_id: "s-1".into(),
                agent_id: "agent \"7\"".into(),
                organization_id: "org/1".into(),
                budget_scope: BudgetScope::PerAgent,
                created_at_ns: 42,
            },
            Arc::new(Policy::new(GuardConfig {
                budget: Money(500_000_000),
                budget_scope: BudgetScope::PerAgent,
                ..GuardConfig::default()
            })),
            42,
        );
        s.last_call_number = u64::MAX;
        s.seq = 7;
        s.last_heartbeat_ns = -1;
        s.state.seen_nonces.insert(9, 10);
        s.state.pending = Some(PendingTransition::default());
        s
    }

    #[test]
    fn session_records_round_trip() {
        let s = session();
        let bytes = encode_session(&s);
        let mut back = decode_session(&bytes, 1 << 20, -1).unwrap();
        assert_eq!(back, s);
        back.last_heartbeat_ns = 5;
        assert_eq!(
            encode_session(&back),
            bytes,
            "the heartbeat is not recorded"
        );
        assert!(decode_session(&bytes, bytes.len() - 1, 0).is_err());
    }

    #[test]
    fn labels_and_the_policy_set_round_trip_and_are_strict() {
        let plain = encode_session(&session());
        let mut s = session();
        s.labels = LabelSet::new()
            .with(&[
                Label::parse("pii").unwrap(),
                Label::parse("customer-data").unwrap(),
            ])
            .unwrap();
        s.policy_set = Some(Digest([0xab; 32]));
        let bytes = encode_session(&s);
        assert_eq!(decode_session(&bytes, 1 << 20, -1).unwrap(), s);
        let text = String::from_utf8(bytes).unwrap();
        assert!(
            text.contains(r#""labels":["customer-data","pii"]"#),
            "{text}"
        );
        // A session without either writes neither key: its record is as before.
        assert!(!String::from_utf8(plain).unwrap().contains("labels"));
        for bad in [
            text.replace(r#"["customer-data","pii"]"#, r#"["pii","customer-data"]"#),
            text.replace(r#"["customer-data","pii"]"#, r#"["pii","pii"]"#),
            text.replace(r#"["customer-data","pii"]"#, "[]"),
            text.replace(r#"["customer-data","pii"]"#, r#"["not a label"]"#),
            text.replace(&"ab".repeat(32), &"AB".repeat(32)),
        ] {
            assert_ne!(bad, text);
            assert!(decode_session(bad.as_bytes(), 1 << 20, 0).is_err(), "{bad}");
        }
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!("\"l{i:02}\"")).collect();
        let too_many = text.replace(
            r#"["customer-data","pii"]"#,
            &format!("[{}]", many.join(",")),
        );
        assert!(decode_session(too_many.as_bytes(), 1 << 20, 0).is_err());
    }

    #[test]
    fn the_direct_writer_writes_the_value_trees_bytes() {
        let mut s = session();
        assert_eq!(encode_session(&s), canonical(&session_value(&s)));
        s.labels = LabelSet::new()
            .with(&[Label::parse("pii").unwrap(), Label::parse("a.b").unwrap()])
            .unwrap();
        s.policy_set = Some(Digest([7; 32]));
        s.state.more_pending = vec![PendingTransition::default()];
        s.state.repeat_counts.insert("t\"o\u{1}ol".into(), 3);
        s.state.window_counts.insert("x".into(), 1);
        s.state.window_counts.insert("é".into(), u32::MAX);
        s.state.reservations.insert(
            4,
            tollgate_core::state::Reservation {
                estimated: Money(-1),
                deducted: Money(i64::MIN),
            },
        );
        s.state.last_params_hash = Some(Digest([0xfe; 32]));
        s.state.last_tool_name = Some("a\nb".into());
        s.state.circuit_trip_reason = Some(tollgate_core::Reason::ALL[0]);
        for n in 0..2000 {
            s.state.seen_nonces.insert(n * 7_919, 1024);
        }
        assert_eq!(encode_session(&s), canonical(&session_value(&s)));
        assert_eq!(decode_session(&encode_session(&s), 1 << 20, -1).unwrap(), s);
    }

    #[test]
    fn session_records_are_strict() {
        let text = String::from_utf8(encode_session(&session())).unwrap();
        let extra = text.replacen("{", "{\"zz\":1,", 1);
        assert_eq!(
            decode_session(extra.as_bytes(), 1 << 20, 0).unwrap_err(),
            RecordError::UnknownKey("zz".into())
        );
        // The record's own version is its last key ("state" sorts before "v").
        let v1 = format!("{}\"v\":1}}", text.strip_suffix("\"v\":2}").unwrap());
        assert_eq!(
            decode_session(v1.as_bytes(), 1 << 20, 0).unwrap_err(),
            RecordError::Version
        );
        let scope = text.replace(
            "\"budget_scope\":\"per_agent\"",
            "\"budget_scope\":\"per_galaxy\"",
        );
        assert_eq!(
            decode_session(scope.as_bytes(), 1 << 20, 0).unwrap_err(),
            RecordError::Invalid("budget_scope")
        );
        let policy = text.replace("nonce_window\\\":1024", "nonce_window\\\":0");
        assert_ne!(policy, text);
        assert!(matches!(
            decode_session(policy.as_bytes(), 1 << 20, 0).unwrap_err(),
            RecordError::Policy(_)
        ));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            let _ = decode_session(&bytes, 1 << 20, 0);
            let _ = decode_budget(&bytes);
            if let Ok(text) = std::str::from_utf8(&bytes) {
                let _ = parse_budget_key(text);
            }
        }

        #[test]
        fn mutated_records_never_panic(
            flips in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()), 1..4),
        ) {
            let mut bytes = encode_session(&session());
            for (i, b) in flips {
                let at = i.index(bytes.len());
                bytes[at] = b;
            }
            if let Ok(s) = decode_session(&bytes, 1 << 20, 0) {
                proptest::prop_assert_eq!(encode_session(&s), canonical(&session_value(&s)));
                proptest::prop_assert_eq!(decode_session(&encode_session(&s), 1 << 20, 0).unwrap(), s);
            }
        }
    }

    #[test]
    fn budgets_and_keys_round_trip() {
        let b = Budget {
            initial: Money(10),
            remaining: Money(-3),
            spent: Money(i64::MAX),
        };
        assert_eq!(decode_budget(&encode_budget(&b)).unwrap(), b);
        for k in [
            BudgetKey::Session("a\"b".into()),
            BudgetKey::Agent("o,1".into(), "a]".into()),
            BudgetKey::Organization("ü".into()),
        ] {
            assert_eq!(parse_budget_key(&budget_key_string(&k)).unwrap(), k);
        }
        assert!(parse_budget_key("[\"agent\",\"o\"]").is_err());
        assert!(decode_budget(b"{\"v\":2,\"initial\":1,\"remaining\":1}").is_err());
    }
}
