//! `[policy]` as every configuration spells it: `tollgate serve`'s config, `mcp.toml` and
//! the Python `Guard(policy=...)` all give a [`Section`], turned into [`Settings`] (paths
//! resolved against the configuration file's directory) and loaded by [`enforced`] with
//! the one loader ([`crate::load()`]), so every path refuses a bad set with the same
//! `file:line:column` findings.
//!
//! ```toml
//! [policy]
//! files = ["tools.cedar"]      # in set order
//! default = "deny"             # "allow" (the default) or "deny"
//! schema = "tools.cedarschema" # optional
//! trip_on_refusal = false      # whether a policy's DENY trips the session's circuit
//! mode = "enforce"             # or "shadow": evaluate and record, enforce nothing
//! ```
//!
//! This module is the crate's only I/O: it reads the files a section names, each bounded
//! by [`crate::load::MAX_FILE_BYTES`].

use std::path::{Path, PathBuf};

use crate::compose::Enforced;
use crate::{DefaultEffect, Finding, Options, Policies, Source};

/// The `[policy]` section as written (TOML, or any serde format).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Section {
    /// The policy files, in set order.
    pub files: Vec<PathBuf>,
    /// `allow` (the default) or `deny`.
    pub default: Option<String>,
    /// A Cedar schema file.
    pub schema: Option<PathBuf>,
    /// Whether a policy's DENY trips the session's circuit (default: no).
    pub trip_on_refusal: Option<bool>,
    /// `enforce` (the default) or `shadow` (the whole set is evaluated on every call and
    /// its would-be verdicts recorded, and nothing is enforced: [`crate::shadow`]).
    pub mode: Option<String>,
}

/// A `[policy]` section, checked, with its paths resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The policy files, in set order.
    pub files: Vec<PathBuf>,
    /// What happens to a call no `permit` matches.
    pub default: DefaultEffect,
    /// The schema, if any.
    pub schema: Option<PathBuf>,
    /// Whether a policy's DENY trips the session's circuit (default: no).
    pub trip_on_refusal: bool,
    /// `mode = "shadow"`: the whole set runs in shadow ([`crate::shadow::whole_set`]).
    pub shadow: bool,
}

/// A section that cannot be used: the key (`policy.files`, ...) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct SectionError {
    /// The offending key, `policy.<name>`.
    pub key: &'static str,
    /// Why.
    pub message: String,
}

impl Settings {
    /// Check `section` and resolve its relative paths against `base` (the directory of the
    /// file it was read from).
    pub fn from_section(section: Section, base: &Path) -> Result<Settings, SectionError> {
        if section.files.is_empty() {
            return Err(SectionError {
                key: "policy.files",
                message: "names no file; remove [policy] to run without policies".into(),
            });
        }
        let resolve = |p: PathBuf| if p.is_relative() { base.join(p) } else { p };
        let default = match section.default.as_deref() {
            None => DefaultEffect::Allow,
            Some(text) => DefaultEffect::parse(text).ok_or_else(|| SectionError {
                key: "policy.default",
                message: format!("`{text}` is not allow or deny"),
            })?,
        };
        let shadow = match section.mode.as_deref() {
            None | Some("enforce") => false,
            Some("shadow") => true,
            Some(text) => {
                return Err(SectionError {
                    key: "policy.mode",
                    message: format!("`{text}` is not enforce or shadow"),
                })
            }
        };
        Ok(Settings {
            files: section.files.into_iter().map(resolve).collect(),
            default,
            schema: section.schema.map(resolve),
            trip_on_refusal: section.trip_on_refusal.unwrap_or(false),
            shadow,
        })
    }
}

/// Why a configured set cannot be put in force.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilesError {
    /// A file cannot be read (or is not UTF-8).
    #[error("policy: {0}")]
    Read(String),
    /// The loader refused the set: every finding, one per line, `file:line:col:
    /// error[code]: message` (then a help line), as `tollgate policy check` prints them.
    #[error("policy set refused:\n{0}")]
    Refused(String),
}

