"""Shared fixtures: the repository's data files, and a real `tollgate serve` on a
temporary socket (and, with a test PKI from `tollgate certs`, on a gRPC port with mutual
TLS).

The daemon binary is `$TOLLGATE_BIN`, else `target/{release,debug}/tollgate` under
`$CARGO_TARGET_DIR` or the repository. Without one, the daemon tests fail (they do not
skip): `python/run-tests.sh` builds it first.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import textwrap
import threading
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def tollgate_bin() -> str:
    if os.environ.get("TOLLGATE_BIN"):
        return os.environ["TOLLGATE_BIN"]
    roots = [pathlib.Path(os.environ["CARGO_TARGET_DIR"])] if os.environ.get("CARGO_TARGET_DIR") else []
    roots.append(REPO / "target")
    for root in roots:
        for profile in ("release", "debug"):
            p = root / profile / "tollgate"
            if p.exists():
                return str(p)
    found = shutil.which("tollgate")
    if found:
        return found
    raise RuntimeError("no tollgate binary: set TOLLGATE_BIN or run `cargo build -p tollgate`")


def make_pki(out: pathlib.Path, clients, server_names=("localhost", "127.0.0.1"),
             listen: str = "127.0.0.1:0") -> None:
    """`tollgate certs --out OUT`: a CA, a server certificate for `server_names`, a client
    certificate per `ORG/AGENT` in `clients`, and `grpc.toml`."""
    args = [tollgate_bin(), "certs", "--out", str(out), "--listen", listen]
    for c in clients:
        args += ["--client", c]
    for n in server_names:
        args += ["--server-name", n]
    subprocess.run(args, check=True, capture_output=True)


# The agents of `default` the gRPC tests connect as: each has its own certificate.
GRPC_AGENTS = ("grpc-bot", "held-bot", "async-grpc", "refused-bot", "slow-grpc", "v6-bot")


class Daemon:
    """A `tollgate serve` in its own process, on a socket in a temporary directory.

    With `grpc=True`, `tollgate certs` first writes a test PKI to `pki/` (a CA; the
    daemon's certificate, for `server_names` only; client certificates for agents of
    organizations `default` and `acme`, each naming its agent, `spiffe://ORG/AGENT`), the
    daemon also serves gRPC with mutual TLS on `listen` (`grpc_addr`: the port it got), and
    `ca`, `cert`, `key` are the files agent `agent` of `default` connects with
    (`pki/client-default-AGENT.{pem,key}` for each of `GRPC_AGENTS`;
    `pki/client-acme-bot.{pem,key}`: `bot` of `acme`). A certificate that names an agent
    registers as that agent only.

    `files` (name -> text) are written beside the configuration file before the daemon
    starts, for what it names by a relative path (a `[policy]` section's Cedar files)."""

    def __init__(self, config: str = "", grpc: bool = False, server_names=("127.0.0.1",),
                 listen: str = "127.0.0.1:0", files=None) -> None:
        # A short path: a Unix socket's path is limited to about 100 bytes.
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="tg-"))
        for name, body in (files or {}).items():
            (self.dir / name).write_text(textwrap.dedent(body))
        self.socket = self.dir / "s.sock"
        self.data = self.dir / "data"
        text = textwrap.dedent(config)
        if grpc:
            self.pki = self.dir / "pki"
            make_pki(self.pki, ["default/agent", "acme/bot"] + [f"default/{a}" for a in GRPC_AGENTS],
                     server_names, listen)
            self.ca = self.pki / "ca.pem"
            self.cert = self.pki / "client-default-agent.pem"
            self.key = self.pki / "client-default-agent.key"
            text = (self.pki / "grpc.toml").read_text() + text
        cfg = self.dir / "tollgate.toml"
        cfg.write_text(text)
        self.proc = subprocess.Popen(
            [tollgate_bin(), "serve", "--config", str(cfg), "--data-dir", str(self.data),
             "--socket", str(self.socket)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.banner = []
        self.grpc_addr = ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # the banner ends once it is listening
            self.banner.append(line)
            if line.strip().startswith("gRPC (mutual TLS): "):
                self.grpc_addr = line.split(": ", 1)[1].strip()
            # The socket's line comes first, the gRPC address (if any) after it, and the
            # audit line last.
            if ("listening on" in line and not grpc) or self.grpc_addr or line.strip().startswith("audit:"):
                break
        if "listening on" not in "".join(self.banner) or (grpc and not self.grpc_addr):
            raise RuntimeError("tollgate serve did not start:\n" + "".join(self.banner))
        # Keep reading its output (the log), so a full pipe never stalls the daemon.
        self.log: list = []
        threading.Thread(target=self.log.extend, args=(self.proc.stdout,), daemon=True).start()
        self.secret_file = self.data / "secrets" / "default.secret"
        self.operator_secret_file = self.data / "secrets" / "default.operator.secret"

    def audited(self, agent_id: str, column: str = "kind") -> list:
        """One column (by default the kind) of the audit entries about `agent_id`'s
        sessions, in order, from `tollgate audit export` (which verifies the log with the
        daemon's public key). Every entry is durable before the daemon answers the
        request that made it."""
        out = subprocess.run(
            [tollgate_bin(), "audit", "export", "--format", "jsonl", "--key", str(self.data / "audit.pub"),
             str(self.data / "audit")], check=True, capture_output=True, text=True)
        rows = [json.loads(line) for line in out.stdout.splitlines() if line]
        return [r[column] for r in rows if r["agent_id"] == agent_id]

    def reload_policies(self) -> subprocess.CompletedProcess:
        """`tollgate policy reload` (over the socket, with the operator secret): the
        daemon reads its `[policy]` files again; once this returns, the set it names
        decides every session's next call. Exit code 1 when the set was refused."""
        return subprocess.run(
            [tollgate_bin(), "policy", "reload", "--data-dir", str(self.data), "--socket", str(self.socket)],
            capture_output=True, text=True, timeout=60)

    def pause(self) -> None:
        """SIGSTOP, and wait until every thread of the daemon is stopped: the signal is
        delivered asynchronously, and on a loaded machine a thread could still answer a
        request sent right after `kill` returned."""
        self.proc.send_signal(signal.SIGSTOP)
        tasks = pathlib.Path(f"/proc/{self.proc.pid}/task")
        for _ in range(2000):
            try:
                states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
            except OSError:
                states = []
            if states and all(st in ("T", "t") for st in states):
                return
            time.sleep(0.005)
        raise RuntimeError("the daemon did not stop after SIGSTOP")

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


DAEMON_CONFIG = """
    [guard.default]
    budget_usd = 1.0
    max_repeat_calls = 3

    [guard.agents.held-bot]
    hitl_mode = "always"

    [limits]
    await_decision_max_secs = 60
"""


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(DAEMON_CONFIG)
    yield d
    d.stop()


@pytest.fixture
def data_dir() -> pathlib.Path:
    return REPO / "tests" / "data"


def wait_until_held(op, session_id, with_params=True):
    """Poll the operator's list until the session's call is held and, by default, its
    params have been shown: up to 30 s (a liveness bound, not a timing threshold), with a
    pause between polls so the client that sends the params gets the CPU."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for p in op.pending():
            if p["session_id"] == session_id and p["decision"] == "" and (p["params"] is not None or not with_params):
                return p
        time.sleep(0.01)
    raise AssertionError("the call was never held")


# Issue 18: a daemon with a `[policy]` section (docs/policy.md), default deny. The rules
# the policy tests enforce, in two files (set order: tools.cedar, then flows.cedar):
#   an allow-list   `allowed-tools` names every tool an agent may call;
#   argument rules  `shell-commands` (only listed commands) and `big-payments` (a payment
#                   over 100 USD is held for a human, `@hitl`);
#   a flow label    `reads-customers` labels the session `customer-data`, after which
#                   `mail-out-after-customer-data` refuses e-mail outside acme.example.
POLICY_TOOLS = """
    @id("allowed-tools")
    permit (principal, action in [Action::"search", Action::"shell", Action::"pay",
                                  Action::"crm_lookup", Action::"send_email"], resource);

    @id("shell-commands")
    forbid (principal, action == Action::"shell", resource)
    unless { context.args has command && ["ls", "cat", "grep", "wc"].contains(context.args.command) };

    @id("big-payments") @hitl("payment over 100 USD")
    permit (principal, action == Action::"pay", resource)
    when { context.args.amount.greaterThan(decimal("100.00")) };
"""

POLICY_FLOWS = """
    @id("reads-customers") @label("customer-data")
    permit (principal, action == Action::"crm_lookup", resource);

    @id("mail-out-after-customer-data")
    forbid (principal, action == Action::"send_email", resource)
    when { context.session.labels.contains("customer-data") && !(context.args.to like "*@acme.example") };
"""

# An emergency rule a reload adds while a payment is held (a forbid beats an approval).
POLICY_EMERGENCY = """
    @id("payments-frozen")
    forbid (principal, action == Action::"pay", resource);
"""

POLICY_CONFIG = """
    [guard.default]
    budget_usd = 10.0
    max_repeat_calls = 5

    [limits]
    await_decision_max_secs = 60

    [policy]
    files = ["tools.cedar", "flows.cedar"]
    default = "deny"
"""


@pytest.fixture(scope="module")
def policy_daemon():
    d = Daemon(POLICY_CONFIG, files={"tools.cedar": POLICY_TOOLS, "flows.cedar": POLICY_FLOWS})
    yield d
    d.stop()
