//! The envelope's JSON Schema (draft 2020-12) and the small validator that applies it.
//!
//! The schema file, `schema/handoff-envelope.schema.json`, is embedded at build time and is
//! the one the gate runs, so what adopters ship is what we check. The validator implements
//! exactly the keywords the file uses (`type`, `enum`, `const`, `pattern`, `minLength`,
//! `maxLength`, `minimum`, `maximum`, `properties`, `required`, `additionalProperties: false`,
//! `items`, `minItems`, `maxItems`, `uniqueItems`, `oneOf`, local `$ref` into `$defs`) and
//! refuses to compile a schema with any other keyword, so the file cannot silently say more
//! than the gate enforces.
//!
//! Patterns follow ECMA-262 as JSON Schema requires: they are unanchored searches, `^` and
//! `$` match only at the ends of the string (so `"abc\n"` fails `^[a-z]{3}$`), and `\d` is
//! ASCII `[0-9]` (the `regex` crate's `\d` would be Unicode, so it is rewritten).
//! String lengths count Unicode code points.

use std::collections::{BTreeMap, HashMap, HashSet};

use regex::Regex;
use tollgate_core::json::{self, Number, Value};

/// The schema text shipped with the crate.
pub const ENVELOPE_SCHEMA: &str = include_str!("../schema/handoff-envelope.schema.json");

/// At most this many shape errors are reported for one message; the rest are counted.
const MAX_ERRORS_PER_MESSAGE: usize = 20;

/// Why a schema document could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The schema text is not strict JSON.
    #[error("schema is not valid JSON: {0}")]
    Json(String),
    /// A keyword this validator does not implement, or a malformed keyword value.
    #[error("schema keyword `{keyword}` at `{at}` is not supported or malformed")]
    Keyword {
        /// The keyword.
        keyword: String,
        /// Where in the schema.
        at: String,
    },
    /// A `$ref` that does not name a `$defs` entry.
    #[error("schema reference `{0}` does not resolve")]
    Ref(String),
    /// A `pattern` that does not compile.
    #[error("schema pattern `{0}` does not compile")]
    Pattern(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Null,
    Boolean,
    Integer,
    Number,
    String,
    Array,
    Object,
}

#[derive(Debug, Default)]
struct Node {
    types: Option<Vec<Ty>>,
    enumeration: Option<Vec<Value>>,
    constant: Option<Value>,
    pattern: Option<(String, Regex)>,
    min_length: Option<usize>,
    max_length: Option<usize>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    // INVARIANT (sorted-names): `properties` and `required` are sorted by name, deduplicated;
    // `compile` sorts them and `check` merges them with an object's sorted keys.
    properties: Vec<(String, usize)>,
    required: Vec<String>,
    closed: bool,
    items: Option<usize>,
    min_items: Option<usize>,
    max_items: Option<usize>,
    unique_items: bool,
    one_of: Vec<usize>,
    reference: Option<usize>,
}

/// A compiled schema.
#[derive(Debug)]
pub struct Schema {
    // INVARIANT (node-indices): every index stored in a node is < nodes.len(); `compile`
    // only stores indices it has just allocated or resolved.
    nodes: Vec<Node>,
    root: usize,
}

fn bad(keyword: &str, at: &str) -> SchemaError {
    SchemaError::Keyword {
        keyword: keyword.to_owned(),
        at: at.to_owned(),
    }
}

fn ecma_to_regex(pattern: &str) -> String {
    // `\d` is ASCII-only in ECMA-262 without the `u` flag's Unicode sets; everything else
    // our schema uses means the same in both dialects.
    pattern.replace("\\d", "[0-9]")
}

impl Schema {
    /// The embedded envelope schema, compiled.
    pub fn envelope() -> Result<Schema, SchemaError> {
        Schema::compile(ENVELOPE_SCHEMA)
    }

