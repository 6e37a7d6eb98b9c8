//! The result objects: `Verdict`, `Released`, `Settlement`, `VectorOutcome`.

use pyo3::prelude::*;

/// One answer to "may this tool run now?". Anything but `ALLOW` means: do not run it.
#[pyclass(frozen, module = "tollgate._native", name = "Verdict")]
#[derive(Debug)]
pub struct Verdict {
    /// `"ALLOW"`, `"DENY"` or `"HITL"`.
    #[pyo3(get)]
    pub verdict: &'static str,
    /// The stable reason (`within_thresholds`, `max_repeat_exceeded`, ...; in daemon mode
    /// `fail_closed:...` when the daemon gave no usable answer).
    #[pyo3(get)]
    pub reason: String,
    /// The verdict in words, for a person or a model: the daemon's explanation
    /// (`human_readable_reason`); for a policy's verdict, the policy's (a `@hitl`
    /// policy's text, or which `forbid` refused it). `""` when there is none (a
    /// fail-closed DENY, which the daemon did not decide; library mode without policies).
    #[pyo3(get)]
    pub explanation: String,
    /// The coarse SP/1.0 deny reason of a DENY, by its wire name (`BUDGET_EXHAUSTED`,
    /// `MAX_REPEAT_EXCEEDED`, `CIRCUIT_OPEN`, ...), else `None` (and `None` for a
    /// fail-closed DENY, which the daemon did not decide).
    #[pyo3(get)]
    pub deny_reason: Option<String>,
    /// The budget left after this call's reservation, in dollars (`None` when the daemon
    /// gave no answer).
    #[pyo3(get)]
    pub budget_remaining_usd: Option<f64>,
    /// This call's number in its session (pass it to `settle`).
    #[pyo3(get)]
    pub call_number: u64,
    /// The nonce the call was dispatched with.
    #[pyo3(get)]
    pub nonce: u64,
    /// The tool's name, as asked.
    #[pyo3(get)]
    pub tool: String,
    /// The params, as given (the same object).
    #[pyo3(get)]
    pub params: Py<PyAny>,
    /// The estimated cost, as given.
    #[pyo3(get)]
    pub estimated_cost_usd: f64,
    /// Daemon mode: the run of identical calls this call extends, as the rule saw it.
    #[pyo3(get)]
    pub repeat_count: Option<i32>,
    /// Daemon mode: the audit entry that records this verdict.
    #[pyo3(get)]
    pub audit_entry_id: Option<String>,
    /// Daemon mode: why the client failed closed, when it did.
    #[pyo3(get)]
    pub error: Option<String>,
    /// Whether a DENY came from the probabilistic layer.
    #[pyo3(get)]
    pub probabilistic: bool,
}

#[pymethods]
impl Verdict {
    /// Whether the tool may run: true only for `ALLOW`.
    #[getter]
    fn allowed(&self) -> bool {
        self.verdict == "ALLOW"
    }

    /// Whether the call is held for a human (`HITL`).
    #[getter]
    fn held(&self) -> bool {
        self.verdict == "HITL"
    }

    fn __bool__(&self) -> bool {
        self.allowed()
    }

    fn __repr__(&self) -> String {
        let budget = self
            .budget_remaining_usd
            .map_or_else(|| "None".to_owned(), |b| format!("{b}"));
        format!(
            "Verdict(verdict={:?}, reason={:?}, tool={:?}, call_number={}, budget_remaining_usd={budget})",
            self.verdict, self.reason, self.tool, self.call_number
        )
    }
}

