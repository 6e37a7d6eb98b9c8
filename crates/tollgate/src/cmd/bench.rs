//! `tollgate bench`: the load generator. S sessions (one connection each), at most C
//! calls in flight (at most one per session); every call is a pre_exec round trip for
//! params never sent before (so no call is a repeat), estimate $0. It reports throughput,
//! p50/p99/p99.9/max of the round trips, and how many calls each session made.
//!
//! Which daemon it measures (the report's first line says which):
//! - by default, `tollgate serve` in its own process, as users run it: this same binary,
//!   started as a child with a generated configuration in a temporary directory, and
//!   stopped with SIGTERM (then waited for) when the load is done;
//! - `--in-process`: the same configuration, served on the load generator's own runtime
//!   (one process sharing one runtime: not how users run it, and on a small machine
//!   faster than a separate process);
//! - `--socket S --secret-file F [--org O]`: a daemon already running, as it is
//!   configured (its rate limits apply).
//!
//! - `--daemons N --redis URL --postgres URL`: a fleet: N `tollgate serve` processes
//!   sharing session state in that Redis (a fresh key prefix) and writing their chains to
//!   that PostgreSQL (a fresh schema), sessions spread over them in turn; the report adds
//!   Redis's commands per decision (`INFO commandstats`, all daemons, background work
//!   included) and its EVALSHA per decision (the compare-and-set: one round trip each).
//!
//! `--grpc` sends the load over the bench's own daemon's gRPC binding with mutual TLS
//! (on 127.0.0.1, with a CA, server and client certificate made by `tollgate certs`'s
//! code in the temporary directory) instead of its Unix socket.
//!
//! How long: `--duration` seconds, or `--calls-per-session N` (history mode): every
//! session makes exactly N calls, and at each mark M of `--marks` the report gives the
//! throughput and p50/p99 of a window of calls ending at M, so the cost of a verdict deep
//! in a session's history can be set beside its cost early on. A worker drives its
//! sessions in turn (one call each per round), so its window is one stretch of time;
//! a mark's throughput is the sum over workers of the window's calls divided by the time
//! that worker took for them, and its percentiles are over every session's window calls.
//!
//! Every session heartbeats (`--heartbeat-ms`), as a long-running agent must: a session
//! that misses its heartbeats is STALE and refused.
//!
//! `--policies N` gives the bench's own daemon a `[policy]` set of N Cedar policies
//! ([`policy_set`]: rules on the bench's tool that read its arguments and attach a label,
//! global rules, and per-tool rules on other tools, as a team writes them); with
//! `--compare-policies` the bench runs twice, each time with a fresh daemon, without a
//! set and then with it, and reports the second's throughput as a share of the first's.
//!
//! What it does not do: retry, or stop on a DENY. Every verdict, a fail-closed one
//! included, is a call; DENYs are counted and the first one's reason printed.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tollgate_client::candidate::quoted as toml_string;
use tollgate_client::{ClientConfig, DaemonClient};
use tollgate_core::json::{Number, Value};
use tollgate_daemon::config::Limits;
use tollgate_daemon::{Daemon, DaemonConfig};

/// Arguments of `tollgate bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sessions (one client connection each).
    #[arg(long, default_value_t = 64)]
    pub sessions: usize,
    /// Requests in flight at once across all sessions (at most one per session).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// History mode: run until every session has made exactly N calls (instead of
    /// --duration), and report each of --marks. Keeps 4 bytes per call for exact
    /// percentiles; with the bench's own daemon, the audit log in the temporary directory
    /// grows with every call.
    #[arg(long, value_name = "N", conflicts_with = "duration")]
    pub calls_per_session: Option<u64>,
    /// With --calls-per-session: the calls into a session at which to report throughput
    /// and p50/p99 over a window of calls ending there (min(mark/10, 10000) calls per
    /// session, at least 1, across all sessions). Default: the powers of ten from 1000 up
    /// to N, and N.
    #[arg(
        long,
        value_name = "M,M,...",
        value_delimiter = ',',
        requires = "calls_per_session"
    )]
    pub marks: Option<Vec<u64>>,
    /// After every ALLOWed call also send its post_exec (success, actual cost = the
    /// estimate, $0), so settlements (one more audited entry each) are part of the load.
    #[arg(long)]
    pub post_exec: bool,
    /// Run the daemon in this process, on the load generator's runtime, instead of as a
    /// separate `tollgate serve` process.
    #[arg(long, conflicts_with = "socket")]
    pub in_process: bool,
    /// An external daemon's socket (default: start one in a temporary directory).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Over the bench's own daemon's gRPC binding with mutual TLS, on 127.0.0.1, instead
    /// of its Unix socket.
    #[arg(long, conflicts_with = "socket")]
    pub grpc: bool,
    /// How many daemons the bench starts (more than one needs --redis and --postgres).
    #[arg(long, default_value_t = 1, conflicts_with_all = ["socket", "in_process", "grpc"],
          value_parser = clap::value_parser!(u16).range(1..=16))]
    pub daemons: u16,
    /// Fleet mode: the daemons keep session state in this Redis (`redis://...`), under a
    /// fresh key prefix.
    #[arg(long, value_name = "URL", requires = "postgres", conflicts_with_all = ["socket", "in_process", "grpc"])]
    pub redis: Option<String>,
    /// Fleet mode: the daemons write their audit chains to this PostgreSQL
    /// (`postgres://...`), in a fresh schema.
    #[arg(long, value_name = "URL", requires = "redis")]
    pub postgres: Option<String>,
    /// With --socket: the organization.
    #[arg(long, default_value = "default")]
    pub org: String,
    /// With --socket: the organization's secret file.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// For the daemon the bench starts: fsync policy of the audit log (the one durable
    /// write of a verdict)
    /// (`batch`: every verdict durable before its reply; `never`: written, not synced).
    #[arg(long, default_value = "batch", value_parser = ["batch", "never"])]
    pub fsync: String,
    /// The agent id to register as.
    #[arg(long, default_value = "bench-agent")]
    pub agent: String,
    /// How often every session heartbeats, in milliseconds. A session that misses its
    /// heartbeats (three 30 s intervals by default) is STALE and its calls are refused,
    /// which a long run would otherwise reach; lower this for an external daemon
    /// configured with a shorter interval.
    #[arg(long, value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub heartbeat_ms: u64,
    /// For the daemon the bench starts: a `[policy]` set of this many generated Cedar
    /// policies (0: none).
    #[arg(long, value_name = "N", default_value_t = 0, conflicts_with_all = ["socket", "redis"])]
    pub policies: usize,
    /// Run twice, side by side: the bench's own daemon without a policy set, then a fresh
    /// one with `--policies N`; report both and the ratio of their throughputs.
    #[arg(long, requires = "policies")]
    pub compare_policies: bool,
}

