//! [`MemoryStore`]: the same engine with no disk, for library mode and callers' tests.

#[cfg(doc)]
use crate::durable::Durable;
use crate::engine::Engine;
use crate::StoreOptions;

/// Sessions in memory only: the same locking, shared budgets, limits and errors as
/// [`crate::EmbeddedStore`], but every [`Durable`] is complete at once and nothing
/// survives the process. `close` is a no-op.
#[derive(Debug)]
pub struct MemoryStore {
    engine: Engine,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new(StoreOptions::default())
    }
}

impl MemoryStore {
    /// An empty store with these limits (`durability` and `max_record_bytes` are unused).
    pub fn new(options: StoreOptions) -> MemoryStore {
        MemoryStore {
            engine: Engine::new(options.limits(), None),
        }
    }
}

// Nothing to flush: a memory store is gone when dropped.
crate::ready_session_store!(MemoryStore, |_: &MemoryStore| Ok(()));
