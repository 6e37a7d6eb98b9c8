//! Library mode with `hitl_mode = "always"`: the host's user approves through MCP
//! elicitation (accept → the call runs once), refuses (decline → denied), or does not
//! answer (→ denied at the timeout); a host without elicitation gets a clear denial. Every
//! answer is in the local audit log under the configured operator id.

use rmcp::model::ElicitationAction;
use serde_json::json;
use tollgate_audit::SessionEvent;
use tollgate_core::{HumanDecision, Reason};

use crate::{denied, start, text, Host, Kit};

fn kit(timeout_secs: u32) -> Kit {
    let kit = Kit::new(&format!(
        "[gateway]\nhitl_timeout_secs = {timeout_secs}\noperator_id = \"desk-user\"\n\
         [guard]\nhitl_mode = \"always\"\n\
         [library]\naudit_dir = \"audit\"\naudit_key = \"audit.key\"\n\
         [tools.kit.add]\ncost_usd = 0.02\n"
    ));
    kit.make_audit_key();
    kit
}

fn decisions(kit: &Kit) -> Vec<(HumanDecision, String)> {
    kit.audited()
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::HumanDecision(d) => Some((d.decision, d.operator_id)),
            _ => None,
        })
        .collect()
}

fn reasons(kit: &Kit) -> Vec<Reason> {
    kit.audited()
        .into_iter()
        .filter_map(|e| match e {
            SessionEvent::Verdict(v) => Some(v.reason),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn accepted_the_call_runs_once_with_exactly_its_arguments() {
    let kit = kit(30);
    let host = Host {
        elicitation: true,
        answer: Some(ElicitationAction::Accept),
        ..Host::default()
    };
    let asked = host.asked.clone();
    let s = start(&kit.config(), host).await;
    let r = s.ok("add", json!({"a": 40, "b": 2})).await;
    assert_eq!(text(&r), "42");
    assert_eq!(kit.invocations(), ["add"]);
    let message = asked.lock().unwrap()[0].clone();
    assert!(message.contains("Tool: add"), "{message}");
    assert!(
        message.contains(r#"Arguments: {"a":40,"b":2}"#),
        "{message}"
    );
    assert!(
        message.contains("Held because: hitl_all_calls"),
        "{message}"
    );
    assert!(message.contains("Estimated cost: $0.0200"), "{message}");
    s.close().await;
    assert_eq!(
        decisions(&kit),
        [(HumanDecision::Approve, "desk-user".into())]
    );
    assert_eq!(
        reasons(&kit),
        [Reason::HitlAllCalls, Reason::TransitionApprove]
    );
}

#[tokio::test]
async fn declined_the_call_is_denied_and_never_runs() {
    for answer in [ElicitationAction::Decline, ElicitationAction::Cancel] {
        let kit = kit(30);
        let host = Host {
            elicitation: true,
            answer: Some(answer),
            ..Host::default()
        };
        let s = start(&kit.config(), host).await;
        let r = s.ok("add", json!({"a": 1})).await;
        assert!(denied(&r));
        assert!(text(&r).starts_with("denied: hitl_transition:reject; a human refused"));
        assert!(kit.invocations().is_empty());
        s.close().await;
        assert_eq!(
            decisions(&kit),
            [(HumanDecision::Reject, "desk-user".into())]
        );
    }
}

#[tokio::test]
async fn unanswered_the_call_is_denied_at_the_timeout() {
    let kit = kit(1);
    let host = Host {
        elicitation: true,
        answer: None,
        ..Host::default()
    };
    let s = start(&kit.config(), host).await;
    let r = s.ok("add", json!({"a": 1})).await;
    assert!(text(&r).starts_with("denied: fail_closed:hitl_timeout; nobody approved"));
    assert!(kit.invocations().is_empty());
    s.close().await;
    assert_eq!(
        decisions(&kit),
        [(HumanDecision::Expire, "tollgate".into())]
    );
}

#[tokio::test]
async fn without_elicitation_a_held_call_is_denied_with_a_clear_text() {
    let kit = kit(30);
    let s = start(&kit.config(), Host::default()).await;
    let r = s.ok("add", json!({"a": 1})).await;
    assert_eq!(
        text(&r),
        "denied: hitl:no_approver; this call needs a human's approval, and the host offers no \
         way to ask one (MCP elicitation). Tollgate did not run `add`."
    );
    assert!(kit.invocations().is_empty());
    s.close().await;
    assert_eq!(
        decisions(&kit),
        [(HumanDecision::Expire, "tollgate".into())]
    );
}
