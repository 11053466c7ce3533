"""Memory amplification: a non-stream n=8 request with top_logprobs=20 and a long output
is refused (400 response_too_large) before the ingress buffers it; the same request as a
stream is served without buffering; a control run with the cap lifted shows what the
ingress would have held. Peaks are Python allocations traced in the ingress process
(tracemalloc) over each request, so other requests and the imports do not count; they
include the test client's copy of the response (response_mib), as both run in-process.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from typing import Any

from agentserve.admission import response_budget
from agentserve.serve.backend import LocalBackend
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine

from tests.reliability.scenario import Outcome, scenario
from tests.reliability.tenants import serve_in_thread

__all__ = ["memory_n_logprobs"]

WORDS = 1000  # prompt words; the fake engine echoes them: about as many output tokens


def _body(stream: bool) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "w " * WORDS}],
        "max_tokens": WORDS + 8,
        "n": 8,
        "logprobs": True,
        "top_logprobs": 20,
        "stream": stream,
    }


def _measure(url: str, stream: bool) -> dict[str, Any]:
    """One request; its status, response bytes and the traced peak (MiB)."""
    import httpx

    tracemalloc.start()
    try:
        with httpx.Client(timeout=300, trust_env=False) as client:
            r = client.post(f"{url}/v1/chat/completions", json=_body(stream))
            text = r.text
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    complete = r.status_code != 200 or not stream or text.rstrip().endswith("data: [DONE]")
    code = r.json()["error"]["code"] if r.status_code >= 400 else None
    return {
        "status": r.status_code,
        "code": code,
        "complete": complete,
        "response_mib": round(len(text) / 2**20, 1),
        "peak_traced_mib": round(peak / 2**20, 1),
    }


@scenario("memory_n_logprobs")
def memory_n_logprobs() -> Outcome:
    """n=8, top_logprobs=20, ~1000 output tokens: non-stream refused (400) with a small
    ingress peak, the stream served, the cap-lifted control's peak recorded."""
    from agentserve.serve.ingress import create_app  # imports vLLM: lazily

    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 4096, "max_num_seqs": 8}]}
    )
    engine = FakeEngine("m", 4096)
    asyncio.run(engine.start())
    app = create_app(spec, {"m": LocalBackend(engine)})
    runs: dict[str, dict[str, Any]] = {}
    with serve_in_thread(app) as url:
        runs["non_stream_capped"] = _measure(url, stream=False)
        runs["stream"] = _measure(url, stream=True)
        cap = response_budget.MAX_BUFFERED_BYTES
        response_budget.MAX_BUFFERED_BYTES = 2**40  # the control: no cap
        try:
            runs["control_uncapped_non_stream"] = _measure(url, stream=False)
        finally:
            response_budget.MAX_BUFFERED_BYTES = cap
    expected = {"non_stream_capped": 400, "stream": 200, "control_uncapped_non_stream": 200}
    lost = sum(runs[k]["status"] != want or not runs[k]["complete"] for k, want in expected.items())
    errors_5xx = sum(r["status"] >= 500 for r in runs.values())
    from agentserve.api.ask import ask_of
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    parsed = ChatCompletionRequest.model_validate(_body(stream=False))
    worst = response_budget.worst_case_bytes(ask_of("chat", parsed), spec.models[0].max_model_len)
    return Outcome(
        requests=len(runs),
        lost=lost,
        errors_5xx=errors_5xx,
        restarts=0,
        details={
            "cap_mib": cap // 2**20,
            "estimated_worst_case_mib": round(worst / 2**20, 1),
            **runs,
        },
    )
