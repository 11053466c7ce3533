"""agentserve_bench/fake_prefix.py and the fake engine's cached_tokens: a prompt that
extends one this engine saw is served from the cache in whole blocks, a new one is not."""

from __future__ import annotations

import asyncio

from agentserve.engine.protocol import EngineRequest
from agentserve_bench.fake_engine import FakeEngine
from agentserve_bench.fake_prefix import BLOCK_WORDS, FakePrefixCache


def _words(n: int, tag: str = "w") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def test_leading_full_blocks_seen_before_are_cached():
    cache = FakePrefixCache()
    first = _words(2 * BLOCK_WORDS + 5)
    assert cache.serve(first) == 0
    assert cache.serve(first + _words(40, "x")) == 2 * BLOCK_WORDS  # the partial block is not
    assert cache.serve(_words(2 * BLOCK_WORDS, "y")) == 0
    changed = ["other", *first[1:]]  # the same words after a different first block
    assert cache.serve(changed) == 0


def test_the_cache_is_bounded_least_recently_used_first():
    cache = FakePrefixCache(capacity_blocks=2)
    a, b = _words(BLOCK_WORDS, "a"), _words(BLOCK_WORDS, "b")
    cache.serve(a)
    cache.serve(b)
    cache.serve(_words(BLOCK_WORDS, "c"))  # drops a
    assert cache.serve(a) == 0
    assert cache.serve(_words(BLOCK_WORDS, "c")) == BLOCK_WORDS


def _chat(messages):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    body = ChatCompletionRequest(model="m", messages=messages, max_tokens=2)
    return EngineRequest("r", "chat", body, {})


def test_the_fake_engine_reports_cached_tokens_on_the_finish_delta():
    system = {"role": "system", "content": " ".join(_words(3 * BLOCK_WORDS))}
    turn_1 = [system, {"role": "user", "content": "first question"}]
    reply = {"role": "assistant", "content": "an answer"}
    turn_2 = [*turn_1, reply, {"role": "user", "content": "more"}]

    async def finish_cached(engine, messages):
        deltas = [d async for d in engine.generate(_chat(messages))]
        assert all(d.cached_tokens == 0 for d in deltas[:-1])
        return deltas[-1].cached_tokens

    async def run():
        engine = FakeEngine("m", 4096)
        await engine.start()
        other = FakeEngine("m", 4096)
        await other.start()
        return [
            await finish_cached(engine, turn_1),
            await finish_cached(engine, turn_2),
            await finish_cached(other, turn_2),
        ]

    first, again, elsewhere = asyncio.run(run())
    assert first == 0 and elsewhere == 0
    assert again >= 3 * BLOCK_WORDS
