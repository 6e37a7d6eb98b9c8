//! `tollgate keygen` and `tollgate audit`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tollgate_audit::format::{parse_record, HEADER_LEN};

use crate::{code, s, text, tollgate};

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    log: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_owned();
        let o = tollgate(&["keygen", "--out", s(&root)]);
        assert_eq!(code(&o), 0, "{}", text(&o));
        let o = tollgate(&["keygen", "--out", s(&root), "--name", "other"]);
        assert_eq!(code(&o), 0, "{}", text(&o));
        let log = root.join("log");
        Fixture {
            _tmp: tmp,
            root,
            log,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn write(&self, count: u64) {
        let o = tollgate(&[
            "audit",
            "demo-write",
            "--dir",
            s(&self.log),
            "--key",
            s(&self.path("audit.key")),
            "--count",
            &count.to_string(),
        ]);
        assert_eq!(code(&o), 0, "{}", text(&o));
    }

    fn verify(&self, extra: &[&str]) -> Output {
        let key = self.path("audit.pub");
        let mut args = vec!["audit", "verify", "--key", s(&key)];
        args.extend_from_slice(extra);
        args.push(s(&self.log));
        tollgate(&args)
    }

    fn log_file(&self) -> PathBuf {
        let mut files: Vec<_> = fs::read_dir(&self.log)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        files.sort();
        files.pop().unwrap()
    }
}

fn spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut off = HEADER_LEN;
    while off < bytes.len() {
        let (_, n) = parse_record(&bytes[off..]).unwrap();
        out.push((off, n));
        off += n;
    }
    out
}

#[test]
fn keygen_writes_a_private_secret_and_refuses_to_overwrite() {
    let f = Fixture::new();
    let mode = |p: PathBuf| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(f.path("audit.key")), 0o600);
    assert_eq!(mode(f.path("audit.pub")), 0o644);
    let secret = fs::read_to_string(f.path("audit.key")).unwrap();
    assert!(secret.contains("tollgate-ed25519-secret-v1 "));
    let public = fs::read_to_string(f.path("audit.pub")).unwrap();
    assert!(public.contains("tollgate-ed25519-public-v1 "));
    let o = tollgate(&["keygen", "--out", s(&f.root)]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert_eq!(fs::read_to_string(f.path("audit.key")).unwrap(), secret);
    let o = tollgate(&["keygen", "--out", s(&f.root), "--force"]);
    assert_eq!(code(&o), 0);
    assert_ne!(fs::read_to_string(f.path("audit.key")).unwrap(), secret);
}

