"""The real app: local Ray Serve + vLLM (CPU build) + bundled model + shipped DFlash drafter,
driven by the official `openai` client. One engine start (eager, ~30 s on CPU) for the module.

Run: .venv/bin/python -m pytest -q -m slow tests/integration/test_serve_vllm.py
"""

from __future__ import annotations

import re

import openai
import pytest
from agentserve.drafters import shipped_drafter
from agentserve.sources.models import BUNDLED_MODEL

pytestmark = pytest.mark.slow

PORT = 8766


@pytest.fixture(scope="module")
def client():
    import ray
    from agentserve.serve.app import build_app
    from agentserve.spec import DeploymentSpec
    from ray import serve

    drafter = {"enabled": shipped_drafter(BUNDLED_MODEL) is not None}
    # engine_args reach vLLM: eager mode (no torch.compile warm-up) starts in ~30 s
    model = {"max_model_len": 1024, "drafter": drafter, "engine_args": {"enforce_eager": True}}
    spec = DeploymentSpec.model_validate({"models": [model], "server": {"port": PORT}})
    ray.init(include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(build_app(spec), route_prefix="/")
    yield openai.OpenAI(api_key="none", base_url=f"http://127.0.0.1:{PORT}/v1", max_retries=0)
    serve.shutdown()
    ray.shutdown()


def test_chat_completions_models(client):
    chat = client.chat.completions.create(
        model=BUNDLED_MODEL,
        messages=[{"role": "user", "content": "What is 2 plus 2?"}],
        max_tokens=16,
        temperature=0,
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens > 0
    done = client.completions.create(
        model=BUNDLED_MODEL, prompt="The capital of France is", max_tokens=8
    )
    assert done.choices[0].text
    assert [m.id for m in client.models.list().data] == [BUNDLED_MODEL]


def test_a_prompt_batch_answers_each_prompt_as_it_alone_would(client):
    """Batched completion prompts (api/prompts.py) through the real engine: greedy, each
    choice is what its prompt sent alone gives, in prompt order; usage counts each once.
    Short, confident continuations: greedy output that batching cannot tip (no near-ties)."""
    prompts = ["The capital of France is", "def add(a, b):\n    return", "1, 2, 3, 4,"]
    alone = [
        client.completions.create(model=BUNDLED_MODEL, prompt=p, max_tokens=4, temperature=0)
        for p in prompts
    ]
    batch = client.completions.create(
        model=BUNDLED_MODEL, prompt=prompts, max_tokens=4, temperature=0
    )
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == [a.choices[0].text for a in alone]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert batch.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_stream_is_incremental_with_usage_last(client):
    stream = client.chat.completions.create(
        model=BUNDLED_MODEL,
        # greedy, and long enough to span several stream intervals (the replica coalesces
        # tokens per 100 ms): a sampled reply may stop after a few tokens
        messages=[{"role": "user", "content": "Count from one to fifty, in words."}],
        max_tokens=160,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens > 0


def test_usage_says_how_much_of_a_repeated_prompt_the_prefix_cache_served(client):
    """An agent's next turn re-sends the conversation: vLLM's prefix cache serves its
    blocks, the usage says how many tokens (the autoscaler plans prefill for the rest)."""
    history = "The tool returned the following rows of the inventory table. " * 40
    messages = [{"role": "user", "content": history + "How many rows were there?"}]
    usages = [
        client.chat.completions.create(
            model=BUNDLED_MODEL, messages=messages, max_tokens=4, temperature=0
        ).usage
        for _ in range(2)
    ]
    first, again = (u.prompt_tokens_details.cached_tokens for u in usages)
    assert usages[1].prompt_tokens == usages[0].prompt_tokens > 400
    assert first < usages[0].prompt_tokens // 2 and again >= usages[1].prompt_tokens // 2


def test_client_mistakes_are_4xx(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=BUNDLED_MODEL, messages=[{"role": "user", "content": "word " * 2000}]
        )
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=BUNDLED_MODEL, messages=[{"role": "user", "content": "x"}], temperature=5
        )


def test_metrics_show_dflash_acceptance(client):
    import httpx

    text = httpx.get(f"http://127.0.0.1:{PORT}/metrics").text
    assert "agentserve_time_to_first_token_seconds_count" in text
    if shipped_drafter(BUNDLED_MODEL) is not None:
        drafts = re.search(r"agentserve_spec_decode_drafts_total\{[^}]*\} ([0-9.e+]+)", text)
        assert drafts and float(drafts.group(1)) > 0, "the DFlash drafter is active"
