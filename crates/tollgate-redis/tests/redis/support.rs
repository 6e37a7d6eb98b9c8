//! Test doubles (an in-memory "PostgreSQL": claims and entries, a journal and an
//! arbiter over it), session builders, the daemon's pre_exec closure, unique prefixes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_audit::{Appended, Completer, SessionEvent};
use tollgate_core::json::Value;
use tollgate_core::{decide, BudgetScope, Decision, GuardConfig, Money, Params, ToolCall};
use tollgate_redis::{RedisOptions, RedisStore};
use tollgate_store::{
    ops, Arbiter, Change, Durable, Journal, Policy, Session, SessionMeta, SessionStore,
    SettleFuture, Settled, StoreError, VoidBudget,
};

pub const REDIS: &str = "redis://127.0.0.1:6379";

/// Who holds a (session, seq) place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    Entry,
    Void,
}

/// The shared audit database of a fleet: one claim per place, entries in commit order.
#[derive(Debug, Default)]
pub struct Book {
    pub claims: Mutex<HashMap<(String, u64), Claim>>,
    pub entries: Mutex<Vec<SessionEvent>>,
    /// What each void said about the shared budget, by place.
    pub voids: Mutex<HashMap<(String, u64), VoidBudget>>,
}

impl Book {
    /// Insert the entry's claim; false if the place is taken (by a void).
    pub fn commit(&self, event: &SessionEvent) -> bool {
        let key = (event.session_id().to_owned(), event.session_seq());
        let mut claims = self.claims.lock().unwrap();
        if claims.contains_key(&key) {
            return false;
        }
        claims.insert(key, Claim::Entry);
        self.entries.lock().unwrap().push(event.clone());
        true
    }

    pub fn settle(&self, id: &str, seq: u64, budget: VoidBudget) -> Settled {
        let mut claims = self.claims.lock().unwrap();
        let key = (id.to_owned(), seq);
        if !claims.contains_key(&key) {
            self.voids.lock().unwrap().insert(key.clone(), budget);
        }
        match *claims.entry(key).or_insert(Claim::Void) {
            Claim::Entry => Settled::Entry,
            Claim::Void => Settled::Void,
        }
    }

    /// Committed ALLOW verdicts: (session, nonce, estimated cost).
    pub fn allows(&self) -> Vec<(String, u64, i64)> {
        self.entries
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                SessionEvent::Verdict(v) if v.verdict == tollgate_core::Verdict::Allow => {
                    Some((v.session_id.clone(), v.nonce, v.estimated_cost.0))
                }
                _ => None,
            })
            .collect()
    }
}

pub const COMMIT: u8 = 0;
/// Take nothing and never complete (a daemon killed before its entry committed).
pub const HANG: u8 = 1;
/// Commit the entry but never complete (killed after the commit, before confirming).
pub const COMMIT_THEN_HANG: u8 = 2;

#[derive(Debug)]
pub struct TestJournal {
    pub book: Arc<Book>,
    pub mode: AtomicU8,
    held: Mutex<Vec<Completer<Appended>>>,
}

impl TestJournal {
    pub fn new(book: Arc<Book>) -> Arc<TestJournal> {
        Arc::new(TestJournal {
            book,
            mode: AtomicU8::new(COMMIT),
            held: Mutex::new(Vec::new()),
        })
    }
}

fn appended(i: usize) -> Appended {
    Appended {
        index: i as u64,
        entry_id: uuid::Uuid::nil(),
        hash: tollgate_core::Digest::default(),
    }
}

impl Journal for TestJournal {
    fn submit(&self, event: SessionEvent) -> Durable {
        let (c, p) = tollgate_audit::pending_pair();
        match self.mode.load(Ordering::SeqCst) {
            COMMIT => {
                if self.book.commit(&event) {
                    c.complete(Ok(appended(self.book.entries.lock().unwrap().len())));
                } else {
                    c.complete(Err(tollgate_audit::WriteError::Refused(
                        "place voided".into(),
                    )));
                }
            }
            HANG => self.held.lock().unwrap().push(c),
            _ => {
                self.book.commit(&event);
                self.held.lock().unwrap().push(c);
            }
        }
        Durable::of(p)
    }
}

#[derive(Debug)]
pub struct TestArbiter(pub Arc<Book>);

impl Arbiter for TestArbiter {
    fn settle<'a>(
        &'a self,
        session_id: &'a str,
        session_seq: u64,
        budget: VoidBudget,
    ) -> SettleFuture<'a> {
        Box::pin(std::future::ready(Ok(self.0.settle(
            session_id,
            session_seq,
            budget,
        ))))
    }
}

/// A unique key prefix for one test.
pub fn prefix(name: &str) -> String {
    format!("tgtest-{name}-{}", tollgate_redis::random_daemon_id())
}

pub fn options(prefix: &str) -> RedisOptions {
    let mut o = RedisOptions::new(REDIS);
    o.key_prefix = prefix.to_owned();
    o.command_timeout = Duration::from_secs(5);
    o.sweep_interval = Duration::from_secs(3600);
    o
}

