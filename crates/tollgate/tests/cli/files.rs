//! Files and commands (issue 17 §6): every file and directory `tollgate serve` creates has
//! its mode whatever the umask; a state file others may write is not trusted; every
//! command stops quietly when its output is closed.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tollgate_client::{ClientConfig, DaemonClient};

use crate::daemon::Serve;
use crate::{repo, s};

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// `tollgate serve` for `dir` under umask 000.
fn serve_umask_000(dir: &Path, socket: &Path) -> Serve {
    let script = format!(
        "umask 000; exec '{}' serve --data-dir '{}' --socket '{}'",
        env!("CARGO_BIN_EXE_tollgate"),
        s(dir),
        s(socket)
    );
    Serve::start_command_at(dir, socket, Command::new("sh").args(["-c", &script]))
}

#[test]
fn every_file_and_directory_has_its_mode_under_umask_000() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let socket = tmp.path().join("run/tollgate/t.sock");
    let daemon = serve_umask_000(&dir, &socket);
    // One registration and a verdict, so that the log has entries; SIGTERM writes a
    // checkpoint and the last snapshot.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let secret = std::fs::read_to_string(dir.join("secrets/default.secret")).unwrap();
            let c = DaemonClient::connect(ClientConfig::new(
                &socket,
                "default",
                secret.trim().as_bytes(),
                "umask",
            ))
            .await
            .unwrap();
            let p = tollgate_core::json::parse_str("{}").unwrap();
            assert!(c.pre_exec("search", &p, 0.0).await.allowed());
        });
    // The socket is never reachable with the umask's mode: bound in a private
    // directory, given its mode, then moved into place.
    assert_eq!(mode(&socket), 0o660, "socket");
    assert!(daemon.terminate().success());

    let expect = [
        (dir.clone(), 0o750),
        (dir.join("state.redb"), 0o640),
        (dir.join("audit"), 0o750),
        (dir.join("audit/checkpoint"), 0o640),
        (dir.join("audit.key"), 0o600),
        (dir.join("audit.pub"), 0o644),
        (dir.join("secrets"), 0o700),
        (dir.join("secrets/default.secret"), 0o600),
        (dir.join("secrets/default.operator.secret"), 0o600),
        (tmp.path().join("run"), 0o755),
        (tmp.path().join("run/tollgate"), 0o755),
    ];
    for (p, m) in expect {
        assert_eq!(mode(&p), m, "{} is {:04o}", p.display(), mode(&p));
    }
    for f in tollgate_audit::files::list_log_files(&dir.join("audit")).unwrap() {
        assert_eq!(mode(&f.path), 0o640, "{}", f.path.display());
    }
}

/// Run `tollgate args...` for at most `secs`; `None` if it was still running (then killed).
fn run_briefly(args: &[&str], secs: u64) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

#[test]
fn a_state_file_others_may_write_is_not_trusted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let daemon = Serve::start_with(dir, &[]);
    assert!(daemon.terminate().success());

    std::fs::set_permissions(
        dir.join("state.redb"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let out = run_briefly(&["serve", "--data-dir", s(dir)], 20)
        .expect("the daemon started on a state file anyone may write");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("may be written by users other than its owner (mode 0666)"),
        "{err}"
    );
    assert!(err.contains("chmod 0640"), "the remedy: {err}");

    std::fs::set_permissions(
        dir.join("state.redb"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = run_briefly(&["serve", "--data-dir", s(dir)], 20)
        .expect("the daemon started in a data directory anyone may write");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("may be written by any user (mode 0777)"),
        "{err}"
    );
    assert!(err.contains("chmod o-w"), "the remedy: {err}");
}

/// A daemon on `dir` that registers a session and decides one call, then stops.
fn some_history(dir: &Path) {
    let daemon = Serve::start_with(dir, &[]);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let secret = std::fs::read_to_string(dir.join("secrets/default.secret")).unwrap();
            let c = DaemonClient::connect(ClientConfig::new(
                dir.join("tollgate.sock"),
                "default",
                secret.trim().as_bytes(),
                "history",
            ))
            .await
            .unwrap();
            let p = tollgate_core::json::parse_str("{}").unwrap();
            assert!(c.pre_exec("search", &p, 0.0).await.allowed());
        });
    assert!(daemon.terminate().success());
}

