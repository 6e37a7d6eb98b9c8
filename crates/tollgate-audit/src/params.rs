//! What a verdict records of its call's params (format version 7, `[audit] params`):
//! nothing but the hash (the default), their canonical JSON, or that JSON with secrets
//! replaced by [`REDACTED_MARKER`]. docs/audit-format.md, "Recorded params", is the
//! normative description; [`Recorder::record`] is the one implementation.
//!
//! Pure: a value in, a [`RecordedParams`] out. The recorded text is bounded by
//! [`MAX_RECORDED_PARAMS`]; a longer one is recorded as [`RecordedParams::TooLarge`] (its
//! length only), never cut.

use std::collections::BTreeMap;

use tollgate_core::json::{self, Value};

use crate::entry::{ParamsMode, RecordedParams, MAX_RECORDED_PARAMS, REDACTED_MARKER};

/// The most `[audit] redact` paths.
pub const MAX_REDACT_PATHS: usize = 64;
/// The longest `[audit] redact` path, in bytes.
pub const MAX_REDACT_PATH_BYTES: usize = 256;

/// Member names (lower-cased, `-` and `_` removed) whose values are redacted wherever they
/// are: a name that contains one of these.
pub const SECRET_NAMES: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "accesskey",
    "authorization",
    "credential",
    "privatekey",
    "cookie",
];

/// Prefixes of well-known API keys: a word that starts with one, followed by at least
/// [`KEY_TAIL`] letters, digits, `-` or `_`, is a secret.
pub const KEY_PREFIXES: &[&str] = &[
    "sk-",
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "pk_live_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxa-",
    "xoxp-",
    "xoxr-",
    "xoxs-",
    "AKIA",
    "ASIA",
    "AIza",
];

/// How many key characters must follow a [`KEY_PREFIXES`] prefix.
pub const KEY_TAIL: usize = 16;

/// One step of a redaction path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// A member of an object (or, if it is all digits, also that element of an array).
    Name(String),
    /// Any member or element.
    Any,
}

/// A configured `[audit] params` setting, ready to record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorder {
    mode: ParamsMode,
    paths: Vec<Vec<Step>>,
}

/// A setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RecorderError(pub String);

/// Which of the two settings ([`Recorder::from_setting`]) cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    /// The mode word (`params`) is not `hash`, `full` nor `redacted`.
    #[error("`{0}` is not hash, full or redacted")]
    Params(String),
    /// The redaction paths (`redact`).
    #[error("{0}")]
    Redact(RecorderError),
}

impl SettingError {
    /// Which of the two keys is at fault: `params_key` or `redact_key` (each producer
    /// names its own, e.g. `audit.params` and `audit.redact`).
    pub fn key<'a>(&self, params_key: &'a str, redact_key: &'a str) -> &'a str {
        match self {
            SettingError::Params(_) => params_key,
            SettingError::Redact(_) => redact_key,
        }
    }
}

impl Recorder {
    /// The recorder a configuration's `params` word (absent: `hash`) and `redact` paths
    /// say: what the daemon's `[audit]`, mcp.toml's `[library]` and the Python `Guard`
    /// all read.
    pub fn from_setting(word: Option<&str>, redact: &[String]) -> Result<Recorder, SettingError> {
        let mode = match word {
            None => ParamsMode::Hash,
            Some(w) => {
                ParamsMode::from_word(w).ok_or_else(|| SettingError::Params(w.to_owned()))?
            }
        };
        Recorder::new(mode, redact).map_err(SettingError::Redact)
    }

    /// Record nothing but the hash.
    pub fn hash_only() -> Recorder {
        Recorder::default()
    }

