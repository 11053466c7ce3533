"""serve/local.init_local_ray on a real Ray: the cluster `agentserve up` starts runs
without the loops nobody reads (ray_env.UNREAD, the log monitor), and still runs work.
A verbose start keeps the log monitor (it copies Ray's log lines to the terminal)."""

from __future__ import annotations

import os

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")


def _ray_processes() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _cmdlines() -> list[str]:
    lines = []
    for proc in _ray_processes():
        try:
            lines.append(" ".join(proc.cmdline()))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return lines


def _raylet_environ() -> dict[str, str]:
    for proc in _ray_processes():
        try:
            if proc.name() == "raylet":
                return proc.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no raylet among {_cmdlines()}")


@pytest.fixture
def clean_environ():
    saved = dict(os.environ)
    from agentserve.ray_env import UNREAD

    for key in UNREAD:
        os.environ.pop(key, None)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("verbose", [False, True])
def test_local_ray_runs_without_unread_loops_and_still_runs_tasks(clean_environ, verbose):
    from agentserve.ray_env import UNREAD
    from agentserve.serve import local

    local.init_local_ray(1, verbose=verbose)
    try:
        monitors = [line for line in _cmdlines() if "log_monitor.py" in line]
        assert bool(monitors) is verbose, monitors
        environ = _raylet_environ()
        for key, value in UNREAD.items():
            assert environ.get(key) == value, key

        @ray.remote
        def square(x: int) -> int:
            return x * x

        assert ray.get(square.remote(7), timeout=120) == 49
    finally:
        ray.shutdown()
    assert not [line for line in _cmdlines() if "raylet" in line]
