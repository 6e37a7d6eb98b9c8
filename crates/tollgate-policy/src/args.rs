//! A call's params as Cedar values: `context.args`.
//!
//! JSON → Cedar: an object is a record, an array a set, a string a string, a boolean a
//! boolean, a number as [`crate::number`] says. An object member whose value is `null` is
//! left out (so `context.args has x` is false for `"x": null`); Cedar has no null, so a
//! `null` inside an array cannot be represented. Records are built directly from the
//! parsed value, never through Cedar's JSON entity format, so an argument spelled
//! `{"__entity": ...}` or `{"__extn": ...}` is an ordinary record, not an entity reference
//! or an extension value an agent could forge.
//!
//! Whatever cannot be represented is replaced by an empty record and its **path** (the
//! keys from `args` down to it, stopping at the first array, since a policy cannot index a
//! set) is recorded; every policy that reads a path that overlaps it fails closed.

use std::collections::BTreeMap;

use tollgate_core::json::Value;

use crate::model::{CedarValue, Names};
use crate::number::{map_number, CedarNumber, NumberType, Unrepresentable};

/// The most JSON values (objects, arrays and scalars together) one call's args may hold;
/// past that, the whole of `args` is unrepresentable.
pub const MAX_ARG_VALUES: usize = 16_384;

/// A path below `context.args`: `["payment", "amount"]` is `context.args.payment.amount`.
pub type ArgPath = Vec<String>;

/// Why part of the args has no Cedar value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArgIssue {
    /// A number (see [`Unrepresentable`]).
    Number(Unrepresentable),
    /// A `null` inside an array.
    NullInArray,
    /// A string, boolean, list or object where the schema declares a number, or a number
    /// where it declares something else.
    TypeMismatch,
    /// More than [`MAX_ARG_VALUES`] values in all.
    TooLarge,
}

impl ArgIssue {
    /// A stable lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ArgIssue::Number(u) => u.as_str(),
            ArgIssue::NullInArray => "null_in_array",
            ArgIssue::TypeMismatch => "type_mismatch",
            ArgIssue::TooLarge => "too_large",
        }
    }
}

/// What a schema says about the shape of an argument, as far as number mapping needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Shape {
    /// Nothing (not declared, or a type that holds no numbers).
    #[default]
    Unknown,
    /// A number of this type.
    Number(NumberType),
    /// A string or boolean: a number here is a type mismatch.
    NotNumber,
    /// A record with these attributes.
    Record(BTreeMap<String, Shape>),
    /// A set of this.
    Set(Box<Shape>),
}

/// `context.args` for one call.
#[derive(Debug)]
pub struct Args {
    /// The record.
    pub value: CedarValue,
    /// The paths that could not be represented, with why.
    pub issues: Vec<(ArgPath, ArgIssue)>,
}

/// Convert params (a JSON object; anything else is an empty record with the root path
/// unrepresentable) under `shape`.
pub(crate) fn to_cedar(params: &Value, shape: &Shape, names: &Names) -> Args {
    let mut cx = Cx {
        names,
        budget: MAX_ARG_VALUES,
        issues: Vec::new(),
        path: Vec::new(),
        path_frozen: 0,
    };
    let value = match params {
        Value::Object(_) => cx.value(params, shape),
        _ => {
            cx.issue(ArgIssue::TypeMismatch);
            empty_record()
        }
    };
    if cx.budget == 0 && cx.issues.iter().any(|(_, i)| *i == ArgIssue::TooLarge) {
        return Args {
            value: empty_record(),
            issues: vec![(Vec::new(), ArgIssue::TooLarge)],
        };
    }
    Args {
        value,
        issues: cx.issues,
    }
}

fn empty_record() -> CedarValue {
    CedarValue::empty_record(None)
}

struct Cx<'n> {
    names: &'n Names,
    budget: usize,
    issues: Vec<(ArgPath, ArgIssue)>,
    /// The keys from `args` to the value being converted.
    path: Vec<String>,
    /// How many levels of arrays enclose the value: while positive, `path` is frozen at
    /// the array (a policy cannot look inside a set by key).
    path_frozen: usize,
}

