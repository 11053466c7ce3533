"""Tenant isolation scenario: tenant A floods far above its limits while tenant B sends
steady streaming traffic; B's requests must all succeed within B's SLA (p95 TTFT and
TPOT, measured by the client).

The ingress app runs under uvicorn on a loopback port (real HTTP and SSE), the model is a
FakeEngine whose steps slow down with the running batch (token_delay_s + per_seq_delay_s
x running, at most max_num_seqs running), so A's admitted requests really compete with
B's. A control run repeats the flood with A unlimited: B then misses its SLA, which shows
that the check can fail and that the limits are what protects B.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from agentserve.serve.backend import LocalBackend
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine

from tests.reliability.scenario import Outcome, scenario

__all__ = ["IsolationRun", "isolation_spec", "run_isolation", "serve_in_thread"]

KEY_A, KEY_B = "sk-flood-a", "sk-steady-b"
MODEL = "m"
A_LIMITS = {"requests_per_minute": 600, "tokens_per_minute": 30_000, "max_concurrent_requests": 2}
B_SLA = {"ttft_p95_ms": 300.0, "tpot_p95_ms": 50.0}


def isolation_spec(limit_a: bool = True) -> Any:
    """Two tenants on one fake model: A with A_LIMITS (or none), B with B_SLA."""

    tenant_a = {
        "name": "flood-a",
        "api_key_sha256": hash_api_key(KEY_A),
        "sla": {},
        "rate_limit": A_LIMITS if limit_a else {},
    }
    tenant_b = {"name": "steady-b", "api_key_sha256": hash_api_key(KEY_B), "sla": B_SLA}
    return DeploymentSpec.model_validate(
        {
            "models": [{"name": MODEL, "engine": "fake", "max_model_len": 512, "max_num_seqs": 8}],
            "tenants": [tenant_a, tenant_b],
        }
    )


@contextmanager
def serve_in_thread(app: Any, lifespan: str = "off", **options: Any) -> Iterator[str]:
    """Serve `app` with uvicorn on 127.0.0.1 (a free port) in a thread; yields the URL.
    `options`: more uvicorn.Config arguments (limit_concurrency, ...)."""
    import uvicorn

    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan, **options
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class IsolationRun:
    """What one run saw, per tenant."""

    statuses: dict[str, dict[str, int]] = field(default_factory=lambda: {"a": {}, "b": {}})
    ttft_s: list[float] = field(default_factory=list)  # B's, one per successful request
    tpot_s: list[float] = field(default_factory=list)  # B's
    truncated: int = 0  # B streams without [DONE]
    retry_after_ok: bool = True  # every 429 had a Retry-After >= 1

    def count(self, tenant: str, status: int) -> None:
        by = self.statuses[tenant]
        by[str(status)] = by.get(str(status), 0) + 1

    def sent(self, tenant: str) -> int:
        return sum(self.statuses[tenant].values())


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _flood(
    client: Any, url: str, until: float, workers: int, gap_s: float, run: IsolationRun
):
    """A: `workers` loops, each sending a request every `gap_s` whatever the answer
    (a client that ignores 429 and Retry-After)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "flood " * 60}]}
    headers = {"Authorization": f"Bearer {KEY_A}"}

    async def worker() -> None:
        while time.monotonic() < until:
            r = await client.post(url, json={**body, "max_tokens": 64}, headers=headers)
            run.count("a", r.status_code)
            if r.status_code == 429:
                run.retry_after_ok &= int(r.headers.get("retry-after", "0")) >= 1
            await asyncio.sleep(gap_s)

    await asyncio.gather(*(worker() for _ in range(workers)))


