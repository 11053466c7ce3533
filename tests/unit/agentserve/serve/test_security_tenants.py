"""Tenants and security at the ingress (fake engine): API keys only as SHA-256 hashes,
compared in constant time, never logged or passed on; 401 without a valid key; open mode
only on loopback; per-tenant limits -> 429 with Retry-After; tenant isolation under a
flood (client-side p95 TTFT/TPOT within B's SLA, and a control run that breaks it)."""

from __future__ import annotations

import asyncio
import hmac
import logging

import httpx
import pytest
from agentserve.admission.quota import RateLimiter
from agentserve.api import auth
from agentserve.api.auth import TenantResolver
from agentserve.api.errors import RateLimitError
from agentserve.cli.up import with_overrides
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, SpecError, hash_api_key, to_yaml
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.reliability.tenants import B_SLA, serve_in_thread, tenant_isolation

SECRET = "sk-very-secret-0123456789abcdef"
OTHER = "sk-other-tenant-key"
MSG = [{"role": "user", "content": "hello there"}]
BODY = {"model": "m", "messages": MSG, "max_tokens": 4}


def _spec(**limits):
    tenants = [
        {"name": "alpha", "api_key_sha256": hash_api_key(SECRET), "sla": {}, "rate_limit": limits},
        {"name": "beta", "api_key_sha256": hash_api_key(OTHER), "sla": {}},
    ]
    return DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 64}], "tenants": tenants}
    )


def _client(spec, engine=None, tracer=None):
    engine = engine or FakeEngine("m", 64)
    asyncio.run(engine.start())
    app = create_app(spec, {"m": LocalBackend(engine)}, tracer=tracer)
    return TestClient(app, raise_server_exceptions=False, client=("127.0.0.1", 5000)), engine


def _auth(key):
    return {"Authorization": f"Bearer {key}"}


def test_keys_are_stored_only_as_sha256_hashes():
    spec = _spec()
    text = to_yaml(spec) + spec.model_dump_json()
    assert SECRET not in text and hash_api_key(SECRET) in text
    with pytest.raises(Exception, match="SHA-256"):
        DeploymentSpec.model_validate(
            {"tenants": [{"name": "x", "api_key_sha256": SECRET, "sla": {}}]}
        )


