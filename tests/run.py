"""Run the whole test suite as CI does, in two phases:

1. the unit tests (tests/unit), spread over the CPU's cores with pytest-xdist, one OpenMP
   thread per worker;
2. everything else (tests that start real engines, Ray clusters, servers, Prometheus, the
   trace UI), one at a time in one process, as a plain `pytest` runs them: they time their
   own work and must not share the cores with each other.

    .venv/bin/python -m tests.run [pytest options]      e.g. -x, -k EXPR, --durations=60

The options go to both phases; give paths to `pytest` itself (`pytest tests/unit/x.py`), which
still runs anything in one process. Without pytest-xdist, or on one core, phase 1 runs in one
process too. The exit status is pytest's: 0 when both phases passed; a phase that collects
nothing fails the run (a broken checkout), as a plain `pytest -q` would, unless the options
select part of the suite (`-k`, `-m`, `--deselect`, `--lf`, `--sw`). A
phase that pytest reports interrupted, or that ends in a usage or internal error, ends the
run there; Ctrl-C ends it with 130.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNIT = "tests/unit"
MAX_WORKERS = 4  # past this, workers mostly wait on each other's imports (torch, vLLM)
NO_TESTS = 5  # pytest's exit status when it collected nothing
STOP = (2, 3, 4)  # pytest's statuses for interrupted, internal error, usage error
INTERRUPTED = 130  # a shell's status for a run stopped by Ctrl-C


def workers() -> int:
    """Processes for phase 1: the cores this process may use, at most MAX_WORKERS; 0 (no
    xdist) on one core or without pytest-xdist."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if (cores or 1) < 2 or importlib.util.find_spec("xdist") is None:
        return 0
    return min(cores or 1, MAX_WORKERS)


def phases(options: list[str], n: int) -> list[tuple[list[str], dict[str, str]]]:
    """[(pytest arguments, extra environment)] for the two phases."""
    unit = [UNIT, *(["-n", str(n)] if n else []), *options]
    rest = ["tests", f"--ignore={UNIT}", *options]
    return [(unit, {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}), (rest, {})]


# options that select part of the suite: with one of them a phase may rightly collect nothing
SELECTING = ("-k", "-m", "--deselect", "--lf", "--last-failed", "--sw", "--stepwise")


def selects(options: list[str]) -> bool:
    """Whether `options` select part of the suite (`-kEXPR`, `--deselect=ID` count too)."""
    return any(o.startswith(SELECTING) for o in options)


def combined_status(statuses: list[int], options: list[str]) -> int:
    """The first failure's status; NO_TESTS counts as one unless the options select part of
    the suite (a -k that selects nothing in one phase is fine; -q or -x change nothing
    there), and always when no phase collected anything."""
    failures = [s for s in statuses if s not in (0, NO_TESTS)]
    if failures:
        return failures[0]
    if all(s == NO_TESTS for s in statuses) or (not selects(options) and NO_TESTS in statuses):
        return NO_TESTS
    return 0


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    paths = [a for a in argv if not a.startswith("-") and (ROOT / a.split("::")[0]).exists()]
    if paths:
        print(
            f"tests.run: takes pytest options, not paths ({', '.join(paths)}); "
            "run `python -m pytest PATH` for part of the suite",
            file=sys.stderr,
        )
        return 2
    n = workers()
    statuses = []
    for number, (args, env) in enumerate(phases(argv, n), 1):
        label = f"{n} workers" if number == 1 and n else "one process"
        print(f"tests.run: phase {number}/2: pytest {shlex.join(args)} ({label})", flush=True)
        command = [sys.executable, "-m", "pytest", *args]
        try:
            statuses.append(subprocess.call(command, cwd=ROOT, env={**os.environ, **env}))
        except KeyboardInterrupt:  # Ctrl-C reached pytest too; it has reported what ran
            print("tests.run: interrupted", file=sys.stderr, flush=True)
            return INTERRUPTED
        if statuses[-1] in STOP:
            break  # interrupted, an internal error or a usage error: the next phase would too
    status = combined_status(statuses, argv)
    print(f"tests.run: phase statuses {statuses}, exit {status}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
