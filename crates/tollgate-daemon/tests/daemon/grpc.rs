//! The gRPC binding with mutual TLS, against a real daemon on 127.0.0.1:0 with
//! certificates generated at run time: the socket's flows over gRPC give the same replies
//! field by field, and every way in without a good certificate decides nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};
use tollgate_client::{ClientConfig, ClientError, DaemonClient, GrpcConfig};
use tollgate_core::json;
use tollgate_core::{Params, Verdict};
use tollgate_daemon::config::{GrpcClientRules, GrpcSettings, Organization};
use tollgate_daemon::DaemonConfig;
use tollgate_proto::sp1;
use tollgate_proto::sp1::shackle_daemon_client::ShackleDaemonClient;

use rustls::pki_types::pem::PemObject;

use crate::{audited, config, session_events, Running};

const BETA: &str = "beta";
const BETA_SECRET: &[u8] = b"beta's own organization secret, long enough";

/// A CA: its certificate and the means to issue more.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf certificate with these DNS and URI names; `expired` puts its validity in
    /// 2019.
    fn issue(&self, dns: &[&str], uris: &[&str], expired: bool) -> (String, String) {
        let mut p = CertificateParams::new(dns.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .unwrap();
        for u in uris {
            p.subject_alt_names
                .push(SanType::URI((*u).try_into().unwrap()));
        }
        if expired {
            p.not_before = rcgen::date_time_ymd(2019, 1, 1);
            p.not_after = rcgen::date_time_ymd(2019, 12, 31);
        }
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// Certificates for one test: the server's, two organizations' CAs, and a stranger CA.
pub(crate) struct Pki {
    dir: PathBuf,
    server_ca: Ca,
    acme: Ca,
    beta: Ca,
    stranger: Ca,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let pki = Pki {
            dir: dir.join("pki"),
            server_ca: Ca::new("tollgate test server CA"),
            acme: Ca::new("acme agents CA"),
            beta: Ca::new("beta agents CA"),
            stranger: Ca::new("nobody's CA"),
        };
        std::fs::create_dir_all(&pki.dir).unwrap();
        let (cert, key) = pki.server_ca.issue(&["localhost"], &[], false);
        pki.write("server.pem", &cert);
        pki.write("server.key", &key);
        pki.write("acme-ca.pem", &pki.acme.pem());
        pki.write("beta-ca.pem", &pki.beta.pem());
        pki
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// The daemon's configuration: `crate::config` plus organization `beta`, gRPC on
    /// 127.0.0.1:0; acme's agents are its CA's certificates named `*.agents.acme.example`
    /// or `spiffe://acme/*`, beta's any certificate of its CA.
    fn daemon_config(&self, data: &Path) -> DaemonConfig {
        let mut c = config(data);
        c.organizations.push(Organization {
            id: BETA.into(),
            secret: Some(BETA_SECRET.to_vec()),
            operator_secret: None,
        });
        c.grpc = Some(GrpcSettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            cert: self.dir.join("server.pem"),
            key: self.dir.join("server.key"),
        });
        c.grpc_clients.insert(
            crate::ORG.into(),
            GrpcClientRules {
                ca: Some(self.dir.join("acme-ca.pem")),
                fingerprints: Vec::new(),
                san: vec!["*.agents.acme.example".into(), "spiffe://acme/*".into()],
            },
        );
        c.grpc_clients.insert(
            BETA.into(),
            GrpcClientRules {
                ca: Some(self.dir.join("beta-ca.pem")),
                ..GrpcClientRules::default()
            },
        );
        c
    }

    /// A gRPC client configuration for `addr` with this certificate (or none).
    pub(crate) fn client(
        &self,
        addr: std::net::SocketAddr,
        identity: Option<(String, String)>,
    ) -> GrpcConfig {
        GrpcConfig {
            address: addr.to_string(),
            server_name: "localhost".into(),
            ca_pem: self.server_ca.pem().into_bytes(),
            identity: identity.map(|(c, k)| (c.into_bytes(), k.into_bytes())),
        }
    }

    pub(crate) fn acme_agent(&self) -> (String, String) {
        self.acme.issue(&["bot1.agents.acme.example"], &[], false)
    }
}

/// A daemon with the gRPC binding on, and its PKI.
pub(crate) struct Both {
    pub(crate) daemon: Running,
    pub(crate) grpc: std::net::SocketAddr,
    pub(crate) pki: Pki,
}

async fn start_both(dir: &Path) -> Both {
    start_both_with(dir, |_| {}).await
}

/// [`start_both`], the configuration changed by `change` first.
pub(crate) async fn start_both_with(dir: &Path, change: impl FnOnce(&mut DaemonConfig)) -> Both {
    let pki = Pki::new(dir);
    let mut cfg = pki.daemon_config(dir);
    change(&mut cfg);
    let daemon = tollgate_daemon::Daemon::start(cfg).await.unwrap();
    let grpc = daemon.grpc_addr().unwrap();
    assert_ne!(grpc.port(), 0);
    let running = crate::run(daemon);
    Both {
        daemon: running,
        grpc,
        pki,
    }
}

impl Both {
    /// Agent `agent` of acme over gRPC, with client certificate `cert`.
    fn as_agent(&self, cert: (String, String), agent: &str) -> ClientConfig {
        ClientConfig::grpc(self.pki.client(self.grpc, Some(cert)), crate::ORG, agent)
    }
}

/// [`start_both`] with acme enrolling `reviewed` (named by its certificate: no secret),
/// enrollment `required` or not.
async fn start_enrolling_reviewed(dir: &Path, required: bool) -> Both {
    start_both_with(dir, |cfg| {
        cfg.enrollment.insert(
            crate::ORG.into(),
            tollgate_daemon::config::Enrollment {
                required,
                agents: [("reviewed".to_owned(), None)].into_iter().collect(),
            },
        );
    })
    .await
}

/// One way to reach the daemon, for running the same flow over either.
#[derive(Clone)]
pub(crate) enum Via {
    Socket(PathBuf),
    Grpc(GrpcConfig),
}

impl Via {
    pub(crate) fn config(&self, agent: &str) -> ClientConfig {
        let mut c = match self {
            Via::Socket(socket) => crate::client_config(socket, agent),
            Via::Grpc(g) => ClientConfig::grpc(g.clone(), crate::ORG, agent),
        };
        c.timeout = Duration::from_secs(5);
        c
    }

    pub(crate) async fn connect(&self, agent: &str) -> DaemonClient {
        DaemonClient::connect(self.config(agent)).await.unwrap()
    }
}

fn digest(p: &json::Value) -> Vec<u8> {
    Params::json(p).canonical_digest().unwrap().0.to_vec()
}

/// A reply's Debug form with what differs between two runs blanked: session ids, the
/// daemon's clock readings (`*_ns` fields) and audit entry ids.
fn normalized(reply: &dyn std::fmt::Debug) -> String {
    let text = format!("{reply:?}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while !rest.is_empty() {
        let id = rest
            .strip_prefix("s_")
            .filter(|a| a.len() >= 32 && a.as_bytes()[..32].iter().all(u8::is_ascii_hexdigit));
        if let Some(after) = id {
            out.push_str("s_<id>");
            rest = &after[32..];
        } else if let Some(after) = rest.strip_prefix("audit_entry_id: \"") {
            let n = after.find('"').unwrap_or(after.len());
            out.push_str("audit_entry_id: \"<id>");
            rest = &after[n..];
        } else if let Some(after) = rest.strip_prefix("_ns: ") {
            let n = after
                .find(|c: char| !(c.is_ascii_digit() || c == '-'))
                .unwrap_or(after.len());
            out.push_str(if &after[..n] == "0" {
                "_ns: 0"
            } else {
                "_ns: <t>"
            });
            rest = &after[n..];
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// What a flow saw: each reply, normalized, in order.
#[derive(Default)]
struct Transcript(Vec<String>);

impl Transcript {
    fn saw(&mut self, what: &str, reply: &dyn std::fmt::Debug) {
        self.0.push(format!("{what}: {}", normalized(reply)));
    }

    fn verdict(&mut self, what: &str, v: &tollgate_client::ClientVerdict) {
        self.saw(what, &(v.verdict, &v.reason, &v.response));
    }
}

fn assert_same(socket: &Transcript, grpc: &Transcript) {
    assert_eq!(socket.0.len(), grpc.0.len());
    for (s, g) in socket.0.iter().zip(&grpc.0) {
        assert_eq!(s, g, "the socket and gRPC replies differ");
    }
}

/// SP/1.0 Appendix A: register, four identical calls (the fourth denied), the session's
/// state, a fifth call (circuit open), a heartbeat.
async fn appendix_a(via: &Via) -> Transcript {
    let mut t = Transcript::default();
    let c = via.connect("research-bot").await;
    t.saw("register", c.registration());
    let p = json::parse_str(r#"{"q":"rust"}"#).unwrap();
    for i in 0..4 {
        let v = c.pre_exec("web_search", &p, 0.002).await;
        t.verdict(&format!("pre_exec {i}"), &v);
        if v.allowed() {
            c.post_exec(v.call_number, 0.0015, true, "").await.unwrap();
        }
    }
    t.saw("state", &c.session_state().await.unwrap());
    let v = c
        .pre_exec("other", &json::parse_str("{}").unwrap(), 0.0)
        .await;
    t.verdict("after the trip", &v);
    t.saw("heartbeat", &c.heartbeat(0.5).await.unwrap());
    t
}

/// A replayed nonce under a new call number.
async fn replay(via: &Via) -> Transcript {
    let mut t = Transcript::default();
    let c = via.connect("research-bot").await;
    let p = json::parse_str(r#"{"q":"a"}"#).unwrap();
    for n in 1..=2 {
        let v = c
            .pre_exec_request(sp1::PreExecRequest {
                session_id: c.session_id().to_owned(),
                call_number: n,
                tool_name: "web_search".into(),
                tool_params_hash: digest(&p),
                nonce: 77,
                ..Default::default()
            })
            .await;
        t.verdict(&format!("dispatch {n}"), &v);
    }
    t
}

/// HITL: held, still held, approved by an operator (over the socket: operators are not
/// on gRPC), released once, then a replay.
async fn hitl_round_trip(via: &Via, socket: &Path) -> Transcript {
    let mut t = Transcript::default();
    let agent = via.connect("reviewed").await;
    let operator = crate::operator(socket).await;
    let p = json::parse_str(r#"{"amount":100,"to":"acct_1"}"#).unwrap();
    let req = |n: u64| sp1::PreExecRequest {
        session_id: agent.session_id().to_owned(),
        call_number: n,
        tool_name: "wire_transfer".into(),
        tool_params_hash: digest(&p),
        estimated_cost_usd: 1.0,
        nonce: 900,
        ..Default::default()
    };
    t.verdict("held", &agent.pre_exec_request(req(1)).await);
    t.verdict("still held", &agent.pre_exec_request(req(2)).await);
    let decided = operator
        .hitl_decide(sp1::HitlDecideRequest {
            session_id: agent.session_id().to_owned(),
            decision: "approve".into(),
            operator_id: "alice@example.com".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    t.saw("decided", &decided);
    t.saw("state", &agent.session_state().await.unwrap());
    t.verdict("released", &agent.pre_exec_request(req(3)).await);
    t.verdict("single use", &agent.pre_exec_request(req(4)).await);
    t
}

/// A session resumed by a new connection continues its numbering; another agent cannot
/// resume it.
async fn resume(via: &Via) -> Transcript {
    let mut t = Transcript::default();
    let c = via.connect("research-bot").await;
    t.verdict(
        "first",
        &c.pre_exec("t", &json::parse_str("{}").unwrap(), 0.1).await,
    );
    let id = c.session_id().to_owned();
    drop(c);
    let r = DaemonClient::resume(via.config("research-bot"), &id)
        .await
        .unwrap();
    t.saw("resumed", r.registration());
    let v = r
        .pre_exec("t", &json::parse_str(r#"{"x":1}"#).unwrap(), 0.0)
        .await;
    t.verdict("continued", &v);
    let other = DaemonClient::resume(via.config("someone-else"), &id).await;
    t.saw("other agent", &other.map(|_| ()));
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_flows_give_the_same_replies_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    let socket = Via::Socket(b.daemon.socket.clone());
    let grpc = Via::Grpc(b.pki.client(b.grpc, Some(b.pki.acme_agent())));

    let (s, g) = (appendix_a(&socket).await, appendix_a(&grpc).await);
    assert_same(&s, &g);
    // The flow is Appendix A's (so the comparison compares something).
    assert!(g.0[4].contains("max_repeat_exceeded"), "{}", g.0[4]);
    assert!(g.0[6].contains("circuit_open"), "{}", g.0[6]);

    assert_same(&replay(&socket).await, &replay(&grpc).await);
    let sock = &b.daemon.socket;
    let (s, g) = (
        hitl_round_trip(&socket, sock).await,
        hitl_round_trip(&grpc, sock).await,
    );
    assert_same(&s, &g);
    assert!(g.0[4].contains("hitl_transition:approve"), "{}", g.0[4]);
    let (s, g) = (resume(&socket).await, resume(&grpc).await);
    assert_same(&s, &g);
    assert!(g.0[3].contains("SessionNotFound"), "{}", g.0[3]);
    b.daemon.stop().await;

    // Both transports' verdicts are in the one audit log, under organization acme.
    let log = audited(dir.path());
    let approvals = log
        .iter()
        .filter(|e| e.reason.as_str() == "hitl_transition:approve")
        .count();
    assert_eq!(approvals, 2);
    assert!(log.iter().all(|e| e.organization_id == crate::ORG));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_params_and_await_decision_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    let grpc = Via::Grpc(b.pki.client(b.grpc, Some(b.pki.acme_agent())));
    let agent = grpc.connect("reviewed").await;
    let p = json::parse_str(r#"{"amount":5}"#).unwrap();
    let v = agent
        .pre_exec_request(sp1::PreExecRequest {
            session_id: agent.session_id().to_owned(),
            call_number: 1,
            tool_name: "buy".into(),
            tool_params_hash: digest(&p),
            nonce: 5,
            ..Default::default()
        })
        .await;
    assert_eq!(v.verdict, Verdict::Hitl);
    let mut raw = raw_client(&b, Some(b.pki.acme_agent())).await;
    let ack = raw
        .send_held_params(sp1::HeldParams {
            session_id: agent.session_id().to_owned(),
            call_number: 1,
            params_json: r#"{"amount":5}"#.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.call_number, 1);
    // The operator sees the params the agent sent over gRPC.
    let operator = crate::operator(&b.daemon.socket).await;
    let listed = operator.hitl_list().await.unwrap();
    assert_eq!(listed[0].params_json, r#"{"amount":5}"#);
    let pending = raw
        .await_decision(sp1::AwaitDecisionRequest {
            session_id: agent.session_id().to_owned(),
            call_number: 1,
            timeout_ms: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pending.outcome, "pending");
    let waiting = tokio::spawn({
        let mut raw = raw.clone();
        let session_id = agent.session_id().to_owned();
        async move {
            raw.await_decision(sp1::AwaitDecisionRequest {
                session_id,
                call_number: 1,
                timeout_ms: 30_000,
            })
            .await
        }
    });
    operator
        .hitl_decide(sp1::HitlDecideRequest {
            session_id: agent.session_id().to_owned(),
            decision: "reject".into(),
            operator_id: "bob".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let decided = waiting.await.unwrap().unwrap().into_inner();
    assert_eq!(decided.outcome, "reject");
    // Params that do not hash to the held call are refused, with the SP/1.0 code.
    let bad = raw
        .send_held_params(sp1::HeldParams {
            session_id: agent.session_id().to_owned(),
            call_number: 1,
            params_json: r#"{"amount":500}"#.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert_eq!(code_of(&bad), "INVALID_REQUEST");
    // Operators' requests are not on gRPC.
    assert!(matches!(
        agent.hitl_list().await,
        Err(ClientError::Unsupported(_))
    ));
    b.daemon.stop().await;
}

/// The generated client over a TLS channel with this certificate.
async fn raw_client(
    b: &Both,
    identity: Option<(String, String)>,
) -> ShackleDaemonClient<tonic::transport::Channel> {
    let cfg = b.pki.client(b.grpc, identity);
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(tonic::transport::Certificate::from_pem(&cfg.ca_pem));
    if let Some((c, k)) = &cfg.identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(c, k));
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", b.grpc))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    ShackleDaemonClient::new(channel)
}

fn code_of(s: &tonic::Status) -> String {
    s.metadata()
        .get("tollgate-error-code")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// Everything the audit log holds about sessions: nothing, after a refusal.
fn nothing_audited(dir: &Path) {
    assert!(session_events(dir).is_empty(), "something was audited");
}

/// A client whose certificate the daemon's TLS refuses fails closed. With TLS 1.3 the
/// client has finished its handshake when the daemon refuses its certificate, so its
/// first rpc either reads the daemon's alert (`fail_closed:tls`) or finds the connection
/// already closed (`fail_closed:daemon_unreachable`): both are refusals, and the
/// daemon decided nothing.
async fn refused_by_tls(identity: Option<(String, String)>, b: &Both) {
    let cfg = ClientConfig::grpc(b.pki.client(b.grpc, identity), crate::ORG, "research-bot");
    let e = DaemonClient::connect(cfg).await.unwrap_err();
    assert!(
        matches!(e, ClientError::Tls(_) | ClientError::Unreachable(_)),
        "{e:?}"
    );
    assert!(e.reason().starts_with("fail_closed:"), "{}", e.reason());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_certificate_another_ca_or_an_expired_one_decides_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    // No client certificate.
    refused_by_tls(None, &b).await;
    // A certificate from a CA no organization trusts, with an acme name.
    let stranger = b
        .pki
        .stranger
        .issue(&["bot1.agents.acme.example"], &[], false);
    refused_by_tls(Some(stranger), &b).await;
    // acme's CA, acme's name, but expired.
    let expired = b.pki.acme.issue(&["bot1.agents.acme.example"], &[], true);
    refused_by_tls(Some(expired), &b).await;
    // A good certificate still works after all that.
    let good = Via::Grpc(b.pki.client(b.grpc, Some(b.pki.acme_agent())));
    let c = DaemonClient::connect(good.config("research-bot"))
        .await
        .unwrap();
    drop(c);
    b.daemon.stop().await;
    // One session opened (the good client's), nothing else.
    let events = session_events(dir.path());
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(audited(dir.path()).is_empty());
}

/// A SPIFFE-named agent of acme's CA is acme's (a certificate with no acme name is refused
/// in the handshake: an_unmapped_certificate_is_refused_before_any_message_is_read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spiffe_named_certificate_maps_by_uri() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    let spiffe = b.pki.acme.issue(&[], &["spiffe://acme/agent/7"], false);
    let via = Via::Grpc(b.pki.client(b.grpc, Some(spiffe)));
    // It acts as the agent it names (issue 15 §3).
    via.connect("agent/7").await;
    b.daemon.stop().await;
    assert_eq!(session_events(dir.path()).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_of_one_organization_cannot_act_on_anothers_session() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    let acme = Via::Grpc(b.pki.client(b.grpc, Some(b.pki.acme_agent())))
        .connect("research-bot")
        .await;
    let beta_cert = b.pki.beta.issue(&["anything.beta.example"], &[], false);
    // beta's agent registers in beta (its certificate's organization)...
    let beta = DaemonClient::connect(ClientConfig::grpc(
        b.pki.client(b.grpc, Some(beta_cert.clone())),
        "",
        "research-bot",
    ))
    .await
    .unwrap();
    assert_eq!(
        beta.registration().state.as_ref().unwrap().organization_id,
        BETA
    );
    // ...and cannot register in acme...
    let into_acme = DaemonClient::connect(ClientConfig::grpc(
        b.pki.client(b.grpc, Some(beta_cert.clone())),
        crate::ORG,
        "research-bot",
    ))
    .await
    .unwrap_err();
    assert_eq!(into_acme.reason(), "fail_closed:authentication_failed");
    // ...nor call, heartbeat, read or settle in acme's session: it does not exist for it.
    let mut raw = raw_client(&b, Some(beta_cert)).await;
    let s = raw
        .pre_exec(sp1::PreExecRequest {
            session_id: acme.session_id().to_owned(),
            call_number: 1,
            tool_name: "t".into(),
            tool_params_hash: vec![0; 32],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::NotFound);
    assert_eq!(code_of(&s), "SESSION_NOT_FOUND");
    let s = raw
        .get_session_state(sp1::GetSessionStateRequest {
            session_id: acme.session_id().to_owned(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::NotFound);
    let s = raw
        .heartbeat(sp1::Heartbeat {
            session_id: acme.session_id().to_owned(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::NotFound);
    let s = raw
        .post_exec(sp1::PostExecNotification {
            session_id: acme.session_id().to_owned(),
            call_number: 1,
            actual_cost_usd: 1.0,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::NotFound);
    // acme's own agent sees its session untouched.
    let st = acme.session_state().await.unwrap();
    assert_eq!((st.last_call_number, st.budget_spent_nanos), (0, 0));
    b.daemon.stop().await;
    assert!(audited(dir.path()).is_empty(), "nothing was decided");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_selects_alpn_h2() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    let (cert, key) = b.pki.acme_agent();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pem_cert(&b.pki.server_ca.pem())).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![pem_cert(&cert)],
            rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )
        .unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(b.grpc).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(conn.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    drop(conn);
    nothing_audited(dir.path());
    b.daemon.stop().await;
}

fn pem_cert(pem: &str) -> rustls::pki_types::CertificateDer<'static> {
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_certificate_maps_by_fingerprint() {
    use sha2::Digest as _;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    // A self-signed agent certificate no CA issued, pinned for beta.
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["pinned.example".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let mut cfg = pki.daemon_config(dir.path());
    cfg.grpc_clients.get_mut(BETA).unwrap().fingerprints =
        vec![sha2::Sha256::digest(cert.der().as_ref()).into()];
    let daemon = tollgate_daemon::Daemon::start(cfg).await.unwrap();
    let addr = daemon.grpc_addr().unwrap();
    let running = crate::run(daemon);
    let c = DaemonClient::connect(ClientConfig::grpc(
        pki.client(addr, Some((cert.pem(), key.serialize_pem()))),
        "",
        "research-bot",
    ))
    .await
    .unwrap();
    assert_eq!(
        c.registration().state.as_ref().unwrap().organization_id,
        BETA
    );
    // Another self-signed certificate is refused by TLS.
    let other_key = KeyPair::generate().unwrap();
    let other = CertificateParams::new(vec!["pinned.example".to_owned()])
        .unwrap()
        .self_signed(&other_key)
        .unwrap();
    let e = DaemonClient::connect(ClientConfig::grpc(
        pki.client(addr, Some((other.pem(), other_key.serialize_pem()))),
        "",
        "research-bot",
    ))
    .await
    .unwrap_err();
    assert!(e.reason().starts_with("fail_closed:"), "{e:?}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_ca_for_two_organizations_needs_san_patterns_on_both() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut cfg = pki.daemon_config(dir.path());
    // beta now trusts acme's CA too, without narrowing it by name.
    cfg.grpc_clients.get_mut(BETA).unwrap().ca = Some(pki.dir.join("acme-ca.pem"));
    let e = tollgate_daemon::Daemon::start(cfg).await.unwrap_err();
    assert!(e.to_string().contains("trust the same client CA"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_rules_for_an_organization_not_served_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut cfg = pki.daemon_config(dir.path());
    cfg.organizations.retain(|o| o.id != BETA);
    let e = tollgate_daemon::Daemon::start(cfg).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("`beta`, which is not a configured organization"),
        "{e}"
    );
}

/// A message over 1 MiB is refused by the gRPC layer before any handler sees it; nothing
/// is decided, and the connection still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    let agent = Via::Grpc(b.pki.client(b.grpc, Some(b.pki.acme_agent())))
        .connect("research-bot")
        .await;
    let mut raw = raw_client(&b, Some(b.pki.acme_agent())).await;
    let s = raw
        .pre_exec(sp1::PreExecRequest {
            session_id: agent.session_id().to_owned(),
            call_number: 1,
            tool_name: "t".repeat(1 << 20),
            tool_params_hash: vec![0; 32],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::OutOfRange, "{s:?}");
    assert_eq!(code_of(&s), "", "not the daemon's handler");
    let v = agent
        .pre_exec("t", &json::parse_str("{}").unwrap(), 0.0)
        .await;
    assert_eq!((v.verdict, v.call_number), (Verdict::Allow, 1));
    b.daemon.stop().await;
    assert_eq!(audited(dir.path()).len(), 1);
}

/// A fake daemon on gRPC with TLS: it registers anyone, answers every `PreExec` ALLOW
/// for the wrong call (or with an unspecified verdict for call 2), and never answers a
/// heartbeat.
struct Liar;

#[tonic::async_trait]
impl sp1::shackle_daemon_server::ShackleDaemon for Liar {
    async fn register(
        &self,
        _: tonic::Request<sp1::RegisterRequest>,
    ) -> Result<tonic::Response<sp1::RegisterResponse>, tonic::Status> {
        Ok(tonic::Response::new(sp1::RegisterResponse {
            session_id: "s_fake".into(),
            negotiated_protocol: "1.0.0".into(),
            ..Default::default()
        }))
    }
    async fn pre_exec(
        &self,
        r: tonic::Request<sp1::PreExecRequest>,
    ) -> Result<tonic::Response<sp1::PreExecResponse>, tonic::Status> {
        let r = r.into_inner();
        let (call_number, verdict) = match r.call_number {
            2 => (2, sp1::Verdict::Unspecified),
            n => (n + 1, sp1::Verdict::Allow),
        };
        Ok(tonic::Response::new(sp1::PreExecResponse {
            session_id: r.session_id,
            call_number,
            verdict: verdict as i32,
            reason: "within_thresholds".into(),
            ..Default::default()
        }))
    }
    async fn post_exec(
        &self,
        _: tonic::Request<sp1::PostExecNotification>,
    ) -> Result<tonic::Response<()>, tonic::Status> {
        Ok(tonic::Response::new(()))
    }
    async fn heartbeat(
        &self,
        _: tonic::Request<sp1::Heartbeat>,
    ) -> Result<tonic::Response<sp1::HeartbeatAck>, tonic::Status> {
        std::future::pending().await
    }
    async fn get_session_state(
        &self,
        _: tonic::Request<sp1::GetSessionStateRequest>,
    ) -> Result<tonic::Response<sp1::SessionState>, tonic::Status> {
        Err(tonic::Status::not_found("no tollgate-error-code here"))
    }
    async fn send_held_params(
        &self,
        _: tonic::Request<sp1::HeldParams>,
    ) -> Result<tonic::Response<sp1::HeldParamsAck>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn await_decision(
        &self,
        _: tonic::Request<sp1::AwaitDecisionRequest>,
    ) -> Result<tonic::Response<sp1::AwaitDecisionResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn close_session(
        &self,
        _: tonic::Request<sp1::CloseSessionRequest>,
    ) -> Result<tonic::Response<sp1::CloseSessionResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
}

/// Over gRPC the client fails closed as over the socket: a reply for another call, an
/// unspecified verdict, no reply in time, a status that is not the daemon's refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_fails_closed_on_a_lying_or_silent_grpc_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let identity = tonic::transport::Identity::from_pem(
        std::fs::read(pki.dir.join("server.pem")).unwrap(),
        std::fs::read(pki.dir.join("server.key")).unwrap(),
    );
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .unwrap()
            .serve_with_incoming(
                sp1::shackle_daemon_server::ShackleDaemonServer::new(Liar),
                tokio_stream::wrappers::TcpListenerStream::new(listener),
            ),
    );
    let mut cfg = ClientConfig::grpc(pki.client(addr, Some(pki.acme_agent())), "", "bot");
    cfg.timeout = Duration::from_secs(2);
    let c = DaemonClient::connect(cfg).await.unwrap();
    let p = json::parse_str("{}").unwrap();
    let v = c.pre_exec("t", &p, 0.0).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "fail_closed:malformed_reply")
    );
    let v = c.pre_exec("t", &p, 0.0).await;
    assert_eq!(v.call_number, 2);
    assert_eq!(v.verdict, Verdict::Deny, "an unspecified verdict is a DENY");
    let e = c.heartbeat(0.0).await.unwrap_err();
    assert_eq!(e.reason(), "fail_closed:timeout");
    let e = c.session_state().await.unwrap_err();
    assert_eq!(e.reason(), "fail_closed:malformed_reply", "{e:?}");
    server.abort();
    // And a daemon that is not there at all.
    let mut cfg = ClientConfig::grpc(pki.client(addr, Some(pki.acme_agent())), "", "bot");
    cfg.timeout = Duration::from_secs(2);
    let _ = server.await;
    let e = DaemonClient::connect(cfg).await.unwrap_err();
    assert!(e.reason().starts_with("fail_closed:"), "{e:?}");
}

/// The Rust client's "decide, and if held, wait" over gRPC: the params go to operators,
/// the long poll outlives the client's reply timeout, and a modify with edited arguments
/// releases exactly those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_exec_or_wait_over_grpc_runs_the_edited_call() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    let grpc = Via::Grpc(b.pki.client(b.grpc, Some(b.pki.acme_agent())));
    let mut cfg = grpc.config("reviewed");
    cfg.timeout = Duration::from_secs(2);
    let agent = DaemonClient::connect(cfg).await.unwrap();
    let operator = crate::operator(&b.daemon.socket).await;
    let session = agent.session_id().to_owned();
    let decider = tokio::spawn(async move {
        loop {
            let held = operator.hitl_list().await.unwrap();
            if held
                .iter()
                .any(|p| p.session_id == session && p.params_known)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Decide later than the client's own reply timeout: the wait must survive it.
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        operator
            .hitl_decide(sp1::HitlDecideRequest {
                session_id: session,
                decision: "modify".into(),
                operator_id: "carol".into(),
                note: "fewer units".into(),
                successor_params_json: r#"{"amount":2}"#.into(),
                ..Default::default()
            })
            .await
            .unwrap();
    });
    let p = json::parse_str(r#"{"amount":5}"#).unwrap();
    let wait = tollgate_client::HumanWait {
        timeout: Duration::from_secs(20),
        share_params: tollgate_client::ShareParams::All,
    };
    let r = agent.pre_exec_or_wait("buy", &p, 0.0, wait).await;
    decider.await.unwrap();
    assert_eq!(r.decision, "modify");
    assert!(r.allowed(), "{r:?}");
    assert_eq!(r.verdict.reason, "hitl_transition:modify_successor");
    assert_eq!(r.params, Some(json::parse_str(r#"{"amount":2}"#).unwrap()));
    b.daemon.stop().await;
}

// --- issue 17 §1: bounded under attack ---

/// A `register` sent with `cfg`'s certificate over a raw tonic channel: `None` when the
/// channel did not even connect, else the rpc's error status.
async fn raw_rpc(cfg: &GrpcConfig, agent: &str) -> Option<tonic::Status> {
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(tonic::transport::Certificate::from_pem(&cfg.ca_pem));
    if let Some((c, k)) = &cfg.identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(c, k));
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", cfg.address))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .ok()?;
    Some(
        ShackleDaemonClient::new(channel)
            .register(sp1::RegisterRequest {
                agent_id: agent.into(),
                organization_id: crate::ORG.into(),
                ..Default::default()
            })
            .await
            .unwrap_err(),
    )
}

/// §1: a certificate of a trusted CA that maps to no organization. Before: the handshake
/// succeeded and each rpc was read, decoded and answered `UNAUTHENTICATED` by the daemon
/// (so its peer could make the daemon hold and decode messages). Now the handshake itself
/// fails: the rpc fails in transport, with no answer from the daemon's handlers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmapped_certificate_is_refused_before_any_message_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    let nameless = b.pki.acme.issue(&["intruder.example"], &[], false);
    refused_by_tls(Some(nameless.clone()), &b).await;
    let cfg = b.pki.client(b.grpc, Some(nameless));
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(tonic::transport::Certificate::from_pem(&cfg.ca_pem));
    if let Some((c, k)) = &cfg.identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(c, k));
    }
    if let Ok(channel) = tonic::transport::Endpoint::from_shared(format!("https://{}", b.grpc))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
    {
        let s = ShackleDaemonClient::new(channel)
            .register(sp1::RegisterRequest {
                agent_id: "research-bot".into(),
                organization_id: crate::ORG.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            code_of(&s),
            "",
            "the daemon read and answered the rpc: {s:?}"
        );
    }
    b.daemon.stop().await;
    assert!(session_events(dir.path()).is_empty());
}

/// §1: connections that never start their TLS handshake, more than every cap. Before: each
/// took a connection slot at accept and kept it for the handshake timeout, and victims
/// were turned away. Now a connection takes a slot only once its handshake completed with
/// a mapped certificate; handshaking ones are bounded apart, the newest pushing the
/// oldest out, and every victim registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_cannot_keep_agents_off_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut cfg = pki.daemon_config(dir.path());
    cfg.limits.max_connections = 8;
    cfg.limits.max_unauthenticated_connections = 4;
    cfg.limits.frame_timeout = Duration::from_secs(30);
    cfg.limits.auth_timeout = Duration::from_secs(30);
    let daemon = tollgate_daemon::Daemon::start(cfg).await.unwrap();
    let grpc = daemon.grpc_addr().unwrap();
    let running = crate::run(daemon);
    let mut silent = Vec::new();
    for _ in 0..16 {
        silent.push(tokio::net::TcpStream::connect(grpc).await.unwrap());
    }
    for i in 0..3 {
        let via = Via::Grpc(pki.client(grpc, Some(pki.acme_agent())));
        let c = DaemonClient::connect(via.config("research-bot"))
            .await
            .unwrap_or_else(|e| panic!("victim {i} was refused: {e:?}"));
        let v = c.pre_exec("t", &json::parse_str("{}").unwrap(), 0.0).await;
        assert_eq!(v.verdict, Verdict::Allow, "victim {i}");
    }
    running.stop().await;
}

/// A certificate of `issuer` for `dns`, valid from a minute ago until `secs` from now.
fn issue_for(issuer: &Ca, dns: &str, secs: u64) -> (String, String) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut p = CertificateParams::new(vec![dns.to_owned()]).unwrap();
    p.not_before = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(now - 60);
    p.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(now + secs);
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &issuer.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// §1: a connection keeps being served after its certificate expires. Before: an rpc 3 s
/// past notAfter was still ALLOWed (the identity was mapped once, at the handshake). Now
/// the connection is closed at notAfter and any later rpc is refused: the agent fails
/// closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_stops_being_served_when_its_certificate_expires() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    // Valid for 10 s: room for the handshake, registration and first call on a loaded
    // machine, each waiting for an fsync.
    let issued = std::time::Instant::now();
    let short = issue_for(&b.pki.acme, "bot1.agents.acme.example", 10);
    let via = Via::Grpc(b.pki.client(b.grpc, Some(short)));
    let c = via.connect("research-bot").await;
    let v = c
        .pre_exec("t", &json::parse_str(r#"{"n":1}"#).unwrap(), 0.0)
        .await;
    assert_eq!(v.verdict, Verdict::Allow);
    // Past notAfter (second precision, inclusive) by a margin.
    tokio::time::sleep_until((issued + Duration::from_secs(13)).into()).await;
    let v = c
        .pre_exec("t", &json::parse_str(r#"{"n":2}"#).unwrap(), 0.0)
        .await;
    assert_ne!(
        v.verdict,
        Verdict::Allow,
        "served past its certificate's notAfter"
    );
    b.daemon.stop().await;
    assert_eq!(audited(dir.path()).len(), 1);
}

/// §1: path length and CA constraints. One CA, `pathlen:0`, serves two organizations told
/// apart by name. An agent of acme was issued a certificate with CA:TRUE. Before: a
/// certificate it signed for a globex name was accepted as globex's agent (webpki keeps
/// only a trust anchor's name and key, so the root's pathlen:0 was not enforced), and
/// the CA certificate itself was accepted as acme's agent. Now both are refused, and an
/// ordinary agent certificate of the same CA is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_through_an_agents_ca_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut root = CertificateParams::new(Vec::<String>::new()).unwrap();
    root.distinguished_name
        .push(DnType::CommonName, "shared agents CA, pathlen 0");
    root.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let root = CertifiedIssuer::self_signed(root, KeyPair::generate().unwrap()).unwrap();
    let root_file = pki.write("shared-ca.pem", &root.pem());
    let mut cfg = pki.daemon_config(dir.path());
    cfg.grpc_clients.insert(
        crate::ORG.into(),
        GrpcClientRules {
            ca: Some(root_file.clone()),
            fingerprints: Vec::new(),
            san: vec!["*.agents.acme.example".into()],
        },
    );
    cfg.grpc_clients.insert(
        BETA.into(),
        GrpcClientRules {
            ca: Some(root_file),
            fingerprints: Vec::new(),
            san: vec!["*.agents.beta.example".into()],
        },
    );
    let daemon = tollgate_daemon::Daemon::start(cfg).await.unwrap();
    let grpc = daemon.grpc_addr().unwrap();
    let running = crate::run(daemon);
    // acme's agent, wrongly issued CA:TRUE.
    let mut p = CertificateParams::new(vec!["rogue.agents.acme.example".to_owned()]).unwrap();
    p.distinguished_name
        .push(DnType::CommonName, "rogue acme agent");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let rogue_key = KeyPair::generate().unwrap();
    let rogue_key_pem = rogue_key.serialize_pem();
    let rogue = CertifiedIssuer::signed_by(p, rogue_key, &root).unwrap();
    let rogue_pem = rogue.pem();
    // A beta name it signed, presented with the rogue certificate as intermediate.
    let forged = CertificateParams::new(vec!["bot.agents.beta.example".to_owned()]).unwrap();
    let forged_key = KeyPair::generate().unwrap();
    let forged_cert = forged.signed_by(&forged_key, &rogue).unwrap();
    let chain = format!("{}{}", forged_cert.pem(), rogue_pem);
    let as_beta = |identity: (String, String)| {
        let mut c = ClientConfig::grpc(pki.client(grpc, Some(identity)), BETA, "research-bot");
        c.timeout = Duration::from_secs(5);
        c
    };
    let e = DaemonClient::connect(as_beta((chain, forged_key.serialize_pem())))
        .await
        .expect_err("a name signed by an agent's certificate was taken as beta's agent");
    assert!(e.reason().starts_with("fail_closed:"), "{e:?}");
    // The CA:TRUE certificate itself is no agent's.
    let as_acme = ClientConfig::grpc(
        pki.client(grpc, Some((rogue_pem, rogue_key_pem))),
        crate::ORG,
        "research-bot",
    );
    assert!(
        DaemonClient::connect(as_acme).await.is_err(),
        "a CA certificate was taken as acme's agent"
    );
    // An ordinary agent certificate of the shared CA is served.
    let ok = CertificateParams::new(vec!["bot1.agents.acme.example".to_owned()]).unwrap();
    let ok_key = KeyPair::generate().unwrap();
    let ok_cert = ok.signed_by(&ok_key, &root).unwrap();
    let via = Via::Grpc(pki.client(grpc, Some((ok_cert.pem(), ok_key.serialize_pem()))));
    via.connect("research-bot").await;
    running.stop().await;
    assert_eq!(session_events(dir.path()).len(), 1);
}

/// A request body that sends a gRPC message header announcing `announced` bytes and
/// `sent` bytes of it, then nothing more, ever.
struct Stalled(Option<tonic::codegen::Bytes>);

impl http_body::Body for Stalled {
    type Data = tonic::codegen::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        match self.0.take() {
            Some(b) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(b)))),
            None => std::task::Poll::Pending,
        }
    }
}

fn stalled(announced: u32, sent: usize) -> Stalled {
    let mut b = vec![0u8];
    b.extend_from_slice(&announced.to_be_bytes());
    b.resize(5 + sent, 0x0a);
    Stalled(Some(b.into()))
}

/// §1: one connection of a mapped agent opens many rpcs, each an unfinished message of
/// almost 1 MiB. Before: nothing ever ended them (no deadline), and each held its buffer
/// (256 streams per connection: ~260 MiB a connection). Now each rpc ends: the message
/// must arrive within the frame timeout, and its bytes count against 4 MiB per
/// connection and 64 MiB overall, so the rest are refused at once; and the daemon goes on
/// serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_messages_are_bounded_and_every_rpc_ends() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut cfg = pki.daemon_config(dir.path());
    cfg.limits.frame_timeout = Duration::from_secs(1);
    let daemon = tollgate_daemon::Daemon::start(cfg).await.unwrap();
    let grpc = daemon.grpc_addr().unwrap();
    let running = crate::run(daemon);
    let b = Both {
        daemon: running,
        grpc,
        pki,
    };
    let cfg = b.pki.client(b.grpc, Some(b.pki.acme_agent()));
    let tls = tonic::transport::ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(tonic::transport::Certificate::from_pem(&cfg.ca_pem))
        .identity({
            let (c, k) = cfg.identity.as_ref().unwrap();
            tonic::transport::Identity::from_pem(c, k)
        });
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", b.grpc))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut calls = Vec::new();
    for _ in 0..32 {
        let mut ch = channel.clone();
        calls.push(tokio::spawn(async move {
            let req = tonic::codegen::http::Request::builder()
                .method("POST")
                .uri(format!("https://{grpc}/tollgate.sp1.ShackleDaemon/PreExec"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(tonic::body::Body::new(stalled(1_000_000, 900_000)))
                .unwrap();
            std::future::poll_fn(|cx| tower_service::Service::poll_ready(&mut ch, cx))
                .await
                .unwrap();
            let r = tower_service::Service::call(&mut ch, req).await;
            // An answer that is not OK (grpc-status in the headers or trailers), or a
            // reset stream: either way the rpc ended.
            r.map(|resp| {
                resp.headers()
                    .get("grpc-status")
                    .map(|v| v.to_str().unwrap().to_owned())
            })
        }));
    }
    for (i, c) in calls.into_iter().enumerate() {
        let ended = tokio::time::timeout(Duration::from_secs(60), c)
            .await
            .unwrap_or_else(|_| panic!("rpc {i} with an unfinished message never ended"))
            .unwrap();
        if let Ok(Some(status)) = ended {
            assert_ne!(status, "0", "rpc {i} succeeded");
        }
    }
    // Still serving agents.
    let via = Via::Grpc(b.pki.client(b.grpc, Some(b.pki.acme_agent())));
    let c = via.connect("research-bot").await;
    let v = c.pre_exec("t", &json::parse_str("{}").unwrap(), 0.0).await;
    assert_eq!(v.verdict, Verdict::Allow);
    b.daemon.stop().await;
}

/// Issue 15 §3: a certificate that names an agent (`spiffe://acme/AGENT`) registers as that
/// agent only; with enrollment, an enrolled id is reserved to a certificate naming it, and
/// `require_enrollment` refuses ids that are not enrolled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_naming_an_agent_registers_only_as_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    let bot = b.pki.acme.issue(&[], &["spiffe://acme/bot"], false);
    let as_bot = |agent: &str| b.as_agent(bot.clone(), agent);
    // The attack: spiffe://acme/bot registering as someone-else (to get the default guard).
    let e = DaemonClient::connect(as_bot("someone-else"))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "fail_closed:authentication_failed", "{e}");
    let served = DaemonClient::connect(as_bot("bot")).await.unwrap();
    assert_eq!(
        served.registration().state.as_ref().unwrap().agent_id,
        "bot"
    );
    // A certificate naming two agents is nobody's: its connection is closed (fail closed).
    let two = b
        .pki
        .acme
        .issue(&[], &["spiffe://acme/bot", "spiffe://acme/other"], false);
    let e = DaemonClient::connect(ClientConfig::grpc(
        b.pki.client(b.grpc, Some(two)),
        crate::ORG,
        "bot",
    ))
    .await
    .unwrap_err();
    assert!(e.reason().starts_with("fail_closed:"), "{e}");
    b.daemon.stop().await;
    assert_eq!(crate::opened_agents(dir.path()), ["bot"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrolled_agents_over_grpc_get_their_own_guard_and_nobody_else_does() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_enrolling_reviewed(dir.path(), true).await;
    let (pki, grpc) = (&b.pki, b.grpc);
    let connect = |cert, agent: &str| DaemonClient::connect(b.as_agent(cert, agent));
    // The enrolled agent, named by its certificate, is served under its own guard (HITL
    // always).
    let reviewed = pki.acme.issue(&[], &["spiffe://acme/reviewed"], false);
    let agent = connect(reviewed.clone(), "reviewed").await.unwrap();
    let p = json::parse_str("{}").unwrap();
    assert_eq!(agent.pre_exec("t", &p, 0.0).await.verdict, Verdict::Hitl);
    // acme requires enrollment, so a certificate of acme that names no agent, or names one
    // that is not enrolled, is refused in the TLS handshake (issue 17 §1: before any
    // message is read), whatever id it would claim: as the enrolled agent, or a new id.
    let stranger = pki.acme.issue(&[], &["spiffe://acme/pa-0"], false);
    for (cert, agent) in [
        (pki.acme_agent(), "reviewed"),
        (pki.acme_agent(), "pa-0"),
        (stranger.clone(), "pa-0"),
        (stranger, "reviewed"),
    ] {
        let e = connect(cert.clone(), agent).await.unwrap_err();
        assert!(
            matches!(e, ClientError::Tls(_) | ClientError::Unreachable(_)),
            "{agent}: {e:?}"
        );
        // Raw: the rpc fails in transport; no handler of the daemon answered it.
        if let Some(s) = raw_rpc(&pki.client(grpc, Some(cert)), agent).await {
            assert_eq!(
                code_of(&s),
                "",
                "the daemon read and answered the rpc: {s:?}"
            );
        }
    }
    b.daemon.stop().await;
    assert_eq!(crate::opened_agents(dir.path()).len(), 1);
}

/// Issue 15 §3 without `require_enrollment`: acme enrolls `reviewed` (named by its
/// certificate) but takes claimed ids too. A certificate of acme that names no agent may
/// register under a claimed id, but not as the enrolled agent: that id is reserved to a
/// certificate naming it, which is served under its own guard (HITL always).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_required_enrollment_a_certificate_naming_no_agent_cannot_claim_an_enrolled_id() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_enrolling_reviewed(dir.path(), false).await;
    let pki = &b.pki;
    let connect = |cert, agent: &str| DaemonClient::connect(b.as_agent(cert, agent));
    let p = json::parse_str("{}").unwrap();
    // A claimed id: served (no enrollment required).
    let claimed = connect(pki.acme_agent(), "someone").await.unwrap();
    assert_eq!(claimed.pre_exec("t", &p, 0.0).await.verdict, Verdict::Allow);
    // The attack: the same certificate claims the enrolled id (to be taken for it).
    let e = connect(pki.acme_agent(), "reviewed").await.unwrap_err();
    assert_eq!(e.reason(), "fail_closed:authentication_failed", "{e}");
    // The enrolled agent's own certificate: served as it, under its guard.
    let reviewed = pki.acme.issue(&[], &["spiffe://acme/reviewed"], false);
    let agent = connect(reviewed, "reviewed").await.unwrap();
    assert_eq!(agent.pre_exec("t", &p, 0.0).await.verdict, Verdict::Hitl);
    b.daemon.stop().await;
    assert_eq!(crate::opened_agents(dir.path()), ["someone", "reviewed"]);
}

/// Issue 17 §4 over gRPC: `CloseSession` ends the session (audited), and every later rpc
/// about it is `NOT_FOUND`: the same core as the socket's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_closes_its_session_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let b = start_both(dir.path()).await;
    let cfg = || {
        ClientConfig::grpc(
            b.pki.client(b.grpc, Some(b.pki.acme_agent())),
            crate::ORG,
            "research-bot",
        )
    };
    let agent = DaemonClient::connect(cfg()).await.unwrap();
    let p = json::parse_str("{}").unwrap();
    assert!(agent.pre_exec("t", &p, 0.1).await.allowed());
    let closed = agent.close().await.unwrap();
    assert_eq!(closed.session_id, agent.session_id());
    assert_eq!(agent.pre_exec("t", &p, 0.1).await.verdict, Verdict::Deny);
    let e = DaemonClient::resume(cfg(), agent.session_id())
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "fail_closed:session_not_found", "{e}");
    b.daemon.stop().await;
    let last = session_events(dir.path()).pop().unwrap();
    assert!(
        matches!(&last, tollgate_audit::SessionEvent::Closed(c) if c.session_id == closed.session_id),
        "{last:?}"
    );
}
