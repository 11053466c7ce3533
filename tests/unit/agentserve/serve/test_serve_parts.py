"""Pure parts of serving: tenant auth, rate limits, traceparent, vLLM SSE -> deltas, options."""

from __future__ import annotations

import asyncio

import pytest
from agentserve.admission.quota import RateLimiter
from agentserve.api.auth import TenantResolver
from agentserve.api.errors import AuthenticationError, RateLimitError
from agentserve.engine.protocol import EngineRequestError
from agentserve.engine.vllm_engine import deltas_from_sse
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve.tracing import forwarded_trace_headers, valid_traceparent

TP = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


def _spec(*tenants):
    return DeploymentSpec.model_validate({"tenants": list(tenants)})


def _tenant(name, key, **limits):
    return {"name": name, "api_key_sha256": hash_api_key(key), "sla": {}, "rate_limit": limits}


@pytest.mark.parametrize(
    ("header", "tenant"),
    [("Bearer k1", "a"), ("bearer k2", "b"), ("Bearer  k2 ", "b")],
)
def test_keys_resolve_to_their_tenant(header, tenant):
    resolver = TenantResolver(_spec(_tenant("a", "k1"), _tenant("b", "k2")))
    assert resolver.resolve(header).name == tenant


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic k1", "Bearer k3", "k1"])
def test_bad_keys_are_401(header):
    resolver = TenantResolver(_spec(_tenant("a", "k1")))
    with pytest.raises(AuthenticationError):
        resolver.resolve(header)


def test_open_mode_only_without_tenants():
    assert TenantResolver(_spec()).resolve(None).name == "default"
    assert not TenantResolver(_spec(_tenant("a", "k1"))).open_mode


def test_rate_limits_window_and_concurrency():
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    resolver = TenantResolver(
        _spec(
            _tenant(
                "a", "k", requests_per_minute=2, max_concurrent_requests=1, tokens_per_minute=100
            )
        )
    )
    tenant = resolver.resolve("Bearer k")
    lease = limiter.admit(tenant)
    with pytest.raises(RateLimitError, match="in flight"):
        limiter.admit(tenant)
    lease.finish(10)
    lease.finish(10)  # idempotent
    limiter.admit(tenant).finish(95)
    with pytest.raises(RateLimitError, match="requests per minute"):
        limiter.admit(tenant)
    now[0] = 61.0
    limiter.admit(tenant).finish(0)  # the window moved on


def test_token_limit():
    limiter = RateLimiter(clock=lambda: 0.0)
    tenant = TenantResolver(_spec(_tenant("a", "k", tokens_per_minute=10))).resolve("Bearer k")
    limiter.admit(tenant).finish(10)
    with pytest.raises(RateLimitError) as err:
        limiter.admit(tenant)
    assert err.value.code == "tokens_limit_exceeded" and err.value.status == 429


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (TP, True),
        ("ff" + TP[2:], False),
        ("00-" + "0" * 32 + "-" + "2" * 16 + "-01", False),
        ("00-xyz", False),
        (None, False),
    ],
)
def test_traceparent_validation(value, ok):
    assert valid_traceparent(value) is ok


def test_trace_headers_forwarded_only_with_valid_parent():
    assert forwarded_trace_headers({"Traceparent": TP, "tracestate": "a=b"}) == {
        "traceparent": TP,
        "tracestate": "a=b",
    }
    assert forwarded_trace_headers({"tracestate": "a=b"}) == {}


def _sse(*payloads):
    async def gen():
        for p in payloads:
            yield p

    return gen()


def _collect(kind, *events):
    async def run():
        return [d async for d in deltas_from_sse(kind, _sse(*events))]

    return asyncio.run(run())


def test_vllm_chat_sse_becomes_deltas_with_final_counts():
    u = '"usage":{{"prompt_tokens":5,"completion_tokens":{}}}'
    events = [
        'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],'
        + u.format(0)
        + "}\n\n",
        'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}],' + u.format(3) + "}\n\n",
        'data: {"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop"}],'
        + u.format(4)
        + "}\n\n",
        'data: {"choices":[],' + u.format(4) + "}\n\n",
        "data: [DONE]\n\n",
    ]
    deltas = _collect("chat", *events)
    assert [d.text for d in deltas] == ["Hi", "!"]
    assert deltas[0].completion_tokens == 3
    assert (deltas[-1].finish_reason, deltas[-1].prompt_tokens, deltas[-1].completion_tokens) == (
        "stop",
        5,
        4,
    )


def test_the_prompt_tokens_the_prefix_cache_served_ride_on_the_finish_delta():
    """vLLM's final usage chunk (enable_prompt_tokens_details) says how much of the prompt
    its prefix cache served: the autoscaler plans prefill for the rest."""
    u = '"usage":{"prompt_tokens":900,"completion_tokens":2}'
    details = (
        '"usage":{"prompt_tokens":900,"completion_tokens":2,'
        '"prompt_tokens_details":{"cached_tokens":864}}'
    )
    events = [
        'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}],' + u + "}\n\n",
        'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],' + u + "}\n\n",
        'data: {"choices":[],' + details + "}\n\n",
        "data: [DONE]\n\n",
    ]
    deltas = _collect("chat", *events)
    assert [d.cached_tokens for d in deltas] == [0, 864]
    assert deltas[-1].prompt_tokens == 900 and deltas[-1].finish_reason == "stop"


def test_vllm_error_event_raises_request_error():
    error = '{"message":"maximum context length is 64","type":"BadRequestError","code":400}'
    event = 'data: {"error":' + error + "}\n\n"
    with pytest.raises(EngineRequestError) as err:
        _collect("completion", event)
    assert err.value.status == 400 and err.value.code == "context_length_exceeded"
