use tollgate_pg::{migrate, RoleOutcome, SCHEMA_VERSION};

use crate::common::*;

#[tokio::test]
async fn migrations_are_idempotent() {
    let s = Schema::new("idem");
    let mut c = client().await.unwrap();
    let first = migrate(&mut c, &s.name).await.unwrap();
    assert_eq!(first.from, 0);
    assert_eq!(first.applied, vec![1]);
    assert_eq!(first.to, SCHEMA_VERSION);
    assert!(matches!(
        first.role,
        RoleOutcome::Created | RoleOutcome::Existed
    ));
    let again = tollgate_pg::migrate_with(&s.settings()).await.unwrap();
    assert_eq!(again.from, SCHEMA_VERSION);
    assert!(again.applied.is_empty());
    assert_eq!(again.role, RoleOutcome::Existed);
    assert_eq!(count(&c, &s.name, "schema_migrations").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_apply_once() {
    let s = Schema::new("conc");
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let name = s.name.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = client().await.unwrap();
            migrate(&mut c, &name).await.unwrap()
        }));
    }
    let mut applied = 0;
    for t in tasks {
        applied += t.await.unwrap().applied.len();
    }
    assert_eq!(applied, 1, "exactly one migrator applied version 1");
    let c = client().await.unwrap();
    assert_eq!(count(&c, &s.name, "schema_migrations").await, 1);
}

#[tokio::test]
async fn writer_role_may_only_insert_and_select() {
    let s = migrated("role").await;
    let c = client().await.unwrap();
    for (table, privilege, expected) in [
        ("entries", "INSERT", true),
        ("entries", "SELECT", true),
        ("entries", "UPDATE", false),
        ("entries", "DELETE", false),
        ("entries", "TRUNCATE", false),
        ("claims", "INSERT", true),
        ("claims", "UPDATE", false),
        ("chains", "DELETE", false),
    ] {
        let has: bool = c
            .query_one(
                "SELECT has_table_privilege('tollgate_writer', $1, $2)",
                &[&format!("\"{}\".{table}", s.name), &privilege],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(has, expected, "{table} {privilege}");
    }
    let login: bool = c
        .query_one(
            "SELECT rolcanlogin FROM pg_roles WHERE rolname = 'tollgate_writer'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!login);
}

#[tokio::test]
async fn update_delete_truncate_are_refused_even_for_the_owner() {
    let s = migrated("append").await;
    let j = tollgate_pg::PgJournal::open(s.settings(), key(1), "c1")
        .await
        .unwrap();
    tollgate_store::Journal::submit(&j, verdict("s", 1))
        .await
        .unwrap();
    j.close().await.unwrap();
    let c = client().await.unwrap();
    let n = &s.name;
    for sql in [
        format!("UPDATE \"{n}\".entries SET kind = 2"),
        format!("DELETE FROM \"{n}\".entries"),
        format!("TRUNCATE \"{n}\".entries CASCADE"),
        format!("UPDATE \"{n}\".claims SET kind = 'void'"),
        format!("DELETE FROM \"{n}\".claims"),
        format!("TRUNCATE \"{n}\".claims"),
        format!("UPDATE \"{n}\".chains SET key_id = 'x'"),
        format!("DELETE FROM \"{n}\".chains"),
    ] {
        let e = c.batch_execute(&sql).await.unwrap_err();
        let msg = e.as_db_error().unwrap().message().to_owned();
        assert!(msg.contains("append-only"), "{sql}: {msg}");
    }
    assert_eq!(count(&c, n, "entries").await, 1);
    assert_eq!(count(&c, n, "claims").await, 1);
}

#[tokio::test]
async fn bad_schema_names_are_refused() {
    let mut c = client().await.unwrap();
    for bad in ["", "Caps", "a-b", "x\"; DROP", "1abc", &"a".repeat(64)] {
        assert!(matches!(
            migrate(&mut c, bad).await,
            Err(tollgate_pg::PgError::Schema(_))
        ));
    }
}

#[tokio::test]
async fn a_journal_needs_a_migrated_schema() {
    let s = Schema::new("unmig");
    let e = tollgate_pg::PgJournal::open(s.settings(), key(1), "c1")
        .await
        .unwrap_err();
    assert!(matches!(e, tollgate_pg::PgError::NotMigrated(_)), "{e}");
}

#[test]
fn outside_a_tokio_runtime_is_an_error_not_a_panic() {
    use std::future::Future as _;
    use std::task::{Context, Poll, Waker};
    let settings = tollgate_pg::PgSettings::new(url());
    let mut f = std::pin::pin!(tollgate_pg::connect(&settings));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(
        f.as_mut().poll(&mut cx),
        Poll::Ready(Err(tollgate_pg::PgError::NoRuntime))
    ));
    let mut g = std::pin::pin!(tollgate_pg::PgJournal::open(settings.clone(), key(1), "c"));
    assert!(matches!(
        g.as_mut().poll(&mut cx),
        Poll::Ready(Err(tollgate_pg::PgError::NoRuntime))
    ));
}
