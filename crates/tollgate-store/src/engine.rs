//! The live, in-memory engine both stores share: sessions and shared budgets behind
//! per-session and per-budget locks, and the journal every durable change is written to.
//!
//! Lock order, outermost first; a thread holding one lock only ever takes locks further
//! down this list, so no two threads can wait on each other:
//!
//! 0. the gate (`gate`: shared by every change and read, exclusive for a reload of the
//!    state after the journal recovered from a failure),
//! 1. a shard of the session map (`shards[i]`; held only to find or insert a slot, never
//!    while a closure runs),
//! 2. a session slot (held for the whole check-and-apply),
//! 3. the budget map (`budgets`; held only to find or insert a budget slot),
//! 4. a budget slot (held for the whole check-and-apply of any session sharing it, which
//!    serializes the sessions of one agent or organization),
//! 5. the journal's own queue (inside [`Journal::submit`]),
//! 6. a shard's quiet index (`quiet[i]`; held only to move one session's entry or to read
//!    the entries up to a time; takes no other lock).
//!
//! INVARIANT (journal-order): a change's audit entry is submitted while the locks of its
//! session (and shared budget) are held, so the entries of one session, and of one shared
//! budget, enter the log in the order the changes were made. Replaying the log in chain
//! order therefore applies them in that order too.
//!
//! INVARIANT (quiet-index): `quiet[i]` holds `(t, id)` exactly for each session `id` of
//! shard `i` whose [`Session::quiet_since`] is `Some(t)`. It is moved only while the
//! session's slot is locked (or its shard's map is locked for writing, at create and
//! reload), so a sweep finds the sessions silent since a time by reading that range
//! instead of copying every session.
//!
//! Closures run on the session in place (no copy): [`Change::Keep`] and [`Change::Touch`]
//! promise that nothing durable was changed. A closure that panics leaves the session in
//! an unknown state, so the engine then refuses every later change ([`StoreError::Failed`]).

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};

use tollgate_audit::SessionEvent;
use tollgate_core::{SessionState, SessionStatus, UnixNanos};

use crate::durable::{Durable, Journal};
use crate::ops;
use crate::session::{Budget, BudgetKey, Session};
use crate::{Change, StoreError};

const SHARDS: usize = 32;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The fold of the log the engine reloads after its journal recovered from a failure:
/// every session and shared budget as the durable entries say.
pub(crate) type Fold = (Vec<Session>, Vec<(BudgetKey, Budget)>);

/// Where the engine gets that fold (the embedded store's snapshot thread).
pub(crate) struct Reload(pub(crate) Box<dyn Fn() -> Result<Fold, StoreError> + Send + Sync>);

impl std::fmt::Debug for Reload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reload")
    }
}

type Slot = Mutex<Session>;
type Shard = RwLock<HashMap<String, Arc<Slot>>>;
type BudgetSlot = Mutex<Budget>;
/// A shard's sessions by the time they went quiet: `(quiet since, id)`.
type Quiet = Mutex<BTreeSet<(UnixNanos, String)>>;

/// Live sessions and shared budgets.
#[derive(Debug)]
pub(crate) struct Engine {
    shards: Box<[Shard]>,
    /// `quiet[i]`: shard `i`'s sessions by [`Session::quiet_since`] (INVARIANT quiet-index).
    quiet: Box<[Quiet]>,
    budgets: Mutex<HashMap<BudgetKey, Arc<BudgetSlot>>>,
    count: AtomicUsize,
    max_sessions: usize,
    /// `None` for a store that writes nothing (every change is complete at once).
    journal: Option<Arc<dyn Journal>>,
    /// Set once a closure panicked or the store closed: every later change is refused.
    stopped: Mutex<Option<StoreError>>,
    /// The journal generation the live state follows. Every change holds it shared from
    /// its check to its submit; a reload holds it exclusively, so it waits for changes in
    /// flight and none starts until it is done.
    gate: RwLock<u64>,
    /// How to get the fold of the log when the journal's generation moves.
    reload: Option<Reload>,
}

impl Engine {
    pub(crate) fn new(max_sessions: usize, journal: Option<Arc<dyn Journal>>) -> Engine {
        Engine {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            quiet: (0..SHARDS).map(|_| Mutex::new(BTreeSet::new())).collect(),
            budgets: Mutex::new(HashMap::new()),
            count: AtomicUsize::new(0),
            max_sessions,
            gate: RwLock::new(journal.as_ref().map_or(0, |j| j.health().generation)),
            journal,
            stopped: Mutex::new(None),
            reload: None,
        }
    }

    /// Reload from `reload` whenever the journal has recovered from a failure.
    pub(crate) fn with_reload(mut self, reload: Reload) -> Engine {
        self.reload = Some(reload);
        self
    }

