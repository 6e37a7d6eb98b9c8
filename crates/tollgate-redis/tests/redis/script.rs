//! The CAS script and its Rust fake answer a table of cases identically, and leave the
//! same hashes behind.

use redis::Value;
use tollgate_redis::cas::{CasReply, CasRequest, Fields};
use tollgate_redis::script::{keys_and_args, settle_keys_and_args, Fake, SettleRequest, CAS_LUA};

use crate::support::{cleanup, prefix, REDIS};

fn req(p: &str, budget: bool) -> CasRequest {
    CasRequest {
        session_key: format!("{p}:{{g}}:s:x"),
        budget_key: budget.then(|| format!("{p}:{{g}}:b")),
        expect_sv: 0,
        expect_bv: 0,
        session_blob: b"s1".to_vec(),
        record_field: "r:0:d1:0".into(),
        drop_fields: Vec::new(),
        budget_blob: None,
        daemon: "d1".into(),
        marker: None,
        drop: Vec::new(),
        ttl_ms: 0,
        hold: None,
        drop_holds: Vec::new(),
        release: None,
        created_marker: None,
        join: false,
    }
}

fn fields(v: Value) -> Fields {
    let mut f = Fields::new();
    let Value::Array(items) = v else {
        panic!("not a hash: {v:?}")
    };
    for pair in items.chunks(2) {
        let (Value::BulkString(k), Value::BulkString(v)) = (&pair[0], &pair[1]) else {
            panic!("bad pair")
        };
        f.insert(String::from_utf8(k.clone()).unwrap(), v.clone());
    }
    f
}

/// The store's pipeline: the record staged into its field (unless `stage` is false: a
/// staging lost before the script ran), then the script.
async fn real(c: &mut redis::aio::MultiplexedConnection, r: &CasRequest, stage: bool) -> CasReply {
    let (keys, args) = keys_and_args(r);
    let mut pipe = redis::pipe();
    if stage {
        pipe.cmd("HSET")
            .arg(&r.session_key)
            .arg(&r.record_field)
            .arg(r.session_blob.as_slice())
            .ignore();
    }
    let cmd = pipe.cmd("EVAL").arg(CAS_LUA).arg(keys.len()).arg(&keys);
    for a in &args {
        cmd.arg(a.as_slice());
    }
    let (v,): (Value,) = pipe.query_async(c).await.unwrap();
    let Value::Array(items) = v else { panic!() };
    let mut it = items.into_iter();
    match (it.next(), it.next(), it.next(), it.next()) {
        (Some(Value::Int(1)), Some(Value::Int(sv)), Some(Value::Int(bv)), None) => CasReply::Done {
            sv: sv as u64,
            bv: bv as u64,
        },
        (Some(Value::Int(0)), Some(s), Some(b), None) => CasReply::Conflict {
            session: fields(s),
            budget: fields(b),
        },
        (Some(Value::Int(4)), None, None, None) => CasReply::Unstaged,
        (Some(Value::Int(2)), Some(Value::Int(sv)), Some(Value::Int(created)), Some(b)) => {
            CasReply::Joined {
                sv: sv as u64,
                created: created == 1,
                budget: fields(b),
            }
        }
        other => panic!("unexpected reply {other:?}"),
    }
}

/// `HSET key field value` in Redis and in `fake`'s hashes alike.
async fn hset_both(
    c: &mut redis::aio::MultiplexedConnection,
    fake: &mut Fake,
    key: &str,
    field: &str,
    value: &[u8],
) {
    crate::support::hset(c, key, field, value).await;
    fake.hashes
        .entry(key.to_owned())
        .or_default()
        .insert(field.to_owned(), value.to_vec());
}

/// The name of a case whose record is not staged before its script.
const NOT_STAGED: &str = "versions match, staged record missing: nothing written";

