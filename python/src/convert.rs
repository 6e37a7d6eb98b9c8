//! Python objects to the core's JSON values and back.
//!
//! The mapping is the one `json.dumps` applies: `dict` with `str` keys to an object,
//! `list` and `tuple` to an array, `str`, `int` (any size), `float`, `bool` and `None` to
//! their JSON counterparts; subclasses of these count as the base type. Anything else,
//! and a key that is not a `str` (which `json.dumps` would turn into a string after
//! sorting by the original keys, so the bytes would differ), is [`Unconvertible`]: such
//! params are not canonicalizable (SP/1.0 rule 1). The walk is bounded by
//! [`MAX_DEPTH`] levels, so neither a deep nor a self-containing object can exhaust the
//! stack.

use std::collections::BTreeMap;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use tollgate_core::json::{Number, Value};

/// The deepest a converted value may nest (the params object is level 1). Params nested
/// deeper than 64 levels are denied as malformed by the core anyway; this bound only
/// keeps the walk finite.
pub const MAX_DEPTH: usize = 128;

/// Why a Python object has no JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unconvertible(pub String);

impl std::fmt::Display for Unconvertible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Convert `obj` to a JSON value.
pub fn to_value(obj: &Bound<'_, PyAny>) -> Result<Value, Unconvertible> {
    walk(obj, 1)
}

fn walk(obj: &Bound<'_, PyAny>, depth: usize) -> Result<Value, Unconvertible> {
    if depth > MAX_DEPTH {
        return Err(Unconvertible(format!(
            "nested deeper than {MAX_DEPTH} levels"
        )));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(text(s)?));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = BTreeMap::new();
        for (k, v) in d.iter() {
            let Ok(key) = k.cast::<PyString>() else {
                return Err(Unconvertible(format!(
                    "a `{}` key (only str keys have one canonical form)",
                    type_name(&k)
                )));
            };
            map.insert(text(key)?, walk(&v, depth + 1)?);
        }
        return Ok(Value::Object(map));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    // bool before int: bool is a subclass of int.
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.cast::<PyInt>().is_ok() {
        // i64 first: one C call; i128 under the stable ABI goes through Python.
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::Number(Number::Int(i128::from(i))));
        }
        return Ok(Value::Number(match obj.extract::<i128>() {
            Ok(i) => Number::Int(i),
            Err(_) => Number::BigInt(big_int_digits(obj)?.into_boxed_str()),
        }));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Value::Number(Number::Float(f.value())));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return l
            .iter()
            .map(|v| walk(&v, depth + 1))
            .collect::<Result<_, _>>()
            .map(Value::Array);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t
            .iter()
            .map(|v| walk(&v, depth + 1))
            .collect::<Result<_, _>>()
            .map(Value::Array);
    }
    Err(Unconvertible(format!(
        "a `{}` value (not a JSON type)",
        type_name(obj)
    )))
}

fn text(s: &Bound<'_, PyString>) -> Result<String, Unconvertible> {
    s.to_str()
        .map(str::to_owned)
        .map_err(|_| Unconvertible("a string that is not valid Unicode (a lone surrogate)".into()))
}

/// The decimal digits of an int too large for 128 bits (`int.__repr__`, as `json.dumps`
/// writes it, whatever a subclass's own `__repr__` says).
fn big_int_digits(obj: &Bound<'_, PyAny>) -> Result<String, Unconvertible> {
    let py = obj.py();
    let int_type = py.get_type::<PyInt>();
    int_type
        .getattr("__repr__")
        .and_then(|r| r.call1((obj,)))
        .and_then(|s| s.extract::<String>())
        .map_err(|e| Unconvertible(format!("an int that cannot be written: {e}")))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A JSON value as a Python object (`dict`, `list`, `str`, `int`, `float`, `bool`,
/// `None`).
pub fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(Number::Int(i)) => i.into_pyobject(py)?.into_any(),
        Value::Number(Number::BigInt(digits)) => py.get_type::<PyInt>().call1((&**digits,))?,
        Value::Number(Number::Float(f)) => PyFloat::new(py, *f).into_any(),
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}
