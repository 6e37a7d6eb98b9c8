//! `tollgate certs`: the files it writes let `tollgate serve` and a gRPC client talk with
//! mutual TLS, each client in its own organization.

use std::time::Duration;

use tollgate_client::{ClientConfig, DaemonClient, GrpcConfig};
use tollgate_core::{json, Verdict};

use crate::daemon::Serve;
use crate::{code, s, text, tollgate};

#[test]
fn certs_make_a_daemon_and_its_clients_talk_mtls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let args = [
        "certs",
        "--out",
        s(&pki),
        "--client",
        "acme/bot1",
        "--client",
        "beta/bot2",
        "--listen",
        "127.0.0.1:0",
    ];
    let o = tollgate(&args);
    assert_eq!(code(&o), 0, "{}", text(&o));
    for f in [
        "ca.pem",
        "ca.key",
        "server.pem",
        "server.key",
        "client-acme-bot1.pem",
        "client-acme-bot1.key",
        "client-beta-bot2.pem",
        "grpc.toml",
    ] {
        assert!(pki.join(f).is_file(), "{f} missing");
    }
    // Keys are private.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(pki.join("client-acme-bot1.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");
    // Nothing is overwritten.
    let again = tollgate(&args);
    assert_ne!(code(&again), 0);
    assert!(
        text(&again).contains("must not exist yet"),
        "{}",
        text(&again)
    );

    let data = dir.path().join("data");
    let mut serve = Serve::start_with(&data, &["--config", s(&pki.join("grpc.toml"))]);
    let banner = serve.banner();
    let addr = banner
        .lines()
        .find_map(|l| l.trim().strip_prefix("gRPC (mutual TLS): "))
        .unwrap_or_else(|| panic!("no gRPC address in:\n{banner}"))
        .to_owned();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for (org, agent) in [("acme", "bot1"), ("beta", "bot2")] {
            let g = GrpcConfig::from_files(
                &addr,
                "localhost",
                &pki.join("ca.pem"),
                &pki.join(format!("client-{org}-{agent}.pem")),
                &pki.join(format!("client-{org}-{agent}.key")),
            )
            .unwrap();
            let mut cfg = ClientConfig::grpc(g, "", agent);
            cfg.timeout = Duration::from_secs(5);
            let c = DaemonClient::connect(cfg).await.unwrap();
            let state = c.registration().state.clone().unwrap();
            assert_eq!(state.organization_id, org);
            let v = c
                .pre_exec("search", &json::parse_str("{}").unwrap(), 0.01)
                .await;
            assert_eq!(v.verdict, Verdict::Allow, "{v:?}");
        }
        // The server certificate is for localhost and 127.0.0.1, nothing else.
        let mut g = GrpcConfig::from_files(
            &addr,
            "elsewhere.example",
            &pki.join("ca.pem"),
            &pki.join("client-acme-bot1.pem"),
            &pki.join("client-acme-bot1.key"),
        )
        .unwrap();
        let e = DaemonClient::connect(ClientConfig::grpc(g.clone(), "", "bot1"))
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "fail_closed:tls", "{e:?}");
        g.server_name = "127.0.0.1".into();
        DaemonClient::connect(ClientConfig::grpc(g, "", "bot1"))
            .await
            .unwrap();
    });
    assert!(serve.terminate().success());
}
