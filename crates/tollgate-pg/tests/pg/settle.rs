use tollgate_audit::Event;
use tollgate_core::Money;
use tollgate_pg::PgJournal;
use tollgate_store::{Arbiter, Journal, Settled, VoidBudget};

use crate::common::*;

#[tokio::test]
async fn a_place_without_an_entry_is_voided_once() {
    let s = migrated("void").await;
    let j = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap();
    // What the voided change did to the shared budget goes into the void (format 4).
    let budget = VoidBudget {
        budget_version: 7,
        budget_before: Money(5_000),
        budget_after: Money(4_000),
        revert_version: 9,
    };
    assert_eq!(j.settle("sess", 3, budget).await.unwrap(), Settled::Void);
    // Idempotent: no second void, whatever the second call says.
    assert_eq!(
        j.settle("sess", 3, VoidBudget::default()).await.unwrap(),
        Settled::Void
    );
    // The change's own entry, arriving late, is refused.
    let e = j.submit(verdict("sess", 3)).await.unwrap_err();
    assert!(e.to_string().contains("already held by a void"), "{e}");
    // Another daemon sees the same settlement.
    let k = PgJournal::open(s.settings(), key(2), "daemon-b")
        .await
        .unwrap();
    assert_eq!(
        k.settle("sess", 3, VoidBudget::default()).await.unwrap(),
        Settled::Void
    );
    j.close().await.unwrap();
    k.close().await.unwrap();
    let c = client().await.unwrap();
    let mut voids = Vec::new();
    let reports = tollgate_pg::verify(&c, &s.name, None, &[], &mut |chain, e| {
        if let Event::Void(v) = &e.event {
            voids.push((chain.to_owned(), v.clone()));
        }
    })
    .await
    .unwrap();
    assert!(reports.iter().all(|r| r.result.is_ok()));
    assert_eq!(voids.len(), 1);
    let (chain, v) = &voids[0];
    assert_eq!(chain, "daemon-a");
    assert_eq!((v.session_id.as_str(), v.session_seq), ("sess", 3));
    assert_eq!(v.chain_id, "daemon-a");
    assert_eq!(v.reason, "unconfirmed_at_settle");
    assert_eq!(
        (
            v.budget_version,
            v.budget_before,
            v.budget_after,
            v.revert_version
        ),
        (7, Money(5_000), Money(4_000), 9)
    );
    let kind: String = c
        .query_one(
            &format!(
                "SELECT kind FROM \"{}\".claims WHERE session_id = 'sess' AND session_seq = 3",
                s.name
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(kind, "void");
}

#[tokio::test]
async fn a_committed_entry_holds_its_place() {
    let s = migrated("held").await;
    let j = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap();
    let k = PgJournal::open(s.settings(), key(2), "daemon-b")
        .await
        .unwrap();
    j.submit(verdict("sess", 1)).await.unwrap();
    assert_eq!(
        j.settle("sess", 1, VoidBudget::default()).await.unwrap(),
        Settled::Entry
    );
    assert_eq!(
        k.settle("sess", 1, VoidBudget::default()).await.unwrap(),
        Settled::Entry
    );
    // A second entry for the same place (from any chain) is refused.
    let e = k.submit(verdict("sess", 1)).await.unwrap_err();
    assert!(
        e.to_string().contains("already held by another entry"),
        "{e}"
    );
    j.close().await.unwrap();
    k.close().await.unwrap();
    let c = client().await.unwrap();
    assert_eq!(count(&c, &s.name, "entries").await, 1);
    assert_eq!(count(&c, &s.name, "claims").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_racing_a_commit_leaves_exactly_one_holder() {
    let s = migrated("race").await;
    let j = std::sync::Arc::new(
        PgJournal::open(s.settings(), key(1), "daemon-a")
            .await
            .unwrap(),
    );
    let k = std::sync::Arc::new(
        PgJournal::open(s.settings(), key(2), "daemon-b")
            .await
            .unwrap(),
    );
    let n = 150u64;
    let mut pairs = Vec::new();
    for i in 0..n {
        let sid = format!("race-{i}");
        let d = j.submit(verdict(&sid, 1));
        let k = k.clone();
        let settle = tokio::spawn(async move { k.settle(&sid, 1, VoidBudget::default()).await });
        pairs.push((tokio::spawn(d), settle));
    }
    let (mut entries, mut voids) = (0u64, 0u32);
    for (d, st) in pairs {
        let committed = d.await.unwrap();
        let settled = st.await.unwrap().unwrap();
        match (committed, settled) {
            (Ok(Some(_)), Settled::Entry) => entries += 1,
            (Err(e), Settled::Void) => {
                assert!(e.to_string().contains("void"), "{e}");
                voids += 1;
            }
            (c, st) => panic!("inconsistent: entry {c:?}, settled {st:?}"),
        }
    }
    eprintln!("race: {entries} entries, {voids} voids");
    assert_eq!(entries + u64::from(voids), n);
    j.close().await.unwrap();
    k.close().await.unwrap();
    let c = client().await.unwrap();
    assert_eq!(
        count(&c, &s.name, "claims").await,
        i64::try_from(n).unwrap()
    );
    let void_rows = count(&c, &s.name, "claims WHERE kind = 'void'").await;
    assert_eq!(void_rows, i64::from(voids));
    // The claims point at the entries that hold them.
    let dangling = count(
        &c,
        &s.name,
        &format!(
            "claims c WHERE NOT EXISTS (SELECT 1 FROM \"{}\".entries e WHERE e.chain_id = c.chain_id AND e.idx = c.idx AND e.session_id = c.session_id AND e.session_seq = c.session_seq)",
            s.name
        ),
    )
    .await;
    assert_eq!(dangling, 0);
    let reports = verify_all(&s.name).await;
    assert_eq!(reports.len(), 2);
    assert!(reports.iter().all(|r| r.result.is_ok()), "{reports:?}");
}

/// Both transactions reach the claims insert before either commits: the primary key
/// makes one wait for the other, and the loser (a conflict, retried) finds the winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_and_commit_in_flight_together_leave_exactly_one_holder() {
    let s = migrated("inflight").await;
    let j = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap();
    let k = std::sync::Arc::new(
        PgJournal::open(s.settings(), key(2), "daemon-b")
            .await
            .unwrap(),
    );
    let mut locker = client().await.unwrap();
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute(&format!(
        "LOCK TABLE \"{}\".claims IN EXCLUSIVE MODE",
        s.name
    ))
    .await
    .unwrap();
    let committed = tokio::spawn(j.submit(verdict("sess", 1)));
    let k2 = k.clone();
    let settled = tokio::spawn(async move { k2.settle("sess", 1, VoidBudget::default()).await });
    // Wait (bounded) until both writers wait on the claims lock.
    let watcher = client().await.unwrap();
    let mut both = false;
    for _ in 0..1000 {
        let n: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
                &[&format!("%{}%", s.name)],
            )
            .await
            .unwrap()
            .get(0);
        if n == 2 {
            both = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(both, "the two transactions never met");
    tx.commit().await.unwrap();
    let committed = committed.await.unwrap();
    let settled = settled.await.unwrap().unwrap();
    match (&committed, settled) {
        (Ok(Some(_)), Settled::Entry) => {}
        (Err(e), Settled::Void) => assert!(e.to_string().contains("void"), "{e}"),
        (c, st) => panic!("inconsistent: entry {c:?}, settled {st:?}"),
    }
    // The loser rolled back and tried again.
    assert_eq!(j.pg_stats().conflicts + k.pg_stats().conflicts, 1);
    j.close().await.unwrap();
    k.close().await.unwrap();
    let c = client().await.unwrap();
    assert_eq!(count(&c, &s.name, "claims").await, 1);
    // The loser wrote nothing: one entry row in all.
    assert_eq!(count(&c, &s.name, "entries").await, 1);
    let reports = verify_all(&s.name).await;
    assert!(reports.iter().all(|r| r.result.is_ok()), "{reports:?}");
}
