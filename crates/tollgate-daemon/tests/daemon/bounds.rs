//! Issue 17: no peer holds a slot, descriptor or memory it has not earned. Each test is an
//! attack that got through before the change.

use std::path::Path;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::json;
use tollgate_daemon::config::Organization;
use tollgate_proto::auth::{seal, MessageKey};
use tollgate_proto::frame;
use tollgate_proto::sp1::{self, envelope::Payload, Envelope, ErrorCode};

use crate::hostile::{closed, error_code, read_reply};
use crate::{config, start, SECRET};

pub const OTHER_ORG: &str = "globex";
pub const OTHER_SECRET: &[u8] = b"globex's own organization secret, long enough";

/// The test configuration with a second organization, `globex`.
pub fn two_orgs(dir: &Path) -> tollgate_daemon::DaemonConfig {
    let mut c = config(dir);
    c.organizations.push(Organization {
        id: OTHER_ORG.into(),
        secret: Some(OTHER_SECRET.to_vec()),
        operator_secret: Some(b"globex's operators' secret, not the agents'".to_vec()),
    });
    c
}

const GARBAGE: [u8; 8] = [0xff, 0xfe, 0x00, 0x13, 0x37, 0xff, 0xff, 0xff];

/// A victim of another organization registers and is allowed a call.
async fn victim_is_served(socket: &Path) {
    let mut cfg = ClientConfig::new(socket, OTHER_ORG, OTHER_SECRET, "victim");
    cfg.timeout = Duration::from_secs(5);
    let c = DaemonClient::connect(cfg)
        .await
        .expect("another organization's agent could not register");
    assert!(c
        .pre_exec("t", &json::parse_str("{}").unwrap(), 0.0)
        .await
        .allowed());
}

/// §2: more silent and garbage-sending connections than every cap, none of which ever
/// authenticates, with the idle timeout at its default 300 s. Before: they held all
/// `max_connections` slots and the victim got `DAEMON_UNAVAILABLE`. Now they hold at most
/// the unauthenticated part, the newest pushing the oldest out, and the victim is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_unauthenticated_flood_cannot_starve_another_organization() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = two_orgs(dir.path());
    cfg.limits.max_connections = 8;
    cfg.limits.max_unauthenticated_connections = 4;
    let d = start(cfg).await;
    let mut hogs = Vec::new();
    for i in 0..24 {
        let mut s = UnixStream::connect(&d.socket).await.unwrap();
        if i % 2 == 1 {
            // One bad frame each: fewer than max_bad_frames.
            let _ = s.write_all(&frame::frame_bytes(&GARBAGE).unwrap()).await;
        }
        hogs.push(s);
    }
    victim_is_served(&d.socket).await;
    // And again while the flood is still open, from a fresh connection each time.
    victim_is_served(&d.socket).await;
    d.stop().await;
}

/// §2: a peer that keeps sending frames that do not authenticate. Before: each was
/// answered and the connection stayed open for ever (each reset the idle timer). Now the
/// connection is closed after `max_bad_frames` answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_bad_frames_close_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.max_bad_frames = 3;
    let d = start(cfg).await;
    for body in [
        GARBAGE.to_vec(),
        // A well-formed envelope sealed with a key nobody has.
        seal(
            &MessageKey::derive(b"not any organization's secret"),
            &register_envelope("acme", "m"),
        )
        .unwrap(),
    ] {
        let mut s = UnixStream::connect(&d.socket).await.unwrap();
        let mut answered = 0;
        for _ in 0..20 {
            if s.write_all(&frame::frame_bytes(&body).unwrap())
                .await
                .is_err()
            {
                break;
            }
            match read_reply(&mut s).await {
                Some(reply) => {
                    assert!(matches!(
                        error_code(&Some(reply)),
                        Some(ErrorCode::MalformedMessage | ErrorCode::AuthenticationFailed)
                    ));
                    answered += 1;
                }
                None => break,
            }
        }
        assert_eq!(answered, 3, "bad frames answered before the close");
        assert!(closed(&mut s).await, "the connection stayed open");
    }
    d.stop().await;
}

/// §2: a connection that never sends anything is closed at the sign-in deadline, not after
/// the (long) idle timeout. Before: it stayed open for the 300 s idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_silent_connection_closed_at_the_sign_in_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.auth_timeout = Duration::from_millis(200);
    cfg.limits.idle_timeout = Duration::from_secs(300);
    let d = start(cfg).await;
    let mut s = UnixStream::connect(&d.socket).await.unwrap();
    let reply = read_reply(&mut s).await;
    assert_eq!(error_code(&reply), Some(ErrorCode::InvalidRequest));
    assert!(closed(&mut s).await, "the connection stayed open");
    d.stop().await;
}

pub(crate) fn register_envelope(org: &str, id: &str) -> Envelope {
    Envelope {
        protocol_version: "1.0.0".into(),
        message_id: id.into(),
        payload: Some(Payload::Register(sp1::RegisterRequest {
            agent_id: "research-bot".into(),
            organization_id: org.into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// §2: once authenticated, frames that fail to authenticate are not activity: a peer that
/// registered and then sends only garbage (more slowly than max_bad_frames would close it)
/// is closed by the idle timeout. Before: every garbage frame reset the idle timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_garbage_does_not_keep_an_authenticated_connection_alive() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.limits.idle_timeout = Duration::from_millis(300);
    cfg.limits.max_bad_frames = 1000;
    let d = start(cfg).await;
    let mut s = UnixStream::connect(&d.socket).await.unwrap();
    let register = seal(
        &MessageKey::derive(SECRET),
        &register_envelope("acme", "r1"),
    )
    .unwrap();
    s.write_all(&frame::frame_bytes(&register).unwrap())
        .await
        .unwrap();
    let reply = read_reply(&mut s).await.expect("a registration reply");
    assert!(matches!(reply.payload, Some(Payload::RegisterResponse(_))));
    // Garbage every 50 ms, 200 times (10 s, far past the 300 ms idle timeout): the daemon
    // must hang up before the peer runs out.
    let mut hung_up = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if s.write_all(&frame::frame_bytes(&GARBAGE).unwrap())
            .await
            .is_err()
        {
            hung_up = true;
            break;
        }
        match read_reply(&mut s).await {
            Some(r) if error_code(&Some(r.clone())) == Some(ErrorCode::MalformedMessage) => {}
            Some(r) => {
                // The idle timeout's own Error, then the close.
                assert_eq!(error_code(&Some(r)), Some(ErrorCode::InvalidRequest));
                hung_up = closed(&mut s).await;
                break;
            }
            None => {
                hung_up = true;
                break;
            }
        }
    }
    assert!(hung_up, "garbage kept an authenticated connection open");
    d.stop().await;
}
