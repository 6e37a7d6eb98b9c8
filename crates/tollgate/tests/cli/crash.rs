//! kill -9 of `tollgate serve` under load, at many points (six fixed, six random from a
//! printed seed). Agents fire calls (and settle the allowed ones, now and then with a cost
//! the daemon cannot read) from eight sessions that share two agent budgets; the daemon
//! is SIGKILLed mid-load, restarted, and every agent resumes its session and resends the
//! call it never heard back about, with the same nonce. After each restart, before any
//! new call: the daemon's state is the fold of its audit log (read with the public key
//! alone) session by session, every budget reconciles entry by entry, and no nonce was
//! ever ALLOWed twice in a session.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate_audit::{Event, SessionEvent};
use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::{BudgetScope, Money, Verdict};
use tollgate_proto::sp1;
use tollgate_store::{BudgetKey, Ledger};

use crate::daemon::Serve;
use crate::s;

const CONFIG: &str = r#"
[limits]
registrations_per_second_per_peer = 1000
pre_exec_per_second_per_session = 100000

[state]
snapshot_interval_secs = 1
snapshot_entries = 50

[guard.default]
budget_usd = 0.5
budget_scope = "per_agent"
settlement = "actual"
"#;

const SESSIONS: usize = 8;

fn start(dir: &Path) -> Serve {
    Serve::start_with(dir, &["--config", s(&dir.join("crash.toml"))])
}

fn client_config(dir: &Path, agent: &str) -> ClientConfig {
    let secret = std::fs::read_to_string(dir.join("secrets/default.secret")).unwrap();
    let mut c = ClientConfig::new(
        dir.join("tollgate.sock"),
        "default",
        secret.trim().as_bytes(),
        agent,
    );
    c.timeout = Duration::from_secs(5);
    c
}

fn agent_of(i: usize) -> String {
    format!("crash-{}", i % 2)
}

/// One agent's session and the call it sent last without hearing back.
struct Agent {
    session: String,
    next_call: u64,
    unanswered: Option<(u64, u64, f64)>,
}

/// Run calls from every session until `stop` is set (the daemon is killed under it).
async fn load(dir: &Path, agents: &mut [Agent], stop: Arc<AtomicBool>, salt: u64) {
    let mut tasks = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        let cfg = client_config(dir, &agent_of(i));
        let session = a.session.clone();
        let mut next = a.next_call;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let Ok(c) = DaemonClient::resume(cfg, &session).await else {
                return (next, None);
            };
            let p = tollgate_core::json::parse_str(r#"{"q":"load"}"#).unwrap();
            let hash = tollgate_core::json::canonical_hash(&p).unwrap().0.to_vec();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let nonce = (salt << 32) | ((i as u64) << 24) | n;
                let cost = 0.000_5 * ((n % 4) as f64 + 1.0);
                let v = c
                    .pre_exec_request(sp1::PreExecRequest {
                        session_id: session.clone(),
                        call_number: next,
                        tool_name: ["search", "fetch", "read"][(n % 3) as usize].into(),
                        tool_params_hash: hash.clone(),
                        estimated_cost_usd: cost,
                        nonce,
                        ..Default::default()
                    })
                    .await;
                if v.response.is_none() {
                    // The daemon is gone: this call was never answered.
                    return (next, Some((next, nonce, cost)));
                }
                next += 1;
                if v.verdict == Verdict::Allow {
                    let actual = if n.is_multiple_of(5) {
                        f64::NAN
                    } else {
                        cost / 2.0
                    };
                    if c.post_exec(v.call_number, actual, true, "").await.is_err() {
                        return (next, None);
                    }
                }
            }
            (next, None)
        }));
    }
    for (a, t) in agents.iter_mut().zip(tasks) {
        let (next, unanswered) = t.await.unwrap();
        a.next_call = next;
        a.unanswered = unanswered;
    }
}

/// The fold of the whole audit log, checking on the way that each budget's entries chain
/// (`budget_before` is where the previous entry left it) and that no nonce is ALLOWed
/// twice in a session.
fn fold_and_reconcile(dir: &Path) -> Ledger {
    let public = std::fs::read_to_string(dir.join("audit.pub")).unwrap();
    let key = tollgate_audit::keys::parse_public_key(&public).unwrap();
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(key),
        ..Default::default()
    };
    let mut ledger = Ledger::new();
    let mut budget_of: HashMap<String, String> = HashMap::new();
    let mut running: HashMap<String, Money> = HashMap::new();
    let mut allowed: HashMap<String, HashSet<u64>> = HashMap::new();
    tollgate_audit::verify_paths(&[dir.join("audit")], &opts, &mut |e| {
        if let Event::Session(ev) = &e.event {
            let (sid, before, after) = match ev {
                SessionEvent::Opened(o) => {
                    assert_eq!(o.budget_scope, BudgetScope::PerAgent);
                    budget_of.insert(o.session_id.clone(), o.agent_id.clone());
                    let r = running.entry(o.agent_id.clone()).or_insert(o.budget_before);
                    assert_eq!(
                        *r, o.budget_before,
                        "a session joins the budget as it stands"
                    );
                    (None, o.budget_before, o.budget_before)
                }
                SessionEvent::Verdict(v) => {
                    if v.verdict == Verdict::Allow {
                        assert!(
                            allowed
                                .entry(v.session_id.clone())
                                .or_default()
                                .insert(v.nonce),
                            "nonce {} ALLOWed twice in {}",
                            v.nonce,
                            v.session_id
                        );
                    }
                    (Some(&v.session_id), v.budget_before, v.budget_after)
                }
                SessionEvent::Settled(st) => {
                    (Some(&st.session_id), st.budget_before, st.budget_after)
                }
                SessionEvent::HumanDecision(h) => {
                    (Some(&h.session_id), h.budget_remaining, h.budget_remaining)
                }
                SessionEvent::Closed(c) => {
                    (Some(&c.session_id), c.budget_remaining, c.budget_remaining)
                }
            };
            if let Some(sid) = sid {
                let r = running.get_mut(&budget_of[sid]).unwrap();
                assert_eq!(*r, before, "entry {} breaks the budget chain", e.index);
                *r = after;
            }
        }
        ledger
            .fold(e.index, tollgate_core::Digest::default(), None, &e.event)
            .unwrap();
    })
    .unwrap();
    for (agent, r) in &running {
        let b = ledger
            .budgets
            .get(&BudgetKey::Agent("default".into(), agent.clone()))
            .unwrap();
        assert_eq!(b.remaining, *r);
    }
    ledger
}

