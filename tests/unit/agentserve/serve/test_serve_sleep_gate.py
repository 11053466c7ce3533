"""Idle sleep of a replica's engine (serve/sleep_gate.py, replicas.sleep_when_idle_s): the
spec allows it on GPU replicas only, vLLM gets enable_sleep_mode, an idle replica sleeps,
its next request wakes it once before it reaches the engine, and the replica reports it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from agentserve.autoscale.policy import PolicyState
from agentserve.autoscale.policy_types import PolicySpec
from agentserve.autoscale.ray_policy import (
    SlaAutoscalingPolicy,
    encode_replica_stats,
    policy_spec_to_json,
    replica_sleep,
)
from agentserve.engine.protocol import EngineRequest, Sleeper, can_sleep
from agentserve.engine.vllm_args import engine_kwargs
from agentserve.serve.replica import ModelReplica
from agentserve.serve.replica_stats import TENANT_HEADER
from agentserve.serve.sleep_gate import SleepGate, sleep_gate
from agentserve.spec import DeploymentSpec, ModelSpec, SpecError, spec_from_dict
from agentserve_bench.fake_engine import FakeEngine, FakeEngineFactory

IDLE_S = 0.05
WAKE_S = 0.03


def _gpu_model(**replicas) -> ModelSpec:
    return ModelSpec.model_validate(
        {"name": "m", "engine": "fake", "replicas": {"num_gpus": 1, **replicas}}
    )


def _request(rid: str) -> EngineRequest:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "a b c"}])
    return EngineRequest(rid, "chat", body, {TENANT_HEADER: "chat"})


async def _replica() -> ModelReplica:
    replica = ModelReplica.__new__(ModelReplica)
    factory = FakeEngineFactory(wake_delay_s=WAKE_S)
    await replica.__init__(_gpu_model(sleep_when_idle_s=IDLE_S), factory)
    return replica


async def _text(replica: ModelReplica, rid: str) -> str:
    return "".join([d.text async for d in replica.generate(_request(rid))])


def test_cpu_replicas_and_the_embedded_default_refuse_idle_sleep():
    with pytest.raises(SpecError, match="sleep_when_idle_s needs GPU replicas"):
        spec_from_dict({"models": [{"replicas": {"sleep_when_idle_s": 60}}]})
    with pytest.raises(SpecError, match=r"replicas\.sleep_when_idle_s"):  # spec-owned
        spec_from_dict({"models": [{"engine_args": {"enable_sleep_mode": True}}]})
    assert DeploymentSpec().models[0].replicas.sleep_when_idle_s is None


def test_vllm_gets_sleep_mode_only_with_the_option():
    on = engine_kwargs(_gpu_model(sleep_when_idle_s=60), "/m")
    off = engine_kwargs(_gpu_model(), "/m")
    assert on["enable_sleep_mode"] is True and "enable_sleep_mode" not in off


def test_engines_with_a_sleep_mode_are_sleepers():
    from agentserve.engine.vllm_engine import VLLMEngine

    assert can_sleep(FakeEngine()) and isinstance(VLLMEngine(_gpu_model()), Sleeper)
    assert sleep_gate(FakeEngine(), None) is None
    with pytest.raises(TypeError, match="no sleep mode"):
        sleep_gate(object(), 1.0)


def test_an_idle_replica_sleeps_and_its_next_request_wakes_it_first():
    async def scenario():
        replica = await _replica()
        engine, gate = replica.engine, replica.sleep_gate
        before = await _text(replica, "r0")
        await asyncio.sleep(IDLE_S * 3)
        asleep = engine.asleep, await replica.record_autoscaling_stats()
        after = await _text(replica, "r1")  # the fake refuses requests while asleep
        awake = await replica.record_autoscaling_stats()
        await replica.__del__()
        return before, after, asleep, awake, gate

    before, after, (was_asleep, asleep), awake, gate = asyncio.run(scenario())
    assert was_asleep and asleep["agentserve_replica_sleeping"] == 1.0
    assert before == after and gate.sleeps == 1 and gate.wakes == 1
    assert awake["agentserve_replica_sleeping"] == 0.0
    assert WAKE_S <= awake["agentserve_replica_wake_s"] < 1.0
    assert "agentserve_replica_wake_s" not in asleep  # no wake measured yet


def test_concurrent_requests_share_one_wake_and_none_is_lost():
    async def scenario():
        replica = await _replica()
        await asyncio.sleep(IDLE_S * 3)  # asleep from its start: a standby never asked
        assert replica.engine.asleep
        texts = await asyncio.gather(*(_text(replica, f"r{i}") for i in range(5)))
        gate = replica.sleep_gate
        await replica.__del__()
        return texts, gate

    texts, gate = asyncio.run(scenario())
    assert len(set(texts)) == 1 and texts[0] and gate.sleeps == 1 and gate.wakes == 1


def test_a_request_arriving_while_the_engine_falls_asleep_waits_and_is_served():
    class SlowSleep(FakeEngine):
        async def sleep(self) -> None:
            await asyncio.sleep(0.05)  # the request below arrives meanwhile
            self.asleep = True

    async def scenario():
        engine = SlowSleep()
        await engine.start()
        gate = SleepGate(engine, idle_s=0.01)
        gate.arm()
        await asyncio.sleep(0.02)  # the sleep is under way
        async with gate.serving():
            served = not engine.asleep
        gate.close()
        return served, gate

    served, gate = asyncio.run(scenario())
    assert served and gate.sleeps == 1 and gate.wakes == 1


def test_a_busy_replica_stays_awake_and_a_failed_sleep_leaves_it_awake():
    class NoSleep(FakeEngine):
        async def sleep(self) -> None:
            raise RuntimeError("sleep mode off")

    async def scenario():
        busy = SleepGate(FakeEngine(), idle_s=0.01)
        busy.arm()
        async with busy.serving():
            await asyncio.sleep(0.05)
            slept_while_busy = busy.sleeps
        failing = SleepGate(NoSleep(), idle_s=0.01)
        failing.arm()
        await asyncio.sleep(0.05)
        busy.close()
        return slept_while_busy, failing.sleeping

    slept_while_busy, failed_asleep = asyncio.run(scenario())
    assert slept_while_busy == 0 and failed_asleep is False


def test_the_adapter_keeps_how_many_replicas_sleep_and_their_wake():
    reports = {
        "a": encode_replica_stats({}, arrival_rate_rps=0, mean_prompt_tokens=0,
                                  mean_output_tokens=0, sleeping=True, wake_s=2.5),
        "b": encode_replica_stats({}, arrival_rate_rps=0, mean_prompt_tokens=0,
                                  mean_output_tokens=0, sleeping=False, wake_s=3.0),
        "c": encode_replica_stats({}, arrival_rate_rps=0, mean_prompt_tokens=0,
                                  mean_output_tokens=0),
    }  # fmt: skip
    assert replica_sleep(reports) == (1, 3.0)
    assert replica_sleep({}) == (0, None)
    metrics: dict = {}
    for rid, report in reports.items():
        for key, value in report.items():
            metrics.setdefault(key, {})[rid] = value
    ctx = SimpleNamespace(
        current_time=10.0, current_num_replicas=3, target_num_replicas=3,
        aggregated_metrics=metrics, raw_metrics=None, total_queued_requests=0.0,
        total_num_requests=0.0, policy_state={"agentserve": PolicyState().to_dict()},
    )  # fmt: skip
    policy = SlaAutoscalingPolicy(**policy_spec_to_json(PolicySpec(max_replicas=4)))
    _, state = policy(ctx)
    assert state["agentserve_last"]["sleeping_replicas"] == 1
    assert state["agentserve_last"]["wake_s"] == 3.0
