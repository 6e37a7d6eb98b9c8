//! The CAS protocol under random interleavings: two or three simulated daemons, each
//! with its own cache (sessions, and the shared budget from its own last write), run the
//! crate's own planning code ([`tollgate_redis::cas`]) against the in-memory fake of the
//! script, with every operation that touches a session or the shared budget in any
//! order: openings (the first starts the budget, later ones join it) racing everything
//! else, decisions, post-exec reports (refunds and overruns: `settlement = "actual"`),
//! held calls decided by a human, released or expired, agents closing their sessions
//! (`Change::End`) through any daemon, journal commits and the confirmer's commands
//! (`cas::confirm_commands`, in its order), writes whose answer is lost (a dropped
//! connection mid-call), Redis restarts (durable: every daemon's connection drops, and
//! the pipeline each had in flight ran with its answer lost, did not run, or was cut after
//! its first command; caches stay as they were, possibly stale), daemon crashes (the
//! session then resumes on another daemon, or on the restarted one with a cold cache),
//! clock ticks, long waits that let Redis expire ended sessions (`session_ttl`), settling
//! and sweeping.
//!
//! Invariants: the shared budget is never overspent, at every step; it equals the
//! budget minus what the committed entries took; no nonce is ALLOWed twice in the
//! committed history; every session's state equals the fold of its committed entries
//! (voids keep their version), and a session Redis expired is one the log ended; every
//! budget version an entry names is named once, and each entry's `budget_before` is the
//! amount the version before left; no daemon plans a change on an ended session, and no
//! place after a committed close is taken (by an entry or a void); once everything is
//! confirmed or settled no hold is left on the budget, and what it has left can all be
//! spent by a fresh session (no reservation leaked).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use proptest::prelude::*;
use tollgate_audit::{CloseReason, SessionEvent};
use tollgate_core::{HitlMode, HumanDecision, Money, SessionStatus, Settlement};
use tollgate_redis::cas::{
    after_done, after_join, budget_from_fields, check_markers, confirm_commands, dips_into_holds,
    hold_field, holds_from_fields, plan_commit, plan_open, plan_revert, settle_needs_budget,
    settling_parts, settling_value, view_from_fields, void_budget, Bounds, CasReply, CasRequest,
    ConfirmCommand, Holds, MarkerAction, Planned, View, MARKER_FIELD,
};
use tollgate_redis::cas::{orphan_only_fields, RECORD_FIELD};
use tollgate_redis::keys::Keys;
use tollgate_redis::script::{Fake, SettleRequest};
use tollgate_store::{ops, Budget, Change, Session, Settled};

use crate::support::{org_session, pre_exec_closure, Book, Claim};

const GRACE: i64 = 100;
/// How long Redis keeps an ended session's hash (`session_ttl`, ms), longer than grace.
const TTL: u64 = 1_000;
const BUDGET: i64 = 60;
const SESSIONS: usize = 3;
const BOUNDS: Bounds = Bounds {
    max_blob_bytes: 1 << 20,
};

#[derive(Debug, Clone)]
enum Op {
    /// Plan the opening of a session (nothing is read: the script reads the budget).
    OpenStart {
        d: usize,
        s: usize,
    },
    /// Send a planned opening.
    OpenSend {
        d: usize,
    },
    Decide {
        d: usize,
        s: usize,
        nonce: u64,
        cost: i64,
    },
    /// The post-exec report of the session's oldest reservation, at `actual`.
    Report {
        d: usize,
        s: usize,
        actual: i64,
    },
    /// A human decides the session's held call (approve or reject).
    Human {
        d: usize,
        s: usize,
        approve: bool,
    },
    /// The agent resends its held call (released if approved).
    Release {
        d: usize,
        s: usize,
    },
    /// The held call expires undecided.
    Expire {
        d: usize,
        s: usize,
    },
    /// The daemon's next write reaches Redis but its answer is lost.
    LoseReply {
        d: usize,
    },
    /// Daemon `d`'s next pipeline is held up on the network between its staged record and
    /// its script, for longer than grace, and a sweep runs meanwhile (which deletes a
    /// staged record it takes for an orphan: an opening's, its hash having nothing else).
    Stall {
        d: usize,
    },
    /// The agent closes its session through daemon `d` (`CloseSession`: a
    /// `Change::End`, TERMINATED for good, the hash expiring after `TTL`).
    Close {
        d: usize,
        s: usize,
    },
    /// A long time passes (the TTL of ended sessions): Redis expires their hashes.
    Later,
    /// Redis restarts (durable: it loses no acknowledged write): every daemon's connection
    /// drops, and the pipeline each had in flight (`fates[d]`, see [`Fate`]) was run with
    /// its answer lost, not run, or cut after its first command. Caches stay as they were.
    Restart {
        fates: [u8; 3],
    },
    Commit {
        d: usize,
    },
    Crash {
        d: usize,
    },
    Tick,
    Sweep {
        d: usize,
    },
}

impl Op {
    fn on(&self, daemons: usize) -> Op {
        let mut o = self.clone();
        match &mut o {
            Op::OpenStart { d, .. }
            | Op::OpenSend { d }
            | Op::Decide { d, .. }
            | Op::Report { d, .. }
            | Op::Human { d, .. }
            | Op::Release { d, .. }
            | Op::Expire { d, .. }
            | Op::LoseReply { d }
            | Op::Stall { d }
            | Op::Close { d, .. }
            | Op::Commit { d }
            | Op::Crash { d }
            | Op::Sweep { d } => *d %= daemons,
            Op::Tick | Op::Later | Op::Restart { .. } => {}
        }
        o
    }
}