/// The outcome of a held call once a human had their say: the final verdict, and the
/// params to run the tool with (a human who modified the call changed them).
#[pyclass(frozen, module = "tollgate._native", name = "Released")]
#[derive(Debug)]
pub struct Released {
    /// The final verdict: `ALLOW` only if the call (or its successor) was released.
    #[pyo3(get)]
    pub verdict: Py<Verdict>,
    /// The params to run the tool with when allowed (the original object, or the
    /// successor's params after `modify`); `None` when not allowed.
    #[pyo3(get)]
    pub params: Option<Py<PyAny>>,
    /// The human's decision (`approve`, `modify`, `reject`, `expire`, `defer`,
    /// `escalate`), or `""` when no human was asked.
    #[pyo3(get)]
    pub decision: String,
    /// The deciding human's note (their reasons, for the model; a reject's above all), or
    /// `""`.
    #[pyo3(get)]
    pub note: String,
}

#[pymethods]
impl Released {
    /// Whether the tool may run (with `params`).
    #[getter]
    fn allowed(&self) -> bool {
        self.verdict.get().verdict == "ALLOW"
    }

    /// The final verdict's reason.
    #[getter]
    fn reason(&self) -> String {
        self.verdict.get().reason.clone()
    }

    fn __bool__(&self) -> bool {
        self.allowed()
    }

    fn __repr__(&self) -> String {
        let v = self.verdict.get();
        format!(
            "Released(verdict={:?}, reason={:?}, decision={:?})",
            v.verdict, v.reason, self.decision
        )
    }
}

/// What settling a call's reported cost did (library mode).
#[pyclass(frozen, module = "tollgate._native", name = "Settlement")]
#[derive(Debug)]
pub struct Settlement {
    /// What the call was charged, in dollars.
    #[pyo3(get)]
    pub charged_usd: f64,
    /// The budget left after the settlement, in dollars.
    #[pyo3(get)]
    pub budget_remaining_usd: f64,
    /// Whether the reported cost was unreadable (NaN, infinite or negative) and the call
    /// was charged its estimate.
    #[pyo3(get)]
    pub cost_unreadable: bool,
    /// Whether the settlement is in the audit log (always true without one).
    #[pyo3(get)]
    pub audited: bool,
}

#[pymethods]
impl Settlement {
    fn __repr__(&self) -> String {
        format!(
            "Settlement(charged_usd={}, budget_remaining_usd={}, cost_unreadable={}, audited={})",
            self.charged_usd,
            self.budget_remaining_usd,
            py_bool(self.cost_unreadable),
            py_bool(self.audited)
        )
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// One conformance vector's result.
#[pyclass(frozen, module = "tollgate._native", name = "VectorOutcome")]
#[derive(Debug)]
pub struct VectorOutcome {
    /// The vector's name (or `#index`).
    #[pyo3(get)]
    pub name: String,
    /// Whether it passed: hashes check, verdict and reason as expected.
    #[pyo3(get)]
    pub passed: bool,
    /// The verdict `decide` returned, if the vector could be run.
    #[pyo3(get)]
    pub verdict: Option<String>,
    /// The reason `decide` returned, if the vector could be run.
    #[pyo3(get)]
    pub reason: Option<String>,
    /// The expected verdict, as written.
    #[pyo3(get)]
    pub expected_verdict: Option<String>,
    /// The expected reason, as written.
    #[pyo3(get)]
    pub expected_reason: Option<String>,
    /// Everything wrong; empty when it passed.
    #[pyo3(get)]
    pub problems: Vec<String>,
}

#[pymethods]
impl VectorOutcome {
    fn __repr__(&self) -> String {
        if self.passed {
            format!("PASS {}", self.name)
        } else {
            format!("FAIL {}: {}", self.name, self.problems.join("; "))
        }
    }
}

impl From<tollgate_core::vectors::Outcome> for VectorOutcome {
    fn from(o: tollgate_core::vectors::Outcome) -> Self {
        let (expected_verdict, expected_reason) = o.expected.clone().unzip();
        VectorOutcome {
            passed: o.passed(),
            verdict: o.got.map(|d| d.verdict.as_str().to_owned()),
            reason: o.got.map(|d| d.reason.as_str().to_owned()),
            expected_verdict,
            expected_reason,
            problems: o.problems,
            name: o.name,
        }
    }
}
