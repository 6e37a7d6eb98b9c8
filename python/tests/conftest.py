"""Shared fixtures: the repository's data files, and a real `tollgate serve` on a
temporary socket.

The daemon binary is `$TOLLGATE_BIN`, else `target/{release,debug}/tollgate` under
`$CARGO_TARGET_DIR` or the repository. Without one, the daemon tests fail (they do not
skip): `python/run-tests.sh` builds it first.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import textwrap

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


class Daemon:
    """A `tollgate serve` in its own process, on a socket in a temporary directory."""

    def __init__(self, config: str = "") -> None:
        # A short path: a Unix socket's path is limited to about 100 bytes.
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="tg-"))
        self.socket = self.dir / "s.sock"
        cfg = self.dir / "tollgate.toml"
        cfg.write_text(textwrap.dedent(config))
        self.proc = subprocess.Popen(
            [tollgate_bin(), "serve", "--config", str(cfg), "--data-dir", str(self.dir / "data"),
             "--socket", str(self.socket)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.banner = []
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # the banner ends once it is listening
            self.banner.append(line)
            if "listening on" in line:
                break
        else:
            raise RuntimeError("tollgate serve did not start:\n" + "".join(self.banner))
        self.secret_file = self.dir / "data" / "secrets" / "default.secret"
        self.operator_secret_file = self.dir / "data" / "secrets" / "default.operator.secret"

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

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