#[tokio::test]
async fn script_and_fake_agree_on_a_table_of_cases() {
    let _scripts = crate::support::SCRIPTS.read().await;
    let p = prefix("script");
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let mut fake = Fake::default();

    let mut cases: Vec<(&str, CasRequest)> = Vec::new();
    cases.push(("create", req(&p, false)));
    cases.push(("create again: conflict", req(&p, false)));
    let mut r = req(&p, true);
    r.expect_sv = 1;
    r.session_blob = b"s2".to_vec();
    r.budget_blob = Some(b"b1".to_vec());
    r.marker = Some((2, b"m2".to_vec()));
    cases.push(("write, start budget, push marker", r.clone()));
    let mut r2 = r.clone();
    r2.expect_sv = 2;
    r2.expect_bv = 7;
    r2.budget_blob = Some(b"b2".to_vec());
    cases.push(("budget version differs: conflict", r2.clone()));
    r2.budget_blob = None;
    r2.session_blob = b"s3".to_vec();
    r2.marker = Some((3, b"m3".to_vec()));
    cases.push(("budget not written: not checked", r2.clone()));
    let mut r3 = r2.clone();
    r3.expect_sv = 3;
    r3.expect_bv = 1;
    r3.budget_blob = Some(b"b3".to_vec());
    r3.marker = None;
    r3.drop = vec![2, 3, 9];
    r3.ttl_ms = 60_000;
    r3.daemon = "d2".into();
    cases.push(("drop markers, expire, write budget", r3.clone()));
    let mut r4 = r3.clone();
    r4.expect_sv = 4;
    r4.expect_bv = 2;
    r4.ttl_ms = 0;
    r4.drop = Vec::new();
    cases.push(("persist again", r4.clone()));
    let mut h = r4.clone();
    h.expect_sv = 5;
    h.expect_bv = 3;
    h.budget_blob = Some(b"b4".to_vec());
    h.hold = Some(("h:x\x1f6".into(), 250));
    cases.push(("a refund: the budget written and held", h.clone()));
    let mut h2 = h.clone();
    h2.expect_sv = 6;
    h2.budget_blob = None;
    h2.hold = None;
    h2.drop_holds = vec!["h:x\x1f6".into(), "h:x\x1f9".into()];
    cases.push((
        "holds taken off, the budget's version unchanged",
        h2.clone(),
    ));
    let mut h3 = h2.clone();
    h3.expect_sv = 1;
    h3.hold = Some(("h:x\x1f7".into(), 1));
    cases.push(("conflict: no hold put", h3));
    let mut r5 = r4.clone();
    r5.expect_sv = 1;
    cases.push(("stale session version: conflict with budget", r5));
    // Joins: a session opened on the budget as it is (started if absent), whatever
    // version it is at; the answer carries the budget as the script read it.
    let mut j = req(&p, true);
    j.session_key = format!("{p}:{{g}}:s:y");
    j.join = true;
    j.expect_bv = 99;
    j.budget_blob = Some(b"b-start".to_vec());
    j.marker = Some((1, b"m1".to_vec()));
    cases.push(("join an existing budget: left alone, read", j.clone()));
    cases.push(("join again: the session exists, conflict", j.clone()));
    let mut j2 = j.clone();
    j2.session_key = format!("{p}:{{h}}:s:z");
    j2.budget_key = Some(format!("{p}:{{h}}:b"));
    cases.push(("join an absent budget: started at version 1", j2));

    // A hash written before record fields existed: its record in `b`, a marker's record
    // before in `p:<seq>` itself. The first write keeps `b` as the record before its
    // marker; dropping that marker drops `b`.
    let legacy = format!("{p}:{{g}}:s:legacy");
    for (f, v) in [
        ("v", b"4".as_slice()),
        ("b", b"old-record"),
        ("d", b"d0"),
        ("u:4", b"m4"),
        ("p:4", b"{\"v\":2,\"old\":true}"),
    ] {
        hset_both(&mut c, &mut fake, &legacy, f, v).await;
    }
    // An orphan: a record staged by a write whose script never ran (its pipeline cut).
    let orphan = "r:9:d9:1";
    hset_both(&mut c, &mut fake, &legacy, orphan, b"half-written").await;
    let mut l = req(&p, false);
    l.session_key = legacy.clone();
    l.expect_sv = 4;
    l.marker = Some((5, b"m5".to_vec()));
    l.drop = vec![4];
    cases.push(("an old-layout hash: b kept as the record before", l.clone()));
    let mut l2 = l.clone();
    l2.expect_sv = 5;
    l2.marker = Some((6, b"m6".to_vec()));
    l2.drop = vec![5];
    // Only record fields are ever dropped as orphans: `v` and the marker stay.
    l2.drop_fields = vec![orphan.into(), "v".into(), "u:6".into()];
    cases.push((
        "its marker dropped: b goes with it; the orphan goes",
        l2.clone(),
    ));
    let mut l3 = l2.clone();
    l3.expect_sv = 6;
    l3.marker = None;
    l3.drop = vec![6];
    l3.drop_fields = Vec::new();
    cases.push((
        "a write with no marker (a revert): the record it replaces goes",
        l3.clone(),
    ));
    // Versions matching, but the staged record is not there (a sweep deleted it while the
    // pipeline was held up): nothing is written, on a new session or an existing one.
    let mut u = req(&p, false);
    u.session_key = format!("{p}:{{g}}:s:unstaged");
    cases.push((NOT_STAGED, u));
    let mut u2 = l3.clone();
    u2.expect_sv = 7;
    u2.marker = Some((8, b"m8".to_vec()));
    u2.drop = Vec::new();
    cases.push((NOT_STAGED, u2));

    for (i, (name, r)) in cases.iter().enumerate() {
        // Every write stages into a field of its own.
        let r = &CasRequest {
            record_field: format!("r:{i}:{}:{i}", r.daemon),
            ..r.clone()
        };
        let staged = *name != NOT_STAGED;
        let got = real(&mut c, r, staged).await;
        let want = if staged { fake.cas(r) } else { fake.script(r) };
        assert_eq!(
            matches!(want, CasReply::Unstaged),
            !staged,
            "case `{name}`: {want:?}"
        );
        assert_eq!(got, want, "case `{name}`");
        let mut keys = vec![
            r.session_key.clone(),
            format!("{p}:{{g}}:b"),
            legacy.clone(),
        ];
        keys.extend(r.budget_key.clone());
        for key in keys {
            let v: Value = redis::cmd("HGETALL")
                .arg(&key)
                .query_async(&mut c)
                .await
                .unwrap();
            assert_eq!(fields(v), fake.hgetall(&key), "case `{name}`: hash {key}");
        }
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&r.session_key)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(
            ttl > 0,
            fake.ttl.contains_key(&r.session_key),
            "case `{name}`: expiry"
        );
    }
    // After the old-layout hash's three writes: `b`, the orphan and every record before a
    // dropped marker are gone; one record field is left, the one `c` names.
    let h = fake.hgetall(&legacy);
    let records: Vec<&String> = h.keys().filter(|k| k.starts_with("r:")).collect();
    assert_eq!(records.len(), 1, "{h:?}");
    assert_eq!(h["c"], records[0].as_bytes(), "{h:?}");
    assert!(!h.contains_key("b") && !h.contains_key("u:6") && !h.contains_key("p:6"));
    assert_eq!(h["v"], b"7");
    // Every record the table staged that lost its race was deleted by the script.
    let x = fake.hgetall(&format!("{p}:{{g}}:s:x"));
    assert_eq!(x.keys().filter(|k| k.starts_with("r:")).count(), 1, "{x:?}");
    // Settlements hold the budget: a budget write that does not name the settlement in
    // progress is refused; the one that names it writes and takes it off.
    let bkey = format!("{p}:{{g}}:b");
    let skey = format!("{p}:{{g}}:s:x");
    let hash = |f: &Fake, k: &str| f.hgetall(k);
    let sv_now = |f: &Fake| -> u64 {
        String::from_utf8(f.hgetall(&skey)["v"].clone())
            .unwrap()
            .parse()
            .unwrap()
    };
    let bv_now = |f: &Fake| -> u64 {
        String::from_utf8(f.hgetall(&bkey)["v"].clone())
            .unwrap()
            .parse()
            .unwrap()
    };
    let (sv, bv) = (sv_now(&fake), bv_now(&fake));
    let take = SettleRequest {
        session_key: skey.clone(),
        budget_key: bkey.clone(),
        expect_sv: sv,
        expect_bv: bv,
        expect: None,
        set: Some("d9\x1f5\x1fx".into()),
    };
    let mut stale = take.clone();
    stale.expect_bv = bv + 7;
    for (name, r) in [
        ("take: stale budget version", &stale),
        ("take", &take),
        ("take again: taken", &take),
    ] {
        let (keys, args) = settle_keys_and_args(r);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(CAS_LUA).arg(keys.len()).arg(&keys);
        for a in &args {
            cmd.arg(a.as_slice());
        }
        let v: Value = cmd.query_async(&mut c).await.unwrap();
        let done = matches!(&v, Value::Array(items) if items.len() == 1);
        assert_eq!(done, fake.settle(r).is_ok(), "case `{name}`");
        let got: Value = redis::cmd("HGETALL")
            .arg(&bkey)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(fields(got), hash(&fake, &bkey), "case `{name}`");
    }
    let mut w = req(&p, true);
    w.expect_sv = sv;
    w.expect_bv = bv;
    w.budget_blob = Some(b"b9".to_vec());
    cases.clear();
    cases.push((
        "a budget write while a settlement holds it: conflict",
        w.clone(),
    ));
    let mut w2 = w.clone();
    w2.release = Some("d9\x1f5\x1fx".into());
    cases.push(("the settlement's own write: written, released", w2));
    let mut w3 = w.clone();
    w3.expect_sv = sv + 1;
    w3.expect_bv = bv + 1;
    w3.budget_blob = Some(b"b10".to_vec());
    cases.push(("released: others write again", w3));
    for (i, (name, r)) in cases.iter().enumerate() {
        let r = &CasRequest {
            record_field: format!("r:s{i}:{}:{i}", r.daemon),
            ..r.clone()
        };
        let got = real(&mut c, r, true).await;
        let want = fake.cas(r);
        assert_eq!(got, want, "case `{name}`");
        let v: Value = redis::cmd("HGETALL")
            .arg(&bkey)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(fields(v), fake.hgetall(&bkey), "case `{name}`");
    }
    assert!(!fake.hgetall(&bkey).contains_key("s"));
    // The table exercised both answers.
    assert!(cases.len() >= 3);
    cleanup(&p).await;
}

