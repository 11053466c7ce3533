"""Hybrid drafting's per-proposer counts reach the request's decode span, with the real vLLM
engine (eager, to start without compiling): the engine's hook counts each request's n-gram
and DFlash drafts, writes them after the last step, and the replica's span reads them."""

from __future__ import annotations

import asyncio

import pytest
from agentserve import tracing as t
from agentserve.engine.protocol import EngineRequest
from agentserve.serve.spans import traced_stream
from agentserve.spec import DeploymentSpec, TracingSpec
from agentserve.spec.defaults import resolve_drafters
from agentserve.spec.overrides import with_speculation
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytestmark = pytest.mark.slow

CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"


def test_decode_span_counts_the_requests_ngram_and_dflash_drafts():
    from agentserve.engine.vllm_engine import VLLMEngine
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    spec, _ = resolve_drafters(with_speculation(DeploymentSpec(), "hybrid"))
    model = spec.models[0].model_copy(update={"engine_args": {"enforce_eager": True}})
    exporter = InMemorySpanExporter()
    tracer = t.make_tracer(TracingSpec(), {}, "test", exporter=exporter)
    message = {"role": "user", "content": "Repeat this code exactly:\n" + CODE}
    steps: dict[str, int] = {}

    async def run() -> None:
        engine = VLLMEngine(model)
        await engine.start()
        try:
            assert engine.proposer_counts is not None  # hybrid: the engine reports them
            body = ChatCompletionRequest(
                model=model.name, messages=[message], max_tokens=64, temperature=0
            )
            request = EngineRequest("span-1", "chat", body)
            stream = engine.generate(request)
            async for _ in traced_stream(
                tracer, request, stream, model=model.name, proposer_counts=engine.proposer_counts
            ):
                pass
            await asyncio.sleep(1.5)  # the engine writes within 0.5 s, the span waits 0.7 s
            steps.update((await engine.stats()).spec_steps)
        finally:
            await engine.stop()

    asyncio.run(run())
    (decode,) = [s for s in exporter.get_finished_spans() if s.name == "decode"]
    a = decode.attributes
    # the reply repeats the prompt: prompt lookup drafts most steps, and its drafts are taken
    assert a["agentserve.spec_decode.ngram.drafts"] >= 1
    assert a["agentserve.spec_decode.ngram.accepted_tokens"] > 0
    assert (
        a["agentserve.spec_decode.ngram.accepted_tokens"]
        <= a["agentserve.spec_decode.ngram.draft_tokens"]
    )
    assert "agentserve.spec_decode.dflash.drafts" in a  # counted, whatever it drafted
    tokens = a[t.SERVED_OUTPUT_TOKENS]
    accepted = sum(a[f"agentserve.spec_decode.{p}.accepted_tokens"] for p in ("ngram", "dflash"))
    assert accepted < tokens  # every step emits one token of its own besides accepted ones
    # steps where prompt lookup drafted (the one request) skipped DFlash's block forward, and
    # the engine's stats say so (the replica's /metrics: agentserve_spec_decode_hybrid_steps)
    assert steps["context_only"] >= 1 and "block" in steps
