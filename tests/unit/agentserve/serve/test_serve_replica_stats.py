"""Replica autoscaling signals: per-tenant windows, TTFT from the ingress accept time, TPOT
per output token, acceptance by batch size, and the replica's Ray hook (no Ray)."""

from __future__ import annotations

import asyncio

import pytest
from agentserve.autoscale.latency_stat import bucket_of, bucket_upper_ms, pooled_tenant_latency
from agentserve.autoscale.policy import TenantLatency
from agentserve.autoscale.ray_policy import snapshot_from_context
from agentserve.engine.protocol import Delta, EngineRequest, EngineStats
from agentserve.serve.replica import ModelReplica
from agentserve.serve.replica_stats import ACCEPTED_AT_HEADER, TENANT_HEADER, ReplicaStats
from agentserve.spec import DeploymentSpec
from agentserve.speculation.by_batch import SpecByBatch, acceptance_by_bucket, batch_bucket
from agentserve_bench.fake_engine import FakeEngine, FakeEngineFactory


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _run(
    stats: ReplicaStats,
    clock: Clock,
    rid: str,
    tenant: str,
    *,
    accepted: float,
    first: float,
    end: float,
    tokens: int,
    prompt: int = 10,
) -> None:
    clock.now = accepted + 0.5  # the router queue: 0.5 s before the replica sees it
    headers = {TENANT_HEADER: tenant, ACCEPTED_AT_HEADER: str(int(accepted * 1e9))}
    stats.begin(rid, headers)
    clock.now = first
    stats.see(rid, Delta("a", prompt, 2))
    clock.now = end
    stats.see(rid, Delta("b", prompt, tokens, finish_reason="stop"))
    stats.end(rid)


def _tenants(stats: ReplicaStats) -> dict[str, TenantLatency]:
    """What the autoscaler reads from this one replica (autoscale/latency_stat.py)."""
    return pooled_tenant_latency([stats.windows()])


def _edge(ms: float) -> float:
    """The value the statistic reports for a sample of `ms`: its bucket's upper edge."""
    return bucket_upper_ms(bucket_of(ms))


def test_reasoning_is_output_for_ttft():
    clock = Clock()
    stats = ReplicaStats(30.0, clock)
    stats.begin("r", {ACCEPTED_AT_HEADER: str(1000 * 10**9)})
    clock.now = 1000.3
    stats.see("r", Delta("", 5, 0))  # usage only: no output yet
    clock.now = 1000.4
    stats.see("r", Delta(prompt_tokens=5, completion_tokens=1, reasoning="hmm"))
    clock.now = 1002.0
    stats.see("r", Delta("answer", 5, 9, finish_reason="stop"))
    stats.end("r")
    assert _tenants(stats)["anonymous"].ttft_p95_ms == _edge(400.0)
    assert _tenants(stats)["anonymous"].tpot_p95_ms == _edge(200.0)


def test_ttft_counts_queue_time_and_tpot_is_per_output_token():
    clock = Clock()
    stats = ReplicaStats(30.0, clock)
    # accepted at 1000, first token at 1001.2: TTFT 1200 ms although the replica saw it at 1000.5
    # 2 tokens at the first delta, 11 at the end 1 s later: 10 tokens after the first one
    _run(stats, clock, "r1", "chat", accepted=1000.0, first=1001.2, end=1002.2, tokens=11)
    lat = _tenants(stats)["chat"]
    assert lat.ttft_p95_ms == _edge(1200.0) and lat.tpot_p95_ms == _edge(100.0)
    assert lat.requests == 1
    assert stats.mean_tokens() == (10.0, 11.0, 1)


def test_the_mean_prompt_counts_what_prefill_computed_not_what_the_cache_served():
    """An agent's later turns re-send a conversation the prefix cache holds: 1,000 prompt
    tokens of which 900 cached cost the prefill of 100, as in the simulator (new_tokens)."""
    clock = Clock()
    stats = ReplicaStats(30.0, clock)
    stats.begin("turn", {})
    clock.now = 1.0
    stats.see("turn", Delta("a", 1000, 1))
    stats.see("turn", Delta("b", 1000, 2, finish_reason="stop", cached_tokens=900))
    stats.end("turn")
    stats.begin("first", {})
    stats.see("first", Delta("a", 300, 1))
    stats.see("first", Delta("", 300, 2, finish_reason="stop"))  # no cache said: all of it
    stats.end("first")
    assert stats.mean_tokens() == (200.0, 2.0, 2)


