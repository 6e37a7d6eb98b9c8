//! Cedar policies in a fleet (issue 18): every daemon of a fleet loads its own `[policy]`
//! at start and on reload, records a policy-set entry in its own PostgreSQL chain (format
//! version 6) before the set decides anything, and decides every call with it; the
//! session's flow labels travel in its Redis record, so a label an ALLOW attached through
//! one daemon is seen by the policies of another when the session resumes there, and a
//! crash of the first loses none (the chains' fold gives Redis's labels). Each test ends
//! with `tollgate audit verify --postgres` on the chains.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use tollgate_audit::{Event, PolicyEffect, PolicySetCause, SessionEvent};
use tollgate_client::DaemonClient;
use tollgate_core::{json, Verdict};

use super::{rt, unique, Extra, Fleet, OPERATOR_SECRET, SECRET, SHARED_PG, SHARED_REDIS};
use crate::{code, s, stdout, text, tollgate};

/// The chain id a daemon of `dir` writes (`key-<key id>`, its key's id from `audit.pub`).
fn chain_of(dir: &Path) -> String {
    let public = std::fs::read_to_string(dir.join("audit.pub")).unwrap();
    let id = public
        .lines()
        .next()
        .and_then(|l| l.rsplit("key id ").next())
        .unwrap()
        .trim()
        .to_owned();
    format!("key-{id}")
}

/// `n` daemons of one fleet, each with `[policy] files = [rules]` (`extra` after it).
fn fleet_with_rules(root: &Path, n: usize, rules: &Path, extra: &str) -> Fleet {
    let urls = vec![SHARED_REDIS.to_owned(); n];
    let tables = format!("[policy]\nfiles = [\"{}\"]\n{extra}", rules.display());
    let extra = Extra {
        tables: &tables,
        ..Extra::default()
    };
    Fleet::start_extra(root, SHARED_REDIS, &urls, SHARED_PG, 2.0, 1, extra)
}

/// Every chain's verified entries, by chain id.
fn chains(fleet: &Fleet) -> BTreeMap<String, Vec<Event>> {
    let mut out: BTreeMap<String, Vec<Event>> = BTreeMap::new();
    rt().block_on(async {
        let settings = tollgate_pg::PgSettings::new(&fleet.pg_url).with_schema(&fleet.schema);
        let client = tollgate_pg::connect(&settings).await.unwrap();
        let reports = tollgate_pg::verify(&client, &fleet.schema, None, &[], &mut |c, e| {
            out.entry(c.to_owned()).or_default().push(e.event.clone());
        })
        .await
        .unwrap();
        for r in &reports {
            assert!(
                r.result.is_ok(),
                "chain {} breaks: {:?}",
                r.chain_id,
                r.result
            );
        }
    });
    out
}

/// `tollgate audit verify --postgres` on the fleet's schema, each daemon's chain with its
/// own public key: exit 0, every chain `ok`.
fn cli_verifies(fleet: &Fleet) {
    let o = tollgate(&[
        "audit",
        "verify",
        "--postgres",
        &fleet.pg_url,
        "--schema",
        &fleet.schema,
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    for dir in &fleet.dirs {
        let chain = chain_of(dir);
        let o = tollgate(&[
            "audit",
            "verify",
            "--postgres",
            &fleet.pg_url,
            "--schema",
            &fleet.schema,
            "--chain",
            &chain,
            "--key",
            s(&dir.join("audit.pub")),
        ]);
        assert_eq!(code(&o), 0, "{}", text(&o));
        assert!(
            stdout(&o).contains(&format!("chain {chain}: ok:")),
            "{}",
            text(&o)
        );
    }
}

/// The policy-set entries of a chain: (cause, digest).
fn sets(events: &[Event]) -> Vec<(PolicySetCause, tollgate_core::Digest)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::PolicySet(r) => Some((r.cause, r.digest)),
            _ => None,
        })
        .collect()
}

/// The session's record in Redis, as stored (`b` of its hash: the stored form's JSON
/// part, docs/redis.md), decoded.
fn redis_session(fleet: &Fleet, session: &str) -> json::Value {
    let b = redis_stored(fleet, session);
    let part = if b.starts_with(b"TGS2") {
        let len = u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
        &b[8..8 + len]
    } else {
        &b[..]
    };
    json::parse_str(std::str::from_utf8(part).unwrap()).unwrap()
}

/// The session's record in Redis (the record field its hash's `c` names), in its stored
/// form.
fn redis_stored(fleet: &Fleet, session: &str) -> Vec<u8> {
    let mut c = redis::Client::open(SHARED_REDIS)
        .unwrap()
        .get_connection()
        .unwrap();
    let key = format!("{}:{{o:acme}}:s:{session}", fleet.prefix);
    let fields: tollgate_redis::cas::Fields =
        redis::cmd("HGETALL").arg(&key).query(&mut c).unwrap();
    tollgate_redis::cas::current_record(&fields)
        .expect("the session's hash has its current record")
        .clone()
}

