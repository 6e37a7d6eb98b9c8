//! Store benchmarks: what one pre_exec costs the store.
//!
//! - `apply_only/*`: one check-and-apply running `decide` + `apply_decision`, without
//!   waiting for the disk (the latency the daemon adds before it can sign);
//! - `apply_durable/batch/{1,64}`: apply, then wait for the `Durable`, from 1 and from 64
//!   concurrent submitter threads, each on its own session, with fsync'd group commit.
//!   Criterion's throughput line is durable verdicts per second.
//! - `apply_durable/batch/64_sessions_2_threads`: the same 64 sessions driven by two
//!   threads as an async daemon would (one call in flight per session; a thread blocks
//!   only when none of its sessions can go on), without 64 OS threads' context switches.
//!
//! Every session holds 1,000 seen nonces throughout (`TOLLGATE_BENCH_NONCES` to change):
//! each call records its nonce and the closure then forgets the oldest, so the costs are
//! those of a session well into its life, at a fixed size. (A check-and-apply walks the
//! nonce set once, so its cost grows linearly with it.) `apply_only` rotates over 64
//! sessions.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tollgate_core::json::Value;
use tollgate_core::{
    apply_decision, decide, BudgetScope, Decision, GuardConfig, Money, Params, ToolCall,
};
use tollgate_store::{
    Change, Durability, Durable, EmbeddedStore, MemoryStore, Session, SessionMeta, StoreOptions,
};

fn session(id: &str) -> Session {
    let mut s = Session::new(
        SessionMeta {
            session_id: id.into(),
            agent_id: format!("agent-{id}"),
            organization_id: "org".into(),
            budget_scope: BudgetScope::PerSession,
            created_at_ns: 0,
            config: None,
        },
        Money(1_000_000_000_000_000),
        0,
    );
    s.state.seen_nonces.extend(0..initial_nonces());
    s
}

/// Nonces of new calls start above every preloaded one (nonces grow, as a client's do).
const FIRST_NONCE: u64 = 1 << 40;

/// Seen nonces each session holds (`TOLLGATE_BENCH_NONCES`, default 1,000).
fn initial_nonces() -> u64 {
    std::env::var("TOLLGATE_BENCH_NONCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

fn config() -> GuardConfig {
    GuardConfig {
        budget: Money(1_000_000_000_000_000),
        max_repeat_calls: 1_000_000,
        ..GuardConfig::default()
    }
}

/// The daemon's closure: decide, number, apply, settle.
fn pre_exec<'c>(
    config: &'c GuardConfig,
    params: &Params,
    nonce: u64,
) -> impl FnOnce(&mut Session) -> Change<Decision> + 'c {
    let params = *params;
    move |s: &mut Session| {
        let call = ToolCall {
            tool_name: "search",
            params,
            nonce: Some(nonce),
            estimated_cost: Money(1_000),
            raw_params: None,
        };
        #[allow(clippy::cast_possible_wrap)]
        let now = nonce as i64;
        let d = decide(config, &s.state, &call, now, 0.5);
        let n = s.next_call_number();
        apply_decision(config, &mut s.state, &call, &d, n, now);
        // Settle at once, and forget the oldest nonce: the session stays at exactly
        // `initial_nonces()` seen nonces however long the bench runs.
        s.state.reservations.clear();
        if s.state.seen_nonces.len() as u64 > initial_nonces() {
            s.state.seen_nonces.pop_first();
        }
        Change::Commit(d)
    }
}

fn params() -> Params {
    let v = Value::Object(
        [
            ("query".to_owned(), Value::from("tollgate benchmarks")),
            ("limit".to_owned(), Value::from(10_i64)),
        ]
        .into(),
    );
    Params::json(&v)
}

