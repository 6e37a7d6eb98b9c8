//! Store benchmarks: what one pre_exec costs the store, and that the cost does not grow
//! with a session's history.
//!
//! - `history/{1k,100k,1m}`: one check-and-apply (`decide` + `ops::verdict`, the record
//!   built) on a session that has already taken 1 thousand, 100 thousand and 1 million
//!   calls, each of them run through the store the same way (building the million-call
//!   session takes a few seconds). Flat numbers mean the per-verdict work is O(1) in the
//!   session's history: the nonce window and the reservations are bounded by the policy.
//! - `apply_durable/{1,64}`: apply and wait until the change's audit entry is durable
//!   (fsync'd group commit in a real audit log), from 1 and from 64 threads, each on its
//!   own session. Criterion's throughput line is durable verdicts per second.
//! - `snapshot/encode_session`: the snapshot record of a session at its bounds (1,024
//!   nonces, 1,024 reservations), written off the verdict path every few seconds.
//! - `idle_sweep/{scan,quiet}_100k`: what the daemon's once-a-second idle sweep reads to
//!   find the 10 silent sessions among 100,000 live: `scan` copies and filters every
//!   session (`list`, what the sweep did before the quiet index), `quiet` reads the index
//!   up to the cutoff. `idle_sweep/heartbeat` is what the index costs a change: one
//!   heartbeat (a `Touch` that moves the session's last sign of life) on a store of
//!   100,000 sessions.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tollgate_audit::{FsyncPolicy, SigningKey, Writer, WriterConfig};
use tollgate_core::json::Value;
use tollgate_core::{decide, BudgetScope, GuardConfig, Money, Params, ToolCall};
use tollgate_store::{
    ops, Change, Durable, EmbeddedStore, MemoryStore, Policy, Session, SessionMeta, StoreOptions,
};

fn session(id: &str) -> Session {
    let policy = Policy::new(GuardConfig {
        budget: Money(1_000_000_000_000_000),
        max_repeat_calls: 3,
        ..GuardConfig::default()
    });
    Session::new(
        SessionMeta {
            session_id: id.into(),
            agent_id: format!("agent-{id}"),
            organization_id: "org".into(),
            budget_scope: BudgetScope::PerSession,
            created_at_ns: 0,
        },
        Arc::new(policy),
        0,
    )
}

fn params(n: u64) -> Params {
    let v = Value::Object(
        [
            ("q".to_owned(), Value::from("rust circuit breakers")),
            ("page".to_owned(), Value::from((n % 4) as i64)),
        ]
        .into(),
    );
    Params::json(&v)
}

/// The daemon's pre_exec inside `apply`, with a fresh nonce and call number.
fn pre_exec<S: tollgate_store::SessionStore>(
    store: &S,
    id: &str,
    nonce: u64,
    p: Params,
) -> Durable {
    let run = store.apply(id, move |s| {
        let call = ToolCall {
            tool_name: "web_search",
            params: p,
            nonce: Some(nonce),
            estimated_cost: Money(2_000_000),
            raw_params: None,
        };
        let d = decide(&s.policy.config, &s.state, &call, 1, 0.5);
        let n = s.last_call_number + 1;
        let r = ops::verdict(s, &call, &d, n, 1);
        Change::Commit(d, r.into())
    });
    let (_, durable) = futures_ready(run).unwrap();
    durable
}

/// The stores' futures are ready when returned.
fn futures_ready<F: std::future::Future>(f: F) -> F::Output {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("store futures are ready at once"),
    }
}

fn history(c: &mut Criterion) {
    let mut g = c.benchmark_group("history");
    g.throughput(Throughput::Elements(1));
    for (name, calls) in [("1k", 1_000u64), ("100k", 100_000), ("1m", 1_000_000)] {
        let store = MemoryStore::default();
        store
            .create_sync(session("h"), 0)
            .unwrap()
            .1
            .wait()
            .unwrap();
        let params: Vec<Params> = (0..4).map(params).collect();
        for n in 1..=calls {
            pre_exec(&store, "h", n, params[(n % 4) as usize])
                .wait()
                .unwrap();
        }
        let s = store.get_sync("h").unwrap().unwrap();
        assert_eq!(s.state.total_calls, calls);
        let mut nonce = calls + 1;
        g.bench_function(name, |b| {
            b.iter(|| {
                nonce += 1;
                pre_exec(&store, "h", nonce, params[(nonce % 4) as usize])
                    .wait()
                    .unwrap();
            })
        });
    }
    g.finish();
}

