//! How long the gate takes on record sets of 100, 1,000 and 10,000 envelopes.
//!
//! Run: `cargo bench -p tollgate-board -- --warm-up-time 1 --measurement-time 3`
//!
//! The synthetic record set is a decided R2 architecture correlation: a principal root, many
//! delegate/return pairs to the legal agent (fan-out), a designated security challenge, a
//! decision-request attaching it, and the decider's record bound by digest. It is asserted
//! clean before timing, so the numbers are for a full pass over every rule.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tollgate_board::{check, digest, Catalog};

const REQ: &str =
    r#"{"kind":"principal","subject":"subject:corp-idp:7c1e9a40b2d35f68","role":"platform-owner"}"#;
const DECIDER: &str = r#"{"kind":"principal","subject":"subject:corp-idp:a1b2c3d4e5f60718","role":"engineering-director"}"#;
const ARCH: &str = r#"{"kind":"agent","id":"agentic-system-architecture-review-agent"}"#;
const SEC: &str = r#"{"kind":"agent","id":"agentic-security-review-agent"}"#;
const LEGAL: &str = r#"{"kind":"agent","id":"legal-regulatory-compliance-agent"}"#;

fn time(i: usize) -> String {
    format!(
        "2026-11-02T{:02}:{:02}:{:02}Z",
        i / 3600,
        (i / 60) % 60,
        i % 60
    )
}

#[allow(clippy::too_many_arguments)]
fn envelope(
    mt: &str,
    id: &str,
    parent: Option<&str>,
    hop: usize,
    at: usize,
    src: &str,
    dst: &str,
    status: &str,
    approval: &str,
    extra: &str,
) -> String {
    let parent = parent.map_or("null".to_owned(), |p| format!("\"{p}\""));
    format!(
        r#"{{"schema_version":"1.0.0","message_type":"{mt}","task_id":"{id}","correlation_id":"corr-bench","parent_task_id":{parent},"hop_count":{hop},"max_hops":6,"sent_at":"{}","source":{src},"destination":{dst},"objective":"Assess whether the claims-triage design holds under review.","input_schema_version":"1.0.0","subject_risk_tier":"R2","data_classification":"internal","materiality_flags":[],"authorized_actions":["read","analyze","recommend","challenge","escalate"],"do_not_do_list":["Do not execute, deploy, or mutate any system"],"evidence_refs":[{{"ref":"adopter-repo:docs/design.md","label":"repo-evidence"}}],"missing_evidence":[],"budget":{{"currency":"USD","limit_tool_calls":40,"spent_tool_calls":0,"limit_tokens":400000,"spent_tokens":0,"limit_cost_minor":2000,"spent_cost_minor":0}},"deadline":"2026-11-06T17:00:00Z","approval_state":"{approval}","expected_output_schema":"agentic-review-verdict/1.0.0","status":"{status}","stop_reasons":[],"synthetic":true{extra}}}"#,
        time(at)
    )
}

