"""Ray Serve adapter: a constructed AutoscalingContext drives the same decide()."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")

from agentserve.autoscale.latency_stat import LatencyWindow, bucket_of, bucket_upper_ms
from agentserve.autoscale.model import LatencyModel
from agentserve.autoscale.policy import PolicySpec, PolicyState, Sla, TenantLatency
from agentserve.autoscale.ray_policy import (
    DECIDED_KEY,
    STATE_KEY,
    WARMING_KEY,
    SlaAutoscalingPolicy,
    encode_replica_stats,
    policy_spec_from_json,
    policy_spec_to_json,
    ray_autoscaling_config,
    snapshot_from_context,
)
from agentserve.spec import DeploymentSpec, hash_api_key
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext

SPEC = DeploymentSpec.model_validate(
    {
        "models": [{"replicas": {"min_replicas": 1, "max_replicas": 6}, "max_num_seqs": 8}],
        "tenants": [
            {
                "name": "chat",
                "api_key_sha256": hash_api_key("k"),
                "sla": {"ttft_p95_ms": 1000, "tpot_p95_ms": 50},
            }
        ],
        # no standby: these tests check decide's plumbing (derived standby: its own test)
        "autoscaling": {"upscale_delay_s": 0, "standby_replicas": 0},
    }
)


def context(config, *, running=2, target=2, replicas_stats=(), state=None, now=1000.0, ongoing=4.0):
    ids = [f"r{i}" for i in range(running)]
    metrics: dict[str, dict[str, float]] = {}
    for rid, stats in zip(ids, replicas_stats, strict=False):
        for key, value in stats.items():
            metrics.setdefault(key, {})[rid] = value
    return AutoscalingContext(
        deployment_id=None,
        deployment_name="model",
        app_name="agentserve",
        current_num_replicas=running,
        target_num_replicas=target,
        running_replicas=ids,
        total_num_requests=ongoing,
        total_queued_requests=0.0,
        aggregated_metrics=metrics,
        raw_metrics={},
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas,
        policy_state=state or {},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=now,
        config=config,
    )


def stats(ttft, tpot, rate=1.0, tokens=(100, 50), finished=10):
    """A replica whose 10 requests all had TTFT `ttft` and TPOT `tpot` (ms)."""
    tenants = {"chat": LatencyWindow.of([ttft] * 10, [tpot] * 10)}
    prompt, output = tokens
    return encode_replica_stats(
        tenants,
        arrival_rate_rps=rate,
        mean_prompt_tokens=prompt,
        mean_output_tokens=output,
        finished_requests=finished,
    )


def test_config_is_valid_for_ray_and_neutralises_its_delays():
    raw = ray_autoscaling_config(SPEC, latency_model=LatencyModel())
    config = AutoscalingConfig(**raw)
    assert (config.min_replicas, config.max_replicas) == (1, 6)
    assert config.upscale_delay_s == 0 and config.downscale_delay_s == 0
    assert config.policy.policy_function.endswith("ray_policy:SlaAutoscalingPolicy")
    policy = policy_spec_from_json(raw["policy"]["policy_kwargs"])
    assert policy.slas == {"chat": Sla(1000, 50)} and policy.model == LatencyModel()
    default = ray_autoscaling_config(
        SPEC.model_copy(
            update={"autoscaling": SPEC.autoscaling.model_copy(update={"policy": "ray_default"})}
        )
    )
    assert "policy" not in default


def test_policy_json_roundtrip():
    spec = PolicySpec(slas={"a": Sla(1, 2)}, model=LatencyModel(alpha_1=0.5))
    assert policy_spec_from_json(policy_spec_to_json(spec)) == spec


def edge(ms):
    return bucket_upper_ms(bucket_of(ms))


def test_snapshot_from_context_pools_replicas_and_sums_rates():
    raw = ray_autoscaling_config(SPEC)
    config = AutoscalingConfig(**raw)
    ctx = context(
        config, running=2, target=3, replicas_stats=[stats(400, 20, 1.0), stats(900, 30, 2.0)]
    )
    snap = snapshot_from_context(ctx, PolicyState(last_up_s=990.0))
    # 20 pooled samples, half at 900 ms: rank 19 is 900 ms (its bucket's upper edge)
    assert snap.tenants["chat"] == TenantLatency(edge(900), edge(30), 20)
    assert snap.arrival_rate_rps == 3.0 and snap.warming_ages_s == (10.0,)
    assert (snap.ready_replicas, snap.draining_replicas, snap.in_flight) == (2, 0, 4)


def test_token_means_are_pooled_by_requests_finished_not_per_replica():
    """A replica just started (nothing finished) must not halve the fleet's means, which
    would halve the capacity floor after every scale-up."""
    config = AutoscalingConfig(**ray_autoscaling_config(SPEC))
    busy = stats(400, 20, tokens=(800, 300), finished=30)
    fresh = stats(400, 20, tokens=(0, 0), finished=0)
    other = stats(400, 20, tokens=(200, 100), finished=10)
    snap = snapshot_from_context(
        context(config, running=3, target=3, replicas_stats=[busy, fresh, other]), PolicyState()
    )
    assert snap.mean_prompt_tokens == pytest.approx((800 * 30 + 200 * 10) / 40)
    assert snap.mean_output_tokens == pytest.approx((300 * 30 + 100 * 10) / 40)


def test_ray_wrapper_runs_our_decision_and_keeps_state():
    raw = ray_autoscaling_config(SPEC)
    config = AutoscalingConfig(**raw)
    policy = _apply_autoscaling_config(SlaAutoscalingPolicy(**raw["policy"]["policy_kwargs"]))
    hot = [stats(1500, 30), stats(1400, 30)]  # TTFT ratio 1.5, upscale_delay_s 0
    target, state = policy(context(config, replicas_stats=hot))
    assert target == 3
    assert (
        state[STATE_KEY]["last_up_s"] == 1000.0
        and state["agentserve_last"]["reason"] == "sla_ratio"
    )
    # the next tick sees the warming replica and holds (one action in flight)
    target, state = policy(
        context(config, running=2, target=3, replicas_stats=hot, state=state, now=1005.0)
    )
    assert target == 3
    calm = [stats(300, 20), stats(300, 20)]
    target, _ = policy(context(config, replicas_stats=calm, state=state, now=1010.0))
    assert target == 2  # within downscale_delay_s of the scale-up: no down


def _in_flight_per_four(snap, spec, state):
    """A stand-in custom policy: one replica per 4 requests in flight, within bounds."""
    from agentserve.autoscale.policy import ScaleDecision

    target = min(spec.max_replicas, max(spec.min_replicas, -(-snap.in_flight // 4)))
    return ScaleDecision(target, "per_four", state)


class _PerFourPolicy(SlaAutoscalingPolicy):
    policy = staticmethod(_in_flight_per_four)


def test_a_subclass_runs_its_own_policy_with_the_same_plumbing():
    raw = ray_autoscaling_config(SPEC, policy_function="my_module:PerFour")
    assert raw["policy"]["policy_function"] == "my_module:PerFour"
    config = AutoscalingConfig(**ray_autoscaling_config(SPEC))  # Ray imports the path
    policy = _apply_autoscaling_config(_PerFourPolicy(**raw["policy"]["policy_kwargs"]))
    target, state = policy(context(config, ongoing=13.0))
    assert target == 4 and state["agentserve_last"]["reason"] == "per_four"
    target, _ = policy(context(config, ongoing=40.0))
    assert target == 6  # max_replicas


def test_standby_replicas_ride_above_the_policy_target():
    """Ray routes to every running replica: the adapter hides `standby_replicas` from the
    snapshot decide sees and asks Ray for decide's target plus them."""
    autoscaling = SPEC.autoscaling.model_copy(update={"standby_replicas": 2})
    raw = ray_autoscaling_config(SPEC.model_copy(update={"autoscaling": autoscaling}))
    assert raw["policy"]["policy_kwargs"]["standby_replicas"] == 2
    config = AutoscalingConfig(**raw)
    policy = _apply_autoscaling_config(SlaAutoscalingPolicy(**raw["policy"]["policy_kwargs"]))
    calm = [stats(300, 20)] * 3
    target, state = policy(context(config, running=3, target=3, replicas_stats=calm))
    assert target == 3  # decide saw 1 replica, held it; the fleet keeps its 2 standby
    hot = [stats(1500, 30)] * 3
    target, state = policy(context(config, running=3, target=3, replicas_stats=hot))
    assert target == 4 and state["agentserve_last"]["reason"] == "sla_ratio"


