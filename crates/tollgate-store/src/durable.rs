//! [`Durable`]: a handle that completes when a write is on disk.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::StoreError;

/// Completes when the change it stands for (and every change committed before it) is
/// durable, as far as the store's [`crate::Durability`] setting promises.
///
/// Await it from async code, or block on it with [`Durable::wait`] from sync code. It is
/// cheap to clone; every clone completes with the same outcome. Dropping it does not
/// cancel the write: the write happens regardless, the handle only reports it.
///
/// The outcome is an error when the batch holding the change could not be committed; the
/// store then refuses every later write (see [`StoreError::Failed`]).
#[derive(Debug, Clone)]
pub struct Durable {
    batch: Option<Arc<Batch>>,
}

impl Durable {
    /// A handle that is already complete: nothing needed writing (a [`crate::MemoryStore`],
    /// or a check whose state was already durable).
    pub const fn ready() -> Durable {
        Durable { batch: None }
    }

    pub(crate) fn of(batch: Arc<Batch>) -> Durable {
        Durable { batch: Some(batch) }
    }

    /// Block the calling thread until the write is durable.
    pub fn wait(&self) -> Result<(), StoreError> {
        let Some(b) = &self.batch else { return Ok(()) };
        let mut st = b.lock();
        loop {
            if let Some(outcome) = &st.outcome {
                return outcome.clone();
            }
            st = b.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Like [`Durable::wait`], giving up after `timeout` (`None` if still pending).
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<(), StoreError>> {
        let Some(b) = &self.batch else {
            return Some(Ok(()));
        };
        let st = b.lock();
        let (st, _) =
            b.cv.wait_timeout_while(st, timeout, |s| s.outcome.is_none())
                .unwrap_or_else(PoisonError::into_inner);
        st.outcome.clone()
    }

    /// The outcome, if the write has completed (without waiting).
    pub fn try_result(&self) -> Option<Result<(), StoreError>> {
        match &self.batch {
            None => Some(Ok(())),
            Some(b) => b.lock().outcome.clone(),
        }
    }

    /// The sequence number of the batch this write joined (0 when already complete).
    /// Batches commit in increasing sequence order.
    pub fn batch_seq(&self) -> u64 {
        self.batch.as_ref().map_or(0, |b| b.seq)
    }
}

impl Future for Durable {
    type Output = Result<(), StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(b) = &self.batch else {
            return Poll::Ready(Ok(()));
        };
        let mut st = b.lock();
        if let Some(outcome) = &st.outcome {
            return Poll::Ready(outcome.clone());
        }
        if !st.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            st.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// One group commit: every change that joined it completes together.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) seq: u64,
    state: Mutex<BatchState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct BatchState {
    outcome: Option<Result<(), StoreError>>,
    wakers: Vec<Waker>,
}

impl Batch {
    pub(crate) fn new(seq: u64) -> Batch {
        Batch {
            seq,
            state: Mutex::new(BatchState::default()),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BatchState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Record the outcome (the first one wins) and wake every waiter.
    pub(crate) fn complete(&self, outcome: Result<(), StoreError>) {
        let wakers = {
            let mut st = self.lock();
            if st.outcome.is_some() {
                return;
            }
            st.outcome = Some(outcome);
            std::mem::take(&mut st.wakers)
        };
        self.cv.notify_all();
        for w in wakers {
            w.wake();
        }
    }

    pub(crate) fn is_complete(&self) -> bool {
        self.lock().outcome.is_some()
    }
}