/// A clean record set of exactly `n` envelopes (n >= 5).
pub fn record_set(n: usize) -> String {
    let mut m = Vec::with_capacity(n);
    m.push(envelope(
        "delegate",
        "root-frame",
        None,
        0,
        0,
        REQ,
        ARCH,
        "dispatched",
        "not-required",
        &format!(r#","decision_class":"architecture","decision_owner":{DECIDER}"#),
    ));
    let pairs = (n - 5) / 2;
    let mut at = 1;
    for i in 0..pairs {
        let d = format!("d-legal-{i}");
        m.push(envelope(
            "delegate",
            &d,
            Some("root-frame"),
            1,
            at,
            ARCH,
            LEGAL,
            "dispatched",
            "not-required",
            "",
        ));
        m.push(envelope(
            "return",
            &format!("r-legal-{i}"),
            Some(&d),
            2,
            at + 1,
            LEGAL,
            ARCH,
            "completed",
            "not-required",
            r#","verdict":{"outcome":"pass","summary":"Meets the retention constraints."}"#,
        ));
        at += 2;
    }
    if (n - 5) % 2 == 1 {
        m.push(envelope(
            "delegate",
            "d-legal-odd",
            Some("root-frame"),
            1,
            at,
            ARCH,
            LEGAL,
            "dispatched",
            "not-required",
            "",
        ));
        at += 1;
    }
    m.push(envelope(
        "delegate",
        "d-sec",
        Some("root-frame"),
        1,
        at,
        ARCH,
        SEC,
        "dispatched",
        "not-required",
        "",
    ));
    m.push(envelope(
        "challenge", "c-sec", Some("d-sec"), 2, at + 1, SEC, ARCH, "completed", "not-required",
        r#","challenge":{"proposal_task_id":"d-sec","round":1,"hard_gate":false,"outcome":"sustained","finding":"The connector is write-capable."}"#,
    ));
    let request = envelope(
        "decision-request",
        "req-1",
        Some("c-sec"),
        3,
        at + 2,
        ARCH,
        DECIDER,
        "completed",
        "pending-human-review",
        r#","decision_request":{"decision_class":"architecture","proposer_agent":"agentic-system-architecture-review-agent","proposal_summary":"One agent with a fixed tool list.","alternatives":[{"kind":"multi-agent","summary":"Two agents.","rejected_because":"No added capability."}],"challenge_task_ids":["c-sec"],"dissent":[{"challenge_task_id":"c-sec","position":"Scope the connector."}],"recommended_outcome":"conditional-approve"}"#,
    );
    let d = digest(request.as_bytes()).unwrap();
    m.push(request);
    m.push(envelope(
        "decision-record", "rec-1", Some("req-1"), 4, at + 3, DECIDER, REQ, "completed", "approved",
        &format!(r#","decision_record":{{"request_task_id":"req-1","request_digest":"{d}","outcome":"conditional-approve","decided_by":{DECIDER},"rationale":"Sound once scoped.","dissent_acknowledged":true}}"#),
    ));
    assert_eq!(m.len(), n);
    format!("{{\"messages\":[{}]}}", m.join(","))
}

/// A hostile record set of `n` envelopes, all sent in the same second: a quarter HARD-gate
/// challenges on the proposer, a quarter decision-requests that supersede nothing, the rest
/// decision-records spread over the requests. It breaks many rules; the point is that the
/// gate's cost stays near-linear (no rule rescans the set per request or per record).
pub fn hostile_set(n: usize) -> String {
    let q = n / 4;
    let mut m = Vec::with_capacity(n);
    m.push(envelope(
        "delegate",
        "root-frame",
        None,
        0,
        0,
        REQ,
        ARCH,
        "dispatched",
        "not-required",
        &format!(r#","decision_class":"architecture","decision_owner":{DECIDER}"#),
    ));
    m.push(envelope(
        "delegate",
        "d-sec",
        Some("root-frame"),
        1,
        0,
        ARCH,
        SEC,
        "dispatched",
        "not-required",
        "",
    ));
    for i in 0..q {
        m.push(envelope(
            "challenge", &format!("c-{i}"), Some("d-sec"), 2, 0, SEC, ARCH, "completed", "not-required",
            r#","challenge":{"proposal_task_id":"d-sec","round":1,"hard_gate":true,"outcome":"sustained","finding":"f"}"#,
        ));
    }
    for i in 0..q {
        m.push(envelope(
            "decision-request", &format!("req-{i}"), Some(&format!("c-{i}")), 3, 0, ARCH, DECIDER, "completed", "pending-human-review",
            &format!(r#","decision_request":{{"decision_class":"architecture","proposer_agent":"agentic-system-architecture-review-agent","proposal_summary":"p","alternatives":[],"challenge_task_ids":["c-{i}"],"dissent":[],"recommended_outcome":"approve"}}"#),
        ));
    }
    let mut i = 0;
    while m.len() < n {
        let r = i % q.max(1);
        m.push(envelope(
            "decision-record", &format!("rec-{i}"), Some(&format!("req-{r}")), 4, 0, DECIDER, REQ, "completed", "approved",
            &format!(r#","decision_record":{{"request_task_id":"req-{r}","request_digest":"sha256:{}","outcome":"approve","decided_by":{DECIDER},"rationale":"r","dissent_acknowledged":true}}"#, "0".repeat(64)),
        ));
        i += 1;
    }
    format!("{{\"messages\":[{}]}}", m.join(","))
}

fn bench(c: &mut Criterion) {
    let catalog = Catalog::default();
    let mut group = c.benchmark_group("board_check");
    for n in [100usize, 1_000, 10_000] {
        let input = record_set(n);
        let report = check(input.as_bytes(), &catalog);
        assert!(report.is_clean(), "{n}: {:?}", report.findings.first());
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &input, |b, input| {
            b.iter(|| check(input.as_bytes(), &catalog));
        });
    }
    group.finish();

    let mut group = c.benchmark_group("board_check_hostile");
    group.sample_size(10);
    for n in [1_000usize, 10_000] {
        let input = hostile_set(n);
        assert!(!check(input.as_bytes(), &catalog).is_clean());
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &input, |b, input| {
            b.iter(|| check(input.as_bytes(), &catalog));
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
