//! A proposed tool call, and the one-time classification of its parameters.

use std::fmt;

use crate::digest::Digest;
use crate::json::{self, Number, Value};
use crate::types::Money;

/// The deepest a value may sit inside params: the params object is level 0, its members
/// level 1, and a value at level 65 or deeper makes the params non-canonicalizable.
pub const MAX_PARAMS_DEPTH: usize = 64;

/// Why params cannot be canonicalized (SP/1.0 rule 1). Detection is structural; the
/// fixtures' `__noncanonical__` marker is recognized as the encoding of this class, not
/// as the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NonCanonical {
    /// Params are not a JSON object.
    NotObject,
    /// A NaN or infinite number.
    NonFiniteNumber,
    /// A value nested deeper than [`MAX_PARAMS_DEPTH`].
    TooDeep,
    /// The conformance fixtures' `"__noncanonical__": true` marker, standing for input
    /// (NaN, a non-string key) that JSON text cannot carry.
    FixtureMarker,
    /// The edge could not read the call's inputs at all: params text that does not parse,
    /// a params hash that is not 32 bytes, or a cost that is not a finite non-negative
    /// amount.
    Unreadable,
}

impl NonCanonical {
    /// A stable lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            NonCanonical::NotObject => "not_an_object",
            NonCanonical::NonFiniteNumber => "non_finite_number",
            NonCanonical::TooDeep => "too_deep",
            NonCanonical::FixtureMarker => "noncanonical_marker",
            NonCanonical::Unreadable => "unreadable",
        }
    }
}

impl fmt::Display for NonCanonical {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The params of a call, classified once at the edge so that `decide` only reads the
/// classification.
///
/// INVARIANT (params-classified): `digest` is the canonical hash of exactly the params
/// this was built from, and `opaque` says whether they carry opaque context. Fields are
/// private so no caller can pair a value with someone else's digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    digest: Result<Digest, NonCanonical>,
    opaque: bool,
}

impl Params {
    /// Classify a params value: is it canonicalizable (and its hash), does it carry opaque
    /// context. Allocation-free; walks the value once for each question, never deeper than
    /// [`MAX_PARAMS_DEPTH`] + 1 levels.
    pub fn json(value: &Value) -> Params {
        match check_canonicalizable(value) {
            Err(e) => Params {
                digest: Err(e),
                opaque: false,
            },
            Ok(()) => Params {
                // check_canonicalizable ruled out non-finite numbers, the only way
                // writing can fail.
                digest: json::canonical_hash(value).map_err(|_| NonCanonical::NonFiniteNumber),
                opaque: has_opaque_context(value, 0),
            },
        }
    }

    /// [`Params::json`], also returning the canonical bytes the digest hashes (`None`
    /// when the params cannot be canonicalized): written once, then hashed, for a client
    /// that sends the params beside their hash.
    pub fn json_with_canonical(value: &Value) -> (Params, Option<Vec<u8>>) {
        if let Err(e) = check_canonicalizable(value) {
            return (
                Params {
                    digest: Err(e),
                    opaque: false,
                },
                None,
            );
        }
        match json::to_canonical_vec(value) {
            Ok(bytes) => (
                Params {
                    digest: Ok(Digest::of(&bytes)),
                    opaque: has_opaque_context(value, 0),
                },
                Some(bytes),
            ),
            // Ruled out by check_canonicalizable, like in `Params::json`.
            Err(_) => (
                Params {
                    digest: Err(NonCanonical::NonFiniteNumber),
                    opaque: false,
                },
                None,
            ),
        }
    }

    /// Params known only by their canonical hash (the daemon's case: agents send the hash,
    /// never the arguments). Opaque-context detection is then the agent library's duty.
    pub const fn digest(digest: Digest) -> Params {
        Params {
            digest: Ok(digest),
            opaque: false,
        }
    }

    /// Params known by their canonical hash, which the agent's library (which saw them)
    /// classified as carrying opaque context. Rule 10 then sends the call to a human.
    pub const fn digest_with_opaque_context(digest: Digest) -> Params {
        Params {
            digest: Ok(digest),
            opaque: true,
        }
    }

    /// Inputs the edge could not read. `decide` denies such a call as malformed.
    pub const fn unreadable() -> Params {
        Params {
            digest: Err(NonCanonical::Unreadable),
            opaque: false,
        }
    }