impl Cx<'_> {
    fn issue(&mut self, issue: ArgIssue) {
        let path = self.path.clone();
        if !self.issues.iter().any(|(p, i)| *p == path && *i == issue) {
            self.issues.push((path, issue));
        }
    }

    fn value(&mut self, v: &Value, shape: &Shape) -> CedarValue {
        if self.budget == 0 {
            self.issue(ArgIssue::TooLarge);
            return empty_record();
        }
        self.budget -= 1;
        match v {
            Value::Null => {
                self.issue(ArgIssue::NullInArray);
                empty_record()
            }
            Value::Bool(b) => self.scalar(shape, CedarValue::from(*b)),
            Value::String(s) => self.scalar(shape, CedarValue::from(s.as_str())),
            Value::Number(n) => {
                let declared = match shape {
                    Shape::Number(t) => Some(*t),
                    Shape::Unknown => None,
                    _ => {
                        self.issue(ArgIssue::TypeMismatch);
                        return empty_record();
                    }
                };
                match map_number(n, declared) {
                    Ok(CedarNumber::Long(i)) => CedarValue::from(i),
                    Ok(CedarNumber::Decimal(scaled)) => {
                        match self.names.decimal(CedarNumber::decimal_text(scaled)) {
                            Some(d) => d,
                            // The text is always one decimal takes; if Cedar refused it,
                            // the number is unrepresentable rather than wrong.
                            None => {
                                self.issue(ArgIssue::Number(Unrepresentable::OutOfRange));
                                empty_record()
                            }
                        }
                    }
                    Err(u) => {
                        self.issue(ArgIssue::Number(u));
                        empty_record()
                    }
                }
            }
            Value::Array(items) => {
                let inner = match shape {
                    Shape::Set(s) => s.as_ref().clone(),
                    Shape::Unknown => Shape::Unknown,
                    _ => {
                        self.issue(ArgIssue::TypeMismatch);
                        return empty_record();
                    }
                };
                self.path_frozen += 1;
                let members: Vec<CedarValue> =
                    items.iter().map(|i| self.value(i, &inner)).collect();
                self.path_frozen -= 1;
                CedarValue::set(members, None)
            }
            Value::Object(map) => {
                let attrs = match shape {
                    Shape::Record(a) => Some(a),
                    Shape::Unknown => None,
                    _ => {
                        self.issue(ArgIssue::TypeMismatch);
                        return empty_record();
                    }
                };
                let mut fields = Vec::with_capacity(map.len());
                for (k, member) in map {
                    if member.is_null() {
                        continue;
                    }
                    let member_shape = attrs.and_then(|a| a.get(k)).cloned().unwrap_or_default();
                    let pushed = self.path_frozen == 0;
                    if pushed {
                        self.path.push(k.clone());
                    }
                    let converted = self.value(member, &member_shape);
                    if pushed {
                        self.path.pop();
                    }
                    fields.push((k.clone(), converted));
                }
                // An object's keys are unique (it is a map), so the record holds every
                // member.
                CedarValue::record(fields, None)
            }
        }
    }

    fn scalar(&mut self, shape: &Shape, e: CedarValue) -> CedarValue {
        match shape {
            Shape::Unknown | Shape::NotNumber => e,
            _ => {
                self.issue(ArgIssue::TypeMismatch);
                empty_record()
            }
        }
    }
}

/// Whether a policy that reads `read` sees the value at `issue`: one path is a prefix of
/// the other (reading `payment` reads `payment.amount`; reading `payment.amount` reads the
/// whole of an unrepresentable `payment`).
pub fn overlaps(read: &[String], issue: &[String]) -> bool {
    let n = read.len().min(issue.len());
    read.get(..n) == issue.get(..n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::json::parse_str;

    fn issues(text: &str, shape: &Shape) -> Vec<(ArgPath, ArgIssue)> {
        to_cedar(&parse_str(text).unwrap(), shape, &Names::new().unwrap()).issues
    }

    fn p(keys: &[&str]) -> ArgPath {
        keys.iter().map(|k| (*k).to_owned()).collect()
    }

    #[test]
    fn issues_name_the_path_and_stop_at_arrays() {
        assert!(issues(
            r#"{"a":1,"b":"x","c":[true,2.5],"d":null}"#,
            &Shape::Unknown
        )
        .is_empty());
        assert_eq!(
            issues(r#"{"pay":{"amount":0.12345,"ok":1}}"#, &Shape::Unknown),
            vec![(
                p(&["pay", "amount"]),
                ArgIssue::Number(Unrepresentable::TooPrecise)
            )]
        );
        assert_eq!(
            issues(r#"{"items":[{"n":1e300}],"z":[null]}"#, &Shape::Unknown),
            vec![
                (p(&["items"]), ArgIssue::Number(Unrepresentable::OutOfRange)),
                (p(&["z"]), ArgIssue::NullInArray)
            ]
        );
        assert_eq!(
            issues("[1]", &Shape::Unknown),
            vec![(p(&[]), ArgIssue::TypeMismatch)]
        );
    }

    #[test]
    fn the_schema_types_numbers_and_catches_mismatches() {
        let mut attrs = BTreeMap::new();
        attrs.insert("amount".to_owned(), Shape::Number(NumberType::Long));
        attrs.insert("name".to_owned(), Shape::NotNumber);
        let shape = Shape::Record(attrs);
        assert!(issues(r#"{"amount":3,"name":"x","other":2.5}"#, &shape).is_empty());
        assert_eq!(
            issues(r#"{"amount":3.5,"name":4}"#, &shape),
            vec![
                (
                    p(&["amount"]),
                    ArgIssue::Number(Unrepresentable::NotAnInteger)
                ),
                (p(&["name"]), ArgIssue::TypeMismatch)
            ]
        );
    }

    #[test]
    fn too_many_values_make_all_of_args_unrepresentable() {
        let big = format!("{{\"a\":[{}]}}", vec!["1"; MAX_ARG_VALUES].join(","));
        assert_eq!(
            issues(&big, &Shape::Unknown),
            vec![(p(&[]), ArgIssue::TooLarge)]
        );
        let fits = format!("{{\"a\":[{}]}}", vec!["1"; MAX_ARG_VALUES - 2].join(","));
        assert!(issues(&fits, &Shape::Unknown).is_empty());
    }

    #[test]
    fn overlap_is_a_prefix_either_way() {
        assert!(overlaps(&p(&[]), &p(&["a"])));
        assert!(overlaps(&p(&["a"]), &p(&["a", "b"])));
        assert!(overlaps(&p(&["a", "b"]), &p(&["a"])));
        assert!(!overlaps(&p(&["a", "c"]), &p(&["a", "b"])));
        assert!(!overlaps(&p(&["b"]), &p(&["a"])));
    }
}
