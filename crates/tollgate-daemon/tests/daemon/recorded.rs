//! Issue 19: `[audit] params`. `redacted` keeps secrets out of the log's bytes while the
//! log verifies and the true params hash to the entry's `params_hash`; `full` records the
//! canonical params, which hash to it; params over the bound are recorded as too large,
//! with their length, never cut.

use tollgate_audit::params::Recorder;
use tollgate_audit::{ParamsMode, RecordedParams, MAX_RECORDED_PARAMS};
use tollgate_core::json;

use super::*;

const SECRETS: [&str; 4] = [
    "s3cr3t-TOKEN-xyz",
    "AK-very-secret-1",
    "4111-1111-1111-1111",
    "ghp_abcdefghijklmnop1234",
];

fn secret_params() -> json::Value {
    json::parse_str(
        r#"{"headers":{"Authorization":"Bearer s3cr3t-TOKEN-xyz","Accept":"text/html"},
            "api_key":"AK-very-secret-1","card":{"number":"4111-1111-1111-1111","brand":"visa"},
            "note":"use ghp_abcdefghijklmnop1234 here","url":"https://ok.example/page"}"#,
    )
    .unwrap()
}

/// Every byte under `dir` (the log files and whatever else the writer keeps there).
fn all_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.extend(std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redacted_params_keep_secrets_out_of_the_log_and_the_hash_still_binds() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.audit.params = Recorder::new(ParamsMode::Redacted, &["card.number".into()]).unwrap();
    let d = start(cfg).await;
    let c = connect(&d.socket, "research-bot").await;
    let params = secret_params();
    let v = c.pre_exec("http_get", &params, 0.01).await;
    assert!(v.allowed(), "{v:?}");
    // Over the bound (but within the wire's 64 KiB): recorded as too large.
    let big = json::parse_str(&format!(
        r#"{{"blob":"{}","password":"p4ss-{}"}}"#,
        "x".repeat(MAX_RECORDED_PARAMS),
        "w0rd"
    ))
    .unwrap();
    let v = c.pre_exec("upload", &big, 0.01).await;
    assert!(v.allowed(), "{v:?}");
    d.stop().await;

    // No secret anywhere in the log's bytes (nor in the data directory's other files).
    let bytes = all_bytes(dir.path());
    for s in SECRETS.iter().chain(&["p4ss-w0rd"]) {
        assert!(!contains(&bytes, s), "`{s}` is in the log's bytes");
    }
    assert!(contains(&bytes, "https://ok.example/page"));
    // The log verifies (`audited` verifies it with its key), and the true params hash to
    // the recorded params_hash.
    let verdicts = audited(dir.path());
    let get = verdicts.iter().find(|v| v.tool_name == "http_get").unwrap();
    assert_eq!(get.params_hash, json::canonical_hash(&params).unwrap());
    let Some(RecordedParams::Redacted(text)) = &get.params else {
        panic!("{:?}", get.params)
    };
    let recorded = json::parse_str(text).unwrap();
    let field = |v: &json::Value, path: &[&str]| -> json::Value {
        let mut v = v.clone();
        for p in path {
            let json::Value::Object(m) = v else { panic!() };
            v = m.get(*p).cloned().unwrap();
        }
        v
    };
    let marker = json::Value::String("[REDACTED]".into());
    assert_eq!(field(&recorded, &["headers", "Authorization"]), marker);
    assert_eq!(field(&recorded, &["api_key"]), marker);
    assert_eq!(field(&recorded, &["card", "number"]), marker);
    assert_eq!(field(&recorded, &["note"]), marker);
    assert_eq!(
        field(&recorded, &["card", "brand"]),
        json::Value::String("visa".into())
    );
    assert_eq!(
        field(&recorded, &["headers", "Accept"]),
        json::Value::String("text/html".into())
    );
    let up = verdicts.iter().find(|v| v.tool_name == "upload").unwrap();
    let canonical_len = json::to_canonical_vec(&big).unwrap().len();
    assert_eq!(
        up.params,
        Some(RecordedParams::TooLarge {
            mode: ParamsMode::Redacted,
            // The redacted text: the password's value became the marker.
            len: u32::try_from(canonical_len - "p4ss-w0rd".len() + "[REDACTED]".len()).unwrap(),
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_params_are_the_canonical_bytes_of_the_hash() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.audit.params = Recorder::new(ParamsMode::Full, &[]).unwrap();
    let d = start(cfg).await;
    let c = connect(&d.socket, "research-bot").await;
    let params = json::parse_str(r#"{ "q": "tollgate", "n": 3 }"#).unwrap();
    let v = c.pre_exec("search", &params, 0.01).await;
    assert!(v.allowed(), "{v:?}");
    // A call sent without params records none.
    let mut blind = c.prepare("search", &json::parse_str(r#"{"q":"b"}"#).unwrap(), 0.01);
    blind.tool_params.clear();
    assert!(c.pre_exec_request(blind).await.allowed());
    let big = json::parse_str(&format!(r#"{{"b":"{}"}}"#, "y".repeat(20_000))).unwrap();
    assert!(c.pre_exec("search", &big, 0.01).await.allowed());
    d.stop().await;
    let verdicts = audited(dir.path());
    let Some(RecordedParams::Full(text)) = &verdicts[0].params else {
        panic!("{:?}", verdicts[0].params)
    };
    assert_eq!(text, r#"{"n":3,"q":"tollgate"}"#);
    assert_eq!(
        tollgate_audit::format::sha256(text.as_bytes()),
        verdicts[0].params_hash
    );
    assert_eq!(verdicts[1].params, None);
    assert_eq!(
        verdicts[2].params,
        Some(RecordedParams::TooLarge {
            mode: ParamsMode::Full,
            len: u32::try_from(json::to_canonical_vec(&big).unwrap().len()).unwrap(),
        })
    );
}

/// The section's keys: a mode, and paths only with `redacted`.
#[test]
fn the_audit_params_settings_are_checked() {
    let base = Path::new("/etc/tollgate");
    let c = DaemonConfig::from_toml("[audit]\nparams = \"redacted\"\nredact = [\"a.b\"]", base)
        .unwrap();
    assert_eq!(c.audit.params.mode(), ParamsMode::Redacted);
    assert_eq!(
        DaemonConfig::from_toml("", base)
            .unwrap()
            .audit
            .params
            .mode(),
        ParamsMode::Hash
    );
    for (text, key) in [
        ("[audit]\nparams = \"all\"", "audit.params"),
        (
            "[audit]\nparams = \"full\"\nredact = [\"a\"]",
            "audit.redact",
        ),
        (
            "[audit]\nparams = \"redacted\"\nredact = [\"a..b\"]",
            "audit.redact",
        ),
    ] {
        let e = DaemonConfig::from_toml(text, base).unwrap_err().to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
}
