//! Policies checked against the tools they govern: a Cedar schema derived from MCP tool
//! definitions (each tool's `inputSchema`, a JSON Schema), and the checks `tollgate policy
//! check --tools FILE` and `--mcp mcp.toml` run with it.
//!
//! # What is checked
//!
//! - **an unknown tool**: a policy's action scope names a tool no definition has (Cedar's
//!   `unrecognized action`, or `tollgate::unknown-tool`): an error;
//! - **an unknown argument**: a policy reads (`context.args.x`) or tests (`context.args has
//!   x`) an argument that no tool it can apply to declares: an error
//!   (`tollgate::unknown-argument`, or Cedar's `attribute not found`);
//! - **a type mismatch**: comparing a string argument with a number, `<` on a decimal, ...:
//!   Cedar's validator in strict mode, against the derived schema: an error;
//! - **a policy that can never match**: Cedar's `impossible policy` (every condition is
//!   false for every tool it names), or, with `--mcp`, a resource `Upstream::"X"` that is
//!   no upstream of the gateway or offers none of the tools the policy names: a warning.
//! - **a comparison that is never true**: `context.args.currency == "usd"` where the
//!   tool's `enum` for it is `["EUR", "USD"]` (and `!=` that is always true, and each
//!   such value of a set literal that `.contains` the argument): a warning
//!   (`tollgate::outside-enum`).
//!
//! Every finding has the policy's file, line and column.
//!
//! # JSON Schema → Cedar
//!
//! | JSON Schema | Cedar |
//! |---|---|
//! | `"type": "string"` (with or without `enum`, `format`, ...) | `String` |
//! | `"type": "boolean"` | `Bool` |
//! | `"type": "integer"` | `Long` |
//! | `"type": "number"` | `decimal` (and a warning, below) |
//! | `"type": "object"` with `properties` | a record: the listed properties, those in `required` required, the others optional |
//! | `"type": "array"` with `items` (one schema) | a set of the items' type |
//! | `"enum"` / `"const"` whose values are all strings (integers, booleans) | `String` (`Long`, `Bool`) |
//! | `["T", "null"]`, `anyOf`/`oneOf` whose branches are one type and `null` | that type, optional (Tollgate leaves a `null` member out of `context.args`) |
//! | a local `$ref` (`#/$defs/Payment`), an `allOf` of one schema | what it points to |
//!
//! Anything else is **unchecked**: a union of different types (`["string", "integer"]`,
//! `oneOf` of a string and an object), a recursive or non-local `$ref`, `allOf` of several
//! schemas, `not`, `if`, a tuple (`items` as a list, `prefixItems`), a schema with no
//! `type` (nor `properties` or `items`), `true`, an array without `items`, a nesting
//! deeper than [`MAX_SCHEMA_DEPTH`], anything past [`MAX_SCHEMA_NODES`] nodes of one
//! tool (`$ref`s can make a small file a large tree). An **open**
//! object is one whose undeclared properties are allowed: `additionalProperties` is `true`
//! or a schema, or it has `patternProperties`, or it lists no `properties` at all (and does
//! not say `additionalProperties: false`). An object that lists `properties` and says
//! nothing of `additionalProperties` is taken as **closed**: a tool's `properties` are its
//! argument list, and a policy that reads a name not on it is almost always a misspelling
//! (write `"additionalProperties": true` to mark a tool open).
//!
//! Cedar has no "any" type, so an unchecked shape is never given a guessed one: a policy
//! that reads an unchecked argument, an undeclared member of an open object, or a record
//! holding either, for some tool it can apply to, is **not type-checked** (a
//! `tollgate::not-type-checked` warning says which argument and why); the names it reads
//! are still checked (an argument no applicable tool declares, in a closed record, is
//! still an error). So an unknown shape never gives a false error.
//!
//! ## Numbers
//!
//! The derived types follow [`crate::number`]: `integer` is `Long`, which is what an
//! integer argument is at run time without a schema (an integral float such as `100.0` is
//! a decimal there, so a `Long` comparison refuses it, fail-closed). A JSON Schema
//! `number` may be an integer or a fraction at run time, and without a schema declaring
//! it Tollgate maps `150` to a `Long` and `150.5` to a `decimal`: no single Cedar
//! comparison works for both, the other fails closed (`policy_error`). So `number` is
//! derived as `decimal` (the one type that holds every such value, what a schema should
//! declare), and a policy that reads a `number` argument of a tool the set's schema does
//! not declare gets a `tollgate::undeclared-number` warning: declare the argument
//! `decimal` in the set's schema (`[policy].schema`), and `150` becomes `decimal("150.0")`.
//!
//! ## With an author schema
//!
//! When the set also has a schema (`--schema`, `[policy].schema`), the two are merged, the
//! author's winning: the tools the author's schema declares keep the author's types and
//! action groups (those are what the set is evaluated with at run time), and the tools it
//! does not declare get the derived ones. An action the author's schema declares (with
//! `appliesTo`) that no tool definition has is a warning (`tollgate::schema-no-tool`), and
//! each one a tool has is compared with the tool's input schema (`tollgate::schema-drift`,
//! in `derive/drift.rs`): a schema that has drifted from its tool would refuse the tool's calls.
//!
//! ## Several definitions of one name
//!
//! With several upstreams (`--mcp`) or files (`--tools A --tools B`), one action name may
//! come from several tools (the gateway's library mode decides by the upstream's own tool
//! name). Their argument types are merged: an argument in all of them keeps its type if
//! they agree (required if required in all), an argument in some is optional, and one
//! whose types disagree is unchecked. Within one file a name listed twice is an error.
//!
//! # Bounds
//!
//! A tools file holds at most [`MAX_TOOLS_BYTES`] bytes, brackets nested at most
//! [`MAX_TOOLS_DEPTH`] deep, at most [`MAX_TOOLS`] tools, each name 1 to
//! [`MAX_TOOL_NAME_BYTES`] bytes; input schemas are read [`MAX_SCHEMA_DEPTH`] deep (deeper
//! is unchecked). A file that breaks a bound, is not JSON, or has no tools array is
//! refused with a `tollgate::tools-file` error naming the file (and the line and column,
//! where there is one).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use cedar_policy::{ActionConstraint, PolicySet, ResourceConstraint};
use miette::Diagnostic;
use serde_json::{json, Map, Value as Json};

use crate::load::{line_col, Ctx, Finding, Location, Options, PolicyId, Severity, Source};

mod drift;

/// The largest tools file, in bytes (the MCP gateway's default message bound).
pub const MAX_TOOLS_BYTES: usize = 4 << 20;
/// The deepest nesting of `[` and `{` in a tools file.
pub const MAX_TOOLS_DEPTH: usize = 64;
/// The most tools in one file (or listed by the upstreams together).
pub const MAX_TOOLS: usize = 10_000;
/// The longest tool name, in bytes.
pub const MAX_TOOL_NAME_BYTES: usize = 256;
/// How deep an input schema is read (`$ref`s followed count); below this, shapes are
/// unchecked.
pub const MAX_SCHEMA_DEPTH: usize = 32;
/// The most schema nodes read for one tool (`$ref`s followed count each time); past
/// this, shapes are unchecked.
pub const MAX_SCHEMA_NODES: usize = 10_000;

/// One tool definition: its name (the policies' action), its input schema, and where it
/// came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    /// The action name policies use for it.
    pub name: String,
    /// Its `inputSchema` (a JSON Schema object).
    pub input_schema: Json,
    /// Where it came from, for messages (`tools.json`, `upstream docs`).
    pub origin: String,
    /// The resource (`Upstream::"NAME"`) its calls are decided with, when known (`--mcp`).
    pub resource: Option<String>,
}

/// The derived-schema check of a set: the loader's own result, and what checking against
/// the tools added.
#[derive(Debug)]
pub struct Report {
    /// What [`crate::load()`] made of the files (as the daemon or gateway would load them).
    pub loaded: Result<crate::Loaded, crate::LoadError>,
    /// The findings against the tools, in file order (none repeats one of `loaded`'s).
    pub findings: Vec<Finding>,
    /// How many distinct action names the tools gave.
    pub tools: usize,
}

impl Report {
    /// Every finding: the loader's, then the tools check's.
    pub fn all(&self) -> Vec<&Finding> {
        let loaded: Vec<&Finding> = match &self.loaded {
            Ok(l) => l.warnings.iter().collect(),
            Err(e) => e.findings.iter().collect(),
        };
        loaded.into_iter().chain(&self.findings).collect()
    }

    /// Whether the set loads and the tools check found no error.
    pub fn ok(&self) -> bool {
        self.loaded.is_ok() && !self.findings.iter().any(|f| f.severity == Severity::Error)
    }
}

fn file_finding(src: &str, message: String, at: Option<(usize, usize)>) -> Box<Finding> {
    Box::new(Finding {
        severity: Severity::Error,
        code: "tollgate::tools-file".into(),
        message,
        file: Some(src.to_owned()),
        location: at.map(|(line, column)| Location {
            file: src.to_owned(),
            line,
            column,
        }),
        help: Some(
            "give the `tools` array of an MCP tools/list result, or an object with one".into(),
        ),
    })
}