def test_default_standby_is_derived_from_the_replica_start():
    """standby_replicas null: the adapter runs the headroom fleet of standby.plan_fleet
    (no latency model: the demand is the replicas the requests in flight fill, at most
    decide's target; a 60 s start: g = 1, twice it) and hides the margin it added from
    the next decision."""
    autoscaling = SPEC.autoscaling.model_copy(update={"standby_replicas": None})
    raw = ray_autoscaling_config(SPEC.model_copy(update={"autoscaling": autoscaling}))
    assert raw["policy"]["policy_kwargs"]["standby_replicas"] is None
    config = AutoscalingConfig(**raw)
    policy = _apply_autoscaling_config(SlaAutoscalingPolicy(**raw["policy"]["policy_kwargs"]))
    calm = [stats(300, 20)] * 4
    busy = context(config, running=2, target=2, replicas_stats=calm[:2], ongoing=12.0)
    target, state = policy(busy)
    assert target == 4 and state["agentserve_last"]["reason"].startswith("hold")
    later = context(
        config, running=4, target=4, replicas_stats=calm, state=state, now=1010.0, ongoing=12.0
    )
    target, state = policy(later)
    assert target == 4  # decide saw 2 (the 2 standby hidden) and held


def test_burst_knobs_roundtrip_and_the_recent_rate_comes_from_latest_reports():
    from types import SimpleNamespace

    spec = PolicySpec(burst=PolicySpec().burst._replace(burst_ratio=1.4, lead_s=90.0))
    assert policy_spec_from_json(policy_spec_to_json(spec)) == spec
    point = lambda t, v: SimpleNamespace(timestamp=t, value=v)  # noqa: E731
    raw = {
        "agentserve_arrival_rps_recent": {
            "r0": [point(1.0, 9.0), point(2.0, 3.0)],
            "r1": [point(2.0, 4.0)],
        },
        "agentserve_ttft_hist:chat:90": {
            "r0": [point(1.0, 5.0)]
        },  # stale: not in r0's latest report
    }
    ctx = SimpleNamespace(
        current_time=10.0,
        current_num_replicas=2,
        target_num_replicas=2,
        total_queued_requests=0.0,
        total_num_requests=0.0,
        aggregated_metrics={},
        raw_metrics=raw,
    )
    snap = snapshot_from_context(ctx, PolicyState())
    assert snap.recent_arrival_rate_rps == 7.0 and "chat" not in snap.tenants


