"""Tool-schema fairness scenario (issue 30 item 1): a hostile tenant sends requests with
128 unique tool schemas at full tilt while a well-behaved tenant sends agent-style tool
requests (the same 8 tools each time); the well-behaved tenant's requests must all
succeed, with p99 latency within 1.5x of a run without the attack.

The hostile schemas are all distinct (no cache hit ever) and the last one is invalid, so
every hostile request costs the full meta-validation of 128 schemas and then gets 400:
the most validation work per request, none of it reaching the engine. The ingress runs
under uvicorn on a loopback port (real HTTP), the model is a FakeEngine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from agentserve.serve.backend import LocalBackend
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine

from tests.reliability.scenario import Outcome, scenario
from tests.reliability.tenants import serve_in_thread

__all__ = ["SchemaRun", "run_schemas"]

KEY_HOSTILE, KEY_GOOD = "sk-schema-hostile", "sk-schema-good"
MODEL = "m"
P99_RATIO_MAX = 1.5
HOSTILE_READY = 96  # hostile bodies encoded before the run (about 12 MB)


def _spec() -> Any:
    tenants = [
        {"name": "hostile", "api_key_sha256": hash_api_key(KEY_HOSTILE), "sla": {}},
        {"name": "good", "api_key_sha256": hash_api_key(KEY_GOOD), "sla": {}},
    ]
    return DeploymentSpec.model_validate(
        {
            "models": [{"name": MODEL, "engine": "fake", "max_model_len": 4096, "max_num_seqs": 8}],
            "tenants": tenants,
        }
    )


def _tool(tag: str, i: int, properties: int = 12) -> dict[str, Any]:
    props = {
        f"{tag}_{j}": {"type": "string", "description": f"field {j}", "enum": ["a", "b", "c"]}
        for j in range(properties)
    }
    parameters = {"type": "object", "properties": props, "required": [f"{tag}_0"]}
    return {"type": "function", "function": {"name": f"tool_{i}", "parameters": parameters}}


def hostile_body(n: int) -> dict[str, Any]:
    """128 tools, every schema new (tagged with `n`), the last one invalid."""
    tools = [_tool(f"h{n}x{i}", i) for i in range(127)]
    tools.append(
        {"type": "function", "function": {"name": "bad", "parameters": {"type": f"no{n}"}}}
    )
    return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": tools}


GOOD_BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "look this up for me"}],
    "tools": [_tool("g", i) for i in range(8)],
    "max_tokens": 8,
}


@dataclass
class SchemaRun:
    """What one run saw."""

    good: dict[str, int] = field(default_factory=dict)
    hostile: dict[str, int] = field(default_factory=dict)
    latency_s: list[float] = field(default_factory=list)  # the good tenant's, 200s only

    def p(self, q: float) -> float | None:
        if not self.latency_s:
            return None
        ordered = sorted(self.latency_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _count(by: dict[str, int], status: int) -> None:
    by[str(status)] = by.get(str(status), 0) + 1


async def _good(client: Any, url: str, until: float, gap_s: float, run: SchemaRun) -> None:
    headers = {"Authorization": f"Bearer {KEY_GOOD}"}

    async def one() -> None:
        start = time.perf_counter()
        try:
            r = await client.post(url, json=GOOD_BODY, headers=headers)
        except Exception:  # a dropped connection: counted as lost
            _count(run.good, 0)
            return
        _count(run.good, r.status_code)
        if r.status_code == 200 and r.json()["choices"]:
            run.latency_s.append(time.perf_counter() - start)

    tasks = []
    while time.monotonic() < until:
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(gap_s)
    await asyncio.gather(*tasks)


async def _hostile(
    client: Any, url: str, until: float, workers: int, run: SchemaRun, ready: list[bytes]
) -> None:
    """`ready`: bodies encoded before the run (the client shares the server's process
    here; a real attacker's encoding costs the server nothing)."""
    headers = {"Authorization": f"Bearer {KEY_HOSTILE}", "Content-Type": "application/json"}
    numbers = itertools.count()

    def body() -> bytes:
        n = next(numbers)
        return ready[n] if n < len(ready) else json.dumps(hostile_body(n)).encode()

    async def worker() -> None:
        while time.monotonic() < until:
            try:
                r = await client.post(url, content=body(), headers=headers)
                _count(run.hostile, r.status_code)
            except Exception:
                _count(run.hostile, 0)

    await asyncio.gather(*(worker() for _ in range(workers)))


def run_schemas(
    attack: bool, duration_s: float = 8.0, good_gap_s: float = 0.05, workers: int = 8
) -> SchemaRun:
    """One run, with or without the hostile tenant."""
    import httpx
    from agentserve.serve.ingress import create_app  # imports vLLM: lazily

    engine = FakeEngine(MODEL, 4096, token_delay_s=0.002, max_num_seqs=8, accept_per_step=2)
    asyncio.run(engine.start())
    app = create_app(_spec(), {MODEL: LocalBackend(engine)})
    run = SchemaRun()
    ready = [json.dumps(hostile_body(n)).encode() for n in range(HOSTILE_READY)] if attack else []

    async def drive(base: str) -> None:
        url = f"{base}/v1/chat/completions"
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=30, limits=limits, trust_env=False) as client:
            await client.post(url, json=GOOD_BODY, headers={"Authorization": f"Bearer {KEY_GOOD}"})
            until = time.monotonic() + duration_s
            jobs = [_good(client, url, until, good_gap_s, run)]
            if attack:
                jobs.append(_hostile(client, url, until, workers, run, ready))
            await asyncio.gather(*jobs)

    with serve_in_thread(app) as base:
        asyncio.run(drive(base))
    return run


def _summary(run: SchemaRun) -> dict[str, Any]:
    ms = {f"good_{k}_ms": run.p(q) for k, q in (("p50", 0.5), ("p99", 0.99))}
    return {
        "good_statuses": run.good,
        "hostile_statuses": run.hostile,
        **{k: None if v is None else round(1000 * v, 1) for k, v in ms.items()},
    }


@scenario("tenant_tool_schemas")
def tenant_tool_schemas(duration_s: float = 8.0) -> Outcome:
    """A hostile tenant sends unique 128-tool schemas from 8 clients at full tilt; the
    well-behaved tenant's tool requests (20/s) all succeed, p99 within 1.5x of a run
    without the attack."""
    quiet = run_schemas(False, duration_s)
    attacked = run_schemas(True, duration_s)
    good_sent = sum(attacked.good.values())
    good_ok = attacked.good.get("200", 0)
    hostile_due = sum(n for s, n in attacked.hostile.items() if s in ("400", "429"))
    errors_5xx = sum(
        n for by in (attacked.good, attacked.hostile) for s, n in by.items() if s.startswith("5")
    )
    base, under = quiet.p(0.99), attacked.p(0.99)
    ratio = None if not base or under is None else round(under / base, 2)
    return Outcome(
        requests=good_sent + sum(attacked.hostile.values()),
        lost=(good_sent - good_ok) + (sum(attacked.hostile.values()) - hostile_due),
        errors_5xx=errors_5xx,
        restarts=0,
        details={
            "no_attack": _summary(quiet),
            "attack": _summary(attacked),
            "good_p99_ratio": ratio,
            "good_p99_within_1_5x": ratio is not None and ratio <= P99_RATIO_MAX,
        },
    )
