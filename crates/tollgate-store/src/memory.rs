//! [`MemoryStore`]: the same engine with no disk, for library mode and callers' tests.

use crate::durable::Durable;
use crate::engine::Engine;
use crate::session::{Budget, BudgetKey, Session};
#[cfg(doc)]
use crate::SessionStore;
use crate::{Change, StoreError, StoreOptions};

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

    /// How many sessions are live.
    pub fn len(&self) -> usize {
        self.engine.len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// [`SessionStore::create`], without a future.
    pub fn create_sync(&self, session: Session) -> Result<Durable, StoreError> {
        self.engine.create(session)
    }

    /// [`SessionStore::apply`], without a future.
    pub fn apply_sync<R>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Session) -> Change<R>,
    ) -> Result<(R, Durable), StoreError> {
        self.engine.apply(id, f)
    }

    /// [`SessionStore::get`], without a future.
    pub fn get_sync(&self, id: &str) -> Result<Option<Session>, StoreError> {
        self.engine.get(id)
    }

    /// [`SessionStore::remove`], without a future.
    pub fn remove_sync(&self, id: &str) -> Result<Durable, StoreError> {
        self.engine.remove(id)
    }

    /// [`SessionStore::list`], without a future.
    pub fn list_sync(&self, org: Option<&str>) -> Result<Vec<Session>, StoreError> {
        self.engine
            .list(|s| org.is_none_or(|o| s.meta.organization_id == o))
    }

    /// [`SessionStore::budget`], without a future.
    pub fn budget_sync(&self, key: &BudgetKey) -> Result<Option<Budget>, StoreError> {
        self.engine.budget(key)
    }
}

// Nothing to flush: a memory store is gone when dropped.
crate::ready_session_store!(MemoryStore, |_: &MemoryStore| Ok(()));
