//! Daemon mode: a real daemon (in this process, on a temporary socket) decides; a held call
//! waits for an operator (`hitl_decide`) while the host waits, then runs; the daemon
//! unreachable is a DENY; the repeat limit is the daemon's.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tokio::sync::oneshot;
use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::Money;
use tollgate_daemon::config::Organization;
use tollgate_daemon::{Daemon, DaemonConfig};
use tollgate_proto::sp1;

use crate::{denied, start, text, Host, Kit};

const ORG: &str = "acme";
const SECRET: &[u8] = b"a test organization secret of some length";
const OPERATOR_SECRET: &[u8] = b"the operators' own secret, not the agents'";

struct Running {
    socket: std::path::PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), tollgate_daemon::DaemonError>>,
}

/// The organization `acme` with its agents' and operators' secrets, in `dir`.
fn acme(dir: &Path) -> DaemonConfig {
    DaemonConfig {
        data_dir: dir.to_owned(),
        organizations: vec![Organization {
            id: ORG.into(),
            secret: Some(SECRET.to_vec()),
            operator_secret: Some(OPERATOR_SECRET.to_vec()),
        }],
        ..DaemonConfig::default()
    }
}

/// A daemon whose agent `mcp-gateway` has HITL always (`hitl`) or a repeat limit of 3.
async fn daemon(dir: &Path, hitl: bool) -> Running {
    Running::start(gateway_config(dir, hitl)).await
}

/// [`daemon`]'s configuration.
fn gateway_config(dir: &Path, hitl: bool) -> DaemonConfig {
    let mut c = acme(dir);
    let mut g = c.default_guard.clone();
    g.budget = Money::from_usd(10.0).unwrap();
    g.max_repeat_calls = 3;
    if hitl {
        g.hitl_mode = tollgate_core::HitlMode::Always;
    }
    c.agent_guards.insert("mcp-gateway".into(), g);
    c
}

