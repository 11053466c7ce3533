"""Issue 19 item 1, priority by SLA class: deadline-ordered dispatch (serve/priority.py), a
batch request past its TTFT objective refused with 429 + Retry-After, vLLM priority
scheduling in the engine args and each forwarded request's priority from its tenant class
(a client's own priority still refused), kept through a migration."""

from __future__ import annotations

import asyncio

import pytest
from agentserve.admission.priority import BATCH_PRIORITY, INTERACTIVE_PRIORITY, DispatchQueue
from agentserve.engine.protocol import Continuation, EngineRequest
from agentserve.engine.vllm_args import engine_kwargs
from agentserve.engine.vllm_engine import continuation_body
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, ModelSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import asgi_request
from pydantic import ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

KEYS = {"chat": "sk-chat-0123456789", "bulk": "sk-bulk-0123456789"}
URL = "/v1/chat/completions"


# -- DispatchQueue (pure) ------------------------------------------------------------------
async def _settle() -> None:
    await asyncio.sleep(0.01)  # the woken waiters' tasks run


async def _started(coro) -> asyncio.Task:
    task = asyncio.ensure_future(coro)
    await _settle()  # it runs up to its wait
    return task


def test_the_earliest_deadline_is_sent_first_not_the_earliest_arrival():
    async def run():
        q = DispatchQueue()
        q.set_slots(1)
        await q.acquire(1.0)  # holds the only slot
        batch = await _started(q.acquire(20.0))  # arrives first, deadline +20 s
        await asyncio.sleep(0.01)
        chat = await _started(q.acquire(2.0))  # arrives later, deadline +2 s
        assert q.waiting == 2 and not batch.done() and not chat.done()
        q.release()
        await _settle()
        assert chat.done() and not batch.done()
        q.release()
        await _settle()
        assert batch.done() and q.sent == 1 and q.waiting == 0

    asyncio.run(run())


def test_a_shed_request_past_its_deadline_times_out_and_holds_nothing():
    async def run():
        q = DispatchQueue()
        q.set_slots(1)
        await q.acquire(1.0)
        late = await _started(q.acquire(0.05, shed=True))
        kept = await _started(q.acquire(0.05))  # not sheddable: waits on
        await asyncio.sleep(0.15)
        assert late.done() and isinstance(late.exception(), TimeoutError)
        assert not kept.done() and q.sent == 1 and q.waiting == 1
        q.release()
        await _settle()
        assert kept.done() and kept.exception() is None and q.sent == 1

    asyncio.run(run())


def test_a_cancelled_waiter_holds_no_slot_and_a_large_head_is_not_overtaken():
    async def run():
        q = DispatchQueue()
        q.set_slots(2)
        await q.acquire(1.0)
        await q.acquire(1.0)
        gone = await _started(q.acquire(0.5))
        big = await _started(q.acquire(1.0, count=2))  # needs both slots
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        q.release()
        small = await _started(q.acquire(5.0))  # one slot is free, but big is ahead
        assert not big.done() and not small.done() and (q.sent, q.waiting) == (1, 2)
        q.release()
        await _settle()
        assert big.done() and not small.done() and q.sent == 2
        q.set_slots(None)  # no ready replica known: no limit
        await _settle()
        assert small.done() and q.sent == 3 and q.waiting == 0

    asyncio.run(run())


# -- the ingress, fake engine ---------------------------------------------------------------
def _spec(bulk_ttft_ms=20000, priority_scheduling=True, dispatch_order="deadline"):
    return DeploymentSpec.model_validate(
        {
            "models": [
                {"name": "m", "engine": "fake", "max_model_len": 256, "max_num_seqs": 1,
                 "priority_scheduling": priority_scheduling, "dispatch_order": dispatch_order},
            ],
            "tenants": [
                {"name": "chat", "api_key_sha256": hash_api_key(KEYS["chat"]),
                 "sla": {"ttft_p95_ms": 1000}},
                {"name": "bulk", "api_key_sha256": hash_api_key(KEYS["bulk"]),
                 "sla": {"ttft_p95_ms": bulk_ttft_ms}, "sla_class": "batch"},
            ],
        }
    )  # fmt: skip