/// The organization of the daemon the bench starts.
const ORG: &str = "bench";
/// The tool every call names.
const TOOL: &str = "search";
/// Every call's estimated cost, and the actual cost its post_exec reports.
const COST_USD: f64 = 0.0;
/// How long a spawned `tollgate serve` may take to listen on its socket.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a spawned `tollgate serve` may take to stop after SIGTERM (it drains for up
/// to 10 s, then flushes the audit log and snapshots its state).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of a spawned daemon's output an error shows (its end).
const LOG_TAIL_BYTES: u64 = 8 * 1024;
/// A window is at most this many calls per session.
const MAX_WINDOW: u64 = 10_000;

/// Run the load.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let plan = Plan::from_args(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    if let Some(socket) = &args.socket {
        let secret_file = args
            .secret_file
            .as_deref()
            .context("--socket needs --secret-file")?;
        let target = Target {
            sockets: vec![socket.clone()],
            org: args.org.clone(),
            secret: read_secret(secret_file)?,
            grpc: None,
        };
        outln!(
            "mode: external daemon at {} (as it is configured)",
            socket.display()
        );
        let report = rt.block_on(load(&plan, &target))?;
        report.print(&plan, "as the external daemon is configured");
        return Ok(ExitCode::SUCCESS);
    }
    let dir = tempfile::Builder::new()
        .prefix("tollgate-bench-")
        .tempdir()
        .context("creating a temporary directory")?;
    if args.daemons > 1 || args.redis.is_some() {
        return fleet(&rt, &plan, dir.path(), args);
    }
    if args.compare_policies {
        anyhow::ensure!(
            args.policies > 0,
            "--compare-policies needs --policies N (N > 0)"
        );
        let without = own_run(&rt, &plan, &dir.path().join("without"), args, 0)?;
        let with = own_run(&rt, &plan, &dir.path().join("with"), args, args.policies)?;
        let share = if without > 0.0 {
            with / without * 100.0
        } else {
            0.0
        };
        outln!(
            "policies: {with:.0} pre_exec/s with {} policies, {without:.0} without: {share:.1}% of the throughput without",
            args.policies
        );
        return Ok(ExitCode::SUCCESS);
    }
    own_run(&rt, &plan, dir.path(), args, args.policies)?;
    Ok(ExitCode::SUCCESS)
}

/// One run against the bench's own daemon in `dir`, with a set of `policies` policies
/// (0: none); returns its throughput.
fn own_run(
    rt: &tokio::runtime::Runtime,
    plan: &Plan,
    dir: &Path,
    args: &Args,
    policies: usize,
) -> anyhow::Result<f64> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let own = OwnDaemon::prepare_with(dir, args, None, policies)?;
    let how = if args.fsync == "batch" {
        "each verdict signed, audited and fsync'd before the reply"
    } else {
        "each verdict signed and audited; no fsync"
    };
    if policies > 0 {
        outln!("policy set: {policies} Cedar policies (`tollgate bench --policies {policies}`)");
    } else if args.compare_policies {
        outln!("policy set: none");
    }
    let report = if args.in_process {
        rt.block_on(in_process(plan, &own))?
    } else {
        let mut serve = Serve::spawn(&own)?;
        serve.wait_listening(&own.config.socket_path())?;
        if let Some(g) = &own.config.grpc {
            serve.wait_tcp(g.listen)?;
        }
        outln!(
            "mode: separate process: `tollgate serve` (pid {}), started by the bench",
            serve.child.id()
        );
        let report = rt.block_on(load(plan, &own.target()));
        let stopped = serve.stop();
        let report = report?;
        stopped?;
        report
    };
    report.print(plan, how);
    Ok(report.throughput())
}

/// `n` Cedar policies for the bench's daemon (default allow): on the bench's tool, a
/// forbid that reads its argument (never true) and a permit that attaches a label; two
/// global rules (a forbid by tool name pattern, a hold under budget pressure, which the
/// bench's zero budget never reaches); the rest per-tool rules on other tools (forbids
/// with argument conditions, allow-lists of commands, holds after a label, labelled
/// permits), so the set is indexed as a real one is.
fn policy_set(n: usize) -> String {
    let mut out = String::new();
    let fixed = [
        format!("@id(\"bench-no-negative\") forbid (principal, action == Action::\"{TOOL}\", resource) when {{ context.args has i && context.args.i < 0 }};\n"),
        format!("@id(\"bench-searched\") @label(\"searched\") permit (principal, action == Action::\"{TOOL}\", resource);\n"),
        "@id(\"no-danger\") forbid (principal, action, resource) when { context.tool like \"danger_*\" };\n".to_owned(),
        "@id(\"low-budget\") @hitl permit (principal, action == Action::\"pay\", resource) when { context.session.budget_fraction.lessThan(decimal(\"0.05\")) };\n".to_owned(),
    ];
    for f in fixed.iter().take(n) {
        out.push_str(f);
    }
    let rest = n.saturating_sub(fixed.len());
    let tools = (rest / 4).max(1);
    for i in 0..rest {
        let t = i % tools;
        let text = match i / tools % 4 {
            0 => format!("@id(\"p{i}\") forbid (principal, action == Action::\"tool{t}\", resource) when {{ context.args.amount.greaterThan(decimal(\"1{t}.5\")) }};\n"),
            1 => format!("@id(\"p{i}\") forbid (principal, action == Action::\"tool{t}\", resource) unless {{ [\"ls\", \"cat\", \"grep\"].contains(context.args.command) }};\n"),
            2 => format!("@id(\"p{i}\") @hitl permit (principal, action == Action::\"tool{t}\", resource) when {{ context.session.labels.contains(\"customer-data\") && !(context.args.to like \"*@acme.example\") }};\n"),
            _ => format!("@id(\"p{i}\") @label(\"touched-{t}\") permit (principal, action == Action::\"tool{t}\", resource);\n"),
        };
        out.push_str(&text);
    }
    out
}