impl Running {
    /// A daemon of `config`, serving until [`Running::stop`].
    async fn start(config: DaemonConfig) -> Running {
        let d = Daemon::start(config).await.unwrap();
        let socket = d.socket().to_owned();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(d.run(async {
            let _ = rx.await;
        }));
        Running {
            socket,
            stop: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.task.await.unwrap().unwrap();
    }
}

fn daemon_kit(socket: &Path, extra: &str) -> Kit {
    let kit = Kit::new(&format!(
        "[gateway]\nmode = \"daemon\"\nhitl_timeout_secs = 60\n{extra}\n\
         [daemon]\nsocket = {socket:?}\nsecret_file = \"agents.secret\"\norganization = \"{ORG}\"\n"
    ));
    std::fs::write(kit.dir.path().join("agents.secret"), SECRET).unwrap();
    kit
}

async fn operator(socket: &Path) -> DaemonClient {
    let mut c = ClientConfig::new(socket, ORG, OPERATOR_SECRET, "operator");
    c.timeout = Duration::from_secs(5);
    DaemonClient::operator(c).await.unwrap()
}

/// The first held call that `pick` takes (polled: each poll is a round trip, no timing
/// threshold).
async fn held_where(
    op: &DaemonClient,
    pick: impl Fn(&sp1::HitlPending) -> bool,
) -> sp1::HitlPending {
    loop {
        let p = op.hitl_list().await.unwrap();
        if let Some(h) = p.into_iter().find(&pick) {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first held call whose params the gateway has shown to operators.
async fn held_with_params(op: &DaemonClient) -> sp1::HitlPending {
    held_where(op, |p| p.params_known).await
}

/// Operator `alice`'s `decision` on the held call `held` (add a note or successor params
/// with struct update syntax).
fn decision(held: &sp1::HitlPending, decision: &str) -> sp1::HitlDecideRequest {
    sp1::HitlDecideRequest {
        session_id: held.session_id.clone(),
        call_number: held.transition.as_ref().unwrap().call_number,
        decision: decision.into(),
        operator_id: "alice".into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_waits_for_an_operator_then_runs() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), true).await;
    let kit = daemon_kit(&d.socket, "");
    let s = start(&kit.config(), Host::default()).await;
    let call = tokio::spawn(async move {
        let r = s.ok("add", json!({"a": 20, "b": 22})).await;
        (s, r)
    });
    // The operator sees the held call, with the arguments the host sent, and approves it.
    let op = operator(&d.socket).await;
    let held = &held_with_params(&op).await;
    assert_eq!(op.hitl_list().await.unwrap().len(), 1);
    assert_eq!(held.agent_id, "mcp-gateway");
    assert_eq!(held.transition.as_ref().unwrap().tool_name, "add");
    assert_eq!(held.params_json, r#"{"a":20,"b":22}"#);
    assert!(
        kit.invocations().is_empty(),
        "nothing runs before the human decides"
    );
    op.hitl_decide(decision(held, "approve")).await.unwrap();
    let (s, r) = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the host's call completes once approved")
        .unwrap();
    assert_eq!(text(&r), "42");
    assert_eq!(kit.invocations(), ["add"]);
    s.close().await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_held_call_is_denied() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), true).await;
    let kit = daemon_kit(&d.socket, "");
    let s = start(&kit.config(), Host::default()).await;
    let call = tokio::spawn(async move {
        let r = s.ok("add", json!({"a": 1})).await;
        (s, r)
    });
    let op = operator(&d.socket).await;
    let held = held_where(&op, |_| true).await;
    op.hitl_decide(decision(&held, "reject")).await.unwrap();
    let (s, r) = call.await.unwrap();
    assert!(
        text(&r).starts_with("denied: hitl_transition:reject;"),
        "{}",
        text(&r)
    );
    assert!(kit.invocations().is_empty());
    s.close().await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_decides_the_repeat_limit_an_unreachable_daemon_is_a_deny_and_its_log_replays() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), false).await;
    let kit = daemon_kit(&d.socket, "");
    let s = start(&kit.config(), Host::default()).await;
    for _ in 0..3 {
        assert_eq!(text(&s.ok("add", json!({"a": 1, "b": 1})).await), "2");
    }
    let fourth = s.ok("add", json!({"a": 1, "b": 1})).await;
    assert_eq!(
        text(&fourth),
        "denied: max_repeat_exceeded; this exact call was repeated 3 times. Tollgate did not \
         run `add`. Do not repeat it: change the arguments or stop."
    );
    // The repeat tripped the session's circuit: anything after is refused.
    let after = s.ok("echo", json!({"text": "x"})).await;
    assert!(
        text(&after).starts_with("denied: circuit_open"),
        "{}",
        text(&after)
    );
    d.stop().await;
    let r = s.ok("echo", json!({"text": "x"})).await;
    assert!(denied(&r));
    assert!(text(&r).starts_with("denied: fail_closed:"), "{}", text(&r));
    assert_eq!(kit.invocations(), ["add", "add", "add"]);
    s.close().await;
    replays_with_no_flip_and_one_under_a_lower_repeat_limit(data.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_daemon_at_all_is_a_deny_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let kit = daemon_kit(&dir.path().join("absent.sock"), "");
    let s = start(&kit.config(), Host::default()).await;
    let r = s.ok("add", json!({"a": 1})).await;
    assert!(
        text(&r).starts_with("denied: fail_closed:daemon_unreachable;"),
        "{}",
        text(&r)
    );
    assert!(kit.invocations().is_empty());
    s.close().await;
}

/// The gateway's one session survives a daemon restart: the next call resumes it (its
/// circuit still open), it never opens a fresh session with a fresh budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_daemon_resumes_the_same_session() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), false).await;
    let socket = d.socket.clone();
    let kit = daemon_kit(&socket, "");
    let s = start(&kit.config(), Host::default()).await;
    for _ in 0..3 {
        assert_eq!(text(&s.ok("add", json!({"a": 1})).await), "1");
    }
    assert!(text(&s.ok("add", json!({"a": 1})).await).starts_with("denied: max_repeat_exceeded;"));
    d.stop().await;
    assert!(text(&s.ok("add", json!({"a": 2})).await).starts_with("denied: fail_closed:"));
    let d = daemon(data.path(), false).await;
    let after = s.ok("add", json!({"a": 3})).await;
    assert!(
        text(&after).starts_with("denied: circuit_open;"),
        "the resumed session remembers its tripped circuit: {}",
        text(&after)
    );
    assert_eq!(kit.invocations(), ["add", "add", "add"]);
    s.close().await;
    d.stop().await;
}

/// Issue 15 §3: the gateway connects as an enrolled agent with the agent's own secret
/// (`[daemon] secret_file`); with the organization's secret the enrolled id is refused,
/// and every call is a DENY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_uses_an_enrolled_agents_own_secret() {
    const AGENT_SECRET: &[u8] = b"the gateway agent's own secret";
    let data = tempfile::tempdir().unwrap();
    let mut c = acme(data.path());
    c.enrollment.insert(
        ORG.into(),
        tollgate_daemon::config::Enrollment {
            required: true,
            agents: [("mcp-gateway".to_owned(), Some(AGENT_SECRET.to_vec()))]
                .into_iter()
                .collect(),
        },
    );
    let d = Running::start(c).await;

    let kit = daemon_kit(&d.socket, "");
    std::fs::write(kit.dir.path().join("agents.secret"), AGENT_SECRET).unwrap();
    let s = start(&kit.config(), Host::default()).await;
    assert_eq!(text(&s.ok("add", json!({"a": 2, "b": 3})).await), "5");
    s.close().await;

    // The organization's secret cannot act as the enrolled agent.
    let kit = daemon_kit(&d.socket, "");
    let s = start(&kit.config(), Host::default()).await;
    let r = s.ok("add", json!({"a": 1})).await;
    assert!(
        text(&r).starts_with("denied: fail_closed:authentication_failed;"),
        "{}",
        text(&r)
    );
    assert!(kit.invocations().is_empty());
    s.close().await;
    d.stop().await;
}

