//! Daemon mode: `tollgate._native.Client` over [`tollgate_client::DaemonClient`], on the
//! daemon's Unix socket or its gRPC binding with mutual TLS, and `tollgate._native.Operator`
//! for operators' HITL decisions, on the socket only (the gRPC binding serves agents, not
//! operators: docs/protocol.md §8.5).
//!
//! Every blocking call releases the GIL while it waits; every `a...` method returns an
//! awaitable ([`crate::pending::Pending`]) that completes on the asyncio loop without
//! occupying it or a thread: the request runs on this module's tokio runtime, whose
//! threads never attach to the interpreter.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tollgate_client::{
    ClientConfig, ClientError, ClientVerdict, DaemonClient, GrpcConfig, HumanWait, ShareParams,
};
use tollgate_core::json;
use tollgate_proto::sp1;

use crate::convert;
use crate::guard::{call_inputs, settle_target};
use crate::objects::{Released, Verdict};
use crate::pending::{self, Pending};
use crate::ConnectError;

fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// Run `fut` on the runtime, with the GIL released until it completes.
fn block_on<F>(py: Python<'_>, fut: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    py.detach(|| runtime().block_on(fut))
}

fn connect_error(e: &ClientError) -> PyErr {
    ConnectError::new_err((e.reason(), e.to_string()))
}

fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        PyValueError::new_err(format!(
            "{what}: `{s}` is not a non-negative number of seconds"
        ))
    })
}

/// The inputs of one call, read from Python while attached.
struct CallArgs {
    tool: String,
    value: json::Value,
    cost: f64,
    params: Py<PyAny>,
}

impl CallArgs {
    fn read(tool: &str, params: Bound<'_, PyAny>, estimated_cost_usd: f64) -> CallArgs {
        let (value, _) = call_inputs(&params, estimated_cost_usd);
        CallArgs {
            tool: tool.to_owned(),
            value,
            // A bad cost goes to the daemon as sent: it denies it as malformed input.
            cost: estimated_cost_usd,
            params: params.unbind(),
        }
    }
}

fn to_verdict(v: ClientVerdict, args: CallArgs, nonce: u64) -> Verdict {
    let r = v.response.as_ref();
    Verdict {
        verdict: v.verdict.as_str(),
        deny_reason: r
            .filter(|_| v.verdict == tollgate_core::Verdict::Deny)
            .and_then(|r| sp1::DenyReason::try_from(r.deny_reason).ok())
            .filter(|d| *d != sp1::DenyReason::Unspecified)
            .map(|d| d.as_str_name().to_owned()),
        #[allow(clippy::cast_precision_loss)]
        budget_remaining_usd: r.map(|r| r.budget_remaining_nanos as f64 / 1e9),
        call_number: v.call_number,
        nonce,
        tool: args.tool,
        params: args.params,
        estimated_cost_usd: args.cost,
        repeat_count: r.map(|r| r.repeat_count),
        audit_entry_id: r.map(|r| r.audit_entry_id.clone()),
        error: v.error.as_ref().map(ToString::to_string),
        probabilistic: r.is_some_and(|r| r.probabilistic_deny),
        explanation: r
            .map(|r| r.human_readable_reason.clone())
            .unwrap_or_default(),
        reason: v.reason,
    }
}

async fn check(client: Arc<DaemonClient>, args: CallArgs) -> Verdict {
    let req = client.prepare(&args.tool, &args.value, args.cost);
    let nonce = req.nonce;
    let v = client.pre_exec_request(req).await;
    to_verdict(v, args, nonce)
}

/// A held call's outcome, before it becomes a Python `Released` (which needs the GIL).
struct ReleasedOut {
    verdict: Verdict,
    /// The successor's params after a modify.
    successor: Option<json::Value>,
    decision: String,
    note: String,
}

impl<'py> IntoPyObject<'py> for ReleasedOut {
    type Target = Released;
    type Output = Bound<'py, Released>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, Released>> {
        let allowed = self.verdict.verdict == "ALLOW";
        // The params to run: the successor's after a modify, else the caller's own object.
        let params = match (allowed, &self.successor) {
            (false, _) => None,
            (true, Some(v)) => Some(convert::to_py(py, v)?.unbind()),
            (true, None) => Some(self.verdict.params.clone_ref(py)),
        };
        Bound::new(
            py,
            Released {
                verdict: Py::new(py, self.verdict)?,
                params,
                decision: self.decision,
                note: self.note,
            },
        )
    }
}

