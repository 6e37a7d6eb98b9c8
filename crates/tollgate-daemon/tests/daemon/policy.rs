//! Issue 18: the call's params on the wire (`tool_params`, checked against
//! `tool_params_hash`), the `[policy]` section at start, and the policies enforced end to
//! end over the socket and gRPC: an allow-list, an argument rule, an approval rule (and a
//! forbid that beats the approval), a flow-label rule, a restart that keeps the labels
//! (the fold of the log), reload (a bad set refused, the old one kept), and the trip
//! setting.

use tollgate_audit::{Event, PolicyEffect, PolicySetCause, SessionEvent};
use tollgate_core::{json, Reason, Verdict};
use tollgate_daemon::config::PolicySettings;
use tollgate_policy::DefaultEffect;
use tollgate_proto::sp1;
use tollgate_proto::MAX_TOOL_PARAMS_BYTES;

use super::*;
use crate::grpc::{start_both_with, Via};

/// Params that are not the params hashed: a DENY (malformed input) that trips the
/// circuit, recorded as such; honest params before it are allowed.
#[tokio::test]
async fn params_that_do_not_hash_to_the_hash_are_denied_and_trip_the_circuit() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let pay = json::parse_str(r#"{"amount": 100.50, "to": "shop"}"#).unwrap();

    // The Rust client sends the params' canonical form beside their hash.
    let honest = c.prepare("pay", &pay, 0.01);
    assert_eq!(honest.tool_params, json::to_canonical_vec(&pay).unwrap());
    let v = c.pre_exec_request(honest).await;
    assert!(v.allowed(), "{v:?}");

    // The same hash, other params: the client lied.
    let mut lying = c.prepare("pay", &pay, 0.01);
    lying.tool_params = br#"{"amount":5000,"to":"attacker"}"#.to_vec();
    let v = c.pre_exec_request(lying).await;
    assert!(!v.allowed());
    assert_eq!(v.reason, "policy_violation:malformed_input", "{v:?}");
    let r = v.response.unwrap();
    assert_eq!(
        r.human_readable_reason,
        "tool_params do not hash to tool_params_hash"
    );
    let s = c.session_state().await.unwrap();
    assert!(s.circuit_tripped);
    // The session stays tripped: an honest call is refused now.
    let v = c
        .pre_exec("search", &json::parse_str("{}").unwrap(), 0.01)
        .await;
    assert_eq!(v.reason, "circuit_open");
    d.stop().await;

    let audited = audited(dir.path());
    assert!(audited
        .iter()
        .any(|e| e.reason == tollgate_core::Reason::MalformedInput && e.tool_name == "pay"));
}

/// Params that are not JSON at all are a lie too.
#[tokio::test]
async fn params_that_are_not_json_are_denied() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let mut req = c.prepare("pay", &json::parse_str(r#"{"a": 1}"#).unwrap(), 0.01);
    req.tool_params = b"{\"a\":".to_vec();
    let v = c.pre_exec_request(req).await;
    assert_eq!(v.reason, "policy_violation:malformed_input", "{v:?}");
    assert!(c.session_state().await.unwrap().circuit_tripped);
    d.stop().await;
}

/// Params beyond the bound are refused as a bad request: nothing decided, nothing
/// tripped; the client does not send them (the call goes by its hash alone).
#[tokio::test]
async fn params_beyond_the_bound_are_not_sent_and_not_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(config(dir.path())).await;
    let c = connect(&d.socket, "research-bot").await;
    let big = json::parse_str(&format!(
        r#"{{"blob": "{}"}}"#,
        "x".repeat(MAX_TOOL_PARAMS_BYTES)
    ))
    .unwrap();
    let req = c.prepare("upload", &big, 0.01);
    assert!(
        req.tool_params.is_empty(),
        "the client sent params past the bound"
    );
    let mut forced = req.clone();
    forced.tool_params = json::to_canonical_vec(&big).unwrap();
    let v = c.pre_exec_request(forced).await;
    assert_eq!(v.reason, "fail_closed:invalid_request", "{v:?}");
    assert!(!c.session_state().await.unwrap().circuit_tripped);
    // Without them the call is decided on its hash, as before.
    let v = c.pre_exec_request(req).await;
    assert!(v.allowed(), "{v:?}");
    d.stop().await;
}

