//! The SessionStore surface over Redis: create (join a shared budget, Exists, invalid
//! ids), get, list, pending_hitl, budget, Touch, close; garbage in Redis is an error;
//! the server's durability settings.

use std::sync::Arc;

use tollgate_core::{BudgetScope, Money, Verdict};
use tollgate_store::{BudgetKey, Change, Session, SessionMeta, SessionStore, StoreError};

use crate::support::{
    cleanup, create, hget, hset, options, org_session, policy, pre_exec, prefix, store,
    wait_confirmed, Book, TestJournal, REDIS,
};

#[tokio::test]
async fn sessions_are_created_read_listed_and_joined() {
    let _scripts = crate::support::SCRIPTS.read().await;
    let p = prefix("basics");
    let book = Arc::new(Book::default());
    let s = store(options(&p), TestJournal::new(book.clone())).await;
    create(&s, org_session("b1", "org-b", 1_000)).await;
    // The second session joins the organization's budget (its own amount is ignored).
    create(&s, org_session("b2", "org-b", 5)).await;
    let own = Session::new(
        SessionMeta {
            session_id: "b3".into(),
            agent_id: "solo".into(),
            organization_id: "org-x".into(),
            budget_scope: BudgetScope::PerSession,
            created_at_ns: 1_000,
        },
        policy(70, BudgetScope::PerSession),
        1_000,
    );
    create(&s, own.clone()).await;
    assert_eq!(
        s.create(own.clone(), 1_000).await.unwrap_err(),
        StoreError::Exists { id: "b3".into() }
    );
    let mut bad = org_session("b\n4", "org-b", 5);
    bad.meta.session_id = "b\n4".into();
    assert!(matches!(
        s.create(bad, 1_000).await.unwrap_err(),
        StoreError::InvalidId { .. }
    ));
    let (d, durable) = pre_exec(&s, "b2", 1, 400).await.unwrap();
    durable.await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    let b1 = s.get("b1").await.unwrap().unwrap();
    assert_eq!(b1.state.budget_remaining, Money(600));
    assert_eq!(b1.seq, 1);
    assert!(s.get("nope").await.unwrap().is_none());
    assert!(matches!(
        pre_exec(&s, "nope", 1, 1).await.map(|x| x.0),
        Err(StoreError::NotFound { .. })
    ));
    let org = s
        .budget(&BudgetKey::Organization("org-b".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((org.initial, org.remaining), (Money(1_000), Money(600)));
    let own_budget = s
        .budget(&BudgetKey::Session("b3".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(own_budget.remaining, Money(70));
    let ids: Vec<String> = s
        .list(Some("org-b"))
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.meta.session_id)
        .collect();
    assert_eq!(ids, ["b1", "b2"]);
    assert_eq!(s.list(None).await.unwrap().len(), 3);
    assert!(s.pending_hitl(None).await.unwrap().is_empty());
    // A liveness touch writes nothing: one read of the session's version.
    let before = s.stats().round_trips;
    let ((), d) = s
        .apply("b1", |x: &mut Session| {
            x.last_heartbeat_ns = 99;
            Change::Touch(())
        })
        .await
        .unwrap();
    d.await.unwrap();
    assert_eq!(s.stats().round_trips, before + 1);
    // Another store sees the same sessions.
    let t = store(options(&p), TestJournal::new(book)).await;
    assert_eq!(
        t.get("b2").await.unwrap().unwrap().state.budget_remaining,
        Money(600)
    );
    // It changes one; a read-only closure on the first store sees the change, not its
    // stale copy.
    wait_confirmed(&format!("{p}:{{o:org-b}}:s:b2")).await;
    let (d, durable) = pre_exec(&t, "b2", 2, 100).await.unwrap();
    durable.await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    wait_confirmed(&format!("{p}:{{o:org-b}}:s:b2")).await;
    let (seen, _) = s
        .apply("b2", |x: &mut Session| {
            Change::Keep((x.seq, x.last_call_number))
        })
        .await
        .unwrap();
    assert_eq!(seen, (3, 2));
    s.close().await.unwrap();
    assert_eq!(
        pre_exec(&s, "b1", 2, 1).await.unwrap_err(),
        StoreError::Closed
    );
    cleanup(&p).await;
}

#[tokio::test]
async fn garbage_in_redis_is_an_error_not_a_panic() {
    let _scripts = crate::support::SCRIPTS.read().await;
    let p = prefix("garbage");
    let book = Arc::new(Book::default());
    let s = store(options(&p), TestJournal::new(book.clone())).await;
    create(&s, org_session("g1", "org-g", 1_000)).await;
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("{p}:{{o:org-g}}:s:g1");
    let cur: String = hget(&mut c, &key, "c").await;
    for (field, value) in [
        (cur.as_str(), "{not json"),
        ("v", "x"),
        ("u:9", "[]"),
        // The current record named by a field that is not a record field, or is absent.
        ("c", "v"),
        ("c", "r:9:gone:0"),
    ] {
        let saved: Vec<u8> = redis::cmd("HGET")
            .arg(&key)
            .arg(field)
            .query_async(&mut c)
            .await
            .unwrap_or_default();
        hset(&mut c, &key, field, value).await;
        // A fresh daemon must read it.
        let t = store(options(&p), TestJournal::new(book.clone())).await;
        let r = pre_exec(&t, "g1", 1, 1).await.map(|x| x.0);
        assert!(
            matches!(r, Err(StoreError::Corrupt { .. })),
            "{field}: {r:?}"
        );
        if saved.is_empty() {
            let _: () = redis::cmd("HDEL")
                .arg(&key)
                .arg(field)
                .query_async(&mut c)
                .await
                .unwrap();
        } else {
            hset(&mut c, &key, field, saved).await;
        }
    }
    cleanup(&p).await;
}

#[tokio::test]
async fn the_servers_durability_settings_are_read() {
    let _scripts = crate::support::SCRIPTS.read().await;
    let p = prefix("durability");
    let s = store(options(&p), TestJournal::new(Arc::new(Book::default()))).await;
    let d = s.server_durability().await.unwrap();
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let (_, aof): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(d.appendonly, aof);
    assert!(
        ["always", "everysec", "no"].contains(&d.appendfsync.as_str()),
        "{d:?}"
    );
    assert_eq!(d.is_strict(), aof == "yes" && d.appendfsync == "always");
}
