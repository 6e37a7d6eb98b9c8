//! decide() on its three typical paths, and params classification (canonical hash).
//!
//! `cargo bench -p tollgate-core --bench decide`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_debug_implementations
)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use tollgate_core::json::{self, Value};
use tollgate_core::{apply_decision, decide, GuardConfig, Money, Params, SessionState, ToolCall};

fn params(text: &str) -> Value {
    json::parse_str(text).unwrap()
}

fn setup() -> (GuardConfig, SessionState, Value) {
    let config = GuardConfig {
        budget: Money::from_usd(10.0).unwrap(),
        max_repeat_calls: 3,
        error_amplification: true,
        window_duration_s: 60,
        window_max_calls: 1000,
        max_total_calls: 100_000,
        ..GuardConfig::default()
    };
    let p = params(
        r#"{"query":"weather in paris","limit":10,"filters":{"lang":["en","fr"],"ratio":0.25}}"#,
    );
    let mut state = SessionState::new(config.budget, 0);
    // A session with some history: 50 seen nonces, a repeat run of 3 on `search`.
    for n in 0..50u64 {
        let q = params(&format!(r#"{{"i":{n}}}"#));
        let call = ToolCall {
            nonce: Some(1000 + n),
            estimated_cost: Money(1_000_000),
            ..ToolCall::new("other", Params::json(&q))
        };
        let d = decide(&config, &state, &call, 0, 1.0);
        apply_decision(&config, &mut state, &call, &d, n, 0);
    }
    for n in 0..3u64 {
        let call = ToolCall {
            nonce: Some(n),
            estimated_cost: Money(1_000_000),
            ..ToolCall::new("search", Params::json(&p))
        };
        let d = decide(&config, &state, &call, 0, 1.0);
        apply_decision(&config, &mut state, &call, &d, 100 + n, 0);
    }
    (config, state, p)
}

fn bench(c: &mut Criterion) {
    let (config, state, p) = setup();
    let other = params(r#"{"query":"weather in rome","limit":10}"#);
    let allow = ToolCall {
        nonce: Some(9_999),
        estimated_cost: Money(1_000_000),
        ..ToolCall::new("search", Params::json(&other))
    };
    let raw = r#"{"query":"weather in paris","limit":10,"last_error":"upstream said: HTTP 503 Service Unavailable, retry later"}"#;
    let repeat = ToolCall {
        nonce: Some(10_000),
        raw_params: Some(raw),
        ..ToolCall::new("search", Params::json(&p))
    };
    let mut tripped = state.clone();
    tripped.circuit_tripped = true;

    let mut g = c.benchmark_group("decide");
    g.bench_function("allow_within_thresholds", |b| {
        b.iter(|| decide(&config, &state, black_box(&allow), 1, 1.0))
    });
    g.bench_function("repeat_with_error_scan", |b| {
        b.iter(|| decide(&config, &state, black_box(&repeat), 1, 1.0))
    });
    g.bench_function("deny_circuit_open", |b| {
        b.iter(|| decide(&config, &tripped, black_box(&allow), 1, 1.0))
    });
    g.bench_function("decide_and_apply_allow", |b| {
        b.iter_batched_ref(
            || state.clone(),
            |s| {
                let d = decide(&config, s, &allow, 1, 1.0);
                apply_decision(&config, s, &allow, &d, 500, 1);
                d
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();

    let mut g = c.benchmark_group("params");
    let small = p;
    let bytes = json::to_canonical_vec(&small).unwrap().len() as u64;
    g.throughput(Throughput::Bytes(bytes));
    g.bench_function("classify_and_hash_small", |b| {
        b.iter(|| Params::json(black_box(&small)))
    });
    let big_text = format!(
        r#"{{"documents":[{}]}}"#,
        (0..64)
            .map(|i| format!(
                r#"{{"id":{i},"title":"document number {i}","score":0.{i}5,"tags":["a","b","c"]}}"#
            ))
            .collect::<Vec<_>>()
            .join(",")
    );
    let big = params(&big_text);
    let bytes = json::to_canonical_vec(&big).unwrap().len() as u64;
    g.throughput(Throughput::Bytes(bytes));
    g.bench_function("classify_and_hash_4k", |b| {
        b.iter(|| Params::json(black_box(&big)))
    });
    let text = json::to_canonical_vec(&small).unwrap();
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("parse_and_classify_small", |b| {
        b.iter(|| Params::json(&json::parse(black_box(&text), json::Limits::default()).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