fn open(dir: &tempfile::TempDir, durability: Durability) -> EmbeddedStore {
    EmbeddedStore::open(
        dir.path().join("bench.redb"),
        StoreOptions {
            durability,
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

/// Sessions the apply-only benches rotate through (the 64 of the throughput target).
const ROTATION: usize = 64;

/// What the writer spends per session per batch on encoding its record.
fn encode(c: &mut Criterion) {
    let config = config();
    let params = params();
    let store = MemoryStore::default();
    store.create_sync(session("x")).unwrap();
    for n in 0..20 {
        store
            .apply_sync("x", pre_exec(&config, &params, FIRST_NONCE + n))
            .unwrap();
    }
    let s = store.get_sync("x").unwrap().unwrap();
    c.bench_function("record/encode_session_without_nonces", |b| {
        b.iter(|| tollgate_store::record::encode_session_without_nonces(&s));
    });
}

fn apply_only(c: &mut Criterion) {
    let config = config();
    let params = params();
    let ids: Vec<String> = (0..ROTATION).map(|i| format!("r{i}")).collect();
    let mut g = c.benchmark_group("apply_only");
    g.throughput(Throughput::Elements(1));

    let memory = MemoryStore::default();
    for id in &ids {
        memory.create_sync(session(id)).unwrap();
    }
    let nonce = AtomicU64::new(FIRST_NONCE);
    g.bench_function("memory", |b| {
        b.iter(|| {
            let n = nonce.fetch_add(1, Ordering::Relaxed);
            let id = &ids[n as usize % ROTATION];
            memory
                .apply_sync(id, pre_exec(&config, &params, n))
                .unwrap()
        });
    });

    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, Durability::Batch);
    for id in &ids {
        store.create_sync(session(id)).unwrap().wait().unwrap();
    }
    g.bench_function("embedded_batch", |b| {
        b.iter(|| {
            let n = nonce.fetch_add(1, Ordering::Relaxed);
            let id = &ids[n as usize % ROTATION];
            store.apply_sync(id, pre_exec(&config, &params, n)).unwrap()
        });
    });
    g.finish();
    store.close_sync().unwrap();
}

/// `threads` submitters, one session each, kept alive across samples; each sample asks
/// every worker for `iters / threads` apply-and-wait rounds.
fn durable_throughput(c: &mut Criterion, threads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(&dir, Durability::Batch));
    for t in 0..threads {
        store
            .create_sync(session(&format!("s{t}")))
            .unwrap()
            .wait()
            .unwrap();
    }
    let start = Arc::new(Barrier::new(threads + 1));
    let done = Arc::new(Barrier::new(threads + 1));
    let per_thread = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let nonce = Arc::new(AtomicU64::new(FIRST_NONCE));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (store, start, done, per_thread, stop, nonce) = (
                Arc::clone(&store),
                Arc::clone(&start),
                Arc::clone(&done),
                Arc::clone(&per_thread),
                Arc::clone(&stop),
                Arc::clone(&nonce),
            );
            std::thread::spawn(move || {
                let config = config();
                let params = params();
                let id = format!("s{t}");
                loop {
                    start.wait();
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let mut last: Option<Durable> = None;
                    for _ in 0..per_thread.load(Ordering::Acquire) {
                        let n = nonce.fetch_add(1, Ordering::Relaxed);
                        let (_, d) = store
                            .apply_sync(&id, pre_exec(&config, &params, n))
                            .unwrap();
                        // The daemon replies only after the verdict is durable.
                        d.wait().unwrap();
                        last = Some(d);
                    }
                    drop(last);
                    done.wait();
                }
            })
        })
        .collect();

    let mut g = c.benchmark_group("apply_durable");
    g.throughput(Throughput::Elements(1));
    g.bench_function(format!("batch/{threads}"), |b| {
        b.iter_custom(|iters| {
            let each = iters.div_ceil(threads as u64).max(1);
            per_thread.store(each, Ordering::Release);
            let t0 = Instant::now();
            start.wait();
            done.wait();
            let elapsed = t0.elapsed();
            // Report per verdict actually made (each * threads may exceed iters).
            #[allow(clippy::cast_precision_loss)]
            let scale = iters as f64 / (each * threads as u64) as f64;
            Duration::from_secs_f64(elapsed.as_secs_f64() * scale)
        });
    });
    g.finish();
    report(&store);
    stop.store(true, Ordering::Release);
    start.wait();
    for w in workers {
        w.join().unwrap();
    }
    store.close_sync().unwrap();
}

