"""Tenant-limits keeper faults: the keeper is stalled (SIGSTOP 3 s) and then killed and
restarted under load; no tenant gets more than one request over its concurrency limit,
and none is locked out (under its limit, wanting more, nothing starting) for longer than
the lease renewal period.

Two ingress apps (uvicorn threads, each with its own fake engine) share one keeper that
runs in its own process (keeper_proc.py), as ingress replicas share the keeper deployment.
Two tenants, each limited to 3 requests in flight, send from 6 clients each (half through
each ingress), retrying 50 ms after a 429. A counter at the engines records each tenant's
requests in flight, so the checks are on what really ran, not on what the ingresses say.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from agentserve.admission.quota_book import RENEW_S
from agentserve.serve.backend import LocalBackend
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine

from tests.reliability.keeper_proc import KeeperHandle
from tests.reliability.scenario import Outcome, scenario
from tests.reliability.tenants import serve_in_thread

__all__ = ["keeper_faults", "longest_lockout_s"]

LIMIT = 3
TENANTS = {"alpha": "sk-keeper-alpha-0123", "beta": "sk-keeper-beta-0123"}
ROOT = Path(__file__).resolve().parents[2]


def _spec() -> DeploymentSpec:
    tenants = [
        {
            "name": name,
            "api_key_sha256": hash_api_key(key),
            "sla": {},
            "rate_limit": {"max_concurrent_requests": LIMIT},
        }
        for name, key in TENANTS.items()
    ]
    model = {"name": "m", "engine": "fake", "max_model_len": 256, "max_num_seqs": 16}
    return DeploymentSpec.model_validate(
        {"models": [model], "tenants": tenants, "server": {"ingress_replicas": 2}}
    )


class _Counting:
    """A backend that records (time, tenant, +1 | -1) as each engine request starts/ends."""

    def __init__(self, inner: LocalBackend, events: list[tuple[float, str, int]]):
        self.inner, self.events = inner, events

    def generate(self, request: Any) -> Any:
        return self._count(request.headers.get("x-agentserve-tenant", "?"), request)

    async def _count(self, tenant: str, request: Any) -> Any:
        self.events.append((time.monotonic(), tenant, +1))
        try:
            async for delta in self.inner.generate(request):
                yield delta
        finally:
            self.events.append((time.monotonic(), tenant, -1))

    async def stats(self) -> Any:
        return await self.inner.stats()

    async def health(self) -> None:
        await self.inner.health()

    async def ready_replicas(self) -> int | None:
        return 1


class _KeeperProcess:
    """The keeper process on a fixed port: start, stop (SIGSTOP/SIGCONT), kill."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        """Start it; seconds until it listens."""
        began = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.keeper_proc", str(self.port)],
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT,
            text=True,
        )
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the keeper process did not start")
        return time.monotonic() - began

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.kill()


def longest_lockout_s(
    events: list[tuple[float, str, int]], tenant: str, until: float
) -> tuple[float, float | None]:
    """The longest stretch before `until` in which `tenant` had fewer than LIMIT requests
    running and none started (its clients always want more: that is a lock-out), and
    when it began."""
    running, since, longest, began = 0, None, 0.0, None
    for at, who, step in sorted(events):
        if who != tenant or at > until:
            continue
        if step > 0:
            if since is not None and at - since > longest:
                longest, began = at - since, since
            since = None
        running += step
        if running < LIMIT and since is None:
            since = at
    if since is not None and until - since > longest:
        longest, began = until - since, since
    return longest, began


def _max_running(events: list[tuple[float, str, int]], tenant: str) -> int:
    running = most = 0
    for _, who, step in sorted(events):
        if who == tenant:
            running += step
            most = max(most, running)
    return most


async def _clients(urls: list[str], until: float, statuses: dict[str, Counter]) -> None:
    import httpx

    body = {"model": "m", "messages": [{"role": "user", "content": "w " * 8}], "max_tokens": 8}

    async def worker(client: Any, tenant: str, url: str) -> None:
        headers = {"authorization": f"Bearer {TENANTS[tenant]}"}
        while time.monotonic() < until:
            try:
                r = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
                status = str(r.status_code)
            except httpx.HTTPError as err:
                status = type(err).__name__
            statuses[tenant][status] += 1
            if status != "200":
                await asyncio.sleep(0.05)

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=30, limits=limits, trust_env=False) as client:
        await asyncio.gather(
            *(worker(client, t, urls[i % 2]) for t in TENANTS for i in range(2 * LIMIT))
        )


def _after(urls: list[str]) -> dict[str, list[int]]:
    """Each tenant's one request through each ingress once the load is over."""
    import httpx

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    seen: dict[str, list[int]] = {}
    with httpx.Client(timeout=30, trust_env=False) as client:
        for tenant, key in TENANTS.items():
            headers = {"authorization": f"Bearer {key}"}
            seen[tenant] = [
                client.post(f"{u}/v1/chat/completions", json=body, headers=headers).status_code
                for u in urls
            ]
    return seen


