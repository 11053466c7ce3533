"""What sharing tenant limits across ingress replicas costs (admission/shared_limits.py).

`python -m agentserve_bench.limits_cost` starts a local Ray Serve with the tenant-limits
keeper deployment alone and times, for a rate-limited tenant, admit + finish through the
keeper (what each ingress replica does per request when server.ingress_replicas > 1)
against the same pair on the in-process RateLimiter (one ingress replica), at 1 and 16
requests at once. Prints a table and writes docs/benchmarks/limits_cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from agentserve.admission.shared_limits import LocalQuota, QuotaKeeper, SharedQuota
from agentserve.api.auth import Tenant
from agentserve.autoscale.latency_stat import nearest_rank
from agentserve.spec import RateLimitSpec, SLASpec

from agentserve_bench.report import default_docs

__all__ = ["main", "measure"]

DEFAULT_OUT = default_docs() / "benchmarks" / "limits_cost.json"
APP = "limits-cost"
TENANT = Tenant(
    name="limited",
    sla=SLASpec(ttft_p95_ms=1000, tpot_p95_ms=100),
    rate_limit=RateLimitSpec(max_concurrent_requests=1_000_000, tokens_per_minute=10**12),
)


async def measure(quota: LocalQuota | SharedQuota, calls: int, concurrency: int) -> dict:
    """admit + finish `calls` times, `concurrency` at once: per-admit latency p50/p95 (ms)
    and admissions per second."""
    gate, took = asyncio.Semaphore(concurrency), []

    async def one() -> None:
        async with gate:
            start = time.perf_counter()
            lease = await quota.admit(TENANT, reserve_tokens=100)
            took.append(time.perf_counter() - start)
            lease.finish(50)

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    wall = time.perf_counter() - start
    await quota.drain()  # the finishes, sent without waiting
    p50, p95 = nearest_rank(took, 0.5), nearest_rank(took, 0.95)
    return {
        "calls": calls,
        "concurrency": concurrency,
        "admit_p50_ms": round(1000 * p50, 3),
        "admit_p95_ms": round(1000 * p95, 3),
        "admits_per_s": round(calls / wall, 1),
    }


def _run(calls: int, port: int) -> list[dict[str, Any]]:
    import ray
    from agentserve.serve.app import quota_options
    from ray import serve

    records = []
    for c in (1, 16):
        local = asyncio.run(measure(LocalQuota(), calls, c))
        records.append({"store": "in_process", **local})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        keeper = serve.deployment(QuotaKeeper).options(**quota_options()).bind(recover_s=0)
        handle = serve.run(keeper, name=APP, route_prefix=None)

        async def shared(c: int) -> dict:
            quota = SharedQuota(handle, replicas=2)
            await measure(quota, 20, 1)  # warm the handle's router
            return await measure(quota, calls, c)

        for c in (1, 16):
            records.append({"store": "keeper", **asyncio.run(shared(c))})
    finally:
        serve.shutdown()
        ray.shutdown()
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m agentserve_bench.limits_cost",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument("--calls", type=int, default=1000, help="admissions per level (%(default)s)")
    p.add_argument("--port", type=int, default=8779, help="Serve HTTP port (%(default)s)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON (%(default)s)")
    args = p.parse_args(argv)
    records = _run(args.calls, args.port)
    print("| store | at once | admit p50 ms | admit p95 ms | admits/s |")
    print("|---|---|---|---|---|")
    for r in records:
        print(
            f"| {r['store']} | {r['concurrency']} | {r['admit_p50_ms']} | "
            f"{r['admit_p95_ms']} | {r['admits_per_s']} |"
        )
    command = "python -m agentserve_bench.limits_cost " + " ".join(argv or sys.argv[1:])
    report = {"command": command.strip(), "cpus": os.cpu_count(), "records": records}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