    /// Admit a change: the journal takes entries, and the live state follows its
    /// current generation (reloaded first if the journal recovered since). Returns the
    /// gate, held shared until the change's entry is submitted, and the generation to
    /// submit it at.
    // INVARIANT (reload-after-recovery): a change is computed only on a state that is the
    // fold of the log at the journal's current generation, and its entry is written only
    // at that generation, so a change built on one whose entry was lost never reaches
    // the log.
    fn admit(&self) -> Result<(RwLockReadGuard<'_, u64>, u64), StoreError> {
        loop {
            let health = self
                .journal
                .as_ref()
                .map(|j| j.health())
                .unwrap_or_default();
            if let Some(message) = health.failure {
                return Err(StoreError::Unavailable { message });
            }
            let gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
            if *gate == health.generation {
                return Ok((gate, health.generation));
            }
            drop(gate);
            self.resync(health.generation)?;
        }
    }

    /// A view for reads: reloaded first if the journal recovered since the last change.
    /// While the journal is failed, reads answer from memory (which may hold changes whose
    /// entries were lost; nobody was told they happened).
    fn view(&self) -> Result<RwLockReadGuard<'_, u64>, StoreError> {
        loop {
            let health = self
                .journal
                .as_ref()
                .map(|j| j.health())
                .unwrap_or_default();
            let gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
            if health.failure.is_some() || *gate == health.generation {
                return Ok(gate);
            }
            drop(gate);
            self.resync(health.generation)?;
        }
    }

    /// Replace the live state by the fold of the log, for journal generation
    /// `generation`. Liveness (heartbeat time, staleness, last activity) is kept for the
    /// sessions that stay.
    fn resync(&self, generation: u64) -> Result<(), StoreError> {
        let mut gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        if *gate == generation {
            return Ok(());
        }
        let Some(reload) = &self.reload else {
            let e = StoreError::Failed {
                message: "the journal recovered from a failure, and this store cannot reload the fold of its log".into(),
            };
            self.stop(e.clone());
            return Err(e);
        };
        let (sessions, budgets) = match (reload.0)() {
            Ok(f) => f,
            Err(e) => {
                let e = StoreError::Failed {
                    message: format!("reloading the state after the audit log recovered: {e}"),
                };
                self.stop(e.clone());
                return Err(e);
            }
        };
        let mut live: HashMap<String, Session> = HashMap::new();
        for shard in self.shards.iter() {
            let mut map = shard.write().unwrap_or_else(PoisonError::into_inner);
            for (id, slot) in map.drain() {
                live.insert(id, lock(&slot).clone());
            }
        }
        for q in self.quiet.iter() {
            lock(q).clear();
        }
        lock(&self.budgets).clear();
        self.count.store(0, Ordering::Release);
        let sessions = sessions.into_iter().map(|mut s| {
            if let Some(old) = live.get(&s.meta.session_id) {
                s.last_heartbeat_ns = old.last_heartbeat_ns;
                s.state.last_activity_ns = old.state.last_activity_ns;
                s.state.status = old.state.status;
            }
            s
        });
        self.load(sessions, budgets)?;
        *gate = generation;
        Ok(())
    }

    fn shard_index(&self, id: &str) -> usize {
        let mut h = DefaultHasher::new();
        id.hash(&mut h);
        let n = self.shards.len().max(1);
        #[allow(clippy::cast_possible_truncation)]
        let i = (h.finish() % n as u64) as usize;
        i
    }

    fn shard(&self, id: &str) -> Result<&Shard, StoreError> {
        self.shards
            .get(self.shard_index(id))
            .ok_or(StoreError::Closed)
    }

    /// Move session `id`'s entry in its shard's quiet index from `from` to `to` (`None`:
    /// no entry). The caller holds the session's slot, or its shard's map for writing.
    fn requiet(&self, id: &str, from: Option<UnixNanos>, to: Option<UnixNanos>) {
        if from == to {
            return;
        }
        let Some(q) = self.quiet.get(self.shard_index(id)) else {
            return;
        };
        let mut q = lock(q);
        let key = from.and_then(|t| q.take(&(t, id.to_owned())));
        if let Some(t) = to {
            let id = key.map_or_else(|| id.to_owned(), |(_, id)| id);
            q.insert((t, id));
        }
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

    fn check_running(&self) -> Result<(), StoreError> {
        match &*lock(&self.stopped) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Refuse every later change with `e` (the first reason wins).
    pub(crate) fn stop(&self, e: StoreError) {
        let mut s = lock(&self.stopped);
        if s.is_none() {
            *s = Some(e);
        }
    }

    /// Insert recovered sessions and budgets (at open; nothing is journaled).
    pub(crate) fn load(
        &self,
        sessions: impl IntoIterator<Item = Session>,
        budgets: impl IntoIterator<Item = (BudgetKey, Budget)>,
    ) -> Result<(), StoreError> {
        let mut bmap = lock(&self.budgets);
        for (k, b) in budgets {
            bmap.insert(k, Arc::new(Mutex::new(b)));
        }
        drop(bmap);
        for s in sessions {
            if let Some(k) = s.meta.shared_budget_key() {
                self.budget_slot(&k)?;
            }
            let id = s.meta.session_id.clone();
            let shard = self.shard(&id)?;
            let mut map = shard.write().unwrap_or_else(PoisonError::into_inner);
            let quiet = s.quiet_since();
            match map.insert(id.clone(), Arc::new(Mutex::new(s))) {
                None => {
                    self.count.fetch_add(1, Ordering::Relaxed);
                    self.requiet(&id, None, quiet);
                }
                Some(old) => self.requiet(&id, lock(&old).quiet_since(), quiet),
            }
        }
        Ok(())
    }

    /// Open a new session (version 0 in, version 1 stored): join or start its shared
    /// budget, journal its session-opened entry, and return its starting state.
    pub(crate) fn create(
        &self,
        mut session: Session,
        now: UnixNanos,
    ) -> Result<(SessionState, Durable), StoreError> {
        self.check_running()?;
        session.meta.validate()?;
        let (_gate, generation) = self.admit()?;
        let id = session.meta.session_id.clone();
        let shard = self.shard(&id)?;
        let mut map = shard.write().unwrap_or_else(PoisonError::into_inner);
        if map.contains_key(&id) {
            return Err(StoreError::Exists { id });
        }
        // INVARIANT (session-cap): the count only grows here, by a compare-and-swap that
        // refuses to pass `max`, so racing creates in different shards cannot overshoot.
        let max = self.max_sessions;
        if self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < max).then_some(c + 1)
            })
            .is_err()
        {
            return Err(StoreError::SessionCap { max });
        }
        let durable = match session.meta.shared_budget_key() {
            None => {
                let record = ops::open(&mut session, now);
                self.submit(SessionEvent::Opened(record), generation)
            }
            Some(key) => {
                let mut budgets = lock(&self.budgets);
                let slot = match budgets.entry(key) {
                    Entry::Occupied(e) => Arc::clone(e.get()),
                    Entry::Vacant(e) => {
                        Arc::clone(e.insert(Arc::new(Mutex::new(Budget::of(&session.state)))))
                    }
                };
                drop(budgets);
                let b = lock(&slot);
                // Join: the shared record's amounts win over the new session's own.
                b.load_into(&mut session.state);
                let record = ops::open(&mut session, now);
                self.submit(SessionEvent::Opened(record), generation)
            }
        };
        let state = session.state.clone();
        self.requiet(&id, None, session.quiet_since());
        map.insert(id, Arc::new(Mutex::new(session)));
        Ok((state, durable))
    }

    fn submit(&self, event: SessionEvent, generation: u64) -> Durable {
        match &self.journal {
            Some(j) => j.submit_at(event, generation),
            None => Durable::ready(),
        }
    }

    /// A copy of a session with its shared budget loaded.
    pub(crate) fn get(&self, id: &str) -> Result<Option<Session>, StoreError> {
        let _view = self.view()?;
        let slot = match self.slot(id) {
            Ok(s) => s,
            Err(StoreError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let s = lock(&slot).clone();
        if s.state.status == SessionStatus::Terminated {
            return Ok(None);
        }
        self.with_budget(s).map(Some)
    }

    fn with_budget(&self, mut s: Session) -> Result<Session, StoreError> {
        if let Some(k) = s.meta.shared_budget_key() {
            let b = self.budget_slot(&k)?;
            lock(&b).load_into(&mut s.state);
        }
        Ok(s)
    }

    /// Copies of every session that `keep` accepts, sorted by id.
    pub(crate) fn list(&self, keep: impl Fn(&Session) -> bool) -> Result<Vec<Session>, StoreError> {
        let _view = self.view()?;
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let slots: Vec<Arc<Slot>> = shard
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned()
                .collect();
            for slot in slots {
                let s = lock(&slot);
                if s.state.status != SessionStatus::Terminated && keep(&s) {
                    out.push(s.clone());
                }
            }
        }
        out.sort_by(|a, b| a.meta.session_id.cmp(&b.meta.session_id));
        out.into_iter().map(|s| self.with_budget(s)).collect()
    }

    /// The ids of the live sessions whose [`Session::quiet_since`] is at or before
    /// `cutoff`, oldest first (then by id). Reads only those entries of the quiet index,
    /// and copies no session.
    pub(crate) fn quiet(&self, cutoff: UnixNanos) -> Result<Vec<String>, StoreError> {
        let _view = self.view()?;
        let mut out = Vec::new();
        for q in self.quiet.iter() {
            let q = lock(q);
            out.extend(q.iter().take_while(|(t, _)| *t <= cutoff).cloned());
        }
        out.sort_unstable();
        Ok(out.into_iter().map(|(_, id)| id).collect())
    }

    /// A shared budget's amounts, or a per-session budget's from its session.
    pub(crate) fn budget(&self, key: &BudgetKey) -> Result<Option<Budget>, StoreError> {
        if let BudgetKey::Session(id) = key {
            return Ok(self.get(id)?.map(|s| Budget::of(&s.state)));
        }
        let _view = self.view()?;
        Ok(lock(&self.budgets).get(key).map(|slot| *lock(slot)))
    }

    /// Every session and shared budget, copied (for a snapshot or a comparison).
    pub(crate) fn dump(&self) -> (Vec<Session>, Vec<(BudgetKey, Budget)>) {
        let sessions = self.list(|_| true).unwrap_or_default();
        let budgets = lock(&self.budgets)
            .iter()
            .map(|(k, slot)| (k.clone(), *lock(slot)))
            .collect();
        (sessions, budgets)
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
        self.check_running()?;
        let (_gate, generation) = self.admit()?;
        let slot = self.slot(id)?;
        let mut session = lock(&slot);
        if session.state.status == SessionStatus::Terminated {
            // Ended by a change that held this lock before us; its slot is on its way out
            // of the map.
            return Err(StoreError::NotFound { id: id.to_owned() });
        }
        let bslot = session
            .meta
            .shared_budget_key()
            .map(|k| self.budget_slot(&k))
            .transpose()?;
        let mut budget = bslot.as_deref().map(lock);
        if let Some(b) = &budget {
            b.load_into(&mut session.state);
        }
        let seq = session.seq;
        let last_call = session.last_call_number;
        let quiet = session.quiet_since();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut session)));
        let change = match outcome {
            Ok(c) => c,
            Err(payload) => {
                self.stop(StoreError::Failed {
                    message: format!("a change to session `{id}` panicked"),
                });
                drop(budget);
                drop(session);
                std::panic::resume_unwind(payload);
            }
        };
        match change {
            Change::Keep(r) | Change::Touch(r) => {
                self.requiet(id, quiet, session.quiet_since());
                Ok((r, Durable::ready()))
            }
            Change::Commit(r, event) => {
                let durable = self.commit(
                    id,
                    &mut session,
                    budget.as_deref_mut(),
                    seq,
                    last_call,
                    event,
                    generation,
                );
                self.requiet(id, quiet, session.quiet_since());
                durable.map(|d| (r, d))
            }
            Change::End(r, event) => {
                if !matches!(event, SessionEvent::Closed(_))
                    || session.state.status != SessionStatus::Terminated
                {
                    let e = StoreError::Failed {
                        message: format!(
                            "session `{id}`: an end that is not a session-closed entry"
                        ),
                    };
                    self.stop(e.clone());
                    return Err(e);
                }
                let durable = self.commit(
                    id,
                    &mut session,
                    budget.as_deref_mut(),
                    seq,
                    last_call,
                    event,
                    generation,
                )?;
                self.requiet(id, quiet, None);
                drop(budget);
                drop(session);
                self.forget(id, &slot);
                Ok((r, durable))
            }
        }
    }

    /// Remove session `id`'s slot `slot` from the map (after a change ended it).
    fn forget(&self, id: &str, slot: &Arc<Slot>) {
        if let Ok(shard) = self.shard(id) {
            let mut map = shard.write().unwrap_or_else(PoisonError::into_inner);
            if map.get(id).is_some_and(|s| Arc::ptr_eq(s, slot)) {
                map.remove(id);
                self.count.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Check that a commit's `event` follows the session's state (at version `seq`, last
    /// call `last_call` before the closure), store the shared budget back, and submit it.
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        id: &str,
        session: &mut Session,
        budget: Option<&mut Budget>,
        seq: u64,
        last_call: u64,
        event: SessionEvent,
        generation: u64,
    ) -> Result<Durable, StoreError> {
        // INVARIANT (seq-follows-entries), checked: the closure made exactly one
        // change, through `ops`, to this session.
        if event.session_seq() != seq.saturating_add(1)
            || session.seq != event.session_seq()
            || event.session_id() != id
            || session.meta.session_id != id
            || session.last_call_number < last_call
        {
            let e = StoreError::Failed {
                message: format!(
                    "session `{id}`: a commit did not follow its state (version {seq} to {}, entry {})",
                    session.seq,
                    event.session_seq()
                ),
            };
            self.stop(e.clone());
            return Err(e);
        }
        if let Some(b) = budget {
            *b = Budget::of(&session.state);
        }
        Ok(self.submit(event, generation))
    }
}
