//! Library mode with `[policy]` (issue 18): the guard decides every call with the Cedar
//! set, the tool's upstream as the resource; `tools/list` leaves out what the set refuses
//! whatever the arguments; the reason the host reads names the policy. Each denied call's
//! upstream tool never runs (the upstream logs what it ran). Daemon mode with a policy set
//! is in `daemon.rs`.

use std::collections::BTreeSet;
use std::time::Duration;

use rmcp::model::ElicitationAction;
use serde_json::json;

use crate::{denied, start, text, Host, Kit, TESTKIT};

/// A kit whose `[policy]` is `policy` (TOML keys) over `tools.cedar` holding `cedar`.
fn policy_kit(cedar: &str, policy: &str) -> Kit {
    let kit = Kit::new(&format!("[policy]\nfiles = [\"tools.cedar\"]\n{policy}\n"));
    std::fs::write(kit.dir.path().join("tools.cedar"), cedar).unwrap();
    kit
}

/// The names `tools/list` shows.
async fn listed(s: &crate::Session) -> BTreeSet<String> {
    s.client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect()
}

fn reason(r: &rmcp::model::CallToolResult) -> String {
    r.meta
        .as_ref()
        .and_then(|m| m.0.get("tollgate/reason"))
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_list_lists_and_runs_only_the_permitted_tools() {
    let kit = policy_kit(
        "@id(\"allowed-tools\")\n\
         permit (principal, action in [Action::\"echo\", Action::\"add\"], resource);\n",
        "default = \"deny\"",
    );
    let s = start(&kit.config(), Host::default()).await;
    assert_eq!(
        listed(&s).await,
        BTreeSet::from(["echo".to_owned(), "add".to_owned()]),
        "tools/list shows only what a permit can allow"
    );
    // A tool the list left out, called anyway: refused by the policy set, never run.
    let r = s.ok("big", json!({"bytes": 3})).await;
    assert!(denied(&r), "{}", text(&r));
    assert_eq!(reason(&r), "policy_default_deny");
    assert!(
        text(&r).contains("no policy permits this call (default deny)"),
        "{}",
        text(&r)
    );
    let r = s.ok("add", json!({"a": 2, "b": 3})).await;
    assert_eq!(text(&r), "5");
    assert_eq!(kit.invocations(), vec!["add"]);
    assert!(s.close().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_argument_rule_refuses_by_the_arguments_and_names_the_policy() {
    let kit = policy_kit(
        "@id(\"no-secrets\")\n\
         forbid (principal, action == Action::\"echo\", resource)\n\
         when { context.args has text && context.args.text like \"*secret*\" };\n\
         @id(\"no-crash\")\n\
         forbid (principal, action == Action::\"crash\", resource);\n",
        "",
    );
    let s = start(&kit.config(), Host::default()).await;
    let tools = listed(&s).await;
    assert!(tools.contains("echo"), "a conditional forbid hides nothing");
    assert!(!tools.contains("crash"), "an unconditional forbid hides");
    assert!(tools.contains("add"), "default allow: {tools:?}");
    let r = s.ok("echo", json!({"text": "hello"})).await;
    assert!(!denied(&r), "{}", text(&r));
    let r = s.ok("echo", json!({"text": "the secret plan"})).await;
    assert!(denied(&r), "{}", text(&r));
    assert_eq!(reason(&r), "policy:no-secrets");
    assert!(
        text(&r).starts_with("denied: policy:no-secrets; refused by policy `no-secrets`."),
        "{}",
        text(&r)
    );
    // Hidden, called anyway: refused by the policy (the upstream would exit otherwise).
    let r = s.ok("crash", json!({})).await;
    assert_eq!(reason(&r), "policy:no-crash", "{}", text(&r));
    let r = s.ok("echo", json!({"text": "still up"})).await;
    assert!(!denied(&r), "{}", text(&r));
    assert_eq!(kit.invocations(), vec!["echo", "echo"]);
    assert!(s.close().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_rule_holds_for_the_host_s_user_and_a_forbid_still_wins() {
    let kit = policy_kit(
        "@id(\"big-adds\") @hitl(\"a big addition\")\n\
         permit (principal, action == Action::\"add\", resource) when { context.args.a > 100 };\n\
         @id(\"no-thirteen\")\n\
         forbid (principal, action == Action::\"add\", resource) when { context.args.b == 13 };\n",
        "",
    );
    let host = Host {
        elicitation: true,
        answer_by: Some(|m| {
            if m.contains("777") {
                ElicitationAction::Decline
            } else {
                ElicitationAction::Accept
            }
        }),
        ..Host::default()
    };
    let asked = host.asked.clone();
    let s = start(&kit.config(), host).await;
    // Small: no hold, no question.
    assert_eq!(text(&s.ok("add", json!({"a": 1, "b": 2})).await), "3");
    assert!(asked.lock().unwrap().is_empty());
    // Big: held by the policy, asked, approved, run once.
    assert_eq!(text(&s.ok("add", json!({"a": 500, "b": 1})).await), "501");
    {
        let asked = asked.lock().unwrap();
        assert_eq!(asked.len(), 1);
        assert!(
            asked[0].contains(
                "Held because: policy:big-adds (policy `big-adds` holds this call \
                               for a human: a big addition)"
            ),
            "{}",
            asked[0]
        );
    }
    // Big and forbidden: the forbid wins over the hold; nobody is asked.
    let r = s.ok("add", json!({"a": 500, "b": 13})).await;
    assert_eq!(reason(&r), "policy:no-thirteen", "{}", text(&r));
    assert_eq!(asked.lock().unwrap().len(), 1);
    // Declined: refused, never run.
    let r = s.ok("add", json!({"a": 777, "b": 1})).await;
    assert_eq!(reason(&r), "hitl_transition:reject", "{}", text(&r));
    assert_eq!(asked.lock().unwrap().len(), 2);
    assert_eq!(kit.invocations(), vec!["add", "add"]);
    assert!(s.close().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_label_refuses_external_mail_after_customer_data() {
    let kit = Kit::with_upstreams(
        &format!(
            "[[upstream]]\nname = \"crm\"\ncommand = \"{TESTKIT}\"\nargs = [\"upstream\"]\n\
             [upstream.env]\nTESTKIT_LOG = \"LOG\"\nTESTKIT_EXTRA_TOOLS = \"crm_lookup|send_email\"\n"
        ),
        "[policy]\nfiles = [\"tools.cedar\"]\n",
    );
    std::fs::write(
        kit.dir.path().join("tools.cedar"),
        "@id(\"reads-customers\") @label(\"customer-data\")\n\
         permit (principal, action == Action::\"crm_lookup\", resource);\n\
         @id(\"external-mail-after-customer-data\")\n\
         forbid (principal, action == Action::\"send_email\", resource)\n\
         when { context.session.labels.contains(\"customer-data\") &&\n\
                !(context.args.to like \"*@acme.example\") };\n",
    )
    .unwrap();
    let s = start(&kit.config(), Host::default()).await;
    let out = json!({"to": "someone@elsewhere.example"});
    assert!(
        !denied(&s.ok("send_email", out.clone()).await),
        "no label yet"
    );
    assert!(!denied(&s.ok("crm_lookup", json!({"id": 7})).await));
    assert!(!denied(
        &s.ok("send_email", json!({"to": "bob@acme.example"})).await
    ));
    let r = s.ok("send_email", out).await;
    assert_eq!(
        reason(&r),
        "policy:external-mail-after-customer-data",
        "{}",
        text(&r)
    );
    assert_eq!(
        kit.invocations(),
        vec!["send_email", "crm_lookup", "send_email"]
    );
    assert!(s.close().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resource_is_the_upstream_and_the_action_its_own_tool_name() {
    let one = |name: &str| {
        format!(
            "[[upstream]]\nname = \"{name}\"\ncommand = \"{TESTKIT}\"\nargs = [\"upstream\"]\n\
             [upstream.env]\nTESTKIT_LOG = \"LOG\"\n"
        )
    };
    let kit = Kit::with_upstreams(
        &format!("{}{}", one("a"), one("b")),
        "[policy]\nfiles = [\"tools.cedar\"]\n",
    );
    std::fs::write(
        kit.dir.path().join("tools.cedar"),
        "@id(\"no-echo-on-b\")\n\
         forbid (principal, action == Action::\"echo\", resource == Upstream::\"b\");\n",
    )
    .unwrap();
    let s = start(&kit.config(), Host::default()).await;
    let tools = listed(&s).await;
    assert!(
        tools.contains("a__echo") && !tools.contains("b__echo"),
        "{tools:?}"
    );
    assert!(tools.contains("b__add"), "{tools:?}");
    let r = s.ok("b__echo", json!({"text": "x"})).await;
    assert_eq!(reason(&r), "policy:no-echo-on-b", "{}", text(&r));
    assert!(!denied(&s.ok("a__echo", json!({"text": "x"})).await));
    assert_eq!(kit.invocations(), vec!["echo"]);
    assert!(s.close().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_that_does_not_load_stops_the_gateway_with_every_finding() {
    let kit = Kit::new("[policy]\nfiles = [\"tools.cedar\", \"more.cedar\"]\n");
    let cedar = kit.dir.path().join("tools.cedar");
    let more = kit.dir.path().join("more.cedar");
    std::fs::write(
        &cedar,
        "permit (principal, action, resource) when { context.args.x > };\n",
    )
    .unwrap();
    std::fs::write(
        &more,
        "@id(\"a\")\n@hitll\npermit (principal, action, resource);\n",
    )
    .unwrap();
    for check in [false, true] {
        let mut cmd = std::process::Command::new(TESTKIT);
        cmd.arg("gateway").arg(kit.config());
        if check {
            cmd.arg("--check");
        }
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::process::Command::from(cmd)
                .stdin(std::process::Stdio::null())
                .output(),
        )
        .await
        .expect("the gateway stops at once")
        .unwrap();
        let err = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "check={check}: {err}");
        assert!(err.contains("policy set refused"), "{err}");
        assert!(err.contains(&format!("{}:1:", cedar.display())), "{err}");
        assert!(
            err.contains(&format!(
                "{}:1:1: error[tollgate::unknown-annotation]",
                more.display()
            )),
            "{err}"
        );
    }
    assert!(kit.invocations().is_empty());
}

/// The principal is `[library]`'s organization and agent, without a local audit log too:
/// an agent-specific rule applies to the gateway it names and to no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_specific_rule_holds_without_an_audit_log() {
    let cedar = "@id(\"only-the-builder-adds\")\n\
                 forbid (principal, action == Action::\"add\", resource)\n\
                 unless { principal == Agent::\"acme/builder\" };\n";
    for (agent, allowed) in [("builder", true), ("intern", false)] {
        let kit = policy_kit(
            cedar,
            &format!("[library]\norganization_id = \"acme\"\nagent_id = \"{agent}\"\n"),
        );
        let s = start(&kit.config(), Host::default()).await;
        let r = s.ok("add", json!({"a": 2, "b": 3})).await;
        if allowed {
            assert_eq!(text(&r), "5", "{agent}");
            assert_eq!(kit.invocations(), vec!["add"]);
        } else {
            assert!(denied(&r), "{agent}: {}", text(&r));
            assert_eq!(reason(&r), "policy:only-the-builder-adds");
            assert!(kit.invocations().is_empty());
        }
        assert!(s.close().await.success());
    }
}
