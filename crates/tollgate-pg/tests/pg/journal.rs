use std::collections::HashSet;

use tollgate_audit::{Event, WriteError};
use tollgate_pg::{PgError, PgJournal};
use tollgate_store::{Journal, StoreError};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_is_written_then_verified_and_resumed() {
    let s = migrated("chain").await;
    let j = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap();
    let durables: Vec<_> = (1..=200)
        .map(|i| j.submit(verdict(&format!("s{}", i % 7), i)))
        .collect();
    let mut indices = Vec::new();
    for d in durables {
        indices.push(d.await.unwrap().unwrap().index);
    }
    // Submission order is chain order.
    assert_eq!(indices, (0..200).collect::<Vec<u64>>());
    let st = j.pg_stats();
    assert_eq!(st.entries, 200);
    assert!(st.batches >= 1 && st.batches <= 200);
    j.close().await.unwrap();

    let reports = verify_all(&s.name).await;
    assert_eq!(reports.len(), 1);
    let sum = reports[0].result.as_ref().unwrap();
    assert_eq!(sum.entries, 200);
    assert_eq!(sum.next_index, 200);

    // Reopened, the chain continues where it was.
    let j = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap();
    let a = j.submit(verdict("later", 1)).await.unwrap().unwrap();
    assert_eq!(a.index, 200);
    j.close().await.unwrap();
    let reports = verify_all(&s.name).await;
    assert_eq!(reports[0].result.as_ref().unwrap().entries, 201);
}