fn op(daemons: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..daemons, 0..SESSIONS).prop_map(|(d, s)| Op::OpenStart { d, s }),
        2 => (0..daemons).prop_map(|d| Op::OpenSend { d }),
        5 => (0..daemons, 0..SESSIONS, 1..10u64, 1..15i64)
            .prop_map(|(d, s, nonce, cost)| Op::Decide { d, s, nonce, cost }),
        2 => (0..daemons, 0..SESSIONS, 0..20i64)
            .prop_map(|(d, s, actual)| Op::Report { d, s, actual }),
        1 => (0..daemons, 0..SESSIONS, any::<bool>())
            .prop_map(|(d, s, approve)| Op::Human { d, s, approve }),
        1 => (0..daemons, 0..SESSIONS).prop_map(|(d, s)| Op::Release { d, s }),
        1 => (0..daemons, 0..SESSIONS).prop_map(|(d, s)| Op::Expire { d, s }),
        1 => (0..daemons).prop_map(|d| Op::LoseReply { d }),
        1 => (0..daemons).prop_map(|d| Op::Stall { d }),
        4 => (0..daemons).prop_map(|d| Op::Commit { d }),
        1 => (0..daemons).prop_map(|d| Op::Crash { d }),
        2 => Just(Op::Tick),
        1 => (0..daemons).prop_map(|d| Op::Sweep { d }),
        1 => (0..daemons, 0..SESSIONS).prop_map(|(d, s)| Op::Close { d, s }),
        1 => Just(Op::Later),
        1 => proptest::array::uniform3(0..4u8).prop_map(|fates| Op::Restart { fates }),
    ]
}

/// What happens to a daemon's next pipeline to Redis (a CAS write, a settlement's hold,
/// the confirmer's deletes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Fate {
    /// Run and answered.
    #[default]
    Sent,
    /// Run; the answer is lost (the daemon sees an error).
    Lost,
    /// Not run: the connection dropped before it reached Redis.
    Dropped,
    /// Only its first command ran (the rest was cut off with the connection).
    Cut,
    /// Run and answered, but held up after its first command while a sweep ran.
    Held,
}

impl Fate {
    fn of(n: u8) -> Fate {
        [Fate::Sent, Fate::Lost, Fate::Dropped, Fate::Cut][usize::from(n % 4)]
    }

    /// How many of a pipeline's `n` commands ran.
    fn ran(self, n: usize) -> usize {
        match self {
            Fate::Sent | Fate::Lost | Fate::Held => n,
            Fate::Dropped => 0,
            Fate::Cut => n.min(1),
        }
    }
}

#[derive(Debug)]
struct Daemon {
    id: String,
    cache: HashMap<String, View>,
    /// The shared budget as this daemon last wrote it (the store's budget cache).
    budget: Option<(u64, Budget, Holds)>,
    /// Entries on their way to the journal, each with whether its change put a hold.
    in_flight: VecDeque<(SessionEvent, bool, String)>,
    confirmed: HashMap<String, u64>,
    /// A planned opening: (session index, plan, the session before it).
    opening: Option<(usize, Planned, SessionEvent, Session)>,
    /// What happens to its next pipeline.
    fate: Fate,
}

impl Daemon {
    fn new(n: u32) -> Daemon {
        Daemon {
            id: format!("d{n}"),
            cache: HashMap::new(),
            budget: None,
            in_flight: VecDeque::new(),
            confirmed: HashMap::new(),
            opening: None,
            fate: Fate::Sent,
        }
    }

    fn confirmed_upto(&self, id: &str) -> u64 {
        self.confirmed.get(id).copied().unwrap_or(0)
    }

    fn in_flight(&self, id: &str, seq: u64) -> bool {
        self.in_flight
            .iter()
            .any(|(e, _, _)| e.session_id() == id && e.session_seq() == seq)
    }

    /// The store's cache rule: keep the newer of the two (version, amounts) pairs.
    fn remember(&mut self, v: &View, wrote: bool) {
        if let Some(b) = v.budget {
            if wrote || self.budget.as_ref().is_none_or(|c| c.0 < b.0) {
                self.budget = Some((b.0, b.1, v.holds.clone()));
            }
        }
    }
}

/// A session of the model: the organization's budget, humans asked on a budget overrun,
/// refunds (actual costs), no repeat rule.
fn model_session(id: &str) -> Session {
    let mut s = org_session(id, "org-m", BUDGET);
    let mut config = s.policy.config.clone();
    config.hitl_mode = HitlMode::OnDeny;
    config.settlement = Settlement::Actual;
    config.max_repeat_calls = 0;
    s.policy = std::sync::Arc::new(tollgate_store::Policy::new(config));
    s
}

const NOW: i64 = 2_000;

/// What names a budget version in the log.
#[derive(Debug, Clone, Copy)]
enum Named {
    /// A change's write (an entry, or a voided change's write): remaining before, after.
    Write(i64, i64),
    /// A void's give-back: the amount given back.
    GiveBack(i64),
}

struct World {
    db: Fake,
    daemons: Vec<Daemon>,
    book: Book,
    now: i64,
    started: u32,
    keys: Keys,
    /// When Redis expires a key (an ended session's hash), as its last PEXPIRE set it.
    expires: HashMap<String, i64>,
    /// Sessions whose hash expired: their ids are never opened again (a daemon's session
    /// ids are random, never reused).
    vanished: HashSet<String>,
    /// Pipelines of each session's writes cut after their staged record.
    cuts: HashMap<String, usize>,
}

const GROUP: &str = "o:org-m";

fn sid(s: usize) -> String {
    format!("m{s}")
}

impl World {
    fn new(daemons: usize) -> World {
        World {
            db: Fake::default(),
            daemons: (0..daemons as u32).map(Daemon::new).collect(),
            book: Book::default(),
            now: 0,
            started: daemons as u32,
            keys: Keys::new("m").unwrap(),
            expires: HashMap::new(),
            vanished: HashSet::new(),
            cuts: HashMap::new(),
        }
    }

    fn skey(&self, id: &str) -> String {
        self.keys.session(GROUP, id)
    }

    fn bkey(&self) -> String {
        self.keys.budget(GROUP)
    }

