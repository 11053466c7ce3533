"""Two tenants with different SLAs under a short concurrent load: latency per tenant as each
client measured it, SLA attainment, the server's own per-tenant figures and the replicas.

Start the platform with this directory's spec first:
    agentserve up --spec examples/03-sla-tenants/tenants.yaml
then: python examples/03-sla-tenants/sla_tenants.py [--requests N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from agentserve.sdk import connect
from agentserve.sdk.metrics_snapshot import parse_metrics
from agentserve.spec import load_spec

SPEC = Path(__file__).resolve().parent / "tenants.yaml"
KEYS = {"interactive": "sk-interactive-demo", "batch": "sk-batch-demo"}
PROMPTS = ("Write a haiku about speed.", "List four uses of a cache.", "Explain TTFT briefly.")


@dataclass
class Samples:
    """One tenant's client-side measurements, seconds."""

    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    errors: int = 0


async def one_request(client, model: str, prompt: str, samples: Samples) -> None:
    """Stream one chat completion; record time to first token and per output token."""
    start = time.perf_counter()
    first = None
    tokens = 0
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=48,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter()
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as err:  # a 429 for the batch tenant is expected under its limit
        samples.errors += 1
        print(f"  request failed: {type(err).__name__}: {err}"[:160])
        return
    end = time.perf_counter()
    if first is not None:
        samples.ttft.append(first - start)
        if tokens > 1:
            samples.tpot.append((end - first) / (tokens - 1))


async def load(tenant: str, base_url: str, model: str, requests: int, concurrency: int) -> Samples:
    """`requests` streamed chats for `tenant`, at most `concurrency` at a time."""
    client = connect(base_url, KEYS[tenant], model, frameworks=False).client
    await one_request(client, model, "warm up", Samples())  # client set-up is not latency
    samples, gate = Samples(), asyncio.Semaphore(concurrency)

    async def guarded(i: int) -> None:
        async with gate:
            await one_request(client, model, PROMPTS[i % len(PROMPTS)], samples)

    await asyncio.gather(*(guarded(i) for i in range(requests)))
    return samples


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    return (
        statistics.quantiles(values, n=20, method="inclusive")[-1] if len(values) > 1 else values[0]
    )


def report(tenant: str, samples: Samples, ttft_slo_s: float, tpot_slo_s: float) -> None:
    """One line per tenant: count, p50/p95 TTFT and TPOT, share of requests within the SLA."""
    within = sum(1 for x in samples.ttft if x <= ttft_slo_s) / max(1, len(samples.ttft))
    ms = lambda x: "-" if x is None else f"{x * 1000:.0f}"  # noqa: E731
    print(
        f"{tenant:<12} ok={len(samples.ttft):<3} errors={samples.errors:<3} "
        f"ttft p50/p95 ms={ms(statistics.median(samples.ttft) if samples.ttft else None)}/"
        f"{ms(p95(samples.ttft))} (slo {ttft_slo_s * 1000:.0f})  "
        f"tpot p95 ms={ms(p95(samples.tpot))} (slo {tpot_slo_s * 1000:.0f})  "
        f"ttft within slo={within:.0%}"
    )


def server_view(root: str) -> None:
    """The server's per-tenant TTFT p95 (/metrics) and the replicas per deployment (/status)."""
    metrics = parse_metrics(httpx.get(f"{root}/metrics", timeout=10, trust_env=False).text)
    for (model, tenant), stats in sorted(metrics.tenants.items()):
        q = stats.ttft.quantile(0.95)
        print(
            f"server: {model} {tenant:<12} requests={dict(stats.requests)} ttft p95 ms="
            f"{'-' if q is None else f'{q * 1000:.0f}'}"
        )
    response = httpx.get(f"{root}/status", timeout=10, trust_env=False)
    if not response.is_success:
        print(f"server: /status unavailable ({response.status_code})")
        return
    for app in response.json().get("applications", {}).values():
        for name, dep in app.get("deployments", {}).items():
            print(f"server: deployment {name} replicas {dep.get('replicas')}")


async def main_async(args: argparse.Namespace) -> None:
    spec = load_spec(SPEC)
    base_url = os.environ.get("AGENTSERVE_BASE_URL", "http://127.0.0.1:8000/v1")
    model = os.environ.get("AGENTSERVE_MODEL", spec.models[0].name)
    results = await asyncio.gather(
        *(load(t, base_url, model, args.requests, args.concurrency) for t in KEYS)
    )
    slas = {t.name: t.sla for t in spec.tenants}
    for tenant, samples in zip(KEYS, results, strict=True):
        sla = slas[tenant]
        report(tenant, samples, sla.ttft_p95_ms / 1000, sla.tpot_p95_ms / 1000)
    server_view(base_url.removesuffix("/v1"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12, help="requests per tenant")
    parser.add_argument("--concurrency", type=int, default=6, help="in flight per tenant")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
