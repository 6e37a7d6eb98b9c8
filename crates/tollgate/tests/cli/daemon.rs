//! `tollgate serve` as a real process: embedded defaults, `tollgate hitl`, kill -9 and
//! restart with state intact, SIGTERM for a graceful stop, then `tollgate audit verify`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::{json, Verdict};

use crate::{code, s, text, tollgate};

pub(crate) struct Serve {
    pub(crate) child: Child,
    dir: PathBuf,
}

impl Serve {
    fn start(dir: &Path) -> Serve {
        Serve::start_with(dir, &[])
    }

    pub(crate) fn start_with(dir: &Path, extra: &[&str]) -> Serve {
        Serve::start_command(
            dir,
            Command::new(env!("CARGO_BIN_EXE_tollgate"))
                .args(["serve", "--data-dir", s(dir)])
                .args(extra),
        )
    }

    /// Start `command` (a `tollgate serve` for `dir`, perhaps under a wrapper) and wait
    /// for its socket.
    pub(crate) fn start_command(dir: &Path, command: &mut Command) -> Serve {
        Serve::start_command_at(dir, &dir.join("tollgate.sock"), command)
    }

    /// [`Serve::start_with`], its standard error (its log) appended to the file `log`.
    pub(crate) fn start_logged(dir: &Path, extra: &[&str], log: &Path) -> Serve {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        Serve::spawn_at(
            dir,
            &dir.join("tollgate.sock"),
            Command::new(env!("CARGO_BIN_EXE_tollgate"))
                .args(["serve", "--data-dir", s(dir)])
                .args(extra),
            log.into(),
        )
    }

    /// [`Serve::start_command`] for a daemon listening on `socket`.
    pub(crate) fn start_command_at(dir: &Path, socket: &Path, command: &mut Command) -> Serve {
        Serve::spawn_at(dir, socket, command, Stdio::null())
    }

    fn spawn_at(dir: &Path, socket: &Path, command: &mut Command, stderr: Stdio) -> Serve {
        let child = command
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Serve {
            child,
            dir: dir.to_owned(),
        }
    }

    pub(crate) fn client_config(&self, agent: &str) -> ClientConfig {
        let secret = std::fs::read_to_string(self.dir.join("secrets/default.secret")).unwrap();
        let mut c = ClientConfig::new(
            self.dir.join("tollgate.sock"),
            "default",
            secret.trim().as_bytes(),
            agent,
        );
        c.timeout = Duration::from_secs(5);
        c
    }

    /// What `serve` printed at start: its lines up to the `audit:` line, which is the last.
    pub(crate) fn banner(&mut self) -> String {
        let out = self.child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                let last = line.starts_with("  audit:");
                let _ = tx.send(line);
                if last {
                    return;
                }
            }
        });
        let mut banner = String::new();
        while let Ok(line) = rx.recv_timeout(Duration::from_secs(20)) {
            banner.push_str(&line);
            banner.push('\n');
        }
        banner
    }

    fn kill_9(mut self) {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
    }

    pub(crate) fn terminate(mut self) -> std::process::ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let t = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "daemon did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A daemon left running by a failed assertion is killed, not leaked.
impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn serve_hitl_kill_9_restart_sigterm_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let daemon = Serve::start(dir);
    // Embedded defaults created the secret (0600), the audit key (0600) and the socket (0660).
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.join("secrets/default.secret")), 0o600);
    assert_eq!(mode(&dir.join("audit.key")), 0o600);
    assert_eq!(mode(&dir.join("tollgate.sock")), 0o660);

    let rt = rt();
    let (spender, tripped, paused) = rt.block_on(async {
        let a = DaemonClient::connect(daemon.client_config("agent-a"))
            .await
            .unwrap();
        let v = a
            .pre_exec("search", &json::parse_str(r#"{"q":1}"#).unwrap(), 0.25)
            .await;
        assert!(v.allowed(), "{v:?}");
        let b = DaemonClient::connect(daemon.client_config("agent-b"))
            .await
            .unwrap();
        let v = b
            .pre_exec("buy", &json::parse_str("{}").unwrap(), 9.0)
            .await;
        assert_eq!(v.reason, "budget_overrun");
        let c = DaemonClient::connect(daemon.client_config("agent-c"))
            .await
            .unwrap();
        let opaque = json::parse_str(r#"{"ctx":"opaque"}"#).unwrap();
        let v = c.pre_exec("read", &opaque, 0.0).await;
        assert_eq!(
            (v.verdict, v.reason.as_str()),
            (Verdict::Hitl, "fail_closed:opaque_context")
        );
        (
            a.session_id().to_owned(),
            b.session_id().to_owned(),
            c.session_id().to_owned(),
        )
    });

    // The operator sees the pending decision.
    let list = tollgate(&["hitl", "list", "--data-dir", s(dir)]);
    assert_eq!(code(&list), 0, "{}", text(&list));
    assert!(text(&list).contains(&paused), "{}", text(&list));
    assert!(text(&list).contains("tool=read"), "{}", text(&list));

    // kill -9, restart: everything acknowledged is still there.
    daemon.kill_9();
    let daemon = Serve::start(dir);
    rt.block_on(async {
        let o = DaemonClient::connect(daemon.client_config("observer"))
            .await
            .unwrap();
        let a = o.state_of(&spender).await.unwrap();
        assert_eq!((a.budget_remaining_nanos, a.total_calls), (750_000_000, 1));
        let b = o.state_of(&tripped).await.unwrap();
        assert!(b.circuit_tripped);
        let c = o.state_of(&paused).await.unwrap();
        assert_eq!(c.pending_transition.unwrap().tool_name, "read");
    });

    let decide = tollgate(&[
        "hitl",
        "decide",
        "--data-dir",
        s(dir),
        &paused,
        "reject",
        "--operator",
        "carol",
        "--note",
        "opaque context: ask the agent's owner first",
    ]);
    assert_eq!(code(&decide), 0, "{}", text(&decide));
    assert!(
        text(&decide).contains("reject recorded by carol"),
        "{}",
        text(&decide)
    );
    let again = tollgate(&[
        "hitl",
        "decide",
        "--data-dir",
        s(dir),
        &paused,
        "approve",
        "--operator",
        "dave",
    ]);
    assert_eq!(
        code(&again),
        2,
        "a decided transition cannot be decided again: {}",
        text(&again)
    );

    // SIGTERM: a clean stop, the socket removed, the log whole and verifiable by anyone.
    let status = daemon.terminate();
    assert!(status.success(), "{status:?}");
    assert!(!dir.join("tollgate.sock").exists());
    let verify = tollgate(&[
        "audit",
        "verify",
        "--key",
        s(&dir.join("audit.pub")),
        s(&dir.join("audit")),
    ]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));
    // The human's words from the command line are in the signed record and the export
    // (issue 16 §5).
    let export = tollgate(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        "--key",
        s(&dir.join("audit.pub")),
        s(&dir.join("audit")),
    ]);
    assert_eq!(code(&export), 0, "{}", text(&export));
    let decided: Vec<&str> = std::str::from_utf8(&export.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.contains(r#""kind":"human_decision""#))
        .collect();
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert!(
        decided[0].contains(r#""note":"opaque context: ask the agent's owner first""#)
            && decided[0].contains(r#""operator_id":"carol""#),
        "{}",
        decided[0]
    );
}

/// `serve` prints where each organization's agents' secret and operator secret are: the
/// generated files' paths, or the configuration file that sets them; never a value.
#[test]
fn serve_prints_where_both_secrets_are() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("embedded");
    let mut daemon = Serve::start(&dir);
    let banner = daemon.banner();
    let agents = dir.join("secrets/default.secret");
    let operators = dir.join("secrets/default.operator.secret");
    for want in [
        "  organization `default`:".to_owned(),
        format!("    agents' secret: {}", agents.display()),
        format!("    operator secret: {}", operators.display()),
    ] {
        assert!(banner.contains(&want), "missing `{want}` in:\n{banner}");
    }
    for secret in [&agents, &operators] {
        let value = std::fs::read_to_string(secret).unwrap();
        assert!(!banner.contains(value.trim()), "a secret was printed");
    }
    assert!(daemon.terminate().success());

    // A configured organization: its agents' secret is in the file, its operator secret
    // generated; and no `default` organization is made beside it.
    let dir = tmp.path().join("configured");
    let file = tmp.path().join("tollgate.toml");
    std::fs::write(
        &file,
        "[[organization]]\nid = \"acme\"\nsecret = \"an agents' secret of some length\"\n",
    )
    .unwrap();
    let mut daemon = Serve::start_with(&dir, &["--config", s(&file)]);
    let banner = daemon.banner();
    for want in [
        "  organization `acme`:".to_owned(),
        format!(
            "    agents' secret: in the configuration file {}",
            file.display()
        ),
        format!(
            "    operator secret: {}",
            dir.join("secrets/acme.operator.secret").display()
        ),
    ] {
        assert!(banner.contains(&want), "missing `{want}` in:\n{banner}");
    }
    assert!(
        !banner.contains("an agents' secret"),
        "a secret was printed"
    );
    assert!(!banner.contains("`default`"), "{banner}");
    assert!(daemon.terminate().success());
}

/// Issue 15 §3: without enrollment, agent ids are claims. `serve` says so at start when
/// per-agent guards (or `per_agent` budgets) are configured for an organization that does
/// not enroll those agents; with the agents enrolled and enrollment required, it does not.
#[test]
fn serve_warns_when_per_agent_guards_rest_on_claimed_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let guards = "[guard.default]\nbudget_scope = \"per_agent\"\n\
                  [guard.agents.research-bot]\nhitl_mode = \"always\"\n\
                  [[organization]]\nid = \"acme\"\nsecret = \"an agents' secret of some length\"\n";
    let claimed = "WARNING: organization `acme`: the per-agent guards of `research-bot` apply to \
                   claimed agent ids, not enrolled agents";
    let fresh = "WARNING: organization `acme`: per_agent budgets are kept per claimed agent id";
    let enrolled = "require_enrollment = true\n[[organization.agent]]\nid = \"research-bot\"\n\
                    secret = \"research-bot's own secret\"\n";
    for (name, extra, warned) in [("claims", "", true), ("enrolled", enrolled, false)] {
        let dir = tmp.path().join(name);
        let file = tmp.path().join(format!("{name}.toml"));
        std::fs::write(&file, format!("{guards}{extra}")).unwrap();
        let mut daemon = Serve::start_with(&dir, &["--config", s(&file)]);
        let banner = daemon.banner();
        for want in [claimed, fresh] {
            assert_eq!(
                banner.contains(want),
                warned,
                "{name}: `{want}` in:\n{banner}"
            );
        }
        assert!(daemon.terminate().success());
    }
}

#[test]
fn demo_runs_appendix_a_as_written() {
    let out = tollgate(&["demo"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let t = text(&out);
    for want in [
        "PRE_EXEC_RESPONSE(verdict=ALLOW, reason=within_thresholds, budget_remaining=0.498, repeat_count=0)",
        "PRE_EXEC_RESPONSE(verdict=ALLOW, reason=within_thresholds, budget_remaining=0.496, repeat_count=1)",
        "PRE_EXEC_RESPONSE(verdict=DENY, reason=max_repeat_exceeded, budget_remaining=0.494, repeat_count=3)",
        "any further call -> DENY circuit_open",
        "audit log verified with the public key: 9 entries: 1 session opened, 5 verdicts",
        "3 settlements [1 charged 0.002; 2 charged 0.002; 3 charged 0.002]",
        "Appendix A flow: as written",
    ] {
        assert!(t.contains(want), "missing `{want}` in:\n{t}");
    }
}

#[test]
fn a_broken_audit_log_stops_serve_with_its_cause_said_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("audit")).unwrap();
    std::fs::write(dir.join("audit/audit-00000000-20261201.log"), b"garbage").unwrap();
    let out = tollgate(&["serve", "--data-dir", s(dir)]);
    assert_eq!(code(&out), 2);
    let t = text(&out);
    let cause = "file is shorter than a header";
    assert_eq!(t.matches(cause).count(), 1, "{t}");
    assert!(t.contains("opening the audit log"), "{t}");
}

/// Issue 19 through the real binary: `tollgate serve` with `[audit] params = "redacted"`
/// and a `@shadow` forbid. The forbidden call is ALLOWed and its exported entry names the
/// would-be DENY; the secrets in a call's params are nowhere in the log's bytes; `audit
/// verify` passes; and the original params, canonicalized by `tollgate canonical --hash`,
/// hash to the exported `params_hash`.
#[test]
fn serve_records_shadow_verdicts_and_redacted_params_that_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("shadow.cedar"),
        "@id(\"no-pay\") @shadow forbid (principal, action == Action::\"pay\", resource);\n",
    )
    .unwrap();
    let config = dir.join("tollgate.toml");
    std::fs::write(
        &config,
        "[audit]\nparams = \"redacted\"\nredact = [\"card.number\"]\n\n[policy]\nfiles = [\"shadow.cedar\"]\n",
    )
    .unwrap();
    let original = r#"{"headers": {"Authorization": "Bearer tok-9f8e7d6c5b4a"}, "api_key": "key-0a1b2c3d4e",
        "card": {"number": "5500-0000-0000-0004", "brand": "mc"}, "url": "https://example.test/x"}"#;
    std::fs::write(dir.join("original.json"), original).unwrap();
    let daemon = Serve::start_with(dir, &["--config", s(&config)]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let agent = DaemonClient::connect(daemon.client_config("bot"))
            .await
            .unwrap();
        let v = agent
            .pre_exec("http_get", &json::parse_str(original).unwrap(), 0.0)
            .await;
        assert!(v.allowed(), "{v:?}");
        let v = agent
            .pre_exec("pay", &json::parse_str(r#"{"amount":3}"#).unwrap(), 0.0)
            .await;
        assert_eq!(v.verdict, Verdict::Allow, "{v:?}");
    });
    assert!(daemon.terminate().success());

    let verify = tollgate(&[
        "audit",
        "verify",
        "--key",
        s(&dir.join("audit.pub")),
        s(&dir.join("audit")),
    ]);
    assert_eq!(code(&verify), 0, "{}", text(&verify));
    for e in std::fs::read_dir(dir.join("audit")).unwrap() {
        let bytes = std::fs::read(e.unwrap().path()).unwrap();
        for secret in ["tok-9f8e7d6c5b4a", "key-0a1b2c3d4e", "5500-0000-0000-0004"] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{secret} is in the log"
            );
        }
    }
    let export = tollgate(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        "--key",
        s(&dir.join("audit.pub")),
        s(&dir.join("audit")),
    ]);
    assert_eq!(code(&export), 0, "{}", text(&export));
    let rows: Vec<json::Value> = std::str::from_utf8(&export.stdout)
        .unwrap()
        .lines()
        .map(|l| json::parse_str(l).unwrap())
        .collect();
    let field = |row: &json::Value, k: &str| -> String {
        let json::Value::Object(m) = row else {
            panic!()
        };
        match m.get(k) {
            Some(json::Value::String(s)) => s.clone(),
            Some(json::Value::Number(n)) => format!("{n:?}"),
            other => format!("{other:?}"),
        }
    };
    let row = |tool: &str| {
        rows.iter()
            .find(|r| field(r, "tool_name") == tool)
            .unwrap()
            .clone()
    };
    let get = row("http_get");
    assert_eq!(field(&get, "params_mode"), "redacted");
    let recorded = field(&get, "params");
    assert!(
        recorded.contains("[REDACTED]") && recorded.contains("https://example.test/x"),
        "{recorded}"
    );
    let hashed = tollgate(&["canonical", "--hash", s(&dir.join("original.json"))]);
    assert_eq!(code(&hashed), 0, "{}", text(&hashed));
    assert_eq!(crate::stdout(&hashed).trim(), field(&get, "params_hash"));
    let pay = row("pay");
    assert_eq!(field(&pay, "verdict"), "ALLOW");
    assert_eq!(field(&pay, "shadow"), "no-pay=DENY(policy:no-pay)");
}