/// A file's text as a [`Source`] named by its path: at most
/// [`crate::load::MAX_FILE_BYTES`] + 1 bytes are read (the loader then reports the file
/// as too large), and text that is not UTF-8 is an error.
pub fn read_source(path: &Path) -> Result<Source, String> {
    use std::io::Read as _;
    let limit = u64::try_from(crate::load::MAX_FILE_BYTES).unwrap_or(u64::MAX);
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limit.saturating_add(1)).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| format!("`{}` is not UTF-8 text: {e}", path.display()))?;
    Ok(Source::new(path.display().to_string(), text))
}

/// Read and load the set `settings` name, with the warnings the loader found.
pub fn load(settings: &Settings) -> Result<(Policies, Vec<Finding>), FilesError> {
    let sources = settings
        .files
        .iter()
        .map(|p| read_source(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(FilesError::Read)?;
    let schema = settings
        .schema
        .as_deref()
        .map(read_source)
        .transpose()
        .map_err(FilesError::Read)?;
    let options = Options {
        default: settings.default,
        schema,
    };
    let loaded = crate::load(&sources, &options).map_err(|e| {
        let lines: Vec<String> = e.findings.iter().map(ToString::to_string).collect();
        FilesError::Refused(lines.join("\n"))
    })?;
    let policies = if settings.shadow {
        crate::shadow::whole_set(loaded.policies)
    } else {
        loaded.policies
    };
    Ok((policies, loaded.warnings))
}

/// [`load`], as a session enforces the set.
pub fn enforced(settings: &Settings) -> Result<(Enforced, Vec<Finding>), FilesError> {
    let (policies, warnings) = load(settings)?;
    Ok((
        Enforced {
            policies,
            trip_on_refusal: settings.trip_on_refusal,
        },
        warnings,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(files: &[&str], default: Option<&str>) -> Section {
        Section {
            files: files.iter().map(PathBuf::from).collect(),
            default: default.map(str::to_owned),
            ..Section::default()
        }
    }

    #[test]
    fn sections_are_checked_and_resolved() {
        let base = Path::new("/etc/tollgate");
        let s = Settings::from_section(section(&["a.cedar", "/abs/b.cedar"], Some("deny")), base)
            .unwrap();
        assert_eq!(
            s.files,
            vec![
                PathBuf::from("/etc/tollgate/a.cedar"),
                PathBuf::from("/abs/b.cedar")
            ]
        );
        assert_eq!(s.default, DefaultEffect::Deny);
        assert!(!s.trip_on_refusal);
        let e = Settings::from_section(section(&[], None), base).unwrap_err();
        assert_eq!(e.key, "policy.files");
        let e = Settings::from_section(section(&["a.cedar"], Some("Deny ")), base).unwrap_err();
        assert_eq!(e.key, "policy.default");
    }

    #[test]
    fn files_that_cannot_be_read_are_named() {
        let dir = std::env::temp_dir().join(format!("tollgate-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok.cedar");
        std::fs::write(
            &ok,
            "@id(\"no-shell\")\nforbid (principal, action == Action::\"shell\", resource);\n",
        )
        .unwrap();
        let bad = dir.join("bad.cedar");
        std::fs::write(
            &bad,
            "permit (principal, action, resource) when { context.args.x > };\n",
        )
        .unwrap();
        let settings = |files: Vec<PathBuf>| Settings {
            files,
            default: DefaultEffect::Allow,
            schema: None,
            trip_on_refusal: true,
            shadow: false,
        };
        let (set, _) = enforced(&settings(vec![ok.clone()])).unwrap();
        assert_eq!(set.policies.len(), 1);
        assert!(set.trip_on_refusal);
        match load(&settings(vec![ok.clone(), bad.clone()])) {
            Err(FilesError::Refused(text)) => {
                assert!(text.contains(&format!("{}:1:", bad.display())), "{text}")
            }
            other => panic!("{other:?}"),
        }
        let missing = dir.join("missing.cedar");
        match load(&settings(vec![missing.clone()])) {
            Err(FilesError::Read(text)) => assert!(text.contains("missing.cedar"), "{text}"),
            other => panic!("{other:?}"),
        }
        std::fs::write(&bad, [0xff, 0xfe]).unwrap();
        assert!(matches!(
            load(&settings(vec![bad])),
            Err(FilesError::Read(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
