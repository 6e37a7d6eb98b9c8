//! Export verified entries for auditors: JSON Lines or CSV, filtered by session, time
//! and verdict. Pure: entries in, text out.

use std::fmt::Write as _;

use tollgate_core::Verdict;

use crate::entry::{AuditEntry, Event};
use crate::files::rfc3339;
use crate::keys::{hex, KeyId};

/// Which entries to export. Filters on session or verdict select verdict entries only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this session.
    pub session: Option<String>,
    /// Only entries at or after this time (ns since the epoch).
    pub since_ns: Option<i64>,
    /// Only entries before this time (ns since the epoch).
    pub until_ns: Option<i64>,
    /// Only this verdict.
    pub verdict: Option<Verdict>,
}

impl Filter {
    /// Whether the entry passes.
    pub fn matches(&self, e: &AuditEntry) -> bool {
        if self.since_ns.is_some_and(|t| e.timestamp_ns < t) {
            return false;
        }
        if self.until_ns.is_some_and(|t| e.timestamp_ns >= t) {
            return false;
        }
        match &e.event {
            Event::Verdict(v) => {
                self.session.as_ref().is_none_or(|s| *s == v.session_id)
                    && self.verdict.is_none_or(|x| x == v.verdict)
            }
            Event::KeyHandover { .. } | Event::Recovery { .. } => {
                self.session.is_none() && self.verdict.is_none()
            }
        }
    }
}

/// The export columns, in order (CSV header and JSON keys).
pub const COLUMNS: &[&str] = &[
    "index",
    "entry_id",
    "time",
    "timestamp_ns",
    "kind",
    "session_id",
    "agent_id",
    "organization_id",
    "call_number",
    "tool_name",
    "params_hash",
    "verdict",
    "deny_reason",
    "reason",
    "probabilistic",
    "budget_before_usd",
    "budget_after_usd",
    "estimated_cost_usd",
    "nonce",
    "operator_id",
    "config_digest",
    "detail",
    "key_id",
    "prev_hash",
    "signature",
];

/// A cell: text, number, boolean, or absent.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cell {
    Text(String),
    Num(String),
    Bool(bool),
    Null,
}

fn cells(e: &AuditEntry) -> Vec<Cell> {
    let t = |s: &str| Cell::Text(s.to_owned());
    let n = |x: &dyn std::fmt::Display| Cell::Num(x.to_string());
    let mut row = vec![
        n(&e.index),
        t(&e.entry_id.to_string()),
        t(&rfc3339(e.timestamp_ns)),
        n(&e.timestamp_ns),
        t(e.event.kind_name()),
    ];
    match &e.event {
        Event::Verdict(v) => row.extend([
            t(&v.session_id),
            t(&v.agent_id),
            t(&v.organization_id),
            n(&v.call_number),
            t(&v.tool_name),
            t(&v.params_hash.to_string()),
            t(v.verdict.as_str()),
            v.deny_reason.map_or(Cell::Null, |d| t(d.as_str())),
            t(v.reason.as_str()),
            Cell::Bool(v.probabilistic),
            // Exact decimal dollars, as text so no float rounding creeps in.
            t(&v.budget_before.to_string()),
            t(&v.budget_after.to_string()),
            t(&v.estimated_cost.to_string()),
            n(&v.nonce),
            v.operator_id.as_deref().map_or(Cell::Null, t),
            v.config_digest.map_or(Cell::Null, |d| t(&d.to_string())),
            Cell::Null,
        ]),
        Event::KeyHandover { new_public_key } => {
            row.extend(std::iter::repeat_n(Cell::Null, 16));
            row.push(t(&format!(
                "new key {} ({})",
                KeyId::of(new_public_key),
                hex(new_public_key)
            )));
        }
        Event::Recovery {
            file,
            offset,
            length,
            sha256,
            moved_to,
        } => {
            row.extend(std::iter::repeat_n(Cell::Null, 16));
            row.push(t(&format!(
                "torn tail of {length} bytes at offset {offset} of {file} (sha256 {sha256}) moved to {moved_to}"
            )));
        }
    }
    row.extend([
        t(&e.key_id.to_string()),
        t(&e.prev_hash.to_string()),
        t(&hex(&e.signature)),
    ]);
    row
}

/// One JSON object (no trailing newline), keys in [`COLUMNS`] order.
pub fn to_json_line(e: &AuditEntry) -> String {
    let mut out = String::from("{");
    for (i, (k, c)) in COLUMNS.iter().zip(cells(e)).enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_str(&mut out, k);
        out.push(':');
        match c {
            Cell::Text(s) => json_str(&mut out, &s),
            Cell::Num(s) => out.push_str(&s),
            Cell::Bool(b) => out.push_str(if b { "true" } else { "false" }),
            Cell::Null => out.push_str("null"),
        }
    }
    out.push('}');
    out
}

/// The CSV header line (no line end).
pub fn csv_header() -> String {
    COLUMNS.join(",")
}

/// One CSV row (RFC 4180 quoting, no line end).
pub fn to_csv_row(e: &AuditEntry) -> String {
    let mut out = String::new();
    for (i, c) in cells(e).into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match c {
            Cell::Text(s) => csv_field(&mut out, &s),
            Cell::Num(s) => out.push_str(&s),
            Cell::Bool(b) => out.push_str(if b { "true" } else { "false" }),
            Cell::Null => {}
        }
    }
    out
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn csv_field(out: &mut String, s: &str) {
    // Text that a spreadsheet would run as a formula (= + @, or - not before a digit)
    // is prefixed with ' inside the quotes.
    let guarded = s.starts_with(['=', '+', '@'])
        || (s.starts_with('-')
            && !s
                .get(1..2)
                .is_some_and(|c| c.starts_with(|d: char| d.is_ascii_digit())));
    if guarded || s.contains([',', '"', '\n', '\r']) {
        out.push('"');
        if guarded {
            out.push('\'');
        }
        out.push_str(&s.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(s);
    }
}
