use tollgate_audit::{BreakKind, KeyId, VerifyingKey};
use tollgate_pg::PgJournal;
use tollgate_store::Journal;

use crate::common::*;

async fn chain_of(n: u64) -> Schema {
    let s = migrated("ver").await;
    let j = PgJournal::open(s.settings(), key(1), "daemon-a")
        .await
        .unwrap();
    let ds: Vec<_> = (1..=n).map(|i| j.submit(verdict("s", i))).collect();
    for d in ds {
        d.await.unwrap();
    }
    j.close().await.unwrap();
    s
}

/// Run `sql` as the superuser with the append-only triggers off.
async fn tamper(schema: &str, sql: &str) {
    let c = client().await.unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE \"{schema}\".entries DISABLE TRIGGER USER; {sql}; ALTER TABLE \"{schema}\".entries ENABLE TRIGGER USER;"
    ))
    .await
    .unwrap();
}

#[tokio::test]
async fn an_altered_row_is_named() {
    let s = chain_of(10).await;
    assert!(verify_all(&s.name).await[0].result.is_ok());
    // Flip one byte inside entry 3's payload.
    tamper(
        &s.name,
        &format!(
            "UPDATE \"{}\".entries SET record = set_byte(record, 60, get_byte(record, 60) # 1) WHERE idx = 3",
            s.name
        ),
    )
    .await;
    let r = verify_all(&s.name).await;
    let b = r[0].result.as_ref().unwrap_err();
    assert_eq!(b.index, Some(3));
    assert_eq!(b.kind, BreakKind::BadSignature);
    assert_eq!(b.file, "chain daemon-a");
    assert!(
        b.to_string()
            .starts_with("entry 3 in `chain daemon-a` at offset "),
        "{b}"
    );
}

#[tokio::test]
async fn a_deleted_row_is_a_missing_entry() {
    let s = chain_of(10).await;
    let c = client().await.unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE \"{n}\".claims DISABLE TRIGGER USER; ALTER TABLE \"{n}\".entries DISABLE TRIGGER USER;
         DELETE FROM \"{n}\".claims WHERE session_seq = 6; DELETE FROM \"{n}\".entries WHERE idx = 5;",
        n = s.name
    ))
    .await
    .unwrap();
    let r = verify_all(&s.name).await;
    let b = r[0].result.as_ref().unwrap_err();
    assert_eq!(b.index, Some(5));
    assert_eq!(
        b.kind,
        BreakKind::MissingEntry {
            expected: 5,
            found: 6
        }
    );
}

#[tokio::test]
async fn a_cut_tail_is_not_a_break_but_the_count_shows() {
    // Without a checkpoint, a cut tail verifies (as for files); the summary counts what
    // is there.
    let s = chain_of(4).await;
    let r = verify_all(&s.name).await;
    assert_eq!(r[0].result.as_ref().unwrap().next_index, 4);
}

#[tokio::test]
async fn given_keys_are_trusted_and_a_wrong_one_is_a_break() {
    let s = chain_of(3).await;
    let c = client().await.unwrap();
    let good: VerifyingKey = key(1).verifying_key();
    let r = tollgate_pg::verify(&c, &s.name, Some("daemon-a"), &[good], &mut |_, _| {})
        .await
        .unwrap();
    assert!(r[0].result.as_ref().unwrap().key_trusted);
    let bad = key(5).verifying_key();
    let r = tollgate_pg::verify(&c, &s.name, Some("daemon-a"), &[bad], &mut |_, _| {})
        .await
        .unwrap();
    assert_eq!(
        r[0].result.as_ref().unwrap_err().kind,
        BreakKind::UnknownKey {
            expected: KeyId::of(bad.as_bytes()),
            found: KeyId::of(good.as_bytes())
        }
    );
    let e = tollgate_pg::verify(&c, &s.name, Some("nope"), &[], &mut |_, _| {})
        .await
        .unwrap_err();
    assert_eq!(e, tollgate_pg::PgError::NoSuchChain("nope".into()));
}

#[tokio::test]
async fn swapped_rows_are_a_reordered_entry() {
    let s = chain_of(6).await;
    let c = client().await.unwrap();
    // Swap the records of rows 2 and 3 (the rows keep their idx).
    c.batch_execute(&format!(
        "ALTER TABLE \"{n}\".entries DISABLE TRIGGER USER;
         UPDATE \"{n}\".entries e SET record = o.record
           FROM \"{n}\".entries o
          WHERE e.chain_id = o.chain_id AND ((e.idx = 2 AND o.idx = 3) OR (e.idx = 3 AND o.idx = 2));
         ALTER TABLE \"{n}\".entries ENABLE TRIGGER USER;",
        n = s.name
    ))
    .await
    .unwrap();
    let r = verify_all(&s.name).await;
    let b = r[0].result.as_ref().unwrap_err();
    assert_eq!(b.index, Some(2));
    assert_eq!(
        b.kind,
        BreakKind::ReorderedEntry {
            expected: 2,
            found: 3
        }
    );
}

#[tokio::test]
async fn a_replaced_registered_key_breaks_the_header() {
    // Someone swaps the chain's registered key for theirs: without --key the verifier
    // trusts the table's key, and the signed header (and every record) disagrees.
    let s = chain_of(2).await;
    let c = client().await.unwrap();
    let forged = key(7).verifying_key();
    c.execute(
        &format!(
            "ALTER TABLE \"{n}\".chains DISABLE TRIGGER USER",
            n = s.name
        ),
        &[],
    )
    .await
    .unwrap();
    c.execute(
        &format!("UPDATE \"{}\".chains SET public_key = $1", s.name),
        &[&forged.as_bytes().as_slice()],
    )
    .await
    .unwrap();
    let r = verify_all(&s.name).await;
    let b = r[0].result.as_ref().unwrap_err();
    assert_eq!(b.index, None);
    assert_eq!(
        b.kind,
        BreakKind::UnknownKey {
            expected: KeyId::of(forged.as_bytes()),
            found: KeyId::of(key(1).verifying_key().as_bytes())
        }
    );
}
