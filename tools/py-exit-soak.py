"""Issue 16 §6 soak: N runs (default 200) of a program that awaits a daemon call, settles,
kills the daemon with SIGKILL, awaits again and exits at once; counts runs that did not
exit cleanly (a fatal error at interpreter exit). Needs the `tollgate` package installed
in this interpreter and a `tollgate` binary ($TOLLGATE_BIN or target/debug/tollgate).

    python tools/py-exit-soak.py [N]

Not a test (it takes minutes); python/tests/test_daemon.py runs 20 of the same runs."""

import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python" / "tests"))
from conftest import DAEMON_CONFIG, Daemon  # noqa: E402
from test_daemon import EXIT_AFTER_LAST_AWAIT  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
script = pathlib.Path(tempfile.mkdtemp()) / "exit_after_last_await.py"
script.write_text(EXIT_AFTER_LAST_AWAIT)
bad = 0
for i in range(n):
    d = Daemon(DAEMON_CONFIG)
    try:
        p = subprocess.run([sys.executable, str(script), str(d.socket), str(d.secret_file), str(d.proc.pid)],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0 or "Fatal Python error" in p.stderr:
            bad += 1
            print(f"run {i}: exit {p.returncode}: {p.stderr.strip().splitlines()[-1:] }", flush=True)
    finally:
        d.stop()
print(f"{bad} of {n} runs did not exit cleanly")
sys.exit(1 if bad else 0)