fn write_config(dir: &Path, policy: &str, files: &[(&str, &str)]) -> PathBuf {
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let data = dir.join("data");
    let path = dir.join("tollgate.toml");
    std::fs::write(
        &path,
        format!(
            "[daemon]\ndata_dir = {:?}\n\n[[organization]]\nid = \"acme\"\n\n[policy]\n{policy}\n",
            data.display().to_string()
        ),
    )
    .unwrap();
    path
}

/// A bad policy set stops the daemon before anything is served, naming the file, line
/// and column of each error (the loader's own messages).
#[tokio::test]
async fn a_bad_policy_file_stops_the_daemon_with_its_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let bad = "@id(\"ok\")\npermit (principal, action, resource);\n\nforbid (principal, action == Action::\"shell\", resource)\nwhen { context.args.command like };\n";
    let path = write_config(
        dir.path(),
        "files = [\"tools.cedar\"]\ndefault = \"deny\"",
        &[("tools.cedar", bad)],
    );
    let config = DaemonConfig::load(&path).unwrap();
    let e = Daemon::start(config).await.unwrap_err().to_string();
    let file = dir.path().join("tools.cedar").display().to_string();
    assert!(e.contains(&format!("{file}:5:")), "{e}");
    assert!(e.contains("error["), "{e}");
    assert!(!dir.path().join("data").join("tollgate.sock").exists());

    // A misspelt annotation is the loader's error too, with its place.
    let path = write_config(
        dir.path(),
        "files = [\"tools.cedar\"]",
        &[(
            "tools.cedar",
            "@hitll\npermit (principal, action, resource);\n",
        )],
    );
    let e = Daemon::start(DaemonConfig::load(&path).unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("{file}:1:1")), "{e}");

    // A file that is not there.
    let path = write_config(dir.path(), "files = [\"missing.cedar\"]", &[]);
    let e = Daemon::start(DaemonConfig::load(&path).unwrap())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.cedar"), "{e}");
}

/// The section's own keys are checked.
#[test]
fn the_policy_section_is_checked() {
    let base = Path::new("/etc/tollgate");
    for (text, key) in [
        (
            "[policy]\nfiles = [\"a.cedar\"]\ndefault = \"maybe\"",
            "policy.default",
        ),
        ("[policy]\nfiles = []", "policy.files"),
    ] {
        let e = DaemonConfig::from_toml(text, base).unwrap_err().to_string();
        assert!(e.contains(key), "{e}");
    }
    let e = DaemonConfig::from_toml("[policy]\nfiles = [\"a\"]\nreload = true", base)
        .unwrap_err()
        .to_string();
    assert!(e.contains("reload"), "{e}");
    let c = DaemonConfig::from_toml("", base).unwrap();
    assert!(c.policy.is_none());
}

/// The rules the end-to-end tests enforce, with `default = "deny"`: an allow-list, an
/// argument rule (refunds over 100 USD refused), an approval rule (payments over 100 USD
/// held), and a flow-label rule (no e-mail outside the company once customer data was
/// read).
const RULES: &str = r#"
@id("tools")
permit (principal, action in [Action::"search", Action::"crm_lookup", Action::"send_email", Action::"pay", Action::"refund"], resource);

@id("refund-limit")
forbid (principal, action == Action::"refund", resource)
when { context.args.amount.greaterThan(decimal("100.00")) };

@id("big-pay") @hitl("payment over 100 USD")
permit (principal, action == Action::"pay", resource)
when { context.args.amount.greaterThan(decimal("100.00")) };

@id("reads-customers") @label("customer-data")
permit (principal, action == Action::"crm_lookup", resource);

@id("mail-out-after-customers")
forbid (principal, action == Action::"send_email", resource)
when { context.session.labels.contains("customer-data") && !(context.args.to like "*@acme.example") };
"#;

/// An emergency rule added by a reload.
const EMERGENCY: &str = r#"
@id("emergency")
forbid (principal, action == Action::"pay", resource);
"#;

const AGENT: &str = "policy-bot";

/// `crate::config` with the rules in `dir/rules.cedar` (default deny).
fn with_rules(c: &mut DaemonConfig, dir: &Path, trip: bool) {
    let file = dir.join("rules.cedar");
    if !file.exists() {
        std::fs::write(&file, RULES).unwrap();
    }
    c.policy = Some(PolicySettings {
        files: vec![file],
        default: DefaultEffect::Deny,
        schema: None,
        trip_on_refusal: trip,
        shadow: false,
    });
}

