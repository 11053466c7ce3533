"""Attacked and quiet measurements interleaved in one run, for the input scenarios
(hostile_lists, structured_outputs, slow_bodies, poison): the machine these run on is
shared, so a quiet run measured a minute before the attacked one compares two different
machines. Here the attacker (its own process, as real clients are) is switched on and off
between rounds of the victim's streams, through files in a directory (`Switch`), and the
victim's TPOT is compared round by round.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "ROOT",
    "Switch",
    "Victim",
    "interleaved",
    "median_ms",
    "spawn_attacker",
    "tpot_details",
]

ROOT = Path(__file__).resolve().parents[2]
SWITCH_TIMEOUT_S = 60.0
# The attacker stands for a remote client: on this shared 2-core machine its own CPU
# (encoding and sending 4 MiB bodies) would otherwise be taken from the server measured.
ATTACKER_NICE = 10


class Switch:
    """Files in `folder`: `go` (attack now), `stop` (attacker exits), `idle` (the attacker
    has nothing in flight). The runner calls on/off/finish, the attacker wait_go/active."""

    def __init__(self, folder: str):
        self.go, self.stop = Path(folder, "go"), Path(folder, "stop")
        self.idle = Path(folder, "idle")

    def on(self, settle_s: float) -> None:
        """Attack; returns once the attacker is busy and `settle_s` passed."""
        self.go.touch()
        _until(lambda: not self.idle.exists())
        time.sleep(settle_s)

    def off(self) -> None:
        """Stop attacking; returns once the attacker has nothing in flight."""
        self.go.unlink(missing_ok=True)
        _until(self.idle.exists)

    def finish(self) -> None:
        self.go.unlink(missing_ok=True)
        self.stop.touch()

    def wait_go(self) -> bool:
        """Attacker side: mark idle, wait for `go`; False once `stop` exists."""
        self.idle.touch()
        while not self.go.exists():
            if self.stop.exists():
                return False
            time.sleep(0.02)
        self.idle.unlink(missing_ok=True)
        return True

    def active(self) -> bool:
        return self.go.exists() and not self.stop.exists()


def _until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + SWITCH_TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("the attacker process did not follow the switch")
        time.sleep(0.01)


def spawn_attacker(module: str, *args: str) -> subprocess.Popen[str]:
    """`python -m module args...` from the repository root, stdout piped, at
    ATTACKER_NICE."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = ["nice", "-n", str(ATTACKER_NICE), sys.executable, "-m", module, *args]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


class Victim:
    """The well-behaved tenant's results: statuses, truncated streams, TPOTs (s)."""

    def __init__(self) -> None:
        self.statuses: dict[str, int] = {}
        self.truncated = 0
        self.tpot_s: list[float] = []

    def see(self, status: int, tpot: float | None, done: bool) -> None:
        self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
        self.truncated += status == 200 and not done
        if tpot is not None:
            self.tpot_s.append(tpot)

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    @property
    def lost(self) -> int:
        """Requests without a complete 200 answer."""
        return self.sent - (self.statuses.get("200", 0) - self.truncated)

    @property
    def errors_5xx(self) -> int:
        return sum(n for s, n in self.statuses.items() if s.startswith("5"))


def interleaved(
    stream: Callable[[], tuple[int, float | None, bool]],
    switch: Switch,
    rounds: int,
    per_round: int,
    settle_s: float = 0.5,
) -> tuple[Victim, Victim]:
    """(quiet, attacked): `rounds` x (`per_round` streams quiet, then `per_round` with the
    attacker on)."""
    quiet, attacked = Victim(), Victim()
    for _ in range(rounds):
        for _ in range(per_round):
            quiet.see(*stream())
        switch.on(settle_s)
        for _ in range(per_round):
            attacked.see(*stream())
        switch.off()
    return quiet, attacked


def median_ms(values: list[float]) -> float | None:
    return round(1000 * statistics.median(values), 2) if values else None


def tpot_details(quiet: Victim, attacked: Victim, ratio_max: float) -> dict[str, Any]:
    """The victim's median TPOT quiet and attacked, their ratio and whether it is within
    `ratio_max`."""
    base, under = median_ms(quiet.tpot_s), median_ms(attacked.tpot_s)
    ratio = round(under / base, 2) if base and under else None
    return {
        "no_attack_tpot_median_ms": base,
        "attack_tpot_median_ms": under,
        "tpot_ratio": ratio,
        "tpot_within_1_2x": ratio is not None and ratio <= ratio_max,
        "good_statuses": attacked.statuses,
        "good_statuses_quiet": quiet.statuses,
    }
