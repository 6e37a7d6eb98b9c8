//! The JSON the gateway reads itself (everything else is rmcp's): a call's arguments,
//! turned into the params Tollgate classifies and hashes, and the actual cost an upstream
//! may report in a result's `_meta`.

use rmcp::model::{CallToolResult, JsonObject};
use tollgate_core::json::{self, Limits, Value};

/// The `_meta` key of a tool result in which an upstream reports the call's actual cost:
/// a JSON number of US dollars, finite and at least 0.
pub const REPORTED_COST_KEY: &str = "tollgate/actual_cost_usd";

/// The params of a `tools/call`: its `arguments` object (`{}` when absent), re-read by
/// Tollgate's strict, bounded parser so that the hash is the canonical JSON's (Python's
/// `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`) of exactly
/// what is forwarded. Arguments it cannot read (over `max_bytes`, nested deeper than its
/// limit) become `null`, which Tollgate's rule 1 denies as `policy_violation:malformed_input`:
/// the call is decided, audited, and not run.
pub fn params(arguments: Option<&JsonObject>, max_bytes: usize) -> Value {
    let Some(args) = arguments else {
        return Value::Object(Default::default());
    };
    let Ok(bytes) = serde_json::to_vec(args) else {
        return Value::Null;
    };
    let limits = Limits {
        max_bytes,
        ..Limits::default()
    };
    json::parse(&bytes, limits).unwrap_or(Value::Null)
}

/// The arguments to forward for `params` (what Tollgate allowed, which after a daemon
/// operator's modify is not what the host sent).
pub fn arguments(params: &Value) -> Option<JsonObject> {
    let bytes = json::to_canonical_vec(params).ok()?;
    match serde_json::from_slice::<serde_json::Value>(&bytes).ok()? {
        serde_json::Value::Object(m) => Some(m),
        _ => None,
    }
}

/// What a result says about the call's actual cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reported {
    /// Nothing: settle with the configured actual cost, or the estimate.
    Absent,
    /// A finite, non-negative number of dollars.
    Cost(f64),
    /// Something that is not a usable cost (a string, a negative number, ...): settled as
    /// unreadable, which charges the estimate and never refunds.
    Unreadable,
}

/// Read [`REPORTED_COST_KEY`] from a result's `_meta`.
pub fn reported_cost(result: &CallToolResult) -> Reported {
    let Some(meta) = result.meta.as_ref() else {
        return Reported::Absent;
    };
    match meta.get(REPORTED_COST_KEY) {
        None => Reported::Absent,
        Some(v) => match v.as_f64() {
            Some(c) if c.is_finite() && c >= 0.0 => Reported::Cost(c),
            _ => Reported::Unreadable,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn result_with_meta(meta: serde_json::Value) -> CallToolResult {
        serde_json::from_value(serde_json::json!({"content": [], "_meta": meta})).unwrap()
    }

    #[test]
    fn absent_arguments_are_an_empty_object() {
        assert_eq!(params(None, 1 << 20), Value::Object(Default::default()));
    }

    #[test]
    fn the_hash_is_pythons_canonical_json() {
        let args: JsonObject =
            serde_json::from_str(r#"{"b":[1,2.0,"é"],"a":{"y":null,"x":true}}"#).unwrap();
        let v = params(Some(&args), 1 << 20);
        assert_eq!(
            String::from_utf8(json::to_canonical_vec(&v).unwrap()).unwrap(),
            r#"{"a":{"x":true,"y":null},"b":[1,2.0,"é"]}"#
        );
        assert_eq!(arguments(&v), Some(args));
    }

    #[test]
    fn oversized_arguments_are_malformed() {
        let args: JsonObject = serde_json::from_str(r#"{"s":"0123456789"}"#).unwrap();
        assert_eq!(params(Some(&args), 8), Value::Null);
        assert!(tollgate_core::Params::json(&Value::Null)
            .canonical_digest()
            .is_err());
    }

    #[test]
    fn reported_costs() {
        let cost = |m| reported_cost(&result_with_meta(m));
        assert_eq!(
            cost(serde_json::json!({REPORTED_COST_KEY: 0.25})),
            Reported::Cost(0.25)
        );
        assert_eq!(
            cost(serde_json::json!({REPORTED_COST_KEY: 2})),
            Reported::Cost(2.0)
        );
        assert_eq!(cost(serde_json::json!({"other": 1})), Reported::Absent);
        assert_eq!(
            cost(serde_json::json!({REPORTED_COST_KEY: -1})),
            Reported::Unreadable
        );
        assert_eq!(
            cost(serde_json::json!({REPORTED_COST_KEY: "0.1"})),
            Reported::Unreadable
        );
        assert_eq!(
            cost(serde_json::json!({REPORTED_COST_KEY: null})),
            Reported::Unreadable
        );
    }

    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            (-1e12f64..1e12).prop_map(serde_json::Value::from),
            ".{0,12}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(6, 64, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                proptest::collection::btree_map(".{0,8}", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Any arguments: Tollgate's params equal its own parse of the same JSON text, and
        /// forwarding them gives back the same arguments.
        #[test]
        fn params_are_the_arguments(v in proptest::collection::btree_map(".{0,8}", arb_json(), 0..6)) {
            let args: JsonObject = v.into_iter().collect();
            let text = serde_json::to_string(&args).unwrap();
            let p = params(Some(&args), 1 << 20);
            prop_assert_eq!(&p, &json::parse_str(&text).unwrap());
            prop_assert_eq!(arguments(&p), Some(args));
        }

        /// Any `_meta`: a cost or a verdict that it is none; never a panic, never a
        /// negative or non-finite cost.
        #[test]
        fn any_meta_reads_safely(m in arb_json()) {
            let meta = serde_json::json!({REPORTED_COST_KEY: m});
            if let Reported::Cost(c) = reported_cost(&result_with_meta(meta)) {
                prop_assert!(c.is_finite() && c >= 0.0);
            }
        }
    }
}
