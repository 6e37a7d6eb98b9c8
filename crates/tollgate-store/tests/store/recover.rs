//! After its journal failed and recovered, the embedded store goes on from the fold of
//! the log, not from its memory: a change whose entry was lost is forgotten, a change
//! computed before the recovery is not written, and every change after it folds.
//!
//! The journal here is the real audit writer behind a switch the test flips: failing (the
//! next entry is lost and every later one refused, as the writer does on a full disk) and
//! recovered (a new generation, as the writer's recovery gives). The writer itself
//! recovering from a real full disk is tested in tollgate-audit (`heal`) and, end to end,
//! in the `tollgate` binary's tests.

use std::path::Path;
use std::sync::{Arc, Mutex};

use tollgate_audit::{SessionEvent, WriteError, Writer, WriterConfig};
use tollgate_core::Verdict;
use tollgate_store::{Durable, EmbeddedStore, Journal, JournalHealth, StoreError, StoreOptions};

use crate::support::{block_on, create, fold_log, key, normalize, pre_exec, session, Call};

#[derive(Debug, Default)]
struct Switch {
    generation: u64,
    failing: bool,
    lose_next: bool,
    /// Recover while the next change is between its admission and its submit.
    recover_at_next_submit: bool,
}

#[derive(Debug)]
struct Flaky {
    writer: Arc<Writer>,
    switch: Mutex<Switch>,
}

fn failed(e: WriteError) -> Durable {
    let (c, p) = tollgate_audit::pending_pair();
    c.complete(Err(e));
    Durable::of(p)
}

impl Journal for Flaky {
    fn submit(&self, event: SessionEvent) -> Durable {
        let g = self.switch.lock().unwrap().generation;
        self.submit_at(event, g)
    }

    fn health(&self) -> JournalHealth {
        let s = self.switch.lock().unwrap();
        JournalHealth {
            generation: s.generation,
            failure: s.failing.then(|| "disk full (test)".to_owned()),
        }
    }

    fn submit_at(&self, event: SessionEvent, generation: u64) -> Durable {
        let mut s = self.switch.lock().unwrap();
        if s.recover_at_next_submit {
            s.recover_at_next_submit = false;
            s.failing = false;
            s.generation += 1;
        }
        if s.lose_next {
            s.lose_next = false;
            s.failing = true;
            return failed(WriteError::Io("disk full (test)".into()));
        }
        if s.failing {
            return failed(WriteError::Failed("disk full (test)".into()));
        }
        if generation != s.generation {
            return failed(WriteError::Stale);
        }
        Durable::of(self.writer.submit(event))
    }
}

fn open(dir: &Path) -> (Arc<Flaky>, EmbeddedStore) {
    let (tap, rx) = tollgate_store::tap();
    let (writer, _) =
        Writer::open_with_tap(WriterConfig::new(dir.join("audit")), key(), tap.into_fn()).unwrap();
    let journal = Arc::new(Flaky {
        writer: Arc::new(writer),
        switch: Mutex::new(Switch::default()),
    });
    let (store, _) = EmbeddedStore::open(
        dir.join("state.redb"),
        dir.join("audit"),
        Some(&key().verifying_key()),
        journal.clone(),
        rx,
        StoreOptions::default(),
        2_000,
    )
    .unwrap();
    (journal, store)
}

fn call(nonce: u64) -> Call<'static> {
    Call {
        tool: "t",
        arg: i64::try_from(nonce).unwrap(),
        nonce,
        cost: 1_000,
        now: 10_000,
    }
}

fn assert_is_fold(store: &EmbeddedStore, journal: &Flaky, dir: &Path) {
    journal.writer.flush().wait().unwrap();
    let ledger = fold_log(dir);
    let (sessions, _) = tollgate_store::dump(store);
    assert_eq!(sessions.len(), ledger.sessions.len());
    // The quiet index was rebuilt with the state: it names each reloaded session.
    let mut quiet: Vec<_> = sessions
        .iter()
        .filter_map(|s| s.quiet_since().map(|t| (t, s.meta.session_id.clone())))
        .collect();
    quiet.sort();
    let quiet: Vec<String> = quiet.into_iter().map(|(_, id)| id).collect();
    assert_eq!(store.quiet_sync(i64::MAX).unwrap(), quiet);
    for s in sessions {
        let folded = ledger.session(&s.meta.session_id).unwrap();
        assert_eq!(normalize(folded), normalize(s));
    }
}

#[test]
fn a_lost_change_is_forgotten_after_the_journal_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, store) = open(dir.path());
    create(&store, session("s1", 1_000_000)).unwrap();
    let (d, durable) = pre_exec(&store, "s1", call(1)).unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    block_on(durable).unwrap();

    // The next entry is lost (its change is in memory only), and the journal refuses.
    journal.switch.lock().unwrap().lose_next = true;
    let (_, durable) = pre_exec(&store, "s1", call(2)).unwrap();
    assert!(block_on(durable).is_err());
    assert!(matches!(
        pre_exec(&store, "s1", call(3)),
        Err(StoreError::Unavailable { .. })
    ));
    assert!(matches!(
        create(&store, session("s2", 1_000)),
        Err(StoreError::Unavailable { .. })
    ));

    // Recovered: the next change starts from the fold of the log, where call 2 is not.
    {
        let mut s = journal.switch.lock().unwrap();
        s.failing = false;
        s.generation += 1;
    }
    let (d, durable) = pre_exec(&store, "s1", call(2)).unwrap();
    assert_eq!(d.verdict, Verdict::Allow, "nonce 2 was never allowed");
    block_on(durable).unwrap();
    assert_eq!(store.get_sync("s1").unwrap().unwrap().last_call_number, 2);
    assert_is_fold(&store, &journal, dir.path());
}

#[test]
fn a_change_computed_before_the_recovery_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, store) = open(dir.path());
    create(&store, session("s1", 1_000_000)).unwrap();
    journal.switch.lock().unwrap().lose_next = true;
    let (_, durable) = pre_exec(&store, "s1", call(1)).unwrap();
    assert!(block_on(durable).is_err());
    // A change admitted while the journal still looked healthy at the old generation
    // (as one that read its health just before the failure showed), computed on the lost
    // change; the journal recovers before its entry is submitted.
    {
        let mut s = journal.switch.lock().unwrap();
        s.failing = false;
        s.recover_at_next_submit = true;
    }
    let (_, durable) = pre_exec(&store, "s1", call(2)).unwrap();
    assert!(
        matches!(block_on(durable), Err(StoreError::Journal { .. })),
        "an entry computed on a lost change reached the log"
    );
    // The next change reloads, and folds.
    let (_, durable) = pre_exec(&store, "s1", call(3)).unwrap();
    block_on(durable).unwrap();
    assert_eq!(store.get_sync("s1").unwrap().unwrap().seq, 2);
    assert_is_fold(&store, &journal, dir.path());
}
