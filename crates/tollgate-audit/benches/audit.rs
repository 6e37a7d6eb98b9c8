//! Audit log throughput: sign-only baseline, signed entries/s written with batch fsync
//! from 1 and from 64 concurrent writers, and verify entries/s.
//!
//! `cargo bench -p tollgate-audit --bench audit -- --warm-up-time 1 --measurement-time 3`
//!
//! The log goes to a temporary directory under Cargo's target directory (a real disk, not
//! tmpfs), so fsync costs what it costs there.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ed25519_dalek::{Signer, SigningKey};
use tollgate_audit::format::{self, Position};
use tollgate_audit::{
    files, verify, Event, FsyncPolicy, KeyId, VerdictRecord, VerifyOptions, Writer, WriterConfig,
};
use tollgate_core::{DenyReason, Digest, Money, Reason, Verdict};

fn record(i: u64) -> VerdictRecord {
    VerdictRecord {
        timestamp_ns: 1_796_040_000_000_000_000 + i as i64,
        session_id: format!("session-{:04}", i % 64),
        agent_id: "agent-research-7".into(),
        organization_id: "org-acme".into(),
        call_number: i,
        tool_name: "web_search".into(),
        params_hash: Digest([7; 32]),
        verdict: Verdict::Deny,
        deny_reason: Some(DenyReason::BudgetExhausted),
        reason: Reason::BudgetOverrun,
        probabilistic: false,
        budget_before: Money(1_000_000_000),
        budget_after: Money(998_500_000),
        operator_id: None,
        estimated_cost: Money(1_500_000),
        nonce: i,
        config_digest: Some(Digest([9; 32])),
        session_seq: i + 1,
        budget_version: 0,
        policy: None,
        shadow: Vec::new(),
        params: None,
        upstream: None,
        draw: None,
    }
}

fn bench_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn sign_only(c: &mut Criterion) {
    let key = SigningKey::from_bytes(&[1; 32]);
    let kid = KeyId::of(key.verifying_key().as_bytes());
    let prev = format::genesis_hash();
    let event = Event::Session(record(1).into());
    let pos = Position {
        index: 1,
        timestamp_ns: 1,
        entry_id: uuid::Uuid::nil(),
        prev_hash: &prev,
    };
    let msg = format::encode_record(pos, &event, &key, kid).unwrap();
    let mut g = c.benchmark_group("baseline");
    g.throughput(Throughput::Elements(1));
    g.bench_function("ed25519_sign_only", |b| b.iter(|| key.sign(&msg)));
    g.bench_function("encode_sign_hash_record", |b| {
        b.iter(|| {
            let r = format::encode_record(pos, &event, &key, kid).unwrap();
            format::sha256(&r)
        })
    });
    g.finish();
}

/// Append `total` entries from `threads` threads, each waiting for its own entry to be
/// durable before submitting the next (like a verdict waiting on its audit entry).
fn write_with(threads: u64, total: u64) -> (Duration, tollgate_audit::Stats) {
    let dir = bench_dir();
    let mut cfg = WriterConfig::new(dir.path());
    cfg.fsync = FsyncPolicy::Batch;
    let (w, _) = Writer::open(cfg, SigningKey::from_bytes(&[1; 32])).unwrap();
    let w = Arc::new(w);
    let per = total.div_ceil(threads);
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let w = w.clone();
            std::thread::spawn(move || {
                for i in 0..per {
                    w.append(record(t * per + i)).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = start.elapsed();
    let stats = w.stats();
    w.shutdown().unwrap();
    (elapsed, stats)
}

fn write_batch_fsync(c: &mut Criterion) {
    let mut g = c.benchmark_group("write_fsync_batch");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    for threads in [1u64, 64] {
        g.bench_function(format!("{threads}_writers"), |b| {
            b.iter_custom(|iters| {
                let total = iters.max(threads);
                let (d, _) = write_with(threads, total);
                // Scale to the iterations asked for.
                d.mul_f64(iters as f64 / total as f64)
            })
        });
        // One plain run to report how many entries shared each fsync.
        let (d, stats) = write_with(threads, 20_000);
        eprintln!(
            "write_fsync_batch/{threads}_writers: 20000 entries in {:.3} s = {:.0} entries/s, {} fsyncs ({:.1} entries per fsync)",
            d.as_secs_f64(),
            20_000.0 / d.as_secs_f64(),
            stats.syncs,
            stats.entries as f64 / stats.syncs.max(1) as f64
        );
    }
    g.finish();
}

fn verify_speed(c: &mut Criterion) {
    let dir = bench_dir();
    let mut cfg = WriterConfig::new(dir.path());
    cfg.fsync = FsyncPolicy::Never;
    let (w, report) = Writer::open(cfg, SigningKey::from_bytes(&[1; 32])).unwrap();
    let n = 10_000u64;
    let pending: Vec<_> = (0..n).map(|i| w.submit(record(i))).collect();
    for p in pending {
        p.wait().unwrap();
    }
    w.shutdown().unwrap();
    let bytes = files::read_log_file(&report.file).unwrap();
    let opts = VerifyOptions {
        trusted_key: Some(SigningKey::from_bytes(&[1; 32]).verifying_key()),
        ..VerifyOptions::default()
    };
    let mut g = c.benchmark_group("verify");
    g.throughput(Throughput::Elements(n));
    g.sample_size(10);
    g.bench_function("10k_entries", |b| {
        b.iter(|| {
            let s = verify(&[("bench", &bytes)], &opts).unwrap();
            assert_eq!(s.entries, n);
        })
    });
    // The same log anchored on the checkpoint the writer left at shutdown (it counts
    // every entry): links and the checkpoint's signature instead of every signature.
    let anchored = VerifyOptions {
        checkpoint: Some(tollgate_audit::read_checkpoint(dir.path()).unwrap()),
        anchor_on_checkpoint: true,
        ..opts.clone()
    };
    g.bench_function("10k_entries_anchored", |b| {
        b.iter(|| {
            let s = verify(&[("bench", &bytes)], &anchored).unwrap();
            assert!(s.checkpoint_matched);
            assert_eq!(s.entries, n);
        })
    });
    g.finish();
}

criterion_group!(benches, sign_only, write_batch_fsync, verify_speed);
criterion_main!(benches);
