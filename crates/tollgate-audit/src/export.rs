//! Export verified entries for auditors: JSON Lines or CSV, filtered by session, time
//! and verdict. Pure: entries in, text out.

use std::fmt::Write as _;

use tollgate_core::{Digest, Money, Verdict};

use crate::entry::{AuditEntry, Event, SessionEvent, VerdictRecord};
use crate::files::rfc3339;
use crate::keys::{hex, KeyId};

/// Which entries to export. A session filter selects the session events (every kind
/// but hand-overs and recoveries) of that session; a verdict filter selects verdict
/// entries only.
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
            Event::Session(ev) => {
                self.session.as_ref().is_none_or(|s| s == ev.session_id())
                    && self.verdict.is_none_or(|x| match ev {
                        SessionEvent::Verdict(v) => x == v.verdict,
                        _ => false,
                    })
            }
            Event::Void(v) => {
                self.session.as_ref().is_none_or(|s| *s == v.session_id) && self.verdict.is_none()
            }
            Event::KeyHandover { .. } | Event::Recovery { .. } | Event::PolicySet(_) => {
                self.session.is_none() && self.verdict.is_none()
            }
        }
    }
}

/// The export columns, in order (CSV header and JSON keys). Every entry has every
/// column; a column that does not apply to the entry's kind is empty (CSV) or `null`
/// (JSON). docs/audit-format.md ("Export") says which kinds fill which columns.
pub const COLUMNS: &[&str] = &[
    "index",
    "chain_id",
    "entry_id",
    "time",
    "timestamp_ns",
    "kind",
    "session_id",
    "agent_id",
    "organization_id",
    "session_seq",
    "call_number",
    "tool_name",
    "params_hash",
    "verdict",
    "deny_reason",
    "reason",
    "probabilistic",
    "budget_before_usd",
    "budget_after_usd",
    "budget_version",
    "estimated_cost_usd",
    "nonce",
    "operator_id",
    "config_digest",
    "budget_scope",
    "budget_initial_usd",
    "config",
    "success",
    "reported_cost_bits",
    "reported_cost",
    "cost_status",
    "actual_cost_usd",
    "reserved",
    "charged_usd",
    "error_signal",
    "decision",
    "note",
    "original_nonce",
    "original_args_digest",
    "successor_nonce",
    "successor_args_digest",
    "budget_remaining_usd",
    "new_public_key",
    "new_key_id",
    "recovery_file",
    "recovery_offset",
    "recovery_length",
    "recovery_sha256",
    "recovery_moved_to",
    "void_chain_id",
    "revert_version",
    "policy_set",
    "policy_effect",
    "policy_id",
    "policy_decided",
    "policy_tripped",
    "policy_reason",
    "labels",
    "policies",
    "default_deny",
    "trip_on_refusal",
    "policy_cause",
    "shadow",
    "shadow_disagree",
    "shadow_policies",
    "shadow_set",
    "params_mode",
    "params",
    "params_len",
    "upstream",
    "draw",
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

/// The cells of one entry of chain `chain_id` (the chain's id in PostgreSQL; `None` for
/// a file log, whose bytes name no chain), in [`COLUMNS`] order.
fn cells(e: &AuditEntry, chain_id: Option<&str>) -> Vec<Cell> {
    let mut row: Vec<(&'static str, Cell)> = Vec::with_capacity(32);
    let t = |s: &str| Cell::Text(s.to_owned());
    let n = |x: &dyn std::fmt::Display| Cell::Num(x.to_string());
    // Exact decimal dollars, as text so no float rounding creeps in.
    let usd = |m: Money| Cell::Text(m.to_string());
    let digest = |d: &Digest| Cell::Text(d.to_string());
    row.extend([
        ("index", n(&e.index)),
        ("chain_id", chain_id.map_or(Cell::Null, t)),
        ("entry_id", t(&e.entry_id.to_string())),
        ("time", t(&rfc3339(e.timestamp_ns))),
        ("timestamp_ns", n(&e.timestamp_ns)),
        ("kind", t(e.event.kind_name())),
    ]);
    if let Event::Session(ev) = &e.event {
        let (agent, org) = match ev {
            SessionEvent::Opened(r) => (&r.agent_id, &r.organization_id),
            SessionEvent::Verdict(r) => (&r.agent_id, &r.organization_id),
            SessionEvent::Settled(r) => (&r.agent_id, &r.organization_id),
            SessionEvent::HumanDecision(r) => (&r.agent_id, &r.organization_id),
            SessionEvent::Closed(r) => (&r.agent_id, &r.organization_id),
        };
        row.extend([
            ("session_id", t(ev.session_id())),
            ("agent_id", t(agent)),
            ("organization_id", t(org)),
            ("session_seq", n(&ev.session_seq())),
        ]);
        if !matches!(ev, SessionEvent::HumanDecision(_) | SessionEvent::Closed(_)) {
            row.push(("budget_version", n(&ev.budget_version())));
        }
    }
    if let Event::Session(SessionEvent::Verdict(VerdictRecord {
        policy: Some(p), ..
    })) = &e.event
    {
        row.extend([
            ("policy_set", digest(&p.set_digest)),
            ("policy_effect", t(p.effect.as_str())),
            ("policy_id", p.policy_id.as_deref().map_or(Cell::Null, t)),
            ("policy_decided", Cell::Bool(p.decided)),
            ("policy_tripped", Cell::Bool(p.tripped)),
            ("policy_reason", p.reason().as_deref().map_or(Cell::Null, t)),
            (
                "labels",
                t(&p.labels
                    .iter()
                    .map(tollgate_core::labels::Label::as_str)
                    .collect::<Vec<_>>()
                    .join(",")),
            ),
        ]);
    }
    if let Event::Session(SessionEvent::Verdict(v)) = &e.event {
        if v.policy.is_some() {
            // Version 7: every shadow candidate's would-be verdict, NAME=VERDICT(REASON).
            let notes: Vec<String> = v
                .shadow
                .iter()
                .map(|s| format!("{}={}({})", s.name, s.verdict.as_str(), s.reason))
                .collect();
            let disagree = v.shadow.iter().filter(|s| !s.agrees(v.verdict)).count();
            row.extend([
                ("shadow", t(&notes.join(";"))),
                ("shadow_disagree", n(&disagree)),
            ]);
        }
        let mode = v
            .params
            .as_ref()
            .map_or(crate::entry::ParamsMode::Hash, |p| p.mode());
        row.push(("params_mode", t(mode.as_str())));
        match &v.params {
            Some(crate::entry::RecordedParams::TooLarge { len, .. }) => {
                row.push(("params_len", n(len)));
            }
            Some(p) => {
                let text = p.text().unwrap_or_default();
                row.extend([("params", t(text)), ("params_len", n(&text.len()))]);
            }
            None => {}
        }
        // Version 8: the upstream called (absent: the local resource) and the draw.
        if let Some(u) = &v.upstream {
            row.push(("upstream", t(u)));
        }
        if let Some(d) = v.draw {
            row.push(("draw", n(&d.value())));
        }
    }
    match &e.event {
        Event::Session(SessionEvent::Verdict(v)) => row.extend([
            ("call_number", n(&v.call_number)),
            ("tool_name", t(&v.tool_name)),
            ("params_hash", digest(&v.params_hash)),
            ("verdict", t(v.verdict.as_str())),
            (
                "deny_reason",
                v.deny_reason.map_or(Cell::Null, |d| t(d.as_str())),
            ),
            ("reason", t(v.reason.as_str())),
            ("probabilistic", Cell::Bool(v.probabilistic)),
            ("budget_before_usd", usd(v.budget_before)),
            ("budget_after_usd", usd(v.budget_after)),
            ("estimated_cost_usd", usd(v.estimated_cost)),
            ("nonce", n(&v.nonce)),
            (
                "operator_id",
                v.operator_id.as_deref().map_or(Cell::Null, t),
            ),
            (
                "config_digest",
                v.config_digest.as_ref().map_or(Cell::Null, digest),
            ),
        ]),
        Event::PolicySet(p) => row.extend([
            ("shadow_policies", n(&p.shadow_policies)),
            ("shadow_set", Cell::Bool(p.shadow_set)),
            ("policy_set", digest(&p.digest)),
            ("policies", n(&p.policies)),
            ("default_deny", Cell::Bool(p.default_deny)),
            ("trip_on_refusal", Cell::Bool(p.trip_on_refusal)),
            ("policy_cause", t(p.cause.as_str())),
        ]),
        Event::Session(SessionEvent::Opened(o)) => row.extend([
            (
                "policy_set",
                o.policy_set.as_ref().map_or(Cell::Null, digest),
            ),
            ("budget_before_usd", usd(o.budget_before)),
            ("config_digest", digest(&o.config_digest)),
            ("budget_scope", t(o.budget_scope.as_str())),
            ("budget_initial_usd", usd(o.budget_initial)),
            ("config", t(&o.config)),
        ]),
        Event::Session(SessionEvent::Settled(s)) => row.extend([
            ("call_number", n(&s.call_number)),
            ("budget_before_usd", usd(s.budget_before)),
            ("budget_after_usd", usd(s.budget_after)),
            ("estimated_cost_usd", usd(s.estimated_cost)),
            ("success", Cell::Bool(s.success)),
            (
                "reported_cost_bits",
                t(&format!("{:016x}", s.reported_cost_bits)),
            ),
            // For reading only: the record keeps the bits, never the float.
            (
                "reported_cost",
                t(&format!("{:?}", f64::from_bits(s.reported_cost_bits))),
            ),
            ("cost_status", t(s.cost_status.as_str())),
            ("actual_cost_usd", usd(s.actual_cost)),
            ("reserved", Cell::Bool(s.reserved)),
            ("charged_usd", usd(s.charged)),
            ("error_signal", Cell::Bool(s.error_signal)),
        ]),
        Event::Session(SessionEvent::HumanDecision(d)) => row.extend([
            ("call_number", n(&d.call_number)),
            ("tool_name", t(&d.tool_name)),
            ("operator_id", t(&d.operator_id)),
            ("decision", t(d.decision.as_str())),
            ("note", t(&d.note)),
            ("original_nonce", n(&d.original_nonce)),
            ("original_args_digest", digest(&d.original_args_digest)),
            (
                "successor_nonce",
                d.successor.as_ref().map_or(Cell::Null, |(s, _)| n(s)),
            ),
            (
                "successor_args_digest",
                d.successor.as_ref().map_or(Cell::Null, |(_, a)| digest(a)),
            ),
            ("budget_remaining_usd", usd(d.budget_remaining)),
        ]),
        Event::Session(SessionEvent::Closed(r)) => row.extend([
            ("reason", t(r.reason.as_str())),
            ("budget_remaining_usd", usd(r.budget_remaining)),
        ]),
        Event::KeyHandover { new_public_key } => row.extend([
            ("new_public_key", t(&hex(new_public_key))),
            ("new_key_id", t(&KeyId::of(new_public_key).to_string())),
        ]),
        Event::Recovery {
            file,
            offset,
            length,
            sha256,
            moved_to,
        } => row.extend([
            ("recovery_file", t(file)),
            ("recovery_offset", n(offset)),
            ("recovery_length", n(length)),
            ("recovery_sha256", digest(sha256)),
            ("recovery_moved_to", t(moved_to)),
        ]),
        Event::Void(v) => row.extend([
            ("session_id", t(&v.session_id)),
            ("session_seq", n(&v.session_seq)),
            ("reason", t(&v.reason)),
            ("void_chain_id", t(&v.chain_id)),
            ("budget_version", n(&v.budget_version)),
            ("budget_before_usd", usd(v.budget_before)),
            ("budget_after_usd", usd(v.budget_after)),
            ("revert_version", n(&v.revert_version)),
        ]),
    }
    row.extend([
        ("key_id", t(&e.key_id.to_string())),
        ("prev_hash", digest(&e.prev_hash)),
        ("signature", t(&hex(&e.signature))),
    ]);
    COLUMNS
        .iter()
        .map(|col| {
            row.iter()
                .position(|(name, _)| name == col)
                .map_or(Cell::Null, |i| row.swap_remove(i).1)
        })
        .collect()
}

/// One JSON object (no trailing newline), keys in [`COLUMNS`] order, for an entry of
/// chain `chain_id` (`None`: a file log).
pub fn to_json_line(e: &AuditEntry, chain_id: Option<&str>) -> String {
    let mut out = String::from("{");
    for (i, (k, c)) in COLUMNS.iter().zip(cells(e, chain_id)).enumerate() {
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

/// One CSV row (RFC 4180 quoting, no line end), for an entry of chain `chain_id`
/// (`None`: a file log).
pub fn to_csv_row(e: &AuditEntry, chain_id: Option<&str>) -> String {
    let mut out = String::new();
    for (i, c) in cells(e, chain_id).into_iter().enumerate() {
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
