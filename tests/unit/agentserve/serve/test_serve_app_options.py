"""build_app's deployment options: the spec's autoscaling policy reaches Ray Serve (no Ray
cluster: options are validated with Ray's own AutoscalingConfig)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")

from agentserve.autoscale.model import LatencyModel
from agentserve.autoscale.ray_policy import POLICY_PATH, policy_spec_from_json
from agentserve.serve.app import deployment_options
from agentserve.spec import DeploymentSpec
from ray.serve.config import AutoscalingConfig


def _spec(policy="sla", engine="vllm", replicas=None, **autoscaling):
    replicas = replicas or {"min_replicas": 1, "max_replicas": 4}
    return DeploymentSpec.model_validate(
        {
            "models": [{"engine": engine, "replicas": replicas, "max_num_seqs": 8}],
            "autoscaling": {"policy": policy, **autoscaling},
        }
    )


def _autoscaling(spec):
    return deployment_options(spec.models[0], spec)["autoscaling_config"]


def test_sla_policy_runs_our_policy_with_the_measured_model_on_the_bundled_cpu_model(
    monkeypatch,
):
    # the whole-engine fit, whatever CPU runs this (a kind with recorded step costs plans
    # with those: tests/unit/agentserve/autoscale/test_calibrated_model.py)
    monkeypatch.setenv("AGENTSERVE_CALIBRATE", "0")
    spec = _spec(look_back_period_s=12)
    raw = _autoscaling(spec)
    config = AutoscalingConfig(**raw)
    assert config.policy.policy_function == POLICY_PATH
    assert (config.min_replicas, config.max_replicas, config.look_back_period_s) == (1, 4, 12)
    policy = policy_spec_from_json(raw["policy"]["policy_kwargs"])
    assert policy.model == LatencyModel() and policy.replica_start_s == 120.0
    assert policy.max_num_seqs == 8 and policy.max_drafted == 0


def test_sla_policy_is_reactive_only_without_a_fitted_model():
    raw = _autoscaling(_spec(engine="fake"))
    policy = policy_spec_from_json(raw["policy"]["policy_kwargs"])
    assert policy.model is None and policy.replica_start_s == 5.0


def test_ray_default_keeps_rays_target_ongoing_requests_policy():
    raw = _autoscaling(_spec("ray_default", target_utilization=0.5, upscale_delay_s=3))
    config = AutoscalingConfig(**raw)
    assert "policy" not in raw and config.target_ongoing_requests == 4.0
    assert config.upscale_delay_s == 3


def test_fixed_fleet_does_not_autoscale():
    spec = _spec(replicas={"min_replicas": 2, "max_replicas": 2})
    options = deployment_options(spec.models[0], spec)
    assert options["num_replicas"] == 2 and "autoscaling_config" not in options


def test_health_checks_drain_and_queue_bounds_follow_the_spec():
    replicas = {
        "health_check_period_s": 2,
        "health_check_timeout_s": 3,
        "graceful_shutdown_timeout_s": 45,
        "graceful_shutdown_wait_loop_s": 0.5,
    }
    spec = DeploymentSpec.model_validate(
        {"models": [{"replicas": replicas, "max_num_seqs": 4}], "server": {"max_queue_len": 9}}
    )
    options = deployment_options(spec.models[0], spec)
    assert (options["health_check_period_s"], options["health_check_timeout_s"]) == (2, 3)
    assert options["graceful_shutdown_timeout_s"] == 45
    assert options["graceful_shutdown_wait_loop_s"] == 0.5
    assert (options["max_ongoing_requests"], options["max_queued_requests"]) == (8, 9)


def test_ingress_takes_all_the_models_can_hold_and_drains_as_long():
    from agentserve.serve.app import INGRESS_SPARE_REQUESTS, ingress_options

    spec = DeploymentSpec.model_validate(
        {
            "models": [
                {"name": "a", "max_num_seqs": 4, "replicas": {"max_replicas": 3}},
                {"name": "b", "replicas": {"graceful_shutdown_timeout_s": 300}},
            ],
            "server": {"max_queue_len": 10},
        }
    )
    options = ingress_options(spec)
    assert options["max_ongoing_requests"] == (4 * 3 + 10) + (16 + 10) + INGRESS_SPARE_REQUESTS
    assert options["graceful_shutdown_timeout_s"] == 300
    assert options["num_replicas"] == 1  # unset: one (the operator asks for 2)


def test_ingress_replicas_share_the_dispatch_slots_and_take_admin_ports_by_rank():
    from agentserve.admission.priority import Dispatcher
    from agentserve.serve.app import ingress_options, replica_admin_port

    raw = {"models": [{"name": "a", "max_num_seqs": 5}], "server": {"metrics_port": 9100}}
    spec = DeploymentSpec.model_validate(raw | {"server": raw["server"] | {"ingress_replicas": 3}})
    assert ingress_options(spec)["num_replicas"] == 3
    # each of 3 ingresses sends ceil(2 * 5 / 3) = 4 requests per ready model replica
    assert Dispatcher(spec.models, ["a"], 3).per_replica == {"a": 4}
    assert Dispatcher(spec.models, ["a"]).per_replica == {"a": 10}
    ports = [replica_admin_port(spec, rank).server.metrics_port for rank in range(3)]
    assert ports == [9100, 9101, 9102]
    open_spec = DeploymentSpec.model_validate({"models": raw["models"]})
    assert replica_admin_port(open_spec, 2) is open_spec  # no admin port: nothing to move


@pytest.mark.parametrize("refuses_in", ["remote", "stream"])
def test_a_full_handle_queue_is_a_503_whichever_call_refuses(refuses_in):
    """Ray 2.60 raises BackPressureError when the stream is first read, and again from
    its cancel(); a fast router may raise it from remote() itself. Either way the
    ingress must see EngineUnavailableError (its 503 + Retry-After), not Ray's error."""
    import asyncio

    from agentserve.engine.protocol import EngineRequest, EngineUnavailableError
    from agentserve.serve.app import HandleBackend
    from ray.serve.exceptions import BackPressureError

    def full():
        return BackPressureError(num_queued_requests=4, max_queued_requests=4)

    class Refused:
        def __aiter__(self):
            return self

        async def __anext__(self):
            raise full()

        def cancel(self):
            raise full()

    class FullHandle:
        def options(self, **_):
            return self

        @property
        def generate_batches(self):
            return self

        def remote(self, _request):
            if refuses_in == "remote":
                raise full()
            return Refused()

    async def run():
        async for _ in HandleBackend(FullHandle()).generate(EngineRequest("r", "chat", None)):
            pass

    with pytest.raises(EngineUnavailableError, match="backpressure"):
        asyncio.run(run())