    /// Compile a schema document.
    pub fn compile(text: &str) -> Result<Schema, SchemaError> {
        let doc = json::parse_str(text).map_err(|e| SchemaError::Json(e.to_string()))?;
        let top = doc.as_object().ok_or_else(|| bad("(root)", "#"))?;
        let mut c = Compiler {
            nodes: Vec::new(),
            defs: HashMap::new(),
        };
        let empty = BTreeMap::new();
        let defs = match top.get("$defs") {
            Some(d) => d.as_object().ok_or_else(|| bad("$defs", "#"))?,
            None => &empty,
        };
        // Allocate one slot per definition first so references can be resolved in any order.
        for name in defs.keys() {
            let idx = c.alloc();
            c.defs.insert(format!("#/$defs/{name}"), idx);
        }
        for (name, def) in defs {
            let idx = c
                .defs
                .get(&format!("#/$defs/{name}"))
                .copied()
                .ok_or_else(|| SchemaError::Ref(name.clone()))?;
            let node = c.node(def, &format!("#/$defs/{name}"), false)?;
            if let Some(slot) = c.nodes.get_mut(idx) {
                *slot = node;
            }
        }
        let root_node = c.node(&doc, "#", true)?;
        let root = c.alloc();
        if let Some(slot) = c.nodes.get_mut(root) {
            *slot = root_node;
        }
        Ok(Schema {
            nodes: c.nodes,
            root,
        })
    }

    /// Validate `value` against the schema; every error names the field by JSON pointer,
    /// prefixed with `path`.
    pub fn validate(&self, value: &Value, path: &str) -> Vec<String> {
        let mut errors = Vec::new();
        let mut p = path.to_owned();
        self.check(self.root, value, &mut p, &mut errors);
        if errors.len() > MAX_ERRORS_PER_MESSAGE {
            let more = errors.len() - MAX_ERRORS_PER_MESSAGE;
            errors.truncate(MAX_ERRORS_PER_MESSAGE);
            errors.push(format!("and {more} more shape errors"));
        }
        errors
    }

    fn check(&self, idx: usize, v: &Value, path: &mut String, errs: &mut Vec<String>) {
        let Some(n) = self.nodes.get(idx) else {
            errs.push(format!("`{path}`: internal schema error"));
            return;
        };
        if let Some(r) = n.reference {
            self.check(r, v, path, errs);
        }
        if let Some(types) = &n.types {
            if !types.iter().any(|t| type_matches(*t, v)) {
                errs.push(format!(
                    "`{}`: expected {}, found {}",
                    show(path),
                    types
                        .iter()
                        .map(|t| ty_name(*t))
                        .collect::<Vec<_>>()
                        .join(" or "),
                    v.type_name()
                ));
                return;
            }
        }
        if let Some(c) = &n.constant {
            if c != v {
                errs.push(format!("`{}`: must be {}", show(path), render(c)));
            }
        }
        if let Some(e) = &n.enumeration {
            if !e.contains(v) {
                let allowed: Vec<String> = e.iter().map(render).collect();
                errs.push(format!(
                    "`{}`: {} is not one of {}",
                    show(path),
                    render_short(v),
                    allowed.join(", ")
                ));
            }
        }
        if let Value::String(s) = v {
            let len = s.chars().count();
            if let Some(min) = n.min_length {
                if len < min {
                    errs.push(format!(
                        "`{}`: string of {len} characters, shorter than {min}",
                        show(path)
                    ));
                }
            }
            if let Some(max) = n.max_length {
                if len > max {
                    errs.push(format!(
                        "`{}`: string of {len} characters, longer than {max}",
                        show(path)
                    ));
                }
            }
            if let Some((text, re)) = &n.pattern {
                if !re.is_match(s) {
                    errs.push(format!(
                        "`{}`: {} does not match the pattern `{text}`",
                        show(path),
                        render_short(v)
                    ));
                }
            }
        }
        if let Value::Number(num) = v {
            if let Some(min) = n.minimum {
                if cmp_num(num, min) == std::cmp::Ordering::Less {
                    errs.push(format!("`{}`: below the minimum {min}", show(path)));
                }
            }
            if let Some(max) = n.maximum {
                if cmp_num(num, max) == std::cmp::Ordering::Greater {
                    errs.push(format!("`{}`: above the maximum {max}", show(path)));
                }
            }
        }
        if let Value::Array(items) = v {
            if let Some(min) = n.min_items {
                if items.len() < min {
                    errs.push(format!(
                        "`{}`: {} items, fewer than {min}",
                        show(path),
                        items.len()
                    ));
                }
            }
            if let Some(max) = n.max_items {
                if items.len() > max {
                    errs.push(format!(
                        "`{}`: {} items, more than {max}",
                        show(path),
                        items.len()
                    ));
                }
            }
            if n.unique_items && !all_unique(items) {
                errs.push(format!("`{}`: items are not unique", show(path)));
            }
            if let Some(item) = n.items {
                for (i, it) in items.iter().enumerate() {
                    if errs.len() > MAX_ERRORS_PER_MESSAGE {
                        return;
                    }
                    let keep = path.len();
                    path.push('/');
                    path.push_str(&i.to_string());
                    self.check(item, it, path, errs);
                    path.truncate(keep);
                }
            }
        }
        if let Value::Object(map) = v {
            // Keys, properties and required names are all sorted by code point (the map is a
            // BTreeMap; `compile` sorts the other two), so one merge pass checks them all.
            let mut required = n.required.iter().peekable();
            let mut props = n.properties.iter().peekable();
            for (key, val) in map {
                while let Some(req) = required.next_if(|r| r.as_str() < key.as_str()) {
                    errs.push(format!("`{}`: missing required field `{req}`", show(path)));
                }
                let _ = required.next_if(|r| r.as_str() == key.as_str());
                while props.next_if(|(k, _)| k.as_str() < key.as_str()).is_some() {}
                let keep = path.len();
                path.push('/');
                push_pointer_token(path, key);
                match props.next_if(|(k, _)| k.as_str() == key.as_str()) {
                    Some((_, sub)) => self.check(*sub, val, path, errs),
                    None if n.closed => {
                        errs.push(format!("`{}`: unknown field", show(path)));
                    }
                    None => {}
                }
                path.truncate(keep);
            }
            for req in required {
                errs.push(format!("`{}`: missing required field `{req}`", show(path)));
            }
        }
        if !n.one_of.is_empty() {
            let mut best: Option<Vec<String>> = None;
            let mut matched = 0usize;
            for sub in &n.one_of {
                let mut e = Vec::new();
                let mut p = path.clone();
                self.check(*sub, v, &mut p, &mut e);
                if e.is_empty() {
                    matched += 1;
                } else if best.as_ref().is_none_or(|b| e.len() < b.len()) {
                    best = Some(e);
                }
            }
            if matched == 0 {
                if let Some(b) = best {
                    errs.extend(b);
                }
            } else if matched > 1 {
                errs.push(format!(
                    "`{}`: matches more than one alternative",
                    show(path)
                ));
            }
        }
    }
}

