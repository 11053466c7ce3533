"""The limits-cost benchmark's measurement on the in-process limiter (the keeper run is in
tests/integration/test_ingress_replicas.py)."""

from __future__ import annotations

import asyncio

from agentserve.admission.shared_limits import LocalQuota
from agentserve_bench.limits_cost import TENANT, measure


def test_measure_counts_every_admission_and_finishes_each_lease():
    quota = LocalQuota()
    record = asyncio.run(measure(quota, calls=200, concurrency=16))
    assert record["calls"] == 200 and record["concurrency"] == 16
    assert 0 <= record["admit_p50_ms"] <= record["admit_p95_ms"]
    usage = quota.limiter._usage[TENANT.name]
    assert usage.in_flight == 0 and usage.reserved == 0  # all finished
    assert sum(n for _, n in usage.tokens) == 200 * 50  # each charged what it used