async def _steady(client: Any, url: str, until: float, gap_s: float, run: IsolationRun):
    """B: one streaming request every `gap_s` (each on its own task, so B's rate does
    not drop when it is slowed down); TTFT and TPOT measured per request."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "steady tenant question"}],
        "max_tokens": 24,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {KEY_B}"}

    async def one() -> None:
        start = time.perf_counter()
        first = last = None
        done, tokens = False, 0
        async with client.stream("POST", url, json=body, headers=headers) as r:
            run.count("b", r.status_code)
            if r.status_code != 200:
                await r.aread()
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                if any(c["delta"].get("content") for c in event.get("choices", [])):
                    last = time.perf_counter()
                    first = first or last
        if not done or first is None:
            run.truncated += 1
            return
        run.ttft_s.append(first - start)
        if tokens > 1:
            run.tpot_s.append((last - first) / (tokens - 1))

    tasks = []
    while time.monotonic() < until:
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(gap_s)
    await asyncio.gather(*tasks)


def run_isolation(
    limit_a: bool = True,
    duration_s: float = 4.0,
    flood_workers: int = 8,
    flood_gap_s: float = 0.05,
    steady_gap_s: float = 0.1,
) -> tuple[IsolationRun, Any]:
    """One run (A limited or not); returns what it saw and the engine."""
    import httpx
    from agentserve.serve.ingress import create_app  # imports vLLM: lazily

    engine = FakeEngine(
        MODEL, 512, token_delay_s=0.01, per_seq_delay_s=0.004, max_num_seqs=8, accept_per_step=2
    )
    asyncio.run(engine.start())
    app = create_app(isolation_spec(limit_a), {MODEL: LocalBackend(engine)})
    run = IsolationRun()

    async def drive(base: str) -> None:
        url = f"{base}/v1/chat/completions"
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client:
            until = time.monotonic() + duration_s
            await asyncio.gather(
                _flood(client, url, until, flood_workers, flood_gap_s, run),
                _steady(client, url, until, steady_gap_s, run),
            )

    with serve_in_thread(app) as base:
        asyncio.run(drive(base))
    return run, engine


def _summary(run: IsolationRun, duration_s: float) -> dict[str, Any]:
    ms = {
        f"b_{name}_{q}_ms": None if v is None else round(1000 * v, 1)
        for name, values in (("ttft", run.ttft_s), ("tpot", run.tpot_s))
        for q, v in (("p50", _p(values, 0.5)), ("p95", _p(values, 0.95)))
    }
    return {
        "a_sent": run.sent("a"),
        "a_offered_per_s": round(run.sent("a") / duration_s, 1),
        "a_statuses": run.statuses["a"],
        "b_sent": run.sent("b"),
        "b_statuses": run.statuses["b"],
        "b_truncated": run.truncated,
        **ms,
    }


def within_sla(run: IsolationRun) -> bool:
    """B's client-side p95 TTFT and TPOT within B_SLA."""
    ttft, tpot = _p(run.ttft_s, 0.95), _p(run.tpot_s, 0.95)
    return (
        ttft is not None
        and tpot is not None
        and 1000 * ttft <= B_SLA["ttft_p95_ms"]
        and 1000 * tpot <= B_SLA["tpot_p95_ms"]
    )


@scenario("tenant_isolation")
def tenant_isolation(duration_s: float = 4.0) -> Outcome:
    """Tenant A floods (8 clients, ~130 req/s offered vs 10 req/s and 2 concurrent
    allowed) while tenant B streams 10 req/s: B all 200 within its p95 TTFT/TPOT SLA;
    control run with A unlimited shows B's SLA broken."""
    run, engine = run_isolation(True, duration_s)
    control, _ = run_isolation(False, duration_s)
    b_ok = run.statuses["b"].get("200", 0)
    a_due = sum(n for s, n in run.statuses["a"].items() if s in ("200", "429"))
    errors_5xx = sum(n for t in "ab" for s, n in run.statuses[t].items() if s.startswith("5"))
    restarts = 0
    try:
        asyncio.run(engine.health())
    except Exception:  # what a Serve health check would act on
        restarts = 1
    return Outcome(
        requests=run.sent("a") + run.sent("b"),
        lost=(run.sent("b") - b_ok) + run.truncated + (run.sent("a") - a_due),
        errors_5xx=errors_5xx,
        restarts=restarts,
        details={
            "sla_b": B_SLA,
            "limits_a": A_LIMITS,
            "b_within_sla": within_sla(run),
            "retry_after_on_every_429": run.retry_after_ok,
            "limited": _summary(run, duration_s),
            "control_a_unlimited": {
                **_summary(control, duration_s),
                "b_within_sla": within_sla(control),
            },
        },
    )
