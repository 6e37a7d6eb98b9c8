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

/// The `a` argument of the call an approval request is about, if it has one.
fn the_i_of(message: &str) -> Option<i64> {
    let start = message.find(r#""a":"#)? + 4;
    message[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// Issue 16 §1: the host sends five calls at once; the gateway asks its user about all
/// five before any is decided (each held call on its own), the user answers them newest
/// first, accepting the even ones; each accepted call runs exactly once with its own
/// arguments, no declined one runs, and the session is not tripped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_calls_held_at_once_are_each_asked_and_decided_in_any_order() {
    let kit = kit(60);
    let host = Host {
        elicitation: true,
        answer_by: Some(|m| {
            if the_i_of(m).is_none_or(|i| i % 2 == 0) {
                ElicitationAction::Accept
            } else {
                ElicitationAction::Decline
            }
        }),
        hold_until: 5,
        ..Host::default()
    };
    let asked = host.asked.clone();
    let s = std::sync::Arc::new(start(&kit.config(), host).await);
    let calls: Vec<_> = (0..5)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { (i, s.ok("add", json!({"a": i, "b": 100})).await) })
        })
        .collect();
    let mut answers = Vec::new();
    for c in calls {
        answers.push(c.await.unwrap());
    }
    assert_eq!(asked.lock().unwrap().len(), 5, "every call was asked about");
    for (i, r) in &answers {
        if i % 2 == 0 {
            assert_eq!(text(r), (i + 100).to_string(), "call {i}");
        } else {
            assert!(
                text(r).starts_with("denied: hitl_transition:reject; a human refused"),
                "call {i}: {}",
                text(r)
            );
        }
    }
    assert_eq!(kit.invocations(), ["add", "add", "add"]);
    // Each decision named its own call; nothing else was recorded.
    let mut decided: Vec<_> = decisions(&kit).into_iter().map(|(d, _)| d).collect();
    decided.sort_by_key(|d| format!("{d:?}"));
    assert_eq!(
        decided,
        [
            HumanDecision::Approve,
            HumanDecision::Approve,
            HumanDecision::Approve,
            HumanDecision::Reject,
            HumanDecision::Reject
        ]
    );
    // The session goes on: a later call is asked about and runs.
    let later = s.ok("echo", json!({"text": "still here"})).await;
    assert_eq!(text(&later), r#"{"text":"still here"}"#);
    std::sync::Arc::into_inner(s).unwrap().close().await;
}

/// Issue 16 §3: one human refusal refuses that call only. The next calls run, in the same
/// session (one session-opened entry), with the budget spent only by what ran, and the
/// refusal's text names what happened while later results are the tools' own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_refusal_does_not_trip_the_session() {
    let kit = refusing_kit("");
    let s = start(&kit.config(), declines_a_1()).await;
    let refused = s.ok("add", json!({"a": 1, "b": 1})).await;
    assert_eq!(
        text(&refused),
        "denied: hitl_transition:reject; a human refused this call. Tollgate did not run `add`."
    );
    assert_eq!(text(&s.ok("add", json!({"a": 2, "b": 3})).await), "5");
    assert_eq!(text(&s.ok("add", json!({"a": 4, "b": 5})).await), "9");
    s.close().await;
    assert_eq!(kit.invocations(), ["add", "add"]);
    let events = kit.audited();
    let opened = events
        .iter()
        .filter(|e| matches!(e, SessionEvent::Opened(_)))
        .count();
    assert_eq!(opened, 1, "one session throughout");
    let last_budget = events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Settled(r) => Some(r.budget_after),
            _ => None,
        })
        .next_back()
        .unwrap();
    // $1 less the two calls that ran at $0.02 each (the refused call's reservation was
    // given back).
    assert_eq!(last_budget, tollgate_core::Money(960_000_000));
    assert!(!reasons(&kit).contains(&Reason::CircuitOpen));
}

/// A host whose user declines the calls with `"a":1` and accepts every other.
fn declines_a_1() -> Host {
    Host {
        elicitation: true,
        answer_by: Some(|m| {
            if m.contains(r#""a":1,"#) {
                ElicitationAction::Decline
            } else {
                ElicitationAction::Accept
            }
        }),
        ..Host::default()
    }
}

/// A library-mode gateway asking its host's user about every call (add costs $0.02 of $1),
/// with `extra` in `[guard]`.
fn refusing_kit(extra: &str) -> Kit {
    let kit = Kit::new(&format!(
        "[gateway]\nhitl_timeout_secs = 30\noperator_id = \"desk-user\"\n\
         [guard]\nhitl_mode = \"always\"\nbudget_usd = 1.0\n{extra}\n\
         [library]\naudit_dir = \"audit\"\naudit_key = \"audit.key\"\n\
         [tools.kit.add]\ncost_usd = 0.02\n"
    ));
    kit.make_audit_key();
    kit
}

/// The strict setting (`max_held_calls = 1`, SP/1.0.1's single held call): a refusal is
/// the end of the session, as the specification has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_max_held_calls_1_a_refusal_trips_the_session() {
    let kit = refusing_kit("max_held_calls = 1");
    let s = start(&kit.config(), declines_a_1()).await;
    let refused = s.ok("add", json!({"a": 1, "b": 1})).await;
    assert!(text(&refused).starts_with("denied: hitl_transition:reject;"));
    let next = s.ok("add", json!({"a": 2, "b": 3})).await;
    assert!(denied(&next), "{}", text(&next));
    // Nobody was asked about this call: its text must not say a human refused it.
    assert!(
        text(&next).starts_with("denied: hitl_transition:reject; nobody was asked about this call"),
        "{}",
        text(&next)
    );
    assert!(
        !text(&next).contains("a human refused this call"),
        "{}",
        text(&next)
    );
    let after = s.ok("add", json!({"a": 4, "b": 5})).await;
    assert!(
        text(&after).starts_with("denied: circuit_open;"),
        "{}",
        text(&after)
    );
    s.close().await;
    assert!(kit.invocations().is_empty());
}

/// Issue 16 §1: more calls at once than the session may hold (`max_held_calls = 2`): the
/// extra one is held behind (nothing recorded for it), so it is denied without its user
/// being asked; the two held ones are asked and run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_held_behind_others_is_denied_without_asking() {
    let kit = refusing_kit("max_held_calls = 2");
    let host = Host {
        elicitation: true,
        answer: Some(ElicitationAction::Accept),
        hold_until: 2,
        ..Host::default()
    };
    let asked = host.asked.clone();
    let s = std::sync::Arc::new(start(&kit.config(), host).await);
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { s.ok("add", json!({"a": i, "b": 10})).await })
        })
        .collect();
    let mut texts = Vec::new();
    for c in calls {
        texts.push(text(&c.await.unwrap()));
    }
    assert_eq!(asked.lock().unwrap().len(), 2, "{texts:?}");
    assert_eq!(
        texts
            .iter()
            .filter(|t| t.starts_with("denied: hitl_transition:defer_escalate;"))
            .count(),
        1,
        "{texts:?}"
    );
    assert_eq!(kit.invocations(), ["add", "add"]);
    std::sync::Arc::into_inner(s).unwrap().close().await;
}
