//! The invariants of SP/1.0 as property tests: the seed's P1-P9 (prefixed `seed_`) and the
//! current text's P1-P9 (prefixed `sp101_`), 500 generated cases each. Where the seed states
//! a property that is false, the test checks the strongest true version and says why.

use std::collections::{BTreeMap, BTreeSet};

use proptest::collection::{btree_map, btree_set, vec};
use proptest::prelude::*;
use proptest::sample::select;

use tollgate_core::json::{Number, Value};
use tollgate_core::{
    apply_decision, apply_post_exec, decide, record_human_decision, Decision, Digest, GuardConfig,
    HitlMode, HumanDecision, Money, Params, PendingTransition, Ratio, Reason, ReportedCost,
    SessionState, Settlement, Successor, ToolCall, TransitionStatus, Verdict,
};

const TOOLS: &[&str] = &["search", "fetch", "buy"];

fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: 500,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------

fn key() -> impl Strategy<Value = String> {
    select(vec![
        "q",
        "tool",
        "ctx",
        "context",
        " Context ",
        "opaque",
        "raw_context",
        "blob",
        "n",
        "é",
    ])
    .prop_map(str::to_owned)
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        // Every f64, NaN and infinities included: decide must stay total.
        any::<f64>().prop_map(|f| Value::Number(Number::Float(f))),
        select(vec![
            "opaque",
            "UNKNOWN",
            " unevaluable ",
            "untestable",
            "user asked",
            "503",
            "x"
        ])
        .prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map(key(), inner, 0..4).prop_map(Value::Object),
        ]
    })
}

fn nested(levels: usize) -> Value {
    let mut v = Value::Object(BTreeMap::new());
    for _ in 0..levels {
        v = Value::Object(BTreeMap::from([("a".to_owned(), v)]));
    }
    v
}

/// Params: mostly objects, sometimes anything, sometimes nested past the depth limit.
fn any_params() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => btree_map(key(), json_value(), 0..4).prop_map(Value::Object),
        1 => json_value(),
        1 => (60usize..70).prop_map(nested),
        1 => Just(Value::Object(BTreeMap::from([("__noncanonical__".to_owned(), Value::Bool(true))]))),
    ]
}

/// A small pool of well-formed params, so that generated digests in state can match.
fn pool() -> Vec<Value> {
    [
        r#"{"q":"a"}"#,
        r#"{"q":"b"}"#,
        r#"{"q":"c","ctx":"opaque"}"#,
        r#"{"n":1.5,"list":[1,2]}"#,
    ]
    .iter()
    .map(|t| tollgate_core::json::parse_str(t).unwrap())
    .collect()
}

fn pool_digest(i: usize) -> Digest {
    Params::json(&pool()[i % 4]).canonical_digest().unwrap()
}

fn money(max_usd: i64) -> impl Strategy<Value = Money> {
    (0..=max_usd * 1_000_000_000).prop_map(Money)
}

fn config() -> impl Strategy<Value = GuardConfig> {
    (
        prop_oneof![Just(Money::ZERO), money(10)],
        0u32..4,
        any::<bool>(),
        prop_oneof![Just(0u32), 1u32..100],
        (prop_oneof![Just(0u32), 1u32..60], 0u32..4),
        prop_oneof![Just(0u64), 1u64..8],
        (any::<bool>(), 0u32..=1_000_000),
        (
            select(vec![
                HitlMode::Never,
                HitlMode::OnDeny,
                HitlMode::OnThreshold,
                HitlMode::Always,
            ]),
            0u32..=1_000_000,
        ),
        select(vec![Settlement::Conservative, Settlement::Actual]),
    )
        .prop_map(
            |(budget, rep, amp, timeout, (wd, wm), total, (prob, jitter), (mode, thr), settle)| {
                GuardConfig {
                    budget,
                    max_repeat_calls: rep,
                    error_amplification: amp,
                    timeout_seconds: timeout,
                    window_duration_s: wd,
                    window_max_calls: wm,
                    max_total_calls: total,
                    probabilistic_deny: prob,
                    deny_jitter_ratio: Ratio::from_ppm(jitter),
                    hitl_mode: mode,
                    hitl_budget_threshold: Ratio::from_ppm(thr),
                    settlement: settle,
                    // The SP/1.0.1 properties are stated for one pending transition; the
                    // parallel-holds extension has its own (`parallel.rs`).
                    max_held_calls: 1,
                    ..GuardConfig::default()
                }
            },
        )
}

