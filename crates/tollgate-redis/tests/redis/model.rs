//! The CAS protocol under random interleavings: two or three simulated daemons, each
//! with its own cache, run the crate's own planning code ([`tollgate_redis::cas`])
//! against the in-memory fake of the script, with reads, decisions, writes, journal
//! commits, crashes between write and commit, clock ticks, settling and sweeping in any
//! order. Invariants: the shared budget is never overspent and equals the budget minus
//! what committed ALLOWs reserved; no nonce is ALLOWed twice in the committed history;
//! every session's state equals the fold of its committed entries (voids keep their
//! version).

use std::collections::{HashMap, HashSet, VecDeque};

use proptest::prelude::*;
use tollgate_audit::SessionEvent;
use tollgate_core::Money;
use tollgate_redis::cas::{
    after_done, budget_from_fields, check_markers, plan_commit, plan_revert, view_from_fields,
    Bounds, CasReply, CasRequest, MarkerAction, View,
};
use tollgate_redis::keys::Keys;
use tollgate_redis::script::Fake;
use tollgate_store::record::{encode_budget, encode_session};
use tollgate_store::{ops, Budget, Change, Session, Settled};

use crate::support::{org_session, pre_exec_closure, Book, Claim};

const GRACE: i64 = 100;
const BUDGET: i64 = 60;
const SESSIONS: usize = 3;
const BOUNDS: Bounds = Bounds {
    max_blob_bytes: 1 << 20,
};

#[derive(Debug, Clone)]
enum Op {
    Decide {
        d: usize,
        s: usize,
        nonce: u64,
        cost: i64,
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

fn op(daemons: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..daemons, 0..SESSIONS, 1..30u64, 1..15i64)
            .prop_map(|(d, s, nonce, cost)| Op::Decide { d, s, nonce, cost }),
        4 => (0..daemons).prop_map(|d| Op::Commit { d }),
        1 => (0..daemons).prop_map(|d| Op::Crash { d }),
        2 => Just(Op::Tick),
        1 => (0..daemons).prop_map(|d| Op::Sweep { d }),
    ]
}

#[derive(Debug)]
struct Daemon {
    id: String,
    cache: HashMap<String, View>,
    in_flight: VecDeque<SessionEvent>,
    confirmed: HashMap<String, u64>,
}

impl Daemon {
    fn new(n: u32) -> Daemon {
        Daemon {
            id: format!("d{n}"),
            cache: HashMap::new(),
            in_flight: VecDeque::new(),
            confirmed: HashMap::new(),
        }
    }

    fn confirmed_upto(&self, id: &str) -> u64 {
        self.confirmed.get(id).copied().unwrap_or(0)
    }

    fn in_flight(&self, id: &str, seq: u64) -> bool {
        self.in_flight
            .iter()
            .any(|e| e.session_id() == id && e.session_seq() == seq)
    }
}

struct World {
    db: Fake,
    daemons: Vec<Daemon>,
    book: Book,
    now: i64,
    started: u32,
    keys: Keys,
}

const GROUP: &str = "o:org-m";

fn sid(s: usize) -> String {
    format!("m{s}")
}

impl World {
    fn new(daemons: usize) -> World {
        let mut w = World {
            db: Fake::default(),
            daemons: (0..daemons as u32).map(Daemon::new).collect(),
            book: Book::default(),
            now: 0,
            started: daemons as u32,
            keys: Keys::new("m").unwrap(),
        };
        // Sessions opened and committed before the interleavings start.
        for s in 0..SESSIONS {
            let mut session = org_session(&sid(s), "org-m", BUDGET);
            let existing = budget_from_fields(&w.db.hgetall(&w.bkey())).unwrap();
            if let Some((_, b)) = existing {
                b.load_into(&mut session.state);
            }
            let record = ops::open(&mut session, 1_000);
            let reply = w.db.cas(&CasRequest {
                session_key: w.skey(&sid(s)),
                budget_key: Some(w.bkey()),
                expect_sv: 0,
                expect_bv: 0,
                session_blob: encode_session(&session),
                budget_blob: existing
                    .is_none()
                    .then(|| encode_budget(&Budget::of(&session.state))),
                daemon: "setup".into(),
                marker: None,
                drop: Vec::new(),
                ttl_ms: 0,
            });
            assert!(matches!(reply, CasReply::Done { .. }));
            assert!(w.book.commit(&record.into()));
        }
        w
    }

    fn skey(&self, id: &str) -> String {
        self.keys.session(GROUP, id)
    }

    fn bkey(&self) -> String {
        self.keys.budget(GROUP)
    }

    fn read(&self, id: &str) -> View {
        view_from_fields(
            &self.db.hgetall(&self.skey(id)),
            &self.db.hgetall(&self.bkey()),
            BOUNDS,
            0,
        )
        .unwrap()
        .unwrap()
    }

    fn budget(&self) -> Budget {
        budget_from_fields(&self.db.hgetall(&self.bkey()))
            .unwrap()
            .unwrap()
            .1
    }

