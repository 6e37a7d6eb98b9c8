//! A fleet of `tollgate serve` processes sharing session state in a real Redis and writing
//! their signed chains to a real PostgreSQL, under load and faults. 200 agents of one
//! organization spend one `per_organization` budget through three daemons, with costs
//! that would total several times the budget, registering new sessions (which join the
//! budget while the others spend it) and resuming theirs on other daemons throughout the
//! load. After each run (only exactness is checked, never speed or progress), from the chains in
//! PostgreSQL (verified with the public keys alone) and the budget in Redis (as the
//! daemons report it):
//! - nothing was overspent: Redis's remaining budget is the budget minus exactly what the
//!   chains' verdicts and settlements took, to the nano-dollar, and is never below 0;
//! - no nonce was ALLOWed twice in a session, across all chains;
//! - every ALLOW an agent was given is in some daemon's chain.
//!
//! Faults: a daemon killed with SIGKILL mid-load (its agents resume through another daemon
//! and resend their unanswered call with the same nonce), a private Redis (AOF, fsync
//! always) killed and restarted mid-load, a private PostgreSQL stopped and started
//! mid-load.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_audit::{Event, SessionEvent};
use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::Verdict;
use tollgate_proto::sp1;

use crate::daemon::Serve;
use crate::servers::{PrivatePostgres, PrivateRedis};
use crate::{code, s, text, tollgate};

mod policy;
mod replay;

const SHARED_REDIS: &str = "redis://127.0.0.1:6379/0";
const SHARED_PG: &str = "postgres://postgres@127.0.0.1:5432/test";
const SECRET: &str = "fleet-test-agents-secret-0123456789";
const OPERATOR_SECRET: &str = "fleet-test-operators-secret-0123456789";
const BUDGET_NANOS: i64 = 2_000_000_000; // $2
const AGENTS: usize = 200;
const DAEMONS: usize = 3;
/// The load test's calls cost 1 to 4 units (0.4 to 1.6 mills, 1 mill on average): the
/// budget pays for 2,000 calls of the mean cost.
const UNIT_NANOS: i64 = 400_000;
/// Calls each agent of the load test makes (distinct nonces, each cost 8 times): the
/// 200 agents ask 200 × 32 × 1 mill = $6.40, 3.2 times the budget.
const CALLS_PER_AGENT: u64 = 32;

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    format!(
        "{tag}_{}_{}_{}",
        std::process::id(),
        t % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Three daemons on one Redis and one PostgreSQL.
struct Fleet {
    dirs: Vec<PathBuf>,
    daemons: Vec<Option<Serve>>,
    pg_url: String,
    schema: String,
    redis_url: String,
    prefix: String,
}

impl Fleet {
    fn start(root: &Path, redis_url: &str, pg_url: &str) -> Fleet {
        let urls = vec![redis_url.to_owned(); DAEMONS];
        Fleet::start_with(root, redis_url, &urls, pg_url, 2.0, 1, "")
    }

    /// One daemon per entry of `urls` (each daemon's Redis URL: the same server, maybe
    /// through a proxy); `redis_url` is the server itself (for the cleanup).
    fn start_with(
        root: &Path,
        redis_url: &str,
        urls: &[String],
        pg_url: &str,
        budget_usd: f64,
        sweep_secs: u64,
        limits: &str,
    ) -> Fleet {
        let extra = Extra {
            limits,
            ..Extra::default()
        };
        Fleet::start_extra(root, redis_url, urls, pg_url, budget_usd, sweep_secs, extra)
    }

    /// As `start_with`, with `extra` configuration in each daemon's file.
    fn start_extra(
        root: &Path,
        redis_url: &str,
        urls: &[String],
        pg_url: &str,
        budget_usd: f64,
        sweep_secs: u64,
        extra: Extra<'_>,
    ) -> Fleet {
        let Extra {
            limits,
            guards,
            acme,
            tables,
        } = extra;
        let prefix = unique("tgfleet");
        let schema = unique("fleet");
        let mut f = Fleet {
            dirs: Vec::new(),
            daemons: Vec::new(),
            pg_url: pg_url.to_owned(),
            schema: schema.clone(),
            redis_url: redis_url.to_owned(),
            prefix: prefix.clone(),
        };
        for (i, url) in urls.iter().enumerate() {
            let dir = root.join(format!("d{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            let config = format!(
                r#"
[limits]
registrations_per_second_per_peer = 100000
pre_exec_per_second_per_session = 100000
{limits}

[state]
backend = "redis"
url = "{url}"
key_prefix = "{prefix}"
durability = "none"
command_timeout_ms = 2000
grace_secs = 1
sweep_interval_secs = {sweep_secs}

[audit]
sink = "postgres"
url = "{pg_url}"
schema = "{schema}"

[guard.default]
budget_usd = {budget_usd:?}
budget_scope = "per_organization"
settlement = "actual"
max_repeat_calls = 0

[guard.agents.reviewed]
hitl_mode = "always"
{guards}

[[organization]]
id = "acme"
secret = "{SECRET}"
operator_secret = "fleet-test-operators-secret-0123456789"
{acme}

[[organization]]
id = "beta"
secret = "{SECRET}"
operator_secret = "fleet-test-operators-secret-0123456789"
{tables}
"#
            );
            std::fs::write(dir.join("fleet.toml"), config).unwrap();
            f.daemons.push(Some(Serve::start_logged(
                &dir,
                &["--config", s(&dir.join("fleet.toml"))],
                &root.join(format!("d{i}.stderr")),
            )));
            f.dirs.push(dir);
        }
        f
    }

    /// No daemons: only what a test left in the shared servers, removed when dropped.
    fn leftovers(schema: String, prefix: String) -> Fleet {
        Fleet {
            dirs: Vec::new(),
            daemons: Vec::new(),
            pg_url: SHARED_PG.to_owned(),
            schema,
            redis_url: SHARED_REDIS.to_owned(),
            prefix,
        }
    }

    fn client_config(&self, daemon: usize, org: &str, agent: usize) -> ClientConfig {
        let mut c = ClientConfig::new(
            self.dirs[daemon].join("tollgate.sock"),
            org,
            SECRET.as_bytes(),
            &format!("agent-{agent}"),
        );
        c.timeout = Duration::from_secs(5);
        c
    }

    fn kill_9(&mut self, daemon: usize) {
        if let Some(mut d) = self.daemons[daemon].take() {
            d.child.kill().unwrap();
            d.child.wait().unwrap();
        }
    }

    fn stop_all(&mut self) {
        for d in self.daemons.iter_mut() {
            if let Some(d) = d.take() {
                assert!(d.terminate().success(), "a daemon did not stop cleanly");
            }
        }
    }
}

/// The daemons are killed (by `Serve`'s own drop) and the run's schema and keys go: the
/// shared servers keep nothing of a test.
impl Drop for Fleet {
    fn drop(&mut self) {
        for d in self.daemons.iter_mut() {
            drop(d.take());
        }
        let (pg, schema, redis, prefix) = (
            self.pg_url.clone(),
            self.schema.clone(),
            self.redis_url.clone(),
            self.prefix.clone(),
        );
        // On a thread of its own: a test's runtime may be on this one.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(c) = tollgate_pg::connect(&tollgate_pg::PgSettings::new(&pg)).await {
                    let _ = c
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                        .await;
                }
            });
            if let Ok(mut c) = redis::Client::open(redis).and_then(|c| c.get_connection()) {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{prefix}*"))
                    .query(&mut c)
                    .unwrap_or_default();
                if !keys.is_empty() {
                    let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&keys).query(&mut c);
                }
            }
        })
        .join();
    }
}