/// The sweeper's delete (`SWEEP_ORPHANS_LUA`) takes staged record fields off a hash that is
/// still no session, and nothing off one that became a session after the sweeper read it:
/// an opening held up between its staging and its script, whose script ran in between.
/// (Fails with a plain `HDEL`: the current record goes.)
#[tokio::test]
async fn the_sweepers_delete_spares_a_hash_that_became_a_session() {
    use crate::support::hset;
    use tollgate_redis::script::SWEEP_ORPHANS_LUA;
    let _scripts = crate::support::SCRIPTS.read().await;
    let p = prefix("sweepdel");
    let key = format!("{p}:{{g}}:s:x");
    let client = redis::Client::open(REDIS).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let sweep = |fields: Vec<&'static str>| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SWEEP_ORPHANS_LUA).arg(1).arg(&key).arg(fields);
        cmd
    };
    // Still no session: the staged field is deleted.
    hset(&mut c, &key, "r:1:d:0", "staged").await;
    let n: i64 = sweep(vec!["r:1:d:0"]).query_async(&mut c).await.unwrap();
    assert_eq!(n, 1);
    // Staged, read by the sweeper as an orphan, then made current by its opening's
    // script (`v` and `c` written) before the sweeper's delete: nothing is deleted.
    hset(&mut c, &key, "r:1:d:0", "staged").await;
    hset(&mut c, &key, "v", "1").await;
    hset(&mut c, &key, "c", "r:1:d:0").await;
    let n: i64 = sweep(vec!["r:1:d:0"]).query_async(&mut c).await.unwrap();
    assert_eq!(n, 0);
    let current: Option<String> = redis::cmd("HGET")
        .arg(&key)
        .arg("r:1:d:0")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(current.as_deref(), Some("staged"));
    cleanup(&p).await;
}