    fn settle(&mut self, d: usize, id: &str, view: &View, seqs: &[u64]) {
        let outcomes: Vec<(u64, Settled)> = seqs
            .iter()
            .map(|q| (*q, self.book.settle(id, *q, Default::default())))
            .collect();
        let me = self.daemons[d].id.clone();
        let planned = plan_revert(
            view,
            &self.skey(id),
            Some(&self.bkey()),
            &outcomes,
            &me,
            BOUNDS,
            1_000,
        )
        .unwrap();
        let next = match self.db.cas(&planned.request) {
            CasReply::Done { sv, bv } => after_done(view, planned, sv, bv),
            CasReply::Conflict { .. } => self.read(id),
        };
        self.daemons[d].cache.insert(id.to_owned(), next);
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Decide { d, s, nonce, cost } => {
                let id = sid(s);
                let view = match self.daemons[d].cache.get(&id) {
                    Some(v) => v.clone(),
                    None => self.read(&id),
                };
                let dm = &self.daemons[d];
                let action = check_markers(
                    &view,
                    &dm.id,
                    dm.confirmed_upto(&id),
                    &|q| dm.in_flight(&id, q),
                    self.now,
                    GRACE,
                    false,
                );
                match action {
                    MarkerAction::WaitOwn => {}
                    MarkerAction::Wait => {
                        let fresh = self.read(&id);
                        self.daemons[d].cache.insert(id, fresh);
                    }
                    MarkerAction::Settle(seqs) => self.settle(d, &id, &view, &seqs),
                    MarkerAction::Proceed => {
                        let mut session: Session = view.session.clone();
                        let Change::Commit(_, event) = pre_exec_closure(nonce, cost)(&mut session)
                        else {
                            panic!("pre_exec always commits")
                        };
                        let dm = &self.daemons[d];
                        let planned = plan_commit(
                            &view,
                            &self.skey(&id),
                            Some(&self.bkey()),
                            session,
                            &event,
                            &dm.id,
                            self.now,
                            dm.confirmed.get(&id).copied().unwrap_or(0),
                            1_000,
                        )
                        .unwrap();
                        let next = match self.db.cas(&planned.request) {
                            CasReply::Done { sv, bv } => {
                                // Written: the entry goes to the journal (committed later).
                                self.daemons[d].in_flight.push_back(event);
                                after_done(&view, planned, sv, bv)
                            }
                            CasReply::Conflict { session, budget } => {
                                view_from_fields(&session, &budget, BOUNDS, 0)
                                    .unwrap()
                                    .unwrap()
                            }
                        };
                        self.daemons[d].cache.insert(id, next);
                    }
                }
            }
            Op::Commit { d } => {
                if let Some(event) = self.daemons[d].in_flight.pop_front() {
                    let id = event.session_id().to_owned();
                    let seq = event.session_seq();
                    if self.book.commit(&event) {
                        let c = self.daemons[d].confirmed.entry(id.clone()).or_insert(0);
                        *c = (*c).max(seq);
                        // The confirmer drops the marker.
                        let key = self.skey(&id);
                        self.db.hdel(&key, &format!("u:{seq}"));
                    }
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
                    let view = self.read(&id);
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
        let b = self.budget();
        assert!(b.remaining.0 >= 0, "budget overspent: {b:?}");
    }

    /// Commit what every live daemon has in flight, then let a fresh daemon sweep after
    /// grace until no marker is left.
    fn finish(&mut self) {
        for d in 0..self.daemons.len() {
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
            assert!(self.read(&sid(s)).markers.is_empty(), "markers left");
        }
    }

    fn check(&self) {
        // No nonce allowed twice in the committed history of a session.
        let allows = self.book.allows();
        let mut seen = HashSet::new();
        for (s, nonce, _) in &allows {
            assert!(
                seen.insert((s.clone(), *nonce)),
                "{s}: nonce {nonce} allowed twice"
            );
        }
        // The budget is what committed ALLOWs reserved, and no more than it had.
        let reserved: i64 = allows.iter().map(|a| a.2).sum();
        let b = self.budget();
        assert!(reserved <= BUDGET);
        assert_eq!(b.remaining, Money(BUDGET - reserved));
        // Each session is the fold of its committed entries; voids keep their version.
        let entries = self.book.entries.lock().unwrap().clone();
        let claims = self.book.claims.lock().unwrap().clone();
        for s in 0..SESSIONS {
            let id = sid(s);
            let stored = self.read(&id);
            let mut mine: HashMap<u64, SessionEvent> = entries
                .iter()
                .filter(|e| e.session_id() == id)
                .map(|e| (e.session_seq(), e.clone()))
                .collect();
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
                        if let SessionEvent::Verdict(v) = &e {
                            folded.state.budget_remaining = v.budget_before;
                        }
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn cas_protocol_holds_under_random_interleavings(
        daemons in 2..=3usize,
        ops in proptest::collection::vec(op(3), 1..80),
    ) {
        let mut w = World::new(daemons);
        for o in &ops {
            let o = match *o {
                Op::Decide { d, s, nonce, cost } => Op::Decide { d: d % daemons, s, nonce, cost },
                Op::Commit { d } => Op::Commit { d: d % daemons },
                Op::Crash { d } => Op::Crash { d: d % daemons },
                Op::Sweep { d } => Op::Sweep { d: d % daemons },
                Op::Tick => Op::Tick,
            };
            w.step(&o);
        }
        w.finish();
        w.check();
    }
}