pub async fn store(opts: RedisOptions, journal: Arc<TestJournal>) -> RedisStore {
    let arbiter = Arc::new(TestArbiter(journal.book.clone()));
    RedisStore::connect(opts, journal, arbiter).await.unwrap()
}

/// Delete every key under `prefix`.
pub async fn cleanup(prefix: &str) {
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut c)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut c)
            .await
            .unwrap();
    }
}

pub fn policy(budget: i64, scope: BudgetScope) -> Arc<Policy> {
    Arc::new(Policy::new(GuardConfig {
        budget: Money(budget),
        budget_scope: scope,
        nonce_window: 64,
        ..GuardConfig::default()
    }))
}

/// A session of organization `org` spending the organization's budget.
pub fn org_session(id: &str, org: &str, budget: i64) -> Session {
    Session::new(
        SessionMeta {
            session_id: id.into(),
            agent_id: format!("agent-{id}"),
            organization_id: org.into(),
            budget_scope: BudgetScope::PerOrganization,
            created_at_ns: 1_000,
        },
        policy(budget, BudgetScope::PerOrganization),
        1_000,
    )
}

/// What the daemon's pre_exec does inside `apply`, as a re-runnable closure.
pub fn pre_exec_closure(
    nonce: u64,
    cost: i64,
) -> impl FnMut(&mut Session) -> Change<Decision> + Send {
    move |s: &mut Session| {
        let params = Value::Object([("arg".to_owned(), Value::from(1))].into());
        let call = ToolCall {
            tool_name: "t",
            params: Params::json(&params),
            nonce: Some(nonce),
            estimated_cost: Money(cost),
            raw_params: None,
        };
        let now = 2_000;
        let decision = decide(&s.policy.config, &s.state, &call, now, 0.5);
        let n = s.last_call_number + 1;
        let record = ops::verdict(s, &call, &decision, n, now);
        Change::Commit(decision, record.into())
    }
}

pub async fn pre_exec<S: SessionStore>(
    store: &S,
    id: &str,
    nonce: u64,
    cost: i64,
) -> Result<(Decision, Durable), StoreError> {
    store.apply(id, pre_exec_closure(nonce, cost)).await
}

pub async fn create<S: SessionStore>(store: &S, s: Session) {
    let (_, d) = store.create(s, 1_000).await.unwrap();
    d.await.unwrap();
}

/// Wait until the session hash holds no unconfirmed marker (the confirmer ran).
pub async fn wait_confirmed(session_key: &str) {
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    loop {
        let fields: Vec<String> = redis::cmd("HKEYS")
            .arg(session_key)
            .query_async(&mut c)
            .await
            .unwrap();
        if !fields.iter().any(|f| f.starts_with("u:")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The field names of a hash, sorted.
pub async fn hash_fields(key: &str) -> Vec<String> {
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let mut fields: Vec<String> = redis::cmd("HKEYS")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap();
    fields.sort();
    fields
}

/// The marker fields of a session hash.
pub async fn markers(session_key: &str) -> Vec<String> {
    let mut fields = hash_fields(session_key).await;
    fields.retain(|f| f.starts_with("u:"));
    fields
}

/// The members of the unconfirmed index of key prefix `prefix`, lowest score first.
pub async fn unconfirmed(prefix: &str) -> Vec<String> {
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("ZRANGE")
        .arg(format!("{prefix}:unconfirmed"))
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await
        .unwrap()
}

/// Every test that uses Redis holds it to read; the one that flushes Redis's scripts holds
/// it to write, so that no other test of this binary loads the script again first or
/// counts the flush's round trips.
pub static SCRIPTS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A loopback TCP proxy to the real Redis that delays every byte its client sends by
/// `delay` (in order), and counts what it forwarded each way, so a test can tell when the
/// client's command reached Redis and when Redis's answer reached the client.
pub struct DelayProxy {
    pub url: String,
    /// Chunks forwarded client → Redis, and Redis → client.
    pub up: Arc<std::sync::atomic::AtomicU64>,
    pub down: Arc<std::sync::atomic::AtomicU64>,
    notify: Arc<tokio::sync::Notify>,
    accept: tokio::task::JoinHandle<()>,
}

impl DelayProxy {
    pub async fn start(delay: Duration) -> DelayProxy {
        use std::sync::atomic::AtomicU64;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicU64::new(0));
        let down = Arc::new(AtomicU64::new(0));
        let notify = Arc::new(tokio::sync::Notify::new());
        let (u, dn, nt) = (up.clone(), down.clone(), notify.clone());
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(out) = tokio::net::TcpStream::connect("127.0.0.1:6379").await else {
                    continue;
                };
                let (mut ir, mut iw) = inbound.into_split();
                let (mut or, mut ow) = out.into_split();
                let (u, dn, nt, nt2) = (u.clone(), dn.clone(), nt.clone(), nt.clone());
                // client → Redis: each chunk leaves `delay` after it arrived, in order.
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
                        nt.notify_waiters();
                    }
                });
                // Redis → client: at once.
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = or.read(&mut buf).await {
                        if n == 0 || iw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        dn.fetch_add(1, Ordering::SeqCst);
                        nt2.notify_waiters();
                    }
                });
            }
        });
        DelayProxy {
            url: format!("redis://{addr}"),
            up,
            down,
            notify,
            accept,
        }
    }

    /// Wait until `cond(up, down)` holds.
    pub async fn wait(&self, cond: impl Fn(u64, u64) -> bool) {
        loop {
            let n = self.notify.notified();
            if cond(
                self.up.load(Ordering::SeqCst),
                self.down.load(Ordering::SeqCst),
            ) {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), n).await;
        }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The daemon's pre_exec closure that also returns the budget remaining after the