#[tokio::test]
async fn a_second_journal_on_the_same_chain_is_refused() {
    let s = migrated("twice").await;
    let j = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap();
    let e = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap_err();
    assert_eq!(e, PgError::ChainLocked("daemon-a".into()));
    assert!(e.to_string().contains("another daemon"));
    // Another chain id is fine.
    let other = PgJournal::open(s.settings(), key(2), "daemon-b")
        .await
        .unwrap();
    other.close().await.unwrap();
    // Once the first is closed, the chain can be taken again.
    j.close().await.unwrap();
    let again = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap();
    again.close().await.unwrap();
    // A chain keeps its key.
    let e = PgJournal::open(s.settings(), key(9), "daemon-a")
        .await
        .unwrap_err();
    assert!(matches!(e, PgError::KeyMismatch { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_is_acknowledged_only_after_its_commit() {
    let s = migrated("ack").await;
    let j = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap();
    // Another session holds the entries table: the journal's insert waits on it.
    let locker = lock_entries(&s.name).await;
    let pending = tokio::spawn(j.submit(verdict("s", 1)));
    // Wait (bounded) until the journal's backend is waiting for that lock.
    let watcher = client().await.unwrap();
    let waiting = wait_for_lock_wait(&watcher, &s.name).await;
    assert!(waiting, "the journal's insert never blocked");
    assert!(!pending.is_finished(), "acknowledged before its commit");
    assert_eq!(count(&watcher, &s.name, "entries").await, 0);
    locker.batch_execute("COMMIT").await.unwrap();
    let a = pending.await.unwrap().unwrap().unwrap();
    assert_eq!(a.index, 0);
    assert_eq!(count(&watcher, &s.name, "entries").await, 1);
    j.close().await.unwrap();
}

/// Group commit's linger (`commit_linger`): after a batch of 4 or more, the next batch
/// waits (here up to an hour) for as many entries before committing, so an entry and four
/// more sent a moment later go in one commit; a shutdown ends the wait, and the entry waiting is
/// committed. The counts, not the time, are checked (the hour only makes the linger
/// certain; the shutdown's bound is a hang guard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_batch_fills_up_and_a_shutdown_ends_the_wait() {
    let s = migrated("linger").await;
    let mut settings = s.settings();
    settings.commit_linger = std::time::Duration::from_secs(3600);
    let j = std::sync::Arc::new(PgJournal::open(settings, key(1), "daemon-a").await.unwrap());
    // A batch of 5: the first entry blocked on a lock, five more queued behind it (a
    // lone entry, the first, never lingers: the batch before it was empty).
    let locker = lock_entries(&s.name).await;
    let first = tokio::spawn(j.submit(verdict("s", 1)));
    let watcher = client().await.unwrap();
    assert!(wait_for_lock_wait(&watcher, &s.name).await);
    let queued: Vec<_> = (2..=6)
        .map(|n| tokio::spawn(j.submit(verdict("s", n))))
        .collect();
    locker.batch_execute("COMMIT").await.unwrap();
    first.await.unwrap().unwrap().unwrap();
    for q in queued {
        q.await.unwrap().unwrap().unwrap();
    }
    let before = j.stats().batches;
    // Now one entry, and four more a moment later: the first waits for the other four
    // (without the linger it would be committed alone in that moment).
    let mut lingering = vec![tokio::spawn(j.submit(verdict("s", 7)))];
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    lingering.extend((8..=11).map(|n| tokio::spawn(j.submit(verdict("s", n)))));
    for l in lingering {
        l.await.unwrap().unwrap().unwrap();
    }
    assert_eq!(j.stats().batches, before + 1, "five entries, one commit");
    // One entry alone after a batch of five waits for more; the shutdown ends the wait
    // and it is committed.
    let waiting = tokio::spawn(j.submit(verdict("s", 12)));
    let closed = tokio::time::timeout(std::time::Duration::from_secs(60), j.close()).await;
    closed.expect("the shutdown ended the linger").unwrap();
    waiting.await.unwrap().unwrap().unwrap();
    assert_eq!(count(&watcher, &s.name, "entries").await, 12);
}

/// A session holding `schema`'s entries table (a transaction left open; `COMMIT` on the
/// client it returns lets the journal's inserts go on).
async fn lock_entries(schema: &str) -> tokio_postgres::Client {
    let locker = client().await.unwrap();
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE \"{schema}\".entries IN EXCLUSIVE MODE"
        ))
        .await
        .unwrap();
    locker
}

/// Wait (bounded) until some backend waits on a lock in a statement on `schema` (whose
/// name is unique to the test).
pub async fn wait_for_lock_wait(watcher: &tokio_postgres::Client, schema: &str) -> bool {
    for _ in 0..1000 {
        let n: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
                &[&format!("%{schema}%")],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_fails_submits_until_reconnected_and_nothing_is_written_twice() {
    let s = migrated("kill").await;
    let app = s.name.clone();
    let mut settings = s.settings();
    let sep = if url().contains('?') { '&' } else { '?' };
    settings.url = format!("{}{sep}application_name={app}", url());
    let j = PgJournal::open(settings, key(1), "daemon-a").await.unwrap();
    let admin = client().await.unwrap();
    let mut ok: Vec<(u64, tollgate_core::Digest)> = Vec::new();
    let mut failed = 0usize;
    let mut killed = false;
    let mut good_waves_after_kill = 0usize;
    let mut seq = 0u64;
    // Waves of 20 concurrent submissions. In wave 5 the writer's backend is killed in the
    // middle of its transaction (held at its insert by a table lock). Go on (bounded)
    // until 5 waves succeed after the kill.
    for wave in 0..2000 {
        let mut locker = client().await.unwrap();
        let lock = if wave == 5 {
            let tx = locker.transaction().await.unwrap();
            tx.batch_execute(&format!(
                "LOCK TABLE \"{}\".entries IN EXCLUSIVE MODE",
                s.name
            ))
            .await
            .unwrap();
            Some(tx)
        } else {
            None
        };
        let ds: Vec<_> = (0..20)
            .map(|_| {
                seq += 1;
                j.submit(verdict("s", seq))
            })
            .collect();
        if let Some(tx) = lock {
            assert!(
                wait_for_lock_wait(&admin, &s.name).await,
                "the batch never blocked"
            );
            let n: i64 = admin
                .query_one(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                    &[&app],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(n, 1, "one writer connection");
            killed = true;
            tx.commit().await.unwrap();
        }
        let mut wave_ok = true;
        for d in ds {
            match d.await {
                Ok(Some(a)) => ok.push((a.index, a.hash)),
                Ok(None) => panic!("no entry"),
                Err(StoreError::Journal { .. }) => {
                    failed += 1;
                    wave_ok = false;
                }
                Err(e) => panic!("{e}"),
            }
        }
        if wave == 5 {
            assert!(
                !wave_ok,
                "the killed transaction's entries were acknowledged"
            );
        }
        if killed && wave_ok {
            good_waves_after_kill += 1;
            if good_waves_after_kill == 5 {
                break;
            }
        }
        if killed && !wave_ok {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    assert!(failed > 0);
    assert_eq!(good_waves_after_kill, 5, "never recovered");
    let st = j.pg_stats();
    assert!(st.reconnects >= 1);
    j.close().await.unwrap();
    // Every acknowledged entry is stored with its hash, once; indices are unique.
    let c = client().await.unwrap();
    let rows = c
        .query(
            &format!(
                "SELECT idx, entry_hash FROM \"{}\".entries ORDER BY idx",
                s.name
            ),
            &[],
        )
        .await
        .unwrap();
    let stored: std::collections::HashMap<i64, Vec<u8>> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut seen = HashSet::new();
    for (idx, hash) in &ok {
        assert!(seen.insert(*idx), "index {idx} acknowledged twice");
        assert_eq!(
            stored.get(&i64::try_from(*idx).unwrap()),
            Some(&hash.0.to_vec())
        );
    }
    // Nothing but the acknowledged entries: the killed transaction left nothing.
    assert_eq!(st.lost_acks, 0);
    assert_eq!(rows.len(), ok.len());
    let reports = verify_all(&s.name).await;
    assert_eq!(
        reports[0].result.as_ref().unwrap().entries,
        u64::try_from(rows.len()).unwrap()
    );
}

#[tokio::test]
async fn submissions_after_shutdown_fail() {
    let s = migrated("shut").await;
    let j = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap();
    j.submit(verdict("s", 1)).await.unwrap();
    j.close().await.unwrap();
    j.close().await.unwrap();
    let e = j.submit(verdict("s", 2)).await.unwrap_err();
    assert!(
        e.to_string().contains(&WriteError::WriterGone.to_string()),
        "{e}"
    );
    let reports = verify_all(&s.name).await;
    assert_eq!(reports[0].result.as_ref().unwrap().entries, 1);
}

#[tokio::test]
async fn an_entry_that_does_not_encode_is_refused_and_the_chain_goes_on() {
    let s = migrated("enc").await;
    let j = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap();
    let long = "x".repeat(2000);
    let e = j.submit(verdict(&long, 1)).await.unwrap_err();
    assert!(e.to_string().contains("session_id"), "{e}");
    let a = j.submit(verdict("s", 1)).await.unwrap().unwrap();
    assert_eq!(a.index, 0);
    j.close().await.unwrap();
    let mut kinds = Vec::new();
    let c = client().await.unwrap();
    tollgate_pg::verify(&c, &s.name, None, &[], &mut |_, e| {
        kinds.push(e.event.kind())
    })
    .await
    .unwrap();
    assert_eq!(kinds, [1]);
    let _ = Event::from(verdict("s", 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_refuses_everything_until_it_is_back() {
    let s = migrated("down").await;
    let switch = Switch::start().await;
    let mut settings = s.settings();
    settings.url = switch.url();
    let j = PgJournal::open(settings.clone(), key(1), "daemon-a")
        .await
        .unwrap();
    let idle = PgJournal::open(settings, key(2), "daemon-b").await.unwrap();
    let mut acked = 0i64;
    let mut seq = 0u64;
    for _ in 0..10 {
        seq += 1;
        j.submit(verdict("s", seq)).await.unwrap();
        acked += 1;
    }
    switch.down();
    // While it is down, nothing is acknowledged, and settles fail too.
    for _ in 0..20 {
        seq += 1;
        assert!(j.submit(verdict("s", seq)).await.is_err());
    }
    assert!(
        tollgate_store::Arbiter::settle(&j, "x", 1, Default::default())
            .await
            .is_err()
    );
    assert!(!j.is_healthy());
    // A journal shut down while the server is away stops anyway.
    idle.close().await.unwrap();
    switch.up();
    // Back: submissions succeed again (bounded wait for the reconnect).
    let mut back = false;
    for _ in 0..1000 {
        seq += 1;
        if j.submit(verdict("s", seq)).await.is_ok() {
            acked += 1;
            back = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(back, "never served again");
    for _ in 0..10 {
        seq += 1;
        j.submit(verdict("s", seq)).await.unwrap();
        acked += 1;
    }
    // A batch sent as the server went away may have committed with its answer lost (the
    // switch cuts the answers; a batch is one statement, its own transaction): found at
    // the reconnect, counted, and not written again.
    let lost = i64::try_from(j.pg_stats().lost_acks).unwrap();
    j.close().await.unwrap();
    let c = client().await.unwrap();
    assert_eq!(
        count(&c, &s.name, "entries WHERE chain_id = 'daemon-a'").await,
        acked + lost
    );
    let reports = verify_all(&s.name).await;
    assert!(reports.iter().all(|r| r.result.is_ok()), "{reports:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_found_and_not_written_twice() {
    let s = migrated("lostack").await;
    let switch = Switch::start().await;
    let mut settings = s.settings();
    settings.url = switch.url();
    let j = PgJournal::open(settings, key(1), "daemon-a").await.unwrap();
    j.submit(verdict("s", 1)).await.unwrap();
    // The server commits entry 1, but the journal never hears it: the batch fails.
    switch.arm_lost_commit();
    let e = j.submit(verdict("s", 2)).await.unwrap_err();
    assert!(matches!(e, StoreError::Journal { .. }), "{e}");
    assert_eq!(
        switch.swallowed.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    // After the reconnect the chain goes on after the committed entry (bounded wait).
    let mut next = None;
    for _ in 0..1000 {
        if let Ok(Some(a)) = j.submit(verdict("s", 3)).await {
            next = Some(a);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let next = next.expect("never served again");
    assert_eq!(next.index, 2, "the lost batch holds index 1");
    let st = j.pg_stats();
    assert_eq!(st.lost_acks, 1);
    // The change whose answer was lost holds its place: settling it finds its entry.
    assert_eq!(
        tollgate_store::Arbiter::settle(&j, "s", 2, Default::default())
            .await
            .unwrap(),
        tollgate_store::Settled::Entry
    );
    j.close().await.unwrap();
    let c = client().await.unwrap();
    assert_eq!(count(&c, &s.name, "entries").await, 3);
    let reports = verify_all(&s.name).await;
    assert_eq!(reports[0].result.as_ref().unwrap().entries, 3);
}

/// Format version 4 records the shared budget's version; a chain registered in version 3
/// (before it) goes on in version 3, as its signed header says, so its records stay
/// readable; a new chain is version 4 and keeps the version.
#[tokio::test]
async fn a_version_3_chain_goes_on_in_version_3_and_a_new_one_is_version_4() {
    use tollgate_audit::format::{self, FileHeader};
    let s = migrated("v3chain").await;
    let c = client().await.unwrap();
    let old = key(3);
    let header = FileHeader::new_signed_version(3, &old, 0, 0, format::genesis_hash(), 1).encode();
    c.execute(
        &format!(
            "INSERT INTO \"{}\".chains (chain_id, key_id, public_key, format_version, header)
             VALUES ('old', $1, $2, 3, $3)",
            s.name
        ),
        &[
            &tollgate_audit::KeyId::of(old.verifying_key().as_bytes()).to_string(),
            &old.verifying_key().as_bytes().as_slice(),
            &header,
        ],
    )
    .await
    .unwrap();
    let with_version = |session: &str| {
        let mut e = verdict(session, 1);
        e.set_budget_version(42);
        e
    };
    let j = PgJournal::open(s.settings(), old, "old").await.unwrap();
    j.submit(with_version("a")).await.unwrap();
    j.close().await.unwrap();
    let k = PgJournal::open(s.settings(), key(4), "new").await.unwrap();
    k.submit(with_version("b")).await.unwrap();
    k.close().await.unwrap();
    let mut seen = Vec::new();
    let reports = tollgate_pg::verify(&c, &s.name, None, &[], &mut |chain, e| {
        if let Event::Session(ev) = &e.event {
            seen.push((chain.to_owned(), ev.budget_version()));
        }
    })
    .await
    .unwrap();
    assert!(reports.iter().all(|r| r.result.is_ok()), "{reports:?}");
    seen.sort();
    assert_eq!(seen, [("new".to_owned(), 42), ("old".to_owned(), 0)]);
    // Reopened, the old chain is still version 3 (its tail parses as such).
    let j = PgJournal::open(s.settings(), key(3), "old").await.unwrap();
    j.submit(with_version("c")).await.unwrap();
    j.close().await.unwrap();
    assert!(verify_all(&s.name).await.iter().all(|r| r.result.is_ok()));
}

fn policy_set(
    digest: u8,
    cause: tollgate_audit::PolicySetCause,
) -> tollgate_audit::PolicySetRecord {
    tollgate_audit::PolicySetRecord {
        timestamp_ns: 1_796_040_000_000_000_000,
        digest: tollgate_core::Digest([digest; 32]),
        policies: 2,
        default_deny: false,
        trip_on_refusal: false,
        cause,
        shadow_policies: 0,
        shadow_set: false,
    }
}

/// Format versions 6 and 7 in PostgreSQL: a chain registered now (version 8) holds
/// policy-set entries (record kind 9, no place in any session's history, so no claim; with
/// their shadow counts) and verdicts with policy notes, shadow notes and recorded params,
/// signed and linked like every entry, in the order submitted; the chain verifies and the
/// verifier gives them back as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_chain_holds_policy_sets_policy_notes_shadow_notes_and_params() {
    use tollgate_audit::{
        PolicyEffect, PolicyNote, PolicySetCause, RecordedParams, SessionEvent, ShadowNote,
    };
    let s = migrated("v6chain").await;
    let j = PgJournal::open(s.settings(), key(6), "d6").await.unwrap();
    assert_eq!(j.format_version(), 8);
    assert_eq!(tollgate_pg::CHAIN_FORMAT_VERSION, 8);
    let start = j.submit_policy_set(tollgate_audit::PolicySetRecord {
        shadow_policies: 1,
        ..policy_set(0xa1, PolicySetCause::Start)
    });
    let mut refused = verdict("s", 1);
    if let SessionEvent::Verdict(v) = &mut refused {
        v.verdict = tollgate_core::Verdict::Deny;
        v.deny_reason = Some(tollgate_core::DenyReason::PolicyViolation);
        v.reason = tollgate_core::Reason::PolicyDeny;
        v.budget_after = v.budget_before;
        v.policy = Some(PolicyNote {
            set_digest: tollgate_core::Digest([0xa1; 32]),
            effect: PolicyEffect::Forbid,
            policy_id: Some("no-shell".into()),
            decided: true,
            tripped: false,
            labels: Vec::new(),
        });
        v.shadow = vec![ShadowNote {
            name: "shadow-rule".into(),
            verdict: tollgate_core::Verdict::Allow,
            reason: "within_thresholds".into(),
            policy_id: None,
        }];
        v.params = Some(RecordedParams::Redacted(r#"{"k":"[REDACTED]"}"#.into()));
    }
    let a = j.submit(refused.clone());
    // Two policy sets in one batch: neither takes a claim, so neither conflicts.
    let reload = j.submit_policy_set(policy_set(0xb2, PolicySetCause::Reload));
    let again = j.submit_policy_set(policy_set(0xb2, PolicySetCause::Reload));
    let start = start.await.unwrap();
    let a = a.await.unwrap().unwrap();
    let reload = reload.await.unwrap();
    let again = again.await.unwrap();
    assert_eq!(
        [start.index, a.index, reload.index, again.index],
        [0, 1, 2, 3]
    );
    j.close().await.unwrap();
    let c = client().await.unwrap();
    assert_eq!(count(&c, &s.name, "entries").await, 4);
    assert_eq!(count(&c, &s.name, "claims").await, 1);
    assert_eq!(
        count(&c, &s.name, "entries WHERE kind = 9 AND session_id IS NULL").await,
        3
    );
    let mut seen = Vec::new();
    let reports = tollgate_pg::verify(&c, &s.name, None, &[], &mut |_, e| {
        seen.push(e.event.clone());
    })
    .await
    .unwrap();
    assert!(reports.iter().all(|r| r.result.is_ok()), "{reports:?}");
    assert_eq!(seen.len(), 4);
    assert!(
        matches!(&seen[0], Event::PolicySet(r) if r.digest.0 == [0xa1; 32] && r.cause == PolicySetCause::Start && r.shadow_policies == 1),
        "{seen:?}"
    );
    assert_eq!(seen[1], Event::Session(refused));
    assert!(matches!(&seen[2], Event::PolicySet(r) if r.cause == PolicySetCause::Reload));
    // Reopened, the chain goes on after its policy-set tail.
    let j = PgJournal::open(s.settings(), key(6), "d6").await.unwrap();
    let next = j
        .submit_policy_set(policy_set(0xc3, PolicySetCause::Start))
        .await
        .unwrap();
    assert_eq!(next.index, 4);
    j.submit(verdict("s", 2)).await.unwrap();
    j.close().await.unwrap();
    assert!(verify_all(&s.name).await.iter().all(|r| r.result.is_ok()));
}

/// A chain registered in format version 5 goes on in version 5 (its signed header says
/// so): its records stay readable and it still takes session entries, but it cannot hold
/// a policy set, which is refused naming the chain, with nothing written.
#[tokio::test]
async fn a_version_5_chain_goes_on_in_version_5_and_refuses_a_policy_set() {
    use tollgate_audit::format::{self, FileHeader};
    let s = migrated("v5chain").await;
    let c = client().await.unwrap();
    let old = key(5);
    let header = FileHeader::new_signed_version(5, &old, 0, 0, format::genesis_hash(), 1).encode();
    c.execute(
        &format!(
            "INSERT INTO \"{}\".chains (chain_id, key_id, public_key, format_version, header)
             VALUES ('old5', $1, $2, 5, $3)",
            s.name
        ),
        &[
            &tollgate_audit::KeyId::of(old.verifying_key().as_bytes()).to_string(),
            &old.verifying_key().as_bytes().as_slice(),
            &header,
        ],
    )
    .await
    .unwrap();
    let j = PgJournal::open(s.settings(), old, "old5").await.unwrap();
    assert_eq!(j.format_version(), 5);
    j.submit(verdict("a", 1)).await.unwrap();
    let e = j
        .submit_policy_set(policy_set(1, tollgate_audit::PolicySetCause::Start))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, tollgate_audit::WriteError::Refused(m) if m.contains("`old5` is format version 5")),
        "{e}"
    );
    j.submit(verdict("a", 2)).await.unwrap();
    j.close().await.unwrap();
    assert_eq!(count(&c, &s.name, "entries").await, 2);
    let reports = verify_all(&s.name).await;
    assert_eq!(reports[0].result.as_ref().unwrap().entries, 2);
}

/// A known-answer log file stored as chain `ka` in a new schema `schema` (its header in
/// `chains`, each record a row), with the number of records stored.
async fn known_answer_chain(
    name: &str,
    version: i16,
    schema: &str,
) -> (crate::common::Schema, tokio_postgres::Client, usize) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tollgate-audit/tests/data")
        .join(name);
    let file = std::fs::read(path).unwrap();
    let (header, mut rest) = file.split_at(170);
    let s = migrated(schema).await;
    let c = client().await.unwrap();
    let public = key(1).verifying_key();
    c.execute(
        &format!(
            "INSERT INTO \"{}\".chains (chain_id, key_id, public_key, format_version, header)
             VALUES ('ka', $1, $2, $3, $4)",
            s.name
        ),
        &[
            &tollgate_audit::KeyId::of(public.as_bytes()).to_string(),
            &public.as_bytes().as_slice(),
            &version,
            &header,
        ],
    )
    .await
    .unwrap();
    let mut idx = 0i64;
    while !rest.is_empty() {
        let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize + 4;
        let (record, tail) = rest.split_at(len);
        c.execute(
            &format!(
                "INSERT INTO \"{}\".entries (chain_id, idx, record, entry_hash, kind)
                 VALUES ('ka', $1, $2, $3, $4)",
                s.name
            ),
            &[
                &idx,
                &record,
                &tollgate_audit::format::sha256(record).0.as_slice(),
                &i16::from(record[4]),
            ],
        )
        .await
        .unwrap();
        idx += 1;
        rest = tail;
    }
    (s, c, usize::try_from(idx).unwrap())
}

/// The events of the known-answer chain in `schema`, verified whole with the file's key;
/// their kinds are `kinds`.
async fn known_answer_events(c: &tokio_postgres::Client, schema: &str, kinds: &[u8]) -> Vec<Event> {
    let mut seen = Vec::new();
    let reports = tollgate_pg::verify(c, schema, None, &[key(1).verifying_key()], &mut |_, e| {
        seen.push(e.event.clone());
    })
    .await
    .unwrap();
    assert!(reports[0].result.is_ok(), "{reports:?}");
    let seen_kinds: Vec<u8> = seen.iter().map(Event::kind).collect();
    assert_eq!(seen_kinds, kinds);
    seen
}

/// A journal with the known-answer file's key on its chain in `s`, which goes on in format
/// `version`.
async fn known_answer_journal(s: &crate::common::Schema, version: u16) -> PgJournal {
    let j = PgJournal::open(s.settings(), key(1), "ka").await.unwrap();
    assert_eq!(j.format_version(), version);
    j
}

/// How many entries the first chain of `schema` verifies with.
async fn verified_entries(schema: &str) -> u64 {
    verify_all(schema).await[0].result.as_ref().unwrap().entries
}

/// A version-6 chain in PostgreSQL is byte for byte a version-6 log file: the known-answer
/// file `known-answer-v6.log` (docs/audit-format.md, "Known answers": two policy sets, a
/// session opened under the first, verdicts with policy notes) stored as a chain verifies
/// with the PostgreSQL verifier, gives back its six entries, and a journal with its key
/// continues it in version 6 (a policy set and a verdict linked after its last record);
/// a policy set with shadow policies (version 7) is refused there, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_6_known_answer_file_is_a_chain() {
    let (s, c, stored) = known_answer_chain("known-answer-v6.log", 6, "kav6").await;
    assert_eq!(stored, 6);
    known_answer_events(&c, &s.name, &[9, 4, 1, 1, 9, 1]).await;
    // A journal with the file's key goes on after its last record, in version 6.
    let j = known_answer_journal(&s, 6).await;
    let shadowed = tollgate_audit::PolicySetRecord {
        shadow_policies: 1,
        ..policy_set(7, tollgate_audit::PolicySetCause::Reload)
    };
    let e = j.submit_policy_set(shadowed).await.unwrap_err();
    assert!(
        matches!(&e, tollgate_audit::WriteError::Refused(m) if m.contains("cannot record shadow policies")),
        "{e}"
    );
    let a = j
        .submit_policy_set(policy_set(7, tollgate_audit::PolicySetCause::Reload))
        .await
        .unwrap();
    assert_eq!(a.index, 6);
    j.submit(verdict("s2", 1)).await.unwrap();
    j.close().await.unwrap();
    assert_eq!(verified_entries(&s.name).await, 8);
}

/// The version-7 known-answer file (shadow notes, recorded params, a set in shadow mode)
/// is a chain too, and a journal with its key continues it in version 7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_7_known_answer_file_is_a_chain() {
    let (s, c, stored) = known_answer_chain("known-answer-v7.log", 7, "kav7").await;
    assert_eq!(stored, 7);
    let seen = known_answer_events(&c, &s.name, &[9, 4, 1, 1, 1, 9, 1]).await;
    assert!(matches!(&seen[5], Event::PolicySet(p) if p.shadow_set));
    let j = known_answer_journal(&s, 7).await;
    let shadowed = tollgate_audit::PolicySetRecord {
        shadow_policies: 2,
        ..policy_set(7, tollgate_audit::PolicySetCause::Reload)
    };
    assert_eq!(j.submit_policy_set(shadowed).await.unwrap().index, 7);
    j.close().await.unwrap();
    assert_eq!(verified_entries(&s.name).await, 8);
}

/// `verdict(session, seq)` with a random draw (format version 8).
fn with_draw(session: &str, seq: u64) -> tollgate_audit::SessionEvent {
    let mut e = verdict(session, seq);
    if let tollgate_audit::SessionEvent::Verdict(v) = &mut e {
        v.draw = tollgate_audit::Draw::new(0.5);
    }
    e
}

/// The version-8 known-answer file (an upstream and a draw on an ALLOW, a draw on a
/// probabilistic DENY) is a chain, and a journal with its key continues it in version 8,
/// draws included; a version-7 chain cannot record a draw: refused, nothing written, and
/// the chain goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_8_known_answer_file_is_a_chain_and_a_version_7_chain_refuses_a_draw() {
    let (s, c, stored) = known_answer_chain("known-answer-v8.log", 8, "kav8").await;
    assert_eq!(stored, 4);
    let seen = known_answer_events(&c, &s.name, &[9, 4, 1, 1]).await;
    let Event::Session(tollgate_audit::SessionEvent::Verdict(v)) = &seen[2] else {
        panic!("{seen:?}")
    };
    assert_eq!(v.upstream.as_deref(), Some("kit"));
    assert_eq!(v.draw.map(tollgate_audit::Draw::value), Some(0.25));
    let j = known_answer_journal(&s, 8).await;
    assert_eq!(
        j.submit(with_draw("s8", 1)).await.unwrap().unwrap().index,
        4
    );
    j.close().await.unwrap();
    assert_eq!(verified_entries(&s.name).await, 5);

    let (s7, c7, _) = known_answer_chain("known-answer-v7.log", 7, "kav7draw").await;
    let j = known_answer_journal(&s7, 7).await;
    let e = j.submit(with_draw("s7", 1)).await.unwrap_err();
    assert!(e.to_string().contains("draw"), "{e}");
    assert_eq!(j.submit(verdict("s7", 1)).await.unwrap().unwrap().index, 7);
    j.close().await.unwrap();
    assert_eq!(count(&c7, &s7.name, "entries").await, 8);
    assert!(verify_all(&s7.name).await[0].result.is_ok());
}
