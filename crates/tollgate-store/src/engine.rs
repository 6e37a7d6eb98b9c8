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
//! Snapshots: a committed session is an immutable `Arc<Session>` *without* its seen
//! nonces; the journal keeps the latest `Arc` per session, the nonces added and removed
//! since the last batch, and the latest amounts per shared budget, all recorded while the
//! slot locks are held. When the writer swaps the journal out, what it holds is therefore
//! a consistent cut: every session and budget exactly as the last change before the swap
//! left them.
//!
//! Nonces: the set of seen nonces only grows over a session's life, so it is kept out of
//! the snapshot (which `apply` clones) and out of the record (which the writer encodes).
//! A slot owns the live set and a second copy, `written`, equal to it between changes.
//! After the closure, one merge walk of the two sets gives the nonces it added and
//! removed: on commit they go to the journal and onto `written`; on keep they are undone.
//! So `apply` costs a walk over the set (no allocation) rather than a clone of it, and
//! the writer writes only new nonces.

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock};

use tollgate_core::NonceSet;

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
    /// `state.seen_nonces` is always empty here: the nonces live in `nonces`.
    session: Option<Arc<Session>>,
    /// The live set of seen nonces. Its change log is empty whenever the slot lock is free.
    nonces: NonceSet,
    /// INVARIANT (nonce-shadow): equal to `nonces` whenever the slot lock is free; the
    /// reference that closure edits are diffed against.
    written: BTreeSet<u64>,
    /// The batch of the last committed change, for `Change::Keep`.
    last: Option<Arc<Batch>>,
}

impl SlotState {
    fn new(mut session: Session, last: Option<Arc<Batch>>) -> SlotState {
        let mut nonces = std::mem::take(&mut session.state.seen_nonces);
        nonces.take_changes(); // what is given here is what is written
        SlotState {
            session: Some(Arc::new(session)),
            written: nonces.as_set().clone(),
            nonces,
            last,
        }
    }

    /// A full copy of the session, nonces included.
    fn full(&self) -> Option<Session> {
        let mut s = Session::clone(self.session.as_deref()?);
        s.state.seen_nonces = self.nonces.clone();
        Some(s)
    }
}

/// The nonces in `now` and not in `old`, and those in `old` and not in `now`.
///
/// One merge walk over both sets; no allocation unless something changed. This walk is
/// the cost of a check-and-apply that grows with the session: O(seen nonces).
pub(crate) fn nonce_diff(old: &BTreeSet<u64>, now: &BTreeSet<u64>) -> (Vec<u64>, Vec<u64>) {
    let (mut added, mut removed) = (Vec::new(), Vec::new());
    let mut a = old.iter().copied();
    let mut b = now.iter().copied();
    let (mut x, mut y) = (a.next(), b.next());
    loop {
        match (x, y) {
            (Some(p), Some(q)) if p == q => {
                x = a.next();
                y = b.next();
            }
            (Some(p), Some(q)) if p < q => {
                removed.push(p);
                x = a.next();
            }
            (Some(_), Some(q)) | (None, Some(q)) => {
                added.push(q);
                y = b.next();
            }
            (Some(p), None) => {
                removed.push(p);
                x = a.next();
            }
            (None, None) => return (added, removed),
        }
    }
}

type Slot = Mutex<SlotState>;
type Shard = RwLock<HashMap<String, Arc<Slot>>>;

#[derive(Debug)]
struct BudgetState {
    budget: Budget,
    last: Option<Arc<Batch>>,
}

type BudgetSlot = Mutex<BudgetState>;

/// What the writer must do for one session.
#[derive(Debug, Default)]
pub(crate) struct SessionChange {
    /// The latest snapshot (nonces left out); `None` once removed.
    pub snapshot: Option<Arc<Session>>,
    /// Delete every stored nonce of this id first (removal, or creation anew).
    pub reset: bool,
    /// Nonces to store.
    pub added: BTreeSet<u64>,
    /// Nonces to delete.
    pub removed: BTreeSet<u64>,
}

impl SessionChange {
    fn add(&mut self, n: u64) {
        if !self.removed.remove(&n) {
            self.added.insert(n);
        }
    }