struct Compiler {
    nodes: Vec<Node>,
    defs: HashMap<String, usize>,
}

impl Compiler {
    fn alloc(&mut self) -> usize {
        // INVARIANT (node-indices): the index handed out is the slot just pushed.
        self.nodes.push(Node::default());
        self.nodes.len() - 1
    }

    fn sub(&mut self, v: &Value, at: &str) -> Result<usize, SchemaError> {
        let node = self.node(v, at, false)?;
        let idx = self.alloc();
        if let Some(slot) = self.nodes.get_mut(idx) {
            *slot = node;
        }
        Ok(idx)
    }

    fn node(&mut self, v: &Value, at: &str, is_root: bool) -> Result<Node, SchemaError> {
        let map = v.as_object().ok_or_else(|| bad("(schema)", at))?;
        let mut n = Node::default();
        let usize_of = |k: &str, v: &Value| -> Result<usize, SchemaError> {
            v.as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .ok_or_else(|| bad(k, at))
        };
        for (k, val) in map {
            match k.as_str() {
                "$schema" | "$id" | "$defs" if is_root => {}
                "title" | "description" | "$comment" => {}
                "type" => {
                    let names: Vec<&str> = match val {
                        Value::String(s) => vec![s.as_str()],
                        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                        _ => return Err(bad(k, at)),
                    };
                    let mut tys = Vec::new();
                    for name in names {
                        tys.push(match name {
                            "null" => Ty::Null,
                            "boolean" => Ty::Boolean,
                            "integer" => Ty::Integer,
                            "number" => Ty::Number,
                            "string" => Ty::String,
                            "array" => Ty::Array,
                            "object" => Ty::Object,
                            _ => return Err(bad(k, at)),
                        });
                    }
                    n.types = Some(tys);
                }
                "enum" => n.enumeration = Some(val.as_array().ok_or_else(|| bad(k, at))?.to_vec()),
                "const" => n.constant = Some(val.clone()),
                "pattern" => {
                    let text = val.as_str().ok_or_else(|| bad(k, at))?;
                    let re = Regex::new(&ecma_to_regex(text))
                        .map_err(|_| SchemaError::Pattern(text.to_owned()))?;
                    n.pattern = Some((text.to_owned(), re));
                }
                "minLength" => n.min_length = Some(usize_of(k, val)?),
                "maxLength" => n.max_length = Some(usize_of(k, val)?),
                "minItems" => n.min_items = Some(usize_of(k, val)?),
                "maxItems" => n.max_items = Some(usize_of(k, val)?),
                "minimum" => n.minimum = Some(val.as_f64().ok_or_else(|| bad(k, at))?),
                "maximum" => n.maximum = Some(val.as_f64().ok_or_else(|| bad(k, at))?),
                "uniqueItems" => n.unique_items = val.as_bool().ok_or_else(|| bad(k, at))?,
                "additionalProperties" => {
                    // Only `false` is supported: the envelope is closed at every level.
                    if val.as_bool() != Some(false) {
                        return Err(bad(k, at));
                    }
                    n.closed = true;
                }
                "required" => {
                    let a = val.as_array().ok_or_else(|| bad(k, at))?;
                    for r in a {
                        n.required
                            .push(r.as_str().ok_or_else(|| bad(k, at))?.to_owned());
                    }
                }
                "properties" => {
                    let props = val.as_object().ok_or_else(|| bad(k, at))?;
                    for (name, sub) in props {
                        let idx = self.sub(sub, &format!("{at}/properties/{name}"))?;
                        n.properties.push((name.clone(), idx));
                    }
                }
                "items" => n.items = Some(self.sub(val, &format!("{at}/items"))?),
                "oneOf" => {
                    let a = val.as_array().ok_or_else(|| bad(k, at))?;
                    for (i, sub) in a.iter().enumerate() {
                        let idx = self.sub(sub, &format!("{at}/oneOf/{i}"))?;
                        n.one_of.push(idx);
                    }
                }
                "$ref" => {
                    let r = val.as_str().ok_or_else(|| bad(k, at))?;
                    let idx = self
                        .defs
                        .get(r)
                        .copied()
                        .ok_or_else(|| SchemaError::Ref(r.to_owned()))?;
                    n.reference = Some(idx);
                }
                _ => return Err(bad(k, at)),
            }
        }
        // INVARIANT (sorted-names): sorted here, merged with sorted object keys in `check`.
        n.properties.sort_by(|a, b| a.0.cmp(&b.0));
        n.required.sort();
        n.required.dedup();
        Ok(n)
    }
}

