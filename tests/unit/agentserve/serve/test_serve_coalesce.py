"""serve/coalesce.py: a replica's stream, merged into fewer messages without losing meaning."""

from __future__ import annotations

import asyncio
import time

import pytest
from agentserve.engine.protocol import Delta, EngineError
from agentserve.serve.coalesce import coalesced, merge_deltas, stream_interval_s


def _d(text: str, n: int, **kw) -> Delta:
    return Delta(text, prompt_tokens=3, completion_tokens=n, token_ids=(n,), **kw)


def test_merge_concatenates_text_ids_logprobs_and_keeps_last_counts():
    lp = {"token": "x", "logprob": -0.1, "bytes": None, "top_logprobs": None}
    first = Delta("a", 3, 1, token_ids=(1,), prompt_token_ids=(7, 8, 9), logprobs=(lp,))
    merged = merge_deltas([first, _d("b", 2, logprobs=(lp,)), _d("c", 3, reasoning="r")])
    assert len(merged) == 1
    m = merged[0]
    assert (m.text, m.reasoning, m.completion_tokens) == ("abc", "r", 3)
    assert m.token_ids == (1, 2, 3) and m.prompt_token_ids == (7, 8, 9)
    assert m.logprobs == (lp, lp)


def test_merge_keeps_tool_calls_finish_and_choices_apart():
    call = ({"index": 0, "function": {"arguments": "{"}},)
    deltas = [
        _d("a", 1),
        _d("", 2, tool_calls=call),
        _d("", 3, tool_calls=call),
        _d("b", 4),
        _d("c", 5, index=1),
        _d("", 6, finish_reason="stop"),
    ]
    merged = merge_deltas(deltas)
    assert merged == deltas  # nothing here may merge with its neighbour
    assert merge_deltas([]) == []


async def _source(items, gap_s: float = 0.0, closed: list | None = None):
    try:
        for item in items:
            if gap_s:
                await asyncio.sleep(gap_s)
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        if closed is not None:
            closed.append(True)


async def _batches(stream) -> list[list[Delta]]:
    return [batch async for batch in stream]


def test_zero_interval_sends_every_delta_alone():
    deltas = [_d(str(i), i) for i in range(1, 6)]
    batches = asyncio.run(_batches(coalesced(_source(deltas), 0)))
    assert batches == [[d] for d in deltas]


def test_first_delta_goes_alone_then_deltas_are_merged_per_interval():
    deltas = [_d(f"t{i} ", i) for i in range(1, 21)]
    batches = asyncio.run(_batches(coalesced(_source(deltas, gap_s=0.005), 0.05)))
    assert batches[0] == [deltas[0]]  # time to first token is not delayed
    assert len(batches) < len(deltas) / 2  # 20 deltas 5 ms apart in 50 ms windows
    flat = [d for batch in batches for d in batch]
    assert "".join(d.text for d in flat) == "".join(d.text for d in deltas)
    assert [i for d in flat for i in d.token_ids] == list(range(1, 21))
    assert flat[-1].completion_tokens == 20


def test_the_end_of_a_stream_is_not_held_back_by_the_interval():
    deltas = [_d("a", 1), _d("b", 2), _d("", 3, finish_reason="stop")]
    start = time.monotonic()
    batches = asyncio.run(_batches(coalesced(_source(deltas, gap_s=0.01), 5.0)))
    assert time.monotonic() - start < 2.0
    flat = [d for batch in batches for d in batch]
    assert flat[-1].finish_reason == "stop" and "".join(d.text for d in flat) == "ab"


def test_an_error_is_raised_after_the_deltas_before_it():
    seen: list[Delta] = []

    async def run() -> None:
        async for batch in coalesced(_source([_d("a", 1), _d("b", 2), EngineError("x")]), 0.05):
            seen.extend(batch)

    with pytest.raises(EngineError, match="x"):
        asyncio.run(run())
    assert "".join(d.text for d in seen) == "ab"


def test_closing_early_closes_the_source():
    closed: list[bool] = []

    async def run() -> None:
        stream = coalesced(_source([_d(str(i), i) for i in range(100)], 0.01, closed), 0.02)
        async for _ in stream:
            break
        await stream.aclose()

    asyncio.run(run())
    assert closed == [True]


def test_the_interval_grows_with_the_streams_open_up_to_its_cap():
    assert stream_interval_s(100, 400, 0) == stream_interval_s(100, 400, 1) == 0.1
    assert stream_interval_s(100, 400, 3) == pytest.approx(0.3)
    assert stream_interval_s(100, 400, 16) == pytest.approx(0.4)
    assert stream_interval_s(100, 100, 8) == pytest.approx(0.1)  # cap = interval: fixed
    assert stream_interval_s(100, 50, 8) == pytest.approx(0.1)  # never below the interval
    assert stream_interval_s(0, 400, 8) == 0  # one message per delta stays so


def test_a_callable_interval_is_asked_again_before_each_wait():
    deltas = [_d(f"t{i} ", i) for i in range(1, 31)]
    asked: list[float] = []

    def interval() -> float:  # 5 ms apart: short windows first, then one long one
        asked.append(0.005 if len(asked) < 6 else 5.0)
        return asked[-1]

    start = time.monotonic()
    batches = asyncio.run(_batches(coalesced(_source(deltas, gap_s=0.005), interval)))
    assert len(asked) > 6 and time.monotonic() - start < 2.0  # the end is not held
    assert len(batches) <= 8  # after the switch, the rest waits in one window
    flat = [d for batch in batches for d in batch]
    assert [i for d in flat for i in d.token_ids] == list(range(1, 31))