def _body(tag: str, max_tokens: int = 8, words: int = 0, **extra) -> dict:
    """`words` more prompt words make a longer reply (the fake engine echoes the prompt)."""
    content = " ".join([tag, *["word"] * words])
    return {"model": "m", "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, **extra}  # fmt: skip


def _post(app, who: str, body: dict, **headers):
    return asgi_request(
        app, "POST", URL, body, headers={"authorization": f"Bearer {KEYS[who]}", **headers}
    )


def _prompt(request: EngineRequest) -> str:
    return request.body.messages[0]["content"].split()[0]


async def _app(spec, token_delay_s=0.03):
    engine = FakeEngine("m", 256, token_delay_s=token_delay_s, accept_per_step=1, max_num_seqs=1)
    await engine.start()
    return engine, create_app(spec, {"m": LocalBackend(engine)})


def test_a_later_interactive_request_is_sent_before_an_earlier_batch_one():
    """max_num_seqs 1, one replica: 2 slots. Two batch requests fill them, a third waits;
    an interactive one arriving after it is sent on first, each with its class's priority."""

    async def run():
        engine, app = await _app(_spec())
        batch = [_body(f"b{i}", 16, words=10) for i in range(3)]  # ~0.4 s each
        calls = [asyncio.ensure_future(_post(app, "bulk", body)) for body in batch]
        await asyncio.sleep(0.05)
        calls.append(asyncio.ensure_future(_post(app, "chat", _body("chat"))))
        done = await asyncio.gather(*calls)
        return engine, done

    engine, done = asyncio.run(run())
    assert [c.status for c in done] == [200] * 4
    order = [_prompt(r) for r in engine.requests]
    assert order.index("chat") < order.index("b2"), order
    priorities = {_prompt(r): r.body.priority for r in engine.requests}
    assert priorities == {"b0": BATCH_PRIORITY, "b1": BATCH_PRIORITY,
                          "b2": BATCH_PRIORITY, "chat": INTERACTIVE_PRIORITY}  # fmt: skip
    assert INTERACTIVE_PRIORITY < BATCH_PRIORITY


def test_a_batch_request_past_its_objective_gets_429_with_retry_after():
    """Batch objective 200 ms; the two slots are busy ~0.7 s: the waiting batch request is
    refused (never started), the interactive one behind the same slots is served."""

    async def run():
        engine, app = await _app(_spec(bulk_ttft_ms=200))
        busy = [_body(f"c{i}", 32, words=20) for i in (0, 1)]  # ~0.7 s each
        busy = [asyncio.ensure_future(_post(app, "chat", body)) for body in busy]
        await asyncio.sleep(0.02)
        late = asyncio.ensure_future(_post(app, "bulk", _body("late")))
        waits = asyncio.ensure_future(_post(app, "chat", _body("waits")))
        return engine, await asyncio.gather(*busy, late, waits), app

    engine, (c0, c1, late, waits), app = asyncio.run(run())
    assert (c0.status, c1.status, waits.status) == (200, 200, 200)
    assert late.status == 429, late.json()
    error = late.json()["error"]
    assert error["code"] == "deadline_exceeded" and error["type"] == "rate_limit_exceeded"
    assert set(error) == {"message", "type", "param", "code"}
    assert int(late.headers["retry-after"]) == 1  # its 0.2 s objective, at least 1 s
    assert "late" not in [_prompt(r) for r in engine.requests]  # never reached the engine
    ingress = app.state.ingress
    assert (
        ingress.dispatch_stage.dispatcher.queues["m"].sent == 0
        and ingress.admit_stage.shares.in_flight["m"] == 0
    )


def test_arrival_order_sends_first_come_first_and_sheds_no_batch_request():
    """dispatch_order arrival (the baseline with priority off): three batch requests fill
    the two slots and wait, an interactive one arriving later goes after all of them, and
    the waiting batch request is served although its 200 ms objective passed."""

    async def run():
        spec = _spec(bulk_ttft_ms=200, priority_scheduling=False, dispatch_order="arrival")
        engine, app = await _app(spec)
        batch = [_body(f"b{i}", 16, words=10) for i in range(3)]  # ~0.4 s each
        calls = [asyncio.ensure_future(_post(app, "bulk", body)) for body in batch]
        await asyncio.sleep(0.05)
        calls.append(asyncio.ensure_future(_post(app, "chat", _body("chat"))))
        return engine, await asyncio.gather(*calls)

    engine, done = asyncio.run(run())
    assert [c.status for c in done] == [200] * 4
    assert [_prompt(r) for r in engine.requests] == ["b0", "b1", "b2", "chat"]


def test_no_priority_is_set_without_priority_scheduling():
    async def run():
        engine, app = await _app(_spec(priority_scheduling=False))
        call = await _post(app, "bulk", _body("x"))
        return engine, call

    engine, call = asyncio.run(run())
    assert call.status == 200
    (request,) = engine.requests
    assert "priority" not in request.body.model_fields_set and request.body.priority == 0


def test_a_client_priority_is_still_refused_and_its_header_not_passed_on():
    async def run():
        engine, app = await _app(_spec())
        refused = await _post(app, "chat", _body("x", priority=-5))
        served = await _post(app, "bulk", _body("y"), **{"x-vllm-priority": "-100"})
        return engine, refused, served

    engine, refused, served = asyncio.run(run())
    assert refused.status == 400 and refused.json()["error"]["param"] == "priority"
    assert served.status == 200
    (request,) = engine.requests
    assert request.body.priority == BATCH_PRIORITY
    assert "x-vllm-priority" not in {k.lower() for k in request.headers}


# -- engine side ------------------------------------------------------------------------------
def test_engine_kwargs_select_vllm_priority_scheduling():
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs = engine_kwargs(ModelSpec(), "/models/x")
    assert kwargs["scheduling_policy"] == "priority"
    assert AsyncEngineArgs(**kwargs).scheduling_policy == "priority"  # a real vLLM field
    off = engine_kwargs(ModelSpec(priority_scheduling=False), "/models/x")
    assert "scheduling_policy" not in off
    with pytest.raises(ValidationError, match="priority_scheduling"):
        ModelSpec(engine_args={"scheduling_policy": "fcfs"})


@pytest.mark.parametrize("token_ids", [(), (7, 8)])
def test_a_continued_request_keeps_its_priority(token_ids):
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    )
    body.priority = BATCH_PRIORITY  # as the ingress sets it
    prompt_ids = (1, 2) if token_ids else ()
    cont = Continuation("He", 2, token_ids=token_ids, prompt_token_ids=prompt_ids)
    kind, continued = continuation_body(EngineRequest("r", "chat", body, continuation=cont))
    assert kind == ("completion" if token_ids else "chat")
    assert continued.priority == BATCH_PRIORITY
