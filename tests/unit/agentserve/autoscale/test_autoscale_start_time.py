"""The measured replica start time: replicas report it, the adapter reduces the reports
(start_stat.measured_start_s, keeping the last value), and the pure policy plans with it
(warming credit, burst lead) instead of the spec's expected start."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
from agentserve.autoscale.burst import BurstKnobs
from agentserve.autoscale.latency_stat import LatencyWindow
from agentserve.autoscale.model import LatencyModel
from agentserve.autoscale.policy import (
    PolicySpec,
    PolicyState,
    Sla,
    Snapshot,
    TenantLatency,
    decide,
    planned_start_s,
)
from agentserve.autoscale.ray_policy import (
    START_KEY,
    SlaAutoscalingPolicy,
    encode_replica_stats,
    policy_spec_to_json,
    snapshot_from_context,
)
from agentserve.autoscale.start_stat import measured_start_s


@pytest.mark.parametrize(
    ("reports", "last", "want"),
    [
        ([40.0, 95.5, 41.0], None, 95.5),  # the largest of the replicas reporting now
        ([40.0], 95.5, 40.0),  # the slow replica went away: the current reports decide
        ([], 95.5, 95.5),  # nobody reports: the last measured value
        ([], None, None),  # never measured
        ([math.nan, -1.0, math.inf], 7.0, 7.0),  # nonsense is ignored
    ],
)
def test_measured_start_reduces_the_reports(reports, last, want):
    assert measured_start_s(reports, last) == want


def _stats(start_s: float | None) -> dict[str, float]:
    tenants = {"chat": LatencyWindow.of([300.0] * 5, [20.0] * 5)}
    return encode_replica_stats(
        tenants,
        arrival_rate_rps=1.0,
        mean_prompt_tokens=100,
        mean_output_tokens=50,
        replica_start_s=start_s,
    )


def _ctx(*reports: dict[str, float], policy_state=None, now=100.0) -> SimpleNamespace:
    metrics: dict[str, dict[str, float]] = {}
    for i, report in enumerate(reports):
        for key, value in report.items():
            metrics.setdefault(key, {})[f"r{i}"] = value
    n = max(1, len(reports))
    return SimpleNamespace(
        current_time=now,
        current_num_replicas=n,
        target_num_replicas=n,
        total_queued_requests=0.0,
        total_num_requests=2.0,
        aggregated_metrics=metrics,
        raw_metrics={},
        policy_state=policy_state or {},
    )


def test_the_start_time_travels_encoded_and_decoded():
    assert _stats(42.5)["agentserve_replica_start_s"] == 42.5
    assert "agentserve_replica_start_s" not in _stats(None)  # not ready: nothing reported
    snap = snapshot_from_context(_ctx(_stats(42.5), _stats(97.0)), PolicyState())
    assert snap.replica_start_s == 97.0
    assert snap.tenants["chat"].requests == 10  # the other stats decode as before
    assert snapshot_from_context(_ctx(_stats(None)), PolicyState(), 50.0).replica_start_s == 50.0
    assert snapshot_from_context(_ctx(_stats(None)), PolicyState()).replica_start_s is None


def test_the_adapter_keeps_the_last_measured_start_when_replicas_go_away():
    policy = SlaAutoscalingPolicy(**policy_spec_to_json(PolicySpec(min_replicas=0)))
    _, state = policy(_ctx(_stats(42.5)))
    assert state[START_KEY] == 42.5 and state["agentserve_last"]["replica_start_s"] == 42.5
    _, state = policy(_ctx(policy_state=state, now=105.0))  # no replica reports
    assert state[START_KEY] == 42.5


SLAS = {"chat": Sla(1000.0, 50.0)}
BASE = PolicySpec(min_replicas=1, max_replicas=8, slas=SLAS, replica_start_s=60.0)


def _warming(start_s: float | None) -> Snapshot:
    """2 ready, one warming for 30 s; TPOT ratio 1.45: above the band on 2 + 0.75 credited
    replicas (60 s start: 1.05), inside it on 2 + 1 (30 s start: 0.97)."""
    tenants = {"chat": TenantLatency(300.0, 72.5, 20)}
    return Snapshot(1000.0, 2, (30.0,), tenants=tenants, in_flight=4, replica_start_s=start_s)


@pytest.mark.parametrize(
    ("start_s", "planned", "target", "reason"),
    [
        (None, 60.0, 4, "sla_ratio"),  # nothing reported: the spec's 60 s, credit 0.75
        (30.0, 30.0, 3, "hold"),  # measured 30 s: the warming replica counts fully
        (90.0, 90.0, 4, "sla_ratio"),  # measured slower than expected: credit 2/3
        (0.01, 1.0, 3, "hold"),  # an instant engine still counts as one second
    ],
)
def test_warming_credit_uses_the_reported_start(start_s, planned, target, reason):
    snap = _warming(start_s)
    old = PolicyState(up_since_s=0.0)
    decision = decide(snap, BASE, old)
    assert planned_start_s(snap, BASE) == planned
    assert (decision.target_replicas, decision.reason) == (target, reason)


def test_the_burst_lead_is_the_reported_start():
    spec = replace(
        BASE, max_replicas=16, model=LatencyModel(), max_drafted=7, burst=BurstKnobs(lead_s=45.0)
    )
    calm = {"chat": TenantLatency(500.0, 30.0, 50)}

    def floor(start_s: float | None) -> int:
        snap = Snapshot(
            1000.0,
            8,
            tenants=calm,
            in_flight=30,
            arrival_rate_rps=9.0,
            recent_arrival_rate_rps=11.5,
            mean_prompt_tokens=100,
            mean_output_tokens=100,
            replica_start_s=start_s,
        )
        return decide(snap, spec).capacity_floor

    assert floor(None) == floor(45.0)  # the spec's lead until a start is reported
    assert floor(5.0) < floor(45.0) <= floor(120.0)