/// Issue 16 §3: the host cancels a call held for the daemon's operators; an operator
/// approves it afterwards; it never runs. While it was held, the host got progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_the_host_cancels_never_runs_even_if_approved_later() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), true).await;
    let kit = daemon_kit(&d.socket, "progress_interval_secs = 1");
    let host = Host::default();
    let progress = host.progress.clone();
    let s = start(&kit.config(), host).await;
    let call = crate::cancel::cancellable(&s, "add", json!({"a": 1, "b": 1})).await;
    let op = operator(&d.socket).await;
    let held = held_with_params(&op).await;
    crate::cancel::eventually("progress while held", || {
        progress
            .lock()
            .unwrap()
            .iter()
            .any(|m| m.contains("waiting for a human"))
    })
    .await;
    call.cancel(Some("the user gave up".into())).await.unwrap();
    // Give the gateway the cancellation before the operator decides: the next request on
    // the host's connection is answered only after the notification was read.
    let _ = s.client.list_all_tools().await.unwrap();
    let _ = op.hitl_decide(decision(&held, "approve")).await;
    // Nothing re-dispatches it. A gateway still waiting on the call would run it within
    // milliseconds of the approval; watch the upstream's log for two seconds.
    for _ in 0..40 {
        assert!(kit.invocations().is_empty(), "{:?}", kit.invocations());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.close().await;
    assert!(kit.invocations().is_empty(), "{:?}", kit.invocations());
    d.stop().await;
}

/// Issue 16 §2: an operator modifies a held call; the upstream runs the edited arguments
/// only (the host's own are never forwarded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_modify_runs_only_the_edited_arguments() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), true).await;
    let kit = daemon_kit(&d.socket, "");
    let s = start(&kit.config(), Host::default()).await;
    let call = tokio::spawn(async move {
        let r = s.ok("add", json!({"a": 1, "b": 1})).await;
        (s, r)
    });
    let op = operator(&d.socket).await;
    let held = held_with_params(&op).await;
    op.hitl_decide(sp1::HitlDecideRequest {
        successor_params_json: r#"{"a":40,"b":2}"#.into(),
        ..decision(&held, "modify")
    })
    .await
    .unwrap();
    let (s, r) = call.await.unwrap();
    assert_eq!(text(&r), "42", "the edited arguments ran, not the host's");
    assert_eq!(kit.invocations(), ["add"]);
    s.close().await;
    d.stop().await;
}

/// Issue 16 §5: a reject's note reaches the model with the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejects_note_reaches_the_model() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), true).await;
    let kit = daemon_kit(&d.socket, "");
    let s = start(&kit.config(), Host::default()).await;
    let call = tokio::spawn(async move {
        let r = s.ok("add", json!({"a": 7})).await;
        (s, r)
    });
    let op = operator(&d.socket).await;
    let held = held_with_params(&op).await;
    op.hitl_decide(sp1::HitlDecideRequest {
        note: "use the staging account".into(),
        ..decision(&held, "reject")
    })
    .await
    .unwrap();
    let (s, r) = call.await.unwrap();
    assert_eq!(
        text(&r),
        "denied: hitl_transition:reject; a human refused this call. Tollgate did not run `add`. \
         The human said: use the staging account"
    );
    assert!(kit.invocations().is_empty());
    // One refusal refuses that call only: the next one is held for a human in turn.
    let next = tokio::spawn(async move {
        let r = s.ok("add", json!({"a": 8})).await;
        (s, r)
    });
    let again = held_where(&op, |p| {
        p.params_known
            && p.transition.as_ref().unwrap().call_number != 1
            && p.params_json.contains('8')
    })
    .await;
    op.hitl_decide(decision(&again, "approve")).await.unwrap();
    let (s, r) = next.await.unwrap();
    assert_eq!(text(&r), "8");
    assert_eq!(kit.invocations(), ["add"]);
    s.close().await;
    d.stop().await;
}

/// A daemon (`tollgate serve`'s code, in this process) whose `[policy]` is `cedar`, with
/// the default `allow`.
async fn daemon_with_policy(dir: &Path, cedar: &str) -> Running {
    let file = dir.join("tools.cedar");
    std::fs::write(&file, cedar).unwrap();
    let mut c = acme(dir);
    c.policy = Some(tollgate_policy::files::Settings {
        files: vec![file],
        default: tollgate_policy::DefaultEffect::Allow,
        schema: None,
        trip_on_refusal: false,
        shadow: false,
    });
    Running::start(c).await
}