fn maybe_digest() -> impl Strategy<Value = Option<Digest>> {
    prop_oneof![
        Just(None),
        (0usize..4).prop_map(|i| Some(pool_digest(i))),
        any::<[u8; 32]>().prop_map(|b| Some(Digest(b))),
    ]
}

fn pending() -> impl Strategy<Value = PendingTransition> {
    (
        select(vec![
            "",
            "approve",
            "reject",
            "modify",
            "defer",
            "escalate",
            "Approve ",
            "approve_with_conditions",
        ]),
        (prop::option::of(0u64..16), maybe_digest()),
        (prop::option::of(0u64..16), maybe_digest()),
        select(vec![
            "pending",
            "rejected",
            "superseded",
            "consumed",
            "executed",
            "expired",
            "revoked",
            "cancelled",
            "consumed_on_execute",
        ]),
        any::<bool>(),
    )
        .prop_map(
            |(decision, (on, od), (sn, sd), status, resume)| PendingTransition {
                decision: HumanDecision::parse(decision),
                original_nonce: on,
                original_args_digest: od,
                successor_nonce: sn,
                successor_args_digest: sd,
                terminal_status: TransitionStatus::parse(status),
                resume_attempt: resume,
                ..PendingTransition::default()
            },
        )
}

fn state() -> impl Strategy<Value = SessionState> {
    (
        (money(10), -1_000_000_000i64..=10_000_000_000),
        (0u64..10, btree_map(select(TOOLS.to_vec()), 0u32..6, 0..3)),
        (
            btree_map(select(TOOLS.to_vec()), 0u32..6, 0..3),
            0i64..100_000_000_000,
        ),
        prop::bool::weighted(0.2),
        btree_set(0u64..16, 0..5),
        (
            prop::option::of(select(TOOLS.to_vec())),
            maybe_digest(),
            any::<bool>(),
        ),
        prop::option::weighted(0.3, pending()),
        0i64..50_000_000_000,
    )
        .prop_map(
            |(
                (initial, rem),
                (total, repeats),
                (windows, wstart),
                tripped,
                seen,
                (last, hash, err),
                pending,
                started,
            )| {
                SessionState {
                    budget_initial: initial,
                    budget_remaining: Money(rem.min(initial.0)),
                    total_calls: total,
                    repeat_counts: repeats
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                    window_counts: windows
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                    window_start_ns: wstart,
                    circuit_tripped: tripped,
                    seen_nonces: seen.into(),
                    last_tool_name: last.map(str::to_owned),
                    last_params_hash: hash,
                    last_error_signal: err,
                    pending,
                    started_at_ns: started,
                    ..SessionState::default()
                }
            },
        )
}

/// A call's inputs, owned so a `ToolCall` can borrow them.
#[derive(Debug, Clone)]
struct CallInput {
    tool: &'static str,
    params: Value,
    nonce: Option<u64>,
    cost: Money,
    raw: Option<&'static str>,
}

impl CallInput {
    fn call(&self) -> ToolCall<'_> {
        ToolCall {
            tool_name: self.tool,
            params: Params::json(&self.params),
            nonce: self.nonce,
            estimated_cost: self.cost,
            raw_params: self.raw,
        }
    }
}

fn call_with(params: impl Strategy<Value = Value>) -> impl Strategy<Value = CallInput> {
    (
        select(TOOLS.to_vec()),
        params,
        prop::option::of(0u64..16),
        money(3),
        prop::option::of(select(vec![
            "{\"e\":\"401 unauthorized\"}",
            "{\"q\":\"fine\"}",
        ])),
    )
        .prop_map(|(tool, params, nonce, cost, raw)| CallInput {
            tool,
            params,
            nonce,
            cost,
            raw,
        })
}

fn pooled_call() -> impl Strategy<Value = CallInput> {
    call_with((0usize..4).prop_map(|i| pool()[i].clone()))
}

