//! An author's schema against the tools it describes (`tollgate::schema-drift`).
//!
//! With an author schema the set runs with the author's argument types, not the tools'
//! ([`super::check`] merges them, the author's winning), so a schema that has drifted from
//! the tool makes calls the tool accepts fail closed at run time: every policy that reads
//! an argument declared `Long` where the tool sends a string, or one declared required that
//! the tool leaves out, is refused (`policy_error`). For every tool the author's schema
//! declares, its `args` are compared with the type derived from the tool's input schema:
//!
//! - a different type (`Long` against a JSON Schema `string`, a record against a scalar,
//!   an entity or an extension type other than `decimal` against anything a JSON value
//!   is): an error;
//! - an argument the tool's (closed) input schema does not list: an error (a policy that
//!   reads it reads nothing the tool sends);
//! - an argument declared required that the tool makes optional (not `required`, or
//!   `null` allowed): an error (a call without it fails every policy that reads it);
//! - `Long` where the tool says `number` (a fraction would be refused): a warning.
//!
//! Nothing is said where the derived type is unchecked, of an open object's undeclared
//! members, nor of the tool's arguments the author leaves out (a schema may declare only
//! what its policies read, and undeclared arguments are still in `context.args`).
//! `decimal` where the tool says `integer` is fine (an integer maps to a decimal).

use serde_json::{Map, Value as Json};

use super::{Rec, Ty};
use crate::load::{line_col, Location, Severity, Source};

/// How deep the comparison goes (common types followed count).
const MAX_DEPTH: usize = 32;

/// One disagreement, before it becomes a finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Drift {
    pub severity: Severity,
    pub message: String,
}

/// A type of the author's schema, resolved through its common types.
#[derive(Debug)]
enum Author<'a> {
    Long,
    Decimal,
    String,
    Bool,
    Set(&'a Json),
    /// Its attributes.
    Record(Option<&'a Map<String, Json>>),
    /// An entity type or another extension type: what no JSON value maps to.
    Other(String),
    /// Not resolved (too deep, or a shape this reader does not know): nothing is said.
    Unknown,
}

struct Cx<'a> {
    common: Option<&'a Map<String, Json>>,
    tool: &'a str,
    out: Vec<Drift>,
}

fn resolve<'a>(t: &'a Json, common: Option<&'a Map<String, Json>>, depth: usize) -> Author<'a> {
    if depth > MAX_DEPTH {
        return Author::Unknown;
    }
    let kind = t.get("type").and_then(Json::as_str).unwrap_or("");
    let named = |n: &str| -> Author<'a> {
        let n = n.strip_prefix("__cedar::").unwrap_or(n);
        match common.and_then(|c| c.get(n)) {
            Some(def) => resolve(def, common, depth + 1),
            None => match n {
                "Long" => Author::Long,
                "decimal" => Author::Decimal,
                "String" => Author::String,
                "Bool" | "Boolean" => Author::Bool,
                other => Author::Other(other.to_owned()),
            },
        }
    };
    match kind {
        "Record" => Author::Record(t.get("attributes").and_then(Json::as_object)),
        "Set" => t.get("element").map_or(Author::Unknown, Author::Set),
        "Long" => Author::Long,
        "String" => Author::String,
        "Boolean" => Author::Bool,
        "Entity" => Author::Other(
            t.get("name")
                .and_then(Json::as_str)
                .unwrap_or("an entity")
                .to_owned(),
        ),
        "Extension" | "EntityOrCommon" => named(t.get("name").and_then(Json::as_str).unwrap_or("")),
        "" => Author::Unknown,
        other => named(other),
    }
}

fn tool_type(t: &Ty) -> &'static str {
    match t {
        Ty::Long => "`integer`",
        Ty::Decimal => "`number`",
        Ty::String => "`string`",
        Ty::Bool => "`boolean`",
        Ty::Set(_) => "an array",
        Ty::Record(_) => "an object",
        Ty::Unchecked(_) => "unchecked",
    }
}

fn author_type(a: &Author<'_>) -> String {
    match a {
        Author::Long => "`Long`".into(),
        Author::Decimal => "`decimal`".into(),
        Author::String => "`String`".into(),
        Author::Bool => "`Bool`".into(),
        Author::Set(_) => "a `Set`".into(),
        Author::Record(_) => "a record".into(),
        Author::Other(n) => format!("`{n}`"),
        Author::Unknown => "unknown".into(),
    }
}

