//! docs/policy.md's examples load, and its recipes do what the page says.

use tollgate_core::labels::LabelSet;
use tollgate_policy::DefaultEffect;

use crate::common::{eval_in, reason, set_with, Session};

fn page() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/policy.md")).unwrap()
}

/// The page's fenced blocks in `lang`, in order.
fn blocks(lang: &str) -> Vec<String> {
    let page = page();
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in page.lines() {
        match &mut cur {
            None if line.trim() == format!("```{lang}") => cur = Some(String::new()),
            Some(b) if line.trim() == "```" => {
                out.push(std::mem::take(b));
                cur = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {}
        }
    }
    out
}

#[test]
fn every_example_loads_with_the_pages_schema() {
    let schemas = blocks("cedarschema");
    assert_eq!(schemas.len(), 1);
    let cedar = blocks("cedar");
    assert!(cedar.len() >= 7, "{}", cedar.len());
    for b in &cedar {
        set_with(&[("page.cedar", b)], DefaultEffect::Allow, None);
    }
    // The payment and refund recipes also validate against the page's schema.
    let all_schema = format!(
        "{}\naction \"crm_lookup\" appliesTo {{ principal: Agent, resource: Upstream }};",
        schemas[0]
    );
    for b in cedar
        .iter()
        .filter(|b| b.contains("\"pay\"") || b.contains("\"refund\""))
    {
        set_with(
            &[("page.cedar", b)],
            DefaultEffect::Allow,
            Some(&all_schema),
        );
    }
}

fn recipe(word: &str) -> String {
    blocks("cedar")
        .into_iter()
        .find(|b| b.contains(word))
        .unwrap()
}

#[test]
fn the_recipes_do_what_the_page_says() {
    let s = Session::default();
    let allow = set_with(
        &[("r.cedar", &recipe("allowed-tools"))],
        DefaultEffect::Deny,
        None,
    );
    assert_eq!(reason(&eval_in(&allow, &s, "web_search", None, false)), "-");
    assert_eq!(
        reason(&eval_in(&allow, &s, "shell", None, false)),
        "policy_default_deny"
    );

    let shell = set_with(
        &[("r.cedar", &recipe("shell-commands"))],
        DefaultEffect::Allow,
        None,
    );
    assert_eq!(
        reason(&eval_in(
            &shell,
            &s,
            "shell",
            Some(r#"{"command":"ls"}"#),
            false
        )),
        "-"
    );
    assert_eq!(
        reason(&eval_in(
            &shell,
            &s,
            "shell",
            Some(r#"{"command":"ls; rm -rf /"}"#),
            false
        )),
        "policy:shell-commands"
    );
    assert_eq!(
        reason(&eval_in(&shell, &s, "shell", Some("{}"), false)),
        "policy:shell-commands"
    );

    let pay = set_with(
        &[("r.cedar", &recipe("big-payments"))],
        DefaultEffect::Allow,
        None,
    );
    assert_eq!(
        reason(&eval_in(
            &pay,
            &s,
            "pay",
            Some(r#"{"amount":100.5}"#),
            false
        )),
        "policy:big-payments"
    );
    assert_eq!(
        reason(&eval_in(&pay, &s, "pay", Some(r#"{"amount":99.5}"#), false)),
        "-"
    );

    let refund = set_with(
        &[("r.cedar", &recipe("one-refund-per-session"))],
        DefaultEffect::Allow,
        None,
    );
    let first = eval_in(&refund, &s, "refund", Some("{}"), false);
    assert_eq!(reason(&first), "-");
    let after = Session {
        labels: LabelSet::new().with(&first.labels).unwrap(),
        ..Session::default()
    };
    assert_eq!(
        reason(&eval_in(&refund, &after, "refund", Some("{}"), false)),
        "policy:one-refund-per-session"
    );

    let mail = set_with(
        &[("r.cedar", &recipe("external-mail-after-customer-data"))],
        DefaultEffect::Allow,
        None,
    );
    let out = Some(r#"{"to":"eve@elsewhere.example"}"#);
    assert_eq!(reason(&eval_in(&mail, &s, "send_email", out, false)), "-");
    let read = eval_in(&mail, &s, "crm_lookup", Some("{}"), false);
    let tainted = Session {
        labels: LabelSet::new().with(&read.labels).unwrap(),
        ..Session::default()
    };
    assert_eq!(
        reason(&eval_in(&mail, &tainted, "send_email", out, false)),
        "policy:external-mail-after-customer-data"
    );
    assert_eq!(
        reason(&eval_in(
            &mail,
            &tainted,
            "send_email",
            Some(r#"{"to":"bob@acme.example"}"#),
            false
        )),
        "-"
    );

    let agents = set_with(
        &[("r.cedar", &recipe("only-the-deployer-deploys"))],
        DefaultEffect::Allow,
        None,
    );
    assert_eq!(
        reason(&eval_in(&agents, &s, "deploy", None, false)),
        "policy:only-the-deployer-deploys"
    );
}