def test_waiting_requests_count_with_their_age_and_windows_expire():
    clock = Clock()
    stats = ReplicaStats(10.0, clock)
    stats.begin("done", {TENANT_HEADER: "batch"})
    stats.see("done", Delta("x", 3, 1, finish_reason="length"))
    stats.end("done")
    stats.begin("stuck", {TENANT_HEADER: "chat", ACCEPTED_AT_HEADER: str(1000 * 10**9)})
    clock.now = 1003.0
    tenants = _tenants(stats)
    assert tenants["chat"] == TenantLatency(_edge(3000.0), None, 1)  # no first token yet: its age
    assert tenants["batch"].tpot_p95_ms is None  # one output token: no TPOT
    assert stats.arrival_rate_rps() == pytest.approx(2 / 10)
    clock.now = 1020.0
    stats.end("stuck")  # cancelled before a token: a TTFT sample of its age at the end
    assert _tenants(stats) == {"chat": TenantLatency(_edge(20000.0), None, 1)}
    assert stats.arrival_rate_rps() == 0.0
    clock.now = 1031.0
    assert _tenants(stats) == {}


@pytest.mark.parametrize("header", [None, "junk", "1.5", str(2000 * 10**9)])
def test_missing_or_bad_accept_time_falls_back_to_receipt(header):
    clock = Clock()
    stats = ReplicaStats(30.0, clock)
    stats.begin("r", {} if header is None else {ACCEPTED_AT_HEADER: header})
    clock.now += 0.25
    stats.see("r", Delta("x", 1, 1, finish_reason="stop"))
    stats.end("r")
    assert _tenants(stats)["anonymous"].ttft_p95_ms == _edge(250.0)


def test_acceptance_by_batch_buckets_and_window_deltas():
    acc = SpecByBatch()
    acc.add(1, 10, 70, 30)  # tau 4 at batch 1
    acc.add(3, 6, 42, 6)  # tau 2 at batch 3
    acc.add(4, 4, 28, 8)  # tau 3 at batch 4 -> bucket 3-4: 1 + 14/10
    acc.add(6, 0, 0, 0)  # no drafts: ignored
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [
        "1",
        "2",
        "3-4",
        "3-4",
        "5-8",
        "5-8",
        "9-16",
        "9-16",
        "17-32",
    ]
    assert acceptance_by_bucket(acc.snapshot()) == {"1": 4.0, "3-4": 2.4}
    clock = Clock()
    stats = ReplicaStats(10.0, clock)
    first = stats.acceptance_by_batch(EngineStats(spec_by_batch=acc.snapshot()))
    assert first == {"1": 4.0, "3-4": 2.4}  # since start until there is a baseline
    clock.now += 11
    acc.add(1, 10, 70, 0)  # acceptance collapsed at batch 1 in the last window
    assert stats.acceptance_by_batch(EngineStats(spec_by_batch=acc.snapshot())) == {"1": 1.0}


def _request(rid: str, words: int, tenant: str = "chat") -> EngineRequest:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": " ".join(["w"] * words)}]
    )
    return EngineRequest(rid, "chat", body, {TENANT_HEADER: tenant})


async def _replica(engine_factory) -> ModelReplica:
    model = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_num_seqs": 2}]}
    ).models[0]
    replica = ModelReplica.__new__(ModelReplica)
    await replica.__init__(model, engine_factory, window_s=30.0)
    return replica


def test_replica_hook_reports_windows_engine_queue_and_acceptance():
    async def scenario():
        factory = FakeEngineFactory(token_delay_s=0.01, accept_per_step=2)
        replica = await _replica(factory)
        assert isinstance(replica.engine, FakeEngine)

        async def consume(rid, words):
            return [d async for d in replica.generate(_request(rid, words))]

        tasks = [asyncio.create_task(consume(f"r{i}", 7)) for i in range(3)]
        await asyncio.sleep(0.005)
        during = await replica.record_autoscaling_stats()
        await asyncio.gather(*tasks)
        after = await replica.record_autoscaling_stats()
        await replica.__del__()
        return during, after

    during, after = asyncio.run(scenario())
    assert during["agentserve_engine_running"] == 2.0  # max_num_seqs 2: one waits
    assert during["agentserve_engine_waiting"] == 1.0
    assert after["agentserve_requests:chat"] == 3.0
    ttft = sum(v for k, v in after.items() if k.startswith("agentserve_ttft_hist:chat:"))
    tpot = sum(v for k, v in after.items() if k.startswith("agentserve_tpot_hist:chat:"))
    assert ttft == 3.0 and tpot == 3.0  # histograms: one sample per finished request
    assert after["agentserve_arrival_rps_recent"] == pytest.approx(3 / 10)
    assert after["agentserve_output_tokens"] == 8.0  # "echo:" + 7 words
    # 4 steps of 2 tokens each: acceptance length 2 at batch 1 and 2
    assert {k: v for k, v in after.items() if k.startswith("agentserve_acceptance")} == {
        "agentserve_acceptance_length:1": 2.0,
        "agentserve_acceptance_length:2": 2.0,
    }
    assert all(isinstance(v, float) for v in after.values())