/// What the load generator does, from the arguments, checked.
#[derive(Debug)]
struct Plan {
    sessions: usize,
    concurrency: usize,
    until: Until,
    /// The rows of a history run, in order; none for a timed run.
    marks: Vec<Mark>,
    post_exec: bool,
    agent: String,
    heartbeat: Duration,
}

/// When a worker stops.
#[derive(Debug, Clone, Copy)]
enum Until {
    /// After this long (the last round started before it is finished).
    Elapsed(Duration),
    /// When each session has made this many calls.
    Calls(u64),
}

/// A point in a session's history at which the report gives a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    /// The call (counted from 1 in every session) the window ends with.
    at: u64,
    /// Calls per session in the window: the calls `at - window + 1 ..= at`.
    window: u64,
}

impl Mark {
    fn new(at: u64) -> Mark {
        Mark {
            at,
            window: (at / 10).clamp(1, MAX_WINDOW),
        }
    }

    /// The round after which the window starts.
    fn starts_after(self) -> u64 {
        self.at - self.window
    }
}

impl Plan {
    fn from_args(args: &Args) -> anyhow::Result<Plan> {
        anyhow::ensure!(
            args.sessions > 0 && args.concurrency > 0,
            "sessions and concurrency must be positive"
        );
        let (until, marks) = match args.calls_per_session {
            None => (
                Until::Elapsed(Duration::from_secs(args.duration)),
                Vec::new(),
            ),
            Some(0) => anyhow::bail!("--calls-per-session must be positive"),
            Some(n) => (Until::Calls(n), marks(n, args.marks.as_deref())?),
        };
        Ok(Plan {
            sessions: args.sessions,
            concurrency: args.concurrency.min(args.sessions),
            until,
            marks,
            post_exec: args.post_exec,
            agent: args.agent.clone(),
            heartbeat: Duration::from_millis(args.heartbeat_ms),
        })
    }
}

/// The marks of a run of `n` calls per session, checked and in order.
fn marks(n: u64, given: Option<&[u64]>) -> anyhow::Result<Vec<Mark>> {
    let mut at: Vec<u64> = match given {
        Some(given) => {
            for &m in given {
                anyhow::ensure!(
                    (1..=n).contains(&m),
                    "--marks: `{m}` is not between 1 and --calls-per-session ({n})"
                );
            }
            given.to_vec()
        }
        None => default_marks(n),
    };
    at.sort_unstable();
    at.dedup();
    Ok(at.into_iter().map(Mark::new).collect())
}

/// The powers of ten from 1000 up to `n`, and `n`.
fn default_marks(n: u64) -> Vec<u64> {
    let mut marks = Vec::new();
    let mut p: u64 = 1000;
    while p <= n {
        marks.push(p);
        match p.checked_mul(10) {
            Some(next) => p = next,
            None => break,
        }
    }
    if marks.last() != Some(&n) {
        marks.push(n);
    }
    marks
}

/// Where the load goes.
#[derive(Debug)]
struct Target {
    /// Sessions go to these in turn.
    sockets: Vec<PathBuf>,
    org: String,
    secret: Vec<u8>,
    /// Over gRPC instead of the socket.
    grpc: Option<tollgate_client::GrpcConfig>,
}

fn read_secret(path: &Path) -> anyhow::Result<Vec<u8>> {
    let secret =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(secret.trim().as_bytes().to_vec())
}

/// The daemon the bench starts, as files in its temporary directory: a configuration
/// (`bench.toml`), the organization's secret (`secrets/bench.secret`) and a data directory
/// (`data/`). Both the separate process and `--in-process` run exactly this configuration.
#[derive(Debug)]
struct OwnDaemon {
    config_file: PathBuf,
    data_dir: PathBuf,
    log: PathBuf,
    /// The configuration as the daemon will read it (`data_dir` set).
    config: DaemonConfig,
    secret: Vec<u8>,
    /// With `--grpc`: the client's side of the mutual TLS.
    grpc: Option<tollgate_client::GrpcConfig>,
}

impl OwnDaemon {
    /// `fleet`: this daemon's place in a fleet: its number, the `[state]` table, and the
    /// `[audit]` keys of the PostgreSQL sink.
    fn prepare(
        dir: &Path,
        args: &Args,
        fleet: Option<(u16, &str, &str)>,
    ) -> anyhow::Result<OwnDaemon> {
        OwnDaemon::prepare_with(dir, args, fleet, 0)
    }