fn type_matches(t: Ty, v: &Value) -> bool {
    match (t, v) {
        (Ty::Null, Value::Null)
        | (Ty::Boolean, Value::Bool(_))
        | (Ty::Number, Value::Number(_))
        | (Ty::String, Value::String(_))
        | (Ty::Array, Value::Array(_))
        | (Ty::Object, Value::Object(_)) => true,
        (Ty::Integer, Value::Number(n)) => match n {
            Number::Int(_) | Number::BigInt(_) => true,
            // JSON Schema: a number with a zero fractional part is an integer.
            Number::Float(f) => f.is_finite() && f.fract() == 0.0,
        },
        _ => false,
    }
}

fn ty_name(t: Ty) -> &'static str {
    match t {
        Ty::Null => "null",
        Ty::Boolean => "boolean",
        Ty::Integer => "integer",
        Ty::Number => "number",
        Ty::String => "string",
        Ty::Array => "array",
        Ty::Object => "object",
    }
}

fn cmp_num(n: &Number, bound: f64) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match n {
        #[allow(clippy::cast_precision_loss)]
        Number::Int(i) => {
            // Bounds in our schema are integers well inside f64's exact range.
            let b = bound as i128;
            if (b as f64) == bound {
                i.cmp(&b)
            } else {
                (*i as f64).partial_cmp(&bound).unwrap_or(Ordering::Greater)
            }
        }
        Number::BigInt(s) => {
            if s.starts_with('-') {
                Ordering::Less
            } else {
                Ordering::Greater
            }
        }
        // NaN cannot come out of the parser; an overflowed float compares as its infinity.
        Number::Float(f) => f.partial_cmp(&bound).unwrap_or(Ordering::Greater),
    }
}

