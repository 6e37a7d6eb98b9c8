//! [`MemoryStore`]: the same engine with no disk, for library mode and callers' tests.

use crate::durable::Durable;
use crate::engine::Engine;
use crate::session::{Budget, BudgetKey, Session};
use crate::{Change, SessionStore, StoreError, StoreOptions};

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

impl SessionStore for MemoryStore {
    fn create(
        &self,
        session: Session,
    ) -> impl std::future::Future<Output = Result<Durable, StoreError>> + Send {
        std::future::ready(self.create_sync(session))
    }

    fn get(
        &self,
        id: &str,
    ) -> impl std::future::Future<Output = Result<Option<Session>, StoreError>> + Send {
        std::future::ready(self.get_sync(id))
    }

    fn apply<R: Send + 'static>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Session) -> Change<R> + Send,
    ) -> impl std::future::Future<Output = Result<(R, Durable), StoreError>> + Send {
        std::future::ready(self.apply_sync(id, f))
    }

    fn remove(
        &self,
        id: &str,
    ) -> impl std::future::Future<Output = Result<Durable, StoreError>> + Send {
        std::future::ready(self.remove_sync(id))
    }

    fn list(
        &self,
        org: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Vec<Session>, StoreError>> + Send {
        std::future::ready(self.list_sync(org))
    }

    fn pending_hitl(
        &self,
        org: Option<&str>,
    ) -> impl std::future::Future<Output = Result<Vec<Session>, StoreError>> + Send {
        std::future::ready(
            self.engine.list(|s| {
                s.state.pending.is_some() && org.is_none_or(|o| s.meta.organization_id == o)
            }),
        )
    }

    fn budget(
        &self,
        key: &BudgetKey,
    ) -> impl std::future::Future<Output = Result<Option<Budget>, StoreError>> + Send {
        std::future::ready(self.budget_sync(key))
    }

    fn close(&self) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }
}