/// Configuration added to each daemon's file by `Fleet::start_extra`.
#[derive(Default, Clone, Copy)]
struct Extra<'a> {
    /// Keys of `[limits]`.
    limits: &'a str,
    /// Tables after `[guard.agents.reviewed]`.
    guards: &'a str,
    /// Keys and `[[organization.agent]]` tables of organization acme.
    acme: &'a str,
    /// Tables at the end of the file (`[policy]`).
    tables: &'a str,
}

/// What the agents saw.
#[derive(Default)]
struct Seen {
    /// (session, nonce) of every ALLOW an agent was given.
    allowed: HashSet<(String, u64)>,
    /// Calls answered, and calls refused or unanswered (fail closed).
    answered: u64,
    failed: u64,
    /// Calls resent after no answer.
    resent: u64,
    /// Sessions registered during the load, and sessions resumed on another daemon.
    registered: u64,
    resumed: u64,
    /// Registrations and resumptions refused (a dead daemon, an outage): retried.
    refused_joins: u64,
    /// Σ of the estimated costs of the distinct calls answered (each nonce once): what
    /// the agents asked of the budget.
    demanded_nanos: i64,
    /// Calls DENYed because the budget could not pay for them (`budget_exhausted`,
    /// `budget_overrun`), and DENYs of any reason.
    budget_denies: u64,
    denies: u64,
    /// Agents that made all their calls (with `Behaviour::calls`).
    finished: u64,
}

/// One agent: its current session and where it goes.
struct Agent {
    org: &'static str,
    index: usize,
    session: String,
    daemon: usize,
}

fn live(fleet_alive: &[Arc<AtomicBool>], from: usize) -> usize {
    (0..DAEMONS)
        .map(|k| (from + k) % DAEMONS)
        .find(|&d| fleet_alive[d].load(Ordering::Relaxed))
        .unwrap_or(from)
}

/// How the agents behave.
#[derive(Clone, Copy, Default)]
struct Behaviour {
    /// Every few calls an agent leaves its session: it registers a new one (joining the
    /// organization's budget while the others spend it) or resumes its session through
    /// the next daemon, in turn.
    churn: bool,
    /// Each agent makes this many calls (distinct nonces), each answered, then stops;
    /// `None`: calls until the run's time is up.
    calls: Option<u64>,
    /// What one unit of a call's cost is (calls cost 1 to 4 units); 0: 1 mill.
    unit_nanos: i64,
}

/// Every agent fires calls until `stop` (or until it made `how.calls`): each call a fresh
/// nonce and a cost of 1-4 units; an ALLOW is settled at its estimate. A call with no
/// answer is resent with the same nonce and call number (after resuming the session,
/// through another daemon if its own is gone) until it is answered or the run stops.
async fn load(
    fleet: &Fleet,
    agents: &mut [Agent],
    alive: &[Arc<AtomicBool>],
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    salt: u64,
    how: Behaviour,
) {
    let mut tasks = Vec::new();
    for a in agents.iter() {
        let configs: Vec<ClientConfig> = (0..DAEMONS)
            .map(|d| fleet.client_config(d, a.org, a.index))
            .collect();
        let (mut session, index, mut daemon) = (a.session.clone(), a.index, a.daemon);
        let (stop, seen) = (stop.clone(), seen.clone());
        let alive: Vec<Arc<AtomicBool>> = alive.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut client: Option<DaemonClient> = None;
            let mut n = 0u64;
            let mut next_call = 0u64;
            let mut pending: Option<(u64, f64)> = None;
            // Calls on the current session before the agent leaves it, and how it comes
            // back next (a new session, or a resume through the next daemon).
            let mut left_on_session = 2 + (index as u64 % 5);
            let mut fresh_next = false;
            let unit = if how.unit_nanos > 0 {
                how.unit_nanos as f64 / 1e9
            } else {
                0.001
            };
            while !stop.load(Ordering::Relaxed) {
                if how.calls.is_some_and(|k| n >= k) && pending.is_none() {
                    seen.lock().unwrap().finished += 1;
                    break;
                }
                let c = match &client {
                    Some(c) => c,
                    None => {
                        daemon = live(&alive, daemon);
                        // An unanswered call is resent in its own session.
                        let fresh = fresh_next && pending.is_none();
                        let joined = if fresh {
                            DaemonClient::connect(configs[daemon].clone()).await
                        } else {
                            DaemonClient::resume(configs[daemon].clone(), &session).await
                        };
                        let joined = match joined {
                            Ok(c) => c.session_state().await.map(|st| (c, st)),
                            Err(e) => Err(e),
                        };
                        match joined {
                            Ok((c, st)) => {
                                let mut s = seen.lock().unwrap();
                                if fresh {
                                    s.registered += 1;
                                    session = c.session_id().to_owned();
                                } else {
                                    s.resumed += 1;
                                }
                                drop(s);
                                fresh_next = false;
                                // The call numbers go on from the session's last.
                                next_call = st.last_call_number + 1;
                                client.insert(c)
                            }
                            Err(_) => {
                                seen.lock().unwrap().refused_joins += 1;
                                daemon = (daemon + 1) % DAEMONS;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                continue;
                            }
                        }
                    }
                };
                let (nonce, cost) = match pending {
                    Some(p) => {
                        seen.lock().unwrap().resent += 1;
                        p
                    }
                    None => {
                        n += 1;
                        let nonce = (salt << 48) | ((index as u64) << 32) | n;
                        (nonce, unit * ((n % 4) as f64 + 1.0))
                    }
                };
                let call_number = next_call;
                let v = c
                    .pre_exec_request(sp1::PreExecRequest {
                        session_id: session.clone(),
                        call_number,
                        tool_name: ["search", "fetch", "read"][(n % 3) as usize].into(),
                        tool_params_hash: vec![7; 32],
                        estimated_cost_usd: cost,
                        nonce,
                        ..Default::default()
                    })
                    .await;
                if v.response.is_none() {
                    // Refused or unanswered: it may or may not have been decided. Resume
                    // (the session's last call number says which) and resend it with the
                    // same nonce: decided again if it was not, a replay if it was.
                    seen.lock().unwrap().failed += 1;
                    pending = Some((nonce, cost));
                    client = None;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                pending = None;
                next_call += 1;
                {
                    let mut s = seen.lock().unwrap();
                    s.answered += 1;
                    s.demanded_nanos += (cost * 1e9).round() as i64;
                    if v.verdict == Verdict::Deny {
                        s.denies += 1;
                        if matches!(v.reason.as_str(), "budget_exhausted" | "budget_overrun") {
                            s.budget_denies += 1;
                        }
                    }
                }
                if v.verdict == Verdict::Allow {
                    seen.lock()
                        .unwrap()
                        .allowed
                        .insert((session.clone(), nonce));
                    let _ = c.post_exec(call_number, cost, true, "").await;
                }
                if how.churn {
                    left_on_session -= 1;
                    if left_on_session == 0 {
                        left_on_session = 2 + ((index as u64 + n) % 5);
                        client = None;
                        fresh_next = n.is_multiple_of(2);
                        daemon = (daemon + 1) % DAEMONS;
                    }
                }
            }
            (daemon, session)
        }));
    }
    for (a, t) in agents.iter_mut().zip(tasks) {
        let (daemon, session) = t.await.unwrap();
        a.daemon = daemon;
        a.session = session;
    }
}