#[test]
fn kill_9_under_load_leaves_the_state_the_fold_of_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("crash.toml"), CONFIG).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut daemon = start(dir);
    let mut agents: Vec<Agent> = rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..SESSIONS {
            let c = DaemonClient::connect(client_config(dir, &agent_of(i)))
                .await
                .unwrap();
            v.push(Agent {
                session: c.session_id().to_owned(),
                next_call: 1,
                unanswered: None,
            });
        }
        v
    });
    // Kill points, in milliseconds of load: six fixed ones (early, mid and late relative to
    // the snapshot interval and count) and six random ones, from a seed printed for a rerun
    // (TOLLGATE_CRASH_SEED=N reproduces a run).
    let seed = std::env::var("TOLLGATE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("kill points from TOLLGATE_CRASH_SEED={seed}");
    let mut x = seed;
    let mut random_ms = || {
        // xorshift64: enough to spread kill points, reproducible from the seed.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % 1_500
    };
    let points: Vec<u64> = [40u64, 260, 5, 730, 120, 1_100]
        .into_iter()
        .chain((0..6).map(|_| random_ms()))
        .collect();
    let mut resent = 0;
    for (round, ms) in points.into_iter().enumerate() {
        let stop = Arc::new(AtomicBool::new(false));
        let killer = {
            let stop = stop.clone();
            let pid = daemon.child.id();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(ms));
                // SIGKILL: no drain, no flush, no last snapshot.
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                stop.store(true, Ordering::Relaxed);
            })
        };
        rt.block_on(load(dir, &mut agents, stop, round as u64 + 1));
        killer.join().unwrap();
        daemon.child.wait().unwrap();
        daemon = start(dir);

        // Before any new call: the state each session reports is the fold of the log.
        let ledger = fold_and_reconcile(dir);
        rt.block_on(async {
            for (i, a) in agents.iter().enumerate() {
                let c = DaemonClient::resume(client_config(dir, &agent_of(i)), &a.session)
                    .await
                    .unwrap();
                let st = c.session_state().await.unwrap();
                let folded = ledger.session(&a.session).unwrap();
                assert_eq!(
                    (
                        st.budget_remaining_nanos,
                        st.budget_spent_nanos,
                        st.total_calls,
                        st.circuit_tripped,
                        st.last_tool_name.as_str()
                    ),
                    (
                        folded.state.budget_remaining.0,
                        folded.state.budget_spent.0,
                        folded.state.total_calls,
                        folded.state.circuit_tripped,
                        folded.state.last_tool_name.as_deref().unwrap_or("")
                    ),
                    "round {round}: session {}",
                    a.session
                );
            }
        });
        // The retry of every call that got no answer, with its nonce: the same call
        // number (refused if the daemon took it, decided if it did not), or the next.
        rt.block_on(async {
            for (i, a) in agents.iter_mut().enumerate() {
                let Some((number, nonce, cost)) = a.unanswered.take() else {
                    continue;
                };
                let c = DaemonClient::resume(client_config(dir, &agent_of(i)), &a.session)
                    .await
                    .unwrap();
                let folded_last = ledger.session(&a.session).unwrap().last_call_number;
                let call_number = if i % 2 == 0 { number } else { folded_last + 1 };
                let p = tollgate_core::json::parse_str(r#"{"q":"load"}"#).unwrap();
                let v = c
                    .pre_exec_request(sp1::PreExecRequest {
                        session_id: a.session.clone(),
                        call_number,
                        tool_name: "search".into(),
                        tool_params_hash: tollgate_core::json::canonical_hash(&p)
                            .unwrap()
                            .0
                            .to_vec(),
                        estimated_cost_usd: cost,
                        nonce,
                        ..Default::default()
                    })
                    .await;
                resent += 1;
                if v.response.is_some() {
                    a.next_call = a.next_call.max(call_number + 1);
                }
                a.next_call = a.next_call.max(folded_last + 1);
            }
        });
    }
    assert!(resent > 0, "some calls were in flight at the kills");
    // A graceful stop, and the whole log verifies and still folds and reconciles.
    let _ = Command::new("kill")
        .args(["-TERM", &daemon.child.id().to_string()])
        .status();
    daemon.child.wait().unwrap();
    fold_and_reconcile(dir);
}
