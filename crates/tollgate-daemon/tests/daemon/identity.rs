//! Who an agent is (issue 15 §3) and the money edges (§4): ids are checked with one rule
//! on every transport, negative amounts however small are refused.

use tollgate_client::{ClientError, DaemonClient};
use tollgate_core::{json, Verdict};
use tollgate_proto::sp1::{self, ErrorCode};

use crate::{audited, client_config, config, connect, session_events, start, ORG};

fn digest(p: &json::Value) -> Vec<u8> {
    json::canonical_hash(p).unwrap().0.to_vec()
}

/// The code a registration as `agent` is refused with.
async fn refused(socket: &std::path::Path, agent: &str) -> ErrorCode {
    match DaemonClient::connect(client_config(socket, agent)).await {
        Ok(_) => panic!("{agent:?} was registered"),
        Err(ClientError::Refused { code, .. }) => code,
        Err(e) => panic!("{agent:?}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_agent_ids_are_invalid_requests_and_open_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.limits.registrations_per_second_per_peer = 1000;
    let d = start(c).await;
    for bad in [
        "research-bot ",
        " research-bot",
        "research\tbot",
        "research-bot\u{1}",
        "research-bot\u{0}",
        "research-bot\u{7f}",
        "research-bot\u{a0}",
        "research-bot\u{2028}",
        "research-bot\u{3000}",
        "research-bot\u{200b}",
        "",
    ] {
        assert_eq!(
            refused(&d.socket, bad).await,
            ErrorCode::InvalidRequest,
            "{bad:?}"
        );
    }
    let long = "a".repeat(129);
    assert_eq!(refused(&d.socket, &long).await, ErrorCode::InvalidRequest);
    // The set's edges are served.
    for good in ["a".repeat(128).as_str(), "acme.bot:1/x@y+z_w-v"] {
        connect(&d.socket, good).await;
    }
    d.stop().await;
    let opened = session_events(dir.path())
        .into_iter()
        .filter(|e| matches!(e, tollgate_audit::SessionEvent::Opened(_)))
        .count();
    assert_eq!(opened, 2, "only the two good ids opened sessions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trailing_space_does_not_dodge_the_agents_guard() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let held = connect(&d.socket, "reviewed").await;
    let p = json::parse_str("{}").unwrap();
    assert_eq!(held.pre_exec("t", &p, 0.0).await.verdict, Verdict::Hitl);
    assert_eq!(
        refused(&d.socket, "reviewed ").await,
        ErrorCode::InvalidRequest
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_estimate_however_small_is_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.limits.registrations_per_second_per_peer = 1000;
    let d = start(c).await;
    let p = json::parse_str(r#"{"q":1}"#).unwrap();
    for (n, cost) in [-4e-10, -1e-12, -f64::MIN_POSITIVE].into_iter().enumerate() {
        let agent = connect(&d.socket, "research-bot").await;
        let v = agent
            .pre_exec_request(sp1::PreExecRequest {
                session_id: agent.session_id().to_owned(),
                call_number: 1,
                tool_name: "search".into(),
                tool_params_hash: digest(&p),
                estimated_cost_usd: cost,
                nonce: 1 + n as u64,
                ..Default::default()
            })
            .await;
        assert_eq!(
            (v.verdict, v.reason.as_str()),
            (Verdict::Deny, "policy_violation:malformed_input"),
            "{cost}"
        );
    }
    d.stop().await;
    assert!(audited(dir.path())
        .iter()
        .all(|v| v.verdict == Verdict::Deny));
}

#[test]
fn a_negative_configured_budget_however_small_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for key in ["[guard.default]", "[guard.agents.bot]"] {
        for b in ["-4e-10", "-1e-12", "-0.5"] {
            let e = tollgate_daemon::DaemonConfig::from_toml(
                &format!("{key}\nbudget_usd = {b}\n"),
                dir.path(),
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("budget_usd") && e.contains("negative"),
                "{b}: {e}"
            );
        }
    }
    for bad in ["\"bot \"", "\"bot\\u00a0\"", "\"b\\u0001\""] {
        let e = tollgate_daemon::DaemonConfig::from_toml(
            &format!("[guard.agents.{bad}]\nbudget_usd = 1\n"),
            dir.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("guard.agents"), "{bad}: {e}");
        let e = tollgate_daemon::DaemonConfig::from_toml(
            &format!(
                "[[organization]]\nid = {bad}\nsecret = \"0123456789abcdef0123\"\noperator_secret = \"fedcba9876543210fedc\"\n"
            ),
            dir.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("organization[0].id"), "{bad}: {e}");
    }
}

// --- enrollment (issue 15 §3) ---

const BOT_SECRET: &[u8] = b"research-bot's very own secret";
const PA_SECRET: &[u8] = b"pa's own secret, nobody else's";

fn enrolled(
    c: &mut tollgate_daemon::DaemonConfig,
    required: bool,
    agents: &[(&str, Option<&[u8]>)],
) {
    c.enrollment.insert(
        ORG.into(),
        tollgate_daemon::config::Enrollment {
            required,
            agents: agents
                .iter()
                .map(|(a, s)| ((*a).to_owned(), s.map(<[u8]>::to_vec)))
                .collect(),
        },
    );
}

fn as_agent(socket: &std::path::Path, secret: &[u8], agent: &str) -> tollgate_client::ClientConfig {
    let mut c = tollgate_client::ClientConfig::new(socket, ORG, secret, agent);
    c.timeout = std::time::Duration::from_secs(5);
    c
}

async fn code_of(config: tollgate_client::ClientConfig) -> ErrorCode {
    match DaemonClient::connect(config).await {
        Ok(c) => panic!(
            "registered as {}",
            c.registration().state.as_ref().unwrap().agent_id
        ),
        Err(ClientError::Refused { code, .. }) => code,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enrolled_agent_is_served_with_its_own_secret_and_only_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    enrolled(&mut c, false, &[("research-bot", Some(BOT_SECRET))]);
    let d = start(c).await;
    let p = json::parse_str("{}").unwrap();

    // Served, every request sealed with its own key: register, decide, settle, heartbeat,
    // state; the guard is research-bot's (budget 0.50).
    let bot = DaemonClient::connect(as_agent(&d.socket, BOT_SECRET, "research-bot"))
        .await
        .unwrap();
    let active = bot.registration().active_config.as_ref().unwrap();
    assert_eq!(active.budget_nanos, 500_000_000);
    assert!(bot.pre_exec("t", &p, 0.1).await.allowed());
    bot.post_exec(1, 0.1, true, "").await.unwrap();
    bot.heartbeat(0.4).await.unwrap();
    assert_eq!(bot.session_state().await.unwrap().total_calls, 1);

    // The organization's secret cannot register as it, nor resume its session.
    assert_eq!(
        code_of(as_agent(&d.socket, crate::SECRET, "research-bot")).await,
        ErrorCode::AuthenticationFailed
    );
    let resumed = DaemonClient::resume(
        as_agent(&d.socket, crate::SECRET, "research-bot"),
        bot.session_id(),
    )
    .await;
    assert!(
        resumed.is_err(),
        "the organization's secret resumed an enrolled agent's session"
    );
    // Nor act on the session: an org-secret client's requests about it are not served.
    let other = DaemonClient::connect(as_agent(&d.socket, crate::SECRET, "other"))
        .await
        .unwrap();
    let e = other.state_of(bot.session_id()).await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Refused {
                code: ErrorCode::AuthenticationFailed | ErrorCode::SessionNotFound,
                ..
            }
        ),
        "{e}"
    );
    // Its own secret is no other agent's: it cannot register as someone else.
    assert_eq!(
        code_of(as_agent(&d.socket, BOT_SECRET, "someone-else")).await,
        ErrorCode::AuthenticationFailed
    );
    d.stop().await;
    assert_eq!(crate::opened_agents(dir.path()), ["research-bot", "other"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_ids_cannot_mint_per_agent_budgets_when_enrollment_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.limits.registrations_per_second_per_peer = 1000;
    let mut g = c.default_guard.clone();
    g.budget = tollgate_core::Money::from_usd(1.0).unwrap();
    g.budget_scope = tollgate_core::BudgetScope::PerAgent;
    g.max_repeat_calls = 100;
    c.agent_guards.insert("pa".into(), g);
    enrolled(&mut c, true, &[("pa", Some(PA_SECRET))]);
    let d = start(c).await;
    // The attack: pa-0, pa-1, pa-2 each a fresh 1 USD. Refused with either secret.
    for n in 0..3 {
        let id = format!("pa-{n}");
        for secret in [crate::SECRET, PA_SECRET] {
            assert_eq!(
                code_of(as_agent(&d.socket, secret, &id)).await,
                ErrorCode::AuthenticationFailed,
                "{id}"
            );
        }
    }
    // pa itself is served; two sessions of pa share its one dollar.
    let p = json::parse_str("{}").unwrap();
    let mut allowed = 0.0;
    for _ in 0..3 {
        let pa = DaemonClient::connect(as_agent(&d.socket, PA_SECRET, "pa"))
            .await
            .unwrap();
        for _ in 0..2 {
            if pa.pre_exec("t", &p, 0.4).await.allowed() {
                allowed += 0.4;
            }
        }
    }
    assert!(allowed <= 1.0 + 1e-9, "pa was allowed {allowed} USD of 1");
    assert!(allowed > 0.0);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_warns_when_per_agent_guards_rest_on_claimed_ids() {
    let dir = tempfile::tempdir().unwrap();
    // crate::config has guards for research-bot and reviewed, and no enrollment.
    let daemon = tollgate_daemon::Daemon::start(config(dir.path()))
        .await
        .unwrap();
    let w = daemon.warnings().join("\n");
    assert!(
        w.contains("claimed agent ids") && w.contains("`research-bot`"),
        "{w}"
    );
    drop(daemon);
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    enrolled(
        &mut c,
        true,
        &[("research-bot", Some(BOT_SECRET)), ("reviewed", None)],
    );
    let daemon = tollgate_daemon::Daemon::start(c).await.unwrap();
    let w = daemon.warnings().join("\n");
    assert!(!w.contains("claimed"), "{w}");
}

#[test]
fn enrollment_is_read_from_the_configuration_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let org = "[[organization]]\nid = \"acme\"\nsecret = \"0123456789abcdef0123\"\noperator_secret = \"fedcba9876543210fedc\"\n";
    let c = tollgate_daemon::DaemonConfig::from_toml(
        &format!(
            "{org}require_enrollment = true\n[[organization.agent]]\nid = \"bot\"\nsecret = \"bot's secret, sixteen+\"\n[[organization.agent]]\nid = \"grpc-only\"\n"
        ),
        dir.path(),
    )
    .unwrap();
    let e = &c.enrollment["acme"];
    assert!(e.required);
    assert_eq!(
        e.agents["bot"].as_deref(),
        Some(&b"bot's secret, sixteen+"[..])
    );
    assert_eq!(e.agents["grpc-only"], None);
    let err = |extra: &str| {
        tollgate_daemon::DaemonConfig::from_toml(&format!("{org}{extra}"), dir.path())
            .unwrap_err()
            .to_string()
    };
    let agent = |id: &str, secret: &str| {
        format!("[[organization.agent]]\nid = \"{id}\"\nsecret = \"{secret}\"\n")
    };
    assert!(err(&agent("bot ", "bot's secret, sixteen+")).contains("organization[0].agent[0].id"));
    assert!(err(&agent("bot", "short")).contains("at least 16"));
    assert!(err(&agent("bot", "0123456789abcdef0123")).contains("must differ"));
    assert!(err(&format!(
        "{}{}",
        agent("bot", "bot's secret, sixteen+"),
        agent("bot", "another secret, sixteen+")
    ))
    .contains("appears twice"));
    assert!(err(&format!(
        "{}{}",
        agent("a", "bot's secret, sixteen+"),
        agent("b", "bot's secret, sixteen+")
    ))
    .contains("must differ"));
}