@scenario("tenant_keeper_faults")
def keeper_faults(
    duration_s: float = 16.0, stall_at_s: float = 3.0, stall_s: float = 3.0, kill_at_s: float = 9.0
) -> Outcome:
    """Two ingresses, one keeper process, two tenants limited to 3 in flight, 6 clients
    each; the keeper is stalled (SIGSTOP) 3 s, later killed and restarted: no tenant more
    than one over its limit, none locked out longer than RENEW_S (2 s), both served after."""
    from agentserve.admission.shared_limits import SharedQuota
    from agentserve.serve.ingress import create_app  # imports vLLM: lazily

    keeper, events = _KeeperProcess(), []
    statuses: dict[str, Counter] = {t: Counter() for t in TENANTS}
    timeline: dict[str, float] = {"keeper_start_s": round(keeper.start(), 2)}
    handle, spec = KeeperHandle(keeper.port), _spec()
    with ExitStack() as stack:
        stack.callback(keeper.stop)
        urls = []
        for _ in range(2):
            engine = FakeEngine("m", 256, token_delay_s=0.03)
            asyncio.run(engine.start())
            backend = _Counting(LocalBackend(engine), events)
            app = create_app(spec, {"m": backend}, quota=SharedQuota(handle, 2))
            urls.append(stack.enter_context(serve_in_thread(app)))

        def faults(start: float) -> None:
            time.sleep(max(0.0, start + stall_at_s - time.monotonic()))
            keeper.signal(signal.SIGSTOP)
            time.sleep(stall_s)
            keeper.signal(signal.SIGCONT)
            time.sleep(max(0.0, start + kill_at_s - time.monotonic()))
            keeper.kill()
            timeline["keeper_restart_s"] = round(keeper.start(), 2)

        start = time.monotonic()
        until = start + duration_s
        thread = threading.Thread(target=faults, args=(start,), daemon=True)
        thread.start()
        asyncio.run(_clients(urls, until, statuses))
        thread.join(timeout=30)
        time.sleep(RENEW_S)  # the last finishes reach the keeper
        after = _after(urls)
    sent = sum(sum(c.values()) for c in statuses.values())
    due = sum(n for c in statuses.values() for s, n in c.items() if s in ("200", "429"))
    errors_5xx = sum(n for c in statuses.values() for s, n in c.items() if s.startswith("5"))
    lockouts = {t: longest_lockout_s(events, t, until) for t in TENANTS}
    per_tenant = {
        t: {
            "limit": LIMIT,
            "max_in_flight": _max_running(events, t),
            "longest_lockout_s": round(lockouts[t][0], 2),
            "lockout_began_at_s": None
            if lockouts[t][1] is None
            else round(lockouts[t][1] - start, 2),
            "statuses": dict(statuses[t]),
            "after": after[t],
        }
        for t in TENANTS
    }
    return Outcome(
        requests=sent,
        lost=sent - due,
        errors_5xx=errors_5xx,
        restarts=1,
        details={
            "tenants": per_tenant,
            "lockout_bound_s": RENEW_S,
            "stall_s": stall_s,
            **timeline,
        },
    )
