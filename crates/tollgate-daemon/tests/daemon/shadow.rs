//! Issue 19: shadow policies, end to end through the daemon. A `@shadow` forbid is
//! recorded and never enforced (the call is ALLOWed, its entry names the would-be DENY); a
//! `@shadow` hold never holds; a whole set in shadow mode (`mode = "shadow"`) enforces
//! nothing and records what it would have done; `/metrics` counts every shadow evaluation
//! by candidate, agreeing or not.

use tollgate_audit::{Event, SessionEvent};
use tollgate_core::{json, Verdict};
use tollgate_daemon::config::PolicySettings;
use tollgate_policy::DefaultEffect;

use super::*;
use crate::control::{control_config, http_get};

const SHADOWED: &str = r#"
@id("tools")
permit (principal, action, resource);

@id("shadow-no-pay") @shadow
forbid (principal, action == Action::"pay", resource);

@id("shadow-hold-search") @shadow @hitl("would hold searches")
permit (principal, action == Action::"search", resource);
"#;

fn with_set(c: &mut DaemonConfig, dir: &Path, text: &str, shadow: bool) {
    let file = dir.join("shadow.cedar");
    std::fs::write(&file, text).unwrap();
    c.policy = Some(PolicySettings {
        files: vec![file],
        default: DefaultEffect::Allow,
        schema: None,
        trip_on_refusal: false,
        shadow,
    });
}

fn params(text: &str) -> json::Value {
    json::parse_str(text).unwrap()
}

/// The value of one sample on a metrics page (0 when absent).
fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn shadow_sample(policy: &str, enforced: &str, shadow: &str) -> String {
    format!(
        "tollgate_policy_shadow_total{{policy=\"{policy}\",enforced=\"{enforced}\",shadow=\"{shadow}\",agree=\"{}\"}}",
        enforced == shadow
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_forbid_and_a_shadow_hold_are_recorded_and_never_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = control_config(dir.path());
    with_set(&mut cfg, dir.path(), SHADOWED, false);
    let d = start(cfg).await;
    let addr = d.control.unwrap();
    let (_, before) = http_get(addr, "/metrics", "").await;
    let c = connect(&d.socket, "research-bot").await;

    // The shadow forbid would refuse `pay`: the call is ALLOWed all the same.
    let v = c.pre_exec("pay", &params(r#"{"amount":5}"#), 0.01).await;
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (Verdict::Allow, "within_thresholds"),
        "{v:?}"
    );
    // The shadow hold would hold `search`: nothing is held.
    let v = c.pre_exec("search", &params(r#"{"q":"a"}"#), 0.01).await;
    assert_eq!(v.verdict, Verdict::Allow, "{v:?}");
    let s = c.session_state().await.unwrap();
    assert!(!s.circuit_tripped);
    let (_, after) = http_get(addr, "/metrics", "").await;
    d.stop().await;

    let verdicts = audited(dir.path());
    let pay = verdicts.iter().find(|v| v.tool_name == "pay").unwrap();
    assert_eq!(pay.verdict, Verdict::Allow);
    let names: Vec<&str> = pay.shadow.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["shadow-no-pay", "shadow-hold-search"]);
    assert_eq!(pay.shadow[0].verdict, Verdict::Deny);
    assert_eq!(pay.shadow[0].reason, "policy:shadow-no-pay");
    assert_eq!(pay.shadow[0].policy_id.as_deref(), Some("shadow-no-pay"));
    assert!(!pay.shadow[0].agrees(pay.verdict));
    // The hold cannot apply to `pay`: it agrees.
    assert_eq!(pay.shadow[1].verdict, Verdict::Allow);
    let search = verdicts.iter().find(|v| v.tool_name == "search").unwrap();
    assert_eq!(search.verdict, Verdict::Allow);
    assert_eq!(
        (search.shadow[1].verdict, search.shadow[1].reason.as_str()),
        (Verdict::Hitl, "policy:shadow-hold-search")
    );
    assert_eq!(search.shadow[0].verdict, Verdict::Allow);
    // The enforced note names the enforced permit, not the shadow policies.
    assert_eq!(
        search.policy.as_ref().unwrap().policy_id.as_deref(),
        Some("tools")
    );
    // No session event but the opening and the two verdicts: nothing was held.
    assert!(!session_events(dir.path())
        .iter()
        .any(|e| matches!(e, SessionEvent::HumanDecision(_))));

    // Every evaluation counted, by candidate, agreeing or not.
    let moved = |name: &str| sample(&after, name) - sample(&before, name);
    assert_eq!(moved(&shadow_sample("shadow-no-pay", "allow", "deny")), 1.0);
    assert_eq!(
        moved(&shadow_sample("shadow-no-pay", "allow", "allow")),
        1.0
    );
    assert_eq!(
        moved(&shadow_sample("shadow-hold-search", "allow", "hitl")),
        1.0
    );
    assert_eq!(
        moved(&shadow_sample("shadow-hold-search", "allow", "allow")),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_in_shadow_mode_enforces_nothing_and_records_what_it_would_do() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    with_set(
        &mut cfg,
        dir.path(),
        r#"@id("no-pay") forbid (principal, action == Action::"pay", resource);
@id("big-search") @hitl permit (principal, action == Action::"search", resource)
  when { context.args.q == "big" };"#,
        true,
    );
    let d = start(cfg).await;
    let c = connect(&d.socket, "research-bot").await;
    let v = c.pre_exec("pay", &params(r#"{"amount":5}"#), 0.01).await;
    assert_eq!(v.verdict, Verdict::Allow, "{v:?}");
    let v = c.pre_exec("search", &params(r#"{"q":"big"}"#), 0.01).await;
    assert_eq!(v.verdict, Verdict::Allow, "{v:?}");
    // A call without params: the shadow set would refuse it (its rule reads them); the
    // enforced nothing does not.
    let mut blind = c.prepare("search", &params(r#"{"q":"x"}"#), 0.01);
    blind.tool_params.clear();
    let v = c.pre_exec_request(blind).await;
    assert_eq!(v.verdict, Verdict::Allow, "{v:?}");
    d.stop().await;

    let public = std::fs::read_to_string(dir.path().join("audit.pub")).unwrap();
    let key = tollgate_audit::keys::parse_public_key(&public).unwrap();
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(key),
        ..Default::default()
    };
    let mut sets = Vec::new();
    tollgate_audit::verify_paths(&[dir.path().join("audit")], &opts, &mut |e| {
        if let Event::PolicySet(p) = &e.event {
            sets.push(p.clone());
        }
    })
    .unwrap();
    assert_eq!(sets.len(), 1);
    assert!(sets[0].shadow_set);
    assert_eq!((sets[0].policies, sets[0].shadow_policies), (2, 2));
    let verdicts = audited(dir.path());
    let would: Vec<(Verdict, &str, &str)> = verdicts
        .iter()
        .map(|v| {
            assert_eq!(v.verdict, Verdict::Allow);
            assert_eq!(v.shadow.len(), 1);
            let n = &v.shadow[0];
            assert_eq!(n.name, "*");
            (n.verdict, n.reason.as_str(), v.tool_name.as_str())
        })
        .collect();
    assert_eq!(
        would,
        [
            (Verdict::Deny, "policy:no-pay", "pay"),
            (Verdict::Hitl, "policy:big-search", "search"),
            (Verdict::Deny, "policy_params_required:big-search", "search"),
        ]
    );
}