    /// [`OwnDaemon::prepare`] with a policy set of `policies` policies (0: none), written
    /// to `<dir>/policies.cedar`.
    fn prepare_with(
        dir: &Path,
        args: &Args,
        fleet: Option<(u16, &str, &str)>,
        policies: usize,
    ) -> anyhow::Result<OwnDaemon> {
        // A random secret, mode 0600, in <dir>/secrets/bench.secret (shared by a fleet).
        let secret = tollgate_daemon::org_secret(dir, ORG)?;
        let n = fleet.map_or(String::new(), |(i, _, _)| format!("-{i}"));
        let config_file = dir.join(format!("bench{n}.toml"));
        let pki = if args.grpc {
            Some(grpc_pki(dir, &args.agent)?)
        } else {
            None
        };
        let mut text = config_text(
            args,
            pki.as_ref(),
            fleet.map(|(_, state, sink)| (state, sink)),
        );
        if policies > 0 {
            let file = dir.join("policies.cedar");
            std::fs::write(&file, policy_set(policies))
                .with_context(|| format!("writing {}", file.display()))?;
            text.push_str("\n[policy]\nfiles = [\"policies.cedar\"]\n");
        }
        if fleet.is_some() {
            // A fleet's organizations name both secrets, the same on every daemon.
            tollgate_daemon::org_secret(dir, &format!("{ORG}.operator"))?;
        }
        std::fs::write(&config_file, text)
            .with_context(|| format!("writing {}", config_file.display()))?;
        let data_dir = dir.join(format!("data{n}"));
        let mut config = DaemonConfig::load(&config_file)?;
        config.data_dir.clone_from(&data_dir);
        Ok(OwnDaemon {
            config_file,
            data_dir,
            log: dir.join(format!("serve{n}.log")),
            config,
            secret,
            grpc: pki.map(|p| p.client),
        })
    }

    fn target(&self) -> Target {
        Target {
            sockets: vec![self.config.socket_path()],
            org: ORG.to_owned(),
            secret: self.secret.clone(),
            grpc: self.grpc.clone(),
        }
    }
}

/// With `--grpc`: what the daemon's configuration and the clients need.
struct GrpcPki {
    /// The configuration's `[grpc]` table.
    table: String,
    /// The organization's `grpc_client_*` keys.
    org_keys: String,
    /// The clients' side of the mutual TLS.
    client: tollgate_client::GrpcConfig,
}

/// With `--grpc`: certificates in `<dir>/pki` (CA, server for 127.0.0.1, client for the
/// bench's agent of organization `bench`) and a free port on 127.0.0.1.
fn grpc_pki(dir: &Path, agent: &str) -> anyhow::Result<GrpcPki> {
    let client = super::certs::Client::parse(&format!("{ORG}/{agent}"))?;
    // A free port: bound, read, released (the daemon binds it a moment later).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port")?
        .port();
    let listen = format!("127.0.0.1:{port}");
    let w = super::certs::write_pki(
        &dir.join("pki"),
        &["127.0.0.1".to_owned()],
        std::slice::from_ref(&client),
        &listen,
        1,
    )?;
    let (_, cert, key) = w
        .clients
        .first()
        .context("no client certificate was made")?;
    let g = tollgate_client::GrpcConfig::from_files(&listen, "127.0.0.1", &w.ca, cert, key)
        .context("reading the certificates")?;
    let q = |p: &Path| toml_string(&p.display().to_string());
    let text = format!(
        "[grpc]\n\
         listen = {}\n\
         cert = {}\n\
         key = {}\n",
        toml_string(&listen),
        q(&w.server.0),
        q(&w.server.1)
    );
    let org_keys = format!(
        "grpc_client_ca = {}\ngrpc_client_san = [{}]\n",
        q(&w.ca),
        toml_string(&format!("spiffe://{ORG}/*"))
    );
    Ok(GrpcPki {
        table: format!("{text}\n"),
        org_keys,
        client: g,
    })
}

/// The configuration of the daemon the bench starts: organization `bench` with the secret
/// in `secrets/bench.secret` (beside the file), rate limits and caps raised above anything
/// the load can reach, the audit fsync policy from `--fsync`, and a guard for the bench's
/// agent with no budget (every budget rule off: the path is measured, not the policy) and
/// `max_repeat_calls = 3` (never reached: every call's params are new).
///
/// With `fleet` (the `[state]` table and the `[audit]` sink keys): a fleet member, whose
/// organization also names its operator secret (a fleet's secrets are never generated).
fn config_text(args: &Args, grpc: Option<&GrpcPki>, fleet: Option<(&str, &str)>) -> String {
    let (grpc_table, org_keys) = grpc.map_or(("", ""), |g| (g.table.as_str(), g.org_keys.as_str()));
    let (state_table, sink_keys) = fleet.unwrap_or(("", ""));
    let operator_secret = if fleet.is_some() {
        format!("operator_secret_file = \"secrets/{ORG}.operator.secret\"\n")
    } else {
        String::new()
    };
    let d = Limits::default();
    let max_sessions = args.sessions.max(d.max_sessions);
    // One connection per session, and room for a few more (a listening check, an operator).
    let max_connections = args.sessions.saturating_add(16).max(d.max_connections);
    let fsync = toml_string(&args.fsync);
    let agent = toml_string(&args.agent);
    format!(
        "# Written by `tollgate bench` for the daemon it starts.\n\
         [limits]\n\
         pre_exec_per_second_per_session = 1000000\n\
         registrations_per_second_per_peer = 1000000\n\
         max_sessions = {max_sessions}\n\
         max_connections = {max_connections}\n\
         \n\
         [audit]\n\
         fsync = {fsync}\n\
         {sink_keys}\
         \n\
         {grpc_table}\
         [[organization]]\n\
         id = \"{ORG}\"\n\
         secret_file = \"secrets/{ORG}.secret\"\n\
         {operator_secret}\
         {org_keys}\
         \n\
         [guard.agents.{agent}]\n\
         budget_usd = 0.0\n\
         max_repeat_calls = 3\n\
         {state_table}"
    )
}