    /// `mode` with the redaction `paths` (dot-separated member names, `*` for any member
    /// or element; only read in mode `redacted`, and refused in another mode, where they
    /// would do nothing).
    pub fn new(mode: ParamsMode, paths: &[String]) -> Result<Recorder, RecorderError> {
        if !paths.is_empty() && mode != ParamsMode::Redacted {
            return Err(RecorderError(format!(
                "redact paths need params = \"redacted\" (params is \"{}\")",
                mode.as_str()
            )));
        }
        if paths.len() > MAX_REDACT_PATHS {
            return Err(RecorderError(format!(
                "{} redact paths; at most {MAX_REDACT_PATHS}",
                paths.len()
            )));
        }
        let mut parsed = Vec::with_capacity(paths.len());
        for p in paths {
            if p.is_empty() || p.len() > MAX_REDACT_PATH_BYTES {
                return Err(RecorderError(format!(
                    "redact path `{}` is not 1 to {MAX_REDACT_PATH_BYTES} bytes",
                    p.escape_default()
                )));
            }
            let steps: Vec<Step> = p
                .split('.')
                .map(|s| match s {
                    "*" => Ok(Step::Any),
                    "" => Err(RecorderError(format!(
                        "redact path `{}` has an empty step",
                        p.escape_default()
                    ))),
                    name => Ok(Step::Name(name.to_owned())),
                })
                .collect::<Result<_, _>>()?;
            parsed.push(steps);
        }
        Ok(Recorder {
            mode,
            paths: parsed,
        })
    }

    /// The mode.
    pub fn mode(&self) -> ParamsMode {
        self.mode
    }

    /// What a verdict records of `params` (the call's params, already checked to hash to
    /// its `params_hash`); `None` in mode `hash`, or for params that have no canonical
    /// form (which never hash to anything).
    pub fn record(&self, params: &Value) -> Option<RecordedParams> {
        let value = match self.mode {
            ParamsMode::Hash => return None,
            ParamsMode::Full => None,
            ParamsMode::Redacted => Some(self.redact(params)),
        };
        let bytes = json::to_canonical_vec(value.as_ref().unwrap_or(params)).ok()?;
        if bytes.len() > MAX_RECORDED_PARAMS {
            return Some(RecordedParams::TooLarge {
                mode: self.mode,
                len: u32::try_from(bytes.len()).unwrap_or(u32::MAX),
            });
        }
        // Canonical JSON is UTF-8.
        let text = String::from_utf8(bytes).ok()?;
        Some(match self.mode {
            ParamsMode::Redacted => RecordedParams::Redacted(text),
            _ => RecordedParams::Full(text),
        })
    }

    /// `params` with the configured paths, the secret-named members and the secret-looking
    /// strings replaced by [`REDACTED_MARKER`].
    pub fn redact(&self, params: &Value) -> Value {
        let live: Vec<&[Step]> = self.paths.iter().map(Vec::as_slice).collect();
        redact(params, &live)
    }
}

fn marker() -> Value {
    Value::String(REDACTED_MARKER.to_owned())
}

