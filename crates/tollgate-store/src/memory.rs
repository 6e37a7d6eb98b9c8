//! [`MemoryStore`]: the same engine with no disk, for tests and embedders.

use std::sync::Arc;

#[cfg(doc)]
use crate::durable::Durable;
use crate::durable::Journal;
use crate::engine::Engine;

/// Sessions in memory only: the same locking, shared budgets, limits and errors as
/// [`crate::EmbeddedStore`]. Without a journal every [`Durable`] is complete at once; with
/// one (an audit writer, say) every change is written to it, as the embedded store does,
/// but nothing is read back: the state is gone when the store is dropped.
#[derive(Debug)]
pub struct MemoryStore {
    pub(crate) engine: Engine,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new(100_000, None)
    }
}

impl MemoryStore {
    /// An empty store holding at most `max_sessions`, writing to `journal` if given.
    pub fn new(max_sessions: usize, journal: Option<Arc<dyn Journal>>) -> MemoryStore {
        MemoryStore {
            engine: Engine::new(max_sessions, journal),
        }
    }

    /// Every session and shared budget, copied.
    pub fn dump(&self) -> (Vec<crate::Session>, Vec<(crate::BudgetKey, crate::Budget)>) {
        self.engine.dump()
    }
}

// Nothing to flush: a memory store is gone when dropped.
crate::ready_session_store!(MemoryStore, |s: &MemoryStore| {
    s.engine.stop(crate::StoreError::Closed);
    Ok(())
});