/// decision (what the daemon answers as `budget_remaining`).
pub fn pre_exec_remaining(
    nonce: u64,
    cost: i64,
) -> impl FnMut(&mut Session) -> Change<(Decision, Money)> + Send {
    let mut inner = pre_exec_closure(nonce, cost);
    move |s: &mut Session| match inner(s) {
        Change::Commit(d, e) => Change::Commit((d, s.state.budget_remaining), e),
        Change::Keep(d) => Change::Keep((d, s.state.budget_remaining)),
        Change::Touch(d) => Change::Touch((d, s.state.budget_remaining)),
        Change::End(d, e) => Change::End((d, s.state.budget_remaining), e),
    }
}

/// Fold organization `org`'s shared budget from the book alone, by its versions
/// (docs/audit-format.md, "Folding a shared budget"): every version from 1 named exactly
/// once (an entry, a voided write, a give-back), each write computed from the amount the
/// version before left. Returns (highest version, remaining).
pub fn fold_budget(book: &Book, org: &str, initial: i64) -> (u64, i64) {
    use std::collections::BTreeMap;
    #[derive(Debug)]
    enum Named {
        Write(i64, i64),
        GiveBack(i64),
    }
    let mut versions: BTreeMap<u64, Named> = BTreeMap::new();
    let entries = book.entries.lock().unwrap().clone();
    let mut ours = std::collections::HashSet::new();
    for e in &entries {
        let (o, before, after) = match e {
            SessionEvent::Verdict(v) => (&v.organization_id, v.budget_before.0, v.budget_after.0),
            SessionEvent::Settled(s) => (&s.organization_id, s.budget_before.0, s.budget_after.0),
            SessionEvent::Opened(s) => (&s.organization_id, s.budget_before.0, s.budget_before.0),
            SessionEvent::HumanDecision(_) | SessionEvent::Closed(_) => continue,
        };
        if o != org {
            continue;
        }
        ours.insert(e.session_id().to_owned());
        if e.budget_version() != 0 {
            let old = versions.insert(e.budget_version(), Named::Write(before, after));
            assert!(old.is_none(), "version {} named twice", e.budget_version());
        }
    }
    let claims = book.claims.lock().unwrap().clone();
    for ((id, seq), vb) in book.voids.lock().unwrap().iter() {
        if !ours.contains(id) || claims.get(&(id.clone(), *seq)) != Some(&Claim::Void) {
            continue;
        }
        if vb.budget_version != 0 {
            let w = Named::Write(vb.budget_before.0, vb.budget_after.0);
            assert!(
                versions.insert(vb.budget_version, w).is_none(),
                "void version twice"
            );
        }
        if vb.revert_version != 0 {
            let g = Named::GiveBack(vb.budget_before.0 - vb.budget_after.0);
            assert!(
                versions.insert(vb.revert_version, g).is_none(),
                "give-back twice"
            );
        }
    }
    let top = versions.keys().next_back().copied().unwrap_or(0);
    assert_eq!(
        versions.keys().copied().collect::<Vec<_>>(),
        (1..=top).collect::<Vec<_>>(),
        "budget versions named: {versions:?}"
    );
    let mut r = initial;
    for (v, n) in &versions {
        match *n {
            Named::Write(before, after) => {
                assert_eq!(before, r, "version {v} not computed from the one before");
                r = after;
            }
            Named::GiveBack(a) => r += a,
        }
    }
    (top, r)
}

/// `HGET key field` over `c`, read as `T`.
pub async fn hget<T: redis::FromRedisValue>(
    c: &mut redis::aio::MultiplexedConnection,
    key: &str,
    field: &str,
) -> T {
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query_async(c)
        .await
        .unwrap()
}

/// `HSET key field value` over `c`.
pub async fn hset(
    c: &mut redis::aio::MultiplexedConnection,
    key: &str,
    field: &str,
    value: impl redis::ToRedisArgs,
) {
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg(field)
        .arg(value)
        .query_async(c)
        .await
        .unwrap();
}

/// The shared budget hash's version in Redis.
pub async fn budget_version(budget_key: &str) -> u64 {
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let v: Option<u64> = hget(&mut c, budget_key, "v").await;
    v.unwrap_or(0)
}