impl Cx<'_> {
    fn push(&mut self, severity: Severity, message: String) {
        self.out.push(Drift { severity, message });
    }

    fn compare(&mut self, author: &Json, tool: &Ty, path: &str, depth: usize) {
        if matches!(tool, Ty::Unchecked(_)) || depth > MAX_DEPTH {
            return;
        }
        let a = resolve(author, self.common, depth);
        let name = self.tool;
        match (&a, tool) {
            (Author::Unknown, _)
            | (Author::Long, Ty::Long)
            | (Author::Decimal, Ty::Decimal | Ty::Long)
            | (Author::String, Ty::String)
            | (Author::Bool, Ty::Bool) => {}
            (Author::Long, Ty::Decimal) => self.push(
                Severity::Warning,
                format!(
                    "the schema declares `{path}` of tool `{name}` as `Long`, but the tool's input schema says `number`: a call with a fraction (`2.5`) would fail every policy that reads it; declare it `decimal`"
                ),
            ),
            (Author::Set(e), Ty::Set(t)) => self.compare(e, t, &format!("{path}[]"), depth + 1),
            (Author::Record(attrs), Ty::Record(r)) => self.record(*attrs, r, path, depth),
            _ => self.push(
                Severity::Error,
                format!(
                    "the schema declares `{path}` of tool `{name}` as {}, but the tool's input schema says {}: every policy that reads it would fail on the tool's calls (`policy_error`)",
                    author_type(&a),
                    tool_type(tool)
                ),
            ),
        }
    }

    fn record(&mut self, attrs: Option<&Map<String, Json>>, r: &Rec, path: &str, depth: usize) {
        let name = self.tool;
        for (k, decl) in attrs.into_iter().flatten() {
            let at = format!("{path}.{k}");
            match r.attrs.get(k) {
                None if r.open => {}
                None => self.push(
                    Severity::Error,
                    format!(
                        "the schema declares `{at}` of tool `{name}`, but the tool's input schema lists no such argument: a policy that reads it reads nothing the tool sends"
                    ),
                ),
                Some(attr) => {
                    let required = decl.get("required").and_then(Json::as_bool).unwrap_or(true);
                    if required && !attr.required && !matches!(attr.ty, Ty::Unchecked(_)) {
                        self.push(
                            Severity::Error,
                            format!(
                                "the schema declares `{at}` of tool `{name}` required, but the tool's input schema makes it optional (not `required`, or `null` allowed): a call without it would fail every policy that reads it; declare it optional (`{k}?`)"
                            ),
                        );
                    }
                    self.compare(decl, &attr.ty, &at, depth + 1);
                }
            }
        }
    }
}

/// How the author's declaration of `tool` (its action, in the schema's JSON form)
/// disagrees with `derived`, the type of its arguments from its input schema.
pub(super) fn drift(
    action: &Json,
    common: Option<&Map<String, Json>>,
    tool: &str,
    derived: &Ty,
) -> Vec<Drift> {
    let mut cx = Cx {
        common,
        tool,
        out: Vec::new(),
    };
    // No `args` declared: the record is empty, so nothing can disagree.
    if let Some(args) = action.pointer("/appliesTo/context/attributes/args") {
        cx.compare(args, derived, "context.args", 0);
    }
    cx.out
}

/// Where `tool`'s declaration is in the schema's text: `action "NAME"`, else `action NAME`
/// (the whole name, not the start of a longer one), else its quoted name anywhere.
pub(super) fn place(schema: &Source, tool: &str) -> (Option<String>, Option<Location>) {
    let text = schema.text.as_str();
    let quoted = format!("\"{tool}\"");
    let after_action = |i: usize| {
        text.get(..i)
            .is_some_and(|b| b.trim_end().ends_with("action"))
    };
    let whole = |i: usize| {
        text.get(i + tool.len()..)
            .and_then(|r| r.chars().next())
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    };
    let at = text
        .match_indices(&quoted)
        .map(|(i, _)| i)
        .find(|&i| after_action(i))
        .or_else(|| {
            (!tool.is_empty())
                .then(|| {
                    text.match_indices(tool)
                        .map(|(i, _)| i)
                        .find(|&i| after_action(i) && whole(i))
                })
                .flatten()
        })
        .or_else(|| text.find(&quoted));
    let location = at.map(|i| {
        let (line, column) = line_col(text, i);
        Location {
            file: schema.name.clone(),
            line,
            column,
        }
    });
    (Some(schema.name.clone()), location)
}

#[cfg(test)]
mod tests {
    use super::place;
    use crate::load::Source;

    fn line(text: &str, tool: &str) -> Option<usize> {
        let s = Source {
            name: "s".into(),
            text: text.into(),
        };
        place(&s, tool).1.map(|l| l.line)
    }

    #[test]
    fn a_declaration_is_found_by_its_own_action_not_a_mention_or_a_longer_name() {
        let text = "action payment appliesTo {};\naction \"refund\" in [\"pay\"];\naction pay appliesTo {};\n";
        assert_eq!(line(text, "pay"), Some(3));
        assert_eq!(line(text, "payment"), Some(1));
        assert_eq!(line(text, "refund"), Some(2));
        let quoted = "action \"refund\" in [\"pay\"];\naction \"pay\" appliesTo {};\n";
        assert_eq!(line(quoted, "pay"), Some(2));
        // Declared in a list: its quoted name anywhere, else nowhere.
        assert_eq!(line("action a, \"b\";", "b"), Some(1));
        assert_eq!(line("action a, b;", "b"), None);
    }
}