fn all_unique(items: &[Value]) -> bool {
    let mut seen = HashSet::with_capacity(items.len());
    for it in items {
        match json::to_canonical_vec(it) {
            Ok(bytes) => {
                if !seen.insert(bytes) {
                    return false;
                }
            }
            // Not canonicalizable (an overflowed float): fall back to pairwise equality.
            Err(_) => {
                if items.iter().filter(|o| *o == it).count() > 1 {
                    return false;
                }
            }
        }
    }
    true
}

fn push_pointer_token(path: &mut String, key: &str) {
    if key.contains(['~', '/']) {
        path.push_str(&key.replace('~', "~0").replace('/', "~1"));
    } else {
        path.push_str(key);
    }
}

fn show(path: &str) -> &str {
    if path.is_empty() {
        "/"
    } else {
        path
    }
}

fn render(v: &Value) -> String {
    json::to_canonical_vec(v)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_else(|| v.type_name().to_owned())
}

fn render_short(v: &Value) -> String {
    let s = render(v);
    if s.chars().count() > 80 {
        let cut: String = s.chars().take(77).collect();
        format!("{cut}...")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errs(schema: &str, doc: &str) -> Vec<String> {
        let s = Schema::compile(schema).unwrap();
        s.validate(&json::parse_str(doc).unwrap(), "")
    }

    #[test]
    fn embedded_schema_compiles() {
        Schema::envelope().unwrap();
    }

    #[test]
    fn ecma_dollar_rejects_trailing_newline() {
        let s = r#"{"type":"string","pattern":"^[a-z0-9-]{3,64}$"}"#;
        assert!(errs(s, r#""abc""#).is_empty());
        assert_eq!(errs(s, r#""abc\n""#).len(), 1);
    }

    #[test]
    fn ecma_digit_is_ascii() {
        let s = r#"{"type":"string","pattern":"^\\d+$"}"#;
        assert!(errs(s, r#""123""#).is_empty());
        // ARABIC-INDIC DIGIT ONE is a Unicode digit but not an ECMA-262 \d.
        assert_eq!(errs(s, "\"\u{0661}\"").len(), 1);
    }

    #[test]
    fn unknown_keyword_refuses_to_compile() {
        assert!(Schema::compile(r#"{"format":"date-time"}"#).is_err());
        assert!(Schema::compile(r##"{"$ref":"#/$defs/nope"}"##).is_err());
    }

    #[test]
    fn integer_accepts_integral_float_and_bounds() {
        let s = r#"{"type":"integer","minimum":0,"maximum":32}"#;
        assert!(errs(s, "1.0").is_empty());
        assert!(!errs(s, "1.5").is_empty());
        assert!(!errs(s, "33").is_empty());
        assert!(!errs(s, "-1").is_empty());
        assert!(!errs(s, "100000000000000000000000000000000000000000").is_empty());
    }

    #[test]
    fn closed_object_names_the_field() {
        let s = r#"{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}"#;
        let e = errs(s, r#"{"a":"x","token":"secret"}"#);
        assert_eq!(e.len(), 1);
        assert!(e[0].contains("/token"), "{e:?}");
        let e = errs(s, r#"{}"#);
        assert!(e[0].contains("`a`"), "{e:?}");
    }

    #[test]
    fn required_and_unknown_fields_are_all_reported() {
        let s = r#"{"type":"object","properties":{"c":{"type":"string"},"a":{"type":"string"},"b":{"type":"string"}},"required":["c","a"],"additionalProperties":false}"#;
        let e = errs(s, r#"{"b":"x"}"#);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains("`a`") && e[1].contains("`c`"), "{e:?}");
        let e = errs(s, r#"{"a":"x","aa":"y","c":"z","d":1}"#);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains("/aa") && e[1].contains("/d"), "{e:?}");
        assert!(errs(s, r#"{"a":"x","b":"y","c":"z"}"#).is_empty());
        assert_eq!(errs(s, r#"{"a":1,"c":"z"}"#).len(), 1);
    }

    #[test]
    fn unique_items_and_lengths_count_code_points() {
        let s = r#"{"type":"array","uniqueItems":true,"items":{"type":"string","maxLength":2}}"#;
        assert!(errs(s, r#"["éé","x"]"#).is_empty());
        assert!(!errs(s, r#"["x","x"]"#).is_empty());
        assert!(!errs(s, r#"["abc"]"#).is_empty());
    }
}
