//! Faults: a daemon killed between its Redis write and its audit commit (void: state and
//! budget reverted; entry: kept), by the next apply or by the sweeper; Redis unreachable,
//! silent, or gone and back.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tollgate_core::{Money, Verdict};
use tollgate_store::{BudgetKey, SessionStore, StoreError};

use crate::support::{
    cleanup, create, hash_fields, hget, hset, markers, options, org_session, pre_exec, prefix,
    store, unconfirmed, Book, Claim, TestJournal, COMMIT_THEN_HANG, HANG, REDIS,
};

/// A daemon writes an ALLOW to Redis, then dies with its journal in `mode`; another
/// daemon then settles it (by applying, or by sweeping). Returns (book, the survivor's
/// verdict for the same nonce resent, the organization budget's remaining).
async fn crash(mode: u8, by_sweep: bool, name: &str) -> (Arc<Book>, Verdict, Money, String) {
    let p = prefix(name);
    let book = Arc::new(Book::default());
    let ja = TestJournal::new(book.clone());
    let a = store(options(&p), ja.clone()).await;
    create(&a, org_session("c1", "org-c", 1_000)).await;
    let (d, durable) = pre_exec(&a, "c1", 42, 300).await.unwrap();
    durable.await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    // The next change is written to Redis; then the daemon dies.
    ja.mode.store(mode, Ordering::SeqCst);
    let (d, durable) = pre_exec(&a, "c1", 43, 200).await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    drop(durable);
    drop(a);
    let key = format!("{p}:{{o:org-c}}:s:c1");
    assert_eq!(markers(&key).await, vec!["u:3".to_owned()]);

    let mut opts = options(&p);
    opts.grace = Duration::from_millis(200);
    let b = store(opts, TestJournal::new(book.clone())).await;
    if by_sweep {
        // Until grace has passed the sweeper leaves the marker alone.
        while !markers(&key).await.is_empty() {
            b.sweep().await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The agent resends its unanswered call, with the same nonce, through b.
    let (d, durable) = pre_exec(&b, "c1", 43, 200).await.unwrap();
    durable.await.unwrap();
    let budget = b
        .budget(&BudgetKey::Organization("org-c".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b.stats().settled, 1);
    // An auditor folds the budget from the book alone, by its versions (the void names
    // the voided write and its give-back), and gets what Redis holds.
    let (top, left) = crate::support::fold_budget(&book, "org-c", 1_000);
    assert_eq!(
        top,
        crate::support::budget_version(&format!("{p}:{{o:org-c}}:b")).await
    );
    assert_eq!(Money(left), budget.remaining);
    cleanup(&p).await;
    (book, d.verdict, budget.remaining, p)
}

#[tokio::test]
async fn a_change_whose_entry_never_committed_is_voided_and_reverted() {
    let _scripts = crate::support::SCRIPTS.read().await;
    for by_sweep in [false, true] {
        let (book, verdict, remaining, _) = crash(HANG, by_sweep, "void").await;
        let claims = book.claims.lock().unwrap().clone();
        assert_eq!(claims.get(&("c1".into(), 3)), Some(&Claim::Void));
        // Reverted: the nonce was unused again, so the resent call is allowed (seq 4),
        // and the budget holds the first call and the resent one only.
        assert_eq!(verdict, Verdict::Allow);
        assert_eq!(claims.get(&("c1".into(), 4)), Some(&Claim::Entry));
        assert_eq!(remaining, Money(1_000 - 300 - 200));
        let allows = book.allows();
        assert_eq!(allows.iter().filter(|a| a.1 == 43).count(), 1);
    }
}

#[tokio::test]
async fn a_change_whose_entry_committed_is_kept() {
    let _scripts = crate::support::SCRIPTS.read().await;
    for by_sweep in [false, true] {
        let (book, verdict, remaining, _) = crash(COMMIT_THEN_HANG, by_sweep, "entry").await;
        let claims = book.claims.lock().unwrap().clone();
        assert_eq!(claims.get(&("c1".into(), 3)), Some(&Claim::Entry));
        // Kept: the nonce is used, the resend is a replay; the budget holds both calls.
        assert_eq!(verdict, Verdict::Deny);
        assert_eq!(remaining, Money(1_000 - 300 - 200));
        assert_eq!(book.allows().iter().filter(|a| a.1 == 43).count(), 1);
    }
}

#[tokio::test]
async fn unreachable_or_silent_redis_is_an_error_not_a_hang() {
    let _scripts = crate::support::SCRIPTS.read().await;
    let book = Arc::new(Book::default());
    let mut o = options("tgtest-down");
    o.url = "redis://127.0.0.1:1".into();
    o.command_timeout = Duration::from_millis(500);
    let arb = Arc::new(crate::support::TestArbiter(book.clone()));
    let r =
        tollgate_redis::RedisStore::connect(o.clone(), TestJournal::new(book.clone()), arb.clone())
            .await;
    assert!(matches!(r, Err(StoreError::Backend { .. })), "{r:?}");
    // TLS (ring provider) to a server that speaks plain text: a handshake error.
    o.url = "rediss://127.0.0.1:6379".into();
    let r =
        tollgate_redis::RedisStore::connect(o.clone(), TestJournal::new(book.clone()), arb.clone())
            .await;
    assert!(matches!(r, Err(StoreError::Backend { .. })), "{r:?}");
    // A server that accepts and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut socks = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            socks.push(s);
        }
    });
    o.url = format!("redis://{addr}");
    let r = tollgate_redis::RedisStore::connect(o, TestJournal::new(book.clone()), arb).await;
    assert!(matches!(r, Err(StoreError::Backend { .. })), "{r:?}");
    hold.abort();
}

