//! [`Durable`]: completes when the audit entry recording a change is durable; and
//! [`Journal`], where a store writes those entries.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tollgate_audit::{Appended, Pending, SessionEvent, Writer};
use tollgate_core::Money;

use crate::StoreError;

/// Completes when the audit entry of a change is durable (as the audit log's fsync policy
/// defines durable), with where the entry landed; or at once, with `None`, when there was
/// nothing to write (a read, a liveness update, a store without a journal).
///
/// Await it from async code, or block on it with [`Durable::wait`]. Dropping it does not
/// cancel the write.
#[derive(Debug)]
#[must_use = "a change is durable only when this completes"]
pub struct Durable(Option<Pending<Appended>>);

impl Durable {
    /// Already complete: nothing needed writing.
    pub const fn ready() -> Durable {
        Durable(None)
    }

    /// Completes with the audit writer's completion.
    pub fn of(pending: Pending<Appended>) -> Durable {
        Durable(Some(pending))
    }

    /// Block the calling thread until the entry is durable.
    pub fn wait(self) -> Result<Option<Appended>, StoreError> {
        match self.0 {
            None => Ok(None),
            Some(p) => p.wait().map(Some).map_err(journal_error),
        }
    }
}

fn journal_error(e: tollgate_audit::WriteError) -> StoreError {
    StoreError::Journal {
        message: e.to_string(),
    }
}

impl Future for Durable {
    type Output = Result<Option<Appended>, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            None => Poll::Ready(Ok(None)),
            Some(p) => Pin::new(p)
                .poll(cx)
                .map(|r| r.map(Some).map_err(journal_error)),
        }
    }
}

/// Where a store writes the audit entry of every durable change, in the order of the
/// changes of each session and each shared budget (a store submits while it holds their
/// locks). The audit log's [`Writer`] is the journal of a daemon; tests may bring others.
pub trait Journal: Send + Sync + std::fmt::Debug + 'static {
    /// Write `event`; the returned handle completes once it is durable.
    fn submit(&self, event: SessionEvent) -> Durable;
}

impl Journal for Writer {
    fn submit(&self, event: SessionEvent) -> Durable {
        Durable::of(Writer::submit(self, event))
    }
}

/// How the place of one change in its session's history was settled, by
/// [`Arbiter::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The change's own audit entry holds the place: the change happened.
    Entry,
    /// A signed void entry holds it: the change did not happen, and its session goes back
    /// to the state before it (its version stays used).
    Void,
}

/// What the void of a change says about the shared budget the change wrote (audit format
/// version 4), so an auditor can account for every version of the budget from the log:
/// the version the change's write produced and what it moved the remaining amount from
/// and to, and the version of the write that gives those amounts back if the place is
/// voided. All zero: the change wrote no shared budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VoidBudget {
    /// The budget version the change's write produced (0: it wrote none).
    pub budget_version: u64,
    /// The remaining amount before the change.
    pub budget_before: Money,
    /// The remaining amount after it.
    pub budget_after: Money,
    /// The version of the write that gives the change's amounts back (0: nothing to give
    /// back).
    pub revert_version: u64,
}

/// The boxed future [`Arbiter::settle`] returns.
pub type SettleFuture<'a> = Pin<Box<dyn Future<Output = Result<Settled, StoreError>> + Send + 'a>>;

/// Decides, once and for all daemons, whether a change a daemon made to a shared session
/// state is in the audit trail. Each place (session id, session version) is held by
/// exactly one entry: the change's own, or a void. A store whose state lives apart from
/// its journal (Redis beside PostgreSQL) calls it for a change whose entry it has not seen
/// committed.
pub trait Arbiter: Send + Sync + std::fmt::Debug + 'static {
    /// Settle the place of `session_seq` in `session_id`'s history: if an entry holds it
    /// (or one being committed takes it: wait for it), [`Settled::Entry`]; otherwise take
    /// it with a signed void entry, which records `budget`, and return
    /// [`Settled::Void`]. Idempotent: a settled place stays settled (a second call writes
    /// nothing, whatever its `budget`).
    fn settle<'a>(
        &'a self,
        session_id: &'a str,
        session_seq: u64,
        budget: VoidBudget,
    ) -> SettleFuture<'a>;
}
