"""Issue 30 item 1: one tenant's tool schemas cannot fail or stall another tenant's
requests. Schema checks take turns across tenants (admission/fair_gate.py), each tenant has
its own cache partition, and a request with schemas is admitted (limits, fair share)
before its schemas are checked (admission/admit_first.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from agentserve.admission import parsing
from agentserve.admission.fair_gate import FairGate
from agentserve.admission.parsing import RequestParser
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import Call, asgi_request

from tests.reliability.tool_schemas import hostile_body, tenant_tool_schemas

URL = "/v1/chat/completions"
BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _tool(tag: str, i: int, properties: int = 15) -> dict:
    """A tool whose schema takes about a millisecond to meta-validate; unique per tag."""
    props = {
        f"p{j}": {"type": "string", "description": tag, "enum": [f"v{k}" for k in range(5)]}
        for j in range(properties)
    }
    parameters = {"type": "object", "properties": props, "title": f"{tag} {i}"}
    return {"type": "function", "function": {"name": f"t{i}", "parameters": parameters}}


def _raw(tag: str, tools: int) -> bytes:
    return json.dumps({**BASE, "tools": [_tool(tag, i) for i in range(tools)]}).encode()


def test_another_tenants_request_is_checked_between_a_heavy_jobs_schemas():
    """Counted in schemas, not seconds (the test machine's load varies): the good
    tenant's request waits for a few of the hostile job's schemas, not for all 64."""
    parser = RequestParser({"m": 1024}, timeout_s=120.0)
    asyncio.run(parser.parse("chat", _raw("warm", 1), tenant="warm"))  # lazy imports done
    hostile = parser.cache("hostile")
    seen: dict[str, int] = {}

    async def good() -> None:
        while hostile.misses < 5:  # the heavy job is under way
            await asyncio.sleep(0.001)
        seen["start"] = hostile.misses
        await parser.parse("chat", _raw("g", 2), tenant="good")
        seen["end"] = hostile.misses

    async def run() -> None:
        await asyncio.gather(parser.parse("chat", _raw("h", 64), tenant="hostile"), good())

    asyncio.run(run())
    assert hostile.misses == 64
    assert seen["end"] - seen["start"] <= 20, seen  # FIFO: it waited for the other ~58


def test_each_tenant_has_its_own_schema_cache(monkeypatch):
    monkeypatch.setattr(parsing, "TENANT_CACHE_ENTRIES", 8)
    parser = RequestParser({"m": 1024})
    raw = _raw("shared", 3)
    asyncio.run(parser.parse("chat", raw, tenant="a"))
    a = parser.cache("a")
    assert (a.misses, a.hits) == (3, 0)
    asyncio.run(parser.parse("chat", raw, tenant="b"))
    b = parser.cache("b")
    assert (b.misses, b.hits) == (3, 0), "b learns nothing from a's entries"
    asyncio.run(parser.parse("chat", _raw("churn", 20), tenant="b"))  # > 8: b evicts its own
    asyncio.run(parser.parse("chat", raw, tenant="a"))
    assert (a.misses, a.hits) == (3, 3), "a's entries survive b's churn"
    asyncio.run(parser.parse("chat", raw, tenant="b"))
    assert b.hits == 0, "b's own entries were the ones evicted"


def test_the_gate_hands_the_turn_to_the_tenant_served_least_recently():
    gate, order, lock = FairGate(), [], threading.Lock()

    def job(tenant: str, steps: int) -> None:
        with gate.turn(tenant) as turn:
            for _ in range(steps):
                with lock:
                    order.append(tenant)
                time.sleep(0.002)
                turn.checkpoint()

    hostile = threading.Thread(target=job, args=("h", 200))
    hostile.start()
    while not order:
        time.sleep(0.001)
    good = threading.Thread(target=job, args=("g", 3))
    good.start()
    while not gate.waiting():  # the good job is queued at the gate
        time.sleep(0.0005)
    with lock:
        queued_at = len(order)
    good.join(5)
    hostile.join(5)
    assert order.count("g") == 3 and order.count("h") == 200
    last_good = max(i for i, t in enumerate(order) if t == "g")
    assert queued_at < 190 and last_good <= queued_at + 8, order  # not after all 200


def test_a_tenant_past_its_limit_gets_429_before_any_schema_is_checked():
    key = "sk-limited-tenant"
    spec = DeploymentSpec.model_validate(
        {
            "models": [{"name": "m", "engine": "fake", "max_model_len": 1024}],
            "tenants": [
                {
                    "name": "t",
                    "api_key_sha256": hash_api_key(key),
                    "sla": {},
                    "rate_limit": {"max_concurrent_requests": 1},
                }
            ],
        }
    )
    engine = FakeEngine("m", 1024, token_delay_s=0.02, accept_per_step=1)
    asyncio.run(engine.start())
    app = create_app(spec, {"m": LocalBackend(engine)})
    parser = app.state.ingress.admit_stage.parser
    headers = {"authorization": f"Bearer {key}"}

    async def run() -> Call:
        call = Call()
        long = {**BASE, "stream": True, "max_tokens": 40}
        held = asyncio.ensure_future(
            asgi_request(app, "POST", URL, long, headers=headers, call=call)
        )
        while not call.body_times():
            await asyncio.sleep(0.005)
        body = {**BASE, "tools": [_tool("x", i) for i in range(20)]}
        refused = await asgi_request(app, "POST", URL, body, headers=headers)
        await held
        return refused

    refused = asyncio.run(run())
    assert refused.status == 429, refused.text()
    assert refused.json()["error"]["code"] == "concurrency_limit_exceeded"
    assert parser.cache("t").misses == 0, "no schema was checked for a refused request"


class _NoStr(dict):
    """A tool that fails the test if serialized (str/repr)."""

    def __repr__(self) -> str:
        raise AssertionError("the admission estimate serialized a tool")


def test_admitting_a_heavy_request_does_not_serialize_its_tools_on_the_loop():
    """The token estimate for an admission view uses the body's size: serializing 128
    schemas again (str(tool), the old estimate) took 4.4 ms on the event loop."""
    from agentserve.admission.shares import estimate_prompt_tokens
    from agentserve.api.ask import ask_of_data

    body = hostile_body(1)
    raw = json.dumps(body).encode()
    body["tools"] = [_NoStr(tool) for tool in body["tools"]]
    view = ask_of_data("chat", body, len(raw))
    estimate = estimate_prompt_tokens(view)
    assert len(raw) / 4 <= estimate <= len(raw) / 4 + 10
    without_tools = ask_of_data("chat", {**body, "tools": None}, len(raw))
    assert estimate_prompt_tokens(without_tools) < 10  # the body size counts only for tools


def test_a_long_conversation_with_tools_is_not_counted_twice():
    """The body's size, which stands for the tools, holds the messages too: the messages
    the estimate already counted are taken out of it."""
    from agentserve.admission.shares import estimate_prompt_tokens
    from agentserve.api.ask import ask_of_data

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "word " * 4000}]  # 20,000 characters
    body = {"model": "m", "messages": messages, "tools": [tool]}
    raw = json.dumps(body).encode()
    counted = estimate_prompt_tokens(ask_of_data("chat", body, len(raw)))
    alone = estimate_prompt_tokens(ask_of_data("chat", {**body, "tools": None}))
    assert alone <= counted <= alone + (len(raw) - 20_000) / 4 + 1  # was about 2 x alone


def test_the_tool_schema_flood_scenario_fails_no_request_of_the_other_tenant():
    """tests/reliability/tool_schemas.py, shortened. Before the fix the well-behaved
    tenant's requests queued behind every hostile schema (FIFO, one worker) and failed
    with validation_timeout; the 1.5x p99 bound is recorded by the scenario run (this
    machine's load makes a 4 s p99 too noisy to assert tightly)."""
    outcome = tenant_tool_schemas(duration_s=4.0)
    d = outcome.details
    assert (outcome.lost, outcome.errors_5xx) == (0, 0), d
    attack = d["attack"]
    assert set(attack["good_statuses"]) == {"200"} and attack["good_statuses"]["200"] >= 40
    assert attack["hostile_statuses"].get("400", 0) >= 2, "the hostile schemas were checked"
    assert d["good_p99_ratio"] <= 5.0, d  # the old code: 187x
