"""Batched completion prompts (api/prompts.py): a list of prompts is answered with one
choice per prompt and n (index p * n + j), each its own engine request; usage counts every
prompt once; admission, token reservation and the response buffer count prompts x n; and
bad batches are a clear 400 before anything reaches the engine."""

from __future__ import annotations

import asyncio
import json

import pytest
from agentserve.admission.response_budget import worst_case_bytes
from agentserve.admission.shares import token_reservation
from agentserve.api.ask import Ask, ask_of, ask_of_data
from agentserve.api.prompts import MAX_BATCH_CHOICES, MAX_PROMPTS, split_prompts
from agentserve.engine.protocol import Delta, EngineRequest
from agentserve.serve.backend import LocalBackend
from agentserve.serve.fanout import choice_requests, fan_out
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient
from test_serve_fanout import Scripted, _drain
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

URL = "/v1/completions"


def _completion(**fields):
    body = CompletionRequest.model_validate({"model": "m", **fields})
    return EngineRequest("r", "completion", body)


def _client(**rate_limit):
    tenants = []
    headers = {}
    if rate_limit:
        tenants = [{"name": "t", "api_key_sha256": hash_api_key("sk-batch-0123"), "sla": {},
                    "rate_limit": rate_limit}]  # fmt: skip
        headers = {"authorization": "Bearer sk-batch-0123"}
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 64}], "tenants": tenants}
    )
    engine = FakeEngine("m", 64)
    asyncio.run(engine.start())
    app = create_app(spec, {"m": LocalBackend(engine)})
    client = TestClient(app, base_url="http://localhost", client=("127.0.0.1", 50000))
    client.headers.update(headers)
    return client, engine


def test_split_prompts_and_choice_count():
    assert split_prompts("a b") == ["a b"]
    assert split_prompts([1, 2]) == [[1, 2]]  # one token-id prompt
    assert split_prompts([[1, 2], [3]]) == [[1, 2], [3]]
    assert split_prompts(["a", "b"]) == ["a", "b"]
    assert split_prompts([]) == [] and split_prompts(None) == []
    assert ask_of("completion", _completion(prompt=["a", "b", "c"], n=2).body).choices == 6
    assert ask_of("completion", _completion(prompt=[5, 6, 7], n=3).body).choices == 3
    assert Ask("chat", "m", n=4).choices == 4  # a chat request has no prompt batch


def test_choice_requests_split_a_batch_prompt_major_with_seed_per_choice():
    parts = choice_requests(_completion(prompt=["p0", "p1"], n=2, seed=7))
    assert [(r.request_id, r.body.prompt, r.body.n, r.body.seed) for r in parts] == [
        ("r-0", "p0", 1, 7),
        ("r-1", "p0", 1, 8),
        ("r-2", "p1", 1, 7),  # each prompt's choice 0 is what that prompt alone gives
        ("r-3", "p1", 1, 8),
    ]
    tokens = choice_requests(_completion(prompt=[[1, 2], [3]]))
    assert [r.body.prompt for r in tokens] == [[1, 2], [3]]
    single = _completion(prompt="only")
    assert choice_requests(single) == [single]  # one prompt: the request itself
    (one,) = choice_requests(_completion(prompt=[[5, 6]]))  # a batch of one: unwrapped,
    assert one.request_id == "r" and one.body.prompt == [5, 6]  # as vLLM reads it
    pair = choice_requests(_completion(prompt=["x"], n=2))
    assert [r.body.prompt for r in pair] == ["x", "x"]


def test_merged_usage_counts_each_prompt_once_and_its_own_cached_tokens():
    scripts = [  # prompt 0 (10 tokens) x 2 choices, prompt 1 (4 tokens) x 2 choices
        [Delta("a", 10, 1), Delta("b", 10, 2, "stop", cached_tokens=8)],
        [Delta("c", 10, 1, "stop", cached_tokens=10)],  # found its sibling's blocks
        [Delta("d", 4, 1, "stop", cached_tokens=0)],
        [Delta("e", 4, 1), Delta("f", 4, 2, "length", cached_tokens=4)],
    ]
    request = _completion(prompt=["p0", "p1"], n=2)
    deltas = asyncio.run(_drain(fan_out(request, Scripted(scripts, 0.001).generate)))
    assert [d.index for d in deltas[:4]] == [0, 1, 2, 3]
    last = deltas[-1]
    assert last.prompt_tokens == 14  # 10 + 4, not 10 (the largest) nor 28 (per choice)
    assert last.completion_tokens == 2 + 1 + 1 + 2
    assert last.cached_tokens == 8 + 0  # the fewest per prompt, summed


def test_a_text_batch_answers_every_prompt_in_order_with_usage_over_all():
    client, engine = _client()
    r = client.post(URL, json={"model": "m", "prompt": ["a b", "c d e"], "max_tokens": 8})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["text"] for c in body["choices"]] == ["echo: a b", "echo: c d e"]
    assert body["usage"]["prompt_tokens"] == 2 + 3
    assert body["usage"]["completion_tokens"] == 3 + 4
    assert sorted(req.body.prompt for req in engine.requests) == ["a b", "c d e"]


