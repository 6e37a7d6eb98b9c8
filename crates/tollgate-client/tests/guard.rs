//! Library mode: the in-process guard, with and without a local audit log.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use tollgate_client::{AuditIdentity, Guard};
use tollgate_core::{json, GuardConfig, HitlMode, HumanDecision, Money, Reason, Verdict};

fn appendix_a() -> GuardConfig {
    GuardConfig {
        budget: Money::from_usd(0.50).unwrap(),
        max_repeat_calls: 3,
        ..GuardConfig::default()
    }
}

#[test]
fn library_mode_runs_appendix_a() {
    let g = Guard::new(appendix_a());
    let p = json::parse_str(r#"{"q":"rust"}"#).unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        let c = g.check("web_search", &p, Money::from_usd(0.002).unwrap());
        got.push((c.decision.verdict, c.decision.reason));
        if c.allowed() {
            g.post_exec(c.call_number, 0.0015, None);
        }
    }
    assert_eq!(
        got,
        vec![
            (Verdict::Allow, Reason::WithinThresholds),
            (Verdict::Allow, Reason::WithinThresholds),
            (Verdict::Allow, Reason::WithinThresholds),
            (Verdict::Deny, Reason::MaxRepeatExceeded),
        ]
    );
    assert_eq!(g.state().budget_remaining, Money(494_000_000));
    assert!(g.state().circuit_tripped);
}

#[test]
fn library_mode_hitl_release_with_the_original_nonce() {
    let g = Guard::new(GuardConfig {
        hitl_mode: HitlMode::Always,
        ..appendix_a()
    });
    let p = json::parse_str(r#"{"to":"acct_1"}"#).unwrap();
    let held = g.check("pay", &p, Money::ZERO);
    assert_eq!(held.decision.verdict, Verdict::Hitl);
    g.decide_human(HumanDecision::Approve, None, "alice")
        .unwrap();
    let other = json::parse_str(r#"{"to":"acct_2"}"#).unwrap();
    let released = g.check_with_nonce("pay", &p, Money::ZERO, held.nonce);
    assert_eq!(released.decision.reason, Reason::TransitionApprove);
    // Single use: the nonce is spent, whatever the arguments.
    let replay = g.check_with_nonce("pay", &other, Money::ZERO, held.nonce);
    assert_eq!(replay.decision.reason, Reason::DuplicateNonce);
}

#[test]
fn library_mode_writes_a_verifiable_local_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let key = tollgate_audit::keys::generate().unwrap();
    let public = key.verifying_key();
    let (writer, _) =
        tollgate_audit::Writer::open(tollgate_audit::WriterConfig::new(dir.path()), key).unwrap();
    let g = Guard::new(appendix_a())
        .with_audit(
            writer,
            AuditIdentity {
                session_id: "local-1".into(),
                agent_id: "bot".into(),
                organization_id: "me".into(),
            },
        )
        .unwrap();
    let p = json::parse_str(r#"{"q":1}"#).unwrap();
    for _ in 0..4 {
        g.check("t", &p, Money::ZERO);
    }
    drop(g);
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(public),
        ..Default::default()
    };
    let mut reasons = Vec::new();
    tollgate_audit::verify_paths(&[dir.path().to_owned()], &opts, &mut |e| {
        if let tollgate_audit::Event::Session(tollgate_audit::SessionEvent::Verdict(v)) = &e.event {
            reasons.push(v.reason);
        }
    })
    .unwrap();
    assert_eq!(
        reasons,
        vec![
            Reason::WithinThresholds,
            Reason::WithinThresholds,
            Reason::WithinThresholds,
            Reason::MaxRepeatExceeded
        ]
    );
}

/// The local log records the opening, every verdict, settlement and human decision, and
/// folds back into exactly the guard's session.
#[test]
fn the_local_audit_log_folds_back_into_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let key = tollgate_audit::keys::generate().unwrap();
    let public = key.verifying_key();
    let (writer, _) =
        tollgate_audit::Writer::open(tollgate_audit::WriterConfig::new(dir.path()), key).unwrap();
    let g = Guard::new(GuardConfig {
        hitl_mode: HitlMode::OnDeny,
        ..appendix_a()
    })
    .with_audit(writer, AuditIdentity::default())
    .unwrap();
    let p = json::parse_str(r#"{"q":1}"#).unwrap();
    let c = g.check("t", &p, Money::from_usd(0.1).unwrap());
    assert!(c.allowed());
    let s = g.post_exec(c.call_number, f64::NAN, Some("HTTP 401"));
    assert!(s.cost_unreadable && s.audited);
    assert_eq!(
        s.charged,
        Money::from_usd(0.1).unwrap(),
        "no refund on a NaN cost"
    );
    // An overrun goes to a human, who approves it.
    let held = g.check("big", &p, Money::from_usd(5.0).unwrap());
    assert_eq!(held.decision.verdict, Verdict::Hitl);
    g.decide_human(HumanDecision::Approve, None, "alice")
        .unwrap();
    let released = g.check_with_nonce("big", &p, Money::from_usd(5.0).unwrap(), held.nonce);
    assert_eq!(released.decision.reason, Reason::TransitionApprove);
    let session = g.session();
    drop(g);
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(public),
        ..Default::default()
    };
    let mut ledger = tollgate_store::Ledger::new();
    let mut kinds = Vec::new();
    tollgate_audit::verify_paths(&[dir.path().to_owned()], &opts, &mut |e| {
        if let tollgate_audit::Event::Session(ev) = &e.event {
            kinds.push(ev.kind());
            if let tollgate_audit::SessionEvent::Verdict(v) = ev {
                if v.reason == Reason::TransitionApprove {
                    assert_eq!(v.operator_id.as_deref(), Some("alice"));
                }
            }
        }
        ledger
            .fold(e.index, tollgate_core::Digest::default(), None, &e.event)
            .unwrap();
    })
    .unwrap();
    assert_eq!(kinds, vec![4, 1, 5, 1, 6, 1]);
    let mut folded = ledger.session("local").unwrap();
    folded.last_heartbeat_ns = session.last_heartbeat_ns;
    assert_eq!(folded, session);
}