/// A session folded from its entries alone (in `session_seq` order, across chains), as a
/// store rebuilds one from the log: opened from its first, then each later entry replayed
/// (and checked: replay regenerates the entry and compares it with the logged one). The
/// session spends a shared budget, whose amounts each entry records before its change.
fn fold(events: &[SessionEvent]) -> tollgate_store::Session {
    use tollgate_store::ops;
    let Some(SessionEvent::Opened(o)) = events.first() else {
        panic!("no opening first: {events:?}");
    };
    let mut s = ops::session_from_record(o).unwrap();
    s.state.budget_remaining = o.budget_before;
    let regenerated = ops::open(&mut s, o.timestamp_ns);
    ops::check_opened(&regenerated, o).unwrap();
    for e in &events[1..] {
        if let SessionEvent::Verdict(v) = e {
            s.state.budget_remaining = v.budget_before;
        }
        ops::replay(&mut s, e).unwrap_or_else(|err| panic!("{err}: {e:?}"));
    }
    s
}

fn strings(v: Option<&json::Value>) -> Vec<String> {
    match v {
        Some(json::Value::Array(items)) => items
            .iter()
            .map(|i| match i {
                json::Value::String(t) => t.clone(),
                other => panic!("not a label: {other:?}"),
            })
            .collect(),
        None => Vec::new(),
        other => panic!("labels: {other:?}"),
    }
}

pub(super) const NO_SHELL: &str =
    "@id(\"no-shell\") forbid (principal, action == Action::\"shell\", resource);\n";

