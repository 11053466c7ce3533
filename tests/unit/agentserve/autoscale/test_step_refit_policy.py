"""The refit's plumbing: a replica publishes its mean TPOT and batch, the Ray adapter refits
the latency prior from them before deciding."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")

from agentserve.autoscale.model import LatencyModel
from agentserve.autoscale.ray_policy import (
    REFIT_STATE_KEY,
    SlaAutoscalingPolicy,
    encode_replica_stats,
    ray_autoscaling_config,
)
from agentserve.autoscale.step_refit import BATCH_MEAN_KEY, SAMPLES_KEY, TPOT_MEAN_KEY
from agentserve.engine.protocol import Delta, EngineStats
from agentserve.serve.replica_stats import ReplicaStats
from agentserve.spec import DeploymentSpec
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig

from tests.unit.agentserve.autoscale.test_autoscale_ray_policy import context

SPEC = DeploymentSpec.model_validate(
    {"models": [{"replicas": {"min_replicas": 1, "max_replicas": 6}}]}
)
PRIOR = LatencyModel(base_ms=10.0, knee_tokens=0.0, per_token_ms=0.1, alpha_1=0.0)


def _replica(tpot_ms, batch):
    return encode_replica_stats(
        {}, arrival_rate_rps=0.0, mean_prompt_tokens=0.0, mean_output_tokens=0.0,
        tpot_mean=(tpot_ms, batch, 8),
    )  # fmt: skip


def _policy(refit_online):
    raw = ray_autoscaling_config(SPEC, latency_model=PRIOR, refit_online=refit_online)
    policy = SlaAutoscalingPolicy(**raw["policy"]["policy_kwargs"])
    return AutoscalingConfig(**raw), _apply_autoscaling_config(policy), policy


def test_the_adapter_refits_the_prior_from_the_replicas_tpot():
    config, wrapped, policy = _policy(True)
    slow = [_replica(2 * PRIOR.tpot_ms(4), 4.0)] * 2  # twice the prior at batch 4
    _, state = wrapped(context(config, replicas_stats=slow))
    assert state[REFIT_STATE_KEY] == {"4": pytest.approx(2.0)}
    refitted = policy._refitted(context(config, replicas_stats=slow), dict(state))
    assert refitted.model.step_ms(4) == pytest.approx(2 * PRIOR.step_ms(4), rel=1e-3)
    assert policy.spec.model == PRIOR  # the prior itself is kept


def test_a_measured_model_is_not_refitted():
    config, wrapped, _ = _policy(False)
    _, state = wrapped(context(config, replicas_stats=[_replica(50.0, 4.0)]))
    assert REFIT_STATE_KEY not in state


def test_the_replica_publishes_its_mean_tpot_and_batch():
    now = [1000.0]
    stats = ReplicaStats(clock=lambda: now[0])
    assert TPOT_MEAN_KEY not in stats.autoscaling_stats(EngineStats(running=2))
    for i, step_s in enumerate((0.01, 0.03)):
        rid = f"r{i}"
        stats.begin(rid, {})
        now[0] += 0.1
        stats.see(rid, Delta("a", 5, 1))
        now[0] += 4 * step_s  # 4 more tokens
        stats.see(rid, Delta("b", 5, 5, finish_reason="stop"))
        stats.end(rid)
    out = stats.autoscaling_stats(EngineStats(running=4))
    assert out[TPOT_MEAN_KEY] == pytest.approx(20.0)  # (10 + 30) / 2 ms
    assert out[BATCH_MEAN_KEY] == pytest.approx(3.0)  # samples 2 and 4
    assert out[SAMPLES_KEY] == 2.0