/// The chains in PostgreSQL, verified with the public keys alone.
#[derive(Debug, Default)]
struct Chains {
    chains: usize,
    /// Σ (budget_before − budget_after) over the organization's verdicts and
    /// settlements: what was taken from its budget.
    taken: i64,
    /// Σ of the estimates the organization's ALLOW verdicts reserved.
    allowed_nanos: i64,
    allows: HashSet<(String, u64)>,
    voids: u64,
    entries: u64,
    /// Sessions of the organization opened.
    opened: u64,
    /// The budget versions the entries name (audit format 4).
    versions: std::collections::BTreeMap<u64, Named>,
    /// Two names for one version.
    dup_version: Option<u64>,
}

/// What names a budget version in the chains.
#[derive(Debug, Clone, Copy)]
enum Named {
    /// A change's write (an entry's, or a voided change's): remaining before, after.
    Write(i64, i64),
    /// A void's give-back, of this amount.
    GiveBack(i64),
}

impl Chains {
    /// Fold the budget from the chains alone, by its versions (docs/audit-format.md,
    /// "Folding a shared budget"): every version from 1 is named exactly once (by an
    /// entry, a voided write, or a void's give-back), each write's `budget_before` is what
    /// the version before left; the result is the budget's remaining amount.
    fn fold(&self) -> i64 {
        assert_eq!(self.dup_version, None, "two names for one budget version");
        let top = self.versions.keys().next_back().copied().unwrap_or(0);
        assert_eq!(
            self.versions.len() as u64,
            top,
            "a budget version is named by no entry"
        );
        let mut r = BUDGET_NANOS;
        for (v, n) in &self.versions {
            match *n {
                Named::Write(before, after) => {
                    assert_eq!(
                        before, r,
                        "version {v} was not computed from the one before"
                    );
                    r = after;
                }
                Named::GiveBack(amount) => r += amount,
            }
        }
        r
    }
}

/// The entries of organization `org`'s budget.
async fn read_chains(url: &str, schema: &str, org: &str) -> Chains {
    let settings = tollgate_pg::PgSettings::new(url).with_schema(schema);
    let client = tollgate_pg::connect(&settings).await.unwrap();
    let mut out = Chains::default();
    let mut dup = None;
    let mut dup_version = None;
    let mut ours = HashSet::new();
    let mut voids = Vec::new();
    let reports = tollgate_pg::verify(&client, schema, None, &[], &mut |_, e| {
        out.entries += 1;
        if let Event::Session(ev) = &e.event {
            let named = match ev {
                SessionEvent::Verdict(v) => Some((
                    v.organization_id.as_str(),
                    v.budget_before.0,
                    v.budget_after.0,
                )),
                SessionEvent::Settled(st) => Some((
                    st.organization_id.as_str(),
                    st.budget_before.0,
                    st.budget_after.0,
                )),
                SessionEvent::Opened(o) => Some((
                    o.organization_id.as_str(),
                    o.budget_before.0,
                    o.budget_before.0,
                )),
                SessionEvent::HumanDecision(_) | SessionEvent::Closed(_) => None,
            };
            if let Some((o, before, after)) = named {
                if o == org {
                    ours.insert(ev.session_id().to_owned());
                }
                if o == org
                    && ev.budget_version() != 0
                    && out
                        .versions
                        .insert(ev.budget_version(), Named::Write(before, after))
                        .is_some()
                {
                    dup_version = Some(ev.budget_version());
                }
            }
        }
        if let Event::Void(v) = &e.event {
            voids.push(v.clone());
        }
        match &e.event {
            Event::Session(SessionEvent::Verdict(v)) if v.organization_id == org => {
                out.taken += v.budget_before.0 - v.budget_after.0;
                if v.verdict == Verdict::Allow {
                    out.allowed_nanos += v.budget_before.0 - v.budget_after.0;
                    if !out.allows.insert((v.session_id.clone(), v.nonce)) {
                        dup = Some((v.session_id.clone(), v.nonce));
                    }
                }
            }
            Event::Session(SessionEvent::Settled(st)) if st.organization_id == org => {
                out.taken += st.budget_before.0 - st.budget_after.0;
            }
            Event::Session(SessionEvent::Opened(o)) if o.organization_id == org => {
                out.opened += 1;
            }
            Event::Void(_) => out.voids += 1,
            _ => {}
        }
    })
    .await
    .unwrap();
    assert_eq!(dup, None, "a nonce was ALLOWed twice in a session");
    assert_eq!(
        dup_version, None,
        "two entries name one budget version: a lost update"
    );
    // A void names the voided write's version and its give-back's.
    for v in voids.iter().filter(|v| ours.contains(&v.session_id)) {
        if v.budget_version != 0 {
            let w = Named::Write(v.budget_before.0, v.budget_after.0);
            if out.versions.insert(v.budget_version, w).is_some() {
                out.dup_version = Some(v.budget_version);
            }
        }
        if v.revert_version != 0 {
            let g = Named::GiveBack(v.budget_before.0 - v.budget_after.0);
            if out.versions.insert(v.revert_version, g).is_some() {
                out.dup_version = Some(v.revert_version);
            }
        }
    }
    for r in &reports {
        assert!(
            r.result.is_ok(),
            "chain {} breaks: {:?}",
            r.chain_id,
            r.result
        );
    }
    out.chains = reports.len();
    out
}

/// The organization's remaining budget, as Redis holds it (asked of a live daemon).
async fn remaining(fleet: &Fleet, alive: &[Arc<AtomicBool>], agent: &Agent) -> i64 {
    let d = live(alive, 0);
    let c = DaemonClient::resume(
        fleet.client_config(d, agent.org, agent.index),
        &agent.session,
    )
    .await
    .unwrap();
    c.session_state().await.unwrap().budget_remaining_nanos
}

