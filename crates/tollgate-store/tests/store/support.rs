//! Helpers: a tiny executor, session builders, and the daemon's pre-exec closure.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

use tollgate_core::json::Value;
use tollgate_core::{
    apply_decision, decide, BudgetScope, Decision, GuardConfig, Money, Params, ToolCall,
};
use tollgate_store::{Change, Durable, Session, SessionMeta, SessionStore, StoreError};

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

pub fn meta(id: &str, agent: &str, org: &str, scope: BudgetScope) -> SessionMeta {
    SessionMeta {
        session_id: id.into(),
        agent_id: agent.into(),
        organization_id: org.into(),
        budget_scope: scope,
        created_at_ns: 1_000,
        config: Some("test".into()),
    }
}

pub fn session(id: &str, budget: i64) -> Session {
    Session::new(
        meta(id, "agent-1", "org-1", BudgetScope::PerSession),
        Money(budget),
        1_000,
    )
}

pub fn agent_session(id: &str, agent: &str, budget: i64) -> Session {
    Session::new(
        meta(id, agent, "org-1", BudgetScope::PerAgent),
        Money(budget),
        1_000,
    )
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
/// decision, commit.
pub fn pre_exec<S: SessionStore>(
    store: &S,
    id: &str,
    config: &GuardConfig,
    call: Call<'_>,
) -> Result<(Decision, Durable), StoreError> {
    let config = config.clone();
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
        let decision = decide(&config, &s.state, &call, now, 0.5);
        let n = s.next_call_number();
        apply_decision(&config, &mut s.state, &call, &decision, n, now);
        Change::Commit(decision)
    }))
}
