"""tests/hard_exit.py: a crash while CPython tears modules down (CI's exit 139 after a finished
run) no longer decides pytest's exit status, and a failing test still fails the run.

Each case runs a real pytest in a subprocess on a scratch suite whose conftest installs the
hook as tests/conftest.py does; the scratch test leaves on `sys` an object whose finalizer
dereferences NULL, which runs only in the interpreter's late module teardown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[2]

CONFTEST = """
import hard_exit

hard_exit.install()


def pytest_sessionfinish(session, exitstatus):
    hard_exit.remember(session)
"""

SUITE = """
import ctypes
import sys


class CrashOnTeardown:
    def __del__(self, read=ctypes.string_at):
        read(0)


def test_leaves_a_crash_for_teardown():
    sys.crash_on_teardown = CrashOnTeardown()
    assert {outcome}
"""


def run_suite(tmp_path: Path, outcome: str, hard_exit: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_scratch.py").write_text(SUITE.format(outcome=outcome))
    env = {**os.environ, "PYTHONPATH": str(TESTS), "AGENTSERVE_PYTEST_HARD_EXIT": hard_exit}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:faulthandler"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_the_hook_the_teardown_crash_is_the_exit_status(tmp_path):
    result = run_suite(tmp_path, "True", hard_exit="0")
    assert "1 passed" in result.stdout
    assert result.returncode == -signal.SIGSEGV, result.stdout + result.stderr


@pytest.mark.parametrize(("outcome", "status"), [("True", 0), ("False", 1)])
def test_with_the_hook_pytest_status_is_the_exit_status(tmp_path, outcome, status):
    result = run_suite(tmp_path, outcome, hard_exit="1")
    assert result.returncode == status, result.stdout + result.stderr
    assert ("1 passed" if status == 0 else "1 failed") in result.stdout
