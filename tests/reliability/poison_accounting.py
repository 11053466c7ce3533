"""Poison accounting (issue 64 item 5): a tenant sends requests that crash every replica
they run on (a vLLM bug some input triggers), repeatedly, one of them as an n=8 batch,
while another tenant streams. One death counter per request (its choices share it, a
replica counts once) and quarantine keyed by tenant and request: each poison request
costs at most one wave of replicas, its repeats none, and the other tenant's streams all
complete (those on a dying replica continue on another), their TPOT within 1.2x of the
rounds without the attack (interleave.py).

No Ray here: `ReplicaSet` is the model as the ingress's router sees it, REPLICAS fake
engines served in turn; a request whose prompt holds POISON kills the replica serving it
after its first token, also when it arrives as a continuation (every stream on that
replica then raises EngineDeadError with the replica's id), and the replica comes back
RESTART_S later under a new id. With no replica alive a request waits for one, as Ray
Serve's router holds requests while replicas start. The control is the deaths count:
before item 5 each choice counted its own deaths, so one n=8 batch could take two waves.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from agentserve.engine.protocol import EngineDeadError, EngineRequest, EngineStats
from agentserve.serve.poison import POISON_DEATHS
from agentserve_bench.fake_engine import FakeEngine

from tests.reliability.hostile_lists import (
    KEY_HOSTILE,
    MODEL,
    hostile_outcome,
    post_attack,
    run_interleaved,
    two_tenant_spec,
)
from tests.reliability.scenario import Outcome, scenario

__all__ = ["POISON_BODIES", "ReplicaSet", "attack", "poison_accounting"]

REPLICAS = 4
RESTART_S = 1.0
WAIT_FOR_REPLICA_S = 30.0


def _poison(n: int, tag: str) -> bytes:
    messages = [{"role": "user", "content": f"POISON {tag} crash the engine please"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 16, "n": n}
    return json.dumps(body).encode()


POISON_BODIES = {"poison_single": _poison(1, "one"), "poison_batch_n8": _poison(8, "batch")}


class ReplicaSet:
    """REPLICAS fake engines behind one ModelBackend (see the module docstring);
    `deaths` counts replica deaths."""

    def __init__(self, count: int = REPLICAS, restart_s: float = RESTART_S):
        self.restart_s = restart_s
        self.live: dict[str, FakeEngine] = {}
        self.deaths = 0
        self._names = (f"replica-{i}" for i in itertools.count())
        self._turn = itertools.count()
        self._changed = asyncio.Event()
        self._count = count

    async def start(self) -> None:
        for _ in range(self._count):
            await self._add()

    async def _add(self) -> None:
        engine = FakeEngine(MODEL, 4096, token_delay_s=0.01, max_num_seqs=8, accept_per_step=1)
        await engine.start()
        self.live[next(self._names)] = engine
        self._changed.set()

    def _kill(self, name: str) -> None:
        if self.live.pop(name, None) is not None:
            self.deaths += 1
            loop = asyncio.get_running_loop()
            loop.call_later(self.restart_s, lambda: loop.create_task(self._add()))

    async def _pick(self) -> str:
        async with asyncio.timeout(WAIT_FOR_REPLICA_S):
            while not self.live:
                self._changed.clear()
                await self._changed.wait()
        names = sorted(self.live)
        return names[next(self._turn) % len(names)]

    def generate(self, request: EngineRequest) -> AsyncIterator[Any]:
        return self._generate(request)

    async def _generate(self, request: EngineRequest) -> AsyncIterator[Any]:
        name = await self._pick()
        poison = "POISON" in str(request.body)
        async for delta in self.live[name].generate(request):
            if name not in self.live:
                raise EngineDeadError(f"{name} died", replica=name)
            yield delta
            if poison:
                self._kill(name)
                raise EngineDeadError(f"{name} crashed on a poison request", replica=name)

    async def embed(self, request: Any) -> Any:
        raise NotImplementedError

    async def stats(self) -> EngineStats:
        return EngineStats(running=0, waiting=0)

    async def health(self) -> None:
        return None

    async def ready_replicas(self) -> int | None:
        return len(self.live) or None  # None: the router waits for one


def attack(url: str, folder: str) -> dict[str, dict[str, int]]:
    """This scenario's hostile client: POISON_BODIES, over and over."""
    return post_attack(url, folder, KEY_HOSTILE, POISON_BODIES)


@scenario("tenant_poison_accounting")
def poison_accounting(rounds: int = 5, per_round: int = 4) -> Outcome:
    """A tenant sends a request that crashes every replica it runs on, and an n=8 batch
    of another, over and over, while another tenant streams on 4 replicas: each gets
    400, at most POISON_DEATHS deaths per request plus one wave for the batch in all
    (repeats are refused at once), the other tenant's streams all complete, median TPOT
    within 1.2x of the quiet rounds."""
    replicas = ReplicaSet()
    quiet, attacked, hostile = run_interleaved(
        two_tenant_spec(), "tests.reliability.poison_accounting", rounds, per_round,
        backend=replicas,
    )  # fmt: skip
    outcome = hostile_outcome(quiet, attacked, hostile)
    bound = POISON_DEATHS + REPLICAS  # the single one's budget, the batch's one wave
    outcome.details |= {
        "replica_deaths": replicas.deaths,
        "replica_deaths_bound": bound,
        "deaths_within_bound": replicas.deaths <= bound,
    }
    outcome.restarts = replicas.deaths
    return outcome


if __name__ == "__main__":  # the hostile client: URL SWITCH_FOLDER
    print(json.dumps(attack(sys.argv[1], sys.argv[2])))
