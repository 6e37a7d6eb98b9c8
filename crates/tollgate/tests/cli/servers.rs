//! Private Redis and PostgreSQL servers for the tests that stop and restart them: each on
//! its own free port and directory, so the machine's shared servers (which other tests use
//! at the same time) are never disturbed. The binaries are Debian's (`redis-server`,
//! `/usr/lib/postgresql/*/bin`), which `.ci/run` installs when missing.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free port below the kernel's ephemeral range: these servers are stopped and started
/// again on their port, and while one is down a client connection of a test running in
/// parallel could take a port of the ephemeral range as its own source port. Ports are
/// handed out in turn from a start that depends on the process id, so two servers of this
/// process never get the same one.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    const FROM: u32 = 10_000;
    if low > FROM + 100 {
        let span = low - FROM;
        let start = std::process::id().wrapping_mul(7_919) % span;
        for _ in 0..1_000 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = FROM + (start + n) % span;
            if let Ok(port) = u16::try_from(port) {
                if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                    return port;
                }
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(port: u16, what: &str) {
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{what} did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `redis-server` with AOF on (`appendfsync always`), in its own directory; with `tls`
/// (certificate, key and CA files), it speaks TLS only on its port.
pub(crate) struct PrivateRedis {
    child: Option<Child>,
    pub(crate) port: u16,
    dir: PathBuf,
    tls: Option<[PathBuf; 3]>,
}

impl PrivateRedis {
    pub(crate) fn start(dir: &Path) -> PrivateRedis {
        std::fs::create_dir_all(dir).unwrap();
        let mut r = PrivateRedis {
            child: None,
            port: free_port(),
            dir: dir.to_owned(),
            tls: None,
        };
        r.restart();
        r
    }

    /// The same, speaking TLS only (`--tls-port`), with this certificate and key; clients
    /// are not asked for certificates.
    pub(crate) fn start_tls(dir: &Path, cert: &Path, key: &Path, ca: &Path) -> PrivateRedis {
        std::fs::create_dir_all(dir).unwrap();
        let mut r = PrivateRedis {
            child: None,
            port: free_port(),
            dir: dir.to_owned(),
            tls: Some([cert.to_owned(), key.to_owned(), ca.to_owned()]),
        };
        r.restart();
        r
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Start it again on the same port and directory (it reloads its AOF).
    pub(crate) fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let mut command = Command::new("redis-server");
        match &self.tls {
            None => command.args(["--port", &self.port.to_string()]),
            Some([cert, key, ca]) => command
                .args(["--port", "0", "--tls-port", &self.port.to_string()])
                .arg("--tls-cert-file")
                .arg(cert)
                .arg("--tls-key-file")
                .arg(key)
                .arg("--tls-ca-cert-file")
                .arg(ca)
                .args(["--tls-auth-clients", "no"]),
        };
        let child = command
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server package)");
        self.child = Some(child);
        wait_for_port(self.port, "redis-server");
    }

    /// kill -9: whatever was acknowledged is in the AOF (`appendfsync always`).
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A PostgreSQL cluster of its own (initdb into a temporary directory, trust auth, a
/// database `test`), run as the `postgres` user when the tests run as root (PostgreSQL
/// refuses to run as root). `dir` must be reachable by that user: pass a temporary
/// directory itself (it is handed to `postgres`), not a folder inside one.
pub(crate) struct PrivatePostgres {
    pub(crate) port: u16,
    data: PathBuf,
    bin: PathBuf,
    running: bool,
}

fn pg_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's server binaries in /usr/lib/postgresql (Debian's postgresql)")
        .map(|e| e.unwrap().path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().expect("an initdb under /usr/lib/postgresql")
}

fn as_postgres_if_root(bin: &Path, tool: &str) -> Command {
    // The effective user, asked of `id -u` (no libc binding needed).
    let uid = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() == "0" {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    } else {
        Command::new(bin.join(tool))
    }
}

impl PrivatePostgres {
    pub(crate) fn start(dir: &Path) -> PrivatePostgres {
        std::fs::create_dir_all(dir).unwrap();
        let root = Command::new("id").arg("-u").output().unwrap();
        if String::from_utf8_lossy(&root.stdout).trim() == "0" {
            let ok = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir)
                .status()
                .unwrap();
            assert!(ok.success());
        }
        let bin = pg_bin();
        let data = dir.join("data");
        let out = as_postgres_if_root(&bin, "initdb")
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {out:?}");
        let mut pg = PrivatePostgres {
            port: free_port(),
            data,
            bin,
            running: false,
        };
        pg.restart();
        let out = Command::new(pg.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &pg.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-c", "CREATE DATABASE test"])
            .output()
            .unwrap();
        assert!(out.status.success(), "createdb: {out:?}");
        pg
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port)
    }

    pub(crate) fn restart(&mut self) {
        assert!(!self.running, "already running");
        let out = as_postgres_if_root(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-o")
            .arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
                self.port,
                self.data.display()
            ))
            .arg("-l")
            .arg(self.data.join("server.log"))
            .args(["-w", "start"])
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl start: {out:?}");
        self.running = true;
        wait_for_port(self.port, "postgres");
    }

    /// Stop it (`-m immediate`: the server's own kill -9, recovered from its WAL at the
    /// next start).
    pub(crate) fn stop(&mut self) {
        if !self.running {
            return;
        }
        let _ = as_postgres_if_root(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        self.running = false;
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.stop();
    }
}
