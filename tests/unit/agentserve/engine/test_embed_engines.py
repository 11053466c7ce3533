"""Embedding models below the ingress: the spec's `task: embed`, its vLLM engine
arguments (the pooling runner), the vLLM adapter over AsyncLLM.encode (a fake client) and
the fake engine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from agentserve.engine.protocol import EmbedRequest, EngineRequestError
from agentserve.engine.vllm_args import engine_kwargs
from agentserve.engine.vllm_embed import encode_all
from agentserve.spec import DeploymentSpec
from agentserve.spec.defaults import with_default_drafters
from agentserve_bench.fake_engine import FakeEngine
from pydantic import ValidationError


def _model(**fields):
    return DeploymentSpec.model_validate({"models": [fields]}).models[0]


def test_models_generate_unless_configured_to_embed():
    assert _model().task == "generate"
    assert _model(task="embed").task == "embed"
    with pytest.raises(ValidationError, match="task"):
        _model(task="classify")


def test_an_embedding_model_never_drafts():
    with pytest.raises(ValidationError, match="never drafts"):
        _model(task="embed", drafter={"enabled": True})
    spec = DeploymentSpec.model_validate({"models": [{"task": "embed"}, {"name": "g"}]})
    out, _ = with_default_drafters(spec, None, lambda _: Path("/drafter"))
    assert [m.drafter.enabled for m in out.models] == [False, True]
    out, _ = with_default_drafters(spec, True, lambda _: Path("/drafter"))  # --drafter
    assert [m.drafter.enabled for m in out.models] == [False, True]


def test_embed_runs_vllms_pooling_runner():
    kwargs = engine_kwargs(_model(task="embed"), "/models/x")
    assert kwargs["runner"] == "pooling" and kwargs["convert"] == "embed"
    assert kwargs["stream_interval"] == 1  # >1 needs a detokenizer, which pooling has not
    assert kwargs["speculative_config"] is None
    plain = engine_kwargs(_model(), "/models/x")
    assert "runner" not in plain and "convert" not in plain


class _Client:
    """AsyncLLM.encode's shape: PoolingRequestOutput-like results, one per request."""

    def __init__(self):
        self.calls = []

    async def encode(self, prompt, params, request_id, trace_headers=None):
        self.calls.append((prompt, params.task, request_id, trace_headers))
        ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt.split()
        yield SimpleNamespace(
            outputs=SimpleNamespace(data=torch.tensor([float(len(ids)), 1.0, 0.5])),
            prompt_token_ids=list(range(len(ids))),
        )


def test_vllm_adapter_encodes_each_input_as_an_embed_request():
    client = _Client()
    request = EmbedRequest("r1", ("a b", (7, 8, 9)), {"traceparent": "tp"})
    result = asyncio.run(encode_all(client, request))
    assert result.vectors == ((2.0, 1.0, 0.5), (3.0, 1.0, 0.5))
    assert result.prompt_tokens == 5
    prompts = [c[0] for c in client.calls]
    assert prompts == ["a b", {"prompt_token_ids": [7, 8, 9]}]
    assert {c[1] for c in client.calls} == {"embed"}
    assert len({c[2] for c in client.calls}) == 2  # one vLLM request id per input
    assert all(c[3] == {"traceparent": "tp"} for c in client.calls)


def test_fake_engine_embeds_only_as_an_embedding_model():
    async def run():
        embedder, generator = FakeEngine("e", 16, task="embed"), FakeEngine("g", 16)
        await embedder.start()
        await generator.start()
        result = await embedder.embed(EmbedRequest("r", ("x y", "x y", "z")))
        with pytest.raises(EngineRequestError) as refused:
            await generator.embed(EmbedRequest("r", ("x",)))
        return result, refused.value

    result, refused = asyncio.run(run())
    assert result.vectors[0] == result.vectors[1] != result.vectors[2]
    assert result.prompt_tokens == 5
    assert abs(sum(x * x for x in result.vectors[0]) - 1.0) < 1e-9  # unit vectors
    assert refused.code == "model_not_embedding"


def test_a_pooling_models_vllm_state_has_no_chat_serving():
    """vLLM 0.32's app state for a pooling model sets neither openai_serving_chat nor
    openai_serving_completion (reading them raised AttributeError at engine start)."""
    from agentserve.engine.vllm_engine import servings
    from starlette.datastructures import State

    pooling = State()
    pooling.openai_serving_embedding = object()
    assert servings(pooling) == {}
    generating = State()
    generating.openai_serving_chat, generating.openai_serving_completion = "chat", "cmpl"
    assert servings(generating) == {"chat": "chat", "completion": "cmpl"}