def test_every_stored_hash_is_compared_in_constant_time(monkeypatch):
    calls, compare = [], hmac.compare_digest

    def counting(a, b):
        calls.append((len(a), len(b)))
        return compare(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    resolver = TenantResolver(_spec())
    assert resolver.resolve(f"Bearer {SECRET}").name == "alpha"  # matches the first
    assert calls == [(32, 32), (32, 32)], "no early exit: both hashes compared"
    calls.clear()
    with pytest.raises(auth.AuthenticationError):
        resolver.resolve("Bearer wrong")
    assert len(calls) == 2


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer   ", f"Basic {SECRET}", "Bearer wrong-key", f"Bearer {SECRET}x"],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/v1/chat/completions"),
        ("post", "/v1/completions"),
        ("post", "/v1/embeddings"),
        ("get", "/v1/models"),
    ],
)
def test_no_valid_key_is_401_on_every_api_route(header, method, path):
    client, engine = _client(_spec())
    headers = {} if header is None else {"Authorization": header}
    r = client.request(method, path, json=BODY if method == "post" else None, headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    error = r.json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    assert not engine.requests


def test_auth_comes_before_the_body_is_read():
    client, _ = _client(_spec())
    r = client.post("/v1/chat/completions", content=b"x" * (5 << 20))  # over the body limit
    assert r.status_code == 401


def test_the_key_never_appears_in_logs_spans_headers_or_metrics(caplog):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client, engine = _client(_spec(), tracer=provider.get_tracer("t"))
    wrong = SECRET[:-1] + "X"
    with caplog.at_level(logging.DEBUG):
        assert (
            client.post("/v1/chat/completions", json=BODY, headers=_auth(wrong)).status_code == 401
        )
        assert (
            client.post("/v1/chat/completions", json=BODY, headers=_auth(SECRET)).status_code == 200
        )
        r = client.post("/v1/chat/completions", content=b"{bad", headers=_auth(SECRET))
        assert r.status_code == 400
        metrics = client.get("/metrics")
        assert metrics.status_code == 200
        metrics = metrics.text
    seen = [caplog.text, metrics, r.text, str(dict(r.headers))]
    seen += [str(dict(req.headers)) for req in engine.requests]
    seen += [str(dict(s.attributes or {})) + str(s.events) for s in exporter.get_finished_spans()]
    for key in (SECRET, wrong):
        assert all(key not in text for text in seen)
    assert all("authorization" not in req.headers for req in engine.requests)
    assert exporter.get_finished_spans(), "spans were recorded and checked"


def test_open_mode_is_loopback_only():
    assert DeploymentSpec().server.host == "127.0.0.1"
    for host in ("0.0.0.0", "192.168.1.5", "::"):
        with pytest.raises(SpecError, match="not a loopback address"):
            with_overrides(DeploymentSpec(), host, None)  # agentserve up --host HOST
    for host in ("127.0.0.1", "::1", "localhost"):
        assert with_overrides(DeploymentSpec(), host, None).server.host == host
    with_overrides(_spec(), "0.0.0.0", None)  # with tenants (API keys) a public bind is fine


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _tenant(**limits):
    return TenantResolver(_spec(**limits)).resolve(f"Bearer {SECRET}")


@pytest.mark.parametrize(
    ("limits", "admitted", "code", "retry_after"),
    [
        ({"requests_per_minute": 3}, 3, "rate_limit_exceeded", "60"),
        ({"max_concurrent_requests": 2}, 2, "concurrency_limit_exceeded", "1"),
        ({}, 50, None, None),
    ],
)
def test_rate_limiter_table(limits, admitted, code, retry_after):
    limiter, tenant = RateLimiter(Clock()), _tenant(**limits)
    leases, error = [], None
    for _ in range(50):
        try:
            leases.append(limiter.admit(tenant))
        except RateLimitError as err:
            error = err
            break
    assert len(leases) == admitted
    assert (error and error.code) == code
    assert (error and error.headers()["Retry-After"]) == retry_after


def test_tokens_per_minute_refuses_until_the_window_passes():
    clock = Clock()
    limiter, tenant = RateLimiter(clock), _tenant(tokens_per_minute=100)
    limiter.admit(tenant).finish(60)
    clock.now += 10
    limiter.admit(tenant).finish(50)  # 110 >= 100 from now on
    clock.now += 5
    with pytest.raises(RateLimitError) as err:
        limiter.admit(tenant)
    assert err.value.code == "tokens_limit_exceeded"
    assert err.value.headers()["Retry-After"] == "45"  # the first charge leaves the window
    clock.now += 46
    limiter.admit(tenant)


def test_concurrency_cap_over_http_is_429_with_retry_after_and_frees_on_finish():
    engine = FakeEngine("m", 64, token_delay_s=0.1)
    asyncio.run(engine.start())
    app = create_app(_spec(max_concurrent_requests=1), {"m": LocalBackend(engine)})
    long = [{"role": "user", "content": "w " * 30}]  # 31 tokens out, 2 per step: ~1.6 s
    body = {"model": "m", "messages": long, "stream": True, "max_tokens": 31}
    with serve_in_thread(app) as base, httpx.Client(base_url=base, trust_env=False) as http:
        url = "/v1/chat/completions"
        with http.stream("POST", url, json=body, headers=_auth(SECRET)) as first:
            lines = first.iter_lines()
            next(lines)  # the first request is in flight
            second = http.post(url, json=BODY, headers=_auth(SECRET))
            other = http.post(url, json=BODY, headers=_auth(OTHER))
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert http.post(url, json=BODY, headers=_auth(SECRET)).status_code == 200
    assert second.status_code == 429 and second.headers["retry-after"] == "1"
    assert second.json()["error"]["code"] == "concurrency_limit_exceeded"
    assert other.status_code == 200, "another tenant is not limited by alpha's cap"


def test_tokens_per_minute_over_http():
    client, _ = _client(_spec(tokens_per_minute=17))  # each request: 2 + 3 tokens
    headers = _auth(SECRET)
    assert client.post("/v1/chat/completions", json=BODY, headers=headers).status_code == 200
    r = client.post("/v1/chat/completions", json=BODY, headers=headers)
    assert r.status_code == 200  # 5 used + 8 reserved (prompt estimate 4 + max_tokens 4)
    r = client.post("/v1/chat/completions", json=BODY, headers=headers)  # 10 + 8 > 17
    assert r.status_code == 429 and r.json()["error"]["code"] == "tokens_limit_exceeded"
    assert int(r.headers["retry-after"]) >= 1
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_flooding_tenant_does_not_push_the_other_past_its_sla():
    outcome = tenant_isolation(duration_s=4.0)  # B: ~40 requests, so p95 is not the max
    d = outcome.details
    limited, control = d["limited"], d["control_a_unlimited"]
    assert (outcome.lost, outcome.errors_5xx, outcome.restarts) == (0, 0, 0)
    assert limited["b_statuses"] == {"200": limited["b_sent"]} and limited["b_sent"] >= 30
    assert limited["a_statuses"].get("429", 0) > 10 * limited["a_statuses"].get("200", 0) / 2
    assert d["retry_after_on_every_429"]
    assert d["b_within_sla"], limited
    assert limited["b_ttft_p95_ms"] <= B_SLA["ttft_p95_ms"]
    assert limited["b_tpot_p95_ms"] <= B_SLA["tpot_p95_ms"]
    # the same flood without A's limits breaks B's SLA: the check can fail
    assert not control["b_within_sla"], control
