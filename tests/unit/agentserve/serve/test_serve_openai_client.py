"""The official `openai` client works unchanged against the ingress (ASGI, fake engine)."""

from __future__ import annotations

import asyncio

import httpx2
import openai
import pytest
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine

KEY = "sk-test"


async def _client() -> openai.AsyncOpenAI:
    spec = DeploymentSpec.model_validate(
        {
            "models": [{"name": "m", "engine": "fake", "max_model_len": 64}],
            "tenants": [{"name": "t", "api_key_sha256": hash_api_key(KEY), "sla": {}}],
        }
    )
    engine = FakeEngine("m", 64)
    await engine.start()
    app = create_app(spec, {"m": LocalBackend(engine)})
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t")
    return openai.AsyncOpenAI(api_key=KEY, base_url="http://t/v1", http_client=http, max_retries=0)


def test_openai_client_chat_stream_completions_models():
    async def run():
        client = await _client()
        chat = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi you"}], max_tokens=2
        )
        assert chat.choices[0].message.content == "echo: hi"
        assert chat.usage.completion_tokens == 2
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi you"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "echo: hi you" and chunks[-1].usage.total_tokens == 6
        done = await client.completions.create(model="m", prompt="a b", max_tokens=5)
        assert done.choices[0].text == "echo: a b"
        assert [m.id for m in (await client.models.list()).data] == ["m"]

    asyncio.run(run())


def test_openai_client_raises_typed_errors():
    async def run():
        client = await _client()
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="other", messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(openai.BadRequestError, match="context length"):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x " * 90}]
            )
        bad = openai.AsyncOpenAI(
            api_key="wrong", base_url="http://t/v1", http_client=client._client, max_retries=0
        )
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()

    asyncio.run(run())


def test_openai_client_embeddings():
    """The client asks for base64 unless told otherwise and decodes it: both ways give
    the same vectors; a generate model's BadRequestError carries the code."""

    async def run():
        spec = DeploymentSpec.model_validate(
            {
                "models": [
                    {"name": "m", "engine": "fake", "max_model_len": 64},
                    {"name": "e", "engine": "fake", "max_model_len": 64, "task": "embed"},
                ],
                "tenants": [{"name": "t", "api_key_sha256": hash_api_key(KEY), "sla": {}}],
            }
        )
        engines = {"m": FakeEngine("m", 64), "e": FakeEngine("e", 64, task="embed")}
        for engine in engines.values():
            await engine.start()
        app = create_app(spec, {n: LocalBackend(e) for n, e in engines.items()})
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t")
        client = openai.AsyncOpenAI(
            api_key=KEY, base_url="http://t/v1", http_client=http, max_retries=0
        )
        packed = await client.embeddings.create(model="e", input=["a b", "c"])
        floats = await client.embeddings.create(
            model="e", input=["a b", "c"], encoding_format="float"
        )
        assert [len(d.embedding) for d in packed.data] == [8, 8]
        for p, f in zip(packed.data, floats.data, strict=True):
            assert p.embedding == pytest.approx(f.embedding, rel=1e-6)
        assert packed.usage.prompt_tokens == 3
        with pytest.raises(openai.BadRequestError, match="not an embedding model") as refused:
            await client.embeddings.create(model="m", input="x")
        assert refused.value.code == "model_not_embedding"

    asyncio.run(run())