#[test]
fn a_snapshot_that_disagrees_with_the_log_says_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    some_history(dir);
    // The log replaced by another one (a restore of the wrong backup): the snapshot's
    // position does not link into it.
    let other = tempfile::tempdir().unwrap();
    some_history(other.path());
    some_history(other.path());
    std::fs::remove_dir_all(dir.join("audit")).unwrap();
    std::fs::rename(other.path().join("audit"), dir.join("audit")).unwrap();
    std::fs::copy(other.path().join("audit.key"), dir.join("audit.key")).unwrap();
    let out = run_briefly(&["serve", "--data-dir", s(dir)], 20)
        .expect("the daemon started on a snapshot of another log");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("disagree"), "{err}");
    assert!(err.contains("tollgate audit verify"), "the remedy: {err}");
    assert!(
        err.contains("move") && err.contains("state.redb"),
        "the remedy: {err}"
    );
}

/// Run `tollgate args...` with its standard output a pipe whose reading end is already
/// closed: its first write fails with EPIPE.
fn into_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn commands_stop_quietly_when_their_output_is_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // A log to read.
    let key = dir.join("audit.key");
    let public = dir.join("audit.pub");
    let out = crate::tollgate(&["keygen", "--out", s(dir)]);
    assert!(out.status.success(), "{}", crate::text(&out));
    let log = dir.join("log");
    let out = crate::tollgate(&[
        "audit",
        "demo-write",
        "--dir",
        s(&log),
        "--key",
        s(&key),
        "--count",
        "300",
    ]);
    assert!(out.status.success(), "{}", crate::text(&out));
    let doc = dir.join("doc.json");
    std::fs::write(&doc, r#"{"b":1,"a":[1,2]}"#).unwrap();
    let vectors = repo("tests/data/sp1");
    let fixture = repo("crates/tollgate-board/tests/data/board/valid/v01-delegate-example.json");
    let commands: Vec<Vec<&str>> = vec![
        vec!["audit", "verify", "--key", s(&public), s(&log)],
        vec![
            "audit",
            "export",
            "--format",
            "jsonl",
            "--key",
            s(&public),
            s(&log),
        ],
        vec![
            "audit",
            "export",
            "--format",
            "csv",
            "--key",
            s(&public),
            s(&log),
        ],
        vec!["audit", "checkpoint", s(&log)],
        vec!["canonical", s(&doc)],
        vec!["conformance", s(&vectors)],
        vec!["board", "check", s(&fixture)],
        vec!["operator-token", "--id", "alice"],
        vec!["keygen", "--out", s(dir), "--name", "other"],
        vec!["--help"],
        vec!["--version"],
        vec!["audit", "--help"],
    ];
    for args in commands {
        let out = into_closed_pipe(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("panicked"),
            "tollgate {args:?} panicked: {err}"
        );
        assert!(err.is_empty(), "tollgate {args:?} wrote to stderr: {err}");
        assert!(
            matches!(out.status.code(), Some(141) | Some(0)),
            "tollgate {args:?}: {:?}",
            out.status
        );
    }
}

#[test]
fn audit_verify_into_head_exits_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let key = dir.join("audit.key");
    assert!(crate::tollgate(&["keygen", "--out", s(dir)])
        .status
        .success());
    let log = dir.join("log");
    assert!(crate::tollgate(&[
        "audit",
        "demo-write",
        "--dir",
        s(&log),
        "--key",
        s(&key),
        "--count",
        "2000",
    ])
    .status
    .success());
    // What a user types, in a real shell pipeline: head closes the pipe after one line.
    for sub in ["verify", "export --format jsonl"] {
        let script = format!(
            "'{}' audit {sub} --key '{}' '{}' 2>'{}' | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}",
            env!("CARGO_BIN_EXE_tollgate"),
            s(&dir.join("audit.pub")),
            s(&log),
            s(&dir.join("err"))
        );
        let out = Command::new("bash").args(["-c", &script]).output().unwrap();
        let status = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let err = std::fs::read_to_string(dir.join("err")).unwrap();
        assert!(err.is_empty(), "audit {sub} | head -1: {err}");
        assert!(
            status == "0" || status == "141",
            "audit {sub} | head -1: {status}"
        );
    }
}