/// 64 sessions driven by 2 threads, the way an async daemon on a 2-core machine drives
/// them: each thread round-robins over its 32 sessions, submits the next call of every
/// session whose last verdict is durable, and blocks only when none is.
fn durable_64_sessions_2_threads(c: &mut Criterion) {
    const SESSIONS: usize = 64;
    const THREADS: usize = 2;
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, Durability::Batch);
    for t in 0..SESSIONS {
        store
            .create_sync(session(&format!("s{t}")))
            .unwrap()
            .wait()
            .unwrap();
    }
    let nonce = AtomicU64::new(FIRST_NONCE);
    let config = config();
    let params = params();
    let mut g = c.benchmark_group("apply_durable");
    g.throughput(Throughput::Elements(1));
    g.bench_function("batch/64_sessions_2_threads", |b| {
        b.iter_custom(|iters| {
            let each = iters.div_ceil(THREADS as u64).max(1);
            let t0 = Instant::now();
            std::thread::scope(|scope| {
                for t in 0..THREADS {
                    let (store, nonce, config, params) = (&store, &nonce, &config, &params);
                    scope.spawn(move || {
                        let ids: Vec<String> = (0..SESSIONS / THREADS)
                            .map(|i| format!("s{}", i * THREADS + t))
                            .collect();
                        let mut inflight: Vec<Option<Durable>> = vec![None; ids.len()];
                        let (mut submitted, mut done) = (0_u64, 0_u64);
                        while done < each {
                            let mut progress = false;
                            for (id, slot) in ids.iter().zip(inflight.iter_mut()) {
                                if let Some(d) = slot {
                                    if d.try_result().is_none() {
                                        continue;
                                    }
                                    d.wait().unwrap();
                                    *slot = None;
                                    done += 1;
                                    progress = true;
                                }
                                if submitted < each {
                                    let n = nonce.fetch_add(1, Ordering::Relaxed);
                                    let (_, d) =
                                        store.apply_sync(id, pre_exec(config, params, n)).unwrap();
                                    *slot = Some(d);
                                    submitted += 1;
                                    progress = true;
                                }
                            }
                            if !progress {
                                // Block on the oldest batch: everything before it completes too.
                                if let Some(d) =
                                    inflight.iter().flatten().min_by_key(|d| d.batch_seq())
                                {
                                    d.wait().unwrap();
                                }
                            }
                        }
                    });
                }
            });
            let elapsed = t0.elapsed();
            #[allow(clippy::cast_precision_loss)]
            let scale = iters as f64 / (each * THREADS as u64) as f64;
            Duration::from_secs_f64(elapsed.as_secs_f64() * scale)
        });
    });
    g.finish();
    report(&store);
    store.close_sync().unwrap();
}

/// Print how the group commit went: changes per batch, time per batch.
fn report(store: &EmbeddedStore) {
    let st = store.writer_stats();
    #[allow(clippy::cast_precision_loss)]
    let per = st.sessions_written as f64 / st.batches.max(1) as f64;
    let each = st.write_time / u32::try_from(st.batches.max(1)).unwrap_or(u32::MAX);
    eprintln!(
        "writer: {} batches, {per:.1} sessions per batch, {each:?} per batch (encode+write+fsync)",
        st.batches
    );
}

fn durable_1(c: &mut Criterion) {
    durable_throughput(c, 1);
}

fn durable_64(c: &mut Criterion) {
    durable_throughput(c, 64);
}

criterion_group!(
    benches,
    encode,
    apply_only,
    durable_1,
    durable_64,
    durable_64_sessions_2_threads
);
criterion_main!(benches);