async fn check_or_wait(client: Arc<DaemonClient>, args: CallArgs, wait: HumanWait) -> ReleasedOut {
    let r = client
        .pre_exec_or_wait(&args.tool, &args.value, args.cost, wait)
        .await;
    let successor = r.params.filter(|_| r.decision == "modify");
    ReleasedOut {
        verdict: to_verdict(r.verdict, args, 0),
        successor,
        decision: r.decision,
        note: r.note,
    }
}

/// A registered session with `tollgate serve`, over its socket or over gRPC. Fails
/// closed: when the daemon cannot be reached, does not answer in time, answers with a
/// bad MAC, fails the TLS handshake or answers with something unreadable, the verdict is
/// DENY with a reason starting `fail_closed:`. Heartbeats run
/// in the background until `close()`. Safe to share between threads and tasks.
#[pyclass(frozen, subclass, module = "tollgate._native", name = "Client")]
#[derive(Debug)]
pub struct PyClient {
    client: Arc<DaemonClient>,
    heartbeats: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for PyClient {
    fn drop(&mut self) {
        if let Some(h) = &self.heartbeats {
            h.abort();
        }
    }
}

/// The keyword arguments of `Client(...)` that choose how it reaches the daemon, as given.
struct TransportArgs {
    socket: Option<PathBuf>,
    secret: Option<Vec<u8>>,
    grpc: Option<String>,
    server_name: Option<String>,
    ca_pem: Option<Vec<u8>>,
    cert_pem: Option<Vec<u8>>,
    key_pem: Option<Vec<u8>>,
}

/// How a `Client` reaches the daemon: one binding, with everything it needs.
enum Transport {
    /// The Unix socket: every message carries an HMAC under the organization's agents'
    /// secret (docs/protocol.md §3).
    Socket { path: PathBuf, secret: Vec<u8> },
    /// gRPC with mutual TLS: the client certificate names the organization; there is no
    /// secret (docs/protocol.md §8).
    Grpc(GrpcConfig),
}

/// The host part of `host:port` (`[v6]:port` too): the name the daemon's certificate
/// is checked against unless one is given.
fn host_of(address: &str) -> &str {
    if let Some((v6, _)) = address.strip_prefix('[').and_then(|a| a.split_once(']')) {
        return v6;
    }
    address.rsplit_once(':').map_or(address, |(host, _)| host)
}

impl Transport {
    /// Exactly one of `socket` (with `secret`) and `grpc` (with `ca_pem`, and `cert_pem`
    /// with `key_pem`); each binding's arguments only with it. `ValueError` otherwise.
    fn read(a: TransportArgs) -> PyResult<Transport> {
        let tls_given = [
            a.server_name.is_some(),
            a.ca_pem.is_some(),
            a.cert_pem.is_some(),
            a.key_pem.is_some(),
        ];
        match (a.socket, a.grpc) {
            (Some(path), None) => {
                if tls_given.contains(&true) {
                    return Err(PyValueError::new_err(
                        "`server_name`, `ca_pem`, `cert_pem` and `key_pem` are for `grpc`, not `socket`",
                    ));
                }
                let secret = a.secret.ok_or_else(|| {
                    PyValueError::new_err(
                        "`socket` needs `secret`: the organization's agents' secret",
                    )
                })?;
                Ok(Transport::Socket { path, secret })
            }
            (None, Some(address)) => {
                if a.secret.is_some() {
                    return Err(PyValueError::new_err(
                        "`secret` is not used over `grpc`: the client certificate authenticates the agent",
                    ));
                }
                let ca_pem = a.ca_pem.ok_or_else(|| {
                    PyValueError::new_err(
                        "`grpc` needs `ca_pem`: the CA certificate that issued the daemon's certificate",
                    )
                })?;
                let identity = match (a.cert_pem, a.key_pem) {
                    (Some(cert), Some(key)) => Some((cert, key)),
                    (None, None) => None,
                    _ => {
                        return Err(PyValueError::new_err(
                            "give both `cert_pem` and `key_pem`: the client certificate and its private key",
                        ))
                    }
                };
                let server_name = a
                    .server_name
                    .unwrap_or_else(|| host_of(&address).to_owned());
                Ok(Transport::Grpc(GrpcConfig {
                    address,
                    server_name,
                    ca_pem,
                    identity,
                }))
            }
            _ => Err(PyValueError::new_err(
                "give exactly one of `socket` and `grpc`",
            )),
        }
    }

