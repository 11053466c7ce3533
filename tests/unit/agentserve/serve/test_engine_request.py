"""The engine request is built once from the parsed body and the ingress's decisions
(serve/engine_request.py); the parsed body is never changed, so what the poison list
fingerprints before dispatch is what it marks after two replica deaths."""

from __future__ import annotations

import asyncio

from agentserve.admission.priority import BATCH_PRIORITY
from agentserve.engine.protocol import Delta, EngineDeadError, EngineRequest, EngineStats
from agentserve.serve.engine_request import engine_headers, engine_request
from agentserve.serve.ingress import create_app
from agentserve.serve.poison import fingerprint
from agentserve.spec import DeploymentSpec, hash_api_key
from asgi_calls import asgi_request
from opentelemetry.trace import INVALID_SPAN
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

KEY = "sk-bulk-0123456789"


def _parsed(**extra) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    )


def test_the_decisions_are_set_on_a_copy_and_the_parsed_body_is_left_as_it_was():
    parsed = _parsed(cache_salt="client")
    before = (parsed.model_dump(), set(parsed.model_fields_set), fingerprint("t", "chat", parsed))
    request = engine_request(
        "chat", parsed, request_id="r1", headers={"a": "b"}, priority=1, cache_salt="salted"
    )
    assert (request.request_id, request.kind, request.headers) == ("r1", "chat", {"a": "b"})
    assert request.body is not parsed
    assert (request.body.priority, request.body.cache_salt) == (1, "salted")
    assert {"priority", "cache_salt"} <= request.body.model_fields_set  # a continuation keeps them
    after = (parsed.model_dump(), set(parsed.model_fields_set), fingerprint("t", "chat", parsed))
    assert after == before


def test_no_decision_leaves_the_field_as_parsed():
    parsed = _parsed()
    request = engine_request(
        "chat", parsed, request_id="r", headers={}, priority=None, cache_salt=None
    )
    assert request.body is parsed and "priority" not in request.body.model_fields_set
    salted = engine_request("chat", parsed, request_id="r", headers={}, priority=None,
                            cache_salt="s")  # fmt: skip
    assert "priority" not in salted.body.model_fields_set and salted.body.priority == 0


def test_engine_headers_pass_session_request_id_and_tenant_only():
    incoming = {"x-session-id": "s1", "x-request-id": "q1", "x-vllm-priority": "-100"}
    headers = engine_headers(INVALID_SPAN, incoming, "bulk")
    assert headers["x-session-id"] == "s1" and headers["x-request-id"] == "q1"
    assert headers["x-agentserve-tenant"] == "bulk" and "x-agentserve-sent-at-ns" in headers
    assert "x-vllm-priority" not in headers


class _Dying:
    """A model whose replicas all die on every request (records what each was sent)."""

    def __init__(self) -> None:
        self.requests: list[EngineRequest] = []

    async def generate(self, request: EngineRequest):
        self.requests.append(request)
        raise EngineDeadError("the replica died")
        yield Delta()  # an async generator, as a replica's stream is

    async def stats(self) -> EngineStats:
        return EngineStats()

    async def health(self) -> None:
        return None

    async def ready_replicas(self) -> int | None:
        return None


def test_a_batch_tenants_poison_request_is_refused_when_sent_again():
    """The engine sees the batch priority and the tenant's salt, yet the poison list
    marks the request as parsed: sent again, it is refused at once (remembered)."""
    spec = DeploymentSpec.model_validate(
        {
            "models": [{"name": "m", "max_model_len": 256}],
            "tenants": [{"name": "bulk", "api_key_sha256": hash_api_key(KEY),
                         "sla": {"ttft_p95_ms": 20000}, "sla_class": "batch"}],
        }
    )  # fmt: skip
    model = _Dying()
    app = create_app(spec, {"m": model})
    body = {"model": "m", "messages": [{"role": "user", "content": "crash"}], "max_tokens": 4}
    auth = {"authorization": f"Bearer {KEY}"}

    async def run():
        first = await asgi_request(app, "POST", "/v1/chat/completions", body, headers=auth)
        again = await asgi_request(app, "POST", "/v1/chat/completions", body, headers=auth)
        return first, again

    first, again = asyncio.run(run())
    assert first.status == 400 and first.json()["error"]["code"] == "request_crashed_engine"
    assert again.status == 400 and "earlier" in again.json()["error"]["message"]
    assert len(model.requests) == 2, "the resent request reached no replica"
    sent = model.requests[0].body
    assert sent.priority == BATCH_PRIORITY and sent.cache_salt