/// The checks every run ends with: exactness, never speed. Waits (bounded) for a dead
/// daemon's half-done changes to be settled by the others' sweepers.
async fn check(fleet: &Fleet, alive: &[Arc<AtomicBool>], agents: &[Agent], seen: &Seen) -> Chains {
    let deadline = Instant::now() + Duration::from_secs(30);
    let org = agents[0].org;
    loop {
        let chains = read_chains(&fleet.pg_url, &fleet.schema, org).await;
        let left = remaining(fleet, alive, &agents[0]).await;
        assert!(left >= 0, "overspent: {left}");
        assert!(chains.taken <= BUDGET_NANOS, "chains took {}", chains.taken);
        // Settled at their estimates: what the ALLOWs reserved is what was taken.
        assert!(
            chains.allowed_nanos <= BUDGET_NANOS,
            "the chains ALLOWed {} of {BUDGET_NANOS}",
            chains.allowed_nanos
        );
        if BUDGET_NANOS - left == chains.taken {
            let missing: Vec<_> = seen.allowed.difference(&chains.allows).take(5).collect();
            assert!(
                missing.is_empty(),
                "ALLOWs given to agents but in no chain: {missing:?}"
            );
            return chains;
        }
        assert!(
            Instant::now() < deadline,
            "Redis holds {left} left, the chains took {} of {BUDGET_NANOS}",
            chains.taken
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn register(fleet: &Fleet, org: &'static str, agents: usize) -> Vec<Agent> {
    let mut v = Vec::new();
    for i in 0..agents {
        let d = i % DAEMONS;
        let c = DaemonClient::connect(fleet.client_config(d, org, i))
            .await
            .unwrap();
        v.push(Agent {
            org,
            index: i,
            session: c.session_id().to_owned(),
            daemon: d,
        });
    }
    v
}

/// Run the load for at most `secs` (less once every agent made `how.calls`, if set: then
/// `secs` only keeps a hung run from hanging the suite), with `fault` run on its own
/// thread meanwhile (given what the agents saw so far and the stop flag).
#[allow(clippy::too_many_arguments)]
fn run(
    rt: &tokio::runtime::Runtime,
    fleet: &Fleet,
    agents: &mut [Agent],
    alive: &[Arc<AtomicBool>],
    secs: u64,
    salt: u64,
    how: Behaviour,
    fault: impl FnOnce(Arc<Mutex<Seen>>, Arc<AtomicBool>) + Send + 'static,
) -> Seen {
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let fault = {
        let (seen, stop) = (seen.clone(), stop.clone());
        std::thread::spawn(move || fault(seen, stop))
    };
    let stopper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            stop.store(true, Ordering::Relaxed);
        })
    };
    rt.block_on(load(
        fleet,
        agents,
        alive,
        stop.clone(),
        seen.clone(),
        salt,
        how,
    ));
    stop.store(true, Ordering::Relaxed);
    stopper.join().unwrap();
    fault.join().unwrap();
    Arc::try_unwrap(seen).ok().unwrap().into_inner().unwrap()
}

fn all_alive() -> Vec<Arc<AtomicBool>> {
    (0..DAEMONS)
        .map(|_| Arc::new(AtomicBool::new(true)))
        .collect()
}

/// Issue 15 §1: 200 agents of one organization, registering new sessions and resuming
/// theirs on other daemons throughout the load, spend one budget through three daemons:
/// 32 calls each, asking 3.2 times what the budget holds, so that it runs out
/// early and the rest of the load is DENYed for want of budget. Only exactness is
/// checked, never speed: the chains ALLOW no more than the budget, Redis's remaining
/// budget is the budget minus exactly what the chains took, and is what the chains fold
/// to by their budget versions; no nonce is ALLOWed twice; every ALLOW an agent saw is
/// in a chain. Then the same with a daemon killed (SIGKILL) once a quarter of the budget
/// is spent, its agents resuming through the others and resending what went unanswered.
/// `tools/repeat-fleet-load.sh N` runs it N times in a row (docs/fleet.md, "Testing").
#[test]
fn three_daemons_share_one_budget_without_overspending_then_one_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let mut fleet = Fleet::start(tmp.path(), SHARED_REDIS, SHARED_PG);
    let rt = rt();
    let alive = all_alive();
    let how = Behaviour {
        churn: true,
        calls: Some(CALLS_PER_AGENT),
        unit_nanos: UNIT_NANOS,
    };
    // The load asks several times what the budget holds, and is DENYed for it.
    let asked_enough = |seen: &Seen, phase: &str| {
        eprintln!(
            "{phase}: {} answered ({} ALLOWed, {} DENYed of which {} for the budget), \
             ${:.4} asked of ${:.4}, {} registered, {} resumed, {} resent, {} refused joins",
            seen.answered,
            seen.allowed.len(),
            seen.denies,
            seen.budget_denies,
            seen.demanded_nanos as f64 / 1e9,
            BUDGET_NANOS as f64 / 1e9,
            seen.registered,
            seen.resumed,
            seen.resent,
            seen.refused_joins,
        );
        assert_eq!(
            seen.finished, AGENTS as u64,
            "{phase}: every agent made its calls"
        );
        assert!(
            seen.demanded_nanos >= 3 * BUDGET_NANOS,
            "{phase}: the agents asked {} of {BUDGET_NANOS}",
            seen.demanded_nanos
        );
        assert!(seen.budget_denies > 0, "{phase}: the budget ran out");
        assert!(
            seen.registered > 0 && seen.resumed > 0,
            "{phase}: the agents churned"
        );
    };

    // 1. No overspend, no double ALLOW.
    let mut agents = rt.block_on(register(&fleet, "acme", AGENTS));
    let seen = run(&rt, &fleet, &mut agents, &alive, 600, 1, how, |_, _| {});
    asked_enough(&seen, "no fault");
    let chains = rt.block_on(check(&fleet, &alive, &agents, &seen));
    assert_eq!(chains.chains, DAEMONS);
    assert_eq!(chains.voids, 0, "nothing crashed, nothing is voided");
    // An auditor folds the budget from the chains alone, by its versions.
    let left = rt.block_on(remaining(&fleet, &alive, &agents[0]));
    assert_eq!(chains.fold(), left, "the chains' fold against Redis");
    assert!(
        chains.opened >= AGENTS as u64 + seen.registered,
        "every session an agent registered is in a chain: {} of {}",
        chains.opened,
        AGENTS as u64 + seen.registered
    );

    // 2. kill -9 one daemon mid-load (a fresh budget: organization `beta`); its agents
    // resume through the others and resend what went unanswered, with the same nonce.
    let mut agents = rt.block_on(register(&fleet, "beta", AGENTS));
    let pid = fleet.daemons[0].as_ref().unwrap().child.id();
    let dead = alive[0].clone();
    // ALLOWs worth a quarter of the budget at the dearest cost (312), at most a
    // quarter of it, before the kill.
    let quarter = (BUDGET_NANOS / 4 / (4 * UNIT_NANOS)) as usize;
    let seen2 = run(
        &rt,
        &fleet,
        &mut agents,
        &alive,
        600,
        2,
        how,
        move |seen, stop| {
            while seen.lock().unwrap().allowed.len() < quarter && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
            dead.store(false, Ordering::Relaxed);
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        },
    );
    fleet.kill_9(0);
    asked_enough(&seen2, "kill -9");
    assert!(seen2.resent > 0, "some calls were in flight at the kill");
    let before = chains;
    let chains = rt.block_on(check(&fleet, &alive, &agents, &seen2));
    assert!(chains.entries > before.entries);
    // The fold still holds with the killed daemon's changes voided: each void names the
    // voided write's version and its give-back's.
    let left = rt.block_on(remaining(&fleet, &alive, &agents[0]));
    assert_eq!(
        chains.fold(),
        left,
        "the chains' fold against Redis, with voids"
    );
    // Every chain, the killed daemon's included, verifies with the CLI too.
    let out = tollgate(&[
        "audit",
        "verify",
        "--postgres",
        &fleet.pg_url,
        "--schema",
        &fleet.schema,
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    fleet.stop_all();
}

#[test]
fn a_redis_restart_mid_load_refuses_then_resumes_with_state_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let redis = Arc::new(Mutex::new(PrivateRedis::start(&tmp.path().join("redis"))));
    let url = redis.lock().unwrap().url();
    let mut fleet = Fleet::start(tmp.path(), &url, SHARED_PG);
    let rt = rt();
    let alive = all_alive();
    let mut agents = rt.block_on(register(&fleet, "acme", 60));
    let fault = redis.clone();
    let seen = run(
        &rt,
        &fleet,
        &mut agents,
        &alive,
        7,
        3,
        Behaviour::default(),
        move |_, _| {
            std::thread::sleep(Duration::from_millis(1500));
            // kill -9 the server: what it acknowledged is in its AOF (fsync always). Down for
            // longer than the daemons' command deadline (2 s), so calls in the outage fail
            // rather than wait it out.
            fault.lock().unwrap().kill();
            std::thread::sleep(Duration::from_millis(3000));
            fault.lock().unwrap().restart();
        },
    );
    assert!(seen.failed > 0, "calls during the outage are refused");
    let chains = rt.block_on(check(&fleet, &alive, &agents, &seen));
    assert!(!chains.allows.is_empty());
    // And it serves again, without a restart.
    let seen = run(
        &rt,
        &fleet,
        &mut agents,
        &alive,
        1,
        4,
        Behaviour::default(),
        |_, _| {},
    );
    assert!(seen.answered > 0, "service resumed");
    rt.block_on(check(&fleet, &alive, &agents, &seen));
    fleet.stop_all();
    redis.lock().unwrap().kill();
}

