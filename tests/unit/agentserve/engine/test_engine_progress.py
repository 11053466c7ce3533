"""A hung engine is noticed by step progress; idle, slow-reader and aborted cases are not."""

from __future__ import annotations

import asyncio

import pytest
from agentserve.engine.progress import StepProgress
from agentserve.engine.protocol import EngineUnavailableError
from agentserve.engine.vllm_engine import VLLMEngine
from agentserve.spec import ModelSpec


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_an_idle_engine_is_never_stalled(clock):
    progress = StepProgress(clock)
    clock.now += 3600
    assert progress.stalled_for() == 0.0


def test_streams_waiting_on_an_engine_that_stopped_stepping_stall_it(clock):
    progress = StepProgress(clock)
    progress.begin()
    progress.begin()
    progress.step(running=2, waiting=0)
    clock.now += 5
    progress.step(running=2, waiting=0)
    clock.now += 40  # the engine core hangs: no more steps
    assert progress.stalled_for() == 40.0 and progress.owed == 2


def test_a_request_sent_to_an_idle_engine_that_hung_stalls_it(clock):
    progress = StepProgress(clock)
    clock.now += 600  # idle for ten minutes: the clock starts at the request
    progress.begin()
    assert progress.stalled_for() == 0.0
    clock.now += 31
    assert progress.stalled_for() == 31.0


def test_a_slow_reader_of_a_finished_request_does_not_stall_the_engine(clock):
    progress = StepProgress(clock)
    progress.begin()
    progress.step(running=1, waiting=0)
    progress.step(running=0, waiting=0)  # the engine finished it; the client reads slowly
    clock.now += 120
    assert progress.open == 1 and progress.stalled_for() == 0.0


def test_an_aborted_last_request_leaves_no_debt(clock):
    progress = StepProgress(clock)
    progress.begin()
    progress.step(running=1, waiting=0)
    progress.end()  # the client went: aborted; the engine reports no step after an abort
    clock.now += 120
    assert progress.held == 1 and progress.stalled_for() == 0.0


def test_a_request_refused_before_the_engine_saw_it_leaves_no_debt(clock):
    progress = StepProgress(clock)
    progress.begin()
    progress.end()  # e.g. vLLM's serving layer answered 400
    clock.now += 120
    assert progress.stalled_for() == 0.0


def test_waiting_requests_count_as_owed(clock):
    progress = StepProgress(clock)
    for _ in range(3):
        progress.begin()
    progress.step(running=1, waiting=2)
    progress.end()  # one finished and closed
    clock.now += 50
    assert progress.owed == 2 and progress.stalled_for() == 50.0


class _HealthyFlagClient:
    """vLLM's check_health: only an error flag, which a hung engine core never sets."""

    async def check_health(self) -> None:
        return None


def _engine(clock: Clock, timeout_s: float = 30.0) -> VLLMEngine:
    engine = VLLMEngine(ModelSpec(replicas={"health_check_timeout_s": timeout_s}))
    engine._client = _HealthyFlagClient()
    engine._progress = StepProgress(clock)
    engine._watch_steps = True
    return engine


def test_vllm_engine_health_fails_once_its_streams_wait_past_the_health_timeout(clock):
    engine = _engine(clock)
    engine._progress.begin()
    engine._progress.step(running=1, waiting=0)
    clock.now += 29
    asyncio.run(engine.health())  # still within the timeout
    clock.now += 2
    with pytest.raises(EngineUnavailableError, match="hung: no engine step for 31 s"):
        asyncio.run(engine.health())


def test_vllm_engine_without_step_stats_does_not_judge_by_steps(clock):
    engine = _engine(clock)
    engine._watch_steps = False  # disable_log_stats: vLLM reports no steps
    engine._progress.begin()
    clock.now += 300
    asyncio.run(engine.health())