def test_a_streamed_token_batch_with_n_indexes_prompt_major():
    client, _ = _client()
    data = {"model": "m", "prompt": [[11, 12], [13]], "n": 2, "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    r = client.post(URL, json=data)
    assert r.status_code == 200, r.text
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line[6:].startswith("{")]
    texts: dict[int, str] = {}
    for event in events:
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {0: "echo: 11 12", 1: "echo: 11 12", 2: "echo: 13", 3: "echo: 13"}
    assert events[-1]["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize(
    ("prompt", "n", "param", "says"),
    [
        ([], 1, "prompt", "non-empty list"),
        (["a", ""], 1, "prompt", "must be non-empty"),
        ([[1], []], 1, "prompt", "must be non-empty"),
        ([[]], 1, "prompt", "must be non-empty"),
        (["w"] * (MAX_PROMPTS + 1), 1, "prompt", f"at most {MAX_PROMPTS}"),
        (["w"] * 5, 8, "n", f"at most {MAX_BATCH_CHOICES}"),
    ],
)
def test_bad_batches_are_a_clear_400_and_reach_no_engine(prompt, n, param, says):
    client, engine = _client()
    r = client.post(URL, json={"model": "m", "prompt": prompt, "n": n, "max_tokens": 2})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"]
    assert not engine.requests


def test_every_token_prompt_of_a_batch_must_fit_the_context():
    client, engine = _client()
    r = client.post(URL, json={"model": "m", "prompt": [[1, 2], list(range(60))], "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert not engine.requests


def test_a_batch_counts_prompts_x_n_against_max_concurrent_requests():
    client, engine = _client(max_concurrent_requests=3)
    r = client.post(URL, json={"model": "m", "prompt": ["a", "b"], "n": 2, "max_tokens": 2})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "concurrency_limit_exceeded", r.text
    assert "4 choices" in error["message"] and not engine.requests
    ok = client.post(URL, json={"model": "m", "prompt": ["a", "b", "c"], "max_tokens": 2})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 3


def test_reservation_and_buffer_sum_over_the_prompts():
    one = ask_of("completion", _completion(prompt=[1, 2, 3], max_tokens=5, n=2).body)
    batch = ask_of("completion", _completion(prompt=[[1, 2, 3], [4] * 7], max_tokens=5, n=2).body)
    assert token_reservation(one, 64) == 3 + 5 + 5
    assert token_reservation(batch, 64) == (3 + 5 + 5) + (7 + 5 + 5)
    assert worst_case_bytes(batch, 64) == 2 * worst_case_bytes(one, 64)
    data = {"model": "m", "prompt": [[1] * 4, [2] * 10]}  # an admission view, no max_tokens
    no_limit = ask_of_data("completion", data)
    assert token_reservation(no_limit, 64) == 64 + 64  # each one's context
    assert no_limit.choices == 2


def test_an_oversized_batch_is_a_400_on_the_admit_first_path_too():
    """A body with schemas (or over 64 KiB) is admitted before it is validated: a batch
    past the limits must still get validation's 400, not a 503 "retry later"."""
    client, engine = _client()
    data = {"model": "m", "prompt": ["a"] * 100, "max_tokens": 2,
            "response_format": {"type": "json_object"}}  # fmt: skip
    r = client.post(URL, json=data)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert not engine.requests


def test_choices_no_idle_model_could_queue_are_a_400_not_a_retry():
    from agentserve.admission.shares import QueueShares
    from agentserve.api.auth import Tenant
    from agentserve.api.errors import InvalidRequestError
    from agentserve.spec import RateLimitSpec, SLASpec

    tenants = [Tenant(f"t{i}", SLASpec(), RateLimitSpec()) for i in range(4)]
    shares = QueueShares({"m": 20}, 16)  # each tenant is guaranteed 16 // 4 = 4 places
    shares.set_tenants(tenants)
    with pytest.raises(InvalidRequestError) as refused:
        shares.admit("m", tenants[0], 9)  # 20 - the others' 3 x 4 = 8 at most, ever
    assert refused.value.status == 400 and refused.value.code == "too_many_choices"
    shares.admit("m", tenants[0], 8)  # the most: admitted on the idle model
    assert shares.in_flight["m"] == 8


def test_the_span_counts_a_batchs_choices():
    from agentserve.serve.spans import request_attributes

    attrs = request_attributes(ask_of("completion", _completion(prompt=["a", "b", "c"], n=2).body))
    assert attrs["gen_ai.request.choice.count"] == 6
    single = ask_of("completion", _completion(prompt="a").body)
    assert "gen_ai.request.choice.count" not in request_attributes(single)