    /// The client's configuration. The organization defaults to `default` on the socket
    /// and, over gRPC, to the one the client certificate names (an empty id).
    fn config(self, organization: Option<&str>, agent_id: &str) -> ClientConfig {
        match self {
            Transport::Socket { path, secret } => {
                ClientConfig::new(path, organization.unwrap_or("default"), &secret, agent_id)
            }
            Transport::Grpc(g) => ClientConfig::grpc(g, organization.unwrap_or(""), agent_id),
        }
    }
}

fn wait_of(timeout: f64, share_params: bool) -> PyResult<HumanWait> {
    Ok(HumanWait {
        timeout: seconds("timeout", timeout)?,
        share_params: if share_params {
            ShareParams::All
        } else {
            ShareParams::Never
        },
    })
}

#[pymethods]
impl PyClient {
    /// Connect to the daemon and register a session (or resume `session_id`): over its
    /// Unix socket (`socket`, with the organization's agents' `secret`), or over gRPC
    /// with mutual TLS (`grpc`, the daemon's `host:port`, with the CA certificate
    /// `ca_pem` and this agent's `cert_pem` and `key_pem`, PEM bytes). Raises
    /// `ValueError` for a bad combination and `ConnectError` (with `.reason`, a
    /// `fail_closed:` string) when connecting fails.
    #[new]
    #[pyo3(signature = (
        *,
        agent_id,
        socket = None,
        secret = None,
        grpc = None,
        server_name = None,
        ca_pem = None,
        cert_pem = None,
        key_pem = None,
        organization = None,
        framework = "python",
        agent_version = "",
        timeout = 2.0,
        heartbeat_interval = 30.0,
        session_id = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        agent_id: &str,
        socket: Option<PathBuf>,
        secret: Option<Vec<u8>>,
        grpc: Option<String>,
        server_name: Option<String>,
        ca_pem: Option<Vec<u8>>,
        cert_pem: Option<Vec<u8>>,
        key_pem: Option<Vec<u8>>,
        organization: Option<String>,
        framework: &str,
        agent_version: &str,
        timeout: f64,
        heartbeat_interval: f64,
        session_id: Option<String>,
    ) -> PyResult<Self> {
        crate::check_id("agent_id", agent_id)?;
        if let Some(org) = &organization {
            crate::check_id("organization", org)?;
        }
        if let Some(id) = &session_id {
            crate::check_id("session_id", id)?;
        }
        let transport = Transport::read(TransportArgs {
            socket,
            secret,
            grpc,
            server_name,
            ca_pem,
            cert_pem,
            key_pem,
        })?;
        let mut config = transport.config(organization.as_deref(), agent_id);
        config.framework = framework.to_owned();
        if !agent_version.is_empty() {
            config.agent_version = agent_version.to_owned();
        }
        config.timeout = seconds("timeout", timeout)?;
        let interval = seconds("heartbeat_interval", heartbeat_interval)?;
        let client = block_on(py, async move {
            match session_id {
                Some(id) => DaemonClient::resume(config, &id).await,
                None => DaemonClient::connect(config).await,
            }
        })
        .map_err(|e| connect_error(&e))?;
        let client = Arc::new(client);
        let heartbeats = (!interval.is_zero()).then(|| {
            let _in_runtime = runtime().enter();
            client.spawn_heartbeats(interval)
        });
        Ok(PyClient { client, heartbeats })
    }

    /// The session id the daemon gave (or resumed).
    #[getter]
    fn session_id(&self) -> String {
        self.client.session_id().to_owned()
    }

