"""Run an example of examples/python/ with this interpreter (the framework's venv)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples" / "python"


def run_example(name: str) -> str:
    env = {**os.environ, "CREWAI_DISABLE_TELEMETRY": "true", "OTEL_SDK_DISABLED": "true"}
    out = subprocess.run([sys.executable, "-W", "ignore", str(EXAMPLES / name)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout
