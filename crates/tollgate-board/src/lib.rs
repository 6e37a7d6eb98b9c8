//! # tollgate-board: the agentic board gate
//!
//! Validates a record set of handoff envelopes (`{"messages": [...]}`) exchanged between board
//! agents and the human principals who decide, and reports **every** violation with a stable
//! rule id (`HO-*`, `CH-*`, `DR-*`, `DRC-*`, `STOP-*`) and the task ids involved. It also
//! computes the canonical request digest that binds a decision-record to its request.
//!
//! The pipeline is: strict bounded parse ([`tollgate_core::json`]) -> the shipped JSON Schema
//! ([`schema`]) -> typed envelopes ([`model`]) -> one index of the record set ([`index`]) ->
//! one named check per rule ([`checks`]). Shape errors stop the pipeline after the schema
//! step: cross-message rules over a malformed record set would report noise.
//!
//! What this crate does **not** do: no I/O (the CLI reads files), no clock (time order is the
//! envelopes' own `sent_at`), no randomness, no threads. It does not authenticate senders,
//! resolve evidence references or prove that an approval happened: a clean record set is
//! well-formed and internally consistent, nothing more. No input panics it; every input is
//! bounded ([`Limits`]).

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod canary;
pub mod catalog;
pub mod checks;
pub mod index;
pub mod model;
pub mod rules;
pub mod schema;

use std::sync::OnceLock;

use tollgate_core::json::{self, Value};

pub use catalog::{Catalog, CatalogError, ExecutionTier};
pub use rules::RuleId;

/// Bounds on one record set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum input size in bytes.
    pub max_bytes: usize,
    /// Maximum number of envelopes.
    pub max_messages: usize,
}

/// Nesting deeper than this is HO-SCHEMA (the outermost container is level 1).
pub const MAX_DEPTH: usize = 32;

impl Default for Limits {
    /// 64 MiB and 100,000 envelopes: room for ten times the 10,000-envelope benchmark.
    fn default() -> Self {
        Limits {
            max_bytes: 64 * 1024 * 1024,
            max_messages: 100_000,
        }
    }
}

/// One violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The rule broken.
    pub rule: RuleId,
    /// The envelope the finding is about, if any (`-` when printed without one).
    pub task_id: Option<String>,
    /// What is wrong, naming the fields and any other task ids involved.
    pub message: String,
}

/// Every violation in one record set, sorted by rule id (as printed), then task id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The findings.
    pub findings: Vec<Finding>,
}

impl Report {
    /// Whether the record set is clean.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// Whether any finding has this rule id.
    pub fn has(&self, rule: RuleId) -> bool {
        self.findings.iter().any(|f| f.rule == rule)
    }

    fn sort(&mut self) {
        self.findings.sort_by(|a, b| {
            (a.rule.as_str(), &a.task_id, &a.message).cmp(&(
                b.rule.as_str(),
                &b.task_id,
                &b.message,
            ))
        });
        self.findings.dedup();
    }
}

fn envelope_schema() -> Result<&'static schema::Schema, &'static schema::SchemaError> {
    static CELL: OnceLock<Result<schema::Schema, schema::SchemaError>> = OnceLock::new();
    CELL.get_or_init(schema::Schema::envelope).as_ref()
}

fn schema_finding(task_id: Option<String>, message: String) -> Finding {
    Finding {
        rule: RuleId::HoSchema,
        task_id,
        message,
    }
}

