"""Requests held at the ingress reach the live policy (found by review): the ingress sends a
model no more than its replicas' slots and keeps the rest in its deadline queue, which Ray's
autoscaling context never counts. The replicas carry the ingresses' board
(serve/held_board.py) in their stats; the adapter adds it to queue, in-flight and TTFT."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")

from agentserve.autoscale.latency_stat import LatencyWindow, bucket_of, bucket_upper_ms
from agentserve.autoscale.policy import PolicyState
from agentserve.autoscale.ray_policy import (
    SlaAutoscalingPolicy,
    encode_replica_stats,
    ingress_held,
    ray_autoscaling_config,
    snapshot_from_context,
)
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig
from test_autoscale_ray_policy import SPEC, context


def replica(held=None, ttft_ms=400.0):
    """A calm replica (10 requests, TTFT `ttft_ms`, TPOT 20 ms), carrying `held` =
    (published at, slots, {tenant: held waits in ms}) as it read the board."""
    board = None
    if held is not None:
        at, slots, waits = held
        board = (at, slots, {t: LatencyWindow.of(ms, []) for t, ms in waits.items()})
    return encode_replica_stats(
        {"chat": LatencyWindow.of([ttft_ms] * 10, [20.0] * 10)},
        arrival_rate_rps=1.0,
        mean_prompt_tokens=100,
        mean_output_tokens=50,
        finished_requests=10,
        held=board,
    )


def test_the_freshest_reading_counts_once_not_one_per_replica():
    """Every replica reads the same board: summing them would count each held request
    once per replica; an older reading loses to a newer one."""
    old = replica((100.0, 30, {"chat": [5000.0] * 30}))
    new = replica((104.0, 12, {"chat": [3000.0] * 12}))
    reports = {"r0": old, "r1": new, "r2": replica()}
    held, windows = ingress_held(reports)
    assert held == 12 and windows["chat"].requests == 12
    assert sum(windows["chat"].ttft.values()) == 12 and windows["chat"].tpot == {}
    assert ingress_held({"r0": replica()}) == (0, {})


def test_held_requests_join_the_queue_in_flight_and_ttft():
    config = AutoscalingConfig(**ray_autoscaling_config(SPEC))
    held = (999.0, 12, {"chat": [3000.0] * 12})
    ctx = context(config, running=2, target=2, replicas_stats=[replica(held), replica(held)])
    snap = snapshot_from_context(ctx, PolicyState())
    assert (snap.queued, snap.in_flight) == (12, 4 + 12)
    # 20 replica samples at 400 ms and 12 held at 3 s: p95 is a held one
    assert snap.tenants["chat"].ttft_p95_ms == bucket_upper_ms(bucket_of(3000.0))
    assert snap.tenants["chat"].requests == 32
    bare = snapshot_from_context(context(config, replicas_stats=[replica()] * 2), PolicyState())
    assert (bare.queued, bare.in_flight) == (0, 4)


def test_the_policy_sizes_the_fleet_for_the_line_at_the_ingress():
    """One replica, its 16 slots full (8 running, 8 queued in the engine), 16 more held at
    the ingress: sized for all 32 in flight at 8 x 0.8 per replica (5), not for the 16 it
    can see (3)."""
    raw = ray_autoscaling_config(SPEC)
    config = AutoscalingConfig(**raw)
    kwargs = raw["policy"]["policy_kwargs"]
    waiting = {"agentserve_engine_waiting": 8.0}
    line = (999.0, 16, {"chat": [900.0] * 16})
    seen = {**replica(line), **waiting}
    target, state = _apply_autoscaling_config(SlaAutoscalingPolicy(**kwargs))(
        context(config, running=1, target=1, replicas_stats=[seen], ongoing=16.0)
    )
    assert target == 5 and state["agentserve_last"]["reason"] == "sla_ratio"
    blind = {**replica(), **waiting}
    target, _ = _apply_autoscaling_config(SlaAutoscalingPolicy(**kwargs))(
        context(config, running=1, target=1, replicas_stats=[blind], ongoing=16.0)
    )
    assert target == 3
