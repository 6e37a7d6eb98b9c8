//! Replay throughput (`tollgate policy replay`, issue 19): a generated log of sessions
//! (openings, verdicts decided by `rules::decide`, settlements, closings) written by the
//! real audit writer, then
//!
//! - `verify`: the audit crate's verifier over the files (signatures and links), then
//!   anchored on the writer's checkpoint (links, hand-overs and the checkpoint's
//!   signature), alone and folding as it goes (end to end, as the command runs);
//! - `fold`: `tollgate_store::replay::Replay` over the verified entries, under the very
//!   configuration that wrote them (every verdict replayed, none flips) and under a
//!   candidate with a `forbid` added (one tool's verdicts flip);
//!
//! each printed as entries per second. `cargo bench -p tollgate-store --bench replay`;
//! `REPLAY_ENTRIES` sets the log's size (default 1,000,000), `REPLAY_LOG_DIR` keeps the
//! log there (for timing `tollgate policy replay` on it with an empty configuration,
//! whose default guard is this one).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tollgate_audit::{
    AuditEntry, CloseReason, FsyncPolicy, SessionEvent, SigningKey, VerifyOptions, Writer,
    WriterConfig,
};
use tollgate_core::{BudgetScope, GuardConfig, Money, Params, ToolCall};
use tollgate_policy::compose::Enforced;
use tollgate_store::replay::{Candidate, Replay};
use tollgate_store::{ops, rules, Policy, Session, SessionMeta};

const START_NS: i64 = 1_796_040_000_000_000_000;
const CALLS_PER_SESSION: u64 = 200;

fn guard() -> GuardConfig {
    // The daemon's embedded default guard (`tollgate serve` with an empty configuration).
    GuardConfig {
        budget: Money(1_000_000_000),
        max_repeat_calls: 3,
        ..GuardConfig::default()
    }
}

fn main() {
    let entries: u64 = std::env::var("REPLAY_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::env::var("REPLAY_LOG_DIR").map_or_else(|_| tmp.path().join("audit"), Into::into);
    let key = SigningKey::from_bytes(&[9u8; 32]);
    let public = key.verifying_key();
    let mut cfg = WriterConfig::new(&dir);
    cfg.fsync = FsyncPolicy::Never;
    cfg.rotate_daily = false;
    let (w, _) = Writer::open(cfg, key).unwrap();
    let policy = Arc::new(Policy::new(guard()));
    let tools = ["search", "read", "pay", "mail"];
    let t = Instant::now();
    let mut written = 0u64;
    let mut pending = Vec::new();
    let mut now = START_NS;
    let mut n = 0u64;
    while written < entries {
        n += 1;
        let meta = SessionMeta {
            session_id: format!("s-{n}"),
            agent_id: format!("agent-{}", n % 50),
            organization_id: "default".into(),
            budget_scope: BudgetScope::PerSession,
            created_at_ns: now,
        };
        let mut s = Session::new(meta, policy.clone(), now);
        let mut events: Vec<SessionEvent> = vec![ops::open(&mut s, now).into()];
        for c in 1..=CALLS_PER_SESSION {
            now += 1_000;
            let digest = tollgate_audit::format::sha256(&(n * 1000 + c / 2).to_be_bytes());
            let call = ToolCall {
                tool_name: tools[(c % 4) as usize],
                params: Params::digest(digest),
                nonce: None,
                estimated_cost: Money(1_000),
                raw_params: None,
            };
            let d = rules::decide(&mut s, None, &call, None, c, now, 0.5);
            let allowed = d.decision.verdict == tollgate_core::Verdict::Allow;
            events.push(d.record.into());
            if allowed && c % 3 == 0 {
                now += 1_000;
                events.push(ops::settle(&mut s, c, 0.000_001, true, false, now).into());
            }
        }
        now += 1_000;
        events.push(ops::close(&mut s, CloseReason::Agent, now).into());
        for e in events {
            written += 1;
            pending.push(w.submit(e));
        }
        if pending.len() > 8192 {
            for p in pending.drain(..) {
                p.wait().unwrap();
            }
        }
    }
    for p in pending.drain(..) {
        p.wait().unwrap();
    }
    w.shutdown().unwrap();
    println!(
        "generated {written} entries ({n} sessions) in {:.2} s into {}",
        t.elapsed().as_secs_f64(),
        dir.display()
    );

    let opts = VerifyOptions {
        trusted_key: Some(public),
        ..VerifyOptions::default()
    };
    let mut all: Vec<AuditEntry> = Vec::with_capacity(usize::try_from(written).unwrap());
    let t = Instant::now();
    tollgate_audit::verify_paths(std::slice::from_ref(&dir), &opts, &mut |e| {
        all.push(e.clone())
    })
    .unwrap();
    let secs = t.elapsed().as_secs_f64();
    println!(
        "verify: {} entries in {secs:.2} s: {:.0} entries/s",
        all.len(),
        all.len() as f64 / secs
    );

    // The writer's checkpoint (written at shutdown, counting every entry) vouching for
    // the signatures, as `tollgate policy replay` verifies a log directory.
    let anchored = VerifyOptions {
        checkpoint: Some(tollgate_audit::read_checkpoint(&dir).unwrap()),
        anchor_on_checkpoint: true,
        ..opts.clone()
    };
    let mut k = 0u64;
    let t = Instant::now();
    tollgate_audit::verify_paths(std::slice::from_ref(&dir), &anchored, &mut |_| k += 1).unwrap();
    let secs = t.elapsed().as_secs_f64();
    println!(
        "verify anchored on the checkpoint: {k} entries in {secs:.2} s: {:.0} entries/s",
        k as f64 / secs
    );

    let same = Candidate {
        default_guard: policy.clone(),
        agent_guards: HashMap::new(),
        set: None,
    };
    // End to end as the command runs: anchored verification, folding each entry as it
    // is verified.
    let mut replay = Replay::new(same.clone());
    let mut k = 0u64;
    let t = Instant::now();
    tollgate_audit::verify_paths(std::slice::from_ref(&dir), &anchored, &mut |e| {
        k += 1;
        replay.fold(e.index, &e.event).unwrap();
    })
    .unwrap();
    let secs = t.elapsed().as_secs_f64();
    println!(
        "verify anchored + fold (same config): {k} entries in {secs:.2} s: {:.0} entries/s",
        k as f64 / secs
    );
    let forbid = tollgate_policy::load(
        &[tollgate_policy::Source::new(
            "bench.cedar",
            "@id(\"no-pay\") forbid (principal, action == Action::\"pay\", resource);\n",
        )],
        &tollgate_policy::Options::default(),
    )
    .unwrap();
    let with_forbid = Candidate {
        set: Some(Arc::new(Enforced {
            policies: forbid.policies,
            trip_on_refusal: false,
        })),
        ..same.clone()
    };
    for (name, candidate) in [("same config", same), ("forbid added", with_forbid)] {
        let mut replay = Replay::new(candidate);
        let t = Instant::now();
        let (mut verdicts, mut flips) = (0u64, 0u64);
        for e in &all {
            if let Some(o) = replay.fold(e.index, &e.event).unwrap() {
                verdicts += 1;
                if let (Ok((v, _)), tollgate_audit::Event::Session(SessionEvent::Verdict(r))) =
                    (&o.candidate, &e.event)
                {
                    flips += u64::from(*v != r.verdict);
                }
            }
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "fold ({name}): {} entries ({verdicts} verdicts, {flips} flips) in {secs:.2} s: {:.0} entries/s",
            all.len(),
            all.len() as f64 / secs
        );
    }
}
