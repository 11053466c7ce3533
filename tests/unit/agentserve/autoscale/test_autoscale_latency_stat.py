"""The latency statistic both worlds feed the policy: pooled nearest-rank p95 over every
replica's window (autoscale/latency_stat.py), and the check that the live path (replica
windows -> Ray stats -> adapter) and the simulator give the same number for the same
requests."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from agentserve.autoscale.latency_stat import (
    GROWTH,
    LatencyWindow,
    bucket_of,
    bucket_upper_ms,
    histogram,
    nearest_rank,
    p95_of_histogram,
    pooled_p95,
    pooled_tenant_latency,
    tpot_ms,
)
from agentserve.autoscale.policy import PolicyState
from agentserve.autoscale.ray_policy import snapshot_from_context
from agentserve.engine.protocol import Delta
from agentserve.serve.replica_stats import ACCEPTED_AT_HEADER, TENANT_HEADER, ReplicaStats
from agentserve_bench.autoscale.simulate import RequestRecord, SimConfig, _Sim
from agentserve_bench.autoscale.trace import Trace, TraceConfig


def p95(samples: list[float]) -> float:
    """Test oracle: nearest-rank p95 of raw samples (the statistic before bucketing)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@pytest.mark.parametrize("ms", [0.0, 0.5, 1.0, 1.01, 7.3, 49.9, 50.0, 1499.0, 1500.0, 9e5])
def test_a_bucket_reports_an_upper_edge_within_five_percent(ms):
    edge = bucket_upper_ms(bucket_of(ms))
    assert edge >= ms - 1e-9
    assert edge <= max(1.0, ms * GROWTH) + 1e-9


def test_the_statistic_is_nearest_rank_on_the_bucketed_samples():
    rng = np.random.default_rng(3)
    for n in (1, 2, 19, 20, 21, 100, 333):
        samples = list(rng.lognormal(6.0, 1.0, n))
        assert pooled_p95([samples]) == bucket_upper_ms(bucket_of(p95(samples)))
    assert pooled_p95([]) is None and pooled_p95([[], []]) is None


def test_pooled_is_not_the_worst_replica():
    fast = [100.0] * 19
    slow = [100.0] * 18 + [5000.0]
    # worst replica's nearest-rank p95 would be 5000 ms; pooled over 38 samples it is 100 ms
    assert pooled_p95([fast, slow]) == bucket_upper_ms(bucket_of(100.0))
    # ...until the slow samples reach the top 5% of the pool
    assert pooled_p95([fast, [5000.0] * 2 + slow[2:]]) == bucket_upper_ms(bucket_of(5000.0))


def test_splitting_samples_across_replicas_does_not_change_the_statistic():
    rng = np.random.default_rng(5)
    samples = list(rng.lognormal(5.0, 1.5, 200))
    whole = pooled_p95([samples])
    for k in (2, 3, 7):
        assert pooled_p95([samples[i::k] for i in range(k)]) == whole


def test_fractional_counts_use_the_same_rank_rule():
    assert p95_of_histogram({1: 0.5, 10: 9.5}) == bucket_upper_ms(10)
    assert p95_of_histogram({1: 9.6, 10: 0.4}) == bucket_upper_ms(1)
    assert p95_of_histogram({}) is None and histogram([]) == {}


def test_pooled_tenant_latency_sums_requests_and_keeps_tenants_apart():
    a = {"chat": LatencyWindow.of([100.0], [20.0]), "batch": LatencyWindow.of([9000.0], [])}
    b = {"chat": LatencyWindow.of([300.0], [], requests=4)}
    out = pooled_tenant_latency([a, b])
    assert out["chat"].requests == 5 and out["batch"].requests == 1
    assert out["chat"].ttft_p95_ms == bucket_upper_ms(bucket_of(300.0))
    assert out["batch"].tpot_p95_ms is None


