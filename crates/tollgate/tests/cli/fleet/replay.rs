//! `tollgate policy replay --postgres` on a fleet's chains (issue 19): three daemons on
//! one Redis and one PostgreSQL, three agents spending one `per_organization` budget
//! through them (their calls settled, the budget running out near the end), a daemon killed
//! with SIGKILL midway and its agent's session resumed on another daemon. Every session's
//! entries and the budget's writes are then spread over several chains.
//!
//! - Replayed under the configuration that wrote it: no flip, no reason change, every
//!   verdict replayed (exit 0).
//! - Under planted changes (a `forbid` added; the budget halved): exactly the flips a
//!   fleet running the change gives the same calls, with the same kill (exit 1).
//! - A changed byte in one chain: refused, nothing replayed (exit 2).

use std::collections::BTreeMap;
use std::path::Path;

use tollgate_client::DaemonClient;
use tollgate_core::{json, Verdict};

use super::policy::{refused_start, OldChain, NO_SHELL};
use super::{rt, Extra, Fleet, SHARED_PG, SHARED_REDIS};
use crate::{code, s, stdout, text, tollgate};

const NO_PAY: &str = "@id(\"no-pay\") forbid (principal, action == Action::\"pay\", resource);\n";
const AGENTS: usize = 3;
const ROUNDS: u64 = 12;
/// The round after which daemon 0 is killed (its agent resumes on daemon 1).
const KILL_AFTER: u64 = 5;
const COST: f64 = 0.1;
const ACTUAL: f64 = 0.1;

/// One fleet run: the fleet (stopped) and every verdict, by (agent, call number).
struct Run {
    fleet: Fleet,
    verdicts: BTreeMap<(usize, u64), (Verdict, String)>,
    sessions: Vec<String>,
}

