//! Helpers: a tiny executor, session builders, the daemon's changes through `ops`, a
//! journal that records, and an embedded store over a real audit log.

use std::future::Future;
use std::path::Path;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

use tollgate_audit::{SessionEvent, SigningKey, Writer, WriterConfig};
use tollgate_core::json::Value;
use tollgate_core::{decide, BudgetScope, Decision, GuardConfig, Money, Params, ToolCall};
use tollgate_store::{
    ops, Change, Durable, EmbeddedStore, Journal, Ledger, Policy, Session, SessionMeta,
    SessionStore, StoreError, StoreOptions, StoreReport,
};

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Run a future on this thread, parking until its waker fires (no runtime needed; it
/// also proves `Durable` wakes its waker).
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        thread::park();
    }
}

pub fn policy(budget: i64, scope: BudgetScope) -> Arc<Policy> {
    Arc::new(Policy::new(GuardConfig {
        budget: Money(budget),
        budget_scope: scope,
        nonce_window: 64,
        max_reservations: 16,
        ..GuardConfig::default()
    }))
}

pub fn meta(id: &str, agent: &str, scope: BudgetScope) -> SessionMeta {
    SessionMeta {
        session_id: id.into(),
        agent_id: agent.into(),
        organization_id: "org-1".into(),
        budget_scope: scope,
        created_at_ns: 1_000,
    }
}

/// A session with its own budget.
pub fn session(id: &str, budget: i64) -> Session {
    Session::new(
        meta(id, "agent-1", BudgetScope::PerSession),
        policy(budget, BudgetScope::PerSession),
        1_000,
    )
}

/// A session spending its agent's shared budget.
pub fn agent_session(id: &str, agent: &str, budget: i64) -> Session {
    Session::new(
        meta(id, agent, BudgetScope::PerAgent),
        policy(budget, BudgetScope::PerAgent),
        1_000,
    )
}

pub fn create<S: SessionStore>(store: &S, s: Session) -> Result<(), StoreError> {
    let (_, durable) = block_on(store.create(s, 1_000))?;
    block_on(durable).map(|_| ())
}

/// One proposed call: `tool` with params `{"arg": arg}`.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub tool: &'a str,
    pub arg: i64,
    pub nonce: u64,
    pub cost: i64,
    pub now: i64,
}

/// What the daemon's pre_exec does inside `apply`: number the call, decide, apply the
/// decision through `ops`, commit its record.
pub fn pre_exec<S: SessionStore>(
    store: &S,
    id: &str,
    call: Call<'_>,
) -> Result<(Decision, Durable), StoreError> {
    let Call {
        tool,
        arg,
        nonce,
        cost,
        now,
    } = call;
    let tool = tool.to_owned();
    block_on(store.apply(id, move |s| {
        let params = Value::Object([("arg".to_owned(), Value::from(arg))].into());
        let call = ToolCall {
            tool_name: &tool,
            params: Params::json(&params),
            nonce: Some(nonce),
            estimated_cost: Money(cost),
            raw_params: None,
        };
        let decision = decide(&s.policy.config, &s.state, &call, now, 0.5);
        let n = s.last_call_number + 1;
        let record = ops::verdict(s, &call, &decision, n, now);
        Change::Commit(decision, record.into())
    }))
}

/// What the daemon's post_exec does: settle the reported cost.
pub fn settle<S: SessionStore>(
    store: &S,
    id: &str,
    call_number: u64,
    reported_usd: f64,
) -> Result<Durable, StoreError> {
    block_on(store.apply(id, move |s| {
        let record = ops::settle(s, call_number, reported_usd, true, false, 5_000);
        Change::Commit((), record.into())
    }))
    .map(|((), d)| d)
}

/// A journal that keeps every event, in submission order.
#[derive(Debug, Default)]
pub struct Recorder(pub Mutex<Vec<SessionEvent>>);

impl Journal for Recorder {
    fn submit(&self, event: SessionEvent) -> Durable {
        self.0.lock().unwrap().push(event);
        Durable::ready()
    }
}

impl Recorder {
    /// Fold everything recorded into a ledger.
    pub fn fold(&self) -> Ledger {
        let mut l = Ledger::new();
        for (i, e) in self.0.lock().unwrap().iter().enumerate() {
            l.fold(
                i as u64,
                tollgate_core::Digest::default(),
                None,
                &tollgate_audit::Event::Session(e.clone()),
            )
            .unwrap();
        }
        l
    }
}

/// The signing key every test log uses.
pub fn key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

/// An embedded store in `dir` (state file `state.redb`, audit log `audit/`), its audit
/// writer open first, as the daemon does.
pub fn open_embedded(
    dir: &Path,
    options: StoreOptions,
) -> Result<(Arc<Writer>, EmbeddedStore, StoreReport), StoreError> {
    open_embedded_with(dir, options, key())
}

/// [`open_embedded`] with the log's current signing key.
pub fn open_embedded_with(
    dir: &Path,
    options: StoreOptions,
    key: SigningKey,
) -> Result<(Arc<Writer>, EmbeddedStore, StoreReport), StoreError> {
    let (tap, rx) = tollgate_store::tap();
    let public = key.verifying_key();
    let (writer, _) =
        Writer::open_with_tap(WriterConfig::new(dir.join("audit")), key, tap.into_fn()).unwrap();
    let writer = Arc::new(writer);
    let (store, report) = EmbeddedStore::open(
        dir.join("state.redb"),
        dir.join("audit"),
        Some(&public),
        writer.clone(),
        rx,
        options,
        2_000,
    )?;
    Ok((writer, store, report))
}

/// Close as the daemon does: the audit log, then the store.
pub fn close(writer: &Writer, store: &EmbeddedStore) {
    writer.shutdown().unwrap();
    store.close_sync().unwrap();
}

/// The fold of the whole audit log in `dir/audit`, read by the verifier with the public
/// key alone: what an auditor would compute.
pub fn fold_log(dir: &Path) -> Ledger {
    let mut ledger = Ledger::new();
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(key().verifying_key()),
        ..Default::default()
    };
    let mut prev_index = None;
    tollgate_audit::verify_paths(&[dir.join("audit")], &opts, &mut |e| {
        assert!(prev_index.is_none_or(|p: u64| p + 1 == e.index));
        prev_index = Some(e.index);
        ledger
            .fold(e.index, tollgate_core::Digest::default(), None, &e.event)
            .unwrap();
    })
    .unwrap();
    ledger
}

/// A session as the fold compares it: shared budget loaded, heartbeat ignored.
pub fn normalize(mut s: Session) -> Session {
    s.last_heartbeat_ns = 0;
    s
}
