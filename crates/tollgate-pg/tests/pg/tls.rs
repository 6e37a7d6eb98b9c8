//! TLS through a test proxy: it answers PostgreSQL's SSLRequest, terminates TLS with a
//! certificate from a test CA, and forwards the plaintext to the real server. The
//! journal must verify the certificate against the CA it is given.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, SanType};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tollgate_pg::{PgError, PgJournal};
use tollgate_store::Journal;

use crate::common::*;

/// PostgreSQL's SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn make_pki() -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().unwrap())];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca).unwrap();
    Pki {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// Start the proxy; returns its address and the count of TLS handshakes completed.
async fn proxy(p: &Pki) -> (SocketAddr, Arc<AtomicUsize>) {
    let certs = vec![CertificateDer::from_pem_slice(p.cert_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(p.key_pem.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let count = handshakes.clone();
    tokio::spawn(async move {
        // Bounded: a test makes a handful of connections.
        for _ in 0..32 {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let count = count.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 8];
                if sock.read_exact(&mut first).await.is_err() || first != SSL_REQUEST {
                    return; // plain connections are refused
                }
                if sock.write_all(b"S").await.is_err() {
                    return;
                }
                let Ok(mut tls) = acceptor.accept(sock).await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(mut upstream) = tokio::net::TcpStream::connect("127.0.0.1:5432").await
                else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut upstream).await;
            });
        }
    });
    (addr, handshakes)
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_writes_over_tls_and_a_wrong_ca_is_refused() {
    let s = migrated("tls").await;
    let pki = make_pki();
    let (addr, handshakes) = proxy(&pki).await;
    let dir = tempfile_dir();
    let ca = write(&dir, "ca.pem", &pki.ca_pem);
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/test?sslmode=require",
        addr.port()
    );
    let mut settings = s.settings();
    settings.url = url.clone();
    settings.ca_file = Some(ca);
    let j = PgJournal::open(settings.clone(), key(1), "daemon-tls")
        .await
        .unwrap();
    j.submit(verdict("s", 1)).await.unwrap();
    j.close().await.unwrap();
    assert!(handshakes.load(Ordering::SeqCst) >= 1);
    let c = tollgate_pg::connect(&settings).await.unwrap();
    let r = tollgate_pg::verify(&c, &s.name, None, &[], &mut |_, _| {})
        .await
        .unwrap();
    assert_eq!(r[0].result.as_ref().unwrap().entries, 1);

    // A CA that did not sign the server's certificate: refused, nothing written.
    let other = make_pki();
    let mut wrong = settings.clone();
    wrong.ca_file = Some(write(&dir, "other.pem", &other.ca_pem));
    let e = PgJournal::open(wrong, key(1), "daemon-tls2")
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            PgError::Db {
                what: "connect",
                ..
            }
        ),
        "{e}"
    );
    // sslmode=require without a CA file: no TLS is possible, so no connection.
    let mut plain = settings.clone();
    plain.ca_file = None;
    assert!(tollgate_pg::connect(&plain).await.is_err());
    // A CA file that holds no certificate, or is missing.
    let mut junk = settings.clone();
    junk.ca_file = Some(write(&dir, "junk.pem", "not a certificate\n"));
    assert!(matches!(
        tollgate_pg::connect(&junk).await,
        Err(PgError::Tls(_))
    ));
    junk.ca_file = Some(dir.join("missing.pem"));
    assert!(matches!(
        tollgate_pg::connect(&junk).await,
        Err(PgError::Tls(_))
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!("tollgate-pg-tls-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
