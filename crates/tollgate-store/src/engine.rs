//! The in-memory engine both stores share: live sessions and shared budgets behind
//! per-session and per-budget locks, and (for a persistent store) the journal of changes
//! waiting for the writer thread.
//!
//! Lock order, outermost first; a thread holding one lock only ever takes locks further
//! down this list, so no two threads can wait on each other:
//!
//! 1. a shard of the session map (`shards[i]`; held only to find, insert or remove a slot,
//!    never while a closure runs),
//! 2. a session slot (`Slot`; held for the whole check-and-apply),
//! 3. the budget map (`budgets`; held only to find or insert a budget slot),
//! 4. a budget slot (`BudgetSlot`; held for the whole check-and-apply of any session
//!    sharing it, which serializes the sessions of one agent or organization),
//! 5. the journal (`Journal::pending`; innermost, never held while taking another lock).
//!
//! Snapshots: a committed session is an immutable `Arc<Session>`; the journal keeps the
//! latest `Arc` per session and the latest amounts per shared budget, taken while the
//! slot locks are held. When the writer swaps the journal out, what it holds is therefore
//! a consistent cut: every session and budget exactly as the last change before the swap
//! left them.

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};

use crate::durable::{Batch, Durable};
use crate::session::{Budget, BudgetKey, Session};
use crate::{Change, StoreError};

const SHARDS: usize = 32;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The limits the engine enforces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineLimits {
    pub max_sessions: usize,
    pub max_state_entries: usize,
}

#[derive(Debug, Default)]
struct SlotState {
    /// `None` once removed (a racing `apply` that already holds the `Arc<Slot>` sees it).
    session: Option<Arc<Session>>,
    /// The batch of the last committed change, for `Change::Keep`.
    last: Option<Arc<Batch>>,
}

type Slot = Mutex<SlotState>;
type Shard = RwLock<HashMap<String, Arc<Slot>>>;

#[derive(Debug)]
struct BudgetState {
    budget: Budget,
    last: Option<Arc<Batch>>,
}

type BudgetSlot = Mutex<BudgetState>;

/// Changes not yet handed to the writer.
#[derive(Debug)]
pub(crate) struct Pending {
    /// Latest snapshot per session; `None` for a removed session.
    pub sessions: HashMap<String, Option<Arc<Session>>>,
    /// Latest amounts per shared budget.
    pub budgets: HashMap<BudgetKey, Budget>,
    /// The batch these changes will complete with.
    pub batch: Arc<Batch>,
    closed: bool,
    failed: Option<StoreError>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.sessions.is_empty() && self.budgets.is_empty()
    }
}

/// The queue between `apply` and the writer thread.
#[derive(Debug)]
pub(crate) struct Journal {
    pending: Mutex<Pending>,
    cv: Condvar,
}