#[test]
fn verify_whole_then_tampered() {
    let f = Fixture::new();
    f.write(20);
    let o = f.verify(&[]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(text(&o).contains("ok: 20 entries"), "{}", text(&o));
    assert!(text(&o).contains("(trusted)"));

    let path = f.log_file();
    let mut bytes = fs::read(&path).unwrap();
    let (off, len) = spans(&bytes)[13];
    bytes[off + len - 1] ^= 0x20;
    fs::write(&path, &bytes).unwrap();
    let o = f.verify(&[]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("entry 13"), "{out}");
    assert!(out.contains("bad signature"), "{out}");
    assert!(out.contains(&format!("offset {off}")), "{out}");
}

#[test]
fn verify_with_another_key_is_unknown_key_and_without_one_warns() {
    let f = Fixture::new();
    f.write(3);
    let o = tollgate(&[
        "audit",
        "verify",
        "--key",
        s(&f.path("other.pub")),
        s(&f.log),
    ]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    assert!(text(&o).contains("unknown key"), "{}", text(&o));
    let o = tollgate(&["audit", "verify", s(&f.log)]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(text(&o).contains("NOT CHECKED"), "{}", text(&o));
}

#[test]
fn usage_and_io_errors_exit_2() {
    let f = Fixture::new();
    assert_eq!(code(&tollgate(&["audit", "verify"])), 2);
    let o = tollgate(&["audit", "verify", s(&f.path("nope"))]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    let o = tollgate(&["audit", "export", "--format", "xml", s(&f.log)]);
    assert_eq!(code(&o), 2);
}

#[test]
fn checkpoint_prints_and_catches_a_cut_tail() {
    let f = Fixture::new();
    f.write(10);
    let o = tollgate(&[
        "audit",
        "checkpoint",
        "--key",
        s(&f.path("audit.pub")),
        s(&f.log),
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let cp = String::from_utf8(o.stdout).unwrap();
    assert!(
        cp.starts_with("tollgate-audit-checkpoint-v1\ncount 10\n"),
        "{cp}"
    );
    let saved = f.path("saved.checkpoint");
    fs::write(&saved, &cp).unwrap();
    let o = tollgate(&[
        "audit",
        "checkpoint",
        "--key",
        s(&f.path("other.pub")),
        s(&saved),
    ]);
    assert_eq!(code(&o), 1, "{}", text(&o));

    assert_eq!(code(&f.verify(&["--checkpoint", s(&saved)])), 0);
    // Cut the last two whole records: only the checkpoint can tell.
    let path = f.log_file();
    let bytes = fs::read(&path).unwrap();
    let (off, _) = spans(&bytes)[8];
    fs::write(&path, &bytes[..off]).unwrap();
    assert_eq!(code(&f.verify(&[])), 0);
    let o = f.verify(&["--checkpoint", s(&saved)]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    assert!(
        text(&o).contains("truncated below checkpoint"),
        "{}",
        text(&o)
    );
}

#[test]
fn export_jsonl_and_csv_with_filters() {
    let f = Fixture::new();
    f.write(12);
    let key = f.path("audit.pub");
    let run = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["audit", "export", "--key", s(&key)];
        args.extend_from_slice(extra);
        args.push(s(&f.log));
        let o = tollgate(&args);
        assert_eq!(code(&o), 0, "{}", text(&o));
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let all = run(&["--format", "jsonl"]);
    assert_eq!(all.len(), 12);
    for line in &all {
        tollgate_core::json::parse_str(line).unwrap();
    }
    // demo-write: session s{i%3}, DENY when i%4==3 → s0 DENY at i=3, 15...; in 0..12: i=3.
    let denies_s0 = run(&["--format", "jsonl", "--session", "s0", "--verdict", "deny"]);
    assert_eq!(denies_s0.len(), 1, "{denies_s0:?}");
    assert!(denies_s0[0].contains("\"index\":3,"));
    // Entries are 1 ms apart from 2026-11-30T12:00:00Z.
    let window = run(&[
        "--format",
        "csv",
        "--since",
        "2026-11-30T12:00:00.002Z",
        "--until",
        "2026-11-30T12:00:00.005Z",
    ]);
    assert_eq!(window.len(), 4, "{window:?}");
    assert!(window[0].starts_with("index,chain_id,entry_id,time,"));
    assert!(window[1].starts_with("2,"));
    assert!(window[3].starts_with("4,"));
    let o = tollgate(&[
        "audit",
        "export",
        "--format",
        "csv",
        "--since",
        "yesterday",
        s(&f.log),
    ]);
    assert_eq!(code(&o), 2);
    // A broken log exports nothing.
    let path = f.log_file();
    let mut bytes = fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 1;
    fs::write(&path, &bytes).unwrap();
    let o = tollgate(&["audit", "export", "--format", "jsonl", s(&f.log)]);
    assert_eq!(code(&o), 1);
    assert!(o.stdout.is_empty());
}

#[test]
fn rotate_key_hands_over() {
    let f = Fixture::new();
    f.write(3);
    let o = tollgate(&[
        "audit",
        "rotate-key",
        "--dir",
        s(&f.log),
        "--key",
        s(&f.path("audit.key")),
        "--new-key",
        s(&f.path("other.key")),
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let o = tollgate(&[
        "audit",
        "demo-write",
        "--dir",
        s(&f.log),
        "--key",
        s(&f.path("other.key")),
        "--count",
        "2",
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    // The old key still anchors the log; the hand-over carries trust to the new one.
    let o = f.verify(&[]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(text(&o).contains("ok: 6 entries"), "{}", text(&o));
    // The old key can no longer append.
    let o = tollgate(&[
        "audit",
        "demo-write",
        "--dir",
        s(&f.log),
        "--key",
        s(&f.path("audit.key")),
    ]);
    assert_eq!(code(&o), 2, "{}", text(&o));
    assert!(text(&o).contains("hand-over"), "{}", text(&o));
}

#[test]
fn kill_9_mid_write_loses_nothing_whole() {
    let f = Fixture::new();
    for round in 0..3u64 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args([
                "audit",
                "demo-write",
                "--dir",
                s(&f.log),
                "--key",
                s(&f.path("audit.key")),
                "--forever",
                "--fsync",
                "never",
                "--rotate-bytes",
                "200000",
                "--pipeline",
                "64",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Let it write for a while (at least some records), then SIGKILL it.
        let start = Instant::now();
        let target = 4000 + round * 3000;
        while dir_bytes(&f.log) < target && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(7 * round));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Whatever it left is either whole or ends in a torn record, nothing else.
        let o = f.verify(&[]);
        let out = text(&o);
        assert!(
            code(&o) == 0 || (code(&o) == 1 && out.contains("torn record")),
            "{out}"
        );
        let before = entries_in(&f);
        if round == 1 {
            // A kill rarely tears a write (the kernel finishes it); a power cut does.
            // Leave the first half of a record at the end, as a power cut would.
            let path = f.log_file();
            let bytes = fs::read(&path).unwrap();
            let (off, len) = *spans(&bytes).last().unwrap();
            let mut damaged = bytes.clone();
            damaged.extend_from_slice(&bytes[off..off + len / 2]);
            fs::write(&path, &damaged).unwrap();
            let o = f.verify(&[]);
            assert_eq!(code(&o), 1);
            assert!(text(&o).contains("torn record"), "{}", text(&o));
        }
        // Reopening recovers and continues the chain.
        let o = tollgate(&[
            "audit",
            "demo-write",
            "--dir",
            s(&f.log),
            "--key",
            s(&f.path("audit.key")),
            "--count",
            "5",
        ]);
        assert_eq!(code(&o), 0, "{}", text(&o));
        if round == 1 {
            assert!(text(&o).contains("recovered a torn tail"), "{}", text(&o));
        }
        let o = f.verify(&[]);
        assert_eq!(code(&o), 0, "{}", text(&o));
        let after = entries_in(&f);
        assert!(after >= before + 5, "{before} -> {after}");
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Whole entries present (verifying up to the first break).
fn entries_in(f: &Fixture) -> u64 {
    let mut n = 0;
    let _ = tollgate_audit::verify_paths(
        std::slice::from_ref(&f.log),
        &tollgate_audit::VerifyOptions::default(),
        &mut |_| n += 1,
    );
    n
}

/// The audit crate's version-2 known answer (one entry of each kind), in a directory of
/// its own, with the public key of its signer.
fn known_answer(f: &Fixture) -> (PathBuf, PathBuf) {
    let dir = f.path("ka");
    fs::create_dir_all(&dir).unwrap();
    fs::copy(
        crate::repo("crates/tollgate-audit/tests/data/known-answer.log"),
        dir.join("audit-00000000-20261130.log"),
    )
    .unwrap();
    let key = tollgate_audit::SigningKey::from_bytes(&[1; 32]);
    let public = f.path("ka.pub");
    fs::write(
        &public,
        tollgate_audit::keys::public_key_text(&key.verifying_key()),
    )
    .unwrap();
    (dir, public)
}

#[test]
fn export_writes_every_kind_with_its_fields() {
    let f = Fixture::new();
    let (dir, public) = known_answer(&f);
    let run = |format: &str| {
        let o = tollgate(&[
            "audit",
            "export",
            "--format",
            format,
            "--key",
            s(&public),
            s(&dir),
        ]);
        assert_eq!(code(&o), 0, "{}", text(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let jsonl = run("jsonl");
    let lines: Vec<_> = jsonl.lines().collect();
    assert_eq!(lines.len(), 6);
    let kinds: Vec<String> = lines
        .iter()
        .map(|l| {
            let v = tollgate_core::json::parse_str(l).unwrap();
            v.get("kind").unwrap().as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "session_opened",
            "verdict",
            "settlement",
            "human_decision",
            "recovery",
            "key_handover"
        ]
    );
    assert!(
        lines[0].contains(r#""budget_scope":"per_agent""#),
        "{}",
        lines[0]
    );
    assert!(
        lines[2].contains(r#""reported_cost_bits":"3f50624dd2f1a9fc""#),
        "{}",
        lines[2]
    );
    assert!(lines[3].contains(r#""decision":"modify""#), "{}", lines[3]);
    let csv = run("csv");
    let rows: Vec<_> = csv.lines().collect();
    assert_eq!(rows.len(), 7);
    assert_eq!(rows[0], tollgate_audit::export::csv_header());
    assert!(rows[1].starts_with("0,,0192f7c8-0000-7000-8000-000000000000,"));
    // The session filter takes every session event of the session.
    let o = tollgate(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        "--session",
        "s1",
        "--key",
        s(&public),
        s(&dir),
    ]);
    assert_eq!(String::from_utf8(o.stdout).unwrap().lines().count(), 4);
}

#[test]
fn a_corrupt_archive_is_a_break_reported_once() {
    let f = Fixture::new();
    let o = tollgate(&[
        "audit",
        "demo-write",
        "--dir",
        s(&f.log),
        "--key",
        s(&f.path("audit.key")),
        "--count",
        "40",
        "--rotate-bytes",
        "2000",
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let zst = fs::read_dir(&f.log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_str().unwrap().ends_with(".log.zst"))
        .expect("a compressed file");
    let bytes = fs::read(&zst).unwrap();
    fs::write(&zst, &bytes[..bytes.len() / 2]).unwrap();
    let o = f.verify(&[]);
    let out = text(&o);
    assert_eq!(code(&o), 1, "{out}");
    assert!(out.contains("BROKEN:"), "{out}");
    assert_eq!(out.matches("corrupt archive").count(), 1, "{out}");
    assert!(
        out.contains(zst.file_name().unwrap().to_str().unwrap()),
        "{out}"
    );
}

#[test]
fn an_io_error_is_printed_once() {
    let f = Fixture::new();
    let missing = f.path("no-such-log");
    let o = f_verify_path(&f, &missing);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(code(&o), 2, "{err}");
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

fn f_verify_path(f: &Fixture, p: &Path) -> Output {
    tollgate(&["audit", "verify", "--key", s(&f.path("audit.pub")), s(p)])
}

#[test]
fn a_version_1_log_is_continued_in_the_current_version() {
    let f = Fixture::new();
    fs::create_dir_all(&f.log).unwrap();
    fs::copy(
        crate::repo("crates/tollgate-audit/tests/data/known-answer-v1.log"),
        f.log.join("audit-00000000-20261130.log"),
    )
    .unwrap();
    // The v1 known answer ends by handing over to the key of seed 0x02.
    let k1 = tollgate_audit::SigningKey::from_bytes(&[1; 32]);
    let k2 = tollgate_audit::SigningKey::from_bytes(&[2; 32]);
    fs::write(
        f.path("k1.pub"),
        tollgate_audit::keys::public_key_text(&k1.verifying_key()),
    )
    .unwrap();
    fs::write(f.path("k2.key"), tollgate_audit::keys::secret_key_text(&k2)).unwrap();
    let o = tollgate(&[
        "audit",
        "demo-write",
        "--dir",
        s(&f.log),
        "--key",
        s(&f.path("k2.key")),
        "--count",
        "2",
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "format version 1; continuing in a new version-{} file",
            tollgate_audit::format::FORMAT_VERSION
        )),
        "{}",
        text(&o)
    );
    let o = tollgate(&["audit", "verify", "--key", s(&f.path("k1.pub")), s(&f.log)]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(
        text(&o).contains("ok: 5 entries (index 0..5) in 2 file(s)"),
        "{}",
        text(&o)
    );
}