    /// The session as stored, if it exists.
    fn read(&self, id: &str) -> Option<View> {
        view_from_fields(
            &self.db.hgetall(&self.skey(id)),
            &self.db.hgetall(&self.bkey()),
            BOUNDS,
            0,
        )
        .unwrap()
    }

    /// Daemon `d` reads session `id` afresh (forgets it if it is gone).
    fn refresh(&mut self, d: usize, id: &str) {
        match self.read(id) {
            Some(v) => self.daemons[d].cache.insert(id.to_owned(), v),
            None => self.daemons[d].cache.remove(id),
        };
    }

    fn budget(&self) -> Option<Budget> {
        budget_from_fields(&self.db.hgetall(&self.bkey()))
            .unwrap()
            .map(|b| b.1)
    }

    /// The script, and the expiry it sets (PEXPIRE) or takes off (PERSIST) on a write.
    /// The script alone, after its record was staged (`Fake::stage`).
    fn script(&mut self, req: &CasRequest) -> CasReply {
        let reply = self.db.script(req);
        if !matches!(reply, CasReply::Conflict { .. }) {
            if req.ttl_ms > 0 {
                let at = self.now + i64::try_from(req.ttl_ms).unwrap();
                self.expires.insert(req.session_key.clone(), at);
            } else {
                self.expires.remove(&req.session_key);
            }
        }
        reply
    }

    /// The sweeper on a session it cannot read: an opening cut after its staged record
    /// (or held up there) leaves a hash of staged records only, which it deletes.
    fn sweep_orphans(&mut self, id: &str) {
        let key = self.skey(id);
        if self.read(id).is_none() {
            if let Some(fields) = orphan_only_fields(&self.db.hgetall(&key)) {
                for f in fields {
                    self.db.hdel(&key, &f);
                }
            }
        }
    }

