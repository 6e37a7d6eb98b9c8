//! `tollgate policy replay --mcp mcp.toml` on the local audit log the gateway itself wrote
//! (issue 19): the real gateway, a real host and the testkit upstream `kit`; a policy on
//! the resource `Upstream::"kit"` with an argument rule, a `@hitl` permit the host
//! approves through elicitation, calls settled at the cost the upstream reports, the
//! probabilistic layer on, and params recorded in full (`[library] audit_params`).
//! Replayed by `tollgate-mcp-testkit replay`, which runs what the command runs: under the
//! gateway's own mcp.toml no flip and every verdict replayed (exit 0); with the forbid
//! moved to another upstream, exactly the one call it refused flips (exit 1).

use rmcp::model::ElicitationAction;
use serde_json::json;
use tollgate_audit::SessionEvent;
use tollgate_core::{json as tjson, Verdict};

use crate::{denied, start, text, Host, Kit, TESTKIT};

const RULES: &str = "@id(\"kit-small-adds\")\n\
     forbid (principal, action == Action::\"add\", resource == Upstream::\"kit\")\n\
     when { context.args has a && context.args.a > 5 };\n\
     @id(\"review-echo\") @hitl(\"an echo to review\")\n\
     permit (principal, action == Action::\"echo\", resource == Upstream::\"kit\")\n\
     when { context.args has text && context.args.text == \"review\" };\n";

/// `tollgate-mcp-testkit replay CONFIG audit.pub audit [FILE.cedar...]`: the exit code and
/// the JSON report.
fn replay(kit: &Kit, policies: &[&std::path::Path]) -> (i32, tjson::Value, String) {
    let dir = kit.dir.path();
    let o = std::process::Command::new(TESTKIT)
        .arg("replay")
        .arg(kit.config())
        .arg(dir.join("audit.pub"))
        .arg(dir.join("audit"))
        .args(policies)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let all = format!("{out}{}", String::from_utf8_lossy(&o.stderr));
    let report = tjson::parse_str(out.trim()).unwrap_or(tjson::Value::Null);
    (o.status.code().unwrap_or(-1), report, all)
}

fn count(report: &tjson::Value, k: &str) -> u64 {
    report.get(k).and_then(tjson::Value::as_u64).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateways_log_replays_under_its_own_mcp_toml_with_no_flip() {
    let kit = Kit::new(
        "[library]\naudit_dir = \"audit\"\naudit_key = \"audit.key\"\naudit_params = \"full\"\n\
         session_id = \"mcp-replay\"\n\
         [guard]\nbudget_usd = 1.0\nprobabilistic_deny = true\ndeny_jitter_ratio = 0.9\n\
         [tools.kit.costly]\ncost_usd = 0.2\n\
         [policy]\nfiles = [\"tools.cedar\"]\n",
    );
    kit.make_audit_key();
    std::fs::write(kit.dir.path().join("tools.cedar"), RULES).unwrap();
    let host = Host {
        elicitation: true,
        answer: Some(ElicitationAction::Accept),
        ..Host::default()
    };
    let s = start(&kit.config(), host).await;
    assert_eq!(text(&s.ok("add", json!({"a": 2, "b": 3})).await), "5");
    let r = s.ok("add", json!({"a": 9, "b": 1})).await;
    assert!(denied(&r), "{}", text(&r));
    // Held by the @hitl permit, approved by the host's user, then run.
    let r = s.ok("echo", json!({"text": "review"})).await;
    assert!(!denied(&r), "{}", text(&r));
    // Costs the upstream reports, settled: the budget runs low, where the probabilistic
    // layer draws.
    for cost in [0.3, 0.3, 0.25, 0.05, 0.01] {
        let _ = s.ok("costly", json!({"cost": cost})).await;
    }
    let _ = s.ok("echo", json!({"text": "hi"})).await;
    assert!(s.close().await.success());

    // The log has what the test is about: verdicts naming the upstream and carrying a
    // draw, recorded params, a human's decision, settlements with reported costs.
    let events = kit.audited();
    let verdicts: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Verdict(v) => Some(v),
            _ => None,
        })
        .collect();
    assert!(verdicts
        .iter()
        .all(|v| v.upstream.as_deref() == Some("kit")));
    assert!(verdicts.iter().all(|v| v.draw.is_some()));
    assert!(verdicts.iter().all(|v| v.params.is_some()));
    assert!(verdicts
        .iter()
        .any(|v| v.verdict == Verdict::Deny && v.tool_name == "add"));
    assert!(verdicts.iter().any(|v| v.verdict == Verdict::Hitl));
    assert!(events
        .iter()
        .any(|e| matches!(e, SessionEvent::HumanDecision(_))));
    assert!(events
        .iter()
        .any(|e| matches!(e, SessionEvent::Settled(s) if s.actual_cost.0 > 0)));

    // Under the gateway's own configuration: nothing flips, every verdict replayed.
    let (c, report, t) = replay(&kit, &[]);
    assert_eq!(c, 0, "{t}");
    assert_eq!(count(&report, "flips"), 0, "{t}");
    assert_eq!(count(&report, "reason_changes"), 0, "{t}");
    assert_eq!(count(&report, "unreplayable"), 0, "{t}");
    assert_eq!(count(&report, "verdicts"), verdicts.len() as u64, "{t}");
    assert_eq!(count(&report, "replayed"), verdicts.len() as u64, "{t}");

    // The forbid moved to another upstream: the refused add is allowed, nothing else.
    let moved = kit.dir.path().join("moved.cedar");
    std::fs::write(
        &moved,
        RULES.replacen("Upstream::\"kit\"", "Upstream::\"other\"", 1),
    )
    .unwrap();
    let (c, report, t) = replay(&kit, &[&moved]);
    assert_eq!(c, 1, "{t}");
    assert_eq!(count(&report, "flips"), 1, "{t}");
    let flip = match report.get("flip_examples") {
        Some(tjson::Value::Array(a)) => a[0].clone(),
        other => panic!("{other:?}"),
    };
    let field = |k: &str| flip.get(k).and_then(|v| v.as_str()).unwrap().to_owned();
    assert_eq!(
        (field("tool_name"), field("recorded"), field("candidate")),
        ("add".into(), "DENY".into(), "ALLOW".into()),
        "{t}"
    );
}
