"""The prompt tokens the engine's prefix cache served reach the client's usage, as OpenAI
reports them (`prompt_tokens_details.cached_tokens`; Responses: `input_tokens_details`):
an agent's later turns re-send a conversation the cache holds, and their cost is the rest.
The real engine's figure is checked in tests/integration/test_serve_vllm.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from agentserve.engine.protocol import Delta
from agentserve.serve.backend import LocalBackend
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import asgi_request
from test_ingress_edges import LONG, URL, _app


class _Cached(LocalBackend):
    """40 prompt tokens, `cached` of them served by the prefix cache (the finish delta)."""

    def __init__(self, engine, cached: int):
        super().__init__(engine)
        self.cached = cached

    async def _gen(self, request):
        yield Delta("Hi", 40, 1)
        yield Delta("!", 40, 2, "stop", cached_tokens=self.cached)

    def generate(self, request):
        return self._gen(request)


def _post(app, path, body):
    return asyncio.run(asgi_request(app, "POST", path, body))


@pytest.mark.parametrize(("cached", "reported"), [(32, 32), (0, 0), (50, 40)])
def test_chat_usage_reports_the_cached_prompt_tokens(cached, reported):
    """(A migrated request's continuation prompt is longer than the client's: the cached
    count is capped at the prompt the client sent.)"""
    app, _ = _app(_Cached(FakeEngine("m", 256), cached))
    usage = _post(app, URL, LONG).json()["usage"]
    assert usage["prompt_tokens"] == 40
    assert usage["prompt_tokens_details"] == {"cached_tokens": reported}
    stream = {**LONG, "stream": True, "stream_options": {"include_usage": True}}
    lines = [x[6:] for x in _post(app, URL, stream).text().splitlines() if x.startswith("data: ")]
    last = json.loads(lines[-2])  # before [DONE]
    assert last["choices"] == [] and last["usage"]["prompt_tokens_details"] == {
        "cached_tokens": reported
    }


def test_responses_usage_reports_the_cached_input_tokens():
    app, _ = _app(_Cached(FakeEngine("m", 256), 32))
    body = {"model": "m", "input": "w " * 40}
    usage = _post(app, "/v1/responses", body).json()["usage"]
    assert usage["input_tokens"] == 40 and usage["input_tokens_details"] == {"cached_tokens": 32}
    events = _post(app, "/v1/responses", {**body, "stream": True}).text()
    done = [e for e in events.split("\n\n") if e.startswith("event: response.completed")]
    data = json.loads(done[0].split("data: ", 1)[1])
    assert data["response"]["usage"]["input_tokens_details"] == {"cached_tokens": 32}