    /// The budget the session started with, as the daemon reported at registration.
    #[getter]
    fn budget_usd(&self) -> Option<f64> {
        #[allow(clippy::cast_precision_loss)]
        self.client
            .registration()
            .active_config
            .as_ref()
            .map(|c| c.budget_nanos as f64 / 1e9)
    }

    /// Ask the daemon whether `tool` may run with `params`. Never raises for the daemon's
    /// failures: they are a DENY `fail_closed:...`.
    #[pyo3(signature = (tool, params, estimated_cost_usd = 0.0))]
    fn check(
        &self,
        py: Python<'_>,
        tool: &str,
        params: Bound<'_, PyAny>,
        estimated_cost_usd: f64,
    ) -> Verdict {
        let args = CallArgs::read(tool, params, estimated_cost_usd);
        block_on(py, check(self.client.clone(), args))
    }

    /// `check`, as an awaitable that does not block the event loop.
    #[pyo3(signature = (tool, params, estimated_cost_usd = 0.0))]
    fn acheck<'py>(
        &self,
        tool: &str,
        params: Bound<'py, PyAny>,
        estimated_cost_usd: f64,
    ) -> PyResult<Pending> {
        let args = CallArgs::read(tool, params, estimated_cost_usd);
        let client = self.client.clone();
        pending::spawn(runtime(), async move { check(client, args).await })
    }

    /// Decide, and if the call is held for a human, show operators its params (unless
    /// `share_params` is false), wait at most `timeout` seconds for their decision, and
    /// re-dispatch what they released (`approve`: the same call; `modify`: the edited
    /// params). Returns a `Released`; never raises for the daemon's failures.
    #[pyo3(signature = (tool, params, estimated_cost_usd = 0.0, *, timeout = 900.0, share_params = true))]
    fn check_or_wait(
        &self,
        py: Python<'_>,
        tool: &str,
        params: Bound<'_, PyAny>,
        estimated_cost_usd: f64,
        timeout: f64,
        share_params: bool,
    ) -> PyResult<ReleasedOut> {
        let wait = wait_of(timeout, share_params)?;
        let args = CallArgs::read(tool, params, estimated_cost_usd);
        Ok(block_on(py, check_or_wait(self.client.clone(), args, wait)))
    }

    /// `check_or_wait`, as an awaitable that does not block the event loop while the
    /// human decides.
    #[pyo3(signature = (tool, params, estimated_cost_usd = 0.0, *, timeout = 900.0, share_params = true))]
    fn acheck_or_wait<'py>(
        &self,
        tool: &str,
        params: Bound<'py, PyAny>,
        estimated_cost_usd: f64,
        timeout: f64,
        share_params: bool,
    ) -> PyResult<Pending> {
        let wait = wait_of(timeout, share_params)?;
        let args = CallArgs::read(tool, params, estimated_cost_usd);
        let client = self.client.clone();
        pending::spawn(
            runtime(),
            async move { check_or_wait(client, args, wait).await },
        )
    }

    /// Report a call's outcome (fire and forget): `call` is its `Verdict` or call number;
    /// without `actual_cost_usd`, a `Verdict`'s estimate is reported (for a bare call
    /// number, NaN: the daemon charges the estimate it reserved). Returns False when the
    /// report could not be sent (the daemon is unreachable).
    #[pyo3(signature = (call, actual_cost_usd = None, error = None))]
    fn settle(
        &self,
        py: Python<'_>,
        call: &Bound<'_, PyAny>,
        actual_cost_usd: Option<f64>,
        error: Option<String>,
    ) -> PyResult<bool> {
        let (n, cost) = settle_target(call, actual_cost_usd)?;
        let client = self.client.clone();
        Ok(block_on(py, async move {
            client
                .post_exec(n, cost, error.is_none(), error.as_deref().unwrap_or(""))
                .await
                .is_ok()
        }))
    }

    /// `settle`, as an awaitable.
    #[pyo3(signature = (call, actual_cost_usd = None, error = None))]
    fn asettle<'py>(
        &self,
        call: &Bound<'py, PyAny>,
        actual_cost_usd: Option<f64>,
        error: Option<String>,
    ) -> PyResult<Pending> {
        let (n, cost) = settle_target(call, actual_cost_usd)?;
        let client = self.client.clone();
        pending::spawn(runtime(), async move {
            client
                .post_exec(n, cost, error.is_none(), error.as_deref().unwrap_or(""))
                .await
                .is_ok()
        })
    }

    /// Send a heartbeat now (they also run in the background). Returns the daemon's
    /// authoritative remaining budget in dollars; raises `ConnectError` on failure.
    fn heartbeat(&self, py: Python<'_>) -> PyResult<f64> {
        let client = self.client.clone();
        block_on(py, async move { client.heartbeat(0.0).await })
            .map(|a| a.daemon_budget_remaining)
            .map_err(|e| connect_error(&e))
    }

    /// Wait at most `timeout` seconds for a human's decision on held call `call_number`.
    /// Returns a dict: `outcome` (`approve`, `modify`, `reject`, `expire`, `pending`,
    /// `none`), `successor_params` (after a modify with edited arguments, else None),
    /// `note` (the deciding human's note, or `""`).
    #[pyo3(signature = (call_number, timeout = 60.0))]
    fn await_decision<'py>(
        &self,
        py: Python<'py>,
        call_number: u64,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let t = seconds("timeout", timeout)?;
        let client = self.client.clone();
        let r = block_on(
            py,
            async move { client.await_decision(call_number, t).await },
        )
        .map_err(|e| connect_error(&e))?;
        let d = PyDict::new(py);
        d.set_item("outcome", &r.outcome)?;
        let successor = match json::parse_str(&r.successor_params_json) {
            Ok(v) if !r.successor_params_json.is_empty() => Some(convert::to_py(py, &v)?),
            _ => None,
        };
        d.set_item("successor_params", successor)?;
        d.set_item("note", &r.note)?;
        Ok(d)
    }

    /// The daemon's view of this session: a dict with `status`, `budget_remaining_usd`,
    /// `total_calls`, `circuit_tripped`, `circuit_trip_reason`, `last_call_number`.
    fn session_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let client = self.client.clone();
        let s = block_on(py, async move { client.session_state().await })
            .map_err(|e| connect_error(&e))?;
        state_dict(py, &s)
    }

    /// End the session at the daemon (`CloseSession`): audited as closed, nothing more is
    /// decided on it (every later check is a DENY) and it cannot be resumed; its place in
    /// the organization's session quota is freed. Stops the background heartbeats. Returns
    /// a dict: `session_id`, `audit_entry_id`, `budget_remaining_usd`. Raises
    /// `ConnectError` when the daemon refuses or cannot be reached.
    fn close_session<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let client = self.client.clone();
        let r = block_on(py, async move { client.close().await }).map_err(|e| connect_error(&e))?;
        if let Some(h) = &self.heartbeats {
            h.abort();
        }
        let d = PyDict::new(py);
        d.set_item("session_id", &r.session_id)?;
        d.set_item("audit_entry_id", &r.audit_entry_id)?;
        d.set_item(
            "budget_remaining_usd",
            tollgate_core::Money(r.budget_remaining_nanos).to_usd(),
        )?;
        Ok(d)
    }

    /// Stop the background heartbeats. The connection closes when the object is dropped.
    /// The session stays open at the daemon (resumable) until it is idle past the daemon's
    /// `session_idle_timeout_secs`; `close_session()` ends it now.
    fn close(&self) {
        if let Some(h) = &self.heartbeats {
            h.abort();
        }
    }
}