/// `sh -c SCRIPT` until it exits (or `secs` pass: then it is killed), with its output.
fn sh_briefly(script: &str, secs: u64) -> Option<Output> {
    let mut child = Command::new("sh")
        .args(["-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

/// Issue 15 §4: a daemon killed by a file-size limit while generating its secrets leaves
/// no empty secret, and the next start generates whole ones: a registration sealed with an
/// empty secret is never served.
#[test]
fn a_file_size_limit_never_leaves_an_empty_secret() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let socket = tmp.path().join("t.sock");
    let script = format!(
        "ulimit -f 0; exec '{}' serve --data-dir '{}' --socket '{}'",
        env!("CARGO_BIN_EXE_tollgate"),
        s(&dir),
        s(&socket)
    );
    let out = sh_briefly(&script, 20).expect("serve ran under `ulimit -f 0`");
    assert!(!out.status.success(), "serve cannot start without writing");
    for name in ["default.secret", "default.operator.secret"] {
        let p = dir.join("secrets").join(name);
        if let Ok(m) = std::fs::metadata(&p) {
            assert!(m.len() >= 16, "{} is {} bytes", p.display(), m.len());
        }
    }
    if let Ok(m) = std::fs::metadata(dir.join("audit.key")) {
        assert!(m.len() > 0, "an empty audit key was left");
    }

    // The restart generates whole secrets, mode 0600, and only they are accepted.
    let daemon = Serve::start_command_at(
        &dir,
        &socket,
        Command::new(env!("CARGO_BIN_EXE_tollgate")).args([
            "serve",
            "--data-dir",
            s(&dir),
            "--socket",
            s(&socket),
        ]),
    );
    let secret_file = dir.join("secrets/default.secret");
    let secret = std::fs::read_to_string(&secret_file).unwrap();
    assert_eq!(secret.trim().len(), 64, "{secret:?}");
    assert_eq!(mode(&secret_file), 0o600);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let empty =
                DaemonClient::connect(ClientConfig::new(&socket, "default", b"", "bot")).await;
            assert!(
                matches!(
                    empty,
                    Err(tollgate_client::ClientError::Refused {
                        code: tollgate_proto::sp1::ErrorCode::AuthenticationFailed,
                        ..
                    })
                ),
                "{:?}",
                empty.map(|c| c.session_id().to_owned())
            );
            DaemonClient::connect(ClientConfig::new(
                &socket,
                "default",
                secret.trim().as_bytes(),
                "bot",
            ))
            .await
            .unwrap();
        });
    assert!(daemon.terminate().success());
    let leftovers: Vec<_> = std::fs::read_dir(dir.join("secrets"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Issue 15 §4: a secret file shorter than 16 bytes (an empty one left by an older
/// version, a cut copy) stops the daemon at start, naming the file; so does a configured
/// `secret_file` that short.
#[test]
fn a_short_secret_file_stops_the_daemon_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    std::fs::create_dir_all(dir.join("secrets")).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    for text in ["", "\n", "0123456789abcde\n"] {
        let file = dir.join("secrets/default.secret");
        std::fs::write(&file, text).unwrap();
        let out = run_briefly(&["serve", "--data-dir", s(&dir)], 20)
            .unwrap_or_else(|| panic!("the daemon started with the secret {text:?}"));
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(s(&file)) && err.contains("at least 16"),
            "{text:?}: {err}"
        );
    }
    let short = tmp.path().join("short.secret");
    std::fs::write(&short, "tooshort\n").unwrap();
    let config = tmp.path().join("tollgate.toml");
    std::fs::write(
        &config,
        format!(
            "[[organization]]\nid = \"acme\"\nsecret_file = \"{}\"\n",
            s(&short)
        ),
    )
    .unwrap();
    let out = run_briefly(
        &["serve", "--config", s(&config), "--data-dir", s(&dir)],
        20,
    )
    .expect("the daemon started with a short configured secret");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(s(&short)) && err.contains("at least 16"),
        "{err}"
    );
}

/// Issue 15 §4, the operators' side: a generated operator-secret file cut short
/// (`secrets/<org>.operator.secret`, empty or 15 bytes) stops the daemon at start naming
/// that file, not the agents' secret beside it; so does a configured
/// `operator_secret_file` that short.
#[test]
fn a_short_operator_secret_file_stops_the_daemon_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    std::fs::create_dir_all(dir.join("secrets")).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    let agents = dir.join("secrets/default.secret");
    std::fs::write(&agents, format!("{}\n", "ab".repeat(32))).unwrap();
    let operators = dir.join("secrets/default.operator.secret");
    for text in ["", "0123456789abcde\n"] {
        std::fs::write(&operators, text).unwrap();
        let out = run_briefly(&["serve", "--data-dir", s(&dir)], 20)
            .unwrap_or_else(|| panic!("the daemon started with the operator secret {text:?}"));
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(s(&operators)) && err.contains("at least 16"),
            "{text:?}: {err}"
        );
        assert!(!err.contains(s(&agents)), "{err}");
    }
    let short = tmp.path().join("operators.secret");
    std::fs::write(&short, "tooshort\n").unwrap();
    let config = tmp.path().join("tollgate.toml");
    std::fs::write(
        &config,
        format!(
            "[[organization]]\nid = \"acme\"\nsecret = \"an agents' secret of some length\"\n\
             operator_secret_file = \"{}\"\n",
            s(&short)
        ),
    )
    .unwrap();
    let out = run_briefly(
        &["serve", "--config", s(&config), "--data-dir", s(&dir)],
        20,
    )
    .expect("the daemon started with a short configured operator secret");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(s(&short)) && err.contains("at least 16"),
        "{err}"
    );
}
