"""Running an example script as a user does, against a served base URL (for tests/integration)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(script: str, base_url: str, *args: str, **env: str) -> str:
    """stdout of `python examples/<script> *args` with AGENTSERVE_BASE_URL=base_url; the
    test fails with the script's output when it exits non-zero."""
    environ = {**os.environ, "AGENTSERVE_BASE_URL": base_url, "NO_PROXY": "127.0.0.1", **env}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=environ,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