def test_ready_replica_count_is_shared_and_reused_longer_while_positive(monkeypatch):
    """Serve's status call costs the ingress CPU: concurrent requests share one, and a
    positive count is reused for READY_CACHE_UP_S (a zero count only READY_CACHE_S)."""
    import asyncio
    import time as real_time

    from agentserve.serve import app as app_module
    from agentserve.serve.app import READY_CACHE_S, READY_CACHE_UP_S, HandleBackend

    calls, counts = [], iter([0, 2, 2, 0])
    clock = [1000.0]

    def running(app, name):
        calls.append((app, name))
        real_time.sleep(0.05)  # concurrent callers arrive while this one runs
        return next(counts)

    class Handle:
        app_name, deployment_name = "agentserve", "model-x"

    monkeypatch.setattr(app_module, "_running_replicas", running)
    monkeypatch.setattr(app_module.time, "monotonic", lambda: clock[0])
    backend = HandleBackend(Handle())

    async def ready_many(n: int) -> list:
        return await asyncio.gather(*(backend.ready_replicas() for _ in range(n)))

    assert asyncio.run(ready_many(8)) == [0] * 8 and len(calls) == 1  # one call shared
    clock[0] += READY_CACHE_S  # a zero count is stale after READY_CACHE_S
    assert asyncio.run(ready_many(3)) == [2] * 3 and len(calls) == 2
    clock[0] += READY_CACHE_UP_S - 0.1  # a positive one lasts READY_CACHE_UP_S
    assert asyncio.run(ready_many(1)) == [2] and len(calls) == 2
    clock[0] += 0.2
    assert asyncio.run(ready_many(1)) == [2] and len(calls) == 3