/// Params that carry an opaque binding somewhere: a context key holding a marker, buried
/// up to three objects or arrays deep inside otherwise arbitrary params.
fn opaque_params() -> impl Strategy<Value = Value> {
    (
        btree_map(key(), json_value(), 0..3),
        select(vec!["ctx", "CONTEXT", " opaque", "raw_context", "blob"]),
        select(vec!["opaque", "Unknown", "unevaluable ", "UNTESTABLE"]),
        vec(any::<bool>(), 0..3),
    )
        .prop_map(|(mut outer, k, marker, wraps)| {
            let mut v = Value::Object(BTreeMap::from([(k.to_owned(), Value::from(marker))]));
            for in_array in wraps {
                v = if in_array {
                    Value::Array(vec![Value::Null, v])
                } else {
                    Value::Object(BTreeMap::from([("inner".to_owned(), v)]))
                };
            }
            outer.insert("zz".to_owned(), v);
            Value::Object(outer)
        })
}

fn any_call() -> impl Strategy<Value = CallInput> {
    prop_oneof![call_with(any_params()), pooled_call()]
}

fn now() -> impl Strategy<Value = i64> {
    0i64..200_000_000_000
}

fn rng() -> impl Strategy<Value = f64> {
    prop_oneof![0.0f64..1.0, Just(f64::NAN), Just(1.0)]
}

fn is_release(r: Reason) -> bool {
    matches!(
        r,
        Reason::TransitionApprove | Reason::TransitionModifySuccessor
    )
}

