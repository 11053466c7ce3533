"""Requests held at the ingress reach the live policy (found by review): the ingress sends a
model no more than its replicas' slots and keeps the rest in its deadline queue, which Ray's
autoscaling context never counts. The policy reads the ingresses' board
(serve/held_board.py) when it decides, in the controller (no replica report in between to
age it), and adds it to queue, in-flight and TTFT."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")

from agentserve.autoscale.latency_stat import LatencyWindow, bucket_of, bucket_upper_ms
from agentserve.autoscale.policy import PolicyState
from agentserve.autoscale.ray_policy import (
    BOARD_KEY,
    SlaAutoscalingPolicy,
    encode_replica_stats,
    ray_autoscaling_config,
    snapshot_from_context,
)
from agentserve.serve.held_board import HELD_SCOPE, HeldReport, MemoryHeldStore
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig
from test_autoscale_ray_policy import SPEC, context


def replica(ttft_ms=400.0):
    """A calm replica: 10 requests, TTFT `ttft_ms`, TPOT 20 ms."""
    return encode_replica_stats(
        {"chat": LatencyWindow.of([ttft_ms] * 10, [20.0] * 10)},
        arrival_rate_rps=1.0,
        mean_prompt_tokens=100,
        mean_output_tokens=50,
        finished_requests=10,
    )


def test_held_requests_join_the_queue_in_flight_and_ttft():
    config = AutoscalingConfig(**ray_autoscaling_config(SPEC))
    held = HeldReport(999.0, 12, {"chat": LatencyWindow.of([3000.0] * 12, [])})
    ctx = context(config, running=2, target=2, replicas_stats=[replica(), replica()])
    snap = snapshot_from_context(ctx, PolicyState(), held=held)
    assert (snap.queued, snap.in_flight) == (12, 4 + 12)
    # 20 replica samples at 400 ms and 12 held at 3 s: p95 is a held one
    assert snap.tenants["chat"].ttft_p95_ms == bucket_upper_ms(bucket_of(3000.0))
    assert snap.tenants["chat"].requests == 32
    bare = snapshot_from_context(context(config, replicas_stats=[replica()] * 2), PolicyState())
    assert (bare.queued, bare.in_flight) == (0, 4)


def _policy(raw, store):
    policy = SlaAutoscalingPolicy(**raw["policy"]["policy_kwargs"])
    policy.held_store = lambda app: store  # Ray's GCS store in the controller
    return _apply_autoscaling_config(policy)


def test_the_policy_sizes_the_fleet_for_the_line_at_the_ingress():
    """One replica, its 16 slots full (8 running, 8 queued in the engine), 16 more held at
    the ingress: sized for all 32 in flight at 8 x 0.8 per replica (5), not for the 16 it
    can see (3). A reading older than the board's STALE_S, or none, counts nothing."""
    raw = ray_autoscaling_config(SPEC)
    model = SPEC.models[0].name
    assert raw["policy"]["policy_kwargs"][BOARD_KEY] == {"scope": HELD_SCOPE, "model": model}
    config = AutoscalingConfig(**raw)
    full = {**replica(), "agentserve_engine_waiting": 8.0}
    now = 1000.0  # the context's wall clock

    def decide(store):
        ctx = context(config, running=1, target=1, replicas_stats=[full], ongoing=16.0, now=now)
        return _policy(raw, store)(ctx)

    line = HeldReport(now - 1, 16, {"chat": LatencyWindow.of([900.0] * 16, [])})
    store = MemoryHeldStore()
    store.put(f"{HELD_SCOPE}/{model}/ingress-a", line.to_json())
    target, state = decide(store)
    assert target == 5 and state["agentserve_last"]["reason"] == "sla_ratio"
    stale = MemoryHeldStore()
    stale.put(f"{HELD_SCOPE}/{model}/ingress-a", HeldReport(now - 30, 16).to_json())
    assert decide(stale)[0] == 3
    assert decide(MemoryHeldStore())[0] == 3


def test_an_unreadable_board_decides_without_it():
    raw = ray_autoscaling_config(SPEC)
    config = AutoscalingConfig(**raw)
    policy = SlaAutoscalingPolicy(**raw["policy"]["policy_kwargs"])

    def broken(app):
        raise ConnectionError("GCS unreachable")

    policy.held_store = broken
    ctx = context(config, running=1, target=1, replicas_stats=[replica()], ongoing=1.0)
    target, _ = _apply_autoscaling_config(policy)(ctx)
    assert target == 1
