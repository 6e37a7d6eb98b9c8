//! `tollgate bench` with tiny loads: its own daemon as a separate process (the default),
//! in process, and an external `tollgate serve`; history mode's rows; post_exec
//! settlements in the audit log; heartbeats; a daemon that cannot start. No assertion
//! here is about speed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{code, s, stdout, text, tollgate};

/// The report's lines that start with `prefix`.
fn lines<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix)).collect()
}

/// The number after `key ` on the `sessions ...` line (`requests`, `denied`).
fn count(out: &str, key: &str) -> u64 {
    let line = lines(out, "sessions ")[0];
    let after = line.split(&format!("{key} ")).nth(1).unwrap();
    after.split_whitespace().next().unwrap().parse().unwrap()
}

fn ok(o: &Output) -> String {
    assert_eq!(code(o), 0, "{}", text(o));
    stdout(o)
}

#[test]
fn the_default_runs_serve_as_a_separate_process_and_stops_it() {
    let o = tollgate(&[
        "bench",
        "--sessions",
        "2",
        "--concurrency",
        "2",
        "--duration",
        "1",
    ]);
    let out = ok(&o);
    let first = out.lines().next().unwrap();
    let prefix = "mode: separate process: `tollgate serve` (pid ";
    assert!(first.starts_with(prefix), "{out}");
    let pid: u32 = first[prefix.len()..]
        .split(')')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // The bench waited for its daemon: the process is gone, not a zombie.
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "{out}");
    assert_eq!(lines(&out, "throughput ").len(), 1, "{out}");
    assert!(out.contains(" pre_exec/s (each verdict signed, audited and fsync'd"));
    assert_eq!(lines(&out, "latency us: p50 ").len(), 1, "{out}");
    assert_eq!(lines(&out, "calls per session: ").len(), 1, "{out}");
    assert_eq!(count(&out, "denied"), 0, "{out}");
    assert!(lines(&out, "mark ").is_empty(), "{out}");
}

#[test]
fn history_mode_prints_one_row_per_mark() {
    let o = tollgate(&[
        "bench",
        "--sessions",
        "2",
        "--concurrency",
        "2",
        "--calls-per-session",
        "300",
        "--marks",
        "300,100",
        "--fsync",
        "never",
    ]);
    let out = ok(&o);
    assert!(out.starts_with("mode: separate process: "), "{out}");
    assert_eq!(
        lines(&out, "calls per session: "),
        ["calls per session: 300"]
    );
    assert_eq!(count(&out, "requests"), 600, "{out}");
    let rows = lines(&out, "mark ");
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows[0].starts_with("mark 100  window 10/session  calls 20  throughput "),
        "{out}"
    );
    assert!(
        rows[1].starts_with("mark 300  window 30/session  calls 60  throughput "),
        "{out}"
    );
    for row in rows {
        assert!(
            row.contains(" pre_exec/s  p50 ") && row.ends_with(" us"),
            "{row}"
        );
    }
    // The total report is still there.
    assert_eq!(lines(&out, "throughput ").len(), 1, "{out}");
    assert_eq!(lines(&out, "latency us: p50 ").len(), 1, "{out}");
}

#[test]
fn history_mode_marks_by_default_are_the_powers_of_ten_and_n() {
    let o = tollgate(&[
        "bench",
        "--in-process",
        "--sessions",
        "1",
        "--calls-per-session",
        "1500",
        "--fsync",
        "never",
    ]);
    let out = ok(&o);
    let rows: Vec<&str> = lines(&out, "mark ")
        .into_iter()
        .map(|r| r.split("  throughput").next().unwrap())
        .collect();
    assert_eq!(
        rows,
        [
            "mark 1000  window 100/session  calls 100",
            "mark 1500  window 150/session  calls 150"
        ],
        "{out}"
    );
}

#[test]
fn marks_beyond_the_run_are_refused() {
    let o = tollgate(&["bench", "--calls-per-session", "300", "--marks", "100,301"]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(
        text(&o).contains("--marks: `301` is not between 1 and --calls-per-session (300)"),
        "{}",
        text(&o)
    );
    let o = tollgate(&["bench", "--marks", "100"]);
    assert_eq!(
        code(&o),
        2,
        "--marks needs --calls-per-session: {}",
        text(&o)
    );
}

#[test]
fn in_process_still_works() {
    let o = tollgate(&[
        "bench",
        "--in-process",
        "--sessions",
        "2",
        "--concurrency",
        "2",
        "--duration",
        "1",
    ]);
    let out = ok(&o);
    assert!(
        out.starts_with("mode: in-process: the daemon runs in the load generator's process\n"),
        "{out}"
    );
    assert_eq!(lines(&out, "throughput ").len(), 1, "{out}");
    assert_eq!(count(&out, "denied"), 0, "{out}");
}

/// The bench's own daemon cannot bind a socket path longer than a Unix socket allows:
/// `serve` exits, and the bench says so with the daemon's own words.
#[test]
fn a_daemon_that_never_listens_is_an_error_showing_its_output() {
    let tmp = tempfile::tempdir().unwrap();
    let long = tmp.path().join("d".repeat(100)).join("e".repeat(30));
    std::fs::create_dir_all(&long).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["bench", "--sessions", "1", "--duration", "1"])
        .env("TMPDIR", &long)
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("`tollgate serve` exited"), "{err}");
    assert!(err.contains("before listening on"), "{err}");
    assert!(
        err.contains("binding `"),
        "the daemon's error is shown: {err}"
    );
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}

/// A `tollgate serve` started by the test, with a configuration.
struct Serve {
    child: Child,
    dir: PathBuf,
}