fn policy_config(dir: &Path, trip: bool) -> DaemonConfig {
    let mut c = config(dir);
    with_rules(&mut c, dir, trip);
    c
}

fn params(text: &str) -> json::Value {
    json::parse_str(text).unwrap()
}

/// The allow-list, the argument rule and the flow-label rule, over one binding. Returns
/// the session id.
async fn allow_list_arguments_and_labels(via: &Via) -> String {
    let c = via.connect(AGENT).await;
    let v = c
        .pre_exec("search", &params(r#"{"q":"tollgate"}"#), 0.01)
        .await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Allow, "within_thresholds"),
        "{v:?}"
    );

    // Allow-list: a tool no permit names is refused, and the refusal does not trip.
    let v = c
        .pre_exec("shell", &params(r#"{"command":"rm -rf /"}"#), 0.01)
        .await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "policy_default_deny"),
        "{v:?}"
    );
    let r = v.response.unwrap();
    assert_eq!(r.deny_reason, sp1::DenyReason::PolicyViolation as i32);
    assert!(!c.session_state().await.unwrap().circuit_tripped);
    let v = c.pre_exec("search", &params(r#"{"q":"more"}"#), 0.01).await;
    assert!(v.allowed(), "a policy refusal tripped the circuit: {v:?}");

    // Argument rule: 100.50 is more than 100 (a decimal, exactly); 99.5 is not.
    let v = c
        .pre_exec("refund", &params(r#"{"amount":100.50}"#), 0.01)
        .await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "policy:refund-limit"),
        "{v:?}"
    );
    assert!(v
        .response
        .unwrap()
        .human_readable_reason
        .contains("refund-limit"));
    let v = c
        .pre_exec("refund", &params(r#"{"amount":99.5}"#), 0.01)
        .await;
    assert!(v.allowed(), "{v:?}");
    // The rule reads the arguments: without them the call is refused, never guessed.
    let mut blind = c.prepare("refund", &params(r#"{"amount":1.5}"#), 0.01);
    blind.tool_params.clear();
    let v = c.pre_exec_request(blind).await;
    assert_eq!(v.reason, "policy_params_required:refund-limit", "{v:?}");

    // Flow labels: e-mail outside is fine until customer data was read.
    let out = params(r#"{"to":"someone@elsewhere.example","body":"hi"}"#);
    let v = c.pre_exec("send_email", &out, 0.01).await;
    assert!(v.allowed(), "{v:?}");
    let v = c
        .pre_exec("crm_lookup", &params(r#"{"customer":7}"#), 0.01)
        .await;
    assert!(v.allowed(), "{v:?}");
    let v = c.pre_exec("send_email", &out, 0.01).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "policy:mail-out-after-customers"),
        "{v:?}"
    );
    let inside = params(r#"{"to":"bob@acme.example","body":"hi"}"#);
    let v = c.pre_exec("send_email", &inside, 0.01).await;
    assert!(v.allowed(), "{v:?}");
    assert!(!c.session_state().await.unwrap().circuit_tripped);
    c.session_id().to_owned()
}

/// What the log says of the session: the set in force (its own entry and the opening),
/// the deciding policy of each verdict, no trip, and the label the ALLOW attached.
fn check_log(dir: &Path, session: &str) {
    let public = std::fs::read_to_string(dir.join("audit.pub")).unwrap();
    let key = tollgate_audit::keys::parse_public_key(&public).unwrap();
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(key),
        ..Default::default()
    };
    let mut sets = Vec::new();
    let mut opened = None;
    let mut verdicts = Vec::new();
    tollgate_audit::verify_paths(&[dir.join("audit")], &opts, &mut |e| match &e.event {
        Event::PolicySet(p) => sets.push(p.clone()),
        Event::Session(SessionEvent::Opened(o)) if o.session_id == session => {
            opened = Some(o.clone())
        }
        Event::Session(SessionEvent::Verdict(v)) if v.session_id == session => {
            verdicts.push(v.clone())
        }
        _ => {}
    })
    .unwrap();
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].cause, PolicySetCause::Start);
    assert!(sets[0].default_deny && !sets[0].trip_on_refusal);
    assert_eq!(opened.unwrap().policy_set, Some(sets[0].digest));
    let by_tool = |tool: &str| -> Vec<&tollgate_audit::VerdictRecord> {
        verdicts.iter().filter(|v| v.tool_name == tool).collect()
    };
    for v in &verdicts {
        assert_eq!(v.policy.as_ref().unwrap().set_digest, sets[0].digest);
    }
    let shell = by_tool("shell")[0];
    let note = shell.policy.as_ref().unwrap();
    assert_eq!(
        (shell.reason, note.effect),
        (Reason::PolicyDeny, PolicyEffect::DefaultDeny)
    );
    assert!(note.decided && !note.tripped);
    let refund = by_tool("refund")[0];
    assert_eq!(
        refund.policy.as_ref().unwrap().reason().unwrap(),
        "policy:refund-limit"
    );
    let lookup = by_tool("crm_lookup")[0];
    let note = lookup.policy.as_ref().unwrap();
    assert_eq!(note.policy_id.as_deref(), Some("tools"));
    assert_eq!(
        note.labels.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
        ["customer-data"]
    );
    let mails = by_tool("send_email");
    assert_eq!(
        mails.iter().map(|v| v.verdict).collect::<Vec<_>>(),
        [Verdict::Allow, Verdict::Deny, Verdict::Allow]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_decide_over_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(policy_config(dir.path(), false)).await;
    let session = allow_list_arguments_and_labels(&Via::Socket(d.socket.clone())).await;
    d.stop().await;
    check_log(dir.path(), &session);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_decide_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let both = start_both_with(dir.path(), |c| with_rules(c, dir.path(), false)).await;
    let via = Via::Grpc(both.pki.client(both.grpc, Some(both.pki.acme_agent())));
    let session = allow_list_arguments_and_labels(&via).await;
    both.daemon.stop().await;
    check_log(dir.path(), &session);
}

/// The approval rule: a payment over 100 USD is held, a human approves, the re-dispatch
/// (same nonce) is allowed; a forbid loaded meanwhile beats the next approval; a bad set
/// is refused and the one in force stays.
async fn approval_and_reload(via: &Via, socket: &Path, dir: &Path) {
    let c = via.connect(AGENT).await;
    let op = crate::operator(socket).await;
    let approve = |session: String, call: u64| sp1::HitlDecideRequest {
        session_id: session,
        decision: "approve".into(),
        operator_id: "alice".into(),
        call_number: call,
        ..Default::default()
    };
    let small = c
        .pre_exec("pay", &params(r#"{"amount":10.25,"to":"shop"}"#), 0.01)
        .await;
    assert!(small.allowed(), "{small:?}");

    let big = c.prepare("pay", &params(r#"{"amount":250.5,"to":"shop"}"#), 0.01);
    let v = c.pre_exec_request(big.clone()).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Hitl, "policy:big-pay"),
        "{v:?}"
    );
    assert!(
        v.response
            .unwrap()
            .human_readable_reason
            .contains("payment over 100 USD"),
        "the @hitl text is shown"
    );
    let held = v.call_number;
    // Operators see why: held by a policy, not by a guard setting.
    let pending = op.hitl_list().await.unwrap();
    let p = pending
        .iter()
        .find(|p| p.session_id == c.session_id())
        .unwrap();
    assert_eq!(p.transition.as_ref().unwrap().held_reason, "policy_hold");
    assert!(
        p.held_explanation.contains("`@hitl` policy `big-pay`")
            && p.held_explanation.contains("payment over 100 USD")
            && !p.held_explanation.contains("[guard"),
        "{}",
        p.held_explanation
    );
    op.hitl_decide(approve(c.session_id().to_owned(), held))
        .await
        .unwrap();
    let again = sp1::PreExecRequest {
        call_number: c.next_call_number(),
        ..big
    };
    let v = c.pre_exec_request(again).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Allow, "hitl_transition:approve"),
        "{v:?}"
    );

    // Held again; an emergency forbid is loaded before the human approves: it wins.
    let big = c.prepare("pay", &params(r#"{"amount":300.5,"to":"shop"}"#), 0.01);
    let v = c.pre_exec_request(big.clone()).await;
    assert_eq!(v.verdict, Verdict::Hitl, "{v:?}");
    let held = v.call_number;
    std::fs::write(dir.join("rules.cedar"), format!("{RULES}\n{EMERGENCY}")).unwrap();
    let reloaded = op.policy_reload().await.unwrap();
    assert_eq!(reloaded.policies, 6);
    op.hitl_decide(approve(c.session_id().to_owned(), held))
        .await
        .unwrap();
    let again = sp1::PreExecRequest {
        call_number: c.next_call_number(),
        ..big
    };
    let v = c.pre_exec_request(again).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Deny, "policy:emergency"),
        "{v:?}"
    );

    // A set that does not load is refused, naming the file and line; the one in force
    // (with the emergency rule) stays.
    std::fs::write(
        dir.join("rules.cedar"),
        "permit (principal, action, resource)\nwhen {",
    )
    .unwrap();
    let e = op.policy_reload().await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains("rules.cedar:"), "{text}");
    let v = c
        .pre_exec("pay", &params(r#"{"amount":1.5,"to":"shop"}"#), 0.01)
        .await;
    assert_eq!(v.reason, "policy:emergency", "{v:?}");
    // An agent cannot reload.
    // (Over the socket its key does not verify as an operator's; gRPC serves no
    // operators' requests. The log below shows no second reload.)
    assert!(c.policy_reload().await.is_err());

    // The log: the start, then exactly one reload, before the verdict it decided.
    let mut kinds = Vec::new();
    let public = std::fs::read_to_string(dir.join("audit.pub")).unwrap();
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(tollgate_audit::keys::parse_public_key(&public).unwrap()),
        ..Default::default()
    };
    tollgate_audit::verify_paths(&[dir.join("audit")], &opts, &mut |e| match &e.event {
        Event::PolicySet(p) => kinds.push(format!("set:{}", p.cause.as_str())),
        Event::Session(SessionEvent::Verdict(v)) if v.tool_name == "pay" => {
            kinds.push(
                v.policy
                    .as_ref()
                    .and_then(|n| n.reason())
                    .unwrap_or_else(|| v.reason.as_str().to_owned()),
            );
        }
        _ => {}
    })
    .unwrap();
    assert_eq!(
        kinds,
        [
            "set:start",
            "within_thresholds",
            "policy:big-pay",
            "hitl_transition:approve",
            "policy:big-pay",
            "set:reload",
            "policy:emergency",
            "policy:emergency"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_rule_and_reload_over_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(policy_config(dir.path(), false)).await;
    approval_and_reload(&Via::Socket(d.socket.clone()), &d.socket, dir.path()).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_rule_and_reload_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let both = start_both_with(dir.path(), |c| with_rules(c, dir.path(), false)).await;
    let via = Via::Grpc(both.pki.client(both.grpc, Some(both.pki.acme_agent())));
    approval_and_reload(&via, &both.daemon.socket.clone(), dir.path()).await;
    both.daemon.stop().await;
}

/// The session's labels survive a restart, from the snapshot and from the log alone
/// (state.redb removed): the fold of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_sessions_labels() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(policy_config(dir.path(), false)).await;
    let c = connect(&d.socket, AGENT).await;
    let v = c
        .pre_exec("crm_lookup", &params(r#"{"customer":7}"#), 0.01)
        .await;
    assert!(v.allowed(), "{v:?}");
    let v = c.pre_exec("shell", &params("{}"), 0.01).await;
    assert_eq!(v.reason, "policy_default_deny");
    let session = c.session_id().to_owned();
    drop(c);
    d.stop().await;
    let out = params(r#"{"to":"someone@elsewhere.example"}"#);
    for remove_snapshot in [false, true] {
        if remove_snapshot {
            std::fs::remove_file(dir.path().join("state.redb")).unwrap();
        }
        let d = start(policy_config(dir.path(), false)).await;
        let c = DaemonClient::resume(client_config(&d.socket, AGENT), &session)
            .await
            .unwrap();
        let v = c.pre_exec("send_email", &out, 0.01).await;
        assert_eq!(v.reason, "policy:mail-out-after-customers", "{v:?}");
        // The policy DENYs before the restart did not trip it either.
        assert!(!c.session_state().await.unwrap().circuit_tripped);
        let v = c.pre_exec("search", &params("{}"), 0.01).await;
        assert!(v.allowed(), "{v:?}");
        drop(c);
        d.stop().await;
    }
}

/// With `trip_on_refusal`, a policy's refusal trips the circuit (SP/1.0 §5), recorded as
/// tripped, and the next call is `circuit_open`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trip_setting_makes_a_policy_refusal_trip() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(policy_config(dir.path(), true)).await;
    let c = connect(&d.socket, AGENT).await;
    let v = c.pre_exec("shell", &params("{}"), 0.01).await;
    assert_eq!(v.reason, "policy_default_deny");
    let s = c.session_state().await.unwrap();
    assert!(s.circuit_tripped);
    assert_eq!(s.circuit_trip_reason, "policy_deny");
    let v = c.pre_exec("search", &params("{}"), 0.01).await;
    assert_eq!(v.reason, "circuit_open");
    d.stop().await;
    let tripped: Vec<bool> = audited(dir.path())
        .iter()
        .filter_map(|v| v.policy.as_ref().map(|n| n.tripped))
        .collect();
    assert_eq!(tripped, [true, false]);
}

/// A daemon with policies and no rules about a call decides it exactly as without: the
/// same verdicts and reasons, call for call, as a daemon without `[policy]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_all_set_changes_no_verdict() {
    let run = |policy: bool| async move {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        if policy {
            std::fs::write(
                dir.path().join("all.cedar"),
                "@id(\"all\") permit (principal, action, resource);",
            )
            .unwrap();
            cfg.policy = Some(PolicySettings {
                files: vec![dir.path().join("all.cedar")],
                default: DefaultEffect::Allow,
                schema: None,
                trip_on_refusal: false,
                shadow: false,
            });
        }
        let d = start(cfg).await;
        // research-bot: budget 0.50, repeat limit 3 (Appendix A).
        let c = connect(&d.socket, "research-bot").await;
        let mut seen = Vec::new();
        for i in 0..6 {
            let v = c.pre_exec("search", &params(r#"{"q":"same"}"#), 0.1).await;
            seen.push((i, v.verdict, v.reason));
        }
        d.stop().await;
        seen
    };
    let without = run(false).await;
    assert!(without.iter().any(|(_, v, _)| *v == Verdict::Deny));
    assert_eq!(run(true).await, without);
}

/// Reloads while six agents call in parallel: every verdict entry names a set whose
/// policy-set entry comes before it in the log (a verdict decided with the old set may
/// follow a new set's entry, never the other way round), and a call sent after a reload
/// has returned is decided by the set that reload put in force (a reload decides every
/// session's next call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_during_parallel_calls_are_ordered_in_the_log() {
    const AGENTS: usize = 6;
    const CALLS: usize = 40;
    const RELOADS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let d = start(policy_config(dir.path(), false)).await;
    let via = Via::Socket(d.socket.clone());
    let op = crate::operator(&d.socket).await;
    let mut agents = Vec::new();
    for a in 0..AGENTS {
        let c = std::sync::Arc::new(via.connect(AGENT).await);
        agents.push(tokio::spawn(async move {
            for i in 0..CALLS {
                let q = params(&format!(r#"{{"q":"{a}-{i}"}}"#));
                let v = c.pre_exec("search", &q, 0.0).await;
                assert!(v.allowed(), "{v:?}");
            }
        }));
    }
    // One more session whose call after each reload must name that reload's set.
    let probe = via.connect(AGENT).await;
    let mut expected = Vec::new();
    for r in 0..RELOADS {
        let text = if r % 2 == 0 {
            format!("{RULES}\n{EMERGENCY}")
        } else {
            RULES.to_owned()
        };
        std::fs::write(dir.path().join("rules.cedar"), text).unwrap();
        let reloaded = op.policy_reload().await.unwrap();
        // The file alternates between two sets: each reload puts the other in force.
        if let Some((_, before)) = expected.last() {
            assert_ne!(&reloaded.digest, before, "reload {r} changed nothing");
        }
        let q = params(&format!(r#"{{"q":"probe-{r}"}}"#));
        let v = probe.pre_exec("search", &q, 0.0).await;
        assert!(v.allowed(), "{v:?}");
        expected.push((v.call_number, reloaded.digest));
        tokio::task::yield_now().await;
    }
    for a in agents {
        a.await.unwrap();
    }
    let probe_session = probe.session_id().to_owned();
    d.stop().await;

    let public = std::fs::read_to_string(dir.path().join("audit.pub")).unwrap();
    let key = tollgate_audit::keys::parse_public_key(&public).unwrap();
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(key),
        ..Default::default()
    };
    let mut recorded = std::collections::HashSet::new();
    let mut sets = 0;
    let mut verdicts = 0;
    let mut probed = Vec::new();
    tollgate_audit::verify_paths(
        &[dir.path().join("audit")],
        &opts,
        &mut |e| match &e.event {
            Event::PolicySet(p) => {
                recorded.insert(p.digest);
                sets += 1;
            }
            Event::Session(SessionEvent::Verdict(v)) => {
                let named = v.policy.as_ref().unwrap().set_digest;
                assert!(
                    recorded.contains(&named),
                    "call {} of {} names set {named}, whose entry is not before it",
                    v.call_number,
                    v.session_id
                );
                verdicts += 1;
                if v.session_id == probe_session {
                    probed.push((v.call_number, named.to_string()));
                }
            }
            _ => {}
        },
    )
    .unwrap();
    assert_eq!(sets, 1 + RELOADS);
    assert_eq!(verdicts, AGENTS * CALLS + RELOADS);
    assert_eq!(probed, expected);
}

/// Human decisions and approved re-dispatches racing reloads that put an emergency forbid
/// in force and take it out again: every verdict on `pay` is the one the set its entry
/// names decides (under the plain set a held call is HITL `big-pay` and its approved
/// re-dispatch ALLOW; under the emergency set every call, approved or not, is DENY
/// `emergency`), no approval slips a call past a forbid in force, an approval a forbid
/// refused is spent, and no nonce is ALLOWed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn approvals_racing_reloads_follow_the_set_each_entry_names() {
    const AGENTS: usize = 6;
    const ROUNDS: usize = 5;
    const RELOADS: usize = 24;
    let dir = tempfile::tempdir().unwrap();
    let d = start(policy_config(dir.path(), false)).await;
    let rules = dir.path().join("rules.cedar");
    let op = crate::operator(&d.socket).await;
    // The two sets' digests, as the daemon names them.
    std::fs::write(&rules, format!("{RULES}\n{EMERGENCY}")).unwrap();
    let emergency = op.policy_reload().await.unwrap().digest;
    std::fs::write(&rules, RULES).unwrap();
    let plain = op.policy_reload().await.unwrap().digest;
    assert_ne!(emergency, plain);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reloader = {
        let (rules, stop) = (rules.clone(), stop.clone());
        let socket = d.socket.clone();
        tokio::spawn(async move {
            let op = crate::operator(&socket).await;
            let mut r = 0;
            while r < RELOADS || !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let text = if r % 2 == 0 {
                    format!("{RULES}\n{EMERGENCY}")
                } else {
                    RULES.to_owned()
                };
                std::fs::write(&rules, text).unwrap();
                op.policy_reload().await.unwrap();
                r += 1;
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            r
        })
    };
    let mut agents = Vec::new();
    for a in 0..AGENTS {
        let socket = d.socket.clone();
        agents.push(tokio::spawn(async move {
            let c = connect(&socket, AGENT).await;
            let op = crate::operator(&socket).await;
            let mut seen = Vec::new();
            for round in 0..ROUNDS {
                let big = c.prepare(
                    "pay",
                    &params(&format!(r#"{{"amount":250.5,"to":"shop-{a}-{round}"}}"#)),
                    0.01,
                );
                let v = c.pre_exec_request(big.clone()).await;
                seen.push((v.verdict, v.reason.clone()));
                if v.verdict != Verdict::Hitl {
                    continue;
                }
                op.hitl_decide(sp1::HitlDecideRequest {
                    session_id: c.session_id().to_owned(),
                    decision: "approve".into(),
                    operator_id: "alice".into(),
                    call_number: v.call_number,
                    ..Default::default()
                })
                .await
                .unwrap();
                let again = sp1::PreExecRequest {
                    call_number: c.next_call_number(),
                    ..big.clone()
                };
                let v = c.pre_exec_request(again).await;
                seen.push((v.verdict, v.reason.clone()));
                if v.verdict == Verdict::Deny {
                    // The forbid refused the approved call: the approval is spent, so
                    // the same call sent again is not released by it, whatever set is in
                    // force by then.
                    let third = sp1::PreExecRequest {
                        call_number: c.next_call_number(),
                        ..big
                    };
                    let v = c.pre_exec_request(third).await;
                    assert_ne!(v.reason, "hitl_transition:approve", "{v:?}");
                    seen.push((v.verdict, v.reason.clone()));
                }
            }
            seen
        }));
    }
    let mut answered = Vec::new();
    for a in agents {
        answered.extend(a.await.unwrap());
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let reloads = reloader.await.unwrap();
    // How the race fell depends on timing (often the forbid was back in force before
    // any approved re-dispatch). So that the log's checks below see both outcomes of a
    // re-dispatch whatever the timing, one held call is released under the plain set and
    // one approved under the plain set is refused after a reload to the emergency set.
    let c = connect(&d.socket, AGENT).await;
    let mut held = Vec::new();
    for (i, then) in [RULES.to_owned(), format!("{RULES}\n{EMERGENCY}")]
        .into_iter()
        .enumerate()
    {
        std::fs::write(&rules, RULES).unwrap();
        op.policy_reload().await.unwrap();
        let big = c.prepare(
            "pay",
            &params(&format!(r#"{{"amount":250.5,"to":"tail-{i}"}}"#)),
            0.01,
        );
        let v = c.pre_exec_request(big.clone()).await;
        assert_eq!(v.verdict, Verdict::Hitl, "{v:?}");
        answered.push((v.verdict, v.reason.clone()));
        op.hitl_decide(sp1::HitlDecideRequest {
            session_id: c.session_id().to_owned(),
            decision: "approve".into(),
            operator_id: "alice".into(),
            call_number: v.call_number,
            ..Default::default()
        })
        .await
        .unwrap();
        std::fs::write(&rules, then).unwrap();
        op.policy_reload().await.unwrap();
        let again = sp1::PreExecRequest {
            call_number: c.next_call_number(),
            ..big
        };
        let v = c.pre_exec_request(again).await;
        answered.push((v.verdict, v.reason.clone()));
        held.push((v.verdict, v.reason));
    }
    assert_eq!(
        held,
        [
            (Verdict::Allow, "hitl_transition:approve".to_owned()),
            (Verdict::Deny, "policy:emergency".to_owned())
        ]
    );
    d.stop().await;

    let public = std::fs::read_to_string(dir.path().join("audit.pub")).unwrap();
    let key = tollgate_audit::keys::parse_public_key(&public).unwrap();
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(key),
        ..Default::default()
    };
    let mut sets = 0;
    let mut pays = 0;
    let mut allowed_nonces = std::collections::HashSet::new();
    tollgate_audit::verify_paths(
        &[dir.path().join("audit")],
        &opts,
        &mut |e| match &e.event {
            Event::PolicySet(_) => sets += 1,
            Event::Session(SessionEvent::Verdict(v)) if v.tool_name == "pay" => {
                pays += 1;
                let note = v.policy.as_ref().unwrap();
                let named = note.set_digest.to_string();
                let what = (
                    v.verdict,
                    v.reason.as_str(),
                    note.policy_id.as_deref(),
                    note.decided,
                );
                if named == emergency {
                    assert_eq!(
                        what,
                        (Verdict::Deny, "policy_deny", Some("emergency"), true),
                        "call {} of {}",
                        v.call_number,
                        v.session_id
                    );
                } else {
                    assert_eq!(named, plain, "a verdict names a set never in force");
                    assert!(
                        matches!(
                            what,
                            (Verdict::Hitl, "policy_hold", Some("big-pay"), true)
                                | (Verdict::Allow, "hitl_transition:approve", _, _)
                        ),
                        "call {} of {}: {what:?}",
                        v.call_number,
                        v.session_id
                    );
                }
                if v.verdict == Verdict::Allow {
                    assert!(
                        allowed_nonces.insert((v.session_id.clone(), v.nonce)),
                        "nonce {} of {} ALLOWed twice",
                        v.nonce,
                        v.session_id
                    );
                }
            }
            _ => {}
        },
    )
    .unwrap();
    // One entry per answer; the start's set and every reload are recorded.
    assert_eq!(pays, answered.len());
    assert_eq!(sets, 3 + reloads + 4);
}
