//! Library mode: `tollgate._native.Guard` over [`tollgate_client::Guard`].

use std::path::PathBuf;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use tollgate_client::{AuditIdentity, Checked};
use tollgate_core::json::Value;
use tollgate_core::{
    GuardConfig, HitlMode, HumanDecision, Money, Params, Ratio, Settlement as SettlementMode,
    Successor,
};

use crate::convert;
use crate::objects::{Released, Settlement, Verdict};

/// The params the core sees for a Python object: its JSON value, or, when it has none (a
/// type JSON does not have, a non-`str` key, too deep), a non-object, which the core
/// denies as malformed input (rule 1). A cost that is not a finite, non-negative amount
/// is malformed input too, as it is on the wire.
pub(crate) fn call_inputs(params: &Bound<'_, PyAny>, cost: f64) -> (Value, Money) {
    let value = convert::to_value(params).unwrap_or(Value::Null);
    match Money::from_usd_non_negative(cost) {
        Ok(m) => (value, m),
        Err(_) => (Value::Null, Money::ZERO),
    }
}

fn word<T: std::str::FromStr>(what: &str, text: &str) -> PyResult<T>
where
    T::Err: std::fmt::Display,
{
    text.parse::<T>()
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

fn ratio(what: &str, f: f64) -> PyResult<Ratio> {
    Ratio::from_f64(f)
        .map_err(|_| PyValueError::new_err(format!("{what}: `{f}` is not a ratio between 0 and 1")))
}

/// An in-process guard over one session: the SP/1.0 decision core, its state and,
/// optionally, a signed local audit log. Safe to share between threads.
#[pyclass(frozen, subclass, module = "tollgate._native", name = "Guard")]
#[derive(Debug)]
pub struct PyGuard {
    inner: tollgate_client::Guard,
    audited: bool,
    /// The loader's warnings about the policy set in force (none without one).
    policy_warnings: Vec<String>,
    /// The `[policy]` settings of the set in force, and the directory its relative paths
    /// were read from (the working directory when the set was loaded), for
    /// [`PyGuard::replay_config`].
    policy_settings: Option<(tollgate_policy::files::Settings, std::path::PathBuf)>,
}

impl PyGuard {
    fn verdict(
        &self,
        checked: Checked,
        tool: &str,
        params: Py<PyAny>,
        estimated_cost_usd: f64,
    ) -> Verdict {
        let d = checked.decision;
        Verdict {
            verdict: d.verdict.as_str(),
            // The deciding policy's (`policy:<id>`, ...) when a policy decided, else the
            // guards'.
            reason: checked.reason,
            explanation: checked.policy_explanation.unwrap_or_default(),
            deny_reason: d.deny_reason.map(|r| r.as_str().to_owned()),
            budget_remaining_usd: Some(checked.budget_remaining.to_usd()),
            call_number: checked.call_number,
            nonce: checked.nonce,
            tool: tool.to_owned(),
            params,
            estimated_cost_usd,
            repeat_count: None,
            audit_entry_id: None,
            error: None,
            probabilistic: d.probabilistic,
        }
    }

    fn run_check(
        &self,
        py: Python<'_>,
        tool: &str,
        value: &Value,
        cost: Money,
        nonce: Option<u64>,
    ) -> Checked {
        let go = || match nonce {
            Some(n) => self.inner.check_with_nonce(tool, value, cost, n),
            None => self.inner.check(tool, value, cost),
        };
        if self.audited {
            // Waits until the verdict's entry is durable: let other threads run.
            py.detach(go)
        } else {
            go()
        }
    }
}

#[pymethods]
impl PyGuard {
    #[new]
    #[pyo3(signature = (
        *,
        budget_usd = 1.0,
        max_repeat_calls = 3,
        hitl_mode = "never",
        settlement = "conservative",
        error_amplification = false,
        timeout_seconds = 0,
        window_duration_s = 0,
        window_max_calls = 0,
        max_total_calls = 0,
        probabilistic_deny = false,
        deny_jitter_ratio = 0.0,
        hitl_budget_threshold = 0.0,
        nonce_window = 1024,
        max_reservations = 1024,
        max_held_calls = tollgate_core::config::DEFAULT_MAX_HELD_CALLS,
        audit_log = None,
        audit_key = None,
        audit_params = "hash",
        audit_redact = None,
        session_id = "local",
        agent_id = "local",
        organization_id = "local",
        policy = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        budget_usd: f64,
        max_repeat_calls: u32,
        hitl_mode: &str,
        settlement: &str,
        error_amplification: bool,
        timeout_seconds: u32,
        window_duration_s: u32,
        window_max_calls: u32,
        max_total_calls: u64,
        probabilistic_deny: bool,
        deny_jitter_ratio: f64,
        hitl_budget_threshold: f64,
        nonce_window: u32,
        max_reservations: u32,
        max_held_calls: u32,
        audit_log: Option<PathBuf>,
        audit_key: Option<PathBuf>,
        audit_params: &str,
        audit_redact: Option<Vec<String>>,
        session_id: &str,
        agent_id: &str,
        organization_id: &str,
        policy: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        for (what, id) in [
            ("session_id", session_id),
            ("agent_id", agent_id),
            ("organization_id", organization_id),
        ] {
            crate::check_id(what, id)?;
        }
        let budget = Money::from_usd_non_negative(budget_usd).map_err(|_| {
            PyValueError::new_err(format!(
                "budget_usd: `{budget_usd}` is not a finite, non-negative amount"
            ))
        })?;
        if nonce_window == 0 || max_reservations == 0 || max_held_calls == 0 {
            return Err(PyValueError::new_err(
                "nonce_window, max_reservations and max_held_calls must be at least 1",
            ));
        }
        let config = GuardConfig {
            budget,
            max_repeat_calls,
            error_amplification,
            timeout_seconds,
            window_duration_s,
            window_max_calls,
            max_total_calls,
            probabilistic_deny,
            deny_jitter_ratio: ratio("deny_jitter_ratio", deny_jitter_ratio)?,
            hitl_mode: word::<HitlMode>("hitl_mode", hitl_mode)?,
            hitl_budget_threshold: ratio("hitl_budget_threshold", hitl_budget_threshold)?,
            settlement: word::<SettlementMode>("settlement", settlement)?,
            nonce_window,
            max_reservations,
            max_held_calls,
            ..GuardConfig::default()
        };
        if audit_log.is_none() && audit_key.is_some() {
            return Err(PyValueError::new_err(
                "audit_key is given without audit_log",
            ));
        }
        // What the log records of the params (the daemon's `[audit] params`).
        let recorder = tollgate_audit::params::Recorder::from_setting(
            Some(audit_params),
            audit_redact.as_deref().unwrap_or(&[]),
        )
        .map_err(|e| {
            PyValueError::new_err(format!("{}: {e}", e.key("audit_params", "audit_redact")))
        })?;
        let mode = recorder.mode();
        if audit_log.is_none() && mode != tollgate_audit::ParamsMode::Hash {
            return Err(PyValueError::new_err(
                "audit_params is given without audit_log",
            ));
        }
        let who = AuditIdentity {
            session_id: session_id.to_owned(),
            agent_id: agent_id.to_owned(),
            organization_id: organization_id.to_owned(),
        };
        // Named from the start, so the policies' principal is the guard's ids with or
        // without an audit log.
        let mut guard = tollgate_client::Guard::new_as(config, who.clone()).with_params(recorder);
        let mut policy_warnings = Vec::new();
        let mut policy_settings = None;
        if let Some(p) = &policy {
            let settings = crate::policy::settings(p)?;
            let cwd = std::env::current_dir().map_err(|e| PyOSError::new_err(e.to_string()))?;
            policy_settings = Some((settings.clone(), cwd));
            let (set, warnings) = py.detach(|| crate::policy::load(&settings))?;
            policy_warnings = warnings;
            // Before the audit log: its session opening then names the set.
            guard = guard
                .with_policies(set)
                .map_err(|e| PyValueError::new_err(format!("policy: {e}")))?;
        }
        let Some(dir) = audit_log else {
            return Ok(PyGuard {
                inner: guard,
                audited: false,
                policy_warnings,
                policy_settings,
            });
        };
        let Some(key_path) = audit_key else {
            return Err(PyValueError::new_err(
                "audit_log needs audit_key: a signing key file (`tollgate keygen --out DIR` writes one)",
            ));
        };
        let inner = py.detach(move || -> Result<tollgate_client::Guard, String> {
            let text = std::fs::read_to_string(&key_path)
                .map_err(|e| format!("audit_key `{}`: {e}", key_path.display()))?;
            let key = tollgate_audit::keys::parse_secret_key(&text)
                .map_err(|e| format!("audit_key `{}`: {e}", key_path.display()))?;
            let (writer, _) =
                tollgate_audit::Writer::open(tollgate_audit::WriterConfig::new(&dir), key)
                    .map_err(|e| format!("audit_log `{}`: {e}", dir.display()))?;
            guard
                .with_audit(writer, who)
                .map_err(|e| format!("audit_log `{}`: {e}", dir.display()))
        });
        Ok(PyGuard {
            inner: inner.map_err(PyOSError::new_err)?,
            audited: true,
            policy_warnings,
            policy_settings,
        })
    }

    /// Decide whether `tool` may run with `params` (a JSON-like dict), and apply the
    /// verdict to the session. `nonce` re-dispatches a call with the nonce it was held
    /// with; leave it out otherwise (a fresh random one is drawn).
    #[pyo3(signature = (tool, params, estimated_cost_usd = 0.0, *, nonce = None))]
    fn check(
        &self,
        py: Python<'_>,
        tool: &str,
        params: Bound<'_, PyAny>,
        estimated_cost_usd: f64,
        nonce: Option<u64>,
    ) -> Verdict {
        let (value, cost) = call_inputs(&params, estimated_cost_usd);
        let checked = self.run_check(py, tool, &value, cost, nonce);
        self.verdict(checked, tool, params.unbind(), estimated_cost_usd)
    }

    /// Report a call's actual cost in dollars and, if it failed, its error message
    /// (scanned for error signals). `call` is the call's `Verdict` or its call number.
    /// Without `actual_cost_usd` the call is charged its estimate: the verdict's, or, for
    /// a bare call number, the reservation's (recorded as an unreadable cost).
    #[pyo3(signature = (call, actual_cost_usd = None, error = None))]
    fn settle(
        &self,
        py: Python<'_>,
        call: &Bound<'_, PyAny>,
        actual_cost_usd: Option<f64>,
        error: Option<String>,
    ) -> PyResult<Settlement> {
        let (call_number, cost) = settle_target(call, actual_cost_usd)?;
        let go = || self.inner.post_exec(call_number, cost, error.as_deref());
        let s = if self.audited { py.detach(go) } else { go() };
        Ok(Settlement {
            charged_usd: s.charged.to_usd(),
            budget_remaining_usd: s.remaining.to_usd(),
            cost_unreadable: s.cost_unreadable,
            audited: s.audited,
        })
    }

    /// Record a human's decision on the held call `held` (a `HITL` verdict from this
    /// guard) and act on it: `approve` re-dispatches the held call with its nonce,
    /// `modify` records the successor `params` and dispatches it, `reject` refuses it,
    /// `defer` and `escalate` leave it held. `note` (the human's words, at most 1024
    /// bytes) is audited with the decision and returned with it. Returns the final
    /// verdict with the params to run. Raises `ValueError` for an unknown decision,
    /// `modify` without params, or a decision the session cannot record (nothing held, or
    /// already decided).
    #[pyo3(signature = (held, decision, *, operator, params = None, note = ""))]
    fn resolve(
        &self,
        py: Python<'_>,
        held: &Bound<'_, Verdict>,
        decision: &str,
        operator: &str,
        params: Option<Bound<'_, PyAny>>,
        note: &str,
    ) -> PyResult<Released> {
        if note.len() > 1024 {
            return Err(PyValueError::new_err("note over 1024 bytes"));
        }
        let held = held.get();
        let word = HumanDecision::parse(decision);
        let (successor, successor_value) = match (&word, &params) {
            (HumanDecision::Modify, Some(p)) => {
                let value = convert::to_value(p).map_err(|e| {
                    PyValueError::new_err(format!("modify: the successor's params: {e}"))
                })?;
                let digest = Params::json(&value).canonical_digest().map_err(|e| {
                    PyValueError::new_err(format!("modify: the successor's params are {e}"))
                })?;
                let nonce = random_nonce();
                (
                    Some(Successor {
                        nonce,
                        args_digest: digest,
                    }),
                    Some((value, nonce)),
                )
            }
            (HumanDecision::Modify, None) => {
                return Err(PyValueError::new_err("modify needs the successor's params"))
            }
            (
                HumanDecision::Approve
                | HumanDecision::Reject
                | HumanDecision::Defer
                | HumanDecision::Escalate,
                _,
            ) => (None, None),
            _ => {
                return Err(PyValueError::new_err(format!(
                    "unknown decision `{decision}` (approve, reject, modify, defer, escalate)"
                )))
            }
        };
        let recorded = {
            // The held call by its own number: a session may hold several at once, each
            // decided on its own (docs/protocol.md, "Several held calls").
            let go = || {
                self.inner
                    .decide_human_call(
                        Some(held.call_number),
                        word.clone(),
                        successor,
                        operator,
                        note,
                    )
                    .map(|_| ())
            };
            if self.audited {
                py.detach(go)
            } else {
                go()
            }
        };
        recorded
            .map_err(|e| PyValueError::new_err(format!("the decision cannot be recorded: {e}")))?;
        let cost = Money::from_usd_non_negative(held.estimated_cost_usd).unwrap_or(Money::ZERO);
        let word_text = decision.trim().to_ascii_lowercase();
        let again = match (word, successor_value, params) {
            (HumanDecision::Approve, _, _) => {
                let original = held.params.bind(py);
                let (value, _) = call_inputs(original, held.estimated_cost_usd);
                let c = self.run_check(py, &held.tool, &value, cost, Some(held.nonce));
                self.verdict(
                    c,
                    &held.tool,
                    original.clone().unbind(),
                    held.estimated_cost_usd,
                )
            }
            (HumanDecision::Modify, Some((value, nonce)), Some(p)) => {
                let c = self.run_check(py, &held.tool, &value, cost, Some(nonce));
                self.verdict(c, &held.tool, p.unbind(), held.estimated_cost_usd)
            }
            (HumanDecision::Reject, _, _) => not_run(py, held, "DENY", "hitl_transition:reject"),
            _ => not_run(py, held, "HITL", &held.reason),
        };
        let allowed = again.verdict == "ALLOW";
        let run_params = allowed.then(|| again.params.clone_ref(py));
        Ok(Released {
            verdict: Py::new(py, again)?,
            params: run_params,
            decision: word_text,
            note: note.to_owned(),
        })
    }

    /// Whether `held` (a `HITL` verdict from this guard) is held now, waiting for a
    /// human's decision: False for a call **held behind** others (the session already held
    /// `max_held_calls`, so nothing was recorded for it and `resolve` refuses it), and for
    /// one already decided.
    fn is_waiting(&self, held: &Bound<'_, Verdict>) -> bool {
        let held = held.get();
        held.verdict == "HITL"
            && self
                .inner
                .state()
                .transition_of_call(held.call_number)
                .is_some_and(tollgate_core::transition::is_undecided)
    }

    /// The budget left now, in dollars.
    #[getter]
    fn budget_remaining_usd(&self) -> f64 {
        self.inner.state().budget_remaining.to_usd()
    }

    /// Whether the circuit is tripped (every later call is denied `circuit_open`).
    #[getter]
    fn circuit_tripped(&self) -> bool {
        self.inner.state().circuit_tripped
    }

    /// The number of calls decided in this session.
    #[getter]
    fn calls(&self) -> u64 {
        self.inner.session().last_call_number
    }

    /// The policy set in force (`policy=`): a dict with `digest` (its SHA-256, as
    /// `tollgate policy check` prints it), `policies` (how many), `default` (`allow` or
    /// `deny`), `trip_on_refusal`, `mode` (`enforce`, or `shadow` for a set that
    /// enforces nothing), `shadow_policies` (how many run in shadow), `warnings` (the
    /// loader's, one line each); `None` without one.
    #[getter]
    fn policy<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        let Some(set) = self.inner.policies() else {
            return Ok(None);
        };
        let d = pyo3::types::PyDict::new(py);
        d.set_item("digest", set.policies.digest().to_string())?;
        d.set_item("policies", set.policies.len())?;
        d.set_item("default", set.policies.default_effect().as_str())?;
        d.set_item("trip_on_refusal", set.trip_on_refusal)?;
        let mode = if set.policies.is_shadow_set() {
            "shadow"
        } else {
            "enforce"
        };
        d.set_item("mode", mode)?;
        d.set_item("shadow_policies", set.policies.shadow_len())?;
        d.set_item("warnings", &self.policy_warnings)?;
        Ok(Some(d))
    }

    /// This guard's settings as a `tollgate serve` configuration (TOML text): its guard as
    /// `[guard.default]`, every key written, and its policy set's `[policy]` (absolute
    /// paths). Write it to a file and replay the guard's audit log under exactly the
    /// settings that wrote it: `tollgate policy replay --config FILE --key audit.pub LOG`;
    /// edit it (or add `--policy new.cedar`) to ask what a change would have done.
    /// Raises `ValueError` for a policy path that is not UTF-8.
    fn replay_config(&self) -> PyResult<String> {
        let config = self.inner.session().policy.config.clone();
        let (settings, base) = match &self.policy_settings {
            Some((s, base)) => (Some(s), base.as_path()),
            // Without a set no path is resolved.
            None => (None, std::path::Path::new("")),
        };
        tollgate_client::candidate::candidate_toml(&config, settings, base)
            .map_err(PyValueError::new_err)
    }
}

