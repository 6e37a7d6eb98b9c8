//! What a replay found ([`Report`]), gathered entry by entry from [`super::Replay`]'s
//! outcomes, and the exit code `tollgate policy replay` gives for it: the one place both
//! the command and the tests that run a producer's log through it (the MCP gateway's
//! testkit) read them from.

use std::collections::BTreeMap;

use tollgate_audit::VerdictRecord;
use tollgate_core::json::{self, Number, Value};
use tollgate_core::Verdict;

use super::{Outcome, Skipped, Unreplayable};

/// One verdict whose candidate verdict or reason differs from the recorded one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The chain the entry is in (a fleet's `chain_id`); `None` for a log's files.
    pub chain: Option<String>,
    /// The entry's index in its chain.
    pub index: u64,
    /// The decision's time.
    pub timestamp_ns: i64,
    /// The session.
    pub session: String,
    /// The call's number in its session.
    pub call_number: u64,
    /// The tool.
    pub tool: String,
    /// The recorded verdict.
    pub recorded: Verdict,
    /// The recorded reason string.
    pub recorded_reason: String,
    /// The candidate's verdict.
    pub candidate: Verdict,
    /// The candidate's reason string.
    pub candidate_reason: String,
    /// Whether an earlier entry of the session already differed.
    pub after_divergence: bool,
}

impl Change {
    /// The rule a flip is counted under: the candidate's reason when it refuses or holds,
    /// else the recorded reason that no longer fires.
    pub fn rule(&self) -> &str {
        if self.candidate == Verdict::Allow {
            &self.recorded_reason
        } else {
            &self.candidate_reason
        }
    }

    /// `RECORDED->CANDIDATE`, e.g. `ALLOW->DENY`.
    pub fn kind(&self) -> String {
        format!("{}->{}", self.recorded, self.candidate)
    }
}

/// What the replay found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Entries verified and folded.
    pub entries: u64,
    /// Verdict entries.
    pub verdicts: u64,
    /// Verdicts the candidate decided.
    pub replayed: u64,
    /// Verdicts the candidate decided otherwise.
    pub flips: u64,
    /// Of them, those after an earlier difference in their session.
    pub flips_after_divergence: u64,
    /// Flips by kind (`ALLOW->DENY`, ...).
    pub by_kind: BTreeMap<String, u64>,
    /// Flips by rule ([`Change::rule`]).
    pub by_rule: BTreeMap<String, u64>,
    /// Flips by session.
    pub by_session: BTreeMap<String, u64>,
    /// The first flips, in full.
    pub flip_examples: Vec<Change>,
    /// Verdicts whose reason alone changed.
    pub reason_changes: u64,
    /// Reason changes by `RECORDED -> CANDIDATE`.
    pub reason_by_change: BTreeMap<String, u64>,
    /// The first reason changes, in full.
    pub reason_examples: Vec<Change>,
    /// Verdicts that could not be replayed, by cause (`args`, `draw`).
    pub unreplayable: BTreeMap<String, u64>,
    /// Verdicts not replayable for want of their params, by the policy that reads them.
    pub unreplayable_policies: BTreeMap<String, u64>,
    /// Settlements of calls whose verdict flipped (not applied).
    pub skipped_settlements: u64,
    /// Human decisions on calls the candidate did not hold (not applied).
    pub skipped_decisions: u64,
    /// How many flips and reason changes are kept in full.
    pub examples: usize,
}

impl Report {
    /// An empty report keeping the first `examples` flips and reason changes in full.
    pub fn new(examples: usize) -> Report {
        Report {
            examples,
            ..Report::default()
        }
    }

    /// Take what the replay made of verdict `v` (entry `index` of `chain`).
    pub fn add(&mut self, chain: Option<&str>, index: u64, v: &VerdictRecord, outcome: Outcome) {
        self.verdicts += 1;
        let (verdict, reason) = match outcome.candidate {
            Err(why) => {
                *self.unreplayable.entry(why.kind().to_owned()).or_default() += 1;
                if let Unreplayable::Args { policy } = why {
                    *self.unreplayable_policies.entry(policy).or_default() += 1;
                }
                return;
            }
            Ok(c) => c,
        };
        self.replayed += 1;
        if verdict == v.verdict && reason == outcome.recorded_reason {
            return;
        }
        let change = Change {
            chain: chain.map(str::to_owned),
            index,
            timestamp_ns: v.timestamp_ns,
            session: v.session_id.clone(),
            call_number: v.call_number,
            tool: v.tool_name.clone(),
            recorded: v.verdict,
            recorded_reason: outcome.recorded_reason,
            candidate: verdict,
            candidate_reason: reason,
            after_divergence: outcome.after_divergence,
        };
        if verdict == v.verdict {
            self.reason_changes += 1;
            *self
                .reason_by_change
                .entry(format!(
                    "{} -> {}",
                    change.recorded_reason, change.candidate_reason
                ))
                .or_default() += 1;
            if self.reason_examples.len() < self.examples {
                self.reason_examples.push(change);
            }
        } else {
            self.flips += 1;
            if change.after_divergence {
                self.flips_after_divergence += 1;
            }
            *self.by_kind.entry(change.kind()).or_default() += 1;
            *self.by_rule.entry(change.rule().to_owned()).or_default() += 1;
            *self.by_session.entry(change.session.clone()).or_default() += 1;
            if self.flip_examples.len() < self.examples {
                self.flip_examples.push(change);
            }
        }
    }