    fn remove(&mut self, n: u64) {
        // Added in this batch: never stored, so nothing to delete.
        if !self.added.remove(&n) {
            self.removed.insert(n);
        }
    }
}

/// One change to a session, as `Journal::record` takes it.
pub(crate) enum SessionEdit<'a> {
    /// Created (or created again after a removal) with these nonces.
    Created(Arc<Session>, &'a BTreeSet<u64>),
    /// Changed: the new snapshot and the nonce delta.
    Changed(Arc<Session>, &'a [u64], &'a [u64]),
    /// Removed.
    Removed,
}

/// Changes not yet handed to the writer.
#[derive(Debug)]
pub(crate) struct Pending {
    /// Per session changed since the last batch.
    pub sessions: HashMap<String, SessionChange>,
    /// Latest amounts per shared budget.
    pub budgets: HashMap<BudgetKey, Budget>,
    /// The batch these changes will complete with.
    pub batch: Arc<Batch>,
    closed: bool,
    failed: Option<StoreError>,
}

impl Pending {
    #[cfg(test)]
    pub(crate) fn empty_for_tests() -> Pending {
        Pending {
            sessions: HashMap::new(),
            budgets: HashMap::new(),
            batch: Arc::new(Batch::new(1)),
            closed: false,
            failed: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.sessions.is_empty() && self.budgets.is_empty()
    }
}

/// The queue between `apply` and the writer thread.
#[derive(Debug)]
pub(crate) struct Journal {
    pending: Mutex<Pending>,
    cv: Condvar,
    /// Batches committed, sessions and budgets written, and time spent writing.
    pub(crate) stats: WriterStats,
}

/// Counters kept by the writer.
#[derive(Debug, Default)]
pub(crate) struct WriterStats {
    pub batches: AtomicU64,
    pub sessions: AtomicU64,
    pub budgets: AtomicU64,
    pub write_nanos: AtomicU64,
    pub checkpoints: AtomicU64,
    pub log_syncs: AtomicU64,
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
            stats: WriterStats::default(),
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
        id: &str,
        edit: SessionEdit<'_>,
        budget: Option<(&BudgetKey, Budget)>,
    ) -> Result<Arc<Batch>, StoreError> {
        let mut p = lock(&self.pending);
        Journal::check(&p)?;
        let change = match p.sessions.get_mut(id) {
            Some(c) => c,
            None => p.sessions.entry(id.to_owned()).or_default(),
        };
        match edit {
            SessionEdit::Created(snap, nonces) => {
                *change = SessionChange {
                    snapshot: Some(snap),
                    reset: true,
                    added: nonces.clone(),
                    removed: BTreeSet::new(),
                };
            }
            SessionEdit::Changed(snap, added, removed) => {
                change.snapshot = Some(snap);
                for n in removed {
                    change.remove(*n);
                }
                for n in added {
                    change.add(*n);
                }
            }
            SessionEdit::Removed => {
                *change = SessionChange {
                    snapshot: None,
                    reset: true,
                    ..SessionChange::default()
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

    /// The writer is gone (it panicked): fail the batch now filling, so nobody waits
    /// forever, and refuse every later change.
    pub(crate) fn abandon(&self, e: StoreError) {
        let mut p = lock(&self.pending);
        if p.failed.is_none() {
            p.failed = Some(e.clone());
        }
        let batch = Arc::clone(&p.batch);
        drop(p);
        batch.complete(Err(e));
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
            map.insert(id, Arc::new(Mutex::new(SlotState::new(s, None))));
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn finish(batch: Option<Arc<Batch>>) -> Durable {
        batch.map_or(Durable::ready(), Durable::of)
    }

    pub(crate) fn create(&self, mut session: Session) -> Result<Durable, StoreError> {
        session.meta.validate()?;
        if session.state_entries() > self.limits.max_state_entries {
            return Err(StoreError::StateTooLarge {
                id: session.meta.session_id.clone(),
                entries: session.state_entries(),
                max: self.limits.max_state_entries,
            });
        }
        if let Some(j) = &self.journal {
            j.ensure_open()?;
        }
        let id = session.meta.session_id.clone();
        let shard = self.shard(&id)?;
        let mut map = shard.write().unwrap_or_else(PoisonError::into_inner);
        if map.contains_key(&id) {
            return Err(StoreError::Exists { id });
        }
        // INVARIANT (session-cap): the count only grows here, by a compare-and-swap that
        // refuses to pass `max`, so racing creates in different shards cannot overshoot.
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
        let nonces = std::mem::take(&mut session.state.seen_nonces);
        match self.create_locked(&id, &mut session, nonces.as_set()) {
            Ok(batch) => {
                session.state.seen_nonces = nonces;
                map.insert(
                    id,
                    Arc::new(Mutex::new(SlotState::new(session, batch.clone()))),
                );
                Ok(Engine::finish(batch))
            }
            Err(e) => {
                self.count.fetch_sub(1, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    /// Join or start the shared budget and journal the new session (`session` without
    /// its nonces, which come separately).
    fn create_locked(
        &self,
        id: &str,
        session: &mut Session,
        nonces: &BTreeSet<u64>,
    ) -> Result<Option<Arc<Batch>>, StoreError> {
        let Some(key) = session.meta.shared_budget_key() else {
            let snap = Arc::new(session.clone());
            return self
                .journal
                .as_ref()
                .map(|j| j.record(id, SessionEdit::Created(snap, nonces), None))
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
                    .map(|j| j.record(id, SessionEdit::Created(snap, nonces), None))
                    .transpose()
            }
            Entry::Vacant(e) => {
                let amounts = Budget::of(&session.state);
                let snap = Arc::new(session.clone());
                let batch = self
                    .journal
                    .as_ref()
                    .map(|j| {
                        j.record(
                            id,
                            SessionEdit::Created(snap, nonces),
                            Some((e.key(), amounts)),
                        )
                    })
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
            .map(|j| j.record(id, SessionEdit::Removed, None))
            .transpose()?;
        st.session = None;
        st.nonces.clear();
        st.written.clear();
        st.last = batch.clone();
        drop(st);
        map.remove(id);
        self.count.fetch_sub(1, Ordering::AcqRel);
        Ok(Engine::finish(batch))
    }

    /// A copy of a session with its nonces and shared budget loaded.
    pub(crate) fn get(&self, id: &str) -> Result<Option<Session>, StoreError> {
        let slot = match self.slot(id) {
            Ok(s) => s,
            Err(StoreError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let full = lock(&slot).full();
        full.map(|s| self.with_budget(s)).transpose()
    }

    fn with_budget(&self, mut s: Session) -> Result<Session, StoreError> {
        if let Some(k) = s.meta.shared_budget_key() {
            let b = self.budget_slot(&k)?;
            lock(&b).budget.load_into(&mut s.state);
        }
        Ok(s)
    }

    /// Copies of every session that `keep` accepts (it sees the session without its
    /// nonces), sorted by id.
    pub(crate) fn list(&self, keep: impl Fn(&Session) -> bool) -> Result<Vec<Session>, StoreError> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let slots: Vec<Arc<Slot>> = shard
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned()
                .collect();
            for slot in slots {
                let st = lock(&slot);
                if st.session.as_deref().is_some_and(&keep) {
                    if let Some(full) = st.full() {
                        out.push(full);
                    }
                }
            }
        }
        out.sort_by(|a, b| a.meta.session_id.cmp(&b.meta.session_id));
        out.into_iter().map(|s| self.with_budget(s)).collect()
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
        let mut guard = lock(&slot);
        let st = &mut *guard;
        let Some(current) = st.session.clone() else {
            return Err(StoreError::NotFound { id: id.to_owned() });
        };
        let key = current.meta.shared_budget_key();
        let bslot = key.as_ref().map(|k| self.budget_slot(k)).transpose()?;
        let mut bst = bslot.as_deref().map(lock);

        // The closure works on a copy of everything but the nonce set, which it gets
        // itself (moved in, not copied).
        let mut work = Session::clone(&current);
        work.state.seen_nonces = std::mem::take(&mut st.nonces);
        if let Some(b) = &bst {
            b.budget.load_into(&mut work.state);
        }
        // A panicking closure must not leave the slot without its nonces: catch it,
        // put the set back as it was, and let the panic go on.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut work)));
        let mut nonces = std::mem::take(&mut work.state.seen_nonces);
        // The set's own change log says what the closure did, in O(changes). A closure that
        // replaced the set wholesale has a log that does not add up; then compare sets.
        let (added, removed) = {
            let (added, removed) = nonces.take_changes();
            if st.written.len() + added.len() == nonces.len() + removed.len()
                && added.iter().all(|n| !st.written.contains(n))
                && removed.iter().all(|n| st.written.contains(n))
            {
                (added, removed)
            } else {
                nonce_diff(&st.written, nonces.as_set())
            }
        };
        let change = match outcome {
            Ok(change) => change,
            Err(payload) => {
                for n in &added {
                    nonces.remove(n);
                }
                nonces.extend(removed.iter().copied());
                nonces.take_changes(); // the undo itself is not a change
                st.nonces = nonces;
                drop(bst);
                drop(guard);
                std::panic::resume_unwind(payload);
            }
        };
        let verdict = match change {
            Change::Keep(r) => Err(Ok(r)),
            Change::Commit(r) => self
                .check_commit(id, &current, &work, nonces.len())
                .map(|()| r)
                .map_err(Err),
        };
        let r = match verdict {
            Ok(r) => r,
            Err(outcome) => {
                // Undo the closure's nonce edits; everything else was only a copy.
                // INVARIANT (nonce-shadow): restored to equal `written`.
                for n in &added {
                    nonces.remove(n);
                }
                nonces.extend(removed.iter().copied());
                nonces.take_changes(); // the undo itself is not a change
                st.nonces = nonces;
                let r = outcome?;
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
        };
        let amounts = Budget::of(&work.state);
        let budget_change = match (&key, &bst) {
            (Some(k), Some(b)) if b.budget != amounts => Some((k, amounts)),
            _ => None,
        };
        let snap = Arc::new(work);
        let recorded = self
            .journal
            .as_ref()
            .map(|j| {
                j.record(
                    id,
                    SessionEdit::Changed(Arc::clone(&snap), &added, &removed),
                    budget_change,
                )
            })
            .transpose();
        let batch = match recorded {
            Ok(b) => b,
            Err(e) => {
                for n in &added {
                    nonces.remove(n);
                }
                nonces.extend(removed.iter().copied());
                nonces.take_changes(); // the undo itself is not a change
                st.nonces = nonces;
                return Err(e);
            }
        };
        // INVARIANT (nonce-shadow): `written` follows `nonces` by the same delta.
        for n in &removed {
            st.written.remove(n);
        }
        st.written.extend(added.iter().copied());
        st.nonces = nonces;
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

    /// The checks a commit must pass; on failure nothing is written.
    fn check_commit(
        &self,
        id: &str,
        current: &Session,
        work: &Session,
        nonces: usize,
    ) -> Result<(), StoreError> {
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
        let entries = work.state_entries() + nonces;
        if entries > self.limits.max_state_entries {
            return Err(StoreError::StateTooLarge {
                id: id.to_owned(),
                entries,
                max: self.limits.max_state_entries,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::collection::btree_set;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn nonce_diff_is_exact(
            old in btree_set(0_u64..200, 0..40),
            now in btree_set(0_u64..200, 0..40),
        ) {
            let (added, removed) = nonce_diff(&old, &now);
            let mut rebuilt = old.clone();
            for n in &removed {
                prop_assert!(rebuilt.remove(n));
            }
            for n in &added {
                prop_assert!(rebuilt.insert(*n));
            }
            prop_assert_eq!(rebuilt, now);
        }

        #[test]
        fn batched_nonce_changes_compose(
            start in btree_set(0_u64..50, 0..20),
            steps in proptest::collection::vec(btree_set(0_u64..50, 0..20), 1..6),
        ) {
            // Folding several changes into one batch gives the net change.
            let mut c = SessionChange::default();
            let mut cur = start.clone();
            for next in &steps {
                let (added, removed) = nonce_diff(&cur, next);
                for n in removed {
                    c.remove(n);
                }
                for n in added {
                    c.add(n);
                }
                cur = next.clone();
            }
            let mut disk = start.clone();
            for n in &c.removed {
                prop_assert!(disk.remove(n), "deleting {n}, which is not stored");
            }
            for n in &c.added {
                prop_assert!(disk.insert(*n), "storing {n}, which is stored");
            }
            prop_assert_eq!(&disk, steps.last().unwrap());
        }
    }
}