/// `--daemons N --redis URL --postgres URL`: N `tollgate serve` processes in the fleet
/// configuration (a fresh Redis key prefix and PostgreSQL schema, so runs never meet),
/// sessions spread over them in turn; Redis's command counts before and after the load
/// give its commands per decision.
fn fleet(
    rt: &tokio::runtime::Runtime,
    plan: &Plan,
    dir: &Path,
    args: &Args,
) -> anyhow::Result<ExitCode> {
    let (Some(redis), Some(postgres)) = (&args.redis, &args.postgres) else {
        anyhow::bail!(
            "--daemons {} needs --redis URL and --postgres URL",
            args.daemons
        );
    };
    let run = format!(
        "{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    );
    let state = format!(
        "\n[state]\nbackend = \"redis\"\nurl = {}\nkey_prefix = {}\ndurability = \"none\"\n",
        toml_string(redis),
        toml_string(&format!("tgbench{run}")),
    );
    let sink = format!(
        "sink = \"postgres\"\nurl = {}\nschema = {}\n",
        toml_string(postgres),
        toml_string(&format!("bench_{run}")),
    );
    let mut daemons = Vec::new();
    let mut sockets = Vec::new();
    let mut secret = Vec::new();
    for i in 0..args.daemons {
        let own = OwnDaemon::prepare(dir, args, Some((i, &state, &sink)))?;
        let mut serve = Serve::spawn(&own)?;
        serve.wait_listening(&own.config.socket_path())?;
        sockets.push(own.config.socket_path());
        secret.clone_from(&own.secret);
        daemons.push(serve);
    }
    outln!(
        "mode: fleet: {} `tollgate serve` processes, state in Redis {}, audit chains in PostgreSQL {} (schema bench_{run})",
        args.daemons,
        tollgate_daemon::config::redact_url(redis),
        tollgate_daemon::config::redact_url(postgres),
    );
    let before = rt.block_on(redis_counts(redis))?;
    let report = rt.block_on(load(
        plan,
        &Target {
            sockets,
            org: ORG.to_owned(),
            secret,
            grpc: None,
        },
    ));
    let after = rt.block_on(redis_counts(redis))?;
    let mut stopped = Ok(());
    for mut d in daemons {
        if let Err(e) = d.stop() {
            stopped = Err(e);
        }
    }
    // Leave nothing behind: the run's schema and keys are the bench's own.
    if let Err(e) = rt.block_on(clean_up(redis, postgres, &run)) {
        errln!("tollgate bench: cleaning up: {e:#}");
    }
    let report = report?;
    report.print(
        plan,
        "each verdict in Redis and committed to PostgreSQL before the reply",
    );
    let decisions = report.latencies.len().max(1) as f64;
    outln!(
        "redis: {:.2} commands per decision, {:.2} EVALSHA (compare-and-set round trips) per decision",
        after.0.saturating_sub(before.0) as f64 / decisions,
        after.1.saturating_sub(before.1) as f64 / decisions,
    );
    stopped?;
    Ok(ExitCode::SUCCESS)
}

/// Drop the run's schema (`bench_<run>`) and delete its Redis keys (`tgbench<run>*`).
async fn clean_up(redis: &str, postgres: &str, run: &str) -> anyhow::Result<()> {
    let settings = tollgate_pg::PgSettings::new(postgres);
    let client = tollgate_pg::connect(&settings).await?;
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS bench_{run} CASCADE"))
        .await
        .context("dropping the bench's schema")?;
    let mut c = redis::Client::open(redis)?
        .get_multiplexed_async_connection()
        .await?;
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("tgbench{run}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await?;
        if !keys.is_empty() {
            let () = redis::cmd("DEL").arg(&keys).query_async(&mut c).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// Redis's total commands processed and EVALSHA calls so far (`INFO`).
async fn redis_counts(url: &str) -> anyhow::Result<(u64, u64)> {
    let client = redis::Client::open(url).context("--redis")?;
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .context("connecting to Redis")?;
    let info: String = redis::cmd("INFO")
        .arg("all")
        .query_async(&mut c)
        .await
        .context("INFO")?;
    let field = |line: &str, key: &str| -> Option<u64> {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
    };
    let mut total = 0;
    let mut evalsha = 0;
    for line in info.lines() {
        if let Some(v) = line.strip_prefix("total_commands_processed:") {
            total = v.trim().parse().unwrap_or(0);
        }
        if let Some(rest) = line.strip_prefix("cmdstat_evalsha:") {
            evalsha = field(rest, "calls=").unwrap_or(0);
        }
    }
    Ok((total, evalsha))
}

/// `--in-process`: the daemon on this runtime, stopped after the load.
async fn in_process(plan: &Plan, own: &OwnDaemon) -> anyhow::Result<Report> {
    let daemon = Daemon::start(own.config.clone()).await?;
    outln!("mode: in-process: the daemon runs in the load generator's process");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(daemon.run(async {
        let _ = rx.await;
    }));
    let report = load(plan, &own.target()).await;
    let _ = tx.send(());
    handle.await??;
    report
}

/// A `tollgate serve` child process. Dropped while running (an error on the way), it is
/// killed and reaped, never left behind.
/// (`tollgate soak` starts its daemon with it too.)
#[derive(Debug)]
pub(crate) struct Serve {
    child: Child,
    log: PathBuf,
}

impl Serve {
    /// [`Serve::start`] with `own`'s files, at the daemon's default log level.
    fn spawn(own: &OwnDaemon) -> anyhow::Result<Serve> {
        Serve::start(&own.config_file, &own.data_dir, &own.log, None)
    }

    /// Start this binary as `tollgate serve --config <config_file> --data-dir <data_dir>`,
    /// its standard output and error into `log` (a file, so a chatty daemon never blocks
    /// on a pipe nobody reads); `rust_log`, if given, is its `RUST_LOG`.
    pub(crate) fn start(
        config_file: &Path,
        data_dir: &Path,
        log: &Path,
        rust_log: Option<&str>,
    ) -> anyhow::Result<Serve> {
        let exe = std::env::current_exe().context("finding the tollgate binary")?;
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut command = Command::new(&exe);
        command
            .arg("serve")
            .arg("--config")
            .arg(config_file)
            .arg("--data-dir")
            .arg(data_dir)
            // Plain text in the log, so an error can show it.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().context("duplicating the log handle")?)
            .stderr(out);
        if let Some(level) = rust_log {
            command.env("RUST_LOG", level);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting `{} serve`", exe.display()))?;
        Ok(Serve {
            child,
            log: log.to_owned(),
        })
    }

    /// The daemon's process id.
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    /// Wait until `socket` accepts a connection. An error if the child exits first, or
    /// does not listen within [`LISTEN_TIMEOUT`] (then it is killed); either way its
    /// output is shown.
    pub(crate) fn wait_listening(&mut self, socket: &Path) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for the daemon")? {
                anyhow::bail!(
                    "`tollgate serve` exited ({status}) before listening on {}; its output:\n{}",
                    socket.display(),
                    tail(&self.log)
                );
            }
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Ok(());
            }
            if started.elapsed() > LISTEN_TIMEOUT {
                self.kill();
                anyhow::bail!(
                    "`tollgate serve` did not listen on {} within {} s (killed); its output:\n{}",
                    socket.display(),
                    LISTEN_TIMEOUT.as_secs(),
                    tail(&self.log)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait until `addr` accepts a TCP connection (the gRPC binding), like
    /// [`Serve::wait_listening`].
    fn wait_tcp(&mut self, addr: std::net::SocketAddr) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for the daemon")? {
                anyhow::bail!(
                    "`tollgate serve` exited ({status}) before listening on {addr}; its output:\n{}",
                    tail(&self.log)
                );
            }
            if std::net::TcpStream::connect(addr).is_ok() {
                return Ok(());
            }
            if started.elapsed() > LISTEN_TIMEOUT {
                self.kill();
                anyhow::bail!(
                    "`tollgate serve` did not listen on {addr} within {} s (killed); its output:\n{}",
                    LISTEN_TIMEOUT.as_secs(),
                    tail(&self.log)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM (with the `kill` command: no `unsafe` here), then wait for a clean exit,
    /// at most [`STOP_TIMEOUT`]. A daemon that exits with a failure, cannot be signalled
    /// or does not stop in time is an error (the last two after SIGKILL).
    pub(crate) fn stop(&mut self) -> anyhow::Result<()> {
        let pid = self.child.id();
        let sent = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match sent {
            Ok(s) if s.success() => {}
            Ok(s) => {
                self.kill();
                anyhow::bail!("`kill -TERM {pid}` failed ({s}); `tollgate serve` was killed");
            }
            Err(e) => {
                self.kill();
                anyhow::bail!("running `kill -TERM {pid}`: {e}; `tollgate serve` was killed");
            }
        }
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for the daemon")? {
                anyhow::ensure!(
                    status.success(),
                    "`tollgate serve` (pid {pid}) stopped with {status}; its output:\n{}",
                    tail(&self.log)
                );
                return Ok(());
            }
            if started.elapsed() > STOP_TIMEOUT {
                self.kill();
                anyhow::bail!(
                    "`tollgate serve` (pid {pid}) did not stop within {} s of SIGTERM (killed); its output:\n{}",
                    STOP_TIMEOUT.as_secs(),
                    tail(&self.log)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// The last [`LOG_TAIL_BYTES`] of a file, lossily as text.
fn tail(path: &Path) -> String {
    let read = || -> std::io::Result<String> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        f.take(LOG_TAIL_BYTES).read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) if text.trim().is_empty() => "(nothing)".to_owned(),
        Ok(text) => text,
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// What one worker measured. Its sessions take turns: one round is one call of each, so
/// they all make the same number of calls, and the worker's `k`-th call (from 0) is
/// call `k / sessions + 1` of session `k % sessions`.
#[derive(Debug, Default)]
struct WorkerResult {
    sessions: usize,
    /// Round-trip microseconds of every call, in the order made.
    latencies: Vec<u32>,
    /// Rounds completed: calls made by each of its sessions.
    rounds: u64,
    denied: u64,
    first_denial: Option<String>,
    post_execs: u64,
    post_exec_failures: u64,
    /// When the rounds a mark needs ended (round 0: when the worker started).
    boundaries: Vec<(u64, Instant)>,
}

impl WorkerResult {
    /// Note the time if a mark needs the end of `round` (`wanted` is sorted).
    fn note(&mut self, round: u64, wanted: &[u64]) {
        if wanted.binary_search(&round).is_ok() {
            self.boundaries.push((round, Instant::now()));
        }
    }

    fn boundary(&self, round: u64) -> Option<Instant> {
        self.boundaries
            .iter()
            .find(|(r, _)| *r == round)
            .map(|(_, t)| *t)
    }
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// One worker: its sessions in turn, one call in flight, until `until`.
async fn work(
    sessions: Vec<Arc<DaemonClient>>,
    until: Until,
    post_exec: bool,
    boundaries: Arc<Vec<u64>>,
) -> WorkerResult {
    let expected = match until {
        Until::Calls(n) => usize::try_from(n)
            .unwrap_or(usize::MAX)
            .saturating_mul(sessions.len()),
        Until::Elapsed(_) => 1 << 16,
    };
    let mut r = WorkerResult {
        sessions: sessions.len(),
        latencies: Vec::with_capacity(expected.min(1 << 24)),
        ..WorkerResult::default()
    };
    let started = Instant::now();
    r.note(0, &boundaries);
    let mut i: i64 = 0;
    loop {
        let done = match until {
            Until::Elapsed(d) => started.elapsed() >= d,
            Until::Calls(n) => r.rounds >= n,
        };
        if done {
            break;
        }
        for c in &sessions {
            i += 1;
            let params = Value::Object(
                [("i".to_owned(), Value::Number(Number::Int(i128::from(i))))]
                    .into_iter()
                    .collect(),
            );
            let t = Instant::now();
            let v = c.pre_exec(TOOL, &params, COST_USD).await;
            r.latencies.push(micros(t.elapsed()));
            if !v.allowed() {
                r.denied += 1;
                r.first_denial.get_or_insert(v.reason);
            } else if post_exec {
                match c.post_exec(v.call_number, COST_USD, true, "").await {
                    Ok(()) => r.post_execs += 1,
                    Err(_) => r.post_exec_failures += 1,
                }
            }
        }
        r.rounds += 1;
        r.note(r.rounds, &boundaries);
    }
    r
}

/// Register the sessions, run the workers, gather what they measured.
async fn load(plan: &Plan, target: &Target) -> anyhow::Result<Report> {
    match &target.grpc {
        Some(g) => outln!(
            "transport: gRPC with mutual TLS at {} (one HTTP/2 connection per session)",
            g.address
        ),
        None => outln!("transport: Unix socket (one connection per session)"),
    }
    let marks = &plan.marks;
    let mut clients = Vec::with_capacity(plan.sessions);
    let mut heartbeats = Vec::with_capacity(plan.sessions);
    for i in 0..plan.sessions {
        let socket = target
            .sockets
            .get(i % target.sockets.len().max(1))
            .context("no socket to load")?;
        let mut cfg = ClientConfig::new(socket, &target.org, &target.secret, &plan.agent);
        cfg.grpc.clone_from(&target.grpc);
        let client = Arc::new(
            DaemonClient::connect(cfg)
                .await
                .context("registering a session")?,
        );
        heartbeats.push(client.spawn_heartbeats(plan.heartbeat));
        clients.push(client);
    }
    let mut rounds: Vec<u64> = marks
        .iter()
        .flat_map(|m| [m.starts_after(), m.at])
        .collect();
    rounds.sort_unstable();
    rounds.dedup();
    let rounds = Arc::new(rounds);
    let workers = plan.concurrency;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(workers);
    for w in 0..workers {
        let mine: Vec<Arc<DaemonClient>> =
            clients.iter().skip(w).step_by(workers).cloned().collect();
        tasks.push(tokio::spawn(work(
            mine,
            plan.until,
            plan.post_exec,
            rounds.clone(),
        )));
    }
    let mut results = Vec::with_capacity(workers);
    for t in tasks {
        results.push(t.await?);
    }
    let elapsed = started.elapsed();
    for h in heartbeats {
        h.abort();
    }
    drop(clients);
    Ok(Report::new(results, elapsed, marks))
}

/// What a run measured.
#[derive(Debug)]
struct Report {
    sessions: usize,
    elapsed: Duration,
    /// Every call's round trip, microseconds, sorted.
    latencies: Vec<u32>,
    denied: u64,
    first_denial: Option<String>,
    post_execs: u64,
    post_exec_failures: u64,
    /// The fewest and the most calls a session made.
    calls_per_session: (u64, u64),
    rows: Vec<Row>,
}

/// One mark of a history run.
#[derive(Debug)]
struct Row {
    mark: Mark,
    /// Calls in the window, all sessions.
    calls: u64,
    /// The sum over workers of the window's calls over the time they took: the rate of
    /// all sessions together while they were at this depth of their history.
    rate: f64,
    p50: u32,
    p99: u32,
}

impl Report {
    fn new(results: Vec<WorkerResult>, elapsed: Duration, marks: &[Mark]) -> Report {
        let rows = marks.iter().map(|m| Row::new(*m, &results)).collect();
        let calls_per_session = (
            results.iter().map(|r| r.rounds).min().unwrap_or(0),
            results.iter().map(|r| r.rounds).max().unwrap_or(0),
        );
        let mut report = Report {
            sessions: results.iter().map(|r| r.sessions).sum(),
            elapsed,
            latencies: Vec::new(),
            denied: 0,
            first_denial: None,
            post_execs: 0,
            post_exec_failures: 0,
            calls_per_session,
            rows,
        };
        for r in results {
            report.latencies.extend(r.latencies);
            report.denied += r.denied;
            if report.first_denial.is_none() {
                report.first_denial = r.first_denial;
            }
            report.post_execs += r.post_execs;
            report.post_exec_failures += r.post_exec_failures;
        }
        report.latencies.sort_unstable();
        report
    }

    /// Calls per second over the run.
    fn throughput(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.latencies.len() as f64 / secs
        } else {
            0.0
        }
    }

    fn print(&self, plan: &Plan, how: &str) {
        if plan.post_exec {
            outln!(
                "load: pre_exec, and after every ALLOW its post_exec (actual cost ${COST_USD}): a settlement, one more audited entry each"
            );
        } else {
            outln!("load: pre_exec only (no post_exec; --post-exec adds settlements)");
        }
        let denied = match &self.first_denial {
            Some(reason) => format!("{} (first: {reason})", self.denied),
            None => self.denied.to_string(),
        };
        outln!(
            "sessions {}  concurrency {}  duration {:.1}s  requests {}  denied {denied}",
            self.sessions,
            plan.concurrency,
            self.elapsed.as_secs_f64(),
            self.latencies.len(),
        );
        match self.calls_per_session {
            (lo, hi) if lo == hi => outln!("calls per session: {lo}"),
            (lo, hi) => outln!("calls per session: {lo} to {hi}"),
        }
        let secs = self.elapsed.as_secs_f64();
        let rate = if secs > 0.0 {
            self.latencies.len() as f64 / secs
        } else {
            0.0
        };
        outln!("throughput {rate:.0} pre_exec/s ({how})");
        let p = |q: f64| percentile(&self.latencies, q);
        outln!(
            "latency us: p50 {}  p99 {}  p99.9 {}  max {}",
            p(0.50),
            p(0.99),
            p(0.999),
            self.latencies.last().copied().unwrap_or(0)
        );
        if plan.post_exec {
            outln!(
                "post_exec sent {}  failed to send {}",
                self.post_execs,
                self.post_exec_failures
            );
        }
        if !self.rows.is_empty() {
            outln!(
                "history: per mark, the window of calls ending there, min(mark/10, {MAX_WINDOW}) per session, all sessions together"
            );
        }
        for row in &self.rows {
            outln!(
                "mark {}  window {}/session  calls {}  throughput {:.0} pre_exec/s  p50 {} us  p99 {} us",
                row.mark.at, row.mark.window, row.calls, row.rate, row.p50, row.p99
            );
        }
    }
}

impl Row {
    fn new(mark: Mark, results: &[WorkerResult]) -> Row {
        let mut latencies = Vec::new();
        let mut calls = 0;
        let mut rate = 0.0;
        for r in results {
            let (Some(t0), Some(t1)) = (r.boundary(mark.starts_after()), r.boundary(mark.at))
            else {
                continue; // the worker never got there
            };
            let k = u64::try_from(r.sessions).unwrap_or(u64::MAX);
            let n = mark.window.saturating_mul(k);
            calls += n;
            let secs = t1.duration_since(t0).as_secs_f64();
            if secs > 0.0 {
                rate += n as f64 / secs;
            }
            let index = |round: u64| usize::try_from(round.saturating_mul(k)).unwrap_or(usize::MAX);
            if let Some(w) = r.latencies.get(index(mark.starts_after())..index(mark.at)) {
                latencies.extend_from_slice(w);
            }
        }
        latencies.sort_unstable();
        Row {
            mark,
            calls,
            rate,
            p50: percentile(&latencies, 0.50),
            p99: percentile(&latencies, 0.99),
        }
    }
}

/// The `q` quantile of sorted values (nearest rank on `(len - 1) * q`); 0 for none.
fn percentile(sorted: &[u32], q: f64) -> u32 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return 0;
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = (last as f64 * q).round() as usize;
    sorted.get(i.min(last)).copied().unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(a: &[&str]) -> Args {
        Cli::try_parse_from(std::iter::once("bench").chain(a.iter().copied()))
            .unwrap()
            .args
    }

    /// The generated configuration is read by the daemon's own parser: the bench's
    /// organization with its secret file, limits above anything the load reaches, the
    /// fsync policy asked for, and the agent's guard (no budget, 3 repeats), whatever
    /// characters of the id rule the agent id holds (each needs the key quoted); an id
    /// outside the rule is an error, not a configuration the daemon cannot read.
    #[test]
    fn the_generated_configuration_is_what_the_daemon_reads() {
        let dir = tempfile::tempdir().unwrap();
        let bad = args(&["--agent", "we\"ird\\agent\u{1}"]);
        assert!(OwnDaemon::prepare(dir.path(), &bad, None).is_err());
        let agent = "we.ird:agent/x@y+z_-1";
        let a = args(&["--sessions", "5000", "--fsync", "never", "--agent", agent]);
        let own = OwnDaemon::prepare(dir.path(), &a, None).unwrap();
        let c = &own.config;
        assert_eq!(c.data_dir, dir.path().join("data"));
        assert_eq!(c.audit.fsync, "never");
        assert_eq!(c.organizations.len(), 1);
        assert_eq!(c.organizations[0].id, ORG);
        assert_eq!(c.organizations[0].secret.as_deref(), Some(&own.secret[..]));
        assert_eq!(c.limits.pre_exec_per_second_per_session, 1_000_000);
        assert_eq!(c.limits.registrations_per_second_per_peer, 1_000_000);
        assert_eq!(c.limits.max_sessions, 100_000);
        assert_eq!(c.limits.max_connections, 5016);
        let g = c.guard_for(agent);
        assert!(!g.budget_enabled());
        assert_eq!(g.max_repeat_calls, 3);
        // Only the bench's agent has the unlimited guard.
        assert!(c.guard_for("someone-else").budget_enabled());
    }

    #[test]
    fn default_marks_are_powers_of_ten_from_1000_and_n() {
        assert_eq!(default_marks(300), [300]);
        assert_eq!(default_marks(1000), [1000]);
        assert_eq!(default_marks(25_000), [1000, 10_000, 25_000]);
        assert_eq!(default_marks(1_000_000), [1000, 10_000, 100_000, 1_000_000]);
        assert_eq!(default_marks(u64::MAX).last(), Some(&u64::MAX));
    }

    #[test]
    fn windows_are_a_tenth_of_the_mark_between_1_and_10000() {
        let w = |at| Mark::new(at).window;
        assert_eq!((w(5), w(100), w(300), w(1_000_000)), (1, 10, 30, 10_000));
        let m = marks(300, Some(&[300, 100, 100])).unwrap();
        assert_eq!(m, [Mark::new(100), Mark::new(300)]);
        let err = marks(300, Some(&[301])).unwrap_err().to_string();
        assert!(err.contains("`301`"), "{err}");
        assert!(marks(300, Some(&[0])).is_err());
    }

    /// A row covers exactly its window's calls: with two sessions taking turns, calls
    /// 3..=4 of each are the worker's 5th to 8th round trips.
    #[test]
    fn a_row_takes_the_window_of_every_session() {
        let t0 = Instant::now();
        let r = WorkerResult {
            sessions: 2,
            latencies: vec![1, 1, 1, 1, 10, 20, 30, 40],
            rounds: 4,
            boundaries: vec![(2, t0), (4, t0 + Duration::from_millis(4))],
            ..WorkerResult::default()
        };
        let mark = Mark { at: 4, window: 2 };
        let row = Row::new(mark, &[r]);
        assert_eq!(row.calls, 4);
        assert_eq!((row.p50, row.p99), (30, 40));
        assert!((row.rate - 1000.0).abs() < 1e-6, "{}", row.rate);
    }
}