/// Daemon mode with a policy set: the daemon decides with the params the gateway sends
/// (an argument rule), the session's flow labels (a label rule) and refuses a forbidden
/// tool; the refused calls never run. `tools/list` is not filtered in daemon mode (the
/// daemon holds the set): a tool forbidden outright is listed, and refused when called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_s_policy_set_decides_by_arguments_and_flow_labels() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon_with_policy(
        data.path(),
        "@id(\"no-secrets\")\n\
         forbid (principal, action == Action::\"echo\", resource)\n\
         when { context.args has text && context.args.text like \"*secret*\" };\n\
         @id(\"adds\") @label(\"summed\")\n\
         permit (principal, action == Action::\"add\", resource);\n\
         @id(\"no-big-after-add\")\n\
         forbid (principal, action == Action::\"big\", resource)\n\
         when { context.session.labels.contains(\"summed\") };\n\
         @id(\"no-crash\")\n\
         forbid (principal, action == Action::\"crash\", resource);\n",
    )
    .await;
    let kit = daemon_kit(&d.socket, "");
    let s = start(&kit.config(), Host::default()).await;
    let listed: Vec<String> = s
        .client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(listed.iter().any(|t| t == "crash"), "{listed:?}");
    let reason = |r: &rmcp::model::CallToolResult| {
        r.meta
            .as_ref()
            .and_then(|m| m.0.get("tollgate/reason"))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        !denied(&s.ok("big", json!({"bytes": 2})).await),
        "no label yet"
    );
    assert!(!denied(&s.ok("echo", json!({"text": "hello"})).await));
    let r = s.ok("echo", json!({"text": "a secret"})).await;
    assert_eq!(reason(&r), "policy:no-secrets", "{}", text(&r));
    assert!(
        text(&r).starts_with("denied: policy:no-secrets; refused by policy `no-secrets`."),
        "{}",
        text(&r)
    );
    let r = s.ok("crash", json!({})).await;
    assert_eq!(reason(&r), "policy:no-crash", "{}", text(&r));
    assert_eq!(text(&s.ok("add", json!({"a": 1, "b": 2})).await), "3");
    let r = s.ok("big", json!({"bytes": 2})).await;
    assert_eq!(reason(&r), "policy:no-big-after-add", "{}", text(&r));
    // A policy's refusal does not trip the session (trip_on_refusal = false).
    assert!(!denied(&s.ok("echo", json!({"text": "bye"})).await));
    assert_eq!(kit.invocations(), vec!["big", "echo", "add", "echo"]);
    assert!(s.close().await.success());
    d.stop().await;
}

/// Issue 19's self-check on a gateway's log in daemon mode: the daemon's own log in `data`
/// of the gateway's calls (three allowed and settled, a repeat refused, a call refused by
/// the circuit it tripped) replays under the daemon's own guards with no flip and every
/// verdict replayed; with the gateway's repeat limit lowered to 2, exactly the third
/// identical call flips (the refusals after it keep their verdict).
fn replays_with_no_flip_and_one_under_a_lower_repeat_limit(data: &Path) {
    use tollgate_store::replay::{replay_paths, Candidate};
    let key = tollgate_audit::keys::parse_public_key(
        &std::fs::read_to_string(data.join("audit.pub")).unwrap(),
    )
    .unwrap();
    let replay = |config: DaemonConfig| {
        let (candidate, _) = Candidate::load(
            config.default_guard.clone(),
            config.agent_guards.clone().into_iter().collect(),
            None,
            &[],
        )
        .unwrap();
        let (report, _) =
            replay_paths(&[data.join("audit")], Some(key), candidate, 10, &mut |_| ()).unwrap();
        report
    };
    let same = replay(gateway_config(data, false));
    assert_eq!(same.verdicts, 5, "{}", same.to_json());
    assert_eq!(same.replayed, 5, "{}", same.to_json());
    assert_eq!(same.flips, 0, "{}", same.to_json());
    assert_eq!(same.exit_code(), 0, "{}", same.to_json());

    let mut lower = gateway_config(data, false);
    if let Some(g) = lower.agent_guards.get_mut("mcp-gateway") {
        g.max_repeat_calls = 2;
    }
    let flipped = replay(lower);
    assert_eq!(flipped.flips, 1, "{}", flipped.to_json());
    assert_eq!(flipped.exit_code(), 1, "{}", flipped.to_json());
    assert!(
        flipped.to_json().to_string().contains("ALLOW->DENY"),
        "{}",
        flipped.to_json()
    );
}