fn state_dict<'py>(py: Python<'py>, s: &sp1::SessionState) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("session_id", &s.session_id)?;
    d.set_item(
        "status",
        sp1::SessionStatus::try_from(s.status)
            .map(|x| x.as_str_name().to_ascii_lowercase())
            .unwrap_or_default(),
    )?;
    #[allow(clippy::cast_precision_loss)]
    d.set_item(
        "budget_remaining_usd",
        s.budget_remaining_nanos as f64 / 1e9,
    )?;
    d.set_item("total_calls", s.total_calls)?;
    d.set_item("circuit_tripped", s.circuit_tripped)?;
    d.set_item("circuit_trip_reason", &s.circuit_trip_reason)?;
    d.set_item("last_call_number", s.last_call_number)?;
    Ok(d)
}

/// An operator's connection: lists held calls and records human decisions. Needs the
/// organization's **operator** secret (agents' secrets cannot decide), and the socket:
/// the gRPC binding does not serve operators' requests.
#[pyclass(frozen, module = "tollgate._native", name = "Operator")]
#[derive(Debug)]
pub struct PyOperator {
    client: Arc<DaemonClient>,
}

#[pymethods]
impl PyOperator {
    /// Connect as an operator of `organization`.
    #[new]
    #[pyo3(signature = (*, socket, secret, organization = "default", timeout = 2.0))]
    fn new(
        py: Python<'_>,
        socket: PathBuf,
        secret: Vec<u8>,
        organization: &str,
        timeout: f64,
    ) -> PyResult<Self> {
        let mut config = ClientConfig::new(socket, organization, &secret, "operator");
        config.timeout = seconds("timeout", timeout)?;
        let client = block_on(py, DaemonClient::operator(config)).map_err(|e| connect_error(&e))?;
        Ok(PyOperator {
            client: Arc::new(client),
        })
    }