// ---------------------------------------------------------------------------------------
// Single decisions
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases())]

    /// SP/1.0.1 P1, totality: a decision for every input (a panic fails the test), and the
    /// decision is well-formed.
    #[test]
    fn sp101_p1_totality(cfg in config(), st in state(), c in any_call(), t in now(), r in rng()) {
        let d = decide(&cfg, &st, &c.call(), t, r);
        let overrun_to_human = d.reason == Reason::BudgetOverrun
            && d.verdict == Verdict::Hitl
            && cfg.hitl_mode == HitlMode::OnDeny;
        prop_assert!(d.verdict == d.reason.usual_verdict() || overrun_to_human, "{d:?}");
        prop_assert_eq!(d.deny_reason.is_some(), d.verdict == Verdict::Deny);
        prop_assert!(!d.probabilistic || d.reason == Reason::BudgetExhausted);
    }

    /// SP/1.0.1 P2 and seed P7, determinism: the same inputs give the same decision,
    /// also from a copy of the state.
    #[test]
    fn sp101_p2_seed_p7_determinism(cfg in config(), st in state(), c in any_call(), t in now(), r in rng()) {
        let a = decide(&cfg, &st, &c.call(), t, r);
        let b = decide(&cfg.clone(), &st.clone(), &c.clone().call(), t, r);
        prop_assert_eq!(a, b);
    }

    /// SP/1.0.1 P3, circuit dominance: a tripped circuit means DENY, reported as
    /// `circuit_open` for canonical params (malformed params report rule 1 instead).
    #[test]
    fn sp101_p3_circuit_dominance(cfg in config(), mut st in state(), c in any_call(), t in now(), r in rng()) {
        st.circuit_tripped = true;
        let call = c.call();
        let d = decide(&cfg, &st, &call, t, r);
        prop_assert_eq!(d.verdict, Verdict::Deny);
        let want = if call.params.canonical_digest().is_ok() { Reason::CircuitOpen } else { Reason::MalformedInput };
        prop_assert_eq!(d.reason, want);
    }

    /// SP/1.0.1 P4 and seed P9, replay refusal: a seen nonce means DENY.
    #[test]
    fn sp101_p4_seed_p9_replay(cfg in config(), mut st in state(), c in any_call(), n in 0u64..16, t in now(), r in rng()) {
        st.seen_nonces.insert(n, usize::MAX);
        let mut c = c;
        c.nonce = Some(n);
        prop_assert_eq!(decide(&cfg, &st, &c.call(), t, r).verdict, Verdict::Deny);
    }

    /// SP/1.0.1 P5 and seed P5, the repeat limit. As stated ("count ≥ max ⇒ DENY") both are
    /// false in two places the current text itself sets: a pending human approval is
    /// resolved before the repeat rule (§3.2's note on rule 4), and rule 5b may send a
    /// budget overrun to a human under ON_DENY. The repeat must also be the same call (same
    /// tool and params). The strongest true version: with no pending transition, a repeat
    /// of the last call at or past the limit is never ALLOWed, and is DENY unless a budget
    /// overrun went to a human.
    #[test]
    fn sp101_p5_seed_p5_repeat_limit(cfg in config(), mut st in state(), c in pooled_call(), extra in 0u32..3, t in now(), r in rng()) {
        let mut cfg = cfg;
        cfg.max_repeat_calls = cfg.max_repeat_calls.max(1);
        st.pending = None;
        let call = c.call();
        st.last_tool_name = Some(c.tool.to_owned());
        st.last_params_hash = call.params.canonical_digest().ok();
        st.repeat_counts.insert(c.tool.to_owned(), cfg.max_repeat_calls + extra);
        let d = decide(&cfg, &st, &call, t, r);
        prop_assert!(
            d.verdict == Verdict::Deny
                || (d.reason == Reason::BudgetOverrun && cfg.hitl_mode == HitlMode::OnDeny),
            "{d:?}"
        );
    }

    /// Seed P6, "a fresh state ALLOWs any first call", is false as stated: malformed params
    /// are denied (rule 1), opaque context goes to a human (rule 10), HITL ALWAYS (or
    /// ON_THRESHOLD at threshold 1) asks a human, and a call costing more than the whole
    /// budget is an overrun. The strongest true version: a fresh session ALLOWs any first
    /// call with canonical, evaluable params that fits its budget, under any config that
    /// does not send every call to a human, before any timeout.
    #[test]
    fn seed_p6_fresh_state_allows(cfg in config(), c in pooled_call(), r in rng()) {
        let mut cfg = cfg;
        if cfg.hitl_mode == HitlMode::Always
            || (cfg.hitl_mode == HitlMode::OnThreshold && cfg.hitl_budget_threshold.ppm() == 1_000_000)
        {
            cfg.hitl_mode = HitlMode::Never;
        }
        let call = c.call();
        prop_assume!(!call.params.has_opaque_context());
        prop_assume!(!cfg.budget_enabled() || c.cost <= cfg.budget);
        let st = SessionState::new(cfg.budget, 1_000);
        let d = decide(&cfg, &st, &call, 1_000, r);
        prop_assert_eq!((d.verdict, d.reason), (Verdict::Allow, Reason::WithinThresholds));
    }

    /// SP/1.0.1 P7 and seed P8, HITL_ALWAYS. The seed's "ALWAYS ∧ ¬tripped ⇒ HITL" is false
    /// for every DENY rule above it (malformed, replay, budget, repeat, ...). The current
    /// text's version holds: under ALWAYS, whenever no higher-precedence rule decides, the
    /// verdict is HITL `hitl_all_calls`; and when one does, ALWAYS changes nothing.
    #[test]
    fn sp101_p7_seed_p8_hitl_always(cfg in config(), st in state(), c in any_call(), t in now(), r in rng()) {
        let never = GuardConfig { hitl_mode: HitlMode::Never, ..cfg.clone() };
        let always = GuardConfig { hitl_mode: HitlMode::Always, ..cfg };
        let call = c.call();
        let lower = decide(&never, &st, &call, t, r);
        let d = decide(&always, &st, &call, t, r);
        if matches!(lower.reason, Reason::WithinThresholds | Reason::OpaqueContext) {
            prop_assert_eq!((d.verdict, d.reason), (Verdict::Hitl, Reason::HitlAllCalls));
        } else {
            prop_assert_eq!(d, lower);
        }
    }

    /// SP/1.0.1 P8, fail closed: params with opaque context are never a silent ALLOW. The
    /// only ALLOW they can get is a human's release of exactly that preimage.
    #[test]
    fn sp101_p8_fail_closed(cfg in config(), st in state(), c in call_with(opaque_params()), t in now(), r in rng()) {
        let call = c.call();
        // The generator buries a binding; params that are also malformed (NaN elsewhere)
        // are denied by rule 1 before any context is looked at.
        prop_assume!(call.params.canonical_digest().is_ok());
        prop_assert!(call.params.has_opaque_context());
        let d = decide(&cfg, &st, &call, t, r);
        prop_assert!(d.verdict != Verdict::Allow || is_release(d.reason), "{d:?}");
    }

    /// SP/1.0.1 P9, bound authorization: with a transition pending, the only ALLOW is the
    /// release of the authorized (nonce, digest) pair; every other call is DENY or HITL.
    #[test]
    fn sp101_p9_bound_authorization(cfg in config(), mut st in state(), p in pending(), c in pooled_call(), t in now(), r in rng()) {
        st.pending = Some(p.clone());
        let call = c.call();
        let d = decide(&cfg, &st, &call, t, r);
        if d.verdict == Verdict::Allow {
            let (nonce, digest) = match p.decision {
                HumanDecision::Approve => (p.original_nonce, p.original_args_digest),
                HumanDecision::Modify => (p.successor_nonce, p.successor_args_digest),
                _ => return Err(TestCaseError::fail(format!("ALLOW under {:?}", p.decision))),
            };
            prop_assert!(is_release(d.reason));
            prop_assert!(nonce.is_some() || digest.is_some());
            prop_assert!(nonce.is_none() || nonce == call.nonce);
            prop_assert!(digest.is_none() || digest == call.params.canonical_digest().ok());
        } else {
            prop_assert!(!is_release(d.reason));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Sequences through the transitions
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Call(CallInput),
    Post {
        back: usize,
        actual: Money,
        error: bool,
    },
    Human {
        decision: &'static str,
        successor: usize,
        nonce: u64,
    },
    Tick(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => pooled_call().prop_map(Op::Call),
        2 => (0usize..4, money(2), any::<bool>()).prop_map(|(back, actual, error)| Op::Post { back, actual, error }),
        1 => (select(vec!["approve", "reject", "modify", "defer", "escalate"]), 0usize..4, 0u64..16)
            .prop_map(|(decision, successor, nonce)| Op::Human { decision, successor, nonce }),
        1 => (0i64..30_000_000_000).prop_map(Op::Tick),
    ]
}

/// What one run observed, for the assertions.
#[derive(Debug, Default)]
struct Trace {
    steps: Vec<(SessionState, Op, Option<Decision>, SessionState)>,
}

fn run(cfg: &GuardConfig, ops: &[Op]) -> Trace {
    let mut st = SessionState::new(cfg.budget, 0);
    let mut now = 0i64;
    let mut allowed: Vec<u64> = Vec::new();
    let mut trace = Trace::default();
    for (i, op) in ops.iter().enumerate() {
        let before = st.clone();
        let mut decision = None;
        match op {
            Op::Call(c) => {
                let call = c.call();
                let number = u64::try_from(i).unwrap() + 1;
                let d = decide(cfg, &st, &call, now, 1.0);
                apply_decision(cfg, &mut st, &call, &d, number, now);
                if d.verdict == Verdict::Allow {
                    allowed.push(number);
                }
                decision = Some(d);
            }
            Op::Post {
                back,
                actual,
                error,
            } => {
                if let Some(&n) = allowed.iter().rev().nth(*back) {
                    apply_post_exec(cfg, &mut st, n, ReportedCost::Exact(*actual), *error, now);
                }
            }
            Op::Human {
                decision,
                successor,
                nonce,
            } => {
                let s = Successor {
                    nonce: *nonce,
                    args_digest: pool_digest(*successor),
                };
                let _ = record_human_decision(
                    &mut st,
                    None,
                    HumanDecision::parse(decision),
                    Some(s),
                    now,
                );
            }
            Op::Tick(dt) => now += dt,
        }
        trace.steps.push((before, op.clone(), decision, st.clone()));
    }
    trace
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    vec(op(), 1..30)
}

proptest! {
    #![proptest_config(cases())]

    /// Seed P1, budget monotonically non-increasing: under conservative settlement (the
    /// default, Appendix A's) remaining never rises, whatever happens. Under `actual`
    /// settlement a refund of an over-estimate raises it, by design; P1 is then false
    /// as stated, and the budget floor (seed P4) is what still holds.
    #[test]
    fn seed_p1_budget_never_rises(cfg in config(), ops in ops()) {
        let cfg = GuardConfig { settlement: Settlement::Conservative, ..cfg };
        for (before, op, _, after) in run(&cfg, &ops).steps {
            prop_assert!(after.budget_remaining <= before.budget_remaining, "{op:?}");
        }
    }

    /// Seed P2, "repeat counts never decrease", is false for a count of *consecutive*
    /// identical calls, which is what the repeat rule needs: a different call ends the run.
    /// The strongest true version: counts change only when a call is ALLOWed; then the
    /// allowed tool's count grows by exactly one if the call repeats the last one, and
    /// restarts at one otherwise, and a restart forgets every other tool's count (only the
    /// last tool's run is ever read, so the state stays one entry long). DENY and HITL
    /// never touch them.
    #[test]
    fn seed_p2_repeat_counts_only_grow_within_a_run(cfg in config(), ops in ops()) {
        for (before, op, d, after) in run(&cfg, &ops).steps {
            if before.repeat_counts == after.repeat_counts { continue; }
            let Op::Call(c) = &op else { return Err(TestCaseError::fail("count changed without a call")) };
            prop_assert_eq!(d.map(|d| d.verdict), Some(Verdict::Allow));
            let digest = c.call().params.canonical_digest().ok();
            let repeat = before.is_repeat(c.tool, digest);
            for tool in TOOLS {
                let b = before.repeat_counts.get(*tool).copied().unwrap_or(0);
                let a = after.repeat_counts.get(*tool).copied().unwrap_or(0);
                let want = match (*tool == c.tool, repeat) {
                    (true, true) => b + 1,
                    (true, false) => 1,
                    (false, true) => b,
                    (false, false) => 0,
                };
                prop_assert_eq!(a, want, "{}", tool);
            }
        }
    }

    /// Seed P3 (and SP/1.0.1 P3 over time), once tripped always tripped: after the first
    /// DENY, every later verdict is DENY and the circuit never closes.
    #[test]
    fn seed_p3_tripped_stays_tripped(cfg in config(), ops in ops()) {
        let mut tripped = false;
        for (_, _, d, after) in run(&cfg, &ops).steps {
            if tripped {
                prop_assert!(after.circuit_tripped);
                if let Some(d) = d { prop_assert_eq!(d.verdict, Verdict::Deny); }
            }
            tripped |= after.circuit_tripped;
            if d.is_some_and(|d| d.verdict == Verdict::Deny) { prop_assert!(after.circuit_tripped); }
        }
    }

    /// Seed P4 and SP/1.0.1 P6, the budget floor: remaining is never negative, and no ALLOW
    /// other than a human's explicit release takes a call whose estimate exceeds what is left.
    #[test]
    fn seed_p4_sp101_p6_budget_floor(cfg in config(), ops in ops()) {
        for (before, op, d, after) in run(&cfg, &ops).steps {
            prop_assert!(after.budget_remaining >= Money::ZERO);
            if let (Op::Call(c), Some(d)) = (&op, d) {
                if d.verdict == Verdict::Allow && cfg.budget_enabled() && !is_release(d.reason) {
                    prop_assert!(c.cost <= before.budget_remaining, "{d:?} {c:?}");
                }
            }
        }
    }

    /// Replay over time (SP/1.0.1 P4) and single use (P9): a nonce is ALLOWed at most once,
    /// and a released transition cannot be released again.
    #[test]
    fn sp101_p4_p9_nonces_and_releases_are_single_use(cfg in config(), ops in ops()) {
        let mut allowed = BTreeSet::new();
        let mut releases = 0;
        for (_, op, d, after) in run(&cfg, &ops).steps {
            if let (Op::Call(c), Some(d)) = (&op, d) {
                if d.verdict == Verdict::Allow {
                    if let Some(n) = c.nonce {
                        prop_assert!(allowed.insert(n), "nonce {n} allowed twice");
                    }
                    if is_release(d.reason) {
                        releases += 1;
                        prop_assert!(after.pending.is_none());
                    }
                }
            }
        }
        prop_assert!(releases <= ops.len());
    }
}
