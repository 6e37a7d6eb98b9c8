//! Three daemons (three stores, one Redis, one audit book) sharing an organization's
//! budget: no overspend, no nonce allowed twice, one round trip per cached decision.

use std::collections::HashSet;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Money, Verdict};
use tollgate_store::{BudgetKey, SessionStore, StoreError};

use crate::support::{
    cleanup, create, options, org_session, pre_exec, pre_exec_remaining, prefix, store,
    wait_confirmed, Book, DelayProxy, TestJournal,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_daemons_never_overspend_a_shared_budget_nor_allow_a_nonce_twice() {
    let _scripts = crate::support::SCRIPTS.read().await;
    let p = prefix("fleet");
    let book = Arc::new(Book::default());
    let mut daemons = Vec::new();
    for _ in 0..3 {
        daemons.push(Arc::new(
            store(options(&p), TestJournal::new(book.clone())).await,
        ));
    }
    const BUDGET: i64 = 1_000;
    const COST: i64 = 7;
    const SESSIONS: usize = 24;
    const CALLS: u64 = 12;
    // Half the sessions are opened before the load, half during it: their openings join
    // the budget while the others spend it.
    for i in 0..SESSIONS / 2 {
        create(
            &*daemons[i % 3],
            org_session(&format!("s{i}"), "org-f", BUDGET),
        )
        .await;
    }
    let mut tasks = Vec::new();
    for i in 0..SESSIONS {
        let daemons = daemons.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("s{i}");
            if i >= SESSIONS / 2 {
                create(&*daemons[i % 3], org_session(&id, "org-f", BUDGET)).await;
            }
            let mut allowed = 0u64;
            let mut refused = 0u64;
            for n in 0..CALLS {
                let nonce = (i as u64) * 1_000 + n + 1;
                // Calls of one session go through all three daemons in turn.
                let d = (i + n as usize) % 3;
                match pre_exec(&*daemons[d], &id, nonce, COST).await {
                    Ok((decision, durable)) => {
                        durable.await.unwrap();
                        if decision.verdict == Verdict::Allow {
                            allowed += 1;
                        }
                    }
                    Err(_) => refused += 1,
                }
            }
            // The agent resends its first call through another daemon (as after a
            // daemon died unanswered): never allowed again.
            let (d, durable) = pre_exec(&*daemons[(i + 2) % 3], &id, (i as u64) * 1_000 + 1, COST)
                .await
                .unwrap();
            durable.await.unwrap();
            assert_ne!(d.verdict, Verdict::Allow);
            (allowed, refused)
        }));
    }
    let mut allowed = 0;
    let mut refused = 0;
    for t in tasks {
        let (a, r) = t.await.unwrap();
        allowed += a;
        refused += r;
    }
    let budget = daemons[0]
        .budget(&BudgetKey::Organization("org-f".into()))
        .await
        .unwrap()
        .unwrap();
    // Never past the budget, to the nano-dollar; Redis's budget is what was allowed.
    assert!(allowed as i64 * COST <= BUDGET);
    assert_eq!(budget.remaining, Money(BUDGET - allowed as i64 * COST));
    if refused == 0 {
        assert_eq!(
            allowed as i64,
            BUDGET / COST,
            "every affordable call was allowed"
        );
    }
    // The audit book agrees, and holds each (session, nonce) at most once.
    let allows = book.allows();
    assert_eq!(allows.len() as u64, allowed);
    let mut seen = HashSet::new();
    for (s, nonce, _) in &allows {
        assert!(
            seen.insert((s.clone(), *nonce)),
            "nonce {nonce} of {s} allowed twice"
        );
    }
    // The budget folds from the book alone, by its versions, to what Redis holds.
    let (_, left) = crate::support::fold_budget(&book, "org-f", BUDGET);
    assert_eq!(Money(left), budget.remaining);
    let stats: Vec<_> = daemons.iter().map(|d| d.stats()).collect();
    assert!(
        stats.iter().map(|s| s.conflicts).sum::<u64>() > 0,
        "the daemons did contend: {stats:?}"
    );
    cleanup(&p).await;
}