/// A verdict carries the remaining budget as its own reservation left it (the Python
/// binding reports it without copying the session state).
#[test]
fn a_verdict_carries_the_budget_it_left() {
    let g = Guard::new(appendix_a());
    let p = json::parse_str(r#"{"q":"rust"}"#).unwrap();
    let first = g.check("web_search", &p, Money::from_usd(0.002).unwrap());
    assert_eq!(first.budget_remaining, Money(498_000_000));
    g.post_exec(first.call_number, 0.0015, None);
    let other = json::parse_str(r#"{"q":"go"}"#).unwrap();
    let second = g.check("web_search", &other, Money::from_usd(0.1).unwrap());
    assert_eq!(second.budget_remaining, Money(398_000_000));
    assert_eq!(second.budget_remaining, g.state().budget_remaining);
    let overrun = g.check("web_search", &p, Money::from_usd(1.0).unwrap());
    assert_eq!(overrun.decision.reason, Reason::BudgetOverrun);
    assert_eq!(overrun.budget_remaining, Money(398_000_000));
}

/// A held call nobody decides is expired by the runtime: audited as `expire` by operator
/// `tollgate`, and the held call is then refused.
#[test]
fn an_expired_held_call_is_audited_and_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = tollgate_audit::keys::generate().unwrap();
    let public = key.verifying_key();
    let (writer, _) =
        tollgate_audit::Writer::open(tollgate_audit::WriterConfig::new(dir.path()), key).unwrap();
    let g = Guard::new(GuardConfig {
        hitl_mode: HitlMode::Always,
        ..appendix_a()
    })
    .with_audit(writer, AuditIdentity::default())
    .unwrap();
    let p = json::parse_str(r#"{"to":"acct_1"}"#).unwrap();
    let held = g.check("pay", &p, Money::ZERO);
    assert_eq!(held.decision.verdict, Verdict::Hitl);
    g.expire_pending().unwrap();
    assert!(
        g.expire_pending().is_err(),
        "an expired call cannot expire again"
    );
    let again = g.check_with_nonce("pay", &p, Money::ZERO, held.nonce);
    assert_eq!(again.decision.reason, Reason::TransitionReject);
    drop(g);
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(public),
        ..Default::default()
    };
    let mut decisions = Vec::new();
    tollgate_audit::verify_paths(&[dir.path().to_owned()], &opts, &mut |e| {
        if let tollgate_audit::Event::Session(tollgate_audit::SessionEvent::HumanDecision(d)) =
            &e.event
        {
            decisions.push((d.decision.clone(), d.operator_id.clone()));
        }
    })
    .unwrap();
    assert_eq!(
        decisions,
        vec![(HumanDecision::Expire, "tollgate".to_owned())]
    );
}

const RULES: &str = r#"
@id("no-shell")
forbid (principal, action == Action::"shell", resource);

@id("big-pay") @hitl("payments over 100 need a human")
permit (principal, action == Action::"pay", resource)
  when { context.args.amount.greaterThan(decimal("100.0")) };

@id("reads-crm") @label("customer-data")
permit (principal, action == Action::"crm_read", resource);

@id("no-exfil")
forbid (principal, action == Action::"send_email", resource)
  when { context.session.labels.contains("customer-data")
         && !(context.args.to like "*@acme.example") };
"#;

fn rules_from_file(dir: &std::path::Path) -> tollgate_policy::compose::Enforced {
    let file = dir.join("tools.cedar");
    std::fs::write(&file, RULES).unwrap();
    let section = tollgate_policy::files::Section {
        files: vec!["tools.cedar".into()],
        ..Default::default()
    };
    let settings = tollgate_policy::files::Settings::from_section(section, dir).unwrap();
    tollgate_policy::files::enforced(&settings).unwrap().0
}

/// A policy set in library mode: an argument rule, an approval rule (a forbid still wins
/// over the approval's re-dispatch), a flow-label rule, and a refusal that does not trip;
/// the local log names the set before the opening, and folds back into the guard's
/// session, labels included.
#[test]
fn a_policy_set_decides_library_calls_and_the_log_folds_them() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("audit");
    let key = tollgate_audit::keys::generate().unwrap();
    let public = key.verifying_key();
    let (writer, _) =
        tollgate_audit::Writer::open(tollgate_audit::WriterConfig::new(&logs), key).unwrap();
    let set = rules_from_file(dir.path());
    let digest = set.policies.digest();
    let who = AuditIdentity {
        session_id: "s1".into(),
        agent_id: "bot".into(),
        organization_id: "acme".into(),
    };
    let g = Guard::new(appendix_a())
        .with_policies(set)
        .unwrap()
        .with_audit(writer, who)
        .unwrap();
    let cost = Money::from_usd(0.01).unwrap();
    let p = |t: &str| json::parse_str(t).unwrap();
    let shell = g.check("shell", &p(r#"{"cmd":"ls"}"#), cost);
    assert_eq!(shell.decision.verdict, Verdict::Deny);
    assert_eq!(shell.reason, "policy:no-shell");
    assert_eq!(
        shell.policy_explanation.as_deref(),
        Some("refused by policy `no-shell`")
    );
    // Not tripped: the agent goes on with its other tools.
    let ok = g.check("web_search", &p(r#"{"q":"x"}"#), cost);
    assert!(ok.allowed(), "{ok:?}");
    assert_eq!(ok.reason, "within_thresholds");
    let big = p(r#"{"amount":100.5,"to":"acct_1"}"#);
    let held = g.check("pay", &big, cost);
    assert_eq!(held.decision.verdict, Verdict::Hitl);
    assert_eq!(held.reason, "policy:big-pay");
    assert!(held
        .policy_explanation
        .as_deref()
        .unwrap()
        .contains("payments over 100 need a human"));
    g.decide_human(HumanDecision::Approve, None, "alice")
        .unwrap();
    let released = g.check_with_nonce("pay", &big, cost, held.nonce);
    assert!(released.allowed(), "{released:?}");
    assert_eq!(released.decision.reason, Reason::TransitionApprove);
    let small = g.check("pay", &p(r#"{"amount":99.5,"to":"acct_1"}"#), cost);
    assert!(small.allowed(), "{small:?}");
    // Flow labels: e-mail out is fine until customer data was read.
    let out = p(r#"{"to":"eve@elsewhere.example"}"#);
    assert!(g.check("send_email", &out, cost).allowed());
    assert!(g.check("crm_read", &p(r#"{"id":7}"#), cost).allowed());
    let exfil = g.check("send_email", &out, cost);
    assert_eq!(exfil.decision.verdict, Verdict::Deny);
    assert_eq!(exfil.reason, "policy:no-exfil");
    let inside = g.check("send_email", &p(r#"{"to":"bob@acme.example"}"#), cost);
    assert!(inside.allowed(), "{inside:?}");
    let session = g.session();
    assert!(session.labels.contains("customer-data"));
    assert!(!session.state.circuit_tripped);
    drop(g);

    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(public),
        ..Default::default()
    };
    let mut ledger = tollgate_store::Ledger::new();
    let mut events = Vec::new();
    let mut reasons = Vec::new();
    tollgate_audit::verify_paths(std::slice::from_ref(&logs), &opts, &mut |e| {
        match &e.event {
            tollgate_audit::Event::PolicySet(r) => {
                assert_eq!(r.digest, digest);
                events.push(9);
            }
            tollgate_audit::Event::Session(ev) => {
                events.push(ev.kind());
                match ev {
                    tollgate_audit::SessionEvent::Opened(o) => {
                        assert_eq!(o.policy_set, Some(digest))
                    }
                    tollgate_audit::SessionEvent::Verdict(v) => reasons.push(
                        v.policy
                            .as_ref()
                            .and_then(tollgate_audit::PolicyNote::reason)
                            .unwrap_or_else(|| v.reason.as_str().to_owned()),
                    ),
                    _ => {}
                }
            }
            _ => {}
        }
        ledger
            .fold(e.index, tollgate_core::Digest::default(), None, &e.event)
            .unwrap();
    })
    .unwrap();
    assert_eq!(
        &events[..2],
        &[9, 4],
        "the set is recorded before the opening"
    );
    assert_eq!(
        reasons,
        vec![
            "policy:no-shell",
            "within_thresholds",
            "policy:big-pay",
            "hitl_transition:approve",
            "within_thresholds",
            "within_thresholds",
            "within_thresholds",
            "policy:no-exfil",
            "within_thresholds",
        ]
    );
    let mut folded = ledger.session("s1").unwrap();
    folded.last_heartbeat_ns = session.last_heartbeat_ns;
    assert_eq!(
        folded, session,
        "the log folds into the guard's session, labels included"
    );
}

/// A set put in force on a guard that already logs is recorded before the calls it
/// decides; ids the policies cannot name are refused, never decided by the guards alone.
#[test]
fn policies_after_the_audit_are_recorded_and_unnamable_ids_refused() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("audit");
    let key = tollgate_audit::keys::generate().unwrap();
    let (writer, _) =
        tollgate_audit::Writer::open(tollgate_audit::WriterConfig::new(&logs), key).unwrap();
    let g = Guard::new(appendix_a())
        .with_audit(writer, AuditIdentity::default())
        .unwrap()
        .with_policies(rules_from_file(dir.path()))
        .unwrap();
    let c = g.check("shell", &json::parse_str("{}").unwrap(), Money::ZERO);
    assert_eq!(c.reason, "policy:no-shell");
    drop(g);
    let mut events = Vec::new();
    tollgate_audit::verify_paths(&[logs], &Default::default(), &mut |e| match &e.event {
        tollgate_audit::Event::PolicySet(_) => events.push(9),
        tollgate_audit::Event::Session(ev) => events.push(ev.kind()),
        _ => {}
    })
    .unwrap();
    assert_eq!(events, vec![4, 9, 1]);

    // An agent id longer than a principal may be: refused when the set is put in force...
    let long = AuditIdentity {
        agent_id: "a".repeat(tollgate_policy::model::MAX_NAME_BYTES + 1),
        ..AuditIdentity::default()
    };
    let logs = dir.path().join("audit2");
    let key = tollgate_audit::keys::generate().unwrap();
    let (writer, _) =
        tollgate_audit::Writer::open(tollgate_audit::WriterConfig::new(&logs), key).unwrap();
    let logged = Guard::new(appendix_a())
        .with_audit(writer, long.clone())
        .unwrap();
    assert!(matches!(
        logged.with_policies(rules_from_file(dir.path())),
        Err(tollgate_client::GuardPolicyError::Names)
    ));
    // ...and, when the identity comes after the set, every call is refused.
    let logs = dir.path().join("audit3");
    let key = tollgate_audit::keys::generate().unwrap();
    let (writer, _) =
        tollgate_audit::Writer::open(tollgate_audit::WriterConfig::new(&logs), key).unwrap();
    let g = Guard::new(appendix_a())
        .with_policies(rules_from_file(dir.path()))
        .unwrap()
        .with_audit(writer, long)
        .unwrap();
    let c = g.check("web_search", &json::parse_str("{}").unwrap(), Money::ZERO);
    assert_eq!(c.decision.verdict, Verdict::Deny);
    assert_eq!(c.decision.reason, Reason::MalformedInput);
}

/// Issue 19 in library mode: a `@shadow` forbid never refuses a library call, and the
/// local log's verdict names its would-be DENY (the same decision path as the daemon's).
#[test]
fn a_shadow_forbid_is_recorded_in_the_local_log_and_never_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("audit");
    let key = tollgate_audit::keys::generate().unwrap();
    let public = key.verifying_key();
    let (writer, _) =
        tollgate_audit::Writer::open(tollgate_audit::WriterConfig::new(&logs), key).unwrap();
    std::fs::write(
        dir.path().join("s.cedar"),
        "@id(\"no-pay\") @shadow forbid (principal, action == Action::\"pay\", resource);",
    )
    .unwrap();
    let section = tollgate_policy::files::Section {
        files: vec!["s.cedar".into()],
        ..Default::default()
    };
    let settings = tollgate_policy::files::Settings::from_section(section, dir.path()).unwrap();
    let set = tollgate_policy::files::enforced(&settings).unwrap().0;
    let who = AuditIdentity {
        session_id: "s1".into(),
        agent_id: "bot".into(),
        organization_id: "acme".into(),
    };
    let g = Guard::new(appendix_a())
        .with_policies(set)
        .unwrap()
        .with_audit(writer, who)
        .unwrap();
    let cost = Money::from_usd(0.01).unwrap();
    let v = g.check("pay", &json::parse_str(r#"{"amount":5}"#).unwrap(), cost);
    assert!(v.allowed(), "{v:?}");
    drop(g);
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(public),
        ..Default::default()
    };
    let mut shadow = Vec::new();
    tollgate_audit::verify_paths(&[logs], &opts, &mut |e| {
        if let tollgate_audit::Event::Session(tollgate_audit::SessionEvent::Verdict(v)) = &e.event {
            shadow.push((v.verdict, v.shadow.clone()));
        }
    })
    .unwrap();
    assert_eq!(shadow.len(), 1);
    assert_eq!(shadow[0].0, Verdict::Allow);
    let n = &shadow[0].1;
    assert_eq!(n.len(), 1);
    assert_eq!(
        (n[0].name.as_str(), n[0].verdict, n[0].reason.as_str()),
        ("no-pay", Verdict::Deny, "policy:no-pay")
    );
}

/// Issue 19 part 2 in library mode: `with_params` records a call's params in the local
/// log as the daemon's `[audit] params` does; redacted, the secret is not in the log's
/// bytes, the log verifies and the true params hash to the entry's params_hash.
#[test]
fn redacted_params_in_the_local_log_keep_the_secret_out_and_the_hash_true() {
    use tollgate_audit::params::Recorder;
    use tollgate_audit::{ParamsMode, RecordedParams};
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("audit");
    let key = tollgate_audit::keys::generate().unwrap();
    let public = key.verifying_key();
    let (writer, _) =
        tollgate_audit::Writer::open(tollgate_audit::WriterConfig::new(&logs), key).unwrap();
    let who = AuditIdentity {
        session_id: "s1".into(),
        agent_id: "bot".into(),
        organization_id: "acme".into(),
    };
    let g = Guard::new(appendix_a())
        .with_params(Recorder::new(ParamsMode::Redacted, &[]).unwrap())
        .with_audit(writer, who)
        .unwrap();
    let params = json::parse_str(r#"{"password":"hunter2-xyz","user":"ann"}"#).unwrap();
    let v = g.check("login", &params, Money::from_usd(0.01).unwrap());
    assert!(v.allowed(), "{v:?}");
    drop(g);
    for e in std::fs::read_dir(&logs).unwrap() {
        let bytes = std::fs::read(e.unwrap().path()).unwrap();
        assert!(!bytes.windows(11).any(|w| w == b"hunter2-xyz"));
    }
    let opts = tollgate_audit::VerifyOptions {
        trusted_key: Some(public),
        ..Default::default()
    };
    let mut seen = Vec::new();
    tollgate_audit::verify_paths(&[logs], &opts, &mut |e| {
        if let tollgate_audit::Event::Session(tollgate_audit::SessionEvent::Verdict(v)) = &e.event {
            seen.push(v.clone());
        }
    })
    .unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].params_hash, json::canonical_hash(&params).unwrap());
    assert_eq!(
        seen[0].params,
        Some(RecordedParams::Redacted(
            r#"{"password":"[REDACTED]","user":"ann"}"#.into()
        ))
    );
}
