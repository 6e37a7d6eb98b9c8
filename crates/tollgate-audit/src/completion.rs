//! A completion handle that can be awaited in async code and blocked on in sync code,
//! built on std primitives only (no async runtime dependency).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use crate::writer::WriteError;

#[derive(Debug)]
enum State<T> {
    Waiting(Option<Waker>),
    Done(Result<T, WriteError>),
    Taken,
}

#[derive(Debug)]
struct Slot<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

impl<T> Slot<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The result of a submitted entry, ready once the batch holding it is durable (as the
/// fsync policy defines durable). `.await` it, or call [`Pending::wait`].
#[derive(Debug)]
#[must_use = "the entry is durable only when this completes"]
pub struct Pending<T> {
    slot: Arc<Slot<T>>,
}

/// The writer's side of a [`Pending`]. Dropped without completing, it completes with
/// [`WriteError::WriterGone`]. Other journals (the PostgreSQL sink) complete their
/// entries through it too.
#[derive(Debug)]
pub struct Completer<T> {
    slot: Option<Arc<Slot<T>>>,
}

/// A connected pair: complete the first, and the second is ready.
pub fn pair<T>() -> (Completer<T>, Pending<T>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(State::Waiting(None)),
        ready: Condvar::new(),
    });
    (
        Completer {
            slot: Some(slot.clone()),
        },
        Pending { slot },
    )
}

impl<T> Completer<T> {
    /// Deliver the result and wake the waiter.
    pub fn complete(mut self, value: Result<T, WriteError>) {
        if let Some(slot) = self.slot.take() {
            deliver(&slot, value);
        }
    }
}

fn deliver<T>(slot: &Slot<T>, value: Result<T, WriteError>) {
    let waker = {
        let mut st = slot.lock();
        match std::mem::replace(&mut *st, State::Done(value)) {
            State::Waiting(w) => w,
            other @ (State::Done(_) | State::Taken) => {
                *st = other;
                None
            }
        }
    };
    slot.ready.notify_all();
    if let Some(w) = waker {
        w.wake();
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            deliver(&slot, Err(WriteError::WriterGone));
        }
    }
}

impl<T> Pending<T> {
    /// Block the calling thread until the result is ready.
    pub fn wait(self) -> Result<T, WriteError> {
        let mut st = self.slot.lock();
        loop {
            match std::mem::replace(&mut *st, State::Taken) {
                State::Done(v) => return v,
                State::Taken => return Err(WriteError::WriterGone),
                waiting @ State::Waiting(_) => {
                    *st = waiting;
                    st = self
                        .slot
                        .ready
                        .wait(st)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
    }

    /// The result, if it is ready, without blocking.
    pub fn try_take(&self) -> Option<Result<T, WriteError>> {
        let mut st = self.slot.lock();
        match std::mem::replace(&mut *st, State::Taken) {
            State::Done(v) => Some(v),
            other => {
                *st = other;
                None
            }
        }
    }
}

impl<T> Future for Pending<T> {
    type Output = Result<T, WriteError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.slot.lock();
        match std::mem::replace(&mut *st, State::Taken) {
            State::Done(v) => Poll::Ready(v),
            State::Taken => Poll::Ready(Err(WriteError::WriterGone)),
            State::Waiting(_) => {
                *st = State::Waiting(Some(cx.waker().clone()));
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Wake;

    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn wait_and_poll_see_the_value() {
        let (c, p) = pair::<u32>();
        let t = std::thread::spawn(move || p.wait());
        c.complete(Ok(7));
        assert_eq!(t.join().unwrap().unwrap(), 7);

        let (c, mut p) = pair::<u32>();
        let flag = Arc::new(Flag(false.into()));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut p).poll(&mut cx).is_pending());
        c.complete(Ok(9));
        assert!(flag.0.load(std::sync::atomic::Ordering::SeqCst));
        assert!(matches!(Pin::new(&mut p).poll(&mut cx), Poll::Ready(Ok(9))));
    }

    #[test]
    fn dropped_completer_reports_writer_gone() {
        let (c, p) = pair::<u32>();
        drop(c);
        assert!(matches!(p.wait(), Err(WriteError::WriterGone)));
    }
}