/// A fleet of three daemons with `budget_usd` shared by organization acme and `rules` as
/// its `[policy]`, asked the same calls in the same order by three agents (agent `a` on
/// daemon `a`), round by round: a search, a payment, a shell call in turn, each with its
/// own params, costing $0.10 and settled at that when allowed. After round
/// [`KILL_AFTER`] daemon 0 is killed with SIGKILL and agent 0 resumes its session on
/// daemon 1.
fn run_fleet(root: &Path, budget_usd: f64, rules: &str) -> Run {
    std::fs::create_dir_all(root).unwrap();
    let rules_path = root.join("rules.cedar");
    std::fs::write(&rules_path, rules).unwrap();
    let tables = format!("[policy]\nfiles = [\"{}\"]\n", rules_path.display());
    let urls = vec![SHARED_REDIS.to_owned(); AGENTS];
    let extra = Extra {
        tables: &tables,
        ..Extra::default()
    };
    let mut fleet = Fleet::start_extra(root, SHARED_REDIS, &urls, SHARED_PG, budget_usd, 1, extra);
    let rt = rt();
    let mut verdicts = BTreeMap::new();
    let mut clients: Vec<DaemonClient> = rt.block_on(async {
        let mut out = Vec::new();
        for a in 0..AGENTS {
            out.push(
                DaemonClient::connect(fleet.client_config(a, "acme", a))
                    .await
                    .unwrap(),
            );
        }
        out
    });
    let sessions: Vec<String> = clients.iter().map(|c| c.session_id().to_owned()).collect();
    let mut round = |clients: &[DaemonClient], r: u64| {
        rt.block_on(async {
            for (a, c) in clients.iter().enumerate() {
                let tool = ["search", "pay", "shell"][((r + a as u64) % 3) as usize];
                let p = json::parse_str(&format!(r#"{{"agent":{a},"round":{r}}}"#)).unwrap();
                let v = c.pre_exec(tool, &p, COST).await;
                assert!(v.error.is_none(), "agent {a} round {r}: {v:?}");
                if v.verdict == Verdict::Allow {
                    c.post_exec(v.call_number, ACTUAL, true, "").await.unwrap();
                }
                verdicts.insert((a, v.call_number), (v.verdict, v.reason.clone()));
            }
        });
    };
    for r in 0..KILL_AFTER {
        round(&clients, r);
    }
    fleet.kill_9(0);
    let resumed = rt
        .block_on(DaemonClient::resume(
            fleet.client_config(1, "acme", 0),
            &sessions[0],
        ))
        .unwrap();
    clients[0] = resumed;
    for r in KILL_AFTER..ROUNDS {
        round(&clients, r);
    }
    drop(clients);
    fleet.stop_all();
    Run {
        fleet,
        verdicts,
        sessions,
    }
}

/// `policy replay --format json --examples 1000 --postgres URL --schema S --key ...` (each
/// daemon's public key) and `args`.
fn replay_args(fleet: &Fleet, args: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = [
        "policy",
        "replay",
        "--format",
        "json",
        "--examples",
        "1000",
        "--postgres",
        &fleet.pg_url,
        "--schema",
        &fleet.schema,
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    for d in &fleet.dirs {
        all.extend(["--key".to_owned(), s(&d.join("audit.pub")).to_owned()]);
    }
    all.extend(args.iter().map(|a| (*a).to_owned()));
    all
}

fn replay(fleet: &Fleet, args: &[&str]) -> (i32, json::Value, String) {
    let all = replay_args(fleet, args);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let o = tollgate(&all);
    let report = json::parse_str(stdout(&o).trim()).unwrap_or(json::Value::Null);
    (code(&o), report, text(&o))
}

fn count(report: &json::Value, k: &str) -> u64 {
    report.get(k).and_then(json::Value::as_u64).unwrap()
}

/// `(agent, call_number) -> (recorded, candidate, candidate_reason)` of every flip.
fn flips(
    report: &json::Value,
    sessions: &[String],
) -> BTreeMap<(usize, u64), (String, String, String)> {
    let str_of = |v: &json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).unwrap().to_owned();
    let json::Value::Array(items) = report.get("flip_examples").unwrap() else {
        panic!("{report:?}");
    };
    items
        .iter()
        .map(|f| {
            let session = str_of(f, "session_id");
            let agent = sessions.iter().position(|s| *s == session).unwrap();
            assert!(
                f.get("chain").is_some(),
                "a fleet's flip names its chain: {f:?}"
            );
            (
                (
                    agent,
                    f.get("call_number").and_then(json::Value::as_u64).unwrap(),
                ),
                (
                    str_of(f, "recorded"),
                    str_of(f, "candidate"),
                    str_of(f, "candidate_reason"),
                ),
            )
        })
        .collect()
}

/// A candidate configuration in `dir`: the fleet's guard with `budget_usd`, and `rules`.
fn candidate(dir: &Path, name: &str, budget_usd: f64, rules: &str) -> std::path::PathBuf {
    let cedar = dir.join(format!("{name}.cedar"));
    std::fs::write(&cedar, rules).unwrap();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[guard.default]\nbudget_usd = {budget_usd:?}\nbudget_scope = \"per_organization\"\n\
             settlement = \"actual\"\nmax_repeat_calls = 0\n\
             [guard.agents.reviewed]\nhitl_mode = \"always\"\n\
             [policy]\nfiles = [\"{name}.cedar\"]\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn a_fleet_log_replays_under_its_own_config_with_no_flip_and_a_planted_change_gives_a_fleets_flips()
{
    let tmp = tempfile::tempdir().unwrap();
    let recorded = run_fleet(&tmp.path().join("recorded"), 2.0, NO_SHELL);
    let fleet = &recorded.fleet;
    // The log has what the test needs: policy refusals, budget refusals, allowed calls,
    // and a session whose entries are in two chains.
    let reasons: Vec<&str> = recorded
        .verdicts
        .values()
        .map(|(_, r)| r.as_str())
        .collect();
    assert!(reasons.contains(&"policy:no-shell"), "{reasons:?}");
    assert!(reasons.contains(&"within_thresholds"), "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| *r == "budget_overrun" || *r == "budget_exhausted"),
        "{reasons:?}"
    );

    // Self-check: the fleet's own configuration (its daemon 1's file, as it ran).
    let own = fleet.dirs[1].join("fleet.toml");
    let (c, report, t) = replay(fleet, &["--config", s(&own)]);
    assert_eq!(c, 0, "{t}");
    assert_eq!(count(&report, "flips"), 0, "{t}");
    assert_eq!(count(&report, "reason_changes"), 0, "{t}");
    assert_eq!(count(&report, "unreplayable"), 0, "{t}");
    assert_eq!(
        count(&report, "verdicts"),
        recorded.verdicts.len() as u64,
        "{t}"
    );
    assert_eq!(
        count(&report, "replayed"),
        recorded.verdicts.len() as u64,
        "{t}"
    );
    assert_eq!(count(&report, "skipped_settlements"), 0, "{t}");
    // On a terminal: a bar toward the chains' rows while they are verified, then one
    // toward the merged session entries while they are replayed.
    let entries = count(&report, "entries");
    let args = replay_args(fleet, &["--config", s(&own)]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (c, terminal) = crate::replay::on_a_terminal(&args);
    assert_eq!(c, 0, "{terminal}");
    let full = "#".repeat(30);
    assert!(
        terminal.contains(&format!(
            "verifying [{full}] 100%  {entries} of {entries}, {entries} entries"
        )),
        "{terminal:?}"
    );
    assert!(
        terminal.contains(&format!("replaying [{full}] 100%")),
        "{terminal:?}"
    );
    // The same as a configuration of its guard and rules alone.
    let same = candidate(tmp.path(), "same", 2.0, NO_SHELL);
    let (c, report, t) = replay(fleet, &["--config", s(&same)]);
    assert_eq!((c, count(&report, "flips")), (0, 0), "{t}");

    // Planted changes; each one's truth is a fleet running it, asked the same calls.
    for (name, budget, rules) in [
        ("forbid", 2.0, format!("{NO_SHELL}{NO_PAY}")),
        ("halved", 1.0, NO_SHELL.to_owned()),
    ] {
        let truth = run_fleet(&tmp.path().join(name), budget, &rules);
        let expected: BTreeMap<(usize, u64), (String, String, String)> = recorded
            .verdicts
            .iter()
            .filter_map(|(k, (v, _))| {
                let (tv, tr) = &truth.verdicts[k];
                (tv != v).then(|| (*k, (v.to_string(), tv.to_string(), tr.clone())))
            })
            .collect();
        assert!(!expected.is_empty(), "{name}: the change flips nothing");
        assert_eq!(truth.verdicts.len(), recorded.verdicts.len(), "{name}");
        let config = candidate(tmp.path(), name, budget, &rules);
        let (c, report, t) = replay(fleet, &["--config", s(&config)]);
        assert_eq!(c, 1, "{name}: {t}");
        assert_eq!(flips(&report, &recorded.sessions), expected, "{name}: {t}");
        assert_eq!(
            count(&report, "flips"),
            expected.len() as u64,
            "{name}: {t}"
        );
        assert_eq!(count(&report, "unreplayable"), 0, "{name}: {t}");
    }

    // A byte changed in one chain's row: refused, nothing replayed.
    rt().block_on(async {
        let settings = tollgate_pg::PgSettings::new(&fleet.pg_url).with_schema(&fleet.schema);
        let client = tollgate_pg::connect(&settings).await.unwrap();
        let sc = &fleet.schema;
        client
            .batch_execute(&format!(
                "ALTER TABLE \"{sc}\".entries DISABLE TRIGGER USER;
                 UPDATE \"{sc}\".entries SET record = set_byte(record, 70, get_byte(record, 70) # 4)
                   WHERE idx = 3 AND chain_id = (SELECT min(chain_id) FROM \"{sc}\".chains);
                 ALTER TABLE \"{sc}\".entries ENABLE TRIGGER USER;"
            ))
            .await
            .unwrap();
    });
    let (c, _, t) = replay(fleet, &["--config", s(&own)]);
    assert_eq!(c, 2, "{t}");
    assert!(t.contains("BROKEN"), "{t}");
    assert!(!t.contains("\"flips\""), "{t}");
}

/// Format version 8 records the probabilistic layer's draw; a chain registered in version
/// 7 cannot: a daemon on it serves without the layer (its entries replay, exit 0), and
/// with `probabilistic_deny` on, for every agent or for one, refuses to start, naming the
/// chain and its version.
#[test]
fn a_version_7_chain_replays_and_refuses_the_probabilistic_layer_naming_the_chain() {
    let old = OldChain::new("tgv7", 7, 11);
    let dir = old.dir();
    let config = |guards: &str| old.configure("", guards);
    // Without the layer: it serves, in version 7.
    config("[guard.default]\nbudget_usd = 1.0\n");
    let serve = old.serve();
    rt().block_on(async {
        let agent = old.agent().await;
        for n in 0..3 {
            let p = json::parse_str(&format!(r#"{{"n":{n}}}"#)).unwrap();
            assert!(agent.pre_exec("search", &p, 0.1).await.allowed());
        }
    });
    assert!(serve.terminate().success());
    // Its entries replay under its own configuration.
    let o = tollgate(&[
        "policy",
        "replay",
        "--config",
        s(&dir.join("fleet.toml")),
        "--postgres",
        SHARED_PG,
        "--schema",
        &old.schema,
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(
        stdout(&o).contains("replayed 3 of 3 verdicts"),
        "{}",
        text(&o)
    );
    // With the layer on: refused, naming the chain; for one agent's guard too.
    for guards in [
        "[guard.default]\nbudget_usd = 1.0\nprobabilistic_deny = true\n",
        "[guard.default]\nbudget_usd = 1.0\n[guard.agents.risky]\nprobabilistic_deny = true\n",
    ] {
        config(guards);
        let out = refused_start(dir);
        assert!(
            text(&out).contains(
                "chain `old7` is format version 7, which cannot record the probabilistic layer's draws"
            ),
            "{}",
            text(&out)
        );
    }
}
