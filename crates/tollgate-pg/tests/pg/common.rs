use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::Client;
use tollgate_audit::{SessionEvent, SigningKey, VerdictRecord};
use tollgate_core::{Digest, Money, Reason, Verdict};
use tollgate_pg::PgSettings;

pub fn url() -> String {
    std::env::var("TOLLGATE_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh schema name for one test, and its removal when dropped.
pub struct Schema {
    pub name: String,
}

impl Schema {
    pub fn new(test: &str) -> Schema {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        Schema {
            name: format!(
                "tgt_{test}_{}_{}_{nanos}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }

    pub fn settings(&self) -> PgSettings {
        PgSettings::new(url()).with_schema(self.name.clone())
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(c) = client().await {
                    let _ = c
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                        .await;
                }
            });
        })
        .join();
    }
}

pub async fn client() -> Result<Client, tollgate_pg::PgError> {
    tollgate_pg::connect(&PgSettings::new(url())).await
}

/// A migrated schema.
pub async fn migrated(test: &str) -> Schema {
    let s = Schema::new(test);
    let mut c = client().await.unwrap();
    tollgate_pg::migrate(&mut c, &s.name).await.unwrap();
    s
}

pub fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

/// An ALLOW verdict for `session` at version `seq`.
pub fn verdict(session: &str, seq: u64) -> SessionEvent {
    SessionEvent::Verdict(VerdictRecord {
        timestamp_ns: 1_796_040_000_000_000_000 + i64::try_from(seq).unwrap(),
        session_id: session.to_owned(),
        agent_id: "agent".into(),
        organization_id: "org".into(),
        call_number: seq,
        tool_name: "search".into(),
        params_hash: Digest([7; 32]),
        verdict: Verdict::Allow,
        deny_reason: None,
        reason: Reason::WithinThresholds,
        probabilistic: false,
        budget_before: Money(1000),
        budget_after: Money(900),
        operator_id: None,
        estimated_cost: Money(100),
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

pub async fn count(c: &Client, schema: &str, sql_tail: &str) -> i64 {
    c.query_one(
        &format!("SELECT count(*) FROM \"{schema}\".{sql_tail}"),
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Verify every chain of `schema` with the registered keys; the reports.
pub async fn verify_all(schema: &str) -> Vec<tollgate_pg::ChainReport> {
    let c = client().await.unwrap();
    tollgate_pg::verify(&c, schema, None, &[], &mut |_, _| {})
        .await
        .unwrap()
}

/// A TCP forwarder to the test server that can be taken down (every connection through
/// it cut, new ones closed at once) and brought back: PostgreSQL stopping and starting,
/// as a client sees it.
pub struct Switch {
    pub port: u16,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Armed: the next `COMMIT` (or execution of a prepared statement, which commits as a
    /// transaction of its own) a client sends reaches the server, but its answer does not
    /// reach the client: the connection is cut instead (a lost acknowledgement).
    trap: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// How many answers the trap swallowed.
    pub swallowed: std::sync::Arc<AtomicU64>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

/// Forward one connection; see [`Switch`]'s `trap`.
async fn pump(
    client: tokio::net::TcpStream,
    trap: std::sync::Arc<std::sync::atomic::AtomicBool>,
    swallowed: std::sync::Arc<AtomicU64>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(server) = tokio::net::TcpStream::connect("127.0.0.1:5432").await else {
        return;
    };
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cut2 = cut.clone();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            // What commits: a `COMMIT`, or the execution of a prepared statement (a Bind
            // message first: the journal's batch runs as a transaction of its own).
            let commits =
                chunk.windows(7).any(|w| w == b"COMMIT\0") || chunk.first() == Some(&b'B');
            if commits && trap.swap(false, Ordering::SeqCst) {
                cut2.store(true, Ordering::SeqCst);
            }
            if sw.write_all(chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match sr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut.load(Ordering::SeqCst) {
            // The COMMIT's answer: dropped, and the connection cut.
            swallowed.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if cw.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    up.abort();
}

impl Switch {
    pub async fn start() -> Switch {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let trap = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swallowed = std::sync::Arc::new(AtomicU64::new(0));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (u, c, t, w) = (up.clone(), conns.clone(), trap.clone(), swallowed.clone());
        tokio::spawn(async move {
            // Bounded: a test reconnects a bounded number of times.
            for _ in 0..10_000 {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                if !u.load(Ordering::SeqCst) {
                    drop(sock);
                    continue;
                }
                let h = tokio::spawn(pump(sock, t.clone(), w.clone()));
                c.lock().unwrap().push(h);
            }
        });
        Switch {
            port,
            up,
            trap,
            swallowed,
            conns,
        }
    }

    /// Swallow the answer to the next COMMIT or prepared statement (and cut that connection).
    pub fn arm_lost_commit(&self) {
        self.trap.store(true, Ordering::SeqCst);
    }

    pub fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }

    pub fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port)
    }
}