/// A `forbid` is refused on every daemon of the fleet, naming the policy, without tripping
/// (the session goes on with its other tools), also for a session resumed on another
/// daemon; every daemon's chain opens with the start's policy-set entry (the same digest:
/// the same files), every session opening names it, and every refusal's note names the
/// set and the policy.
#[test]
fn a_forbid_is_refused_on_every_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let rules = tmp.path().join("rules.cedar");
    std::fs::write(&rules, NO_SHELL).unwrap();
    let mut fleet = fleet_with_rules(tmp.path(), 3, &rules, "");
    let p = json::parse_str(r#"{"command":"ls"}"#).unwrap();
    let q = |n: u32| json::parse_str(&format!(r#"{{"query":{n}}}"#)).unwrap();
    let mut sessions = Vec::new();
    rt().block_on(async {
        for d in 0..3 {
            let c = DaemonClient::connect(fleet.client_config(d, "acme", d))
                .await
                .unwrap();
            let v = c.pre_exec("shell", &p, 0.01).await;
            assert_eq!(
                (v.verdict, v.reason.as_str()),
                (Verdict::Deny, "policy:no-shell"),
                "daemon {d}: {v:?}"
            );
            let v = c.pre_exec("search", &q(1), 0.01).await;
            assert!(v.allowed(), "daemon {d}: {v:?}");
            sessions.push(c.session_id().to_owned());
        }
        // Each session resumed on the next daemon: refused there too.
        for (d, id) in sessions.iter().enumerate() {
            let next = (d + 1) % 3;
            let c = DaemonClient::resume(fleet.client_config(next, "acme", d), id)
                .await
                .unwrap();
            let v = c.pre_exec("shell", &p, 0.01).await;
            assert_eq!(
                (v.verdict, v.reason.as_str()),
                (Verdict::Deny, "policy:no-shell"),
                "daemon {next}: {v:?}"
            );
            assert!(c.pre_exec("search", &q(2), 0.01).await.allowed());
        }
    });
    fleet.stop_all();
    let all = chains(&fleet);
    assert_eq!(all.len(), 3, "{:?}", all.keys());
    let mut digests = Vec::new();
    let mut refusals = 0;
    for dir in &fleet.dirs {
        let events = &all[&chain_of(dir)];
        // The set is recorded before anything it decides: the chain's first entry.
        let Some(Event::PolicySet(start)) = events.first() else {
            panic!("{}: {events:?}", chain_of(dir));
        };
        assert_eq!(start.cause, PolicySetCause::Start);
        assert_eq!(start.policies, 1);
        assert_eq!(sets(events).len(), 1);
        digests.push(start.digest);
        for e in events {
            match e {
                Event::Session(SessionEvent::Opened(o)) => {
                    assert_eq!(o.policy_set, Some(start.digest));
                }
                Event::Session(SessionEvent::Verdict(v)) => {
                    let n = v.policy.as_ref().expect("a verdict without a policy note");
                    assert_eq!(n.set_digest, start.digest);
                    if v.tool_name == "shell" {
                        refusals += 1;
                        assert_eq!(v.verdict, Verdict::Deny);
                        assert_eq!(n.effect, PolicyEffect::Forbid);
                        assert_eq!(n.policy_id.as_deref(), Some("no-shell"));
                        assert!(n.decided && !n.tripped, "{n:?}");
                    } else {
                        assert_eq!(v.verdict, Verdict::Allow);
                    }
                }
                _ => {}
            }
        }
    }
    assert_eq!(refusals, 6);
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
    cli_verifies(&fleet);
}

/// A flow label attached by an ALLOW through daemon A is seen by the policies of daemon B
/// when the session resumes there: the exfiltration call is refused (and an upload held)
/// on B. A is killed with SIGKILL the moment its ALLOW returns, before it can confirm the
/// change in Redis: B settles the change (its entry is in A's chain, so it stands) and
/// the label survives. Afterwards the chains' fold of the session (the union of its
/// ALLOWs' labels, its last version, the set it opened under) is exactly Redis's record.
#[test]
fn a_label_set_through_one_daemon_holds_the_exfiltration_on_another_after_a_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let rules = tmp.path().join("rules.cedar");
    std::fs::write(
        &rules,
        "@id(\"reads-customers\") @label(\"customer-data\")\n\
         permit (principal, action == Action::\"crm_export\", resource);\n\
         @id(\"no-mail-out-after-customers\")\n\
         forbid (principal, action == Action::\"send_email\", resource)\n\
         when { context.session.labels.contains(\"customer-data\") };\n\
         @id(\"upload-after-customers\") @hitl(\"customer data may leave\")\n\
         permit (principal, action == Action::\"upload\", resource)\n\
         when { context.session.labels.contains(\"customer-data\") };\n",
    )
    .unwrap();
    let mut fleet = fleet_with_rules(tmp.path(), 2, &rules, "");
    let chain_a = chain_of(&fleet.dirs[0]);
    let chain_b = chain_of(&fleet.dirs[1]);
    let mail = json::parse_str(r#"{"to":"x@elsewhere.example"}"#).unwrap();
    let mail2 = json::parse_str(r#"{"to":"y@elsewhere.example"}"#).unwrap();
    let session = rt().block_on(async {
        let a = DaemonClient::connect(fleet.client_config(0, "acme", 1))
            .await
            .unwrap();
        // No label yet: mail goes out.
        let v = a.pre_exec("send_email", &mail, 0.01).await;
        assert!(v.allowed(), "{v:?}");
        let v = a
            .pre_exec("crm_export", &json::parse_str("{}").unwrap(), 0.01)
            .await;
        assert!(v.allowed(), "{v:?}");
        a.session_id().to_owned()
    });
    // The moment the labelling ALLOW returned: daemon A dies.
    fleet.kill_9(0);
    rt().block_on(async {
        let b = DaemonClient::resume(fleet.client_config(1, "acme", 1), &session)
            .await
            .unwrap();
        let v = b.pre_exec("send_email", &mail2, 0.01).await;
        assert_eq!(
            (v.verdict, v.reason.as_str()),
            (Verdict::Deny, "policy:no-mail-out-after-customers"),
            "{v:?}"
        );
        let v = b
            .pre_exec(
                "upload",
                &json::parse_str(r#"{"file":"a.csv"}"#).unwrap(),
                0.01,
            )
            .await;
        assert_eq!(
            (v.verdict, v.reason.as_str()),
            (Verdict::Hitl, "policy:upload-after-customers"),
            "{v:?}"
        );
    });
    // Redis's record, once B's confirmer is done (no unconfirmed change left).
    let t = Instant::now();
    let record = loop {
        let r = redis_session(&fleet, &session);
        let mut c = redis::Client::open(SHARED_REDIS)
            .unwrap()
            .get_connection()
            .unwrap();
        let key = format!("{}:{{o:acme}}:s:{session}", fleet.prefix);
        let fields: Vec<String> = redis::cmd("HKEYS").arg(&key).query(&mut c).unwrap();
        if !fields.iter().any(|f| f.starts_with("u:")) {
            break r;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{fields:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    fleet.stop_all();
    let all = chains(&fleet);
    // The fold of the session over both chains.
    let mut mine: Vec<(String, SessionEvent)> = all
        .iter()
        .flat_map(|(c, es)| {
            let session = &session;
            es.iter().filter_map(move |e| match e {
                Event::Session(ev) if ev.session_id() == session.as_str() => {
                    Some((c.clone(), ev.clone()))
                }
                _ => None,
            })
        })
        .collect();
    mine.sort_by_key(|(_, e)| e.session_seq());
    let seqs: Vec<u64> = mine.iter().map(|(_, e)| e.session_seq()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "{mine:?}"
    );
    let mut folded: Vec<String> = Vec::new();
    let mut opened_under = None;
    for (chain, e) in &mine {
        match e {
            SessionEvent::Opened(o) => opened_under = o.policy_set,
            SessionEvent::Verdict(v) => {
                let n = v.policy.as_ref().unwrap();
                if v.verdict == Verdict::Allow {
                    folded.extend(n.labels.iter().map(|l| l.as_str().to_owned()));
                }
                if v.tool_name == "crm_export" {
                    assert_eq!(*chain, chain_a, "the labelling ALLOW is A's");
                    assert_eq!(
                        n.labels.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
                        ["customer-data"]
                    );
                }
                if v.tool_name == "upload" || v.verdict == Verdict::Deny {
                    assert_eq!(*chain, chain_b, "B decided after the resume");
                }
            }
            _ => {}
        }
    }
    folded.sort();
    folded.dedup();
    assert_eq!(folded, ["customer-data"]);
    assert_eq!(strings(record.get("labels")), folded, "{record:?}");
    assert_eq!(
        record.get("seq").and_then(json::Value::as_u64),
        Some(seqs.len() as u64),
        "{record:?}"
    );
    assert_eq!(
        record.get("policy_set"),
        opened_under
            .map(|d| json::Value::from(d.to_string().as_str()))
            .as_ref()
    );
    // The whole session state, folded from the chains alone, is Redis's record (the shared
    // budget's amounts aside: they are the budget's, folded by its versions elsewhere).
    let events: Vec<SessionEvent> = mine.iter().map(|(_, e)| e.clone()).collect();
    let folded = fold(&events);
    let mut stored =
        tollgate_redis::cas::decode_stored(&redis_stored(&fleet, &session), 1 << 20, 0).unwrap();
    stored.state.budget_initial = folded.state.budget_initial;
    stored.state.budget_remaining = folded.state.budget_remaining;
    stored.state.budget_spent = folded.state.budget_spent;
    let text = |s: &tollgate_store::Session| {
        String::from_utf8(tollgate_store::record::encode_session(s)).unwrap()
    };
    assert_eq!(text(&folded), text(&stored));
    assert_eq!(folded.labels, stored.labels);
    // No void: the crash lost nothing that was acknowledged.
    assert!(
        !all.values().flatten().any(|e| matches!(e, Event::Void(_))),
        "a change was voided"
    );
    cli_verifies(&fleet);
}

/// A reload on one daemon (`tollgate policy reload` over its socket, then SIGHUP) puts the
/// new set in force on that daemon only, recorded in its own chain before it decides; the
/// other daemon goes on with the set it loaded. A reload of a bad set is refused, the CLI
/// names the file and line, and nothing is recorded. `tollgate audit export --postgres`
/// shows each chain's policy-set entries.
#[test]
fn a_reload_on_one_daemon_is_recorded_in_its_chain() {
    let tmp = tempfile::tempdir().unwrap();
    let rules = tmp.path().join("rules.cedar");
    std::fs::write(&rules, NO_SHELL).unwrap();
    let mut fleet = fleet_with_rules(tmp.path(), 2, &rules, "");
    let ops = tmp.path().join("acme.ops");
    std::fs::write(&ops, OPERATOR_SECRET).unwrap();
    let reload = |d: usize| {
        tollgate(&[
            "policy",
            "reload",
            "--socket",
            s(&fleet.dirs[d].join("tollgate.sock")),
            "--org",
            "acme",
            "--secret-file",
            s(&ops),
        ])
    };
    let n = std::cell::Cell::new(0u32);
    let rt = rt();
    let call = |c: &DaemonClient, tool: &str| {
        n.set(n.get() + 1);
        let args = json::parse_str(&format!(r#"{{"amount":{}}}"#, n.get())).unwrap();
        let v = rt.block_on(c.pre_exec(tool, &args, 0.01));
        assert!(v.error.is_none(), "{v:?}");
        (v.verdict, v.reason)
    };
    let allowed = (Verdict::Allow, "within_thresholds".to_owned());
    let denied = |id: &str| (Verdict::Deny, format!("policy:{id}"));
    let a = rt
        .block_on(DaemonClient::connect(fleet.client_config(0, "acme", 1)))
        .unwrap();
    let session = a.session_id().to_owned();
    assert_eq!(call(&a, "shell"), denied("no-shell"));
    assert_eq!(call(&a, "pay"), allowed);

    // The files change; daemon 0 alone is told to reload.
    std::fs::write(
        &rules,
        "@id(\"no-pay\") forbid (principal, action == Action::\"pay\", resource);\n",
    )
    .unwrap();
    let o = reload(0);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let out = stdout(&o);
    assert!(out.starts_with("reloaded: 1 policies, digest "), "{out}");
    assert_eq!(call(&a, "pay"), denied("no-pay"));
    assert_eq!(call(&a, "shell"), allowed);
    // The same session through daemon 1 (the agent moves: one connection at a time, so
    // that its call numbers follow): still the set daemon 1 loaded.
    drop(a);
    let on = |d: usize| {
        rt.block_on(DaemonClient::resume(
            fleet.client_config(d, "acme", 1),
            &session,
        ))
        .unwrap()
    };
    let b = on(1);
    assert_eq!(call(&b, "shell"), denied("no-shell"));
    assert_eq!(call(&b, "pay"), allowed);

    // A bad set: refused through the CLI (naming file and line) and by SIGHUP; daemon 0
    // keeps its set, and records nothing.
    std::fs::write(&rules, "permit (principal, action, resource)\nwhen {\n").unwrap();
    let o = reload(0);
    assert_eq!(code(&o), 1, "{}", text(&o));
    assert!(
        text(&o).contains(&format!("{}:", rules.display())),
        "{}",
        text(&o)
    );
    let hup = |pid: u32| {
        assert!(std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap()
            .success());
    };
    hup(fleet.daemons[0].as_ref().unwrap().child.id());
    // The signal is handled asynchronously: wait until daemon 0 has refused the bad files
    // (its log says so) before they change again below.
    let log = tmp.path().join("d0.stderr");
    let t = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("SIGHUP: policy reload refused")
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "SIGHUP was not handled"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(b);
    let a = on(0);
    assert_eq!(call(&a, "pay"), denied("no-pay"));
    drop(a);

    // SIGHUP on daemon 1 with a good set: in force there from a next call.
    std::fs::write(
        &rules,
        "@id(\"no-search\") forbid (principal, action == Action::\"search\", resource);\n",
    )
    .unwrap();
    hup(fleet.daemons[1].as_ref().unwrap().child.id());
    let b = on(1);
    let t = Instant::now();
    loop {
        let r = call(&b, "search");
        if r == denied("no-search") {
            break;
        }
        assert_eq!(r, allowed);
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "SIGHUP did not reload"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(b);
    let a = on(0);
    assert_eq!(call(&a, "search"), allowed);
    drop(a);
    fleet.stop_all();

    let all = chains(&fleet);
    let (c0, c1) = (chain_of(&fleet.dirs[0]), chain_of(&fleet.dirs[1]));
    let s0 = sets(&all[&c0]);
    let s1 = sets(&all[&c1]);
    let causes = |v: &[(PolicySetCause, tollgate_core::Digest)]| {
        v.iter().map(|(c, _)| *c).collect::<Vec<_>>()
    };
    // Daemon 0: the start and its one reload that loaded (the bad SIGHUP recorded nothing).
    assert_eq!(
        causes(&s0),
        [PolicySetCause::Start, PolicySetCause::Reload],
        "{s0:?}"
    );
    assert_eq!(
        &causes(&s1)[..2],
        [PolicySetCause::Start, PolicySetCause::Reload]
    );
    assert_eq!(s0[0].1, s1[0].1, "both started with the same files");
    assert_ne!(s0[1].1, s0[0].1);
    assert_ne!(s1[1].1, s0[1].1);
    // In each chain, every verdict names a set recorded before it in that chain.
    for (chain, events) in [(&c0, &all[&c0]), (&c1, &all[&c1])] {
        let mut recorded = Vec::new();
        for e in events {
            match e {
                Event::PolicySet(r) => recorded.push(r.digest),
                Event::Session(SessionEvent::Verdict(v)) => {
                    let n = v.policy.as_ref().unwrap();
                    assert!(recorded.contains(&n.set_digest), "{chain}: {v:?}");
                }
                _ => {}
            }
        }
    }
    // The export shows them, per chain.
    let o = tollgate(&[
        "audit",
        "export",
        "--postgres",
        &fleet.pg_url,
        "--schema",
        &fleet.schema,
        "--format",
        "jsonl",
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let rows: Vec<json::Value> = stdout(&o)
        .lines()
        .map(|l| json::parse_str(l).unwrap())
        .collect();
    let exported: Vec<(String, String)> = rows
        .iter()
        .filter(|r| r.get("kind") == Some(&json::Value::from("policy_set")))
        .map(|r| {
            let f = |k: &str| match r.get(k) {
                Some(json::Value::String(t)) => t.clone(),
                other => panic!("{k}: {other:?}"),
            };
            (f("chain_id"), f("policy_cause"))
        })
        .collect();
    assert_eq!(
        exported.iter().filter(|(c, _)| *c == c0).count(),
        s0.len(),
        "{exported:?}"
    );
    assert_eq!(
        exported.iter().filter(|(c, _)| *c == c1).count(),
        s1.len(),
        "{exported:?}"
    );
    // And each refusal with its chain and policy: `no-pay` only through daemon 0, which
    // alone reloaded that set.
    let refusals: Vec<(String, String)> = rows
        .iter()
        .filter(|r| r.get("kind") == Some(&json::Value::from("verdict")))
        .filter_map(|r| match (r.get("chain_id"), r.get("policy_reason")) {
            (Some(json::Value::String(c)), Some(json::Value::String(p))) => {
                Some((c.clone(), p.clone()))
            }
            _ => None,
        })
        .collect();
    let by = |chain: &str, reason: &str| {
        refusals
            .iter()
            .filter(|(c, r)| c == chain && r == reason)
            .count()
    };
    assert_eq!(by(&c0, "policy:no-pay"), 2, "{refusals:?}");
    assert_eq!(by(&c1, "policy:no-pay"), 0, "{refusals:?}");
    assert_eq!(by(&c0, "policy:no-shell"), 1, "{refusals:?}");
    assert_eq!(by(&c1, "policy:no-shell"), 1, "{refusals:?}");
    assert_eq!(by(&c1, "policy:no-search"), 1, "{refusals:?}");
    cli_verifies(&fleet);
}

/// A fleet daemon whose `[policy]` set does not load refuses to start, naming the file,
/// line and column of each finding, before it touches Redis or PostgreSQL (no chain is
/// registered, no socket made).
#[test]
fn a_fleet_daemon_with_a_bad_policy_set_refuses_to_start_naming_file_line_col() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o750)).unwrap();
    let rules = dir.join("rules.cedar");
    std::fs::write(
        &rules,
        "@id(\"no-shell\") forbid (principal, action == Action::\"shell\", resource);\n\
         @id(\"bad\") permit (principal, action, resource)\n  when { context.args.x == };\n",
    )
    .unwrap();
    let (prefix, schema) = (unique("tgpolicy"), unique("tgpolicy"));
    let _cleanup = Fleet::leftovers(schema.clone(), prefix.clone());
    std::fs::write(
        dir.join("fleet.toml"),
        format!(
            "[state]\nbackend = \"redis\"\nurl = \"{SHARED_REDIS}\"\nkey_prefix = \"{prefix}\"\n\
             [audit]\nsink = \"postgres\"\nurl = \"{SHARED_PG}\"\nschema = \"{schema}\"\n\
             [policy]\nfiles = [\"rules.cedar\"]\n\
             [[organization]]\nid = \"acme\"\nsecret = \"{SECRET}\"\noperator_secret = \"{OPERATOR_SECRET}\"\n"
        ),
    )
    .unwrap();
    let out = refused_start(dir);
    let all = text(&out);
    // `file:line:col: error[...]`, the finding on line 3.
    let at = format!("{}:3:", rules.display());
    let line = all
        .lines()
        .find(|l| l.contains(&at))
        .unwrap_or_else(|| panic!("no finding at {at}: {all}"));
    let col = line[line.find(&at).unwrap() + at.len()..]
        .split(':')
        .next()
        .unwrap();
    assert!(col.parse::<u32>().is_ok(), "no column: {line}");
    assert!(line.contains("error"), "{line}");
    // Nothing was written: no chain registered (the schema was never made).
    rt().block_on(async {
        let c = tollgate_pg::connect(&tollgate_pg::PgSettings::new(SHARED_PG))
            .await
            .unwrap();
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1",
                &[&schema],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "the daemon touched PostgreSQL");
    });
}

/// A chain registered in PostgreSQL in an older format `version` (by an older daemon),
/// `old<version>`, with no entry yet, in a fresh schema of the shared server; and the
/// directory (0750) a daemon on it runs in, holding the chain's audit key (0600). What the
/// test leaves in the shared servers goes when it is dropped.
pub(super) struct OldChain {
    pub(super) fleet: Fleet,
    pub(super) prefix: String,
    pub(super) schema: String,
    chain: String,
    dir: tempfile::TempDir,
}

impl OldChain {
    /// The chain, its key made from `seed`; the schema and the Redis key prefix are named
    /// after `tag`.
    pub(super) fn new(tag: &str, version: u16, seed: u8) -> OldChain {
        use tollgate_audit::format::{self, FileHeader};
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o750),
        )
        .unwrap();
        let key = tollgate_audit::SigningKey::from_bytes(&[seed; 32]);
        std::fs::write(
            dir.path().join("audit.key"),
            tollgate_audit::keys::secret_key_text(&key),
        )
        .unwrap();
        std::fs::set_permissions(
            dir.path().join("audit.key"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let (prefix, schema) = (unique(tag), unique(tag));
        let fleet = Fleet::leftovers(schema.clone(), prefix.clone());
        let chain = format!("old{version}");
        rt().block_on(async {
            let mut c = tollgate_pg::connect(&tollgate_pg::PgSettings::new(SHARED_PG))
                .await
                .unwrap();
            tollgate_pg::migrate(&mut c, &schema).await.unwrap();
            let header =
                FileHeader::new_signed_version(version, &key, 0, 0, format::genesis_hash(), 1)
                    .encode();
            c.execute(
                &format!(
                    "INSERT INTO {schema}.chains (chain_id, key_id, public_key, format_version, header)
                     VALUES ('{chain}', $1, $2, {version}, $3)"
                ),
                &[
                    &tollgate_audit::KeyId::of(key.verifying_key().as_bytes()).to_string(),
                    &key.verifying_key().as_bytes().as_slice(),
                    &header,
                ],
            )
            .await
            .unwrap();
        });
        OldChain {
            fleet,
            prefix,
            schema,
            chain,
            dir,
        }
    }

    pub(super) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Write the directory's `fleet.toml`: the state in the shared Redis (the chain's
    /// prefix), the audit sink the chain in PostgreSQL with `audit` added to `[audit]`,
    /// then `tables`, then organization acme.
    pub(super) fn configure(&self, audit: &str, tables: &str) {
        let (prefix, schema, chain) = (&self.prefix, &self.schema, &self.chain);
        std::fs::write(
            self.dir().join("fleet.toml"),
            format!(
                "[state]\nbackend = \"redis\"\nurl = \"{SHARED_REDIS}\"\nkey_prefix = \"{prefix}\"\ndurability = \"none\"\n\
                 [audit]\nsink = \"postgres\"\nurl = \"{SHARED_PG}\"\nschema = \"{schema}\"\nchain_id = \"{chain}\"\n{audit}\n\
                 {tables}\
                 [[organization]]\nid = \"acme\"\nsecret = \"{SECRET}\"\noperator_secret = \"{OPERATOR_SECRET}\"\n"
            ),
        )
        .unwrap();
    }

    /// `tollgate serve` as `fleet.toml` says.
    pub(super) fn serve(&self) -> crate::daemon::Serve {
        crate::daemon::Serve::start_with(
            self.dir(),
            &["--config", s(&self.dir().join("fleet.toml"))],
        )
    }

    /// Agent-1 of acme, connected to the daemon serving in the directory.
    pub(super) async fn agent(&self) -> DaemonClient {
        let mut c = tollgate_client::ClientConfig::new(
            self.dir().join("tollgate.sock"),
            "acme",
            SECRET.as_bytes(),
            "agent-1",
        );
        c.timeout = Duration::from_secs(5);
        DaemonClient::connect(c).await.unwrap()
    }

    /// `tollgate audit verify --postgres` on the schema: exit 0, the chain `ok`.
    pub(super) fn cli_verifies(&self) {
        let o = tollgate(&[
            "audit",
            "verify",
            "--postgres",
            SHARED_PG,
            "--schema",
            &self.schema,
        ]);
        assert_eq!(code(&o), 0, "{}", text(&o));
        assert!(
            stdout(&o).contains(&format!("chain {}: ok:", self.chain)),
            "{}",
            text(&o)
        );
    }
}

/// Run `tollgate serve --config DIR/fleet.toml --data-dir DIR`, which must refuse to start:
/// it exits non-zero within 20 s (a daemon that starts anyway, the failure these tests
/// are for, would serve until killed). Its output.
pub(super) fn refused_start(dir: &Path) -> std::process::Output {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "serve",
            "--config",
            s(&dir.join("fleet.toml")),
            "--data-dir",
            s(dir),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("the daemon started: {}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert_ne!(code(&out), 0, "{}", text(&out));
    assert!(!dir.join("tollgate.sock").exists());
    out
}

/// A chain registered in PostgreSQL before format version 6 (by an older daemon) goes on
/// in its version: a daemon without `[policy]` serves on it and the chain verifies; with
/// `[policy]` the daemon refuses to start, naming the chain and its version, since the
/// chain cannot record the set nor the verdicts' notes.
#[test]
fn a_version_5_chain_serves_without_policies_and_refuses_them_naming_the_chain() {
    let old = OldChain::new("tgv5", 5, 9);
    let dir = old.dir();
    std::fs::write(dir.join("rules.cedar"), NO_SHELL).unwrap();
    // Without [policy]: it serves, in version 5.
    old.configure("", "");
    let serve = old.serve();
    rt().block_on(async {
        let agent = old.agent().await;
        let v = agent
            .pre_exec("shell", &json::parse_str("{}").unwrap(), 0.0)
            .await;
        assert!(v.allowed(), "{v:?}");
    });
    assert!(serve.terminate().success());
    // With [policy]: refused, naming the chain.
    old.configure("", "[policy]\nfiles = [\"rules.cedar\"]\n");
    let out = refused_start(dir);
    assert!(
        text(&out).contains("chain `old5` is format version 5, which cannot record a policy set"),
        "{}",
        text(&out)
    );
    // The chain holds the version-5 entries of the first run, and verifies.
    let all = chains(&old.fleet);
    assert_eq!(all.len(), 1);
    assert!(all["old5"].len() >= 2, "{:?}", all["old5"]);
    assert!(!all["old5"].iter().any(|e| matches!(e, Event::PolicySet(_))));
    old.cli_verifies();
}

/// Issue 19: a chain registered in format version 6 goes on in version 6 and takes a plain
/// `[policy]` set, but cannot record what version 7 adds: a daemon whose set has a
/// `@shadow` policy, or with `[audit] params` other than `hash`, refuses to start, naming
/// the chain and its version; and a running daemon refuses to reload into such a set,
/// keeping the set it has (nothing recorded, its verdicts unchanged).
#[test]
fn a_version_6_chain_refuses_shadow_policies_and_recorded_params_naming_the_chain() {
    let old = OldChain::new("tgv6", 6, 10);
    let dir = old.dir();
    std::fs::write(dir.join("rules.cedar"), NO_SHELL).unwrap();
    std::fs::write(
        dir.join("shadow.cedar"),
        "@id(\"shadow-no-pay\") @shadow forbid (principal, action == Action::\"pay\", resource);\n",
    )
    .unwrap();
    let config = |audit: &str, policy: &str| old.configure(audit, policy);
    // A plain set: it serves, in version 6, and the forbid decides.
    config("", "[policy]\nfiles = [\"rules.cedar\"]\n");
    let serve = old.serve();
    let ops = dir.join("acme.ops");
    std::fs::write(&ops, OPERATOR_SECRET).unwrap();
    rt().block_on(async {
        let agent = old.agent().await;
        let v = agent
            .pre_exec("shell", &json::parse_str("{}").unwrap(), 0.0)
            .await;
        assert_eq!(v.reason, "policy:no-shell", "{v:?}");
        // The files gain a @shadow policy and the running daemon is told to reload: it
        // refuses, naming the chain, and keeps deciding with the set it has.
        std::fs::write(
            dir.join("rules.cedar"),
            format!(
                "{NO_SHELL}\n@id(\"shadow-no-pay\") @shadow forbid (principal, action == Action::\"pay\", resource);\n"
            ),
        )
        .unwrap();
        let o = tollgate(&[
            "policy",
            "reload",
            "--socket",
            s(&dir.join("tollgate.sock")),
            "--org",
            "acme",
            "--secret-file",
            s(&ops),
        ]);
        assert_ne!(code(&o), 0, "{}", text(&o));
        assert!(
            text(&o).contains("cannot record shadow policies"),
            "{}",
            text(&o)
        );
        let v = agent
            .pre_exec("shell", &json::parse_str("{}").unwrap(), 0.0)
            .await;
        assert_eq!(v.reason, "policy:no-shell", "{v:?}");
        let v = agent
            .pre_exec("pay", &json::parse_str("{}").unwrap(), 0.0)
            .await;
        assert_eq!(v.reason, "within_thresholds", "{v:?}");
        std::fs::write(dir.join("rules.cedar"), NO_SHELL).unwrap();
    });
    assert!(serve.terminate().success());
    // A @shadow policy: refused, naming the chain.
    config(
        "",
        "[policy]\nfiles = [\"rules.cedar\", \"shadow.cedar\"]\n",
    );
    let out = refused_start(dir);
    assert!(
        text(&out)
            .contains("chain `old6` is format version 6, which cannot record shadow policies"),
        "{}",
        text(&out)
    );
    // A whole set in shadow mode: refused too.
    config(
        "",
        "[policy]\nfiles = [\"rules.cedar\"]\nmode = \"shadow\"\n",
    );
    let out = refused_start(dir);
    assert!(
        text(&out).contains("cannot record shadow policies"),
        "{}",
        text(&out)
    );
    // Recorded params: refused, naming the chain.
    config("params = \"full\"", "");
    let out = refused_start(dir);
    assert!(
        text(&out).contains("chain `old6` is format version 6, which cannot record params"),
        "{}",
        text(&out)
    );
    // The chain holds the version-6 entries of the first run (one policy set: the refused
    // reload recorded nothing, and no shadow note), and verifies.
    let all = chains(&old.fleet);
    let sets: Vec<_> = all["old6"]
        .iter()
        .filter(|e| matches!(e, Event::PolicySet(_)))
        .collect();
    assert_eq!(sets.len(), 1, "{sets:?}");
    assert!(matches!(sets[0], Event::PolicySet(p) if p.shadow_policies == 0));
    old.cli_verifies();
}
