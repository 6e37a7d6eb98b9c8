//! Three daemons (three stores, one Redis, one audit book) sharing an organization's
//! budget: no overspend, no nonce allowed twice, one round trip per cached decision.

use std::collections::HashSet;
use std::sync::Arc;

use tollgate_core::{Money, Verdict};
use tollgate_store::{BudgetKey, SessionStore};

use crate::support::{
    cleanup, create, options, org_session, pre_exec, prefix, store, wait_confirmed, Book,
    TestJournal,
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
    for i in 0..SESSIONS {
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