def _requests(now: float, n: int, seed: int) -> list[RequestRecord]:
    """Finished requests of two tenants with first and last tokens inside a 30 s window."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        tenant = "interactive" if i % 3 else "batch"
        first = now - rng.uniform(0.5, 25.0)
        arrival = first - rng.lognormal(-0.5, 1.0)
        tokens = int(rng.integers(2, 200))
        finish = min(now, first + tokens * rng.uniform(0.02, 0.12))
        q = RequestRecord(tenant, arrival, 100, 100, tokens, first, finish, float(tokens))
        out.append(q)
    return out


def _simulator_view(now: float, requests: list[RequestRecord]):
    sim = _Sim(Trace(TraceConfig(), ()), lambda _s: 1, SimConfig(window_s=30.0))
    sim.all, sim.done = list(requests), list(requests)
    return sim.snapshot(now).tenants


def _live_view(now: float, requests: list[RequestRecord], replicas: int):
    """The same requests served round-robin by `replicas` replicas, each keeping its own
    ReplicaStats window and publishing it; the adapter reads the latest reports."""
    clock = SimpleNamespace(now=0.0)
    stats = [ReplicaStats(30.0, lambda: clock.now) for _ in range(replicas)]
    events = []
    for i, q in enumerate(requests):
        events += [(q.first_token_s, 1, i, q), (q.finish_s, 2, i, q)]
    for i, q in enumerate(requests):
        s = stats[i % replicas]
        clock.now = q.arrival_s
        headers = {TENANT_HEADER: q.tenant, ACCEPTED_AT_HEADER: str(round(q.arrival_s * 1e9))}
        s.begin(str(i), headers)
    for t, kind, i, q in sorted(events, key=lambda e: (e[0], e[1], e[2])):
        clock.now, s = t, stats[i % replicas]
        if kind == 1:
            s.see(str(i), Delta("a", 100, 1))
        else:
            s.see(str(i), Delta("b", 100, q.output_tokens, finish_reason="stop"))
            s.end(str(i))
    clock.now = now
    raw: dict[str, dict[str, list]] = {}
    for r, s in enumerate(stats):
        report = s.autoscaling_stats(SimpleNamespace(running=0, waiting=0, spec_by_batch=()))
        for key, value in report.items():
            raw.setdefault(key, {})[f"r{r}"] = [SimpleNamespace(timestamp=now, value=value)]
    ctx = SimpleNamespace(
        current_time=now,
        current_num_replicas=replicas,
        target_num_replicas=replicas,
        aggregated_metrics={},
        raw_metrics=raw,
        total_queued_requests=0.0,
        total_num_requests=0.0,
    )
    return snapshot_from_context(ctx, PolicyState()).tenants


@pytest.mark.parametrize(("n", "replicas"), [(40, 1), (120, 3), (300, 8)])
def test_live_adapter_and_simulator_feed_the_policy_the_same_numbers(n, replicas):
    now = 1000.0
    requests = _requests(now, n, seed=n)
    sim, live = _simulator_view(now, requests), _live_view(now, requests, replicas)
    assert set(sim) == set(live) == {"interactive", "batch"}
    for tenant in sim:
        assert live[tenant].ttft_p95_ms == pytest.approx(sim[tenant].ttft_p95_ms, rel=1e-12)
        assert live[tenant].tpot_p95_ms == pytest.approx(sim[tenant].tpot_p95_ms, rel=1e-12)
        assert live[tenant].requests == sim[tenant].requests
        ttft = [q.ttft_ms for q in requests if q.tenant == tenant]
        assert sim[tenant].ttft_p95_ms == bucket_upper_ms(bucket_of(p95(ttft)))


def test_tpot_is_per_output_token_after_the_first_in_every_world():
    assert tpot_ms(1.0, 1.5, 11) == pytest.approx(50.0)
    assert tpot_ms(1.0, 1.0, 1) is None and tpot_ms(None, 2.0, 5) is None
    assert tpot_ms(1.0, None, 5) is None
    record = RequestRecord("a", 0.0, 10, 11, 11, first_token_s=1.0, finish_s=1.5)
    assert record.tpot_ms == tpot_ms(1.0, 1.5, 11)


def test_nearest_rank_on_raw_samples_is_the_histograms_rank_rule():
    """The benchmarks' percentile (raw samples) and the policy's p95 (pooled histogram)
    pick the same rank: on samples that sit on bucket edges they agree exactly."""
    rng = np.random.default_rng(7)
    for n in (1, 2, 19, 20, 21, 60, 101):
        values = [bucket_upper_ms(int(i)) for i in rng.integers(0, 120, n)]
        assert nearest_rank(values, 0.95) == pooled_p95([values[: n // 2], values[n // 2 :]])
    assert nearest_rank(range(1, 101), 0.5) == 50 and nearest_rank([], 0.95) is None