#[tokio::test]
async fn a_cached_decision_costs_one_round_trip() {
    let _scripts = crate::support::SCRIPTS.read().await;
    let p = prefix("rtt");
    let book = Arc::new(Book::default());
    let a = store(options(&p), TestJournal::new(book.clone())).await;
    create(&a, org_session("r1", "org-r", 1_000)).await;
    for nonce in 1..=5 {
        let before = a.stats().round_trips;
        let (d, durable) = pre_exec(&a, "r1", nonce, 10).await.unwrap();
        assert_eq!(d.verdict, Verdict::Allow);
        assert_eq!(a.stats().round_trips - before, 1, "call {nonce}");
        durable.await.unwrap();
    }
    wait_confirmed(&format!("{p}:{{o:org-r}}:s:r1")).await;
    // Another daemon, cold: the group, the hashes, then the script.
    let b = store(options(&p), TestJournal::new(book)).await;
    let before = b.stats().round_trips;
    let (d, durable) = pre_exec(&b, "r1", 6, 10).await.unwrap();
    durable.await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(b.stats().round_trips - before, 3);
    wait_confirmed(&format!("{p}:{{o:org-r}}:s:r1")).await;
    // Back on the first daemon: its copy is stale, so the script's conflict answer
    // (which carries the current hashes) and a second script call: two round trips.
    let before = a.stats().round_trips;
    let (d, durable) = pre_exec(&a, "r1", 7, 10).await.unwrap();
    durable.await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(a.stats().round_trips - before, 2);
    cleanup(&p).await;
}

/// Issue 15 §1, as reproduced: daemon A reaches Redis through a proxy that delays its
/// bytes by 0.5 s, daemon B goes direct. B allows 1.00 of 10.00; A starts opening a
/// session of the same organization; while A's opening is on its way, B allows 2.00;
/// then A allows 3.00 and B asks for 6.00. A must answer 4.00 left, B's 6.00 must be
/// denied, and nothing is allowed past the budget (before the fix, A joined with the
/// version of one read and the amounts of another, answered 6.00 left, and B's 6.00 was
/// allowed: 12.00 of 10.00).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_joining_while_another_daemon_spends_never_overspends() {
    let _scripts = crate::support::SCRIPTS.read().await;
    const USD: i64 = 1_000_000_000;
    let p = prefix("join-race");
    let book = Arc::new(Book::default());
    let proxy = DelayProxy::start(Duration::from_millis(500)).await;
    let mut oa = options(&p);
    oa.url = proxy.url.clone();
    let a = Arc::new(store(oa, TestJournal::new(book.clone())).await);
    let b = store(options(&p), TestJournal::new(book.clone())).await;
    create(&b, org_session("b1", "org-j", 10 * USD)).await;
    let (d, durable) = pre_exec(&b, "b1", 1, USD).await.unwrap();
    durable.await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);

    // A opens a1 (its own 10.00 is ignored: it joins the organization's budget).
    let (up, down) = (proxy.up.load(SeqCst), proxy.down.load(SeqCst));
    let a2 = a.clone();
    let opening = tokio::spawn(async move {
        let (_, d) = a2
            .create(org_session("a1", "org-j", 10 * USD), 1_000)
            .await?;
        d.await.map_err(|e| StoreError::Failed {
            message: e.to_string(),
        })
    });
    // A's first command of the opening has reached Redis and been answered.
    proxy.wait(|u, d| u > up && d > down).await;
    // B spends meanwhile (direct: well within A's 0.5 s).
    let (d, durable) = pre_exec(&b, "b1", 2, 2 * USD).await.unwrap();
    durable.await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    opening.await.unwrap().unwrap();

    let ((d, left), durable) = a.apply("a1", pre_exec_remaining(3, 3 * USD)).await.unwrap();
    durable.await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(left, Money(4 * USD), "A's budget_remaining after its 3.00");
    let (d, durable) = pre_exec(&b, "b1", 4, 6 * USD).await.unwrap();
    durable.await.unwrap();
    let allowed: i64 = book.allows().iter().map(|x| x.2).sum();
    assert!(
        allowed <= 10 * USD,
        "allowed {allowed} of a budget of {}",
        10 * USD
    );
    assert_ne!(d.verdict, Verdict::Allow, "B's 6.00 with 4.00 left");
    let budget = b
        .budget(&BudgetKey::Organization("org-j".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(budget.remaining, Money(10 * USD - allowed));
    assert_eq!(budget.remaining, Money(4 * USD));
    cleanup(&p).await;
}