    /// The held calls of the organization: a list of dicts with `session_id`,
    /// `agent_id`, `tool`, `call_number`, `held_reason` (`hitl_all_calls`,
    /// `policy_hold`, ...), `held_explanation` (why, in words), `decision`, `params` (the
    /// held call's params when its agent sent them, else None).
    fn pending<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let client = self.client.clone();
        let list =
            block_on(py, async move { client.hitl_list().await }).map_err(|e| connect_error(&e))?;
        list.iter()
            .map(|p| {
                let d = PyDict::new(py);
                d.set_item("session_id", &p.session_id)?;
                d.set_item("agent_id", &p.agent_id)?;
                let t = p.transition.clone().unwrap_or_default();
                d.set_item("tool", &t.tool_name)?;
                d.set_item("call_number", t.call_number)?;
                d.set_item("held_reason", &t.held_reason)?;
                d.set_item("held_explanation", &p.held_explanation)?;
                d.set_item("decision", &t.decision)?;
                let params = match json::parse_str(&p.params_json) {
                    Ok(v) if p.params_known => Some(convert::to_py(py, &v)?),
                    _ => None,
                };
                d.set_item("params", params)?;
                Ok(d)
            })
            .collect()
    }

    /// Record a decision (`approve`, `reject`, `modify`, `defer`, `escalate`) on
    /// `session_id`'s held call `call_number` (its `pending()` entry's; `None`: the
    /// session's one undecided held call, refused when several wait), as `operator`, with
    /// an optional `note` (at most 1024 bytes; the agent gets it with the decision);
    /// `modify` takes the successor's `params`. Raises `ConnectError` when the daemon
    /// refuses.
    #[pyo3(signature = (session_id, decision, *, operator, note = "", params = None, call_number = None))]
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &self,
        py: Python<'_>,
        session_id: &str,
        decision: &str,
        operator: &str,
        note: &str,
        params: Option<Bound<'_, PyAny>>,
        call_number: Option<u64>,
    ) -> PyResult<()> {
        if call_number == Some(0) {
            return Err(PyValueError::new_err(
                "call_number: a held call's number is at least 1 (None: the session's one held call)",
            ));
        }
        let successor_params_json = match params {
            None => String::new(),
            Some(p) => {
                let v = convert::to_value(&p)
                    .map_err(|e| PyValueError::new_err(format!("the successor's params: {e}")))?;
                json::to_canonical_vec(&v)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| {
                        PyValueError::new_err("the successor's params are not canonicalizable")
                    })?
            }
        };
        let req = sp1::HitlDecideRequest {
            session_id: session_id.to_owned(),
            decision: decision.to_owned(),
            operator_id: operator.to_owned(),
            note: note.to_owned(),
            successor_params_json,
            call_number: call_number.unwrap_or(0),
            ..sp1::HitlDecideRequest::default()
        };
        let client = self.client.clone();
        block_on(py, async move { client.hitl_decide(req).await })
            .map(|_| ())
            .map_err(|e| connect_error(&e))
    }
}