#[test]
fn a_postgres_stop_mid_load_refuses_verdicts_and_loses_no_acknowledged_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let pg = Arc::new(Mutex::new(PrivatePostgres::start(tmp.path())));
    let url = pg.lock().unwrap().url();
    let mut fleet = Fleet::start(&tmp.path().join("fleet"), SHARED_REDIS, &url);
    let rt = rt();
    let alive = all_alive();
    let mut agents = rt.block_on(register(&fleet, "acme", 60));
    let fault = pg.clone();
    let seen = run(
        &rt,
        &fleet,
        &mut agents,
        &alive,
        5,
        5,
        Behaviour::default(),
        move |_, _| {
            std::thread::sleep(Duration::from_millis(1500));
            fault.lock().unwrap().stop();
            std::thread::sleep(Duration::from_millis(1000));
            fault.lock().unwrap().restart();
        },
    );
    assert!(
        seen.failed > 0,
        "verdicts are refused while PostgreSQL is down"
    );
    // Every ALLOW an agent was given is in a chain; the budget in Redis is what the
    // chains took (changes made while the journal was down were voided and reverted).
    let chains = rt.block_on(check(&fleet, &alive, &agents, &seen));
    assert!(!chains.allows.is_empty());
    let seen = run(
        &rt,
        &fleet,
        &mut agents,
        &alive,
        1,
        6,
        Behaviour::default(),
        |_, _| {},
    );
    assert!(seen.answered > 0, "service resumed");
    rt.block_on(check(&fleet, &alive, &agents, &seen));
    fleet.stop_all();
}