/// The offset where `[`/`{` nesting first passes [`MAX_TOOLS_DEPTH`], outside strings.
fn json_too_deep(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, b) in text.bytes().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_TOOLS_DEPTH {
                    return Some(i);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// Read a tools file: the `tools` array of an MCP `tools/list` result, an object with
/// such an array (`{"tools": [...]}`), or a whole JSON-RPC response
/// (`{"result": {"tools": [...]}}`). Every tool needs a `name` and an `inputSchema`
/// object. Bounded as the module says; every refusal names the file.
pub fn parse_tools(src: &Source) -> Result<Vec<ToolDef>, Box<Finding>> {
    let name = src.name.as_str();
    if src.text.len() > MAX_TOOLS_BYTES {
        return Err(file_finding(
            name,
            format!(
                "{} bytes; a tools file holds at most {MAX_TOOLS_BYTES}",
                src.text.len()
            ),
            None,
        ));
    }
    if let Some(off) = json_too_deep(&src.text) {
        return Err(file_finding(
            name,
            format!("brackets nest deeper than {MAX_TOOLS_DEPTH}"),
            Some(line_col(&src.text, off)),
        ));
    }
    let value: Json = serde_json::from_str(&src.text).map_err(|e| {
        file_finding(
            name,
            format!("not JSON: {e}"),
            (e.line() > 0).then(|| (e.line(), e.column().max(1))),
        )
    })?;
    let list = match &value {
        Json::Array(a) => Some(a),
        Json::Object(o) => o
            .get("tools")
            .or_else(|| o.get("result").and_then(|r| r.get("tools")))
            .and_then(Json::as_array),
        _ => None,
    };
    let Some(list) = list else {
        return Err(file_finding(
            name,
            "no tools array (expected `[...]`, `{\"tools\": [...]}` or a tools/list response)"
                .into(),
            None,
        ));
    };
    if list.len() > MAX_TOOLS {
        return Err(file_finding(
            name,
            format!("{} tools; at most {MAX_TOOLS}", list.len()),
            None,
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    let mut seen = HashSet::new();
    for (i, t) in list.iter().enumerate() {
        let tool_name = t
            .get("name")
            .and_then(Json::as_str)
            .ok_or_else(|| file_finding(name, format!("tool {i} has no `name` string"), None))?;
        if tool_name.is_empty() || tool_name.len() > MAX_TOOL_NAME_BYTES {
            return Err(file_finding(
                name,
                format!("tool {i}: a name is 1 to {MAX_TOOL_NAME_BYTES} bytes"),
                None,
            ));
        }
        let schema = t
            .get("inputSchema")
            .filter(|s| s.is_object())
            .ok_or_else(|| {
                file_finding(
                    name,
                    format!("tool `{tool_name}` has no `inputSchema` object"),
                    None,
                )
            })?;
        if !seen.insert(tool_name) {
            return Err(file_finding(
                name,
                format!("tool `{tool_name}` is listed twice"),
                None,
            ));
        }
        out.push(ToolDef {
            name: tool_name.to_owned(),
            input_schema: schema.clone(),
            origin: name.to_owned(),
            resource: None,
        });
    }
    Ok(out)
}

/// An argument's type as derived from its JSON Schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ty {
    Long,
    /// From a JSON Schema `number`.
    Decimal,
    String,
    Bool,
    Set(Box<Ty>),
    Record(Rec),
    /// No Cedar type: why.
    Unchecked(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Rec {
    pub attrs: BTreeMap<String, Attr>,
    /// Undeclared members are allowed.
    pub open: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attr {
    pub ty: Ty,
    pub required: bool,
}

fn unchecked(why: impl Into<String>) -> (Ty, bool) {
    (Ty::Unchecked(why.into()), false)
}

fn value_type(v: &Json) -> Option<Ty> {
    match v {
        Json::String(_) => Some(Ty::String),
        Json::Bool(_) => Some(Ty::Bool),
        Json::Number(n) if n.is_i64() || n.is_u64() => Some(Ty::Long),
        _ => None,
    }
}

/// A JSON Schema's type, and whether `null` is allowed (the member is then optional);
/// `s` is the root its local `$ref`s point into.
pub(crate) fn ty(s: &Json, depth: usize) -> (Ty, bool) {
    Deriver {
        root: s,
        budget: MAX_SCHEMA_NODES,
        refs: Vec::new(),
    }
    .ty(s, depth)
}

/// One input schema's derivation: its root (for `$ref`), how many more schema nodes may
/// be read (a `$ref` can make a small file a large tree), and the `$ref`s being expanded
/// (a `$ref` back into one of them is recursive: unchecked).
struct Deriver<'a> {
    root: &'a Json,
    budget: usize,
    refs: Vec<&'a str>,
}

impl<'a> Deriver<'a> {
    fn ty(&mut self, s: &'a Json, depth: usize) -> (Ty, bool) {
        if depth > MAX_SCHEMA_DEPTH {
            return unchecked(format!("nested deeper than {MAX_SCHEMA_DEPTH}"));
        }
        if self.budget == 0 {
            return unchecked(format!(
                "past the {MAX_SCHEMA_NODES} schema nodes read per tool"
            ));
        }
        self.budget -= 1;
        let Some(o) = s.as_object() else {
            return unchecked("a schema that allows any value");
        };
        if let Some(r) = o.get("$ref") {
            // A local reference (`#/$defs/Payment`, as pydantic writes nested models),
            // followed; any other is unchecked.
            let target = r
                .as_str()
                .and_then(|r| r.strip_prefix('#').map(|p| (r, p)))
                .and_then(|(r, p)| self.root.pointer(p).map(|t| (r, t)));
            let Some((r, target)) = target else {
                return unchecked("a `$ref` that is not a local `#/...` reference");
            };
            if self.refs.contains(&r) {
                return unchecked(format!("a recursive `$ref` (`{r}`)"));
            }
            self.refs.push(r);
            let out = self.ty(target, depth + 1);
            self.refs.pop();
            return out;
        }
        // `allOf` of one schema (pydantic's way to put a description next to a `$ref`).
        if let Some([only]) = o.get("allOf").and_then(Json::as_array).map(Vec::as_slice) {
            return self.ty(only, depth + 1);
        }
        for k in ["allOf", "not", "if", "$dynamicRef"] {
            if o.contains_key(k) {
                return unchecked(format!("`{k}`"));
            }
        }
        if let Some(branches) = o
            .get("anyOf")
            .or_else(|| o.get("oneOf"))
            .and_then(Json::as_array)
        {
            let mut nullable = false;
            let mut one: Option<Ty> = None;
            for b in branches {
                if b.get("type").and_then(Json::as_str) == Some("null") {
                    nullable = true;
                    continue;
                }
                let (t, n) = self.ty(b, depth + 1);
                nullable |= n;
                if let Ty::Unchecked(_) = t {
                    return unchecked("a union with a branch of no Cedar type");
                }
                match &one {
                    None => one = Some(t),
                    Some(prev) if *prev == t => {}
                    Some(_) => return unchecked("a union of different types"),
                }
            }
            return match one {
                Some(t) => (t, nullable),
                None => unchecked("a union with no branch of a Cedar type"),
            };
        }
        let literals = match (o.get("const"), o.get("enum").and_then(Json::as_array)) {
            (Some(c), _) => Some(std::slice::from_ref(c)),
            (None, Some(e)) => Some(e.as_slice()),
            (None, None) => None,
        };
        if let Some(values) = literals {
            let mut nullable = false;
            let mut one: Option<Ty> = None;
            for v in values {
                if v.is_null() {
                    nullable = true;
                    continue;
                }
                let Some(t) = value_type(v) else {
                    return unchecked(
                        "an enum of values other than strings, integers and booleans",
                    );
                };
                match &one {
                    None => one = Some(t),
                    Some(prev) if *prev == t => {}
                    Some(_) => return unchecked("an enum of values of different types"),
                }
            }
            return match one {
                Some(t) => (t, nullable),
                None => unchecked("an enum of no value"),
            };
        }
        let (name, nullable) = match o.get("type") {
            Some(Json::String(t)) => (Some(t.as_str()), false),
            Some(Json::Array(ts)) => {
                let non_null: Vec<&str> = ts
                    .iter()
                    .filter_map(Json::as_str)
                    .filter(|t| *t != "null")
                    .collect();
                let nullable = non_null.len() < ts.len();
                match non_null.as_slice() {
                    [one] => (Some(*one), nullable),
                    [] => return unchecked("always null"),
                    _ => return unchecked("a union of different types"),
                }
            }
            Some(_) => return unchecked("a `type` that is not a string or a list"),
            None if o.contains_key("properties") => (Some("object"), false),
            None if o.contains_key("items") => (Some("array"), false),
            None => return unchecked("no `type`"),
        };
        let t = match name {
            Some("string") => Ty::String,
            Some("boolean") => Ty::Bool,
            Some("integer") => Ty::Long,
            Some("number") => Ty::Decimal,
            Some("null") => return unchecked("always null"),
            Some("array") => {
                if o.contains_key("prefixItems") {
                    return unchecked("a tuple (`prefixItems`)");
                }
                match o.get("items") {
                    Some(items @ Json::Object(_)) => {
                        let (t, _) = self.ty(items, depth + 1);
                        match t {
                            Ty::Unchecked(why) => {
                                return unchecked(format!("an array of items with {why}"))
                            }
                            t => Ty::Set(Box::new(t)),
                        }
                    }
                    Some(Json::Array(_)) => return unchecked("a tuple (`items` as a list)"),
                    _ => return unchecked("an array without `items`"),
                }
            }
            Some("object") => Ty::Record(self.record(o, depth)),
            Some(other) => return unchecked(format!("type `{other}`")),
            None => return unchecked("no `type`"),
        };
        (t, nullable)
    }

    fn record(&mut self, o: &'a Map<String, Json>, depth: usize) -> Rec {
        let props = o.get("properties").and_then(Json::as_object);
        let additional = o.get("additionalProperties");
        let closed_explicitly = additional == Some(&Json::Bool(false));
        let open_explicitly = matches!(additional, Some(Json::Bool(true)) | Some(Json::Object(_)));
        let open = open_explicitly
            || o.contains_key("patternProperties")
            || (props.is_none() && !closed_explicitly);
        let required: HashSet<&str> = o
            .get("required")
            .and_then(Json::as_array)
            .map(|r| r.iter().filter_map(Json::as_str).collect())
            .unwrap_or_default();
        let mut attrs = BTreeMap::new();
        for (k, v) in props.into_iter().flatten() {
            let (t, nullable) = self.ty(v, depth + 1);
            attrs.insert(
                k.clone(),
                Attr {
                    ty: t,
                    required: required.contains(k.as_str()) && !nullable,
                },
            );
        }
        Rec { attrs, open }
    }
}

/// Two definitions of one name, merged as the module says.
fn merge(a: &Ty, b: &Ty) -> Ty {
    match (a, b) {
        (Ty::Unchecked(w), _) | (_, Ty::Unchecked(w)) => Ty::Unchecked(w.clone()),
        (Ty::Set(x), Ty::Set(y)) => match merge(x, y) {
            Ty::Unchecked(w) => Ty::Unchecked(w),
            t => Ty::Set(Box::new(t)),
        },
        (Ty::Record(x), Ty::Record(y)) => {
            let mut attrs = BTreeMap::new();
            let keys: BTreeSet<&String> = x.attrs.keys().chain(y.attrs.keys()).collect();
            for k in keys {
                let attr = match (x.attrs.get(k), y.attrs.get(k)) {
                    (Some(p), Some(q)) => Attr {
                        ty: merge(&p.ty, &q.ty),
                        required: p.required && q.required,
                    },
                    (Some(p), None) | (None, Some(p)) => Attr {
                        ty: p.ty.clone(),
                        required: false,
                    },
                    (None, None) => continue,
                };
                attrs.insert(k.clone(), attr);
            }
            Ty::Record(Rec {
                attrs,
                open: x.open || y.open,
            })
        }
        (x, y) if x == y => x.clone(),
        _ => Ty::Unchecked("different types in the definitions of one tool name".into()),
    }
}

/// The Cedar JSON-schema type of `t`, `None` when it has none.
fn cedar_type(t: &Ty) -> Option<Json> {
    Some(match t {
        Ty::Long => json!({"type": "Long"}),
        Ty::Decimal => json!({"type": "Extension", "name": "decimal"}),
        Ty::String => json!({"type": "String"}),
        Ty::Bool => json!({"type": "Boolean"}),
        Ty::Set(e) => json!({"type": "Set", "element": cedar_type(e)?}),
        Ty::Record(r) => {
            let mut attrs = Map::new();
            for (k, a) in &r.attrs {
                if let Some(mut c) = cedar_type(&a.ty) {
                    if let Some(obj) = c.as_object_mut() {
                        obj.insert("required".into(), Json::Bool(a.required));
                    }
                    attrs.insert(k.clone(), c);
                }
            }
            json!({"type": "Record", "attributes": attrs})
        }
        Ty::Unchecked(_) => return None,
    })
}

/// Whether `t` holds something Cedar is not told about (so reading all of it is
/// unchecked), with why.
fn hidden(t: &Ty, path: &str) -> Option<String> {
    match t {
        Ty::Unchecked(why) => Some(format!("`{path}` is {why}")),
        Ty::Set(e) => hidden(e, path),
        Ty::Record(r) => {
            if r.open {
                return Some(format!("`{path}` allows undeclared members"));
            }
            r.attrs
                .iter()
                .find_map(|(k, a)| hidden(&a.ty, &format!("{path}.{k}")))
        }
        _ => None,
    }
}

/// One tool's derived arguments.
#[derive(Debug, Clone)]
struct DerivedTool {
    args: Ty,
    /// Its input schemas as given (one per definition), for their `enum`s.
    schemas: Vec<Json>,
    origins: Vec<String>,
    /// The resources its calls come with, when known.
    resources: Option<BTreeSet<String>>,
}

/// What reading a path of `context.args` meets in one tool.
#[derive(Debug, PartialEq)]
enum Walk {
    /// A typed value (the type at the end of the path).
    Typed(Ty),
    /// The key at this index is declared nowhere in a closed record.
    Unknown(usize),
    /// Something Cedar is not told about: why.
    Unchecked(String),
}

fn walk(args: &Ty, path: &[String]) -> Walk {
    let mut t = args;
    let mut shown = String::from("context.args");
    for (i, k) in path.iter().enumerate() {
        match t {
            Ty::Record(r) => match r.attrs.get(k) {
                Some(a) => t = &a.ty,
                None if r.open => {
                    return Walk::Unchecked(format!(
                        "`{shown}` allows undeclared members such as `{k}`"
                    ))
                }
                None => return Walk::Unknown(i),
            },
            Ty::Unchecked(why) => return Walk::Unchecked(format!("`{shown}` is {why}")),
            // A member of a non-record: a type error Cedar reports.
            _ => return Walk::Typed(t.clone()),
        }
        shown.push('.');
        shown.push_str(k);
    }
    match hidden(t, &shown) {
        Some(why) => Walk::Unchecked(why),
        None => Walk::Typed(t.clone()),
    }
}

/// One policy, as the check sees it.
struct Pol {
    id: PolicyId,
    file: usize,
    start: usize,
    end: usize,
    policy: cedar_policy::Policy,
    /// Paths below `context` it reads, each with the index of its first key only tested
    /// with `has` (the path's length when none is).
    reads: Vec<(Vec<String>, usize)>,
    /// The comparisons of a path with a literal it makes.
    comparisons: Vec<(Vec<String>, Json, Cmp)>,
}

// The findings are gathered in the loader's context (`load::Ctx`, its `at` and `push`).
impl Ctx<'_> {
    /// A Cedar diagnostic at its first labelled span, unless `said` has it already.
    fn tools_diagnostic(
        &mut self,
        severity: Severity,
        file: usize,
        d: &dyn Diagnostic,
        code: &str,
        said: &HashSet<(String, Option<Location>)>,
        help: Option<String>,
    ) {
        let offset = d.labels().and_then(|mut l| l.next()).map(|l| l.offset());
        let help = help.or_else(|| d.help().map(|h| h.to_string()));
        let place = self.at(file, offset);
        if said.contains(&(d.to_string(), place.1.clone())) {
            return;
        }
        self.push(
            severity,
            code,
            format!("{d} (against the tools' input schemas)"),
            place,
            help,
        );
    }
}

/// The author's schema in Cedar's JSON form, if it parses.
fn author_json(s: &Source) -> Option<Json> {
    if s.text.len() > crate::load::MAX_FILE_BYTES {
        return None;
    }
    let fragment = if s.name.ends_with(".json") {
        cedar_policy::SchemaFragment::from_json_str(&s.text).ok()?
    } else {
        cedar_policy::SchemaFragment::from_cedarschema_str(&s.text)
            .ok()?
            .0
    };
    fragment.to_json_value().ok()
}

/// Whether an action declaration applies to requests (not a group).
fn declares_request(action: &Json) -> bool {
    let Some(applies) = action.get("appliesTo") else {
        return false;
    };
    let non_empty = |k: &str| {
        applies
            .get(k)
            .and_then(Json::as_array)
            .is_some_and(|v| !v.is_empty())
    };
    non_empty("principalTypes") || non_empty("resourceTypes")
}

/// Where a policy's effect (`permit`/`forbid`) starts: after its annotations, blank space
/// and comments, so a search for a name in the policy does not find it in an `@id`.
fn body_start(text: &str, start: usize, end: usize) -> usize {
    let bytes = text.as_bytes();
    let end = end.min(bytes.len());
    let mut i = start;
    while i < end {
        match bytes.get(i) {
            Some(b) if b.is_ascii_whitespace() => i += 1,
            Some(b'/') if bytes.get(i + 1) == Some(&b'/') => {
                while i < end && bytes.get(i) != Some(&b'\n') {
                    i += 1;
                }
            }
            Some(b'@') => {
                i += 1;
                while i < end
                    && bytes
                        .get(i)
                        .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
                {
                    i += 1;
                }
                while i < end && bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
                    i += 1;
                }
                if bytes.get(i) == Some(&b'(') {
                    // `("...")`: skip to the closing parenthesis outside the string.
                    let mut in_string = false;
                    while i < end {
                        match bytes.get(i) {
                            Some(b'\\') if in_string => i += 1,
                            Some(b'"') => in_string = !in_string,
                            Some(b')') if !in_string => {
                                i += 1;
                                break;
                            }
                            _ => {}
                        }
                        i += 1;
                    }
                }
            }
            _ => break,
        }
    }
    i.min(end)
}

/// The first offset of any of `needles` in `text[start..end]`, if there is one.
fn find_in(text: &str, start: usize, end: usize, needles: &[String]) -> Option<usize> {
    let start = body_start(text, start, end);
    let span = text.get(start..end.min(text.len()))?;
    needles
        .iter()
        .filter_map(|n| span.find(n.as_str()))
        .min()
        .map(|o| start + o)
}

/// Where a policy reads argument `key`: `.key`, `has key`, `"key"`.
fn find_key(text: &str, start: usize, end: usize, key: &str) -> Option<usize> {
    let start = body_start(text, start, end);
    let span = text.get(start..end.min(text.len()))?;
    let ident_end = |rest: &str| {
        !rest
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    };
    for pat in [
        format!(".{key}"),
        format!("has {key}"),
        format!("\"{key}\""),
    ] {
        let mut from = 0;
        while let Some(i) = span.get(from..).and_then(|s| s.find(pat.as_str())) {
            let at = from + i;
            let after = span.get(at + pat.len()..).unwrap_or("");
            if pat.starts_with('"') || ident_end(after) {
                let lead = usize::from(!pat.starts_with('"')) * (pat.len() - key.len());
                return Some(start + at + lead);
            }
            from = at + 1;
        }
    }
    None
}

/// A help line listing what there is (at most 20 names).
fn suggest<'a>(wanted: &str, names: impl Iterator<Item = &'a str>, what: &str) -> String {
    let names: Vec<&str> = names.collect();
    // A near spelling, else a longer name ending in it (`kit__echo` for `echo`: the names
    // a host sees in daemon mode).
    let close = names.iter().find(|n| close_enough(wanted, n)).or_else(|| {
        names
            .iter()
            .find(|n| n.len() > wanted.len() && n.ends_with(wanted))
    });
    let mut listed: Vec<&str> = names.iter().copied().take(20).collect();
    if names.len() > 20 {
        listed.push("...");
    }
    let list = if listed.is_empty() {
        "none".to_owned()
    } else {
        listed.join(", ")
    };
    match close {
        Some(c) => format!("did you mean `{c}`? the {what} are: {list}"),
        None => format!("the {what} are: {list}"),
    }
}

/// At most two single-character edits apart (a cheap Levenshtein, bounded by length).
fn close_enough(a: &str, b: &str) -> bool {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    if a.len().abs_diff(b.len()) > 2 || a.len() > 64 || b.len() > 64 {
        return false;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev.get(j).copied().unwrap_or(0) + usize::from(ca != cb);
            let del = prev.get(j + 1).copied().unwrap_or(0) + 1;
            let ins = cur.get(j).copied().unwrap_or(0) + 1;
            if let Some(c) = cur.get_mut(j + 1) {
                *c = sub.min(del).min(ins);
            }
        }
        prev = cur;
    }
    prev.last().copied().unwrap_or(usize::MAX) <= 2
}

/// The deepest policy structure walked for reads (as [`crate::analysis`]).
const MAX_WALK_DEPTH: usize = 512;

/// How a path is compared with a literal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Cmp {
    /// `context.PATH == literal`
    Eq,
    /// `context.PATH != literal`
    Ne,
    /// `[..., literal, ...].contains(context.PATH)`
    Member,
}