/// A TCP proxy to the real Redis that can be cut and restored.
struct Proxy {
    accept: tokio::task::JoinHandle<()>,
    conns: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

async fn proxy(listener: TcpListener) -> Proxy {
    let conns = Arc::new(std::sync::Mutex::new(Vec::new()));
    let c2 = conns.clone();
    let accept = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let t = tokio::spawn(async move {
                if let Ok(mut out) = tokio::net::TcpStream::connect("127.0.0.1:6379").await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
            c2.lock().unwrap().push(t);
        }
    });
    Proxy { accept, conns }
}

impl Proxy {
    fn cut(self) {
        self.accept.abort();
        for t in self.conns.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_gone_refuses_and_service_resumes_when_it_is_back() {
    let _scripts = crate::support::SCRIPTS.read().await;
    let p = prefix("outage");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let px = proxy(listener).await;
    let book = Arc::new(Book::default());
    let mut o = options(&p);
    o.url = format!("redis://{addr}");
    // Long enough for every command through the proxy on a loaded machine; the refusals
    // below come from the cut connection, not from this timeout.
    o.command_timeout = Duration::from_secs(3);
    let s = store(o, TestJournal::new(book)).await;
    create(&s, org_session("o1", "org-o", 1_000)).await;
    let (d, durable) = pre_exec(&s, "o1", 1, 10).await.unwrap();
    durable.await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    px.cut();
    let r = pre_exec(&s, "o1", 2, 10).await;
    assert!(
        matches!(r, Err(StoreError::Backend { .. })),
        "{:?}",
        r.map(|x| x.0)
    );
    // Back on the same address: the store reconnects by itself.
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let px = proxy(listener).await;
    let mut ok = None;
    for _ in 0..100 {
        match pre_exec(&s, "o1", 2, 10).await {
            Ok((d, durable)) => {
                durable.await.unwrap();
                ok = Some(d.verdict);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert_eq!(ok, Some(Verdict::Allow));
    let b = s
        .budget(&BudgetKey::Organization("org-o".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b.remaining, Money(980));
    px.cut();
    let _ = REDIS;
    cleanup(&p).await;
}

#[tokio::test]
async fn a_flushed_script_is_loaded_again() {
    let _scripts = crate::support::SCRIPTS.write().await;
    let p = prefix("noscript");
    let s = store(options(&p), TestJournal::new(Arc::new(Book::default()))).await;
    create(&s, org_session("n1", "org-n", 1_000)).await;
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut c)
        .await
        .unwrap();
    let before = s.stats().round_trips;
    let (d, durable) = pre_exec(&s, "n1", 1, 10).await.unwrap();
    durable.await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    // NOSCRIPT, SCRIPT LOAD, the pipeline again.
    assert_eq!(s.stats().round_trips - before, 3);
    cleanup(&p).await;
}

/// An arbiter that answers only once the test lets it.
#[derive(Debug)]
struct Gated {
    book: Arc<Book>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl tollgate_store::Arbiter for Gated {
    fn settle<'a>(
        &'a self,
        session_id: &'a str,
        session_seq: u64,
        budget: tollgate_store::VoidBudget,
    ) -> tollgate_store::SettleFuture<'a> {
        Box::pin(async move {
            let _go = self.gate.acquire().await;
            Ok(self.book.settle(session_id, session_seq, budget))
        })
    }
}

/// A settlement holds the budget from before its void is decided until its give-back is
/// written, so the void can name the give-back's version: another daemon's spend on
/// another session of the budget, attempted meanwhile, waits and goes in after it; the
/// budget then folds from the book alone, by its versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_holds_the_budget_until_its_give_back() {
    let _scripts = crate::support::SCRIPTS.read().await;
    let p = prefix("hold");
    let book = Arc::new(Book::default());
    let ja = TestJournal::new(book.clone());
    let a = store(options(&p), ja.clone()).await;
    create(&a, org_session("h1", "org-h", 1_000)).await;
    create(&a, org_session("h2", "org-h", 1_000)).await;
    let (d, durable) = pre_exec(&a, "h1", 1, 300).await.unwrap();
    durable.await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    // Written to Redis, never committed: the daemon dies.
    ja.mode.store(HANG, Ordering::SeqCst);
    let (d, durable) = pre_exec(&a, "h1", 2, 200).await.unwrap();
    assert_eq!(d.verdict, Verdict::Allow);
    drop(durable);
    drop(a);

    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut ob = options(&p);
    ob.grace = Duration::from_millis(200);
    let arbiter = Arc::new(Gated {
        book: book.clone(),
        gate: gate.clone(),
    });
    let b = Arc::new(
        tollgate_redis::RedisStore::connect(ob, TestJournal::new(book.clone()), arbiter)
            .await
            .unwrap(),
    );
    let c = Arc::new(store(options(&p), TestJournal::new(book.clone())).await);
    let bkey = format!("{p}:{{o:org-h}}:b");
    let client = redis::Client::open(REDIS).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // B settles h1 (after grace): it holds the budget, then waits for the arbiter.
    let b2 = b.clone();
    let settling = tokio::spawn(async move {
        loop {
            b2.sweep().await.unwrap();
            if b2.stats().settled > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    loop {
        let s: Option<String> = hget(&mut conn, &bkey, "s").await;
        if s.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // C spends on h2 meanwhile: it waits (re-reading) while the budget is held.
    let before = c.stats().round_trips;
    let c2 = c.clone();
    let spend = tokio::spawn(async move {
        let (d, durable) = pre_exec(&*c2, "h2", 3, 100).await.unwrap();
        durable.await.unwrap();
        d.verdict
    });
    while c.stats().round_trips < before + 4 && !spend.is_finished() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(!spend.is_finished(), "C wrote while the budget was held");
    gate.add_permits(100);
    settling.await.unwrap();
    assert_eq!(spend.await.unwrap(), Verdict::Allow);
    // The void gave 200 back; C took 100: 1000 − 300 − 100.
    let budget = c
        .budget(&BudgetKey::Organization("org-h".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(budget.remaining, Money(600));
    let (top, left) = crate::support::fold_budget(&book, "org-h", 1_000);
    assert_eq!(top, crate::support::budget_version(&bkey).await);
    assert_eq!(Money(left), budget.remaining);
    cleanup(&p).await;
}

/// The records and indexes a decision leaves behind: after confirmed changes and one
/// that never commits (its daemon hangs), the session hash holds exactly that change's
/// marker and, beside it, `p:<seq>` naming the record field it replaced (the record at the
/// version before, byte for byte and never copied, so a void restores exactly that); the unconfirmed index names
/// exactly that change (a sweeper can find it; nothing confirmed is left in it). Fails if
/// the script copies the wrong record, if a write's drop or its index `ZREM` misses or
/// takes the wrong change, or if the confirmer leaves markers of confirmed changes.
#[tokio::test]
async fn only_the_unconfirmed_change_is_marked_and_indexed_with_the_record_it_replaced() {
    let _scripts = crate::support::SCRIPTS.read().await;
    let p = prefix("index");
    let book = Arc::new(Book::default());
    let ja = TestJournal::new(book.clone());
    let a = store(options(&p), ja.clone()).await;
    create(&a, org_session("x1", "org-x", 1_000_000)).await;
    for nonce in 1..=4u64 {
        let (_, durable) = pre_exec(&a, "x1", nonce, 10).await.unwrap();
        durable.await.unwrap();
    }
    let key = format!("{p}:{{o:org-x}}:s:x1");
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    // An idle session whose changes are all confirmed: the confirmer (in the background,
    // a round trip after each fsync: waited for, not timed) took every marker, record
    // before and index member off.
    let cur: String = hget(&mut c, &key, "c").await;
    assert!(cur.starts_with("r:5:"), "{cur}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (fields, index) = (hash_fields(&key).await, unconfirmed(&p).await);
        if fields == ["c", "d", cur.as_str(), "v"] && index.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not confirmed within 20 s: fields {fields:?}, index {index:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The record as it stands at version 5 (the opening and four decisions).
    let before: Vec<u8> = hget(&mut c, &key, &cur).await;
    ja.mode.store(HANG, Ordering::SeqCst);
    // Written (the script and the index's ZADD) before pre_exec returns; never confirmed.
    let (_, durable) = pre_exec(&a, "x1", 5, 10).await.unwrap();
    let now: String = hget(&mut c, &key, "c").await;
    assert!(now.starts_with("r:6:"), "{now}");
    let mut want = vec!["c", "d", "p:6", cur.as_str(), now.as_str(), "u:6", "v"];
    want.sort_unstable();
    assert_eq!(hash_fields(&key).await, want, "fields of the session hash");
    // p:6 names the field still holding the record change 6 replaced: never copied.
    let named: String = hget(&mut c, &key, "p:6").await;
    assert_eq!(named, cur, "p:6 names the record change 6 replaced");
    let prev: Vec<u8> = hget(&mut c, &key, &named).await;
    assert_eq!(
        prev, before,
        "the record before is byte for byte what it was"
    );
    let decoded = tollgate_redis::cas::decode_stored(&prev, 1 << 20, 0).unwrap();
    assert_eq!(decoded.seq, 5);
    assert_eq!(unconfirmed(&p).await, ["o:org-x\x1fx1\x1f6"]);
    drop(durable);
    drop(a);
    cleanup(&p).await;
}

/// Milliseconds until `key` expires (-1: no expiry, -2: no key).
async fn pttl(key: &str) -> i64 {
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap()
}

/// An agent's close (`Change::End`) sets no expiry on the session's hash while it is
/// unconfirmed: a hash that expired with it would leave a close neither in the log nor
/// voidable. Confirmed, the hash expires (`session_ttl`); written and never committed (its
/// daemon died), it is voided and the session is back, with no expiry, its `loc` key
/// neither (a daemon that never cached it still finds it) and still in the index;
/// committed and never confirmed, the settlement that keeps it sets the expiry. Fails on
/// the `loc` key with a close that sets its expiry when it is written.
#[tokio::test]
async fn an_ended_session_expires_only_once_its_close_is_confirmed() {
    use tollgate_audit::CloseReason;
    use tollgate_store::{ops, Change};
    let _scripts = crate::support::SCRIPTS.read().await;
    let close = |s: &mut tollgate_store::Session| {
        Change::End((), ops::close(s, CloseReason::Agent, 2_000).into())
    };
    for mode in [crate::support::COMMIT, HANG, COMMIT_THEN_HANG] {
        let p = prefix("ttl");
        let book = Arc::new(Book::default());
        let ja = TestJournal::new(book.clone());
        let a = store(options(&p), ja.clone()).await;
        create(&a, org_session("e1", "org-e", 1_000)).await;
        let key = format!("{p}:{{o:org-e}}:s:e1");
        ja.mode.store(mode, Ordering::SeqCst);
        let ((), durable) = a.apply("e1", close).await.unwrap();
        let loc = format!("{p}:loc:e1");
        let live = || async {
            let client = redis::Client::open(REDIS).unwrap();
            let mut c = client.get_multiplexed_async_connection().await.unwrap();
            let m: bool = redis::cmd("SISMEMBER")
                .arg(format!("{p}:idx"))
                .arg("e1")
                .query_async(&mut c)
                .await
                .unwrap();
            m
        };
        if mode == crate::support::COMMIT {
            durable.await.unwrap();
            crate::support::wait_confirmed(&key).await;
            assert!(pttl(&key).await > 0, "a confirmed close expires");
            assert!(pttl(&loc).await > 0, "and so does its loc key");
            assert!(!live().await, "and it leaves the index");
            assert!(a.get("e1").await.unwrap().is_none());
            cleanup(&p).await;
            continue;
        }
        // The daemon dies with its close written, marked unconfirmed.
        drop(durable);
        drop(a);
        assert_eq!(markers(&key).await, vec!["u:2".to_owned()]);
        assert_eq!(pttl(&key).await, -1, "an unconfirmed close sets no expiry");
        assert_eq!(pttl(&loc).await, -1, "nor on its loc key");
        assert!(live().await, "and leaves it in the index");
        let mut opts = options(&p);
        opts.grace = Duration::from_millis(200);
        let b = store(opts, TestJournal::new(book.clone())).await;
        while !markers(&key).await.is_empty() {
            b.sweep().await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let claim = book.claims.lock().unwrap().get(&("e1".into(), 2)).copied();
        if mode == HANG {
            // Voided: the session was never closed, and lives on.
            assert_eq!(claim, Some(Claim::Void));
            assert!(b.get("e1").await.unwrap().is_some());
            assert_eq!(pttl(&key).await, -1);
            // Findable by a daemon that never cached it, for as long as it lives.
            assert_eq!(
                pttl(&loc).await,
                -1,
                "a live session's loc key never expires"
            );
            assert!(live().await);
            let fresh = store(options(&p), TestJournal::new(book.clone())).await;
            assert!(fresh.get("e1").await.unwrap().is_some());
        } else {
            // Kept: the settlement sets the expiry the confirmer did not.
            assert_eq!(claim, Some(Claim::Entry));
            assert!(b.get("e1").await.unwrap().is_none());
            assert!(pttl(&key).await > 0, "a settled close expires");
            assert!(pttl(&loc).await > 0, "and so does its loc key");
            assert!(!live().await, "and it leaves the index");
        }
        cleanup(&p).await;
    }
}

/// An opening whose pipeline is cut after its staged record (the connection dropped
/// before the script ran) leaves a session hash holding only that record, and its index
/// member (the pipeline's `ZADD` comes first). It is no session: reads say NotFound, the
/// id can be opened, and the sweeper deletes the record and the member. Fails if a hash of
/// staged records reads as corrupt, or if the sweeper leaves the record behind.
#[tokio::test]
async fn an_opening_cut_after_its_staged_record_is_swept() {
    let _scripts = crate::support::SCRIPTS.read().await;
    let p = prefix("orphan");
    let key = format!("{p}:{{o:org-o}}:s:o1");
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    hset(
        &mut c,
        &key,
        "r:1:dead-daemon:0",
        "a record nobody made current",
    )
    .await;
    let _: () = redis::cmd("ZADD")
        .arg(format!("{p}:unconfirmed"))
        .arg(0)
        .arg("o:org-o\x1fo1\x1f1")
        .query_async(&mut c)
        .await
        .unwrap();
    let mut o = options(&p);
    o.grace = Duration::from_millis(1);
    let s = store(o, TestJournal::new(Arc::new(Book::default()))).await;
    assert!(s.get("o1").await.unwrap().is_none());
    s.sweep().await.unwrap();
    // The confirmer takes the index member off in the background (waited for up to 20 s).
    for _ in 0..2_000 {
        if unconfirmed(&p).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(hash_fields(&key).await, Vec::<String>::new());
    assert_eq!(unconfirmed(&p).await, Vec::<String>::new());
    create(&s, org_session("o1", "org-o", 1_000)).await;
    let (v, _) = pre_exec(&s, "o1", 1, 10).await.unwrap();
    assert_eq!(v.verdict, Verdict::Allow);
    drop(s);
    cleanup(&p).await;
}
