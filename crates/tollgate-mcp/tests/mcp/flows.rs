//! Library mode: allowed calls pass intact, the repeat limit and the circuit, budgets,
//! hidden tools, what passes through, the local audit log, protocol negotiation.

use rmcp::model::{GetPromptRequestParams, ProtocolVersion, ReadResourceRequestParams};
use serde_json::json;
use tollgate_audit::SessionEvent;
use tollgate_core::Reason;

use crate::{denied, start, text, Host, Kit};

#[tokio::test]
async fn allowed_calls_pass_with_their_results_intact() {
    let kit = Kit::new("");
    let s = start(&kit.config(), Host::default()).await;
    let r = s
        .ok("echo", json!({"text": "héllo", "n": [1, 2.5, null]}))
        .await;
    assert_eq!(r.is_error, Some(false));
    let echoed: serde_json::Value = serde_json::from_str(&text(&r)).unwrap();
    assert_eq!(echoed, json!({"text": "héllo", "n": [1, 2.5, null]}));
    // Absent arguments are `{}` to the guard and to the upstream.
    let mut p = rmcp::model::CallToolRequestParams::new("echo");
    p.arguments = None;
    assert_eq!(text(&s.client.call_tool(p).await.unwrap()), "{}");
    // The upstream's own error result comes back unchanged (and is not a denial).
    let f = s.ok("fail", json!({})).await;
    assert_eq!(f.is_error, Some(true));
    assert_eq!(text(&f), "HTTP 401 unauthorized");
    assert_eq!(kit.invocations(), ["echo", "echo", "fail"]);
    assert!(s.close().await.success());
}

#[tokio::test]
async fn the_fourth_identical_call_is_denied_and_never_runs_then_the_circuit_is_open() {
    let kit = Kit::new("");
    let s = start(&kit.config(), Host::default()).await;
    for _ in 0..3 {
        assert!(!denied(&s.ok("add", json!({"a": 1, "b": 2})).await));
    }
    let fourth = s.ok("add", json!({"a": 1, "b": 2})).await;
    assert_eq!(
        text(&fourth),
        "denied: max_repeat_exceeded; this exact call was repeated 3 times. Tollgate did not \
         run `add`. Do not repeat it: change the arguments or stop."
    );
    let meta = fourth.meta.as_ref().unwrap();
    assert_eq!(meta.0["tollgate/reason"], "max_repeat_exceeded");
    // Any later call, even a different one, hits the open circuit.
    let later = s.ok("echo", json!({"text": "other"})).await;
    assert!(denied(&later));
    assert!(text(&later).starts_with("denied: circuit_open; "));
    assert_eq!(
        kit.invocations(),
        ["add", "add", "add"],
        "the denied calls never ran"
    );
    s.close().await;
}

#[tokio::test]
async fn a_budget_overrun_is_denied_and_costs_settle() {
    // Budget $0.10; `echo` estimated at $0.04 (settled at its estimate), `costly` reports
    // its actual cost, which settles conservatively: max(estimate, actual).
    let kit = Kit::new(
        "[guard]\nbudget_usd = 0.10\n[tools.kit.echo]\ncost_usd = 0.04\n\
         [tools.kit.costly]\ncost_usd = 0.01\n",
    );
    let s = start(&kit.config(), Host::default()).await;
    assert!(!denied(&s.ok("echo", json!({"text": "1"})).await)); // 0.06 left
    assert!(!denied(&s.ok("costly", json!({"cost": 0.03})).await)); // 0.03 left
    let over = s.ok("echo", json!({"text": "2"})).await;
    assert!(
        text(&over).starts_with(
            "denied: budget_overrun; this call's estimated cost ($0.0400) is more than the budget \
         left ($0.0300)"
        ),
        "{}",
        text(&over)
    );
    assert_eq!(kit.invocations(), ["echo", "costly"]);
    s.close().await;
}

#[tokio::test]
async fn a_deny_can_be_a_json_rpc_error_instead() {
    let kit = Kit::new("[gateway]\non_deny = \"error\"\n[guard]\nmax_repeat_calls = 1\n");
    let s = start(&kit.config(), Host::default()).await;
    s.ok("add", json!({"a": 1})).await;
    let e = s.call("add", json!({"a": 1})).await.unwrap_err();
    let rmcp::service::ServiceError::McpError(e) = e else {
        panic!("a JSON-RPC error expected, got {e:?}")
    };
    assert_eq!(e.code.0, tollgate_mcp::gateway::DENIED_ERROR_CODE);
    assert!(e.message.starts_with("denied: max_repeat_exceeded;"));
    assert_eq!(e.data.unwrap()["reason"], "max_repeat_exceeded");
    s.close().await;
}

