//! `Guard(policy=...)`: the Cedar policy set a library-mode guard enforces (issue 18),
//! named the way every configuration names it, a `[policy]` section
//! ([`tollgate_policy::files::Section`]), and loaded by the one loader the daemon and
//! `tollgate policy check` use ([`tollgate_policy::files::enforced`]), so a bad set is
//! refused with the same `file:line:column` findings.
//!
//! `policy=` is either a path to a TOML file with a `[policy]` section (a `tollgate serve`
//! configuration or an `mcp.toml` will do: the other sections are not read; relative paths
//! in it are resolved against the file's directory), or a dict with the section's keys
//! (`files`, `default`, `schema`, `trip_on_refusal`, `mode`; relative paths are resolved against
//! the current directory).

use std::io::Read as _;
use std::path::{Path, PathBuf};

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use tollgate_policy::compose::Enforced;
use tollgate_policy::files::{self, FilesError, Section, Settings};

use crate::PolicyError;

/// The largest configuration file `policy=` reads (a `[policy]` section is a few lines;
/// a whole `tollgate serve` configuration fits many times over).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The keys of a `[policy]` section, as a dict gives them.
const KEYS: [&str; 5] = ["files", "default", "schema", "trip_on_refusal", "mode"];

/// What `policy=` names: the section's settings, and where they came from (for messages).
pub(crate) fn settings(policy: &Bound<'_, PyAny>) -> PyResult<Settings> {
    if let Ok(d) = policy.cast::<PyDict>() {
        return from_dict(d);
    }
    if policy.is_instance_of::<PyString>() || policy.hasattr("__fspath__")? {
        let path: PathBuf = policy.extract()?;
        return from_file(&path);
    }
    Err(PyTypeError::new_err(
        "policy: give a path to a TOML file with a [policy] section, or a dict with its keys \
         (files, default, schema, trip_on_refusal, mode)",
    ))
}

fn from_dict(d: &Bound<'_, PyDict>) -> PyResult<Settings> {
    let mut section = Section::default();
    for (k, v) in d.iter() {
        let key: String = k
            .extract()
            .map_err(|_| PyTypeError::new_err("policy: the dict's keys are strings"))?;
        let bad = |what: &str| PyTypeError::new_err(format!("policy[{key:?}]: {what}"));
        match key.as_str() {
            "files" => {
                if v.is_instance_of::<PyString>() {
                    return Err(bad("a list of file paths, not one string"));
                }
                section.files = v
                    .extract::<Vec<PathBuf>>()
                    .map_err(|_| bad("a list of file paths"))?;
            }
            "default" => {
                section.default = v
                    .extract::<Option<String>>()
                    .map_err(|_| bad("\"allow\" or \"deny\""))?;
            }
            "schema" => {
                section.schema = v
                    .extract::<Option<PathBuf>>()
                    .map_err(|_| bad("a file path"))?;
            }
            "trip_on_refusal" => {
                section.trip_on_refusal = v
                    .extract::<Option<bool>>()
                    .map_err(|_| bad("True or False"))?;
            }
            "mode" => {
                section.mode = v
                    .extract::<Option<String>>()
                    .map_err(|_| bad("\"enforce\" or \"shadow\""))?;
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "policy: unknown key `{other}` (the keys are {})",
                    KEYS.join(", ")
                )))
            }
        }
    }
    // Relative paths are the caller's, from the current directory (kept relative, so the
    // findings name the files as given).
    Settings::from_section(section, Path::new(""))
        .map_err(|e| PyValueError::new_err(format!("policy: {e}")))
}

fn from_file(path: &Path) -> PyResult<Settings> {
    let shown = path.display();
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| PyOSError::new_err(format!("policy: cannot read `{shown}`: {e}")))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(PyValueError::new_err(format!(
            "policy: `{shown}` is larger than {MAX_CONFIG_BYTES} bytes"
        )));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| PyValueError::new_err(format!("policy: `{shown}` is not UTF-8 text")))?;
    let mut table: toml::Table = toml::from_str(&text)
        .map_err(|e| PyValueError::new_err(format!("policy: `{shown}`: {e}")))?;
    let Some(value) = table.remove("policy") else {
        return Err(PyValueError::new_err(format!(
            "policy: `{shown}` has no [policy] section"
        )));
    };
    let section: Section = value
        .try_into()
        .map_err(|e| PyValueError::new_err(format!("policy: `{shown}`, [policy]: {e}")))?;
    let base = path.parent().unwrap_or(Path::new(""));
    Settings::from_section(section, base)
        .map_err(|e| PyValueError::new_err(format!("policy: `{shown}`: {e}")))
}

/// Load the set `settings` name. A file that cannot be read is `OSError`; a set the loader
/// refuses is `PolicyError`, its message every finding (`file:line:column:
/// error[code]: message`, then a help line), as `tollgate policy check` prints them.
/// Returns the set and the loader's warnings, one line each.
pub(crate) fn load(settings: &Settings) -> PyResult<(Enforced, Vec<String>)> {
    match files::enforced(settings) {
        Ok((set, warnings)) => Ok((set, warnings.iter().map(ToString::to_string).collect())),
        Err(FilesError::Read(e)) => Err(PyOSError::new_err(e)),
        Err(e @ FilesError::Refused(_)) => Err(PolicyError::new_err(e.to_string())),
    }
}
