"""tests/run.py, the suite runner CI and README use: unit tests spread over cores, then the
rest in one process; its exit status; and README's test command is the one .ci/run runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import run

ROOT = Path(__file__).resolve().parents[3]


def test_phase_one_is_the_unit_tests_on_workers_and_phase_two_the_rest_in_one_process():
    (unit, unit_env), (rest, rest_env) = run.phases(["-x", "-k", "foo"], 2)
    assert unit == ["tests/unit", "-n", "2", "-x", "-k", "foo"]
    assert rest == ["tests", "--ignore=tests/unit", "-x", "-k", "foo"]
    assert "-n" not in rest and rest_env == {}
    assert unit_env["OMP_NUM_THREADS"]  # one thread per worker unless the caller set it
    (unit, _), _ = run.phases([], 0)
    assert unit == ["tests/unit"]  # no xdist: one process


def test_workers_follow_the_cores_and_need_xdist(monkeypatch):
    monkeypatch.setattr(run.os, "sched_getaffinity", lambda _pid: set(range(16)))
    assert run.workers() == run.MAX_WORKERS
    monkeypatch.setattr(run.os, "sched_getaffinity", lambda _pid: {0, 1})
    assert run.workers() == 2
    monkeypatch.setattr(run.os, "sched_getaffinity", lambda _pid: {0})
    assert run.workers() == 0
    monkeypatch.setattr(run.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(run.importlib.util, "find_spec", lambda name: None)
    assert run.workers() == 0


@pytest.mark.parametrize(
    ("statuses", "options", "expected"),
    [
        ([0, 0], [], 0),
        ([1, 0], [], 1),
        ([0, 2], [], 2),
        ([5, 0], [], 5),  # the whole suite collected nothing in one phase: broken checkout
        ([5, 0], ["-q"], 5),  # CI passes -q: an empty phase still fails it
        ([0, 5], ["-q", "-x"], 5),
        ([5, 0], ["-k", "x"], 0),  # a filter that selects nothing in one phase
        ([5, 0], ["-q", "-kx"], 0),
        ([0, 5], ["-m", "slow"], 0),
        ([0, 5], ["--deselect=tests/e2e"], 0),
        ([5, 0], ["--lf"], 0),
        ([5, 5], ["-k", "x"], 5),
        ([5, 1], ["-k", "x"], 1),
    ],
)
def test_the_exit_status_is_the_first_failure(statuses, options, expected):
    assert run.combined_status(statuses, options) == expected


def test_main_runs_both_phases_and_refuses_paths(monkeypatch, capsys):
    calls = []

    def call(command, cwd, env):
        calls.append((command, env))
        return 1 if len(calls) == 2 else 0

    monkeypatch.setattr(run.subprocess, "call", call)
    assert run.main(["-q"]) == 1  # phase 2 failed
    assert [c[0][3] for c in calls] == ["tests/unit", "tests"]
    assert all(c[0][1:3] == ["-m", "pytest"] for c in calls)
    calls.clear()
    assert run.main(["tests/unit/repo"]) == 2 and not calls
    assert "not paths" in capsys.readouterr().err


def test_readme_test_command_is_the_one_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    (command,) = re.findall(r"^\./install\.sh --dev && .+$", readme, flags=re.M)
    assert "tests.run" in command
    assert command in ci.splitlines()


@pytest.mark.parametrize("status", [2, 3, 4])
def test_an_interrupted_or_unusable_phase_ends_the_run(monkeypatch, status):
    calls = []
    monkeypatch.setattr(run.subprocess, "call", lambda command, cwd, env: calls.append(1) or status)
    assert run.main(["-q"]) == status and len(calls) == 1


def test_ctrl_c_ends_the_run_with_130(monkeypatch, capsys):
    def interrupted(command, cwd, env):
        raise KeyboardInterrupt

    monkeypatch.setattr(run.subprocess, "call", interrupted)
    assert run.main(["-q"]) == run.INTERRUPTED
    assert "interrupted" in capsys.readouterr().err