#[tokio::test]
async fn hidden_tools_are_neither_listed_nor_callable_and_lists_pass_through() {
    let kit = Kit::new("");
    let s = start(&kit.config(), Host::default()).await;
    let tools = s.client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| &*t.name).collect();
    assert!(names.contains(&"echo") && !names.contains(&"delete_everything"));
    let e = s.call("delete_everything", json!({})).await.unwrap_err();
    assert!(e.to_string().contains("unknown tool"), "{e}");
    let resources = s.client.list_all_resources().await.unwrap();
    assert_eq!(resources[0].uri, "testkit://readme");
    let read = s
        .client
        .read_resource(ReadResourceRequestParams::new("testkit://readme"))
        .await
        .unwrap();
    assert!(serde_json::to_string(&read).unwrap().contains("read me"));
    let prompts = s.client.list_all_prompts().await.unwrap();
    assert_eq!(prompts[0].name, "greet");
    let p = s
        .client
        .get_prompt(GetPromptRequestParams::new("greet"))
        .await
        .unwrap();
    assert!(serde_json::to_string(&p).unwrap().contains("hello"));
    assert!(kit.invocations().is_empty(), "listing runs no tool");
    s.close().await;
}

#[tokio::test]
async fn two_upstreams_are_namespaced() {
    let up = |name: &str| {
        format!(
            "[[upstream]]\nname = \"{name}\"\ncommand = \"{}\"\nargs = [\"upstream\"]\n\
             [upstream.env]\nTESTKIT_LOG = \"LOG\"\n",
            crate::TESTKIT
        )
    };
    let kit = Kit::with_upstreams(&format!("{}{}", up("github"), up("files")), "");
    let s = start(&kit.config(), Host::default()).await;
    let tools = s.client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| &*t.name).collect();
    assert!(
        names.contains(&"github__echo") && names.contains(&"files__echo"),
        "{names:?}"
    );
    assert_eq!(
        text(&s.ok("files__add", json!({"a": 2, "b": 3})).await),
        "5"
    );
    assert!(
        s.call("echo", json!({})).await.is_err(),
        "bare names are unknown"
    );
    assert_eq!(
        s.client.list_all_prompts().await.unwrap()[1].name,
        "files__greet"
    );
    s.close().await;
}

#[tokio::test]
async fn the_local_audit_log_verifies_and_holds_every_decision() {
    let kit = Kit::new(
        "[library]\naudit_dir = \"audit\"\naudit_key = \"audit.key\"\nsession_id = \"mcp-1\"\n\
         [tools.kit.costly]\ncost_usd = 0.01\n",
    );
    kit.make_audit_key();
    let s = start(&kit.config(), Host::default()).await;
    s.ok("costly", json!({"cost": 0.002})).await;
    for _ in 0..4 {
        s.ok("add", json!({"a": 1})).await;
    }
    s.ok("echo", json!({})).await;
    assert!(s.close().await.success());
    let events = kit.audited();
    let verdicts: Vec<(String, Reason)> = events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Verdict(v) => Some((v.tool_name.clone(), v.reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        verdicts,
        vec![
            ("costly".into(), Reason::WithinThresholds),
            ("add".into(), Reason::WithinThresholds),
            ("add".into(), Reason::WithinThresholds),
            ("add".into(), Reason::WithinThresholds),
            ("add".into(), Reason::MaxRepeatExceeded),
            ("echo".into(), Reason::CircuitOpen),
        ]
    );
    assert!(
        matches!(events[0], SessionEvent::Opened(_)),
        "{:?}",
        events[0]
    );
    let settlements: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Settled(s) => Some(s.call_number),
            _ => None,
        })
        .collect();
    assert_eq!(settlements, [1, 2, 3, 4], "every call that ran is settled");
    assert!(events.iter().all(|e| e.session_id() == "mcp-1"));
}

#[tokio::test]
async fn older_hosts_negotiate_down() {
    let kit = Kit::new("");
    for v in [ProtocolVersion::V_2024_11_05, ProtocolVersion::V_2025_06_18] {
        let host = Host {
            version: v.clone(),
            ..Host::default()
        };
        let s = start(&kit.config(), host).await;
        assert_eq!(s.client.peer_info().unwrap().protocol_version, v);
        assert_eq!(text(&s.ok("add", json!({"a": 1, "b": 1})).await), "2");
        s.close().await;
    }
    // The newest this gateway speaks is 2025-11-25.
    let s = start(&kit.config(), Host::default()).await;
    assert_eq!(
        s.client.peer_info().unwrap().protocol_version,
        ProtocolVersion::V_2025_11_25
    );
    s.close().await;
}