/// `v` redacted, where `paths` are the rests of the configured paths that reached it.
fn redact(v: &Value, paths: &[&[Step]]) -> Value {
    if paths.iter().any(|p| p.is_empty()) {
        return marker();
    }
    let below = |key: &str| -> Vec<&[Step]> {
        paths
            .iter()
            .filter_map(|p| match p.split_first() {
                Some((Step::Any, rest)) => Some(rest),
                Some((Step::Name(n), rest)) if n == key => Some(rest),
                _ => None,
            })
            .collect()
    };
    match v {
        Value::String(s) if looks_secret(s) => marker(),
        Value::Object(members) => {
            let mut out = BTreeMap::new();
            for (k, item) in members {
                let value = if secret_name(k) {
                    marker()
                } else {
                    redact(item, &below(k))
                };
                out.insert(k.clone(), value);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| redact(item, &below(&i.to_string())))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Whether a member name says its value is a secret ([`SECRET_NAMES`]).
pub fn secret_name(name: &str) -> bool {
    let folded: String = name
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .flat_map(char::to_lowercase)
        .collect();
    SECRET_NAMES.iter().any(|s| folded.contains(s))
}

fn key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// Whether a string holds a word that looks like a credential: `Bearer`/`Basic` and a
/// word, a JSON Web Token, a PEM private key, a known key prefix and a key, a URL with a
/// password (`scheme://user:password@host`), or a secret-named assignment
/// (`password=...`, `api_key: ...`, `--token=...`).
pub fn looks_secret(s: &str) -> bool {
    if s.contains("-----BEGIN") && s.contains("PRIVATE KEY-----") {
        return true;
    }
    if url_password(s) || secret_assignment(s) {
        return true;
    }
    let words: Vec<&str> = s
        .split(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';' | '=' | '&'))
        .filter(|w| !w.is_empty())
        .collect();
    for (i, w) in words.iter().enumerate() {
        let scheme = w.eq_ignore_ascii_case("bearer") || w.eq_ignore_ascii_case("basic");
        if scheme && words.get(i + 1).is_some() {
            return true;
        }
        if is_jwt(w) {
            return true;
        }
        for p in KEY_PREFIXES {
            if let Some(rest) = w.strip_prefix(p) {
                if rest.chars().take_while(|c| key_char(*c)).count() >= KEY_TAIL {
                    return true;
                }
            }
        }
    }
    false
}

/// A URL whose authority holds a password: `postgres://app:hunter2@db/x`.
fn url_password(s: &str) -> bool {
    s.match_indices("://").any(|(i, _)| {
        let rest = s.get(i + 3..).unwrap_or("");
        let end = rest
            .find(|c: char| c.is_whitespace() || matches!(c, '/' | '?' | '#'))
            .unwrap_or(rest.len());
        let authority = rest.get(..end).unwrap_or("");
        authority.rfind('@').is_some_and(|at| {
            let userinfo = authority.get(..at).unwrap_or("");
            userinfo
                .split_once(':')
                .is_some_and(|(_, password)| !password.is_empty())
        })
    })
}

/// `NAME=VALUE` or `NAME: VALUE` where NAME is a secret name ([`secret_name`]) and VALUE
/// is not empty: a query string, a command line, a header or config line.
fn secret_assignment(s: &str) -> bool {
    let bytes = s.as_bytes();
    bytes.iter().enumerate().any(|(i, b)| {
        if !matches!(b, b'=' | b':') {
            return false;
        }
        // `token = x` as well as `token=x`.
        let end = bytes
            .get(..i)
            .unwrap_or(&[])
            .iter()
            .rposition(|c| !matches!(c, b' ' | b'\t'))
            .map_or(0, |p| p + 1);
        let start = bytes
            .get(..end)
            .unwrap_or(&[])
            .iter()
            .rposition(|c| !key_char(char::from(*c)))
            .map_or(0, |p| p + 1);
        let name = s.get(start..end).unwrap_or("");
        let value = s.get(i + 1..).unwrap_or("").trim_start_matches([' ', '\t']);
        let value_starts = value
            .chars()
            .next()
            .is_some_and(|c| !c.is_whitespace() && !matches!(c, '&' | ';' | ','));
        !name.is_empty() && value_starts && secret_name(name)
    })
}

fn is_jwt(w: &str) -> bool {
    let parts: Vec<&str> = w.split('.').collect();
    parts.len() == 3
        && parts.first().is_some_and(|p| p.starts_with("eyJ"))
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(t: &str) -> Value {
        json::parse_str(t).unwrap()
    }

    fn redacted(r: &Recorder, t: &str) -> String {
        match r.record(&parse(t)) {
            Some(RecordedParams::Redacted(s)) => s,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn secrets_by_name_form_and_path_are_replaced() {
        let r = Recorder::new(
            ParamsMode::Redacted,
            &["card.number".to_owned(), "items.*.pin".to_owned()],
        )
        .unwrap();
        let out = redacted(
            &r,
            r#"{"api_key":"k1","X-Api-Key":"k2","user":"ann","password":{"v":1},
                "headers":{"Authorization":"whatever"},"note":"use Bearer abc.def please",
                "jwt":"eyJhbGciOi.eyJzdWIiOiIx.c2lnbmF0dXJl","gh":"ghp_0123456789abcdefABCDEF",
                "short":"sk-1","card":{"number":4111111111111111,"brand":"visa"},
                "items":[{"pin":"1234","n":1},{"pin":[1,2]}],
                "aws":["AKIAABCDEFGHIJKLMNOP"]}"#,
        );
        for secret in [
            "k1",
            "k2",
            "abc.def",
            "eyJhbGciOi",
            "ghp_0123",
            "4111111111111111",
            "1234",
            "AKIAABCD",
        ] {
            assert!(!out.contains(secret), "{secret} in {out}");
        }
        for kept in ["ann", "visa", "sk-1", "\"n\":1", "api_key", "Authorization"] {
            assert!(out.contains(kept), "{kept} not in {out}");
        }
        assert!(out.contains(r#""pin":"[REDACTED]""#), "{out}");
    }

    #[test]
    fn passwords_in_urls_and_secret_assignments_in_strings_are_replaced() {
        let r = Recorder::new(ParamsMode::Redacted, &[]).unwrap();
        let out = redacted(
            &r,
            r#"{"dsn":"postgres://app:hunter2@db.internal:5432/prod",
                "url":"https://api.example/v1/items?limit=5&api_key=k-9f8e7d",
                "cmd":["mysql","--password=s3cr3t","-h","db"],
                "slash":"--db-password=/pa55/w0rd",
                "env":"PATH=/bin\nCLIENT_SECRET=cs-000111",
                "header":"X-Auth-Token: tok-424242",
                "conf":"refresh_token = rt-55aa66",
                "plain":"https://example.com/a@b?limit=5&page=2",
                "ratio":"3:4 at 10:30, key=value",
                "mail":"mailto:ann@example.com"}"#,
        );
        for secret in [
            "hunter2",
            "k-9f8e7d",
            "s3cr3t",
            "cs-000111",
            "tok-424242",
            "rt-55aa66",
            "pa55/w0rd",
        ] {
            assert!(!out.contains(secret), "{secret} in {out}");
        }
        for kept in [
            "https://example.com/a@b?limit=5&page=2",
            "3:4 at 10:30, key=value",
            "mailto:ann@example.com",
            "\"mysql\"",
        ] {
            assert!(out.contains(kept), "{kept} not in {out}");
        }
        // Not secrets: a user without a password, an empty value, a name alone.
        for s in [
            "ssh://git@github.com/x",
            "password=",
            "token = ",
            "the password: ",
            "passwords are rotated",
        ] {
            assert!(!looks_secret(s), "{s}");
        }
    }

    #[test]
    fn full_is_the_canonical_form_and_hashes_to_the_params_hash() {
        let v = parse(r#"{ "b": 1, "a": [true, null] }"#);
        let r = Recorder::new(ParamsMode::Full, &[]).unwrap();
        let Some(RecordedParams::Full(t)) = r.record(&v) else {
            panic!()
        };
        assert_eq!(t, r#"{"a":[true,null],"b":1}"#);
        assert_eq!(
            crate::format::sha256(t.as_bytes()),
            json::canonical_hash(&v).unwrap()
        );
        assert_eq!(Recorder::hash_only().record(&v), None);
    }

    #[test]
    fn params_over_the_bound_are_not_recorded_but_say_so() {
        let big = Value::String("x".repeat(MAX_RECORDED_PARAMS));
        for mode in [ParamsMode::Full, ParamsMode::Redacted] {
            let r = Recorder::new(mode, &[]).unwrap();
            assert_eq!(
                r.record(&big),
                Some(RecordedParams::TooLarge {
                    mode,
                    len: u32::try_from(MAX_RECORDED_PARAMS + 2).unwrap()
                })
            );
        }
        // Exactly at the bound: recorded.
        let fits = Value::String("x".repeat(MAX_RECORDED_PARAMS - 2));
        let r = Recorder::new(ParamsMode::Full, &[]).unwrap();
        assert!(
            matches!(r.record(&fits), Some(RecordedParams::Full(t)) if t.len() == MAX_RECORDED_PARAMS)
        );
    }

    #[test]
    fn a_configuration_reads_as_one_recorder_with_the_failing_setting_named() {
        assert_eq!(
            Recorder::from_setting(None, &[]).unwrap().mode(),
            ParamsMode::Hash
        );
        assert_eq!(
            Recorder::from_setting(Some("full"), &[]).unwrap().mode(),
            ParamsMode::Full
        );
        let e = Recorder::from_setting(Some("all"), &[]).unwrap_err();
        assert_eq!(e, SettingError::Params("all".into()));
        assert_eq!(e.to_string(), "`all` is not hash, full or redacted");
        assert_eq!(e.key("p", "r"), "p");
        let e = Recorder::from_setting(Some("hash"), &["a.b".to_owned()]).unwrap_err();
        assert!(matches!(e, SettingError::Redact(_)));
        assert_eq!(e.key("p", "r"), "r");
    }

    #[test]
    fn settings_are_checked() {
        assert!(Recorder::new(ParamsMode::Full, &["a".into()]).is_err());
        assert!(Recorder::new(ParamsMode::Redacted, &["a..b".into()]).is_err());
        assert!(Recorder::new(ParamsMode::Redacted, &[String::new()]).is_err());
        assert!(Recorder::new(ParamsMode::Redacted, &["x".repeat(257)]).is_err());
        let many: Vec<String> = (0..65).map(|i| format!("p{i}")).collect();
        assert!(Recorder::new(ParamsMode::Redacted, &many).is_err());
    }
}