/// HO-SCHEMA: the record set is strict JSON within the bounds, an object whose `messages` is
/// a non-empty array of objects, each matching the shipped envelope schema and digestable.
///
/// Returns the typed envelopes with their raw values, or every shape finding.
pub fn ho_schema(input: &[u8], limits: Limits) -> Result<Vec<model::Envelope>, Vec<Finding>> {
    let doc = json::parse(
        input,
        json::Limits {
            max_bytes: limits.max_bytes,
            max_depth: MAX_DEPTH,
        },
    )
    .map_err(|e| {
        vec![schema_finding(
            None,
            format!("not a strict JSON record set: {e}"),
        )]
    })?;
    let Value::Object(top) = &doc else {
        return Err(vec![schema_finding(
            None,
            format!(
                "the record set is a JSON {}, not an object",
                doc.type_name()
            ),
        )]);
    };
    let mut findings = Vec::new();
    for k in top.keys().filter(|k| k.as_str() != "messages") {
        findings.push(schema_finding(
            None,
            format!("unknown top-level field `{k}`"),
        ));
    }
    let messages = match top.get("messages") {
        None => {
            findings.push(schema_finding(None, "missing `messages` array".to_owned()));
            return Err(findings);
        }
        Some(Value::Array(m)) if m.is_empty() => {
            findings.push(schema_finding(None, "`messages` is empty".to_owned()));
            return Err(findings);
        }
        Some(Value::Array(m)) => m,
        Some(other) => {
            findings.push(schema_finding(
                None,
                format!("`messages` is a {}, not an array", other.type_name()),
            ));
            return Err(findings);
        }
    };
    if messages.len() > limits.max_messages {
        findings.push(schema_finding(
            None,
            format!(
                "{} messages, over the limit of {}",
                messages.len(),
                limits.max_messages
            ),
        ));
        return Err(findings);
    }
    let schema = match envelope_schema() {
        Ok(s) => s,
        Err(e) => {
            findings.push(schema_finding(None, format!("internal: {e}")));
            return Err(findings);
        }
    };
    let mut envelopes = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let task_id = m.get("task_id").and_then(Value::as_str).map(short);
        let errors = schema.validate(m, &format!("/messages/{i}"));
        if !errors.is_empty() {
            for e in errors {
                findings.push(schema_finding(task_id.clone(), e));
            }
            continue;
        }
        match model::envelope(m) {
            Ok(e) => envelopes.push(e),
            Err(e) => findings.push(schema_finding(task_id, format!("/messages/{i}: {e}"))),
        }
    }
    if findings.is_empty() {
        Ok(envelopes)
    } else {
        Err(findings)
    }
}

/// Keep task ids from hostile input short in messages and output.
fn short(s: &str) -> String {
    if s.chars().count() > 64 {
        let c: String = s.chars().take(64).collect();
        format!("{c}...")
    } else {
        s.to_owned()
    }
}

/// Check one record set with the default [`Limits`].
pub fn check(input: &[u8], catalog: &Catalog) -> Report {
    check_with(input, catalog, Limits::default())
}

/// Check one record set: every violation of every rule, sorted.
pub fn check_with(input: &[u8], catalog: &Catalog, limits: Limits) -> Report {
    let mut report = Report::default();
    match ho_schema(input, limits) {
        Err(findings) => report.findings = findings,
        Ok(envelopes) => {
            let ctx = index::Ctx::new(&envelopes, catalog);
            for (_, check) in checks::CHECKS {
                check(&ctx, &mut report.findings);
            }
        }
    }
    report.sort();
    report
}

/// Why an envelope could not be digested.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    /// Not strict JSON within the bounds.
    #[error("not strict JSON: {0}")]
    Json(#[from] json::ParseError),
    /// The document is not a JSON object.
    #[error("an envelope is a JSON object, not a {0}")]
    NotObject(&'static str),
    /// A number that has no canonical form (it overflowed to infinity).
    #[error("a number in the envelope has no canonical form")]
    NonFinite,
}

/// The request digest of one envelope: `sha256:` and the lowercase hex SHA-256 of its
/// canonical JSON (Python's `json.dumps(sort_keys=True, separators=(",", ":"),
/// ensure_ascii=False)`, byte for byte).
pub fn digest(input: &[u8]) -> Result<String, DigestError> {
    let v = json::parse(
        input,
        json::Limits {
            max_bytes: Limits::default().max_bytes,
            max_depth: MAX_DEPTH,
        },
    )?;
    if !matches!(v, Value::Object(_)) {
        return Err(DigestError::NotObject(v.type_name()));
    }
    let d = json::canonical_hash(&v).map_err(|_| DigestError::NonFinite)?;
    Ok(format!("sha256:{d}"))
}