impl Serve {
    fn start(dir: &Path, config: &str) -> Serve {
        let file = dir.join("serve.toml");
        std::fs::write(&file, config).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--config", s(&file), "--data-dir", s(dir)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(dir.join("tollgate.sock")).is_err() {
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

    fn bench(&self, extra: &[&str]) -> Output {
        let socket = self.dir.join("tollgate.sock");
        let secret = self.dir.join("secrets/default.secret");
        let mut args = vec!["bench", "--socket", s(&socket), "--secret-file", s(&secret)];
        args.extend_from_slice(extra);
        tollgate(&args)
    }

    fn terminate(mut self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let t = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(t.elapsed() < Duration::from_secs(20), "daemon did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Rate limits out of the way (the embedded default is 1000 pre_exec/s per session).
const UNLIMITED: &str = "[limits]\npre_exec_per_second_per_session = 1000000\n";

/// `--post-exec` sends a post_exec after every ALLOW: the daemon's audit log holds one
/// settlement per verdict.
#[test]
fn post_exec_puts_a_settlement_after_every_allowed_verdict_in_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start(tmp.path(), UNLIMITED);
    let o = serve.bench(&[
        "--sessions",
        "2",
        "--concurrency",
        "2",
        "--calls-per-session",
        "20",
        "--post-exec",
    ]);
    let out = ok(&o);
    let socket = tmp.path().join("tollgate.sock");
    assert_eq!(
        out.lines().next().unwrap(),
        format!(
            "mode: external daemon at {} (as it is configured)",
            socket.display()
        )
    );
    assert!(
        out.contains("\nload: pre_exec, and after every ALLOW its post_exec"),
        "{out}"
    );
    assert_eq!(count(&out, "denied"), 0, "{out}");
    assert_eq!(
        lines(&out, "post_exec sent "),
        ["post_exec sent 40  failed to send 0"],
        "{out}"
    );
    serve.terminate();
    let export = tollgate(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        s(&tmp.path().join("audit")),
    ]);
    let log = ok(&export);
    let kinds = |kind: &str| {
        log.lines()
            .filter(|l| l.contains(&format!(r#""kind":"{kind}""#)))
            .count()
    };
    assert_eq!((kinds("verdict"), kinds("settlement")), (40, 40), "{log}");
}

/// Sessions heartbeat while they run. Against a daemon that marks a session STALE after
/// one missed 2-second interval, a 4-second run is refused (fail closed) without
/// heartbeats often enough, and never with them (every 200 ms: a stall of 1.8 s would be
/// needed to miss one).
#[test]
fn sessions_heartbeat_so_a_long_run_does_not_go_stale() {
    let tmp = tempfile::tempdir().unwrap();
    let config =
        format!("{UNLIMITED}heartbeat_interval_secs = 2\nmissed_heartbeats_for_stale = 1\n");
    let serve = Serve::start(tmp.path(), &config);
    let run = |extra: &[&str]| {
        let mut args = vec!["--sessions", "1", "--duration", "4"];
        args.extend_from_slice(extra);
        ok(&serve.bench(&args))
    };
    let beating = run(&["--heartbeat-ms", "200"]);
    assert_eq!(count(&beating, "denied"), 0, "{beating}");
    let silent = run(&[]);
    assert!(count(&silent, "denied") > 0, "{silent}");
    assert!(
        silent.contains("(first: fail_closed:session_stale)"),
        "{silent}"
    );
    serve.terminate();
}

/// `--grpc`: the same load over the bench's own daemon's gRPC binding with mutual TLS,
/// separate process and in process, post_exec included; nothing is denied.
#[test]
fn grpc_sends_the_load_over_mutual_tls() {
    for extra in [&[][..], &["--in-process"][..]] {
        let mut args = vec![
            "bench",
            "--grpc",
            "--post-exec",
            "--sessions",
            "2",
            "--concurrency",
            "2",
            "--duration",
            "1",
        ];
        args.extend_from_slice(extra);
        let out = ok(&tollgate(&args));
        let transport = lines(&out, "transport: ");
        assert_eq!(transport.len(), 1, "{out}");
        assert!(
            transport[0].starts_with("transport: gRPC with mutual TLS at 127.0.0.1:"),
            "{out}"
        );
        assert!(count(&out, "requests") > 0, "{out}");
        assert_eq!(count(&out, "denied"), 0, "{out}");
    }
    // Without it, the socket.
    let out = ok(&tollgate(&[
        "bench",
        "--sessions",
        "1",
        "--concurrency",
        "1",
        "--duration",
        "1",
    ]));
    assert_eq!(
        lines(&out, "transport: "),
        ["transport: Unix socket (one connection per session)"]
    );
}

/// `tollgate soak` end to end, small: every session opened is ended (closed by its agent,
/// or idle), none fails, and the live ones never pass the bound it reports.
#[test]
fn soak_opens_and_ends_sessions_within_the_live_bound() {
    let o = tollgate(&[
        "soak",
        "--sessions",
        "60",
        "--live",
        "8",
        "--concurrency",
        "4",
        "--abandon",
        "5",
        "--idle-secs",
        "2",
        "--every",
        "20",
    ]);
    let out = ok(&o);
    assert!(
        out.contains("soak: 60 sessions in") && out.contains("0 calls denied, 0 requests failed"),
        "{out}"
    );
    // Every row's live column is within the bound.
    for row in out.lines().filter(|l| {
        l.split_whitespace().count() == 6
            && l.split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<u64>().is_ok())
    }) {
        let live: u64 = row.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert!(live <= 8, "{row}");
    }
}