fn open(dir: &std::path::Path) -> (Arc<Writer>, EmbeddedStore) {
    let (tap, rx) = tollgate_store::tap();
    let key = SigningKey::from_bytes(&[9; 32]);
    let mut wc = WriterConfig::new(dir.join("audit"));
    wc.fsync = FsyncPolicy::Batch;
    let (writer, _) = Writer::open_with_tap(wc, key.clone(), tap.into_fn()).unwrap();
    let writer = Arc::new(writer);
    let (store, _) = EmbeddedStore::open(
        dir.join("state.redb"),
        dir.join("audit"),
        Some(&key.verifying_key()),
        writer.clone(),
        rx,
        StoreOptions::default(),
        0,
    )
    .unwrap();
    (writer, store)
}

fn durable(c: &mut Criterion, threads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (writer, store) = open(dir.path());
    for t in 0..threads {
        store
            .create_sync(session(&format!("d{t}")), 0)
            .unwrap()
            .1
            .wait()
            .unwrap();
    }
    let p = params(0);
    let mut g = c.benchmark_group("apply_durable");
    g.throughput(Throughput::Elements(threads as u64));
    g.sample_size(20);
    let mut round = 0u64;
    g.bench_function(format!("{threads}"), |b| {
        b.iter_custom(|iters| {
            let barrier = Barrier::new(threads);
            let start = Instant::now();
            std::thread::scope(|scope| {
                for t in 0..threads {
                    let (store, barrier) = (&store, &barrier);
                    let base = round * iters;
                    scope.spawn(move || {
                        barrier.wait();
                        for i in 0..iters {
                            let nonce = ((base + i) << 8) | t as u64 | 1 << 60;
                            pre_exec(store, &format!("d{t}"), nonce, p).wait().unwrap();
                        }
                    });
                }
            });
            round += 1;
            start.elapsed()
        })
    });
    g.finish();
    writer.shutdown().unwrap();
    store.close_sync().unwrap();
}

fn durable_1(c: &mut Criterion) {
    durable(c, 1);
}

fn durable_64(c: &mut Criterion) {
    durable(c, 64);
}

fn encode(c: &mut Criterion) {
    let store = MemoryStore::default();
    store
        .create_sync(session("e"), 0)
        .unwrap()
        .1
        .wait()
        .unwrap();
    for n in 1..=5_000u64 {
        pre_exec(&store, "e", n, params(n)).wait().unwrap();
    }
    let s = store.get_sync("e").unwrap().unwrap();
    assert_eq!(s.state.seen_nonces.len(), 1024);
    c.bench_function("snapshot/encode_session", |b| {
        b.iter(|| tollgate_store::record::encode_session(&s))
    });
}

fn idle_sweep(c: &mut Criterion) {
    const LIVE: u64 = 100_000;
    const SILENT: u64 = 10;
    let store = MemoryStore::new(LIVE as usize, None);
    for n in 0..LIVE {
        // Sessions 0..10 registered at time 0 and were silent since; the others at 1,000.
        let at = if n < SILENT { 0 } else { 1_000 };
        let (_, d) = store.create_sync(session(&format!("s{n}")), at).unwrap();
        d.wait().unwrap();
    }
    let cutoff = 500;
    let mut g = c.benchmark_group("idle_sweep");
    g.bench_function("scan_100k", |b| {
        b.iter(|| {
            let silent = store
                .list_sync(None)
                .unwrap()
                .into_iter()
                .filter(|s| s.quiet_since().is_some_and(|t| t <= cutoff))
                .count();
            assert_eq!(silent, SILENT as usize);
        })
    });
    g.bench_function("quiet_100k", |b| {
        b.iter(|| assert_eq!(store.quiet_sync(cutoff).unwrap().len(), SILENT as usize))
    });
    let mut now = 2_000i64;
    g.bench_function("heartbeat", |b| {
        b.iter(|| {
            now += 1;
            let id = format!("s{}", SILENT + (now as u64 % (LIVE - SILENT)));
            // A touch is not journaled: its durability handle has nothing to wait for.
            let ((), _touched) = store
                .apply_sync(&id, |s| {
                    s.last_heartbeat_ns = now;
                    Change::Touch(())
                })
                .unwrap();
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = history, durable_1, durable_64, encode, idle_sweep
}
criterion_main!(benches);