    /// Take the counts of the recorded history the candidate's sessions did not take.
    pub fn skipped(&mut self, skipped: Skipped) {
        self.skipped_settlements = skipped.settlements;
        self.skipped_decisions = skipped.decisions;
    }

    /// Verdicts that could not be replayed, whatever the cause.
    pub fn unreplayable_total(&self) -> u64 {
        self.unreplayable.values().sum()
    }

    /// `tollgate policy replay`'s exit code for this report: 1 something flips, 3 nothing
    /// flips but some verdicts could not be replayed, 0 otherwise. (2, a broken log or bad
    /// input, never has a report.)
    pub fn exit_code(&self) -> u8 {
        if self.flips > 0 {
            1
        } else if self.unreplayable_total() > 0 {
            3
        } else {
            0
        }
    }

    /// The report as one JSON object (`--format json`).
    pub fn to_json(&self) -> String {
        let mut m = BTreeMap::new();
        m.insert("entries".to_owned(), uint(self.entries));
        m.insert("verdicts".to_owned(), uint(self.verdicts));
        m.insert("replayed".to_owned(), uint(self.replayed));
        m.insert("flips".to_owned(), uint(self.flips));
        m.insert(
            "flips_after_divergence".to_owned(),
            uint(self.flips_after_divergence),
        );
        m.insert("flips_by_kind".to_owned(), counts(&self.by_kind));
        m.insert("flips_by_rule".to_owned(), counts(&self.by_rule));
        m.insert("flips_by_session".to_owned(), counts(&self.by_session));
        m.insert(
            "flip_examples".to_owned(),
            Value::Array(self.flip_examples.iter().map(change_json).collect()),
        );
        m.insert("reason_changes".to_owned(), uint(self.reason_changes));
        m.insert(
            "reason_changes_by_change".to_owned(),
            counts(&self.reason_by_change),
        );
        m.insert(
            "reason_examples".to_owned(),
            Value::Array(self.reason_examples.iter().map(change_json).collect()),
        );
        m.insert("unreplayable".to_owned(), uint(self.unreplayable_total()));
        m.insert(
            "unreplayable_by_cause".to_owned(),
            counts(&self.unreplayable),
        );
        m.insert(
            "unreplayable_by_policy".to_owned(),
            counts(&self.unreplayable_policies),
        );
        m.insert(
            "skipped_settlements".to_owned(),
            uint(self.skipped_settlements),
        );
        m.insert("skipped_decisions".to_owned(), uint(self.skipped_decisions));
        let mut out = Vec::new();
        // Counts and strings only: the canonical writer cannot fail.
        let _ = json::write_canonical(&Value::Object(m), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

fn uint(n: u64) -> Value {
    Value::Number(Number::Int(i128::from(n)))
}

fn counts(m: &BTreeMap<String, u64>) -> Value {
    Value::Object(m.iter().map(|(k, n)| (k.clone(), uint(*n))).collect())
}

fn change_json(c: &Change) -> Value {
    let mut m = BTreeMap::new();
    if let Some(chain) = &c.chain {
        m.insert("chain".to_owned(), Value::from(chain.as_str()));
    }
    m.insert("index".to_owned(), uint(c.index));
    m.insert(
        "timestamp_ns".to_owned(),
        Value::Number(Number::Int(i128::from(c.timestamp_ns))),
    );
    m.insert(
        "time".to_owned(),
        Value::from(tollgate_audit::files::rfc3339(c.timestamp_ns).as_str()),
    );
    m.insert("session_id".to_owned(), Value::from(c.session.as_str()));
    m.insert("call_number".to_owned(), uint(c.call_number));
    m.insert("tool_name".to_owned(), Value::from(c.tool.as_str()));
    m.insert(
        "recorded".to_owned(),
        Value::from(c.recorded.to_string().as_str()),
    );
    m.insert(
        "recorded_reason".to_owned(),
        Value::from(c.recorded_reason.as_str()),
    );
    m.insert(
        "candidate".to_owned(),
        Value::from(c.candidate.to_string().as_str()),
    );
    m.insert(
        "candidate_reason".to_owned(),
        Value::from(c.candidate_reason.as_str()),
    );
    m.insert(
        "after_divergence".to_owned(),
        Value::Bool(c.after_divergence),
    );
    Value::Object(m)
}
