//! The optional schema: what a policy set's author declares, and what Tollgate adds.
//!
//! The author's schema (Cedar's schema syntax, or its JSON form when the file name ends in
//! `.json`) declares one action per tool, each with the shape of its arguments:
//!
//! ```text
//! action "pay" appliesTo {
//!   principal: Agent, resource: Upstream,
//!   context: { args: { amount: decimal, currency: String } }
//! };
//! ```
//!
//! Tollgate adds the rest of its request model to it ([`crate::model`]): the entity types
//! `Agent` (in `Organization`, with attributes `organization` and `agent`),
//! `Organization` and `Upstream`, and to every action's context the attributes `tool`,
//! `cost_usd`, `now` and `session`. An author who declares any of these names gets an
//! error, not a silent override. Everything is in Cedar's empty namespace.
//!
//! The schema does two things: Cedar's validator checks every policy against it when the
//! set is loaded, and it types the numbers in each tool's `args` ([`crate::number`]).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value as Json};

use crate::args::Shape;
use crate::number::NumberType;

/// The context attributes Tollgate supplies, which an author's schema may not declare.
pub const RESERVED_CONTEXT: &[&str] = &["tool", "cost_usd", "now", "session"];

/// The entity types Tollgate declares.
pub const RESERVED_TYPES: &[&str] = &["Agent", "Organization", "Upstream"];

/// How deep common-type references are followed when typing arguments.
const MAX_TYPE_DEPTH: usize = 32;

/// A schema problem, before locations are attached by the loader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SchemaProblem {
    pub code: &'static str,
    pub message: String,
}

fn problem(code: &'static str, message: String) -> SchemaProblem {
    SchemaProblem { code, message }
}

/// The author's schema fragment in JSON form, with Tollgate's declarations added.
pub(crate) fn augment(mut fragment: Json) -> Result<Json, SchemaProblem> {
    let root = fragment.as_object_mut().ok_or_else(|| {
        problem(
            "tollgate::schema-shape",
            "the schema is not an object".into(),
        )
    })?;
    if let Some(other) = root.keys().find(|k| !k.is_empty()) {
        return Err(problem(
            "tollgate::schema-namespace",
            format!(
                "namespace `{other}` is not supported: Tollgate's requests use Cedar's empty namespace (declare actions at the top level)"
            ),
        ));
    }
    let ns = root
        .entry(String::new())
        .or_insert_with(|| json!({"entityTypes": {}, "actions": {}}));
    let ns = ns.as_object_mut().ok_or_else(|| {
        problem(
            "tollgate::schema-shape",
            "the namespace is not an object".into(),
        )
    })?;
    let types = object_entry(ns, "entityTypes")?;
    for name in RESERVED_TYPES {
        if types.contains_key(*name) {
            return Err(problem(
                "tollgate::schema-reserved",
                format!("entity type `{name}` is declared by Tollgate; remove it from the schema"),
            ));
        }
    }
    types.insert(
        "Agent".into(),
        json!({
            "memberOfTypes": ["Organization"],
            "shape": {"type": "Record", "attributes": {
                "organization": {"type": "String"},
                "agent": {"type": "String"}
            }}
        }),
    );
    types.insert("Organization".into(), json!({}));
    types.insert("Upstream".into(), json!({}));
    let actions = object_entry(ns, "actions")?;
    for (name, action) in actions.iter_mut() {
        let action = action.as_object_mut().ok_or_else(|| {
            problem(
                "tollgate::schema-shape",
                format!("action `{name}` is not an object"),
            )
        })?;
        let Some(applies) = action.get_mut("appliesTo") else {
            // An action without appliesTo is a group: it applies to no request itself.
            continue;
        };
        let applies = applies.as_object_mut().ok_or_else(|| {
            problem(
                "tollgate::schema-shape",
                format!("action `{name}`: appliesTo is not an object"),
            )
        })?;
        let empty = |k: &str| {
            applies
                .get(k)
                .and_then(Json::as_array)
                .is_none_or(Vec::is_empty)
        };
        if empty("principalTypes") && empty("resourceTypes") {
            // Cedar's schema syntax writes a group as an action with empty lists.
            continue;
        }
        let context = applies
            .entry("context")
            .or_insert_with(|| json!({"type": "Record", "attributes": {}}));
        let context = context.as_object_mut().ok_or_else(|| {
            problem(
                "tollgate::schema-shape",
                format!("action `{name}`: context is not an object"),
            )
        })?;
        if context.get("type").and_then(Json::as_str) != Some("Record") {
            return Err(problem(
                "tollgate::schema-context",
                format!("action `{name}`: its context must be a record written in place (`context: {{ args: {{ ... }} }}`), not a named type"),
            ));
        }
        let attrs = object_entry(context, "attributes")?;
        for key in RESERVED_CONTEXT {
            if attrs.contains_key(*key) {
                return Err(problem(
                    "tollgate::schema-reserved",
                    format!("action `{name}`: context attribute `{key}` is supplied by Tollgate; remove it from the schema"),
                ));
            }
        }
        if let Some(extra) = attrs.keys().find(|k| k.as_str() != "args") {
            return Err(problem(
                "tollgate::schema-context",
                format!("action `{name}`: context attribute `{extra}` is not one Tollgate supplies (declare arguments under `args`)"),
            ));
        }
        let decimal = json!({"type": "Extension", "name": "decimal"});
        attrs.insert("tool".into(), json!({"type": "String"}));
        attrs.insert("cost_usd".into(), decimal.clone());
        attrs.insert(
            "now".into(),
            json!({"type": "Extension", "name": "datetime"}),
        );
        attrs.insert(
            "session".into(),
            json!({"type": "Record", "attributes": {
                "calls": {"type": "Long"},
                "budget_initial_usd": decimal.clone(),
                "budget_remaining_usd": decimal.clone(),
                "budget_fraction": decimal,
                "labels": {"type": "Set", "element": {"type": "String"}}
            }}),
        );
    }
    Ok(fragment)
}