impl Journal {
    pub(crate) fn new() -> Journal {
        Journal {
            pending: Mutex::new(Pending {
                sessions: HashMap::new(),
                budgets: HashMap::new(),
                batch: Arc::new(Batch::new(1)),
                closed: false,
                failed: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn check(p: &Pending) -> Result<(), StoreError> {
        if let Some(e) = &p.failed {
            return Err(StoreError::Failed {
                message: e.to_string(),
            });
        }
        if p.closed {
            return Err(StoreError::Closed);
        }
        Ok(())
    }

    /// Record a change. Called with the slot locks held, so changes of one session (and
    /// of one budget) enter the journal in the order they were made.
    fn record(
        &self,
        session: Option<(&str, Option<Arc<Session>>)>,
        budget: Option<(&BudgetKey, Budget)>,
    ) -> Result<Arc<Batch>, StoreError> {
        let mut p = lock(&self.pending);
        Journal::check(&p)?;
        if let Some((id, snap)) = session {
            match p.sessions.get_mut(id) {
                Some(slot) => *slot = snap,
                None => {
                    p.sessions.insert(id.to_owned(), snap);
                }
            }
        }
        if let Some((key, amounts)) = budget {
            match p.budgets.get_mut(key) {
                Some(slot) => *slot = amounts,
                None => {
                    p.budgets.insert(key.clone(), amounts);
                }
            }
        }
        let batch = Arc::clone(&p.batch);
        drop(p);
        self.cv.notify_one();
        Ok(batch)
    }

    /// Whether new changes are accepted.
    pub(crate) fn ensure_open(&self) -> Result<(), StoreError> {
        Journal::check(&lock(&self.pending))
    }

    /// Wait for changes and take them all, starting a new batch. `None` once closed and
    /// drained.
    pub(crate) fn take(&self) -> Option<Pending> {
        let mut p = lock(&self.pending);
        while p.is_empty() && !p.closed {
            p = self.cv.wait(p).unwrap_or_else(PoisonError::into_inner);
        }
        if p.is_empty() {
            return None;
        }
        let next = Arc::new(Batch::new(p.batch.seq.saturating_add(1)));
        Some(Pending {
            sessions: std::mem::take(&mut p.sessions),
            budgets: std::mem::take(&mut p.budgets),
            batch: std::mem::replace(&mut p.batch, next),
            closed: false,
            failed: None,
        })
    }

    /// Stop accepting changes; the writer drains what is queued and exits.
    pub(crate) fn close(&self) {
        lock(&self.pending).closed = true;
        self.cv.notify_all();
    }

    /// A batch failed: refuse every later change (memory is now ahead of disk).
    pub(crate) fn fail(&self, e: StoreError) {
        let mut p = lock(&self.pending);
        if p.failed.is_none() {
            p.failed = Some(e);
        }
    }
}

/// Live sessions and shared budgets.
#[derive(Debug)]
pub(crate) struct Engine {
    shards: Box<[Shard]>,
    budgets: Mutex<HashMap<BudgetKey, Arc<BudgetSlot>>>,
    count: AtomicUsize,
    limits: EngineLimits,
    /// `None` for a store with no disk: every change is complete at once.
    journal: Option<Journal>,
}

impl Engine {
    pub(crate) fn new(limits: EngineLimits, journal: Option<Journal>) -> Engine {
        Engine {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            budgets: Mutex::new(HashMap::new()),
            count: AtomicUsize::new(0),
            limits,
            journal,
        }
    }

    pub(crate) fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }

    fn shard(&self, id: &str) -> Result<&Shard, StoreError> {
        let mut h = DefaultHasher::new();
        id.hash(&mut h);
        let n = self.shards.len().max(1);
        #[allow(clippy::cast_possible_truncation)]
        let i = (h.finish() % n as u64) as usize;
        self.shards.get(i).ok_or(StoreError::Closed)
    }

    fn slot(&self, id: &str) -> Result<Arc<Slot>, StoreError> {
        let shard = self.shard(id)?;
        let map = shard.read().unwrap_or_else(PoisonError::into_inner);
        map.get(id)
            .cloned()
            .ok_or_else(|| StoreError::NotFound { id: id.to_owned() })
    }

    fn budget_slot(&self, key: &BudgetKey) -> Result<Arc<BudgetSlot>, StoreError> {
        lock(&self.budgets)
            .get(key)
            .cloned()
            .ok_or_else(|| StoreError::BudgetMissing { key: key.clone() })
    }

    /// Insert loaded records (at open; no journal entries).
    pub(crate) fn load(
        &self,
        sessions: Vec<Session>,
        budgets: Vec<(BudgetKey, Budget)>,
    ) -> Result<(), StoreError> {
        let mut bmap = lock(&self.budgets);
        for (k, b) in budgets {
            bmap.insert(
                k,
                Arc::new(Mutex::new(BudgetState {
                    budget: b,
                    last: None,
                })),
            );
        }
        drop(bmap);
        for s in sessions {
            if let Some(k) = s.meta.shared_budget_key() {
                // A session whose shared record is missing would spend a budget nobody
                // else sees: refuse to open rather than guess.
                self.budget_slot(&k)?;
            }
            let id = s.meta.session_id.clone();
            let shard = self.shard(&id)?;
            let mut map = shard.write().unwrap_or_else(PoisonError::into_inner);
            map.insert(
                id,
                Arc::new(Mutex::new(SlotState {
                    session: Some(Arc::new(s)),
                    last: None,
                })),
            );
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn finish(batch: Option<Arc<Batch>>) -> Durable {
        batch.map_or(Durable::ready(), Durable::of)
    }

    pub(crate) fn create(&self, mut session: Session) -> Result<Durable, StoreError> {
        session.meta.validate()?;
        if let Some(j) = &self.journal {
            j.ensure_open()?;
        }
        let id = session.meta.session_id.clone();
        let shard = self.shard(&id)?;
        let mut map = shard.write().unwrap_or_else(PoisonError::into_inner);
        if map.contains_key(&id) {
            return Err(StoreError::Exists { id });
        }
        // INVARIANT (session-cap): the count only grows here, under a shard lock, after
        // this check; racing creates in other shards are caught by the compare below.
        let max = self.limits.max_sessions;
        if self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < max).then_some(c + 1)
            })
            .is_err()
        {
            return Err(StoreError::SessionCap { max });
        }
        let result = self.create_locked(&id, &mut session);
        match result {
            Ok(batch) => {
                map.insert(
                    id,
                    Arc::new(Mutex::new(SlotState {
                        session: Some(Arc::new(session)),
                        last: batch.clone(),
                    })),
                );
                Ok(Engine::finish(batch))
            }
            Err(e) => {
                self.count.fetch_sub(1, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    /// Join or start the shared budget and journal the new session.
    fn create_locked(
        &self,
        id: &str,
        session: &mut Session,
    ) -> Result<Option<Arc<Batch>>, StoreError> {
        let Some(key) = session.meta.shared_budget_key() else {
            let snap = Arc::new(session.clone());
            return self
                .journal
                .as_ref()
                .map(|j| j.record(Some((id, Some(snap))), None))
                .transpose();
        };
        let mut budgets = lock(&self.budgets);
        match budgets.entry(key) {
            Entry::Occupied(e) => {
                // Join: the shared record's amounts win over the new session's own.
                let b = lock(e.get());
                b.budget.load_into(&mut session.state);
                let snap = Arc::new(session.clone());
                self.journal
                    .as_ref()
                    .map(|j| j.record(Some((id, Some(snap))), None))
                    .transpose()
            }
            Entry::Vacant(e) => {
                let amounts = Budget::of(&session.state);
                let snap = Arc::new(session.clone());
                let batch = self
                    .journal
                    .as_ref()
                    .map(|j| j.record(Some((id, Some(snap))), Some((e.key(), amounts))))
                    .transpose()?;
                e.insert(Arc::new(Mutex::new(BudgetState {
                    budget: amounts,
                    last: batch.clone(),
                })));
                Ok(batch)
            }
        }
    }

    pub(crate) fn remove(&self, id: &str) -> Result<Durable, StoreError> {
        if let Some(j) = &self.journal {
            j.ensure_open()?;
        }
        let shard = self.shard(id)?;
        let mut map = shard.write().unwrap_or_else(PoisonError::into_inner);
        let slot = map
            .get(id)
            .cloned()
            .ok_or_else(|| StoreError::NotFound { id: id.to_owned() })?;
        let mut st = lock(&slot);
        let batch = self
            .journal
            .as_ref()
            .map(|j| j.record(Some((id, None)), None))
            .transpose()?;
        st.session = None;
        st.last = batch.clone();
        drop(st);
        map.remove(id);
        self.count.fetch_sub(1, Ordering::AcqRel);
        Ok(Engine::finish(batch))
    }

    /// A copy of a session with its shared budget loaded.
    pub(crate) fn get(&self, id: &str) -> Result<Option<Session>, StoreError> {
        let slot = match self.slot(id) {
            Ok(s) => s,
            Err(StoreError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let st = lock(&slot);
        let Some(snap) = st.session.clone() else {
            return Ok(None);
        };
        drop(st);
        self.with_budget(&snap).map(Some)
    }

    fn with_budget(&self, snap: &Session) -> Result<Session, StoreError> {
        let mut s = snap.clone();
        if let Some(k) = s.meta.shared_budget_key() {
            let b = self.budget_slot(&k)?;
            lock(&b).budget.load_into(&mut s.state);
        }
        Ok(s)
    }

    /// Copies of every session that `keep` accepts, sorted by id.
    pub(crate) fn list(&self, keep: impl Fn(&Session) -> bool) -> Result<Vec<Session>, StoreError> {
        let mut snaps = Vec::new();
        for shard in self.shards.iter() {
            let slots: Vec<Arc<Slot>> = shard
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned()
                .collect();
            for slot in slots {
                if let Some(s) = lock(&slot).session.clone() {
                    if keep(&s) {
                        snaps.push(s);
                    }
                }
            }
        }
        snaps.sort_by(|a, b| a.meta.session_id.cmp(&b.meta.session_id));
        snaps.iter().map(|s| self.with_budget(s)).collect()
    }

    /// A shared budget's amounts, or a per-session budget's from its session.
    pub(crate) fn budget(&self, key: &BudgetKey) -> Result<Option<Budget>, StoreError> {
        if let BudgetKey::Session(id) = key {
            return Ok(self.get(id)?.map(|s| Budget::of(&s.state)));
        }
        Ok(lock(&self.budgets).get(key).map(|slot| lock(slot).budget))
    }

    /// How many sessions are live.
    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    pub(crate) fn apply<R>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Session) -> Change<R>,
    ) -> Result<(R, Durable), StoreError> {
        let slot = self.slot(id)?;
        let mut st = lock(&slot);
        let Some(current) = st.session.clone() else {
            return Err(StoreError::NotFound { id: id.to_owned() });
        };
        let key = current.meta.shared_budget_key();
        let bslot = key.as_ref().map(|k| self.budget_slot(k)).transpose()?;
        let mut bst = bslot.as_deref().map(lock);

        let mut work = Session::clone(&current);
        if let Some(b) = &bst {
            b.budget.load_into(&mut work.state);
        }
        let r = match f(&mut work) {
            Change::Keep(r) => {
                // Nothing to write, but what the closure read may not be on disk yet:
                // complete with the later of the session's and the budget's last batch.
                let mut last = st.last.clone();
                if let Some(b) = bst.as_ref().and_then(|b| b.last.clone()) {
                    if last.as_ref().is_none_or(|l| l.seq < b.seq) {
                        last = Some(b);
                    }
                }
                let last = last.filter(|b| !b.is_complete());
                return Ok((r, Engine::finish(last)));
            }
            Change::Commit(r) => r,
        };
        if work.meta != current.meta {
            return Err(StoreError::MetaChanged { id: id.to_owned() });
        }
        if work.last_call_number < current.last_call_number {
            return Err(StoreError::CallNumberRegressed {
                id: id.to_owned(),
                last: current.last_call_number,
                new: work.last_call_number,
            });
        }
        let entries = work.state_entries();
        if entries > self.limits.max_state_entries {
            return Err(StoreError::StateTooLarge {
                id: id.to_owned(),
                entries,
                max: self.limits.max_state_entries,
            });
        }
        let amounts = Budget::of(&work.state);
        let budget_change = match (&key, &bst) {
            (Some(k), Some(b)) if b.budget != amounts => Some((k, amounts)),
            _ => None,
        };
        let snap = Arc::new(work);
        let batch = self
            .journal
            .as_ref()
            .map(|j| j.record(Some((id, Some(Arc::clone(&snap)))), budget_change))
            .transpose()?;
        if let Some(b) = &mut bst {
            b.budget = amounts;
            if budget_change.is_some() {
                b.last = batch.clone();
            }
        }
        st.session = Some(snap);
        st.last = batch.clone();
        Ok((r, Engine::finish(batch)))
    }
}