    /// The canonical hash, or why there is none.
    pub const fn canonical_digest(&self) -> Result<Digest, NonCanonical> {
        self.digest
    }

    /// Whether the params carry context that cannot be evaluated deterministically.
    pub const fn has_opaque_context(&self) -> bool {
        self.opaque
    }
}

/// A proposed tool call: the `call` argument of `decide`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolCall<'a> {
    /// The tool's name.
    pub tool_name: &'a str,
    /// The classified params.
    pub params: Params,
    /// The per-dispatch replay token, if the caller sent one.
    pub nonce: Option<u64>,
    /// The caller's estimate of this call's cost; zero when not supplied.
    pub estimated_cost: Money,
    /// The params as the caller wrote them, when available: scanned for error signals
    /// (429, "unauthorized", ...) by error amplification.
    pub raw_params: Option<&'a str>,
}

impl<'a> ToolCall<'a> {
    /// A call with no nonce, no cost and no raw text.
    pub const fn new(tool_name: &'a str, params: Params) -> ToolCall<'a> {
        ToolCall {
            tool_name,
            params,
            nonce: None,
            estimated_cost: Money::ZERO,
            raw_params: None,
        }
    }
}

/// Rule 1, structurally: is `params` an object of finite numbers, nested no deeper than
/// [`MAX_PARAMS_DEPTH`], without the fixtures' marker?
pub fn check_canonicalizable(params: &Value) -> Result<(), NonCanonical> {
    if !matches!(params, Value::Object(_)) {
        return Err(NonCanonical::NotObject);
    }
    check_value(params, 0)
}

fn check_value(v: &Value, level: usize) -> Result<(), NonCanonical> {
    if level > MAX_PARAMS_DEPTH {
        return Err(NonCanonical::TooDeep);
    }
    match v {
        Value::Number(Number::Float(f)) if !f.is_finite() => Err(NonCanonical::NonFiniteNumber),
        Value::Array(items) => items.iter().try_for_each(|i| check_value(i, level + 1)),
        Value::Object(map) => {
            if map.get("__noncanonical__") == Some(&Value::Bool(true)) {
                return Err(NonCanonical::FixtureMarker);
            }
            map.values().try_for_each(|i| check_value(i, level + 1))
        }
        _ => Ok(()),
    }
}

/// Keys that carry context (compared trimmed, ASCII-case-insensitively).
const CONTEXT_KEYS: &[&str] = &["ctx", "context", "opaque", "raw_context", "blob"];
/// Values that say "this cannot be evaluated" (compared the same way).
const OPAQUE_MARKERS: &[&str] = &["opaque", "unknown", "unevaluable", "untestable"];

fn is_one_of(text: &str, words: &[&str]) -> bool {
    let t = text.trim();
    words.iter().any(|w| t.eq_ignore_ascii_case(w))
}

/// Rule 10's key-class × value-class product: a context-bearing key, at any depth, whose
/// own value is an opaque marker string. A context key with any other value is evaluable
/// and does not match; a list or object under it is not itself a marker but is walked like
/// the rest of the params, so context keys inside its objects (also objects inside lists)
/// count, while a bare marker string inside a list binds nothing. Every JSON value can be
/// introspected, so for JSON params the markers are the whole value class.
fn has_opaque_context(v: &Value, level: usize) -> bool {
    if level > MAX_PARAMS_DEPTH {
        return false; // unreachable after check_canonicalizable; bounds the walk anyway
    }
    match v {
        Value::Object(map) => map.iter().any(|(k, val)| {
            (is_one_of(k, CONTEXT_KEYS) && is_opaque_value(val))
                || has_opaque_context(val, level + 1)
        }),
        Value::Array(items) => items.iter().any(|i| has_opaque_context(i, level + 1)),
        _ => false,
    }
}

fn is_opaque_value(v: &Value) -> bool {
    matches!(v, Value::String(s) if is_one_of(s, OPAQUE_MARKERS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::parse_str;

    fn classify(text: &str) -> Params {
        Params::json(&parse_str(text).unwrap())
    }

    fn nested(levels: usize) -> Value {
        // params object at level 0 holding `levels` more nested objects.
        let mut v = Value::Object(Default::default());
        for _ in 0..levels {
            let mut m = std::collections::BTreeMap::new();
            m.insert("a".to_owned(), v);
            v = Value::Object(m);
        }
        v
    }

    #[test]
    fn structural_rejections() {
        assert_eq!(
            classify("[1]").canonical_digest(),
            Err(NonCanonical::NotObject)
        );
        assert_eq!(
            classify("\"x\"").canonical_digest(),
            Err(NonCanonical::NotObject)
        );
        assert_eq!(
            classify(r#"{"a":{"__noncanonical__":true}}"#).canonical_digest(),
            Err(NonCanonical::FixtureMarker)
        );
        assert!(classify(r#"{"__noncanonical__":false}"#)
            .canonical_digest()
            .is_ok());
        let mut m = std::collections::BTreeMap::new();
        m.insert("x".to_owned(), Value::from(f64::NAN));
        assert_eq!(
            Params::json(&Value::Object(m)).canonical_digest(),
            Err(NonCanonical::NonFiniteNumber)
        );
        assert_eq!(
            classify("{\"x\":[1e999]}").canonical_digest(),
            Err(NonCanonical::NonFiniteNumber)
        );
    }

    #[test]
    fn json_with_canonical_agrees_with_json() {
        for text in [
            r#"{"to":"x","amount":100.50,"ctx":"opaque"}"#,
            r#"{"a":[1,{"b":null}],"é":"\u00e9"}"#,
            "[1]",
            r#"{"a":{"__noncanonical__":true}}"#,
            "{\"x\":[1e999]}",
        ] {
            let v = json::parse_str(text).unwrap();
            let (p, bytes) = Params::json_with_canonical(&v);
            assert_eq!(p, Params::json(&v), "{text}");
            match p.canonical_digest() {
                Ok(d) => {
                    let b = bytes.expect(text);
                    assert_eq!(b, json::to_canonical_vec(&v).unwrap(), "{text}");
                    assert_eq!(Digest::of(&b), d, "{text}");
                }
                Err(_) => assert_eq!(bytes, None, "{text}"),
            }
        }
        let (p, bytes) = Params::json_with_canonical(&nested(65));
        assert_eq!(p.canonical_digest(), Err(NonCanonical::TooDeep));
        assert_eq!(bytes, None);
    }

    #[test]
    fn depth_limit_is_64_below_the_params_object() {
        // 64 nested objects inside params: the innermost sits at level 64 and is empty.
        assert!(Params::json(&nested(64)).canonical_digest().is_ok());
        // 65: a value at level 65.
        assert_eq!(
            Params::json(&nested(65)).canonical_digest(),
            Err(NonCanonical::TooDeep)
        );
        // A scalar at level 65 also counts.
        let mut v = Value::from(1);
        for _ in 0..65 {
            v = Value::Array(vec![v]);
        }
        let mut m = std::collections::BTreeMap::new();
        m.insert("deep".to_owned(), v);
        assert_eq!(
            Params::json(&Value::Object(m)).canonical_digest(),
            Err(NonCanonical::TooDeep)
        );
    }

    #[test]
    fn opaque_context_is_a_product_of_key_and_value_classes() {
        for text in [
            r#"{"ctx":"opaque"}"#,
            r#"{"context":"opaque"}"#,
            r#"{"ctx":"unknown"}"#,
            r#"{"raw_context":"unevaluable"}"#,
            r#"{"blob":"untestable"}"#,
            r#"{" Context ":" OPAQUE "}"#,
            r#"{"outer":{"inner":[{"context":"opaque"}]}}"#,
            r#"{"ctx":[{"context":"opaque"}]}"#,
            r#"{"ctx":{"blob":"untestable"}}"#,
        ] {
            assert!(classify(text).has_opaque_context(), "{text}");
        }
        for text in [
            r#"{"context":"user asked about pricing"}"#,
            r#"{"note":"opaque"}"#,
            r#"{"ctx":{"kind":"web"}}"#,
            r#"{"ctx":null}"#,
            r#"{"tool":"click"}"#,
            // A marker string inside a list binds nothing; the list is walked, not matched.
            r#"{"opaque":["x","unknown"]}"#,
            r#"{"ctx":[42,"unknown"]}"#,
            r#"{"ctx":{"note":"opaque"}}"#,
        ] {
            assert!(!classify(text).has_opaque_context(), "{text}");
        }
    }

    #[test]
    fn digest_matches_published_canonical_hash() {
        let p = classify(r#"{"tool": "click", "target": "search_box"}"#);
        assert_eq!(
            p.canonical_digest().unwrap().to_string(),
            "f487a46f520575a76a1537f2235bd32acdefa067fc54a69d7e85962650ac7efc"
        );
    }
}