fn object_entry<'a>(
    parent: &'a mut Map<String, Json>,
    key: &str,
) -> Result<&'a mut Map<String, Json>, SchemaProblem> {
    parent
        .entry(key)
        .or_insert_with(|| Json::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| {
            problem(
                "tollgate::schema-shape",
                format!("`{key}` is not an object"),
            )
        })
}

/// Per action (tool) name, the declared shape of its `args`, from the augmented fragment.
pub(crate) fn arg_shapes(fragment: &Json) -> BTreeMap<String, Shape> {
    let mut out = BTreeMap::new();
    let Some(ns) = fragment.get("") else {
        return out;
    };
    let common = ns.get("commonTypes").and_then(Json::as_object);
    let Some(actions) = ns.get("actions").and_then(Json::as_object) else {
        return out;
    };
    for (name, action) in actions {
        let args = action
            .pointer("/appliesTo/context/attributes/args")
            .map(|t| shape(t, common, 0))
            .unwrap_or_default();
        out.insert(name.clone(), args);
    }
    out
}

fn shape(t: &Json, common: Option<&Map<String, Json>>, depth: usize) -> Shape {
    if depth > MAX_TYPE_DEPTH {
        return Shape::Unknown;
    }
    let kind = t.get("type").and_then(Json::as_str).unwrap_or("");
    let named = |n: &str| -> Shape {
        let n = n.strip_prefix("__cedar::").unwrap_or(n);
        match n {
            "Long" => Shape::Number(NumberType::Long),
            "decimal" => Shape::Number(NumberType::Decimal),
            "String" | "Bool" | "Boolean" => Shape::NotNumber,
            other => match common.and_then(|c| c.get(other)) {
                Some(def) => shape(def, common, depth + 1),
                // An entity type, or an extension type other than decimal.
                None => Shape::NotNumber,
            },
        }
    };
    match kind {
        "Record" => {
            let attrs = t
                .get("attributes")
                .and_then(Json::as_object)
                .map(|a| {
                    a.iter()
                        .map(|(k, v)| (k.clone(), shape(v, common, depth + 1)))
                        .collect()
                })
                .unwrap_or_default();
            Shape::Record(attrs)
        }
        "Set" => Shape::Set(Box::new(
            t.get("element")
                .map(|e| shape(e, common, depth + 1))
                .unwrap_or_default(),
        )),
        "Extension" | "EntityOrCommon" | "Entity" => {
            if kind == "Entity" {
                return Shape::NotNumber;
            }
            named(t.get("name").and_then(Json::as_str).unwrap_or(""))
        }
        "" => Shape::Unknown,
        other => named(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment(text: &str) -> Json {
        let (f, _) = cedar_policy::SchemaFragment::from_cedarschema_str(text).unwrap();
        f.to_json_value().unwrap()
    }

    #[test]
    fn tollgate_adds_its_model_and_the_result_is_a_schema() {
        let f = augment(fragment(
            r#"type Pay = { amount: decimal, n: Long };
            action "group";
            action "pay" in ["group"] appliesTo { principal: Agent, resource: Upstream,
              context: { args: { amount: decimal, p: Pay, tags: Set<Long>, name: String } } };
            action "ping" appliesTo { principal: Agent, resource: Upstream };"#,
        ))
        .unwrap();
        cedar_policy::Schema::from_json_value(f.clone()).unwrap();
        let shapes = arg_shapes(&f);
        let Shape::Record(pay) = &shapes["pay"] else {
            panic!("{shapes:?}")
        };
        assert_eq!(pay["amount"], Shape::Number(NumberType::Decimal));
        assert_eq!(pay["name"], Shape::NotNumber);
        assert_eq!(
            pay["tags"],
            Shape::Set(Box::new(Shape::Number(NumberType::Long)))
        );
        let Shape::Record(p) = &pay["p"] else {
            panic!()
        };
        assert_eq!(p["n"], Shape::Number(NumberType::Long));
        assert_eq!(shapes["ping"], Shape::Unknown);
    }

    #[test]
    fn reserved_names_and_namespaces_are_refused() {
        let cases = [
            ("entity Agent;", "tollgate::schema-reserved"),
            ("namespace Acme { action \"x\"; }", "tollgate::schema-namespace"),
            (
                "action \"x\" appliesTo { principal: Agent, resource: Upstream, context: { cost_usd: Long } };",
                "tollgate::schema-reserved",
            ),
            (
                "action \"x\" appliesTo { principal: Agent, resource: Upstream, context: { user: String } };",
                "tollgate::schema-context",
            ),
            (
                "type C = { args: {} }; action \"x\" appliesTo { principal: Agent, resource: Upstream, context: C };",
                "tollgate::schema-context",
            ),
        ];
        for (text, code) in cases {
            assert_eq!(augment(fragment(text)).unwrap_err().code, code, "{text}");
        }
    }
}
