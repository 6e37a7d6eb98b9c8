//! Policy evaluation with 10, 100 and 1,000 policies (issue 18's target: p50 at most
//! 10 µs at 100). Run: `cargo bench -p tollgate-policy --bench evaluate`.
//!
//! Each set is what a team writes: per-tool rules (half `forbid` with an argument
//! condition, the rest `permit`s, some `@hitl`, some `@label`) over `n / 4` tools, plus
//! two rules for every tool. The call is to a tool that four rules name, with three
//! arguments; the actor is built once, as the daemon builds it once per session.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tollgate_core::json::parse_str;
use tollgate_core::labels::{Label, LabelSet};
use tollgate_core::Money;
use tollgate_policy::{load, Call, DefaultEffect, Options, SessionView, Source};

fn policies(n: usize) -> String {
    let tools = (n / 4).max(1);
    let mut out = String::new();
    out.push_str("@id(\"everyone-no-danger\") forbid(principal, action, resource) when { context.tool like \"danger_*\" };\n");
    out.push_str("@id(\"low-budget\") @hitl permit(principal, action, resource) when { context.session.budget_fraction.lessThan(decimal(\"0.05\")) };\n");
    for i in 0..n.saturating_sub(2) {
        let t = i % tools;
        let text = match i / tools % 4 {
            0 => format!("@id(\"p{i}\") forbid(principal, action == Action::\"tool{t}\", resource) when {{ context.args.amount.greaterThan(decimal(\"1{t}.5\")) }};\n"),
            1 => format!("@id(\"p{i}\") forbid(principal, action == Action::\"tool{t}\", resource) unless {{ [\"ls\", \"cat\", \"grep\"].contains(context.args.command) }};\n"),
            2 => format!("@id(\"p{i}\") @hitl permit(principal, action == Action::\"tool{t}\", resource) when {{ context.session.labels.contains(\"customer-data\") && !(context.args.to like \"*@acme.example\") }};\n"),
            _ => format!("@id(\"p{i}\") @label(\"touched-{t}\") permit(principal, action == Action::\"tool{t}\", resource);\n"),
        };
        out.push_str(&text);
    }
    out
}

fn bench(c: &mut Criterion) {
    let args = parse_str(r#"{"amount": 1.25, "command": "ls", "to": "bob@acme.example"}"#).unwrap();
    let labels = LabelSet::new()
        .with(&[Label::parse("customer-data").unwrap()])
        .unwrap();
    let mut group = c.benchmark_group("evaluate");
    for n in [10usize, 100, 1000] {
        let loaded = load(
            &[Source::new("bench.cedar", policies(n))],
            &Options {
                default: DefaultEffect::Allow,
                schema: None,
            },
        )
        .unwrap();
        let p = loaded.policies;
        assert_eq!(p.len(), n);
        let actor = p.actor("acme", "bot", "local").unwrap();
        let call = Call {
            tool: "tool0",
            args: Some(&args),
            cost: Money(2_000_000),
            now: 1_700_000_000_000_000_000,
            session: SessionView {
                calls: 12,
                budget_initial: Money(10_000_000_000),
                budget_remaining: Money(6_000_000_000),
                labels: &labels,
            },
            approved: false,
        };
        // The call must be evaluated for real: every rule on tool0 is looked at.
        let o = p.evaluate(&actor, &call);
        assert!(
            matches!(o.effect, tollgate_policy::Effect::Permit { .. }),
            "{o:?}"
        );
        group.bench_with_input(BenchmarkId::new("tool_with_rules", n), &n, |b, _| {
            b.iter(|| p.evaluate(&actor, &call))
        });
        let other = Call {
            tool: "search",
            ..call
        };
        group.bench_with_input(BenchmarkId::new("tool_without_rules", n), &n, |b, _| {
            b.iter(|| p.evaluate(&actor, &other))
        });
        group.bench_with_input(BenchmarkId::new("actor", n), &n, |b, _| {
            b.iter(|| p.actor("acme", "bot", "local"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