/// The `context.PATH == literal` and `!=` comparisons in a policy (either side), and the
/// literals of a set literal that `.contains(context.PATH)`.
fn comparisons_of(est: &Json) -> Vec<(Vec<String>, Json, Cmp)> {
    fn path_of(v: &Json, depth: usize) -> Option<Vec<String>> {
        if depth > MAX_WALK_DEPTH {
            return None;
        }
        let obj = v.as_object()?;
        if obj.get("Var").and_then(Json::as_str) == Some("context") && obj.len() == 1 {
            return Some(Vec::new());
        }
        let inner = obj.get(".")?;
        let mut path = path_of(inner.get("left")?, depth + 1)?;
        path.push(inner.get("attr")?.as_str()?.to_owned());
        Some(path)
    }
    fn go(v: &Json, depth: usize, out: &mut Vec<(Vec<String>, Json, Cmp)>) {
        if depth > MAX_WALK_DEPTH || out.len() > 1_000 {
            return;
        }
        if let Some(obj) = v.as_object() {
            if let Some(inner) = obj.get("contains") {
                let set = inner.get("left").and_then(|l| l.get("Set")?.as_array());
                let path = inner.get("right").and_then(|r| path_of(r, 0));
                if let (Some(items), Some(path)) = (set, path) {
                    // (Bounded like the walk: at most about 1,000 comparisons a policy.)
                    for item in items.iter().take(1_000usize.saturating_sub(out.len())) {
                        let literal = item
                            .get("Value")
                            .filter(|x| !x.is_object() && !x.is_array());
                        if let Some(lit) = literal {
                            out.push((path.clone(), lit.clone(), Cmp::Member));
                        }
                    }
                }
            }
            for (op, eq) in [("==", Cmp::Eq), ("!=", Cmp::Ne)] {
                let Some(inner) = obj.get(op) else { continue };
                let (Some(l), Some(r)) = (inner.get("left"), inner.get("right")) else {
                    continue;
                };
                for (a, b) in [(l, r), (r, l)] {
                    let literal = b.get("Value").filter(|x| !x.is_object() && !x.is_array());
                    if let (Some(path), Some(lit)) = (path_of(a, 0), literal) {
                        out.push((path, lit.clone(), eq));
                    }
                }
            }
            for c in obj.values() {
                go(c, depth + 1, out);
            }
        } else if let Some(items) = v.as_array() {
            for c in items {
                go(c, depth + 1, out);
            }
        }
    }
    let mut out = Vec::new();
    go(est, 0, &mut out);
    out
}