#[test]
fn a_call_held_through_one_daemon_is_modified_through_another() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::start(tmp.path(), SHARED_REDIS, SHARED_PG);
    let rt = rt();
    rt.block_on(async {
        // The agent is on daemon 0; the operator on daemon 1.
        let mut agent_cfg = fleet.client_config(0, "acme", 0);
        agent_cfg.agent_id = "reviewed".into();
        let agent = DaemonClient::connect(agent_cfg).await.unwrap();
        let mut op_cfg = fleet.client_config(1, "acme", 0);
        op_cfg.secret = OPERATOR_SECRET.as_bytes().to_vec();
        let op = DaemonClient::operator(op_cfg).await.unwrap();
        let session = agent.session_id().to_owned();
        let decider = tokio::spawn(async move {
            // Daemon 1 shows the params the agent sent to daemon 0.
            let deadline = Instant::now() + Duration::from_secs(15);
            let held = loop {
                let listed = op.hitl_list().await.unwrap();
                if let Some(p) = listed
                    .into_iter()
                    .find(|p| p.session_id == session && p.params_known)
                {
                    break p;
                }
                assert!(
                    Instant::now() < deadline,
                    "daemon 1 never showed the held call's params"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            assert_eq!(held.params_json, r#"{"amount":1000,"to":"acct_1"}"#);
            op.hitl_decide(sp1::HitlDecideRequest {
                session_id: session,
                decision: "modify".into(),
                operator_id: "bob".into(),
                note: "smaller amount".into(),
                successor_params_json: r#"{"to":"acct_1","amount":10}"#.into(),
                ..Default::default()
            })
            .await
            .unwrap()
        });
        let p = tollgate_core::json::parse_str(r#"{"to":"acct_1","amount":1000}"#).unwrap();
        let wait = tollgate_client::HumanWait {
            timeout: Duration::from_secs(20),
            ..Default::default()
        };
        let r = agent.pre_exec_or_wait("pay", &p, 0.01, wait).await;
        decider.await.unwrap();
        // Daemon 0 hands its agent the successor decided through daemon 1.
        assert_eq!(r.decision, "modify");
        assert!(r.allowed(), "{r:?}");
        assert_eq!(r.verdict.reason, "hitl_transition:modify_successor");
        let edited = tollgate_core::json::parse_str(r#"{"amount":10,"to":"acct_1"}"#).unwrap();
        assert_eq!(r.params, Some(edited));
    });
}

#[test]
fn serve_warns_when_redis_persists_less_than_configured() {
    // The shared Redis keeps nothing on disk (appendonly no); the daemon expects
    // `appendfsync always` (the default durability) and says so at start.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let schema = unique("warn");
    let prefix = unique("tgwarn");
    std::fs::write(
        dir.join("fleet.toml"),
        format!(
            "[state]\nbackend = \"redis\"\nurl = \"{SHARED_REDIS}\"\nkey_prefix = \"{prefix}\"\n\
             [audit]\nsink = \"postgres\"\nurl = \"{SHARED_PG}\"\nschema = \"{schema}\"\n\
             [[organization]]\nid = \"acme\"\nsecret = \"{SECRET}\"\noperator_secret = \"{OPERATOR_SECRET}\"\n"
        ),
    )
    .unwrap();
    let mut d = Serve::start_with(dir, &["--config", s(&dir.join("fleet.toml"))]);
    let banner = d.banner();
    assert!(
        banner.contains("WARNING: redis persistence is weaker than [state] durability"),
        "{banner}"
    );
    assert!(
        banner.contains("expected appendonly yes, appendfsync always"),
        "{banner}"
    );
    assert!(banner.contains(&format!("schema `{schema}`")), "{banner}");
    assert!(d.terminate().success());
    // The schema the daemon migrated goes with the test.
    drop(Fleet::leftovers(schema, prefix));
}

#[test]
fn rediss_with_a_private_ca_is_trusted_only_through_ca_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let pki = dir.join("pki");
    let out = tollgate(&["certs", "--out", s(&pki)]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let mut redis = PrivateRedis::start_tls(
        &dir.join("redis"),
        &pki.join("server.pem"),
        &pki.join("server.key"),
        &pki.join("ca.pem"),
    );
    let schema = unique("tls");
    let prefix = unique("tgtls");
    let config = |ca: &str| {
        format!(
            "[state]\nbackend = \"redis\"\nurl = \"rediss://127.0.0.1:{}/0\"\nkey_prefix = \"{prefix}\"\n\
             durability = \"none\"\ncommand_timeout_ms = 2000\n{ca}\
             [audit]\nsink = \"postgres\"\nurl = \"{SHARED_PG}\"\nschema = \"{schema}\"\n\
             [[organization]]\nid = \"acme\"\nsecret = \"{SECRET}\"\noperator_secret = \"{OPERATOR_SECRET}\"\n",
            redis.port
        )
    };
    // The system's roots do not know the test CA: the daemon refuses to start, saying why.
    let refused = dir.join("refused");
    std::fs::create_dir_all(&refused).unwrap();
    std::fs::write(refused.join("fleet.toml"), config("")).unwrap();
    let out = tollgate(&[
        "serve",
        "--config",
        s(&refused.join("fleet.toml")),
        "--data-dir",
        s(&refused),
    ]);
    assert_ne!(code(&out), 0);
    assert!(text(&out).contains("state store"), "{}", text(&out));
    // With ca_file, it serves over TLS.
    let ok = dir.join("ok");
    std::fs::create_dir_all(&ok).unwrap();
    let ca_line = format!("ca_file = {:?}\n", s(&pki.join("ca.pem")));
    std::fs::write(ok.join("fleet.toml"), config(&ca_line)).unwrap();
    let daemon = Serve::start_with(&ok, &["--config", s(&ok.join("fleet.toml"))]);
    let rt = rt();
    rt.block_on(async {
        let mut c = ClientConfig::new(ok.join("tollgate.sock"), "acme", SECRET.as_bytes(), "tls");
        c.timeout = Duration::from_secs(5);
        let agent = DaemonClient::connect(c).await.unwrap();
        let p = tollgate_core::json::parse_str(r#"{"q":1}"#).unwrap();
        let v = agent.pre_exec("search", &p, 0.0).await;
        assert_eq!(v.verdict, Verdict::Allow, "{v:?}");
    });
    assert!(daemon.terminate().success());
    redis.kill();
    drop(Fleet::leftovers(schema, prefix));
}

#[test]
fn bench_loads_a_fleet_and_leaves_nothing_behind() {
    let out = tollgate(&[
        "bench",
        "--daemons",
        "2",
        "--redis",
        SHARED_REDIS,
        "--postgres",
        SHARED_PG,
        "--sessions",
        "4",
        "--duration",
        "1",
    ]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report = text(&out);
    assert!(
        report.contains("mode: fleet: 2 `tollgate serve` processes"),
        "{report}"
    );
    assert!(report.contains("denied 0"), "{report}");
    assert!(
        report.contains("EVALSHA (compare-and-set round trips) per decision"),
        "{report}"
    );
    // The run's schema and keys are gone.
    let schema = report
        .split("(schema ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap()
        .to_owned();
    let rt = rt();
    rt.block_on(async {
        let c = tollgate_pg::connect(&tollgate_pg::PgSettings::new(SHARED_PG))
            .await
            .unwrap();
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1",
                &[&schema],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "schema {schema} is left behind");
    });
    let prefix = schema.replacen("bench_", "tgbench", 1);
    let mut c = redis::Client::open(SHARED_REDIS)
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut c)
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}

/// A loopback TCP proxy to a Redis that delays every byte its client sends by `delay` (in
/// order), and counts the chunks it forwarded each way.
struct DelayProxy {
    url: String,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
}

impl DelayProxy {
    /// Wait until nothing has gone through for `quiet` (longer than the delay: then no
    /// byte is on its way either).
    async fn quiet(&self, quiet: Duration) {
        loop {
            let before = (
                self.up.load(Ordering::SeqCst),
                self.down.load(Ordering::SeqCst),
            );
            tokio::time::sleep(quiet).await;
            if (
                self.up.load(Ordering::SeqCst),
                self.down.load(Ordering::SeqCst),
            ) == before
            {
                return;
            }
        }
    }

    async fn start(target: &'static str, delay: Duration) -> DelayProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up, down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (u, dn) = (up.clone(), down.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(out) = tokio::net::TcpStream::connect(target).await else {
                    continue;
                };
                let (mut ir, mut iw) = inbound.into_split();
                let (mut or, mut ow) = out.into_split();
                let (u, dn) = (u.clone(), dn.clone());
                let (tx, mut rx) =
                    tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = ir.read(&mut buf).await {
                        if n == 0
                            || tx
                                .send((tokio::time::Instant::now(), buf[..n].to_vec()))
                                .is_err()
                        {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    while let Some((at, bytes)) = rx.recv().await {
                        tokio::time::sleep_until(at + delay).await;
                        if ow.write_all(&bytes).await.is_err() {
                            break;
                        }
                        u.fetch_add(1, Ordering::SeqCst);
                    }
                });
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = or.read(&mut buf).await {
                        if n == 0 || iw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        dn.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        DelayProxy {
            url: format!("redis://{addr}/0"),
            up,
            down,
        }
    }
}

/// Issue 15 §1 as it was reproduced, with real daemons: daemon A reaches Redis through a
/// proxy that delays A's bytes by 0.5 s, daemon B goes direct; a `per_organization`
/// budget of 10 USD. B ALLOWs 1.00; an agent registers on A; while A's registration is on
/// its way (its first command has reached Redis and been answered), B ALLOWs 2.00; A's
/// registration completes; A ALLOWs 3.00 and must report 4.00 left; B's 6.00 must not be
/// ALLOWed; the chains ALLOW no more than 10.00 and Redis holds what they left. (Before
/// the fix: A reported 6.00 and B's 6.00 was ALLOWed, 12.00 of 10.00.)
#[test]
fn a_registration_racing_a_spend_on_another_daemon_never_overspends() {
    const USD: i64 = 1_000_000_000;
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    let proxy = rt.block_on(DelayProxy::start(
        "127.0.0.1:6379",
        Duration::from_millis(500),
    ));
    let urls = vec![proxy.url.clone(), SHARED_REDIS.to_owned()];
    // No sweeps and no scans for held calls to expire: A's only Redis traffic is what
    // its agents cause.
    let fleet = Fleet::start_with(
        tmp.path(),
        SHARED_REDIS,
        &urls,
        SHARED_PG,
        10.0,
        3600,
        "hitl_timeout_secs = 0",
    );
    async fn call(
        c: &DaemonClient,
        session: String,
        n: u64,
        usd: f64,
    ) -> tollgate_client::ClientVerdict {
        c.pre_exec_request(sp1::PreExecRequest {
            session_id: session,
            call_number: n,
            tool_name: "pay".into(),
            tool_params_hash: vec![n as u8; 32],
            estimated_cost_usd: usd,
            nonce: n,
            ..Default::default()
        })
        .await
    }
    rt.block_on(async {
        let b = DaemonClient::connect(fleet.client_config(1, "acme", 1))
            .await
            .unwrap();
        let bs = b.session_id().to_owned();
        let v = call(&b, bs.clone(), 1, 1.0).await;
        assert_eq!(v.verdict, Verdict::Allow, "{v:?}");
        // A has finished starting (its own commands to Redis have all been answered).
        proxy.quiet(Duration::from_millis(1500)).await;

        let (up, down) = (
            proxy.up.load(Ordering::SeqCst),
            proxy.down.load(Ordering::SeqCst),
        );
        let config_a = fleet.client_config(0, "acme", 0);
        let registering = tokio::spawn(DaemonClient::connect(config_a));
        // A's first command of the registration has reached Redis and been answered.
        while proxy.up.load(Ordering::SeqCst) == up || proxy.down.load(Ordering::SeqCst) == down {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let v = call(&b, bs.clone(), 2, 2.0).await;
        assert_eq!(v.verdict, Verdict::Allow, "{v:?}");
        let a = registering.await.unwrap().unwrap();
        let v = call(&a, a.session_id().to_owned(), 1, 3.0).await;
        assert_eq!(v.verdict, Verdict::Allow, "{v:?}");
        assert_eq!(
            v.response.as_ref().unwrap().budget_remaining_nanos,
            4 * USD,
            "A's budget_remaining after its 3.00"
        );
        let v = call(&b, bs.clone(), 3, 6.0).await;
        assert_ne!(v.verdict, Verdict::Allow, "B's 6.00 with 4.00 left: {v:?}");

        let chains = read_chains(&fleet.pg_url, &fleet.schema, "acme").await;
        assert!(
            chains.allowed_nanos <= 10 * USD,
            "the chains ALLOWed {} of {}",
            chains.allowed_nanos,
            10 * USD
        );
        assert_eq!(chains.allowed_nanos, 6 * USD);
        let left = b.session_state().await.unwrap().budget_remaining_nanos;
        assert_eq!(left, 10 * USD - chains.taken);
        assert_eq!(left, 4 * USD);
    });
}

const PA_SECRET: &str = "pa's own fleet secret, nobody else's";
const OTHER_SECRET: &str = "other's own fleet secret, nobody else's";

/// Issue 15 §3 in a fleet: enrollment holds on every daemon of one Redis. An enrolled
/// agent registered with the organization's secret or with another agent's secret is
/// refused by each daemon; an id that is not enrolled cannot mint a fresh `per_agent`
/// budget on any of them; a session resumed through another daemon keeps its
/// authenticated agent (and only that agent's credential resumes it); and the
/// `per_agent` budget follows the authenticated id across daemons.
#[test]
fn enrolled_agents_are_who_they_say_on_every_daemon_of_a_fleet() {
    const USD: i64 = 1_000_000_000;
    let tmp = tempfile::tempdir().unwrap();
    let urls = vec![SHARED_REDIS.to_owned(); DAEMONS];
    let extra = Extra {
        guards: "[guard.agents.pa]\nbudget_usd = 1.0\nbudget_scope = \"per_agent\"\n",
        acme: &format!(
            "require_enrollment = true\n\
             [[organization.agent]]\nid = \"pa\"\nsecret = \"{PA_SECRET}\"\n\
             [[organization.agent]]\nid = \"other\"\nsecret = \"{OTHER_SECRET}\"\n"
        ),
        ..Extra::default()
    };
    let mut fleet = Fleet::start_extra(tmp.path(), SHARED_REDIS, &urls, SHARED_PG, 2.0, 1, extra);
    let cfg = |daemon: usize, secret: &str, agent: &str| {
        let mut c = fleet.client_config(daemon, "acme", 0);
        c.secret = secret.as_bytes().to_vec();
        c.agent_id = agent.into();
        c
    };
    let refused = |r: Result<DaemonClient, tollgate_client::ClientError>, what: &str| match r {
        Ok(c) => panic!(
            "{what}: registered as {}",
            c.registration().state.as_ref().unwrap().agent_id
        ),
        Err(tollgate_client::ClientError::Refused { code, .. }) => {
            assert_eq!(code, sp1::ErrorCode::AuthenticationFailed, "{what}")
        }
        Err(e) => panic!("{what}: {e}"),
    };
    let rt = rt();
    rt.block_on(async {
        let p = tollgate_core::json::parse_str("{}").unwrap();
        for d in 0..DAEMONS {
            // The enrolled id with the organization's secret, or another agent's.
            for secret in [SECRET, OTHER_SECRET] {
                refused(
                    DaemonClient::connect(cfg(d, secret, "pa")).await,
                    &format!("pa on {d}"),
                );
            }
            // New ids, with any secret: no fresh per_agent budget on any daemon.
            for secret in [SECRET, PA_SECRET, OTHER_SECRET] {
                refused(
                    DaemonClient::connect(cfg(d, secret, "pa-0")).await,
                    &format!("pa-0 on {d}"),
                );
            }
        }
        // pa on daemon 0, with its own secret: its own guard (1 USD, per_agent).
        let pa = DaemonClient::connect(cfg(0, PA_SECRET, "pa"))
            .await
            .unwrap();
        assert_eq!(
            pa.registration()
                .active_config
                .as_ref()
                .unwrap()
                .budget_nanos,
            USD
        );
        let v = pa.pre_exec("t", &p, 0.4).await;
        assert!(v.allowed(), "{v:?}");
        let session = pa.session_id().to_owned();
        // Resumed on daemon 1 by pa's own secret only; it is still pa's session.
        for (d, secret, agent) in [
            (1, SECRET, "pa"),
            (2, OTHER_SECRET, "pa"),
            (1, OTHER_SECRET, "other"),
        ] {
            assert!(
                DaemonClient::resume(cfg(d, secret, agent), &session)
                    .await
                    .is_err(),
                "pa's session resumed on daemon {d} as {agent} with another credential"
            );
        }
        let resumed = DaemonClient::resume(cfg(1, PA_SECRET, "pa"), &session)
            .await
            .unwrap();
        assert!(resumed.registration().resumed);
        let state = resumed.registration().state.clone().unwrap();
        assert_eq!(
            (state.agent_id.as_str(), state.organization_id.as_str()),
            ("pa", "acme")
        );
        // Another enrolled agent on daemon 2 cannot read or act on pa's session.
        let other = DaemonClient::connect(cfg(2, OTHER_SECRET, "other"))
            .await
            .unwrap();
        assert!(other.state_of(&session).await.is_err());
        // pa's one dollar follows pa across daemons: 0.4 through daemon 1 (0.2 left), then
        // a new session of pa through daemon 2 starts with what is left and cannot spend 0.4.
        let v = resumed.pre_exec("t", &p, 0.4).await;
        assert!(v.allowed(), "{v:?}");
        assert_eq!(v.response.as_ref().unwrap().budget_remaining_nanos, USD / 5);
        let pa2 = DaemonClient::connect(cfg(2, PA_SECRET, "pa"))
            .await
            .unwrap();
        let st = pa2.registration().state.clone().unwrap();
        assert_eq!(st.budget_remaining_nanos, USD / 5, "{st:?}");
        let v = pa2.pre_exec("t", &p, 0.4).await;
        assert_eq!(v.verdict, Verdict::Deny, "{v:?}");
        // other runs under the default guard (the organization's 2 USD), untouched by pa's.
        let v = other.pre_exec("t", &p, 1.5).await;
        assert!(v.allowed(), "{v:?}");
    });
    fleet.stop_all();
    // Only the authenticated agents opened sessions, in all the chains (verified).
    let mut opened = Vec::new();
    rt.block_on(async {
        let settings = tollgate_pg::PgSettings::new(&fleet.pg_url).with_schema(&fleet.schema);
        let client = tollgate_pg::connect(&settings).await.unwrap();
        let reports = tollgate_pg::verify(&client, &fleet.schema, None, &[], &mut |_, e| {
            if let Event::Session(SessionEvent::Opened(o)) = &e.event {
                opened.push(o.agent_id.clone());
            }
        })
        .await
        .unwrap();
        assert!(
            reports.iter().all(|r| r.result.is_ok()),
            "a chain does not verify"
        );
    });
    opened.sort();
    assert_eq!(opened, ["other", "pa", "pa"]);
}

/// Issue 17 §4 in a fleet: a session closed through one daemon is gone on every daemon
/// (no decision, no resume, no state), its close is in that daemon's chain as the
/// session's last entry, and it leaves Redis's index of live sessions at once.
#[test]
fn a_session_closed_through_one_daemon_is_gone_on_every_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::start(tmp.path(), SHARED_REDIS, SHARED_PG);
    let rt = rt();
    let session = rt.block_on(async {
        let p = tollgate_core::json::parse_str("{}").unwrap();
        let agent = DaemonClient::connect(fleet.client_config(0, "acme", 1))
            .await
            .unwrap();
        assert!(agent.pre_exec("t", &p, 0.01).await.allowed());
        let id = agent.session_id().to_owned();
        // Every daemon knows the session (and caches it).
        for d in 1..DAEMONS {
            let other = DaemonClient::connect(fleet.client_config(d, "acme", 2))
                .await
                .unwrap();
            other.state_of(&id).await.unwrap();
        }
        let closer = DaemonClient::resume(fleet.client_config(1, "acme", 1), &id)
            .await
            .unwrap();
        closer.close().await.unwrap();
        let v = agent.pre_exec("t", &p, 0.01).await;
        assert_eq!(v.verdict, Verdict::Deny, "{v:?}");
        for d in 0..DAEMONS {
            let e = DaemonClient::resume(fleet.client_config(d, "acme", 1), &id)
                .await
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    tollgate_client::ClientError::Refused {
                        code: sp1::ErrorCode::SessionNotFound,
                        ..
                    }
                ),
                "daemon {d}: {e}"
            );
            let other = DaemonClient::connect(fleet.client_config(d, "acme", 3))
                .await
                .unwrap();
            assert!(
                other.state_of(&id).await.is_err(),
                "daemon {d} still shows it"
            );
        }
        id
    });
    // Off Redis's index of live sessions (`P:idx`), which still lists the sessions the
    // other agents opened above: the closing daemon's confirmer takes it off once the
    // close's entry is committed (just after the close's answer).
    let mut c = redis::Client::open(SHARED_REDIS)
        .unwrap()
        .get_connection()
        .unwrap();
    let idx = format!("{}:idx", fleet.prefix);
    let mut live: Vec<String> = Vec::new();
    for _ in 0..500 {
        live = redis::cmd("SMEMBERS").arg(&idx).query(&mut c).unwrap();
        if !live.contains(&session) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!live.is_empty(), "{idx} lists no session at all");
    assert!(
        !live.contains(&session),
        "{idx} still lists the closed session"
    );
    // The close is the session's last entry, in daemon 1's chain.
    let mut mine = Vec::new();
    rt.block_on(async {
        let settings = tollgate_pg::PgSettings::new(&fleet.pg_url).with_schema(&fleet.schema);
        let client = tollgate_pg::connect(&settings).await.unwrap();
        tollgate_pg::verify(&client, &fleet.schema, None, &[], &mut |_, e| {
            if let Event::Session(ev) = &e.event {
                if ev.session_id() == session {
                    mine.push(ev.clone());
                }
            }
        })
        .await
        .unwrap();
    });
    mine.sort_by_key(SessionEvent::session_seq);
    assert!(
        matches!(mine.last(), Some(SessionEvent::Closed(_))),
        "{mine:?}"
    );
}

#[test]
fn a_fleet_warns_that_organization_quotas_are_not_enforced_and_serves_past_them() {
    // Each daemon would count only the sessions it opened itself: acme's quota of 1 would
    // let a second session in through another daemon and, once Redis expired a session,
    // keep its place taken until a restart. A fleet does not pretend: every daemon says at
    // start that the quota is not enforced, and serves past it.
    let tmp = tempfile::tempdir().unwrap();
    let urls = vec![SHARED_REDIS.to_owned(); DAEMONS];
    let extra = Extra {
        acme: "max_sessions = 1\n",
        ..Extra::default()
    };
    let mut fleet = Fleet::start_extra(tmp.path(), SHARED_REDIS, &urls, SHARED_PG, 2.0, 1, extra);
    for (i, d) in fleet.daemons.iter_mut().enumerate() {
        let banner = d.as_mut().unwrap().banner();
        assert!(
            banner.contains(
                "WARNING: [[organization]] max_sessions is not enforced in a fleet \
                 (organizations acme)"
            ),
            "daemon {i}: {banner}"
        );
    }
    rt().block_on(async {
        let p = tollgate_core::json::parse_str("{}").unwrap();
        let mut open = Vec::new();
        // Two of acme's sessions through one daemon (its own count alone would refuse the
        // second), a third through another.
        for (daemon, agent) in [(0, 1), (0, 2), (1, 3)] {
            let c = DaemonClient::connect(fleet.client_config(daemon, "acme", agent))
                .await
                .unwrap_or_else(|e| panic!("daemon {daemon}, agent {agent}: {e}"));
            assert!(c.pre_exec("t", &p, 0.01).await.allowed());
            open.push(c);
        }
    });
}
