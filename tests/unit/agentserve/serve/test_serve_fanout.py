"""serve/fanout.py: n choices as n engine requests merged into one stream; errors before
any output fail the whole request, closing the stream closes every choice; a choice whose
replica dies continues elsewhere with its log probabilities."""

from __future__ import annotations

import asyncio

import pytest
from agentserve.engine.protocol import Delta, EngineRequest, EngineRequestError
from agentserve.serve.fanout import choice_requests, fan_out
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient
from test_serve_migrate import Pool
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

MSG = [{"role": "user", "content": "one two three four five six"}]


def _request(**extra):
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **extra})
    return EngineRequest("r", "chat", body)


def test_choice_requests_split_n_with_seed_plus_index():
    single = _request()
    assert choice_requests(single)[0] is single  # n=1: the request itself
    parts = choice_requests(_request(n=3, seed=2**63 - 2))
    assert [(p.request_id, p.body.n, p.body.seed) for p in parts] == [
        ("r-0", 1, 2**63 - 2),
        ("r-1", 1, 2**63 - 1),
        ("r-2", 1, 2**63 - 4),  # past int64: seed - i, still distinct
    ]
    unseeded = choice_requests(_request(n=2))
    assert [p.body.seed for p in unseeded] == [None, None]


class Scripted:
    """Choice streams from scripts: a list of Deltas or exceptions per request id suffix;
    records which streams were closed."""

    def __init__(self, scripts, delay=0.0):
        self.scripts, self.delay, self.closed = scripts, delay, []

    async def generate(self, request):
        i = int(request.request_id.rsplit("-", 1)[1])
        try:
            for step in self.scripts[i]:
                await asyncio.sleep(self.delay * (i + 1))
                if isinstance(step, BaseException):
                    raise step
                yield step
        finally:
            self.closed.append(i)


async def _drain(stream):
    return [d async for d in stream]


def test_merged_stream_counts_tokens_over_choices_and_sets_indices():
    scripts = [
        [Delta("a", 5, 1), Delta("b", 5, 2, "stop")],
        [Delta("x", 5, 1), Delta("y", 5, 2), Delta("z", 5, 3, "length")],
    ]
    source = Scripted(scripts, delay=0.001)
    deltas = asyncio.run(_drain(fan_out(_request(n=2), source.generate)))
    assert [d.index for d in deltas[:2]] == [0, 1]  # every first delta, in order
    by_index = {i: "".join(d.text for d in deltas if d.index == i) for i in (0, 1)}
    assert by_index == {0: "ab", 1: "xyz"}
    totals = [d.completion_tokens for d in deltas]
    assert totals == sorted(totals) and totals[-1] == 5  # running sum: 2 + 3
    assert {d.prompt_tokens for d in deltas} == {5}
    assert sorted(source.closed) == [0, 1]


@pytest.mark.parametrize(("cached", "reported"), [((0, 32), 0), ((32, 16), 16)])
def test_the_cached_prompt_tokens_are_the_fewest_any_choice_found(cached, reported):
    """A choice finds the blocks a sibling just prefilled: its near-total hit must not make
    the request's usage say its fresh prompt was cached (found by review)."""
    scripts = [
        [Delta("a", 40, 1), Delta("b", 40, 2, "stop", cached_tokens=cached[0])],
        [Delta("x", 40, 1), Delta("y", 40, 2, "stop", cached_tokens=cached[1])],
    ]
    deltas = asyncio.run(_drain(fan_out(_request(n=2), Scripted(scripts, 0.001).generate)))
    assert max(d.cached_tokens for d in deltas) == reported


def test_an_error_before_any_output_fails_the_whole_request_and_closes_the_rest():
    bad = EngineRequestError("too long", param="messages")
    source = Scripted([[Delta("a", 5, 1), Delta("b", 5, 2, "stop")], [bad]], delay=0.001)
    got: list[Delta] = []

    async def run():
        async for d in fan_out(_request(n=2), source.generate):
            got.append(d)

    with pytest.raises(EngineRequestError, match="too long"):
        asyncio.run(run())
    assert got == [] and sorted(source.closed) == [0, 1]


def test_an_error_after_output_ends_the_stream_and_closing_cancels_all():
    boom = EngineRequestError("late")
    slow = [Delta("a", 5, 1)] + [Delta("a", 5, k) for k in range(2, 50)]
    source = Scripted([slow, [Delta("x", 5, 1), boom]], delay=0.005)
    with pytest.raises(EngineRequestError, match="late"):
        asyncio.run(_drain(fan_out(_request(n=2), source.generate)))
    assert sorted(source.closed) == [0, 1]

    source = Scripted([slow, slow], delay=0.005)  # the client leaves after 3 deltas

    async def leave_early():
        stream = fan_out(_request(n=2), source.generate)
        for _ in range(3):
            await anext(stream)
        await stream.aclose()

    asyncio.run(leave_early())
    assert sorted(source.closed) == [0, 1]


def test_each_choice_migrates_on_its_own_with_its_logprobs():
    """n=2 with logprobs through the ingress; replica a dies mid-stream: both choices end
    whole, their log probabilities cover exactly their text."""
    engines = [FakeEngine("m", 256, token_delay_s=0.001) for _ in range(2)]
    for e in engines:
        asyncio.run(e.start())
    engines[0].inject("crash", after_tokens=3)
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 256}]}
    )
    client = TestClient(
        create_app(spec, {"m": Pool(*engines)}),
        base_url="http://127.0.0.1",
        client=("127.0.0.1", 50000),
    )
    body = {"model": "m", "messages": MSG, "n": 2, "logprobs": True, "top_logprobs": 2}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    reply = "echo: one two three four five six"
    for choice in r.json()["choices"]:
        assert choice["message"]["content"] == reply
        tokens = [e["token"] for e in choice["logprobs"]["content"]]
        assert "".join(tokens) == reply
        assert all(len(e["top_logprobs"]) == 2 for e in choice["logprobs"]["content"])
    assert r.json()["usage"]["completion_tokens"] == 14
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]
    assert 'agentserve_migrations_total{model="m"} 1.0' in client.get("/metrics").text