def test_the_replica_reports_its_start_once_its_engine_is_ready():
    """Construction to engine ready, in seconds: the start the policy plans with."""

    class SlowStart(FakeEngine):
        async def start(self) -> None:
            await asyncio.sleep(0.05)
            await super().start()

    stats = ReplicaStats(clock=Clock())
    assert "agentserve_replica_start_s" not in stats.autoscaling_stats(EngineStats())

    async def scenario():
        replica = await _replica(lambda model: SlowStart(model.name))
        reported = await replica.record_autoscaling_stats()
        await replica.__del__()
        return reported

    start_s = asyncio.run(scenario())["agentserve_replica_start_s"]
    assert 0.05 <= start_s < 5.0


def test_engine_waiting_counts_as_queued_for_the_policy():
    from types import SimpleNamespace

    ctx = SimpleNamespace(
        current_time=10.0,
        current_num_replicas=2,
        target_num_replicas=2,
        aggregated_metrics={"agentserve_engine_waiting": {"a": 3.0, "b": 2.0}},
        total_queued_requests=4.0,
        total_num_requests=20.0,
    )
    from agentserve.autoscale.policy import PolicyState

    assert snapshot_from_context(ctx, PolicyState()).queued == 9


def test_vllm_stat_logger_adds_each_step_under_its_running_batch():
    from agentserve.speculation.by_batch import vllm_stat_logger
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    acc = SpecByBatch()
    logger = vllm_stat_logger(acc)(None, 0)
    step = SpecDecodingStats.new(7)
    step.observe_draft(7, 2)
    step.observe_draft(7, 4)
    logger.record(SchedulerStats(num_running_reqs=2, spec_decoding_stats=step), None)
    logger.record(SchedulerStats(num_running_reqs=3), None)  # no drafting this step
    logger.record(None, None)
    assert acc.snapshot() == ((2, 2, 14, 6),)


def test_vllm_stat_logger_reports_every_step_with_the_requests_the_scheduler_holds():
    from agentserve.speculation.by_batch import vllm_stat_logger
    from vllm.v1.metrics.stats import SchedulerStats

    steps: list[tuple[int, int]] = []
    logger = vllm_stat_logger(SpecByBatch(), on_step=lambda *load: steps.append(load))(None, 0)
    logger.record(SchedulerStats(num_running_reqs=3, num_waiting_reqs=2), None)
    logger.record(SchedulerStats(), None)  # a step with nothing left
    logger.record(None, None)  # no stats: not a step report
    assert steps == [(3, 2), (0, 0)]


def test_a_replica_whose_engine_failed_to_start_still_stops_it():
    """Serve calls __del__ after a failed __init__: no watchdog exists, the engine stops."""

    class FailingStart(FakeEngine):
        async def start(self) -> None:
            self.started = True  # half started: holds resources stop() must release
            raise RuntimeError("engine failed to start")

    made: list[FailingStart] = []

    def factory(model):
        made.append(FailingStart(model.name))
        return made[0]

    model = DeploymentSpec.model_validate({"models": [{"name": "m", "engine": "fake"}]}).models[0]

    async def scenario():
        replica = ModelReplica.__new__(ModelReplica)
        with pytest.raises(RuntimeError, match="failed to start"):
            await replica.__init__(model, factory)
        await replica.__del__()
        await ModelReplica.__new__(ModelReplica).__del__()  # the factory itself failed

    asyncio.run(scenario())
    assert made[0].started is False


def test_streams_open_on_the_replica_lengthen_each_streams_interval(monkeypatch):
    import agentserve.serve.replica as replica_module

    seen: list[int] = []

    def interval(every_ms: float, max_ms: float, streams: int) -> float:
        assert (every_ms, max_ms) == (100.0, 400.0)  # the model's defaults
        seen.append(streams)
        return 0.001

    monkeypatch.setattr(replica_module, "stream_interval_s", interval)

    async def scenario():
        replica = await _replica(FakeEngineFactory(token_delay_s=0.005))

        async def consume(rid: str) -> str:
            batches = [b async for b in replica.generate_batches(_request(rid, 12))]
            return "".join(d.text for b in batches for d in b)

        alone = await consume("r0")
        assert max(seen) == 1
        seen.clear()
        both = await asyncio.gather(consume("r1"), consume("r2"))
        assert replica._streams == 0  # closed streams no longer count
        await replica.engine.stop()
        return alone, both

    alone, both = asyncio.run(scenario())
    assert max(seen) == 2 and both == [alone, alone]