    /// Redis expires what is due.
    fn expire(&mut self) {
        let now = self.now;
        let due: Vec<String> = self
            .expires
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            self.expires.remove(&k);
            if let Some(h) = self.db.hashes.remove(&k) {
                let b = tollgate_redis::cas::current_record(&h)
                    .expect("a session hash without a record");
                let s = tollgate_redis::cas::decode_stored(b, BOUNDS.max_blob_bytes, 0).unwrap();
                assert_eq!(
                    s.state.status,
                    SessionStatus::Terminated,
                    "a live session expired"
                );
                self.vanished.insert(s.meta.session_id);
            }
        }
    }

    /// Send a write for daemon `d`: its answer, or `None` if the answer was lost (the
    /// write may or may not have happened; the daemon forgets its copy of the session, as
    /// the store does).
    fn send(&mut self, d: usize, id: &str, planned: &Planned) -> Option<CasReply> {
        let fate = std::mem::take(&mut self.daemons[d].fate);
        // The write's pipeline: the staged record, then the script. Cut after the first,
        // the record is left behind, an orphan the next write deletes.
        let ran = fate.ran(2);
        if ran >= 1 {
            self.db.stage(&planned.request);
        }
        if ran == 1 {
            *self.cuts.entry(id.to_owned()).or_default() += 1;
        }
        if fate == Fate::Held {
            self.sweep_orphans(id);
        }
        let reply = (ran == 2).then(|| self.script(&planned.request));
        if !matches!(fate, Fate::Sent | Fate::Held) || reply == Some(CasReply::Unstaged) {
            // No answer, or a failed write (its staged record swept: nothing written):
            // the store forgets its copy and reads afresh.
            self.daemons[d].cache.remove(id);
            return None;
        }
        reply
    }

    fn settle(&mut self, d: usize, id: &str, view: &View, seqs: &[u64]) {
        let me = self.daemons[d].id.clone();
        // Hold the budget for a give-back (the store's settlement; atomic here).
        let mut release = None;
        if let (true, Some((bv, _))) = (settle_needs_budget(view, seqs), view.budget) {
            let value = settling_value(&me, self.now, id);
            let req = SettleRequest {
                session_key: self.skey(id),
                budget_key: self.bkey(),
                expect_sv: view.sv,
                expect_bv: bv,
                expect: view.settling.clone(),
                set: Some(value.clone()),
            };
            let fate = std::mem::take(&mut self.daemons[d].fate);
            let done = (fate.ran(1) == 1).then(|| self.db.settle(&req).is_ok());
            if fate != Fate::Sent {
                // No answer: the store gives up and reads afresh next time (a hold it may
                // have put is its own: taken over when it settles again, or by another
                // daemon after grace).
                self.daemons[d].cache.remove(id);
                return;
            }
            if done != Some(true) {
                self.refresh(d, id);
                return;
            }
            release = Some(value);
        }
        let outcomes: Vec<(u64, Settled)> = seqs
            .iter()
            .map(|q| (*q, self.book.settle(id, *q, void_budget(view, *q))))
            .collect();
        let planned = plan_revert(
            view,
            &self.skey(id),
            Some(&self.bkey()),
            &outcomes,
            &me,
            BOUNDS,
            TTL,
            release,
        )
        .unwrap();
        match self.send(d, id, &planned) {
            Some(CasReply::Done { sv, bv }) => {
                let wrote = planned.request.budget_blob.is_some();
                let next = after_done(view.clone(), planned, sv, bv);
                self.daemons[d].remember(&next, wrote);
                self.daemons[d].cache.insert(id.to_owned(), next);
            }
            Some(CasReply::Conflict { .. }) => self.refresh(d, id),
            Some(CasReply::Joined { .. }) => panic!("a join answer to a settlement"),
            Some(CasReply::Unstaged) => unreachable!("`send` answers Unstaged as None"),
            None => {}
        }
    }

    /// The store's `clear_settling`: take off settlement `cur` (of session `sid`, budget
    /// version `bv`) if that session has no unconfirmed change left.
    fn clear_settling(&mut self, d: usize, sid: &str, bv: u64, cur: &str) {
        let f = self.db.hgetall(&self.skey(sid));
        if f.keys().any(|k| k.starts_with(MARKER_FIELD)) {
            return;
        }
        let sv = f
            .get("v")
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        let req = SettleRequest {
            session_key: self.skey(sid),
            budget_key: self.bkey(),
            expect_sv: sv,
            expect_bv: bv,
            expect: Some(cur.to_owned()),
            set: None,
        };
        let fate = std::mem::take(&mut self.daemons[d].fate);
        if fate.ran(1) == 1 {
            let _ = self.db.settle(&req);
        }
    }

    /// What the store's `apply` does for one attempt of closure `f` on daemon `d`.
    fn change(&mut self, d: usize, id: &str, f: &mut dyn FnMut(&mut Session) -> Change<()>) {
        let mut view = match self.daemons[d].cache.get(id) {
            Some(v) => v.clone(),
            None => match self.read(id) {
                Some(v) => v,
                None => return,
            },
        };
        // A fresher copy of the shared budget from this daemon's own last write.
        if let (Some((cbv, cb, ch)), Some((bv, _))) = (&self.daemons[d].budget, view.budget) {
            if *cbv > bv {
                view.budget = Some((*cbv, *cb));
                view.holds = ch.clone();
                cb.load_into(&mut view.session.state);
            }
        }
        let dm = &self.daemons[d];
        let action = check_markers(
            &view,
            &dm.id,
            dm.confirmed_upto(id),
            &|q| dm.in_flight(id, q),
            self.now,
            GRACE,
            false,
        );
        match action {
            MarkerAction::WaitOwn => {}
            MarkerAction::Wait => {
                self.refresh(d, id);
            }
            MarkerAction::Settle(seqs) => self.settle(d, id, &view, &seqs),
            MarkerAction::Proceed => {
                if view.session.state.status == tollgate_core::SessionStatus::Terminated {
                    // A voided opening: the session never existed; nothing is decided on
                    // it (the store answers NotFound, as RedisStore::apply does).
                    return;
                }
                let mut session: Session = view.session.clone();
                let (Change::Commit((), mut event) | Change::End((), mut event)) = f(&mut session)
                else {
                    return;
                };
                let moves = Budget::of(&session.state) != Budget::of(&view.session.state);
                if let (true, Some(cur), Some((bv, _))) =
                    (moves, view.settling.clone(), view.budget)
                {
                    // A settlement holds the budget; one left by a daemon that died after
                    // its change was confirmed is taken off after grace (as the store's
                    // `clear_settling`).
                    if let Some((_, at, sid)) = settling_parts(&cur) {
                        if self.now - at >= GRACE {
                            self.clear_settling(d, sid, bv, &cur);
                        }
                    }
                }
                if dips_into_holds(&view, &session) || (moves && view.settling.is_some()) {
                    // Held money: the store waits and decides again on a fresh copy.
                    self.refresh(d, id);
                    return;
                }
                // Invariant: no daemon writes a decision on an ended session (its write is
                // expected at the version it read: that version's record is not ended).
                if let Some(stored) = self.read(id) {
                    if stored.sv == view.sv {
                        assert_ne!(
                            stored.session.state.status,
                            SessionStatus::Terminated,
                            "{id}: a change planned on an ended session"
                        );
                    }
                }
                let dm = &self.daemons[d];
                let planned = plan_commit(
                    &view,
                    &self.skey(id),
                    Some(&self.bkey()),
                    session,
                    &mut event,
                    &dm.id,
                    self.now,
                    dm.confirmed_upto(id),
                )
                .unwrap();
                match self.send(d, id, &planned) {
                    Some(CasReply::Done { sv, bv }) => {
                        // Written: the entry goes to the journal (committed later).
                        let wrote = planned.request.budget_blob.is_some();
                        let held = planned.request.hold.is_some();
                        let prev = planned
                            .marker
                            .as_ref()
                            .map(|m| m.prev_field.clone())
                            .unwrap_or_default();
                        let next = after_done(view, planned, sv, bv);
                        self.daemons[d].in_flight.push_back((event, held, prev));
                        self.daemons[d].remember(&next, wrote);
                        self.daemons[d].cache.insert(id.to_owned(), next);
                    }
                    Some(CasReply::Conflict { session, budget }) => {
                        // The current hashes; none if the session expired (NotFound).
                        match view_from_fields(&session, &budget, BOUNDS, 0).unwrap() {
                            Some(v) => self.daemons[d].cache.insert(id.to_owned(), v),
                            None => self.daemons[d].cache.remove(id),
                        };
                    }
                    Some(CasReply::Joined { .. }) => panic!("a join answer to a change"),
                    Some(CasReply::Unstaged) => unreachable!("`send` answers Unstaged as None"),
                    None => {}
                }
            }
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::OpenStart { d, s } => {
                if self.daemons[d].opening.is_none() && !self.vanished.contains(&sid(s)) {
                    let session = model_session(&sid(s));
                    let me = self.daemons[d].id.clone();
                    let (planned, record) = plan_open(
                        &session,
                        &self.skey(&sid(s)),
                        Some(&self.bkey()),
                        &me,
                        self.now,
                        1_000,
                    );
                    self.daemons[d].opening = Some((s, planned, record, session));
                }
            }
            Op::OpenSend { d } => {
                if let Some((s, planned, record, session)) = self.daemons[d].opening.take() {
                    let id = sid(s);
                    if self.vanished.contains(&id) {
                        return;
                    }
                    match self.send(d, &id, &planned) {
                        Some(CasReply::Joined {
                            sv,
                            created,
                            budget,
                        }) => {
                            let (view, event) =
                                after_join(planned, &session, 1_000, sv, created, &budget).unwrap();
                            self.daemons[d]
                                .in_flight
                                .push_back((event, false, String::new()));
                            self.daemons[d].remember(&view, false);
                            self.daemons[d].cache.insert(id, view);
                        }
                        Some(CasReply::Done { .. }) => {
                            // A session with its own budget (not in this model).
                            let _ = record;
                            panic!("an opening of a shared budget is a join")
                        }
                        // The session exists (opened by another daemon): refused.
                        Some(CasReply::Conflict { .. }) | None => {}
                        Some(CasReply::Unstaged) => {
                            unreachable!("`send` answers Unstaged as None")
                        }
                    }
                }
            }
            Op::Decide { d, s, nonce, cost } => {
                let mut f = pre_exec_closure(nonce, cost);
                self.change(d, &sid(s), &mut |x| match f(x) {
                    Change::Commit(_, e) => Change::Commit((), e),
                    _ => Change::Keep(()),
                });
            }
            Op::Report { d, s, actual } => {
                self.change(d, &sid(s), &mut |x| {
                    let Some((&call, _)) = x.state.reservations.iter().next() else {
                        return Change::Keep(());
                    };
                    let usd = actual as f64 / 1e9;
                    Change::Commit((), ops::settle(x, call, usd, true, false, NOW).into())
                });
            }
            Op::Human { d, s, approve } => {
                let decision = if approve {
                    HumanDecision::Approve
                } else {
                    HumanDecision::Reject
                };
                self.change(d, &sid(s), &mut |x| match ops::human_decision(
                    x,
                    None,
                    decision.clone(),
                    None,
                    "op",
                    "",
                    NOW,
                ) {
                    Ok(r) => Change::Commit((), r.into()),
                    Err(_) => Change::Keep(()),
                });
            }
            Op::Release { d, s } => {
                let id = sid(s);
                let held = self
                    .read(&id)
                    .and_then(|v| v.session.state.pending.clone())
                    .and_then(|p| Some((p.original_nonce?, p.estimated_cost)));
                if let Some((nonce, cost)) = held {
                    let mut f = pre_exec_closure(nonce, cost.0);
                    self.change(d, &id, &mut |x| match f(x) {
                        Change::Commit(_, e) => Change::Commit((), e),
                        _ => Change::Keep(()),
                    });
                }
            }
            Op::Expire { d, s } => {
                self.change(d, &sid(s), &mut |x| match ops::expire(x, None, NOW) {
                    Ok(r) => Change::Commit((), r.into()),
                    Err(_) => Change::Keep(()),
                });
            }
            Op::LoseReply { d } => self.daemons[d].fate = Fate::Lost,
            Op::Stall { d } => self.daemons[d].fate = Fate::Held,
            Op::Commit { d } => {
                if let Some((event, held, prev)) = self.daemons[d].in_flight.pop_front() {
                    let id = event.session_id().to_owned();
                    let seq = event.session_seq();
                    let ends = matches!(event, SessionEvent::Closed(_));
                    if self.book.commit(&event) {
                        let c = self.daemons[d].confirmed.entry(id.clone()).or_insert(0);
                        *c = (*c).max(seq);
                        // The confirmer drops the marker (and the hold of a refund; an end
                        // gets its expiry), with the store's commands in its order: a
                        // restart may cut them.
                        let (key, bkey, hold) = (self.skey(&id), self.bkey(), hold_field(&id, seq));
                        let hold = held.then_some((bkey.as_str(), hold.as_str()));
                        let commands =
                            confirm_commands(&key, seq, hold, ends.then_some(TTL), &prev);
                        let fate = std::mem::take(&mut self.daemons[d].fate);
                        for c in commands.iter().take(fate.ran(commands.len())) {
                            match c {
                                ConfirmCommand::Hdel { key, fields } => {
                                    for f in fields {
                                        self.db.hdel(key, f);
                                    }
                                }
                                ConfirmCommand::Pexpire { key, ms } => {
                                    if self.db.hashes.contains_key(key) {
                                        let at = self.now + i64::try_from(*ms).unwrap();
                                        self.expires.insert(key.clone(), at);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            Op::Close { d, s } => {
                self.change(d, &sid(s), &mut |x| {
                    Change::End((), ops::close(x, CloseReason::Agent, NOW).into())
                });
            }
            Op::Later => self.now += i64::try_from(TTL).unwrap(),
            Op::Restart { fates } => {
                for (dm, f) in self.daemons.iter_mut().zip(fates) {
                    dm.fate = Fate::of(f);
                }
            }
            Op::Crash { d } => {
                self.daemons[d] = Daemon::new(self.started);
                self.started += 1;
            }
            Op::Tick => self.now += 40,
            Op::Sweep { d } => {
                for s in 0..SESSIONS {
                    let id = sid(s);
                    let Some(view) = self.read(&id) else {
                        self.sweep_orphans(&id);
                        continue;
                    };
                    let me = self.daemons[d].id.clone();
                    let confirmed = self.daemons[d].confirmed_upto(&id);
                    if let MarkerAction::Settle(seqs) =
                        check_markers(&view, &me, confirmed, &|_| false, self.now, GRACE, true)
                    {
                        self.settle(d, &id, &view, &seqs);
                    }
                }
            }
        }
        self.expire();
        if let Some(b) = self.budget() {
            assert!(b.remaining.0 >= 0, "budget overspent: {b:?}");
        }
    }

    /// Commit what every live daemon has in flight, then let a fresh daemon sweep after
    /// grace until no marker is left.
    fn finish(&mut self) {
        for d in 0..self.daemons.len() {
            self.daemons[d].opening = None;
            while !self.daemons[d].in_flight.is_empty() {
                self.step(&Op::Commit { d });
            }
        }
        self.now += 10 * GRACE;
        self.daemons.push(Daemon::new(self.started));
        let sweeper = self.daemons.len() - 1;
        for _ in 0..4 {
            self.step(&Op::Sweep { d: sweeper });
        }
        for s in 0..SESSIONS {
            if let Some(v) = self.read(&sid(s)) {
                assert!(v.markers.is_empty(), "markers left");
            }
            // No opening's staged record outlives the sweeps.
            let h = self.db.hgetall(&self.skey(&sid(s)));
            assert!(orphan_only_fields(&h).is_none(), "orphans left: {h:?}");
        }
        // Every change is confirmed or settled: no refund is held any more (a hold left
        // would keep its amount from being spent, for good).
        let holds = holds_from_fields(&self.db.hgetall(&self.bkey())).unwrap();
        assert!(holds.is_empty(), "holds left on the budget: {holds:?}");
    }

    /// Once everything is settled, what the budget has left can all be spent: a fresh
    /// daemon opens a session and is ALLOWed a call of exactly the remaining amount (after
    /// grace, so that a settlement a dead daemon left on the budget is taken off).
    fn drain(&mut self) {
        if self.budget().is_none() {
            return;
        }
        self.daemons.push(Daemon::new(self.started));
        self.started += 1;
        let (d, s) = (self.daemons.len() - 1, SESSIONS);
        for o in [Op::OpenStart { d, s }, Op::OpenSend { d }, Op::Commit { d }] {
            self.step(&o);
        }
        for nonce in 1..=2 {
            let left = self.budget().unwrap().remaining.0;
            if left == 0 {
                break;
            }
            self.step(&Op::Decide {
                d,
                s,
                nonce,
                cost: left,
            });
            self.step(&Op::Commit { d });
        }
        assert_eq!(
            self.budget().unwrap().remaining,
            Money::ZERO,
            "what the budget has left cannot all be spent: {:?}",
            self.db.hgetall(&self.bkey()).keys().collect::<Vec<_>>()
        );
    }

    fn check(&self) {
        // Records are never copied and never pile up: a session hash holds its current
        // record, the record before each unconfirmed change, and at most one orphan per
        // pipeline cut after its staged record (deleted by a later write or the sweeper).
        for s in 0..SESSIONS {
            let id = sid(s);
            let h = self.db.hgetall(&self.skey(&id));
            let records = h.keys().filter(|k| k.starts_with(RECORD_FIELD)).count();
            let markers = h.keys().filter(|k| k.starts_with("u:")).count();
            let cuts = self.cuts.get(&id).copied().unwrap_or(0);
            assert!(
                records <= 1 + markers + cuts,
                "{id}: {records} records for {markers} markers and {cuts} cut pipelines"
            );
        }
        // No nonce allowed twice in the committed history of a session.
        let allows = self.book.allows();
        let mut seen = HashSet::new();
        for (s, nonce, _) in &allows {
            assert!(
                seen.insert((s.clone(), *nonce)),
                "{s}: nonce {nonce} allowed twice"
            );
        }
        let entries = self.book.entries.lock().unwrap().clone();
        let claims = self.book.claims.lock().unwrap().clone();
        // The budget is what the committed entries took from it, and never below 0.
        let Some(b) = self.budget() else {
            assert!(entries.is_empty(), "entries without a budget");
            return;
        };
        let mut taken = 0;
        // Budget versions the entries and voids name: each once (docs/audit-format.md,
        // "Folding a shared budget"): a write's (before, after), or a give-back's amount.
        let mut versions: BTreeMap<u64, Named> = BTreeMap::new();
        for e in &entries {
            let (before, after) = match e {
                SessionEvent::Verdict(v) => (v.budget_before.0, v.budget_after.0),
                SessionEvent::Settled(st) => (st.budget_before.0, st.budget_after.0),
                SessionEvent::Opened(o) => (o.budget_before.0, o.budget_before.0),
                SessionEvent::HumanDecision(_) | SessionEvent::Closed(_) => continue,
            };
            taken += before - after;
            if e.budget_version() != 0 {
                assert!(
                    versions
                        .insert(e.budget_version(), Named::Write(before, after))
                        .is_none(),
                    "budget version {} named twice",
                    e.budget_version()
                );
            } else {
                assert_eq!(
                    before, after,
                    "an entry moved the budget without a version: {e:?}"
                );
            }
        }
        assert!(b.remaining.0 >= 0);
        assert_eq!(
            b.remaining,
            Money(BUDGET - taken),
            "Redis against the entries"
        );
        for ((id, seq), vb) in self.book.voids.lock().unwrap().iter() {
            if claims.get(&(id.clone(), *seq)) != Some(&Claim::Void) || vb.budget_version == 0 {
                continue;
            }
            let (before, after) = (vb.budget_before.0, vb.budget_after.0);
            assert!(
                versions
                    .insert(vb.budget_version, Named::Write(before, after))
                    .is_none(),
                "budget version {} named twice (a void)",
                vb.budget_version
            );
            if vb.revert_version != 0 {
                assert!(
                    versions
                        .insert(vb.revert_version, Named::GiveBack(before - after))
                        .is_none(),
                    "budget version {} named twice (a give-back)",
                    vb.revert_version
                );
            }
        }
        // Walk the versions: 1 to the last, each named, each write computed from the one
        // before; the result is what Redis holds.
        let top = budget_from_fields(&self.db.hgetall(&self.bkey()))
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(
            versions.keys().copied().collect::<Vec<_>>(),
            (1..=top).collect::<Vec<_>>(),
            "budget versions named by the entries and voids: {versions:?}"
        );
        let mut r = BUDGET;
        for (v, n) in &versions {
            match *n {
                Named::Write(before, after) => {
                    assert_eq!(
                        before, r,
                        "version {v} was not computed from the one before"
                    );
                    r = after;
                }
                Named::GiveBack(amount) => r += amount,
            }
        }
        assert_eq!(Money(r), b.remaining, "the fold of the log against Redis");
        // A session closed (its session-closed entry committed) is never decided on again,
        // by any daemon: no place after its close is taken, by an entry or a void.
        for e in &entries {
            if let SessionEvent::Closed(c) = e {
                let later: Vec<_> = claims
                    .iter()
                    .filter(|((id, seq), _)| *id == c.session_id && *seq > c.session_seq)
                    .collect();
                assert!(
                    later.is_empty(),
                    "{}: changed after its close (version {}): {later:?}",
                    c.session_id,
                    c.session_seq
                );
            }
        }
        // Each session is the fold of its committed entries; voids keep their version.
        for s in 0..=SESSIONS {
            let id = sid(s);
            let Some(stored) = self.read(&id) else {
                if self.vanished.contains(&id) {
                    // Expired after its end: its opening was voided (it never existed), or
                    // its last place holds its committed close.
                    let last = claims.keys().filter(|(i, _)| *i == id).map(|k| k.1).max();
                    let opened_void = claims.get(&(id.clone(), 1)) == Some(&Claim::Void);
                    let closed_last = entries.iter().any(|e| {
                        matches!(e, SessionEvent::Closed(c)
                            if c.session_id == id && Some(c.session_seq) == last)
                    });
                    assert!(
                        opened_void || closed_last,
                        "{id}: expired from Redis, but its log does not end it: {:?}",
                        entries
                            .iter()
                            .filter(|e| e.session_id() == id)
                            .map(|e| (e.session_seq(), e.kind_name()))
                            .collect::<Vec<_>>()
                    );
                } else {
                    assert!(entries.iter().all(|e| e.session_id() != id));
                }
                continue;
            };
            let mut mine: HashMap<u64, SessionEvent> = entries
                .iter()
                .filter(|e| e.session_id() == id)
                .map(|e| (e.session_seq(), e.clone()))
                .collect();
            if claims.get(&(id.clone(), 1)) == Some(&Claim::Void) {
                // A voided opening: the session never existed, and stays ended.
                assert_eq!(
                    stored.session.state.status,
                    tollgate_core::SessionStatus::Terminated
                );
                continue;
            }
            let Some(SessionEvent::Opened(opened)) = mine.remove(&1) else {
                panic!("{id}: no opening")
            };
            let mut folded = ops::session_from_record(&opened).unwrap();
            folded.state.budget_remaining = opened.budget_before;
            let regenerated = ops::open(&mut folded, opened.timestamp_ns);
            ops::check_opened(&regenerated, &opened).unwrap();
            for seq in 2..=stored.session.seq {
                match claims.get(&(id.clone(), seq)) {
                    Some(Claim::Void) => folded.seq = seq,
                    Some(Claim::Entry) => {
                        let e = mine.remove(&seq).unwrap();
                        folded.state.budget_remaining = match &e {
                            SessionEvent::Verdict(v) => v.budget_before,
                            SessionEvent::Settled(st) => st.budget_before,
                            SessionEvent::HumanDecision(h) => h.budget_remaining,
                            SessionEvent::Closed(c) => c.budget_remaining,
                            SessionEvent::Opened(o) => o.budget_before,
                        };
                        ops::replay(&mut folded, &e).unwrap();
                    }
                    None => panic!("{id}: version {seq} has no place"),
                }
            }
            assert!(
                mine.is_empty(),
                "{id}: committed entries beyond the state: {mine:?}"
            );
            Budget::of(&stored.session.state).load_into(&mut folded.state);
            folded.last_heartbeat_ns = stored.session.last_heartbeat_ns;
            folded.meta.created_at_ns = stored.session.meta.created_at_ns;
            assert!(
                folded == stored.session,
                "{id}: state is not the fold of its entries:\n{:?}\n{:?}",
                folded.state,
                stored.session.state
            );
        }
    }
}

/// The random interleavings' seed: fixed, so that every run (and CI) explores the same 512
/// cases and a failure is reproducible; `PROPTEST_RNG_SEED=N` explores others (a random
/// seed found `a_voided_opening_is_never_decided_on`, below).
fn model_config() -> ProptestConfig {
    let seed = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_202);
    ProptestConfig {
        cases: 512,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(model_config())]

    #[test]
    fn cas_protocol_holds_under_random_interleavings(
        daemons in 2..=3usize,
        ops in proptest::collection::vec(op(3), 1..100),
    ) {
        let mut w = World::new(daemons);
        for o in &ops {
            w.step(&o.on(daemons));
        }
        w.finish();
        w.check();
        w.drain();
        w.check();
    }
}

/// Found 2026-12-02 by a random seed of the test above: an opening voided by a sweep,
/// with decisions on the session around it, left the session `Paused` instead of ended: a
/// session that never existed went on deciding. Neither the store nor the model refused a
/// change to a voided (`Terminated`) session; `RedisStore::apply` now answers `NotFound`.
#[test]
fn a_voided_opening_is_never_decided_on() {
    use Op::*;
    let d = |d: usize, s: usize, nonce: u64, cost: i64| Decide { d, s, nonce, cost };
    run(
        2,
        &[
            OpenStart { d: 2, s: 1 },
            OpenSend { d: 2 },
            OpenStart { d: 0, s: 0 },
            Tick,
            Tick,
            Tick,
            Sweep { d: 0 },
            d(1, 1, 1, 6),
            Commit { d: 1 },
            OpenSend { d: 0 },
            Sweep { d: 2 },
            d(0, 0, 1, 14),
            Report {
                d: 1,
                s: 1,
                actual: 0,
            },
            Commit { d: 0 },
            d(1, 1, 2, 14),
            Commit { d: 0 },
            Commit { d: 0 },
            Commit { d: 1 },
            d(1, 1, 3, 6),
            d(0, 0, 2, 1),
            d(0, 0, 2, 8),
            Commit { d: 0 },
            d(0, 0, 3, 13),
        ],
    );
}

fn run(daemons: usize, ops: &[Op]) {
    let mut w = World::new(daemons);
    for o in ops {
        w.step(&o.on(daemons));
    }
    w.finish();
    w.check();
    w.drain();
    w.check();
}

/// An opening's pipeline held up between its staged record and its script while a sweep
/// runs: the sweeper takes the staged record for an orphan (the hash holds nothing else)
/// and deletes it. The script then found its versions matching and pointed `c` at a field
/// that no longer existed: a session whose record was gone, unreadable by every daemon.
/// The script now refuses a write whose staged record is not there (`CasReply::Unstaged`,
/// nothing written; the store fails the call closed), and the agent registers again.
#[test]
fn an_opening_whose_staged_record_was_swept_writes_nothing() {
    use Op::*;
    run(
        2,
        &[
            OpenStart { d: 0, s: 0 },
            Stall { d: 0 },
            OpenSend { d: 0 },
            Decide {
                d: 1,
                s: 0,
                nonce: 1,
                cost: 1,
            },
            Sweep { d: 1 },
            OpenStart { d: 1, s: 1 },
            OpenSend { d: 1 },
            // The agent registers again: the refused id opens, and is decided on.
            OpenStart { d: 1, s: 0 },
            OpenSend { d: 1 },
            Decide {
                d: 1,
                s: 0,
                nonce: 2,
                cost: 1,
            },
            Commit { d: 1 },
        ],
    );
}

/// A refund whose entry is not yet committed is not spent by others: if its daemon dies
/// and the refund is voided, taking it back must not leave the budget below zero.
#[test]
fn a_refund_is_not_spent_before_its_entry_commits() {
    use Op::*;
    let mut ops = vec![
        OpenStart { d: 0, s: 0 },
        OpenSend { d: 0 },
        Commit { d: 0 },
        OpenStart { d: 1, s: 1 },
        OpenSend { d: 1 },
        Commit { d: 1 },
        Decide {
            d: 0,
            s: 0,
            nonce: 1,
            cost: 14,
        },
        Commit { d: 0 },
        // Charged 0 of the 14 reserved: 14 back, then the daemon dies before the entry.
        Report {
            d: 0,
            s: 0,
            actual: 0,
        },
        Crash { d: 0 },
    ];
    for n in 1..=5 {
        ops.push(Decide {
            d: 1,
            s: 1,
            nonce: n,
            cost: 14,
        });
        ops.push(Commit { d: 1 });
    }
    ops.extend([Tick, Tick, Tick, Sweep { d: 1 }]);
    run(2, &ops);
}

/// Issue 15 §1 in the model: a session joins the shared budget while another daemon
/// spends it; the joining daemon must not cache the version of one read with the amounts
/// of another.
#[test]
fn a_join_racing_a_spend_caches_one_read() {
    use Op::*;
    run(
        2,
        &[
            OpenStart { d: 1, s: 1 },
            OpenSend { d: 1 },
            Commit { d: 1 },
            Decide {
                d: 1,
                s: 1,
                nonce: 1,
                cost: 10,
            },
            Commit { d: 1 },
            // Daemon 0 begins opening session 0; daemon 1 spends meanwhile.
            OpenStart { d: 0, s: 0 },
            Decide {
                d: 1,
                s: 1,
                nonce: 2,
                cost: 14,
            },
            Commit { d: 1 },
            OpenSend { d: 0 },
            Commit { d: 0 },
            Decide {
                d: 0,
                s: 0,
                nonce: 3,
                cost: 14,
            },
            Commit { d: 0 },
            Decide {
                d: 1,
                s: 1,
                nonce: 4,
                cost: 14,
            },
            Commit { d: 1 },
            Decide {
                d: 1,
                s: 1,
                nonce: 5,
                cost: 14,
            },
            Commit { d: 1 },
        ],
    );
}

/// Found 2026-12-06 by the test above once it closed sessions and let time pass: an agent's
/// close was written with the session's expiry (`PEXPIRE session_ttl`) while its entry was
/// still on its way to the journal. Its hash expired first; another daemon, deciding on
/// its cached copy, settled the close as a void (its place unclaimed) and found nothing to
/// revert. The log said the session was open (its close voided), Redis had forgotten it:
/// the fold of the log no longer matched the store. A commit now sets no expiry; an end's
/// is set when its marker goes (`cas::confirm_commands`, `cas::plan_revert`).
#[test]
fn an_ended_session_does_not_expire_before_its_end_is_confirmed() {
    use Op::*;
    run(
        2,
        &[
            OpenStart { d: 0, s: 0 },
            OpenSend { d: 0 },
            Commit { d: 0 },
            // Daemon 1 closes the session; its entry is not committed yet.
            Close { d: 1, s: 0 },
            // Daemon 0 decides on its copy: a conflict, it reads the close.
            Decide {
                d: 0,
                s: 0,
                nonce: 1,
                cost: 1,
            },
            Later,
            // Past grace: daemon 0 settles the unconfirmed close.
            Decide {
                d: 0,
                s: 0,
                nonce: 1,
                cost: 1,
            },
        ],
    );
}

/// Found 2026-12-06 by the test above once it restarted Redis: the confirmer dropped a
/// refund's marker, then its hold on the budget, in one pipeline (not a transaction). A
/// restart that cut it between the two left a hold that no marker named: nothing would
/// ever take it off, and its amount could never be spent again. The marker now goes last
/// (`cas::confirm_commands`): cut anywhere, the marker stays, and whoever settles it drops
/// the hold with it.
#[test]
fn a_confirmation_cut_by_a_restart_leaves_no_hold() {
    use Op::*;
    run(
        2,
        &[
            OpenStart { d: 0, s: 0 },
            OpenSend { d: 0 },
            Commit { d: 0 },
            Decide {
                d: 0,
                s: 0,
                nonce: 1,
                cost: 10,
            },
            Commit { d: 0 },
            // Charged 0 of the 10 reserved: 10 back, held until the entry commits.
            Report {
                d: 1,
                s: 0,
                actual: 0,
            },
            // Redis restarts with daemon 1's next pipeline (its confirmer's) in flight:
            // only its first command runs.
            Restart { fates: [0, 3, 0] },
            Commit { d: 1 },
        ],
    );
}
