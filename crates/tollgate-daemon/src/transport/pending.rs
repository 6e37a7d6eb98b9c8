//! A bounded set of peers that have not proved who they are yet (a socket connection before
//! its first authenticated frame, a control-plane connection before it signs in), oldest
//! first. Admitting one more when it is full signals the oldest to close: a flood of
//! silent or garbage connections then only ever pushes out its own oldest members, and a
//! new peer, which proves itself right after it connects, is pushed out only if the flood
//! opens as many connections as the set holds in that moment.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// The set (see the module documentation).
#[derive(Debug)]
pub struct Pending {
    cap: usize,
    inner: Mutex<(u64, BTreeMap<u64, Arc<Notify>>)>,
}

/// A peer's place in a [`Pending`] set, given up when dropped (it proved itself, or
/// closed).
#[derive(Debug)]
pub struct PendingSlot {
    pending: Arc<Pending>,
    id: u64,
    evicted: Arc<Notify>,
}

impl Pending {
    /// A set of at most `cap` (at least 1).
    pub fn new(cap: usize) -> Arc<Pending> {
        Arc::new(Pending {
            cap: cap.max(1),
            inner: Mutex::new((0, BTreeMap::new())),
        })
    }

    /// A place for a new peer, signalling the oldest to close if the set is full.
    pub fn admit(self: &Arc<Self>, transport: &str) -> PendingSlot {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        while inner.1.len() >= self.cap {
            let Some((_, oldest)) = inner.1.pop_first() else {
                break;
            };
            // Stored as a permit if the peer is not waiting on it right now.
            oldest.notify_one();
            tracing::warn!(
                "{transport}: {} peers not signed in; closing the oldest",
                self.cap
            );
        }
        let id = inner.0;
        inner.0 = inner.0.wrapping_add(1);
        let evicted = Arc::new(Notify::new());
        inner.1.insert(id, evicted.clone());
        PendingSlot {
            pending: self.clone(),
            id,
            evicted,
        }
    }

    /// How many hold a place now.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .len()
    }

    /// Whether none does.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl PendingSlot {
    /// Resolves once this peer was pushed out by a newer one (at once if it already was).
    pub fn evicted(&self) -> Arc<Notify> {
        self.evicted.clone()
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        let mut inner = self
            .pending
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        inner.1.remove(&self.id);
    }
}
