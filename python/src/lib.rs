//! # tollgate-python: the `tollgate._native` extension module
//!
//! PyO3 bindings over the Rust crates, so that Python agents get the same semantics as
//! Rust ones, not a port: canonical JSON and params hashing (`tollgate_core::json`,
//! `Params::json`), conformance vectors (`tollgate_core::vectors`), the in-process guard
//! (`tollgate_client::Guard`) and the daemon client (`tollgate_client::DaemonClient`).
//!
//! What it does **not** do: decide anything itself, or run tools. The pure-Python package
//! around it (`python/tollgate/`) adds the `@guard.tool` decorator, the exceptions and
//! the framework adapters.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod convert;
mod daemon;
mod guard;
mod objects;
mod pending;
mod policy;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tollgate_core::json;

create_exception!(
    _native,
    TollgateError,
    PyException,
    "The base of every error Tollgate raises."
);
create_exception!(
    _native,
    ConnectError,
    TollgateError,
    "The daemon could not be reached or refused the request. `args[0]` is the fail-closed \
     reason (`fail_closed:daemon_unreachable`, `fail_closed:timeout`, ...), `args[1]` the detail."
);

create_exception!(
    _native,
    PolicyError,
    TollgateError,
    "A policy set (`Guard(policy=...)`) that does not load: the message lists every finding, \
     `file:line:column: error[code]: message` then a help line, as `tollgate policy check` \
     prints them."
);

/// An id argument (agent, organization, session), checked with the one rule the daemon
/// uses (`tollgate_core::check_id`): `ValueError` naming the argument.
pub(crate) fn check_id(what: &str, id: &str) -> PyResult<()> {
    tollgate_core::check_id(id).map_err(|e| PyValueError::new_err(format!("{what} {e}")))
}

fn value_of(obj: &Bound<'_, PyAny>) -> PyResult<json::Value> {
    convert::to_value(obj).map_err(|e| PyValueError::new_err(format!("not canonical JSON: {e}")))
}

/// The canonical JSON text of `obj`: byte for byte what
/// `json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` writes.
/// Raises `ValueError` for what has no canonical form: NaN or infinity, a non-`str` key,
/// a type JSON does not have, nesting deeper than 128 levels.
#[pyfunction]
fn canonical_json(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let v = value_of(obj)?;
    json::to_canonical_vec(&v)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| PyValueError::new_err("not canonical JSON: a NaN or infinite number"))
}

/// The SHA-256 of `canonical_json(obj)`, as 64 lowercase hex digits: a call's
/// `tool_params_hash`, a vector's `canonical_hash`. Raises `ValueError` like
/// `canonical_json`.
#[pyfunction]
fn canonical_hash(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let v = value_of(obj)?;
    json::canonical_hash(&v)
        .map(|d| d.to_string())
        .map_err(|_| PyValueError::new_err("not canonical JSON: a NaN or infinite number"))
}

/// Decide one conformance vector (a dict in the published SP/1.0 vector format) and
/// compare with what it expects; its `canonical_hash` and `vector_hash`, when present,
/// are checked too. Returns a `VectorOutcome`.
#[pyfunction]
fn check_vector(vector: &Bound<'_, PyAny>) -> objects::VectorOutcome {
    let name = vector
        .get_item("name")
        .ok()
        .and_then(|n| n.extract::<String>().ok())
        .unwrap_or_else(|| "#?".into());
    let outcome = match convert::to_value(vector) {
        Err(e) => tollgate_core::vectors::Outcome {
            name,
            expected: None,
            got: None,
            problems: vec![format!("invalid vector: {e}")],
        },
        Ok(v) => match tollgate_core::vectors::Vector::from_value(&v) {
            Ok(parsed) => tollgate_core::vectors::run(&parsed),
            Err(e) => tollgate_core::vectors::Outcome {
                name,
                expected: None,
                got: None,
                problems: vec![format!("invalid vector: {e}")],
            },
        },
    };
    outcome.into()
}

/// Read a vector file's text (the published shape, an object with a `fixtures` array,
/// or a bare array) and run every vector. Raises `ValueError` when the text is not a
/// vector file.
#[pyfunction]
fn run_vectors(text: &Bound<'_, PyAny>) -> PyResult<Vec<objects::VectorOutcome>> {
    let bytes: Vec<u8> = if let Ok(b) = text.cast::<PyBytes>() {
        b.as_bytes().to_vec()
    } else {
        text.extract::<String>()?.into_bytes()
    };
    tollgate_core::vectors::run_file(&bytes)
        .map(|outcomes| outcomes.into_iter().map(Into::into).collect())
        .map_err(|e| PyValueError::new_err(format!("not a vector file: {e}")))
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TollgateError", py.get_type::<TollgateError>())?;
    m.add("ConnectError", py.get_type::<ConnectError>())?;
    m.add("PolicyError", py.get_type::<PolicyError>())?;
    m.add_class::<objects::Verdict>()?;
    m.add_class::<objects::Released>()?;
    m.add_class::<objects::Settlement>()?;
    m.add_class::<objects::VectorOutcome>()?;
    m.add_class::<guard::PyGuard>()?;
    m.add_class::<daemon::PyClient>()?;
    m.add_class::<daemon::PyOperator>()?;
    m.add_class::<pending::Pending>()?;
    m.add_function(wrap_pyfunction!(canonical_json, m)?)?;
    m.add_function(wrap_pyfunction!(canonical_hash, m)?)?;
    m.add_function(wrap_pyfunction!(check_vector, m)?)?;
    m.add_function(wrap_pyfunction!(run_vectors, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
