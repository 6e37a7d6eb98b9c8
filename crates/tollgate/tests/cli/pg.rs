//! `tollgate migrate` and `tollgate audit verify|export --postgres` against a real
//! PostgreSQL (127.0.0.1:5432, database `test`, or `TOLLGATE_TEST_PG_URL`).

use tollgate_store::Journal as _;

use crate::{code, s, stdout, text, tollgate};

fn url() -> String {
    std::env::var("TOLLGATE_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A schema of this test's own, dropped at the end.
struct Schema(String);

impl Schema {
    fn new(test: &str) -> Schema {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        Schema(format!("tgc_{test}_{}_{nanos}", std::process::id()))
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

impl Drop for Schema {
    fn drop(&mut self) {
        let name = self.0.clone();
        rt().block_on(async {
            let settings = tollgate_pg::PgSettings::new(url());
            if let Ok(c) = tollgate_pg::connect(&settings).await {
                let _ = c
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                    .await;
            }
        });
    }
}

fn verdict(seq: u64) -> tollgate_audit::SessionEvent {
    tollgate_audit::SessionEvent::Verdict(tollgate_audit::VerdictRecord {
        timestamp_ns: 1_796_040_000_000_000_000,
        session_id: "sess".into(),
        agent_id: "agent".into(),
        organization_id: "org".into(),
        call_number: seq,
        tool_name: "search".into(),
        params_hash: tollgate_core::Digest([1; 32]),
        verdict: tollgate_core::Verdict::Allow,
        deny_reason: None,
        reason: tollgate_core::Reason::WithinThresholds,
        probabilistic: false,
        budget_before: tollgate_core::Money(10),
        budget_after: tollgate_core::Money(9),
        operator_id: None,
        estimated_cost: tollgate_core::Money(1),
        nonce: seq,
        config_digest: None,
        session_seq: seq,
        budget_version: 0,
        policy: None,
        shadow: Vec::new(),
        params: None,
        upstream: None,
        draw: None,
    })
}

#[test]
fn migrate_then_verify_and_export_a_chain_then_name_a_break() {
    let schema = Schema::new("cli");
    let sc = schema.0.as_str();
    let url = url();
    let o = tollgate(&["migrate", "--postgres", &url, "--schema", sc]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(
        stdout(&o).contains(&format!("schema {sc}: version 0 -> 1 (applied 1)")),
        "{}",
        text(&o)
    );
    let o = tollgate(&["migrate", "--postgres", &url, "--schema", sc]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(stdout(&o).contains("up to date"), "{}", text(&o));

    // A daemon's chain: keys from `tollgate keygen`.
    let dir = tempfile::tempdir().unwrap();
    let o = tollgate(&["keygen", "--out", s(dir.path())]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let o = tollgate(&["keygen", "--out", s(dir.path()), "--name", "other"]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let secret = std::fs::read_to_string(dir.path().join("audit.key")).unwrap();
    let key = tollgate_audit::keys::parse_secret_key(&secret).unwrap();
    let settings = tollgate_pg::PgSettings::new(url.clone()).with_schema(sc);
    rt().block_on(async {
        let j = tollgate_pg::PgJournal::open(settings, key, "daemon-1")
            .await
            .unwrap();
        for i in 1..=5 {
            j.submit(verdict(i)).await.unwrap();
        }
        j.close().await.unwrap();
    });

    let pub_key = dir.path().join("audit.pub");
    let other = dir.path().join("other.pub");
    let o = tollgate(&["audit", "verify", "--postgres", &url, "--schema", sc]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let out = stdout(&o);
    assert!(
        out.contains("chain daemon-1: ok: 5 entries (index 0..5), whole"),
        "{out}"
    );
    assert!(out.contains("NOT CHECKED"), "{out}");
    let o = tollgate(&[
        "audit",
        "verify",
        "--postgres",
        &url,
        "--schema",
        sc,
        "--chain",
        "daemon-1",
        "--key",
        s(&pub_key),
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(stdout(&o).contains("(trusted)"), "{}", text(&o));
    let o = tollgate(&[
        "audit",
        "verify",
        "--postgres",
        &url,
        "--schema",
        sc,
        "--key",
        s(&other),
    ]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    assert!(
        stdout(&o).contains("BROKEN: `chain daemon-1` at offset 0: unknown key"),
        "{}",
        text(&o)
    );

    let o = tollgate(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        "--postgres",
        &url,
        "--schema",
        sc,
        "--key",
        s(&pub_key),
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert_eq!(stdout(&o).lines().count(), 5);
    // Every row names its chain.
    for l in stdout(&o).lines() {
        let v = tollgate_core::json::parse_str(l).unwrap();
        assert_eq!(v.get("chain_id").unwrap().as_str(), Some("daemon-1"), "{l}");
    }
    let o = tollgate(&[
        "audit",
        "export",
        "--format",
        "csv",
        "--postgres",
        &url,
        "--schema",
        sc,
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert_eq!(stdout(&o).lines().count(), 6);

    // Alter entry 2 as the superuser, with the append-only trigger off.
    rt().block_on(async {
        let c = tollgate_pg::connect(&tollgate_pg::PgSettings::new(url.clone()))
            .await
            .unwrap();
        c.batch_execute(&format!(
            "ALTER TABLE \"{sc}\".entries DISABLE TRIGGER USER;
             UPDATE \"{sc}\".entries SET record = set_byte(record, 70, get_byte(record, 70) # 4) WHERE idx = 2;
             ALTER TABLE \"{sc}\".entries ENABLE TRIGGER USER;"
        ))
        .await
        .unwrap();
    });
    let o = tollgate(&["audit", "verify", "--postgres", &url, "--schema", sc]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    let out = stdout(&o);
    assert!(
        out.contains("BROKEN: entry 2 in `chain daemon-1` at offset "),
        "{out}"
    );
    assert!(out.contains("bad signature"), "{out}");
    let o = tollgate(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        "--postgres",
        &url,
        "--schema",
        sc,
    ]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    assert!(text(&o).contains("nothing exported"));
    assert!(stdout(&o).is_empty());

    // Files and --postgres do not mix; an unknown chain is an error.
    let o = tollgate(&["audit", "verify", "--postgres", &url, "some.log"]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    let o = tollgate(&[
        "audit",
        "verify",
        "--postgres",
        &url,
        "--schema",
        sc,
        "--chain",
        "nope",
    ]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("no chain `nope`"), "{}", text(&o));
}