/// The call number and the cost to report for `settle(call, actual_cost_usd)`: `call` is
/// a `Verdict` (whose estimate stands in for a missing cost) or an int. NaN stands for
/// "no cost reported": the core charges the reservation's estimate.
pub(crate) fn settle_target(call: &Bound<'_, PyAny>, actual: Option<f64>) -> PyResult<(u64, f64)> {
    if let Ok(v) = call.cast::<Verdict>() {
        let v = v.get();
        return Ok((v.call_number, actual.unwrap_or(v.estimated_cost_usd)));
    }
    let n = call.extract::<u64>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err("settle: pass the call's Verdict or its call number")
    })?;
    Ok((n, actual.unwrap_or(f64::NAN)))
}

/// The answer for a held call that is not re-dispatched.
fn not_run(py: Python<'_>, held: &Verdict, verdict: &'static str, reason: &str) -> Verdict {
    Verdict {
        verdict,
        reason: reason.to_owned(),
        // Still held: why it was held; refused by a human: nothing more to say.
        explanation: if verdict == "HITL" {
            held.explanation.clone()
        } else {
            String::new()
        },
        deny_reason: None,
        budget_remaining_usd: held.budget_remaining_usd,
        call_number: held.call_number,
        nonce: held.nonce,
        tool: held.tool.clone(),
        params: held.params.clone_ref(py),
        estimated_cost_usd: held.estimated_cost_usd,
        repeat_count: None,
        audit_entry_id: None,
        error: None,
        probabilistic: false,
    }
}

/// A random non-zero nonce (a successor's, for a modify in library mode). Without
/// system randomness it is 1, which a later use refuses as a replay: failing closed.
fn random_nonce() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b).max(1)
}