/// The values an input schema's `enum` (or `const`) allows at `path` below its root, when
/// it has one there (local `$ref`s, an `allOf` of one schema and a `T | null` union are
/// looked through); `None` when it does not say.
fn enum_at(root: &Json, path: &[String]) -> Option<Vec<Json>> {
    fn resolve<'a>(root: &'a Json, mut s: &'a Json) -> Option<&'a Json> {
        for _ in 0..MAX_SCHEMA_DEPTH {
            let o = s.as_object()?;
            if let Some(r) = o.get("$ref") {
                s = root.pointer(r.as_str()?.strip_prefix('#')?)?;
            } else if let Some([only]) = o.get("allOf").and_then(Json::as_array).map(Vec::as_slice)
            {
                s = only;
            } else if let Some(bs) = o
                .get("anyOf")
                .or_else(|| o.get("oneOf"))
                .and_then(Json::as_array)
            {
                let non_null: Vec<&Json> = bs
                    .iter()
                    .filter(|b| b.get("type").and_then(Json::as_str) != Some("null"))
                    .collect();
                match non_null.as_slice() {
                    [one] => s = one,
                    _ => return None,
                }
            } else {
                return Some(s);
            }
        }
        None
    }
    let mut s = resolve(root, root)?;
    for k in path {
        s = resolve(root, s.get("properties")?.get(k)?)?;
    }
    let values: Vec<Json> = match (s.get("const"), s.get("enum").and_then(Json::as_array)) {
        (Some(c), _) => vec![c.clone()],
        (None, Some(e)) => e.clone(),
        (None, None) => return None,
    };
    Some(values.into_iter().filter(|v| !v.is_null()).collect())
}

/// The paths below `context` a policy reads, each with the index of the first key only
/// tested with `has`; `None` when the structure is too deep to walk (then it reads all).
fn reads_of(est: &Json) -> Vec<(Vec<String>, usize)> {
    fn chain(v: &Json, depth: usize) -> Option<(Vec<String>, usize)> {
        if depth > MAX_WALK_DEPTH {
            return None;
        }
        let obj = v.as_object()?;
        if obj.len() != 1 {
            return None;
        }
        if obj.get("Var").and_then(Json::as_str) == Some("context") {
            return Some((Vec::new(), usize::MAX));
        }
        for op in [".", "has"] {
            if let Some(inner) = obj.get(op) {
                let (mut path, first_has) = chain(inner.get("left")?, depth + 1)?;
                let before = path.len();
                match inner.get("attr")? {
                    Json::String(a) => path.push(a.clone()),
                    Json::Array(keys) => {
                        for k in keys {
                            path.push(k.as_str()?.to_owned());
                        }
                    }
                    _ => return None,
                }
                let first_has = if op == "has" {
                    first_has.min(before)
                } else {
                    first_has
                };
                return Some((path, first_has));
            }
        }
        None
    }
    fn go(v: &Json, depth: usize, out: &mut Vec<(Vec<String>, usize)>) -> bool {
        if depth > MAX_WALK_DEPTH {
            return false;
        }
        if let Some((path, first_has)) = chain(v, 0) {
            let n = path.len();
            out.push((path, first_has.min(n)));
            return true;
        }
        match v {
            Json::Object(map) => map.values().all(|c| go(c, depth + 1, out)),
            Json::Array(items) => items.iter().all(|c| go(c, depth + 1, out)),
            _ => true,
        }
    }
    let mut out = Vec::new();
    if !go(est, 0, &mut out) {
        return vec![(Vec::new(), 0)];
    }
    out.sort();
    out.dedup();
    out
}

/// The set's policies with the ids the loader gives them (files it would refuse unread
/// are skipped: the loader reports them).
fn collect(files: &[Source]) -> Vec<Pol> {
    let mut parsed: Vec<(usize, usize, usize, cedar_policy::Policy)> = Vec::new();
    for (i, src) in files.iter().enumerate().take(crate::load::MAX_FILES) {
        if src.text.len() > crate::load::MAX_FILE_BYTES
            || crate::load::too_deep(&src.text).is_some()
        {
            continue;
        }
        let Ok(set) = src.text.parse::<PolicySet>() else {
            continue;
        };
        let mut in_file: Vec<(usize, usize, usize, cedar_policy::Policy)> = set
            .policies()
            .map(|p| {
                let (s, e) = p
                    .as_ref()
                    .loc()
                    .map_or((0, src.text.len()), |l| (l.start(), l.end()));
                (i, s, e, p.clone())
            })
            .collect();
        in_file.sort_by_key(|p| p.1);
        parsed.extend(in_file);
    }
    parsed.truncate(crate::load::MAX_POLICIES);
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (n, (file, start, end, policy)) in parsed.into_iter().enumerate() {
        let id = match policy.annotation("id") {
            Some(text) => PolicyId::parse(text),
            None => PolicyId::parse(&format!("policy{n}")),
        };
        let Some(id) = id else { continue };
        if !seen.insert(id.clone()) {
            continue;
        }
        let est = policy.to_json().ok();
        let reads = est.as_ref().map_or_else(|| vec![(Vec::new(), 0)], reads_of);
        let comparisons = est.as_ref().map(comparisons_of).unwrap_or_default();
        out.push(Pol {
            policy: policy.new_id(cedar_policy::PolicyId::new(id.as_str())),
            id,
            file,
            start,
            end,
            reads,
            comparisons,
        });
    }
    out
}