def test_one_decision_per_interval_between_ray_ticks():
    """Ray calls the policy every control-loop tick; it decides once per
    autoscaling.interval_s (5 s), as the simulator does, and keeps the target between."""
    raw = ray_autoscaling_config(SPEC)
    config = AutoscalingConfig(**raw)
    policy = _apply_autoscaling_config(SlaAutoscalingPolicy(**raw["policy"]["policy_kwargs"]))
    hot = [stats(1500, 30), stats(1400, 30)]
    target, state = policy(context(config, replicas_stats=hot))
    assert target == 3 and state[DECIDED_KEY] == 1000.0
    calm = [stats(300, 20), stats(300, 20)]  # would scale down, were it decided now
    held, kept = policy(context(config, running=3, target=3, replicas_stats=calm, state=state,
                                now=1004.9))  # fmt: skip
    assert held == 3 and kept == state  # not decided: nothing in the state moved
    _, later = policy(
        context(config, running=3, target=3, replicas_stats=calm, state=state, now=1005.0)
    )
    assert later[DECIDED_KEY] == 1005.0


def test_a_replica_replacing_a_crashed_one_is_aged_from_the_crash_not_the_last_scale_up():
    """Hours after the last scale-up a replica dies and Ray starts another: it warms (half
    credit at start), so a breach during its start is answered, not covered by full credit."""
    raw = ray_autoscaling_config(SPEC)
    config = AutoscalingConfig(**raw)
    policy = _apply_autoscaling_config(SlaAutoscalingPolicy(**raw["policy"]["policy_kwargs"]))
    calm = [stats(300, 20), stats(300, 20)]
    _, state = policy(context(config, running=2, target=2, replicas_stats=calm, now=1000.0))
    state[STATE_KEY]["last_up_s"] = 0.0  # scaled up long ago
    crashed = context(config, running=1, target=2, replicas_stats=calm[:1], state=state, now=8000.0)
    _, state = policy(crashed)
    assert state[WARMING_KEY] == [1, 8000.0]
    later = context(config, running=1, target=2, replicas_stats=calm[:1], state=state, now=8030.0)
    snap = snapshot_from_context(later, PolicyState(last_up_s=0.0), None, 8000.0)
    assert snap.warming_ages_s == (30.0,)  # not 8030 s: the crash, not the scale-up
    _, state = policy(context(config, running=2, target=2, replicas_stats=calm, state=state,
                              now=8060.0))  # fmt: skip
    assert state[WARMING_KEY] == [0, None]