/// Check `files` (loaded with `options`, as the daemon or gateway would) against `tools`.
pub fn check(files: &[Source], options: &Options, tools: &[ToolDef]) -> Report {
    let loaded = crate::load(files, options);
    let mut cx = Ctx {
        files,
        findings: Vec::new(),
    };
    let derived = derive_tools(tools);
    let tool_count = derived.len();
    let done = |cx: Ctx<'_>, loaded| Report {
        loaded,
        findings: cx.findings,
        tools: tool_count,
    };

    // The author's schema in JSON form (the loader reports it when it does not read).
    let author: Option<Json> = match &options.schema {
        None => None,
        Some(s) => match author_json(s) {
            Some(a) => Some(a),
            None => return done(cx, loaded),
        },
    };
    let author_actions: Map<String, Json> = author
        .as_ref()
        .and_then(|a| a.get("")?.get("actions")?.as_object().cloned())
        .unwrap_or_default();
    let author_declared: BTreeSet<String> = author_actions
        .iter()
        .filter(|(_, a)| declares_request(a))
        .map(|(k, _)| k.clone())
        .collect();

    // The merged fragment: the author's, plus every tool it does not declare.
    let mut fragment = author
        .clone()
        .unwrap_or_else(|| json!({"": {"entityTypes": {}, "actions": {}}}));
    let Some(actions) = fragment
        .get_mut("")
        .and_then(Json::as_object_mut)
        .map(|ns| ns.entry("actions").or_insert_with(|| json!({})))
        .and_then(Json::as_object_mut)
    else {
        return done(cx, loaded);
    };
    for (name, t) in &derived {
        if actions.contains_key(name) {
            continue;
        }
        let mut attrs = Map::new();
        if let Some(args) = cedar_type(&t.args) {
            attrs.insert("args".into(), args);
        }
        actions.insert(
            name.clone(),
            json!({"appliesTo": {
                "principalTypes": ["Agent"],
                "resourceTypes": ["Upstream"],
                "context": {"type": "Record", "attributes": attrs}
            }}),
        );
    }
    let schema = match crate::schema::augment(fragment)
        .map_err(|p| p.message)
        .and_then(|f| cedar_policy::Schema::from_json_value(f).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            cx.push(
                Severity::Error,
                "tollgate::derived-schema",
                format!("the schema derived from the tools is not a Cedar schema: {e}"),
                (None, None),
                None,
            );
            return done(cx, loaded);
        }
    };
    for name in &author_declared {
        if !derived.contains_key(name) {
            let place = (options.schema.as_ref().map(|s| s.name.clone()), None);
            cx.push(
                Severity::Warning,
                "tollgate::schema-no-tool",
                format!(
                    "the schema declares action `{name}`, but no tool definition has that name"
                ),
                place,
                Some(
                    "a policy on it never matches a call; check the name, or remove the declaration"
                        .into(),
                ),
            );
        }
    }

    // The author's declarations against the tools' own input schemas.
    if let Some(schema_source) = &options.schema {
        let common = author
            .as_ref()
            .and_then(|a| a.get("")?.get("commonTypes")?.as_object());
        for name in &author_declared {
            let (Some(action), Some(t)) = (author_actions.get(name), derived.get(name)) else {
                continue;
            };
            let found = drift::drift(action, common, name, &t.args);
            if found.is_empty() {
                continue;
            }
            // Found once per tool, not per finding (it scans the schema's text).
            let place = drift::place(schema_source, name);
            for d in found {
                cx.push(
                    d.severity,
                    "tollgate::schema-drift",
                    d.message,
                    place.clone(),
                    Some(
                        "the set runs with the schema's types, not the tool's: make the schema say what the tool sends"
                            .into(),
                    ),
                );
            }
        }
    }

    // A group's members (groups come from the author's schema).
    let mut members_of: HashMap<String, Vec<String>> = HashMap::new();
    if let Ok(entities) = schema.action_entities() {
        for e in entities.iter() {
            let uid = e.uid();
            for anc in entities.ancestors(&uid).into_iter().flatten() {
                members_of
                    .entry(anc.id().unescaped().to_owned())
                    .or_default()
                    .push(uid.id().unescaped().to_owned());
            }
        }
    }
    let known: BTreeSet<String> = derived
        .keys()
        .cloned()
        .chain(author_actions.keys().cloned())
        .collect();
    let all_resources: Option<BTreeSet<String>> = derived
        .values()
        .try_fold(BTreeSet::new(), |mut acc, t| {
            acc.extend(t.resources.clone()?);
            Some(acc)
        })
        .filter(|_| !derived.is_empty());

    let policies = collect(files);
    let mut validated = PolicySet::new();
    let mut file_of: HashMap<String, usize> = HashMap::new();
    let mut policies_in_error: HashSet<String> = HashSet::new();
    for p in &policies {
        let text: &str = files.get(p.file).map_or("", |f| f.text.as_str());
        let (named, any) = match p.policy.action_constraint() {
            ActionConstraint::Any => (Vec::new(), true),
            ActionConstraint::Eq(uid) => (vec![uid.id().unescaped().to_owned()], false),
            ActionConstraint::In(uids) => (
                uids.iter().map(|u| u.id().unescaped().to_owned()).collect(),
                false,
            ),
        };
        let unknown_tools: Vec<&String> = named.iter().filter(|a| !known.contains(*a)).collect();
        let mut applicable: BTreeSet<String> = BTreeSet::new();
        for a in named.iter().filter(|a| known.contains(*a)) {
            applicable.insert(a.clone());
            applicable.extend(members_of.get(a).into_iter().flatten().cloned());
        }
        if any {
            applicable.extend(known.iter().cloned());
        }
        // The applicable tools typed by derivation (the author types its own).
        let derived_here: Vec<(&String, &DerivedTool)> = applicable
            .iter()
            .filter(|a| !author_declared.contains(*a))
            .filter_map(|a| derived.get(a).map(|t| (a, t)))
            .collect();
        let author_here = applicable.iter().any(|a| author_declared.contains(a));

        let mut unchecked_why: Option<String> = None;
        let mut number: Option<(String, String)> = None;
        // (key, offset of the key in the path, only tested with has)
        let mut unknown_args: Vec<(String, bool)> = Vec::new();
        for (path, first_has) in &p.reads {
            let args_path: &[String] = match path.split_first() {
                None => &[],
                Some((first, rest)) if first == "args" => rest,
                Some(_) => continue,
            };
            let mut unknown_at: Option<usize> = None;
            let mut everywhere = !derived_here.is_empty() && !author_here;
            for (tool, t) in &derived_here {
                match walk(&t.args, args_path) {
                    Walk::Typed(end) => {
                        everywhere = false;
                        let is_number =
                            end == Ty::Decimal || matches!(&end, Ty::Set(e) if **e == Ty::Decimal);
                        if is_number && number.is_none() {
                            number = Some(((*tool).clone(), args_path.join(".")));
                        }
                    }
                    Walk::Unknown(i) => unknown_at = Some(unknown_at.map_or(i, |j| j.min(i))),
                    Walk::Unchecked(why) => {
                        everywhere = false;
                        if unchecked_why.is_none() {
                            unchecked_why = Some(format!("for `{tool}`, {why}"));
                        }
                    }
                }
            }
            if everywhere {
                if let Some(i) = unknown_at {
                    if let Some(key) = args_path.get(i) {
                        // `first_has` counts from `context`; `i` from `args`.
                        unknown_args.push((key.clone(), i + 1 >= *first_has));
                    }
                }
            }
        }
        let checked_by_cedar = unchecked_why.is_none();
        // Cedar reports an unknown tool, and a plain read of an undeclared argument, in
        // the policies it checks; a `has` test of one it types as false (an impossible
        // policy at worst), so that is reported here, as is everything in a policy it
        // does not check.
        if !checked_by_cedar {
            for a in &unknown_tools {
                let at = find_in(text, p.start, p.end, &[format!("\"{a}\"")]);
                let place = cx.at(p.file, Some(at.unwrap_or(p.start)));
                cx.push(
                    Severity::Error,
                    "tollgate::unknown-tool",
                    format!("for policy `{}`, no tool is named `{a}`", p.id),
                    place,
                    Some(suggest(a, derived.keys().map(String::as_str), "tools")),
                );
                policies_in_error.insert(p.id.as_str().to_owned());
            }
        }
        let mut reported = HashSet::new();
        for (key, tested_only) in &unknown_args {
            if (checked_by_cedar && !tested_only) || !reported.insert(key.clone()) {
                continue;
            }
            let at = find_key(text, p.start, p.end, key);
            let place = cx.at(p.file, Some(at.unwrap_or(p.start)));
            let declared: BTreeSet<&str> = derived_here
                .iter()
                .filter_map(|(_, t)| match &t.args {
                    Ty::Record(r) => Some(r.attrs.keys().map(String::as_str)),
                    _ => None,
                })
                .flatten()
                .collect();
            cx.push(
                Severity::Error,
                "tollgate::unknown-argument",
                format!(
                    "for policy `{}`, no argument `{key}` in the input schema of {}",
                    p.id,
                    if let [(name, t)] = derived_here.as_slice() {
                        format!("`{name}` ({})", t.origins.join(", "))
                    } else {
                        format!("any of the {} tools it can apply to", derived_here.len())
                    }
                ),
                place,
                Some(suggest(key, declared.into_iter(), "declared arguments")),
            );
            policies_in_error.insert(p.id.as_str().to_owned());
        }
        if let Some(why) = &unchecked_why {
            let place = cx.at(p.file, Some(p.start));
            cx.push(
                Severity::Warning,
                "tollgate::not-type-checked",
                format!(
                    "policy `{}` is not type-checked against the tools: {why} (no Cedar type)",
                    p.id
                ),
                place,
                Some("its tool and argument names are still checked; declare the argument in the set's schema to type-check it".into()),
            );
        }
        if let Some((tool, path)) = &number {
            let at = path
                .rsplit('.')
                .next()
                .and_then(|k| find_key(text, p.start, p.end, k));
            let place = cx.at(p.file, Some(at.unwrap_or(p.start)));
            cx.push(
                Severity::Warning,
                "tollgate::undeclared-number",
                format!(
                    "policy `{}` reads `context.args.{path}`, a JSON Schema number of `{tool}`: without a schema declaring it, an integer (150) arrives as a Long and a fraction (150.5) as a decimal, and a comparison that fits one refuses the other (DENY policy_error)",
                    p.id
                ),
                place,
                Some(format!(
                    "declare it in the set's schema ([policy].schema, --schema): `action \"{tool}\" appliesTo {{ principal: Agent, resource: Upstream, context: {{ args: {{ {path}: decimal, ... }} }} }};`"
                )),
            );
        }
        // `context.args.x == "v"` where no tool's `enum` for `x` has `v`.
        let mut compared = HashSet::new();
        // Per argument path: every value the tools' `enum`s allow, when every tool has one
        // (read once per path, however many literals are compared with it).
        let mut enums: HashMap<&[String], Option<Vec<Json>>> = HashMap::new();
        for (path, literal, cmp) in &p.comparisons {
            let Some(("args", args_path)) = path.split_first().map(|(f, r)| (f.as_str(), r)) else {
                continue;
            };
            if derived_here.is_empty() || author_here || !compared.insert((path, literal)) {
                continue;
            }
            let allowed = enums.entry(args_path).or_insert_with(|| {
                let mut allowed: Vec<Json> = Vec::new();
                let all_enumerated = derived_here.iter().all(|(_, t)| {
                    t.schemas
                        .iter()
                        .all(|schema| match enum_at(schema, args_path) {
                            Some(values) => {
                                allowed.extend(values);
                                true
                            }
                            None => false,
                        })
                });
                all_enumerated.then_some(allowed)
            });
            let Some(allowed) = allowed.as_ref() else {
                continue;
            };
            if allowed.contains(literal) {
                continue;
            }
            let shown = serde_json::to_string(literal).unwrap_or_default();
            let mut listed: Vec<String> = allowed
                .iter()
                .map(|v| serde_json::to_string(v).unwrap_or_default())
                .collect();
            listed.sort();
            listed.dedup();
            listed.truncate(20);
            let at = find_in(text, p.start, p.end, std::slice::from_ref(&shown));
            let place = cx.at(p.file, Some(at.unwrap_or(p.start)));
            let said = match cmp {
                Cmp::Eq => format!("`== {shown}` is never true"),
                Cmp::Ne => format!("`!= {shown}` is always true"),
                Cmp::Member => format!("{shown} in a set that `.contains` it never matches"),
            };
            cx.push(
                Severity::Warning,
                "tollgate::outside-enum",
                format!(
                    "for policy `{}`, `context.args.{}` is one of {} in the tools' input schemas, so {said}",
                    p.id,
                    args_path.join("."),
                    listed.join(", "),
                ),
                place,
                Some("check the value's spelling and case against the tool's enum".into()),
            );
        }
        // A resource no upstream is, or one offering none of the tools named.
        let resource = match p.policy.resource_constraint() {
            ResourceConstraint::Eq(uid) | ResourceConstraint::In(uid)
                if uid.type_name().to_string() == "Upstream" =>
            {
                Some(uid.id().unescaped().to_owned())
            }
            _ => None,
        };
        if let (Some(r), Some(all)) = (&resource, &all_resources) {
            let at = find_in(text, p.start, p.end, &[format!("\"{r}\"")]);
            let place = cx.at(p.file, Some(at.unwrap_or(p.start)));
            if !all.contains(r) {
                cx.push(
                    Severity::Warning,
                    "tollgate::never-matches",
                    format!(
                        "policy `{}` can never match: its resource `Upstream::\"{r}\"` is no upstream the calls come from",
                        p.id
                    ),
                    place,
                    Some(format!(
                        "the resources are: {}",
                        all.iter()
                            .map(|u| format!("Upstream::\"{u}\""))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                );
            } else if !any
                && !applicable.is_empty()
                && applicable.iter().all(|a| {
                    derived
                        .get(a)
                        .and_then(|t| t.resources.as_ref())
                        .is_some_and(|rs| !rs.contains(r))
                })
            {
                cx.push(
                    Severity::Warning,
                    "tollgate::never-matches",
                    format!(
                        "policy `{}` can never match: upstream `{r}` offers none of the tools it names",
                        p.id
                    ),
                    place,
                    None,
                );
            }
        }
        if checked_by_cedar && validated.add(p.policy.clone()).is_ok() {
            file_of.insert(p.id.as_str().to_owned(), p.file);
        }
    }

    let result = cedar_policy::Validator::new(schema)
        .validate(&validated, cedar_policy::ValidationMode::Strict);
    // What the loader already said (the author's schema's own validation) is not said
    // twice; a policy with an error is not also warned about (the warnings follow from
    // the error: an unknown tool makes the policy apply to nothing).
    let said: HashSet<(String, Option<Location>)> = match &loaded {
        Ok(l) => l.warnings.iter(),
        Err(e) => e.findings.iter(),
    }
    .map(|f| (f.message.clone(), f.location.clone()))
    .collect();
    let mut erred: HashSet<String> = HashSet::new();
    for e in result.validation_errors() {
        use cedar_policy::ValidationError as E;
        let id = e.policy_id().to_string();
        let code = match e {
            E::UnrecognizedActionId(_) => "tollgate::unknown-tool",
            E::UnsafeAttributeAccess(_) if e.to_string().contains("`args.") => {
                "tollgate::unknown-argument"
            }
            E::UnsafeAttributeAccess(_) => "tollgate::unknown-attribute",
            E::UnsafeOptionalAttributeAccess(_) => "tollgate::optional-argument",
            E::UnexpectedType(_) | E::IncompatibleTypes(_) => "tollgate::type-mismatch",
            _ => "cedar::validation",
        };
        let file = file_of.get(id.as_str()).copied().unwrap_or(usize::MAX);
        // Cedar's suggestion for an unknown action is its own; ours is the closest tool.
        let help = match e {
            E::UnrecognizedActionId(_) => {
                let text = e.to_string();
                text.split_once("Action::\"")
                    .and_then(|(_, rest)| rest.split_once('"'))
                    .map(|(name, _)| suggest(name, known.iter().map(String::as_str), "tools"))
            }
            _ => None,
        };
        cx.tools_diagnostic(Severity::Error, file, e, code, &said, help);
        erred.insert(id);
    }
    for w in result.validation_warnings() {
        use cedar_policy::ValidationWarning as W;
        let id = w.policy_id().to_string();
        if erred.contains(&id) || policies_in_error.contains(id.as_str()) {
            continue;
        }
        let code = match w {
            W::ImpossiblePolicy(_) | W::InvalidActionApplication(_) => "tollgate::never-matches",
            _ => "cedar::validation",
        };
        let file = file_of.get(id.as_str()).copied().unwrap_or(usize::MAX);
        cx.tools_diagnostic(Severity::Warning, file, w, code, &said, None);
    }
    cx.findings.sort_by(|a, b| {
        let key = |f: &Finding| {
            f.location
                .as_ref()
                .map(|l| (l.file.clone(), l.line, l.column))
        };
        key(a).cmp(&key(b))
    });
    done(cx, loaded)
}

/// What `tollgate policy check` prints for `report` and its exit code: every finding
/// (`file:line:col: error[code]: message`, then a help line), `checked against N tools
/// (SOURCE)`, then `ok: ...` (0) or `refused: E errors, W warnings` (1).
pub fn render(report: &Report, source: &str) -> (String, u8) {
    use std::fmt::Write as _;
    let mut out = String::new();
    let all = report.all();
    for f in &all {
        let _ = writeln!(out, "{f}");
    }
    let errors = all.iter().filter(|f| f.severity == Severity::Error).count();
    let warnings = all.len() - errors;
    let _ = writeln!(out, "checked against {} tools ({source})", report.tools);
    match (&report.loaded, errors) {
        (Ok(l), 0) => {
            let _ = writeln!(
                out,
                "ok: {} policies, {warnings} warnings, default {}, digest {}",
                l.policies.len(),
                l.policies.default_effect().as_str(),
                l.policies.digest()
            );
            (out, 0)
        }
        _ => {
            let _ = writeln!(out, "refused: {errors} errors, {warnings} warnings");
            (out, 1)
        }
    }
}

fn derive_tools(tools: &[ToolDef]) -> BTreeMap<String, DerivedTool> {
    let mut derived: BTreeMap<String, DerivedTool> = BTreeMap::new();
    for t in tools.iter().take(MAX_TOOLS) {
        let (args, _) = ty(&t.input_schema, 0);
        match derived.get_mut(&t.name) {
            None => {
                derived.insert(
                    t.name.clone(),
                    DerivedTool {
                        args,
                        schemas: vec![t.input_schema.clone()],
                        origins: vec![t.origin.clone()],
                        resources: t.resource.clone().map(|r| BTreeSet::from([r])),
                    },
                );
            }
            Some(entry) => {
                entry.args = merge(&entry.args, &args);
                entry.schemas.push(t.input_schema.clone());
                entry.origins.push(t.origin.clone());
                match (&mut entry.resources, &t.resource) {
                    (Some(set), Some(r)) => {
                        set.insert(r.clone());
                    }
                    (r, None) => *r = None,
                    (None, Some(_)) => {}
                }
            }
        }
    }
    derived
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, schema: Json) -> ToolDef {
        ToolDef {
            name: name.into(),
            input_schema: schema,
            origin: "tools.json".into(),
            resource: None,
        }
    }

    fn tools() -> Vec<ToolDef> {
        vec![
            tool(
                "pay",
                json!({"type": "object", "properties": {
                    "amount": {"type": "number"},
                    "count": {"type": "integer"},
                    "currency": {"type": "string", "enum": ["EUR", "USD"]},
                    "to": {"type": "string"},
                    "memo": {"type": ["string", "null"]},
                    "meta": {"type": "object"},
                    "any": {"oneOf": [{"type": "string"}, {"type": "integer"}]}
                }, "required": ["amount", "count", "currency", "to", "memo"]}),
            ),
            tool(
                "search",
                json!({"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["query"]}),
            ),
        ]
    }

    fn run(policies: &str) -> Report {
        check(
            &[Source::new("p.cedar", policies)],
            &Options::default(),
            &tools(),
        )
    }

    /// `policies` checked against [`tools`] with an author schema `schema`.
    fn run_with_schema(schema: &str, policies: &str) -> Report {
        let options = Options {
            schema: Some(Source::new("s.cedarschema", schema)),
            ..Options::default()
        };
        check(&[Source::new("p.cedar", policies)], &options, &tools())
    }

    fn codes(r: &Report) -> Vec<String> {
        r.findings
            .iter()
            .map(|f| {
                let at = f
                    .location
                    .as_ref()
                    .map_or(String::new(), |l| format!("{}:{}", l.line, l.column));
                format!("{at} {:?} {}", f.severity, f.code)
            })
            .collect()
    }

    #[test]
    fn json_schema_types_map_as_documented() {
        let t = |s: Json| ty(&s, 0).0;
        assert_eq!(t(json!({"type": "integer"})), Ty::Long);
        assert_eq!(t(json!({"type": "number"})), Ty::Decimal);
        assert_eq!(t(json!({"type": "string", "format": "email"})), Ty::String);
        assert_eq!(t(json!({"enum": ["a", "b"]})), Ty::String);
        assert_eq!(t(json!({"enum": [1, 2, null]})), Ty::Long);
        assert_eq!(t(json!({"const": true})), Ty::Bool);
        assert_eq!(
            ty(&json!({"type": ["string", "null"]}), 0),
            (Ty::String, true)
        );
        assert_eq!(
            ty(
                &json!({"anyOf": [{"type": "integer"}, {"type": "null"}]}),
                0
            ),
            (Ty::Long, true)
        );
        assert_eq!(
            t(json!({"type": "array", "items": {"type": "string"}})),
            Ty::Set(Box::new(Ty::String))
        );
        for unchecked in [
            json!({"type": ["string", "integer"]}),
            json!({"oneOf": [{"type": "string"}, {"type": "object"}]}),
            json!({"$ref": "#/$defs/x"}),
            json!({"$ref": "https://example.com/s.json"}),
            json!({"allOf": [{"type": "string"}, {"minLength": 1}]}),
            json!({"type": "array"}),
            json!({"type": "array", "items": [{"type": "string"}]}),
            json!({"enum": ["a", 1]}),
            json!({}),
            json!(true),
            json!({"type": "null"}),
        ] {
            assert!(
                matches!(t(unchecked.clone()), Ty::Unchecked(_)),
                "{unchecked}"
            );
        }
        // Open and closed objects.
        let Ty::Record(r) = t(json!({"type": "object", "properties": {"a": {"type": "string"}}}))
        else {
            panic!()
        };
        assert!(!r.open);
        assert!(!r.attrs["a"].required);
        for open in [
            json!({"type": "object"}),
            json!({"type": "object", "properties": {}, "additionalProperties": true}),
            json!({"type": "object", "properties": {}, "additionalProperties": {"type": "string"}}),
            json!({"type": "object", "properties": {}, "patternProperties": {"^x": {}}}),
        ] {
            let Ty::Record(r) = t(open.clone()) else {
                panic!("{open}")
            };
            assert!(r.open, "{open}");
        }
        let Ty::Record(r) = t(json!({"type": "object", "additionalProperties": false})) else {
            panic!()
        };
        assert!(!r.open);
        // Deep nesting is unchecked, not a stack overflow.
        let mut deep = json!({"type": "string"});
        for _ in 0..200 {
            deep = json!({"type": "object", "properties": {"x": deep}});
        }
        assert!(hidden(&t(deep), "x").is_some());
    }

    #[test]
    fn local_refs_are_followed_bounded() {
        // As pydantic writes a nested model.
        let schema = json!({"type": "object", "properties": {
            "payment": {"$ref": "#/$defs/Payment"},
            "again": {"allOf": [{"$ref": "#/$defs/Payment"}], "description": "d"},
            "tree": {"$ref": "#/$defs/Node"}
        }, "$defs": {
            "Payment": {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]},
            "Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}}
        }});
        let Ty::Record(r) = ty(&schema, 0).0 else {
            panic!()
        };
        let Ty::Record(pay) = &r.attrs["payment"].ty else {
            panic!("{r:?}")
        };
        assert_eq!(
            pay.attrs["amount"],
            Attr {
                ty: Ty::Long,
                required: true
            }
        );
        assert_eq!(r.attrs["again"].ty, r.attrs["payment"].ty);
        let Ty::Record(node) = &r.attrs["tree"].ty else {
            panic!()
        };
        assert!(matches!(&node.attrs["child"].ty, Ty::Unchecked(w) if w.contains("recursive")));
        // A small schema whose references double at every level (2^14 leaves, within the
        // depth bound): the node budget ends it.
        let mut defs = Map::new();
        for i in 0..14 {
            defs.insert(
                format!("D{i}"),
                json!({"type": "object", "properties": {
                    "a": {"$ref": format!("#/$defs/D{}", i + 1)},
                    "b": {"$ref": format!("#/$defs/D{}", i + 1)}
                }}),
            );
        }
        defs.insert("D14".into(), json!({"type": "string"}));
        let wide = json!({"$ref": "#/$defs/D0", "$defs": defs});
        assert!(hidden(&ty(&wide, 0).0, "x").is_some());
    }

    #[test]
    fn merging_two_definitions_of_a_name() {
        let a = ty(&json!({"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}, "x": {"type": "string"}}, "required": ["q", "n"]}), 0).0;
        let b = ty(&json!({"type": "object", "properties": {"q": {"type": "string"}, "x": {"type": "integer"}}, "required": ["q"]}), 0).0;
        let Ty::Record(m) = merge(&a, &b) else {
            panic!()
        };
        assert_eq!(
            m.attrs["q"],
            Attr {
                ty: Ty::String,
                required: true
            }
        );
        assert_eq!(
            m.attrs["n"],
            Attr {
                ty: Ty::Long,
                required: false
            }
        );
        assert!(matches!(m.attrs["x"].ty, Ty::Unchecked(_)));
    }

    #[test]
    fn a_correct_set_passes() {
        let r = run(r#"@id("big")
forbid (principal, action == Action::"pay", resource)
when { context.args.amount.greaterThan(decimal("100.0")) && context.args.currency == "EUR" && context.args.count > 2 };
@id("memo")
forbid (principal, action == Action::"pay", resource)
when { context.args has memo && context.args.memo like "*x*" };
@id("search")
permit (principal, action == Action::"search", resource)
when { context.args.query != "" && (context.args has limit && context.args.limit < 50) };
"#);
        assert!(r.ok(), "{:?}", r.all());
        // The number warning, only.
        assert_eq!(codes(&r), vec!["3:21 Warning tollgate::undeclared-number"]);
    }

    #[test]
    fn a_misspelt_argument_is_an_error_at_its_place() {
        let r = run("@id(\"big\")\nforbid (principal, action == Action::\"pay\", resource)\nwhen { context.args.amonut.greaterThan(decimal(\"100.0\")) };\n");
        assert!(!r.ok());
        let f = &r.findings[0];
        assert_eq!(f.severity, Severity::Error, "{f}");
        let l = f.location.as_ref().unwrap();
        assert_eq!((l.file.as_str(), l.line), ("p.cedar", 3), "{f}");
        assert!(f.to_string().contains("amonut"), "{f}");
        // Tested with has: ours, since Cedar types it false.
        let r = run("@id(\"big\")\nforbid (principal, action == Action::\"pay\", resource)\nwhen { context.args has amonut };\n");
        let f = r
            .findings
            .iter()
            .find(|f| f.code == "tollgate::unknown-argument")
            .unwrap();
        assert_eq!(f.location.as_ref().unwrap().column, 25, "{f}");
        assert!(
            f.help.as_ref().unwrap().contains("did you mean `amount`"),
            "{f}"
        );
    }

    #[test]
    fn an_unknown_tool_is_an_error() {
        let r = run("@id(\"x\")\nforbid (principal, action == Action::\"pya\", resource);\n");
        assert!(!r.ok());
        println!("{:?}", r.all());
        let f = r
            .findings
            .iter()
            .find(|f| f.severity == Severity::Error)
            .unwrap();
        assert_eq!(f.location.as_ref().unwrap().line, 2, "{f}");
        assert!(f.to_string().contains("pya"), "{f}");
    }

    #[test]
    fn a_string_compared_with_a_number_is_an_error() {
        for cond in [
            "context.args.to > 5",
            "context.args.to == 5",
            "context.args.count.lessThan(decimal(\"1.0\"))",
        ] {
            let r = run(&format!("@id(\"x\")\nforbid (principal, action == Action::\"pay\", resource)\nwhen {{ {cond} }};\n"));
            assert!(!r.ok(), "{cond}: {:?}", codes(&r));
            assert_eq!(r.findings[0].location.as_ref().unwrap().line, 3, "{cond}");
        }
    }

    #[test]
    fn a_policy_that_never_matches_is_a_warning() {
        let r = run("@id(\"x\")\nforbid (principal, action == Action::\"pay\", resource)\nwhen { false };\n");
        assert!(r.ok(), "{:?}", codes(&r));
        assert_eq!(codes(&r), vec!["1:1 Warning tollgate::never-matches"]);
    }

    #[test]
    fn unchecked_shapes_give_no_false_error() {
        // `meta` is an open object and `any` a union: not type-checked, no error.
        let r = run("@id(\"x\")\nforbid (principal, action == Action::\"pay\", resource)\nwhen { context.args.meta.whatever == 1 || context.args.any == 3 };\n");
        assert!(r.ok(), "{:?}", r.all());
        assert_eq!(codes(&r), vec!["1:1 Warning tollgate::not-type-checked"]);
        // Names are still checked there.
        let r = run("@id(\"x\")\nforbid (principal, action == Action::\"pay\", resource)\nwhen { context.args.meta.whatever == 1 || context.args.tpo == 3 };\n");
        assert!(!r.ok());
        assert!(
            codes(&r).contains(&"3:56 Error tollgate::unknown-argument".to_owned()),
            "{:?}",
            codes(&r)
        );
    }

    #[test]
    fn tools_files_are_bounded_and_refused_in_words() {
        let parse = |text: &str| parse_tools(&Source::new("t.json", text));
        let one = r#"{"name": "pay", "inputSchema": {"type": "object"}}"#;
        for ok in [
            format!("[{one}]"),
            format!(r#"{{"tools": [{one}]}}"#),
            format!(r#"{{"jsonrpc": "2.0", "id": 1, "result": {{"tools": [{one}]}}}}"#),
        ] {
            assert_eq!(parse(&ok).unwrap().len(), 1, "{ok}");
        }
        let deep = format!(
            "{}{}",
            "[".repeat(MAX_TOOLS_DEPTH + 1),
            "]".repeat(MAX_TOOLS_DEPTH + 1)
        );
        let big = format!("[{}]", " ".repeat(MAX_TOOLS_BYTES));
        let many = format!(
            "[{}]",
            (0..=MAX_TOOLS)
                .map(|i| format!(r#"{{"name": "t{i}", "inputSchema": {{}}}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        for (text, says) in [
            ("{\"tools\": [", "not JSON"),
            ("[1,]", "not JSON"),
            ("{\"a\": 1}", "no tools array"),
            ("\"x\"", "no tools array"),
            ("[{\"inputSchema\": {}}]", "no `name`"),
            ("[{\"name\": \"x\"}]", "no `inputSchema`"),
            ("[{\"name\": \"\", \"inputSchema\": {}}]", "a name is 1 to"),
            (&format!("[{one}, {one}]"), "listed twice"),
            (&deep, "nest deeper than 64"),
            (&big, "a tools file holds at most"),
            (&many, "at most 10000"),
        ] {
            let f = parse(text).unwrap_err();
            assert_eq!(f.code, "tollgate::tools-file");
            assert_eq!(f.file.as_deref(), Some("t.json"));
            assert!(f.message.contains(says), "{says}: {f}");
        }
        let f = parse("[\n  {\"name\": }]").unwrap_err();
        assert_eq!(f.location.as_ref().map(|l| l.line), Some(2), "{f}");
    }

    #[test]
    fn with_an_author_schema_its_declarations_win() {
        let r = run_with_schema(
            "action \"pay\" appliesTo { principal: Agent, resource: Upstream, context: { args: { amount: decimal, currency: String, count: Long, to: String, memo: String } } };\naction \"refund\" appliesTo { principal: Agent, resource: Upstream };\n",
            "@id(\"big\")\nforbid (principal, action == Action::\"pay\", resource)\nwhen { context.args.amount.greaterThan(decimal(\"100.0\")) };\n@id(\"s\")\npermit (principal, action == Action::\"search\", resource) when { context.args.query == \"x\" };\n",
        );
        // `search` is no action of the author's schema: the loader refuses the set (as
        // the gateway would); no number warning (the author declares `amount`); `refund`
        // has no tool; and `memo`, declared required, may be `null` in the tool's calls.
        assert!(r.loaded.is_err());
        assert_eq!(
            codes(&r),
            vec![
                " Warning tollgate::schema-no-tool",
                "1:8 Error tollgate::schema-drift"
            ]
        );
        assert!(
            r.findings[1]
                .message
                .contains("`context.args.memo` of tool `pay` required"),
            "{}",
            r.findings[1].message
        );
    }

    #[test]
    fn an_author_schema_that_drifted_from_the_tools_is_caught() {
        // The set runs with the author's types: each disagreement with what the tool
        // sends would refuse the tool's calls in every policy that reads the argument.
        let r = run_with_schema(
            "type Money = { amount: Long, currency: String };\n\
             action \"search\" appliesTo { principal: Agent, resource: Upstream, context: { args: { query: String, limit?: decimal } } };\n\
             action pay appliesTo { principal: Agent, resource: Upstream,\n\
               context: { args: { amount: Long, count: String, currency: String, to: Money, memo?: String, amonut: decimal, meta: { x: Long } } } };\n",
            "permit (principal, action == Action::\"search\", resource);\n",
        );
        assert!(r.loaded.is_ok(), "{:?}", r.loaded.err());
        let got: Vec<(String, String)> = codes(&r)
            .into_iter()
            .zip(r.findings.iter().map(|f| f.message.clone()))
            .collect();
        let expect = [
            ("Error", "`context.args.amonut` of tool `pay`, but the tool's input schema lists no such argument"),
            ("Warning", "`context.args.amount` of tool `pay` as `Long`, but the tool's input schema says `number`"),
            ("Error", "`context.args.count` of tool `pay` as `String`, but the tool's input schema says `integer`"),
            ("Error", "`context.args.meta` of tool `pay` required, but the tool's input schema makes it optional"),
            ("Error", "`context.args.to` of tool `pay` as a record, but the tool's input schema says `string`"),
        ];
        assert_eq!(got.len(), expect.len(), "{got:#?}");
        for ((code, message), (severity, says)) in got.iter().zip(expect) {
            assert_eq!(
                code,
                &format!("3:8 {severity} tollgate::schema-drift"),
                "{message}"
            );
            assert!(message.contains(says), "{says}: {message}");
        }
        // `memo` optional, `meta.x` a member of an open object, `search` agreeing
        // (`decimal` holds an `integer`): nothing said. Corrected, the schema is clean.
        let r = run_with_schema(
            "action pay appliesTo { principal: Agent, resource: Upstream,\n\
               context: { args: { amount: decimal, count: Long, currency: String, to: String, memo?: String, meta?: { x: Long } } } };\n",
            "permit (principal, action == Action::\"pay\", resource);\n",
        );
        assert!(r.findings.is_empty(), "{:#?}", r.findings);
    }

    #[test]
    fn odd_names_make_a_schema_all_the_same() {
        let odd = vec![
            tool(
                "a \"quoted\" name/with:odd.chars",
                json!({"type": "object", "properties": {"": {"type": "string"}, "with space": {"type": "integer"}, "__entity": {"type": "string"}}, "required": ["with space"]}),
            ),
            tool("ünïcode", json!({"type": "object", "properties": {}})),
        ];
        let r = check(
            &[Source::new(
                "p.cedar",
                "@id(\"x\")\nforbid (principal, action == Action::\"a \\\"quoted\\\" name/with:odd.chars\", resource)\nwhen { context.args[\"with space\"] > 1 };\n",
            )],
            &Options::default(),
            &odd,
        );
        assert!(r.ok(), "{:?}", r.all());
    }

    #[test]
    fn a_value_outside_the_enum_is_a_warning() {
        let r = run("@id(\"x\")\nforbid (principal, action == Action::\"pay\", resource)\nwhen { context.args.currency == \"usd\" };\n@id(\"y\")\nforbid (principal, action == Action::\"pay\", resource)\nunless { \"EUR\" == context.args.currency || context.args.to == \"usd\" };\n");
        assert!(r.ok(), "{:?}", r.all());
        assert_eq!(codes(&r), vec!["3:33 Warning tollgate::outside-enum"]);
        assert!(
            r.findings[0].message.contains("one of \"EUR\", \"USD\""),
            "{}",
            r.findings[0]
        );
        // A set literal that `.contains` the argument: each value outside the enum.
        let r = run("@id(\"z\")\nforbid (principal, action == Action::\"pay\", resource)\nwhen { [\"EUR\", \"gbp\", \"USD\"].contains(context.args.currency) };\n");
        assert!(r.ok(), "{:?}", r.all());
        assert_eq!(codes(&r), vec!["3:16 Warning tollgate::outside-enum"]);
        assert!(
            r.findings[0]
                .message
                .contains("so \"gbp\" in a set that `.contains` it never matches"),
            "{}",
            r.findings[0]
        );
        // A huge set literal is read only up to the walk's bound (1,000 comparisons).
        let many: Vec<String> = (0..5_000).map(|i| format!("\"x{i}\"")).collect();
        let r = run(&format!(
            "@id(\"many\")\nforbid (principal, action == Action::\"pay\", resource)\nwhen {{ [{}].contains(context.args.currency) }};\n",
            many.join(", ")
        ));
        let n = r
            .findings
            .iter()
            .filter(|f| f.code == "tollgate::outside-enum")
            .count();
        assert_eq!(n, 1_000, "{n}");
        // Through a $ref and a nullable union.
        let schema = json!({"type": "object", "properties": {"c": {"anyOf": [{"$ref": "#/$defs/C"}, {"type": "null"}]}}, "$defs": {"C": {"type": "string", "enum": ["a", "b"]}}});
        assert_eq!(
            enum_at(&schema, &["c".to_owned()]),
            Some(vec![json!("a"), json!("b")])
        );
        assert_eq!(enum_at(&schema, &["d".to_owned()]), None);
    }

    #[test]
    fn names_are_found_after_the_annotations() {
        let t = r#"// c
@id("a \") x") @hitl
@label ("l")
permit (principal, action, resource) when { context.args.x };"#;
        let b = body_start(t, 0, t.len());
        assert!(t[b..].starts_with("permit"), "{}", &t[b..]);
        assert_eq!(find_key(t, 0, t.len(), "x"), t.find("x }"));
    }

    #[test]
    fn shadow_policies_are_checked_too() {
        let r = run("@id(\"trial\") @shadow\nforbid (principal, action == Action::\"pay\", resource)\nwhen { context.args.amonut.greaterThan(decimal(\"1.0\")) };\n");
        assert!(r.loaded.is_ok(), "{:?}", r.all());
        assert!(!r.ok());
        assert_eq!(codes(&r), vec!["3:8 Error tollgate::unknown-argument"]);
    }

    #[test]
    fn unnamed_policies_have_the_loaders_ids_and_their_own_file() {
        let r = check(
            &[
                Source::new("a.cedar", "forbid (principal, action == Action::\"pay\", resource);\n"),
                Source::new(
                    "b.cedar",
                    "\n\nforbid (principal, action == Action::\"search\", resource)\nwhen { context.args.qeury == \"x\" };\n",
                ),
            ],
            &Options::default(),
            &tools(),
        );
        let f = r
            .findings
            .iter()
            .find(|f| f.severity == Severity::Error)
            .unwrap();
        let l = f.location.as_ref().unwrap();
        assert_eq!((l.file.as_str(), l.line), ("b.cedar", 4), "{f}");
        assert!(f.message.contains("policy `policy1`"), "{f}");
        // The loader's own warnings name the same ids.
        assert!(r
            .all()
            .iter()
            .any(|w| w.code == "tollgate::no-id" && w.message.contains("policy1")));
    }
}
