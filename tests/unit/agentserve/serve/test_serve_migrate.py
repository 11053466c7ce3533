"""Mid-stream migration without Ray: a replica (fake engine) dies, the request continues on
another, and the client sees the undisturbed output (serve/migrate.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time

import pytest
from agentserve.engine.protocol import (
    Continuation,
    Delta,
    EngineDeadError,
    EngineRequest,
)
from agentserve.serve.ingress import create_app
from agentserve.serve.migrate import Progress, continuation_request, migrating
from agentserve.spec import DeploymentSpec
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest

LOCAL = "http://localhost"  # open mode answers only trusted Host names

WORDS = "one two three four five six seven eight nine ten eleven twelve"
MSG = [{"role": "user", "content": WORDS}]


class Pool:
    """Round-robin over fake engines; one that failed a request with EngineDeadError is
    skipped from then on, as Serve's router drops a replica whose actor died: the
    ModelBackend a multi-replica deployment looks like."""

    def __init__(self, *engines: FakeEngine):
        self.engines = engines
        self.dead: set[int] = set()
        self._next = itertools.cycle(range(len(engines)))

    def generate(self, request: EngineRequest):
        for _ in self.engines:
            i = next(self._next)
            if i not in self.dead:
                break
        return self._watch(i, self.engines[i].generate(request))

    async def _watch(self, i, stream):
        try:
            async for delta in stream:
                yield delta
        except EngineDeadError:
            self.dead.add(i)
            raise

    async def stats(self):
        return await self.engines[0].stats()

    async def health(self):
        await self.engines[0].health()

    async def ready_replicas(self):
        return len(self.engines) - len(self.dead)


def _engines(n=2, **kwargs):
    engines = [FakeEngine("m", 256, **kwargs) for _ in range(n)]
    for e in engines:
        asyncio.run(e.start())
    return engines


def _chat(max_tokens=None, **extra):
    body = {"model": "m", "messages": MSG, **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return EngineRequest("r1", "chat", ChatCompletionRequest.model_validate(body))


def _completion(prompt=WORDS, **extra):
    body = CompletionRequest.model_validate({"model": "m", "prompt": prompt, **extra})
    return EngineRequest("r2", "completion", body)


async def _collect(stream) -> list[Delta]:
    return [d async for d in stream]


def _summary(deltas: list[Delta]) -> tuple[str, int, int, str | None]:
    last = deltas[-1]
    text = "".join(d.text for d in deltas)
    return text, last.prompt_tokens, last.completion_tokens, last.finish_reason


def _undisturbed(request: EngineRequest, **kwargs) -> tuple[str, int, int, str | None]:
    (engine,) = _engines(1, **kwargs)
    return _summary(asyncio.run(_collect(engine.generate(request))))


# -- the fake engine as an autoregressive model ---------------------------------------


def test_fake_continues_from_a_true_prefix_and_diverges_from_a_wrong_one():
    full, _, _, _ = _undisturbed(_chat(max_tokens=10))
    assert full == "echo: one two three four five six seven eight nine"
    (engine,) = _engines(1)
    sent = "echo: one two three"
    cont = continuation_request(_chat(max_tokens=10), _progress(sent, 4), 1)
    rest = _summary(asyncio.run(_collect(engine.generate(cont))))
    assert sent + rest[0] == full and rest[2] == 6 and rest[3] == "length"
    wrong = continuation_request(_chat(max_tokens=10), _progress("echo: one three", 3), 1)
    other = _summary(asyncio.run(_collect(engine.generate(wrong))))[0]
    assert "echo: one three" + other != full  # a mangled prefix shows in the output


def _progress(text: str, tokens: int, prompt_tokens: int = 13) -> Progress:
    return Progress(prompt_tokens=prompt_tokens, completion_tokens=tokens, text=text)


def test_fake_faults_crash_and_stuck():
    crash, stuck = _engines(2)
    crash.inject("crash", after_tokens=4)
    with pytest.raises(EngineDeadError):
        asyncio.run(_collect(crash.generate(_chat())))
    with pytest.raises(EngineDeadError):
        asyncio.run(crash.health())
    stuck.inject("stuck")
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(stuck.health(), 0.05))
    (prompted,) = _engines(1, fault_prompts=True)
    stream = prompted.generate(_completion("FAULT crash a b c d e f g"))
    with pytest.raises(EngineDeadError):  # after FAULT_AFTER_TOKENS tokens
        asyncio.run(_collect(stream))
    assert prompted.fault == "crash"


# -- migrating ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        _chat(),
        _chat(max_tokens=9),
        _chat(max_tokens=11, stop=["eight"]),
        _completion(max_tokens=7),
        _completion(min_tokens=3),
    ],
    ids=["chat-default", "chat-max", "chat-stop", "completion-max", "completion-min"],
)
@pytest.mark.parametrize("after_tokens", [0, 1, 2, 5])
def test_migrated_output_equals_undisturbed(request_, after_tokens):
    expected = _undisturbed(request_, accept_per_step=1)
    a, b = _engines(2, accept_per_step=1)  # a dies after exactly `after_tokens` tokens
    a.inject("crash", after_tokens=after_tokens)
    seen: list[int] = []
    deltas = asyncio.run(_collect(migrating(Pool(a, b).generate, request_, 2, seen.append)))
    assert _summary(deltas) == expected
    assert seen == [1]
    counts = [d.completion_tokens for d in deltas]
    assert counts == sorted(counts), "cumulative counts never go back"
    assert [r.request_id for r in b.requests] == [f"{request_.request_id}-m1"]
    if after_tokens:  # something was delivered: b got a continuation with less budget
        assert b.requests[0].continuation.completion_tokens == after_tokens


def test_the_continuation_sent_after_a_death_carries_its_own_send_time():
    from agentserve.serve.spans import SENT_AT_HEADER

    request_ = dataclasses.replace(_chat(max_tokens=9), headers={SENT_AT_HEADER: "1000"})
    a, b = _engines(2, accept_per_step=1)
    a.inject("crash", after_tokens=3)
    before = time.time_ns()
    asyncio.run(_collect(migrating(Pool(a, b).generate, request_, 2)))
    (continued,) = b.requests
    assert continued.continuation is not None
    assert int(continued.headers[SENT_AT_HEADER]) >= before  # not the first send's 1000


def test_migrations_are_bounded():
    engines = _engines(3)
    for e in engines:
        e.inject("crash", after_tokens=2)
    seen: list[int] = []
    stream = migrating(
        Pool(*engines).generate, _chat(max_tokens=11), 2, seen.append, poison_deaths=None
    )
    delivered: list[Delta] = []

    async def run():
        async for d in stream:
            delivered.append(d)

    with pytest.raises(EngineDeadError):
        asyncio.run(run())
    assert seen == [1, 2] and delivered[-1].completion_tokens == 6


def test_a_tool_request_is_not_continued_after_output_but_reissued_before():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    request_ = _chat(tools=tools, tool_choice="required")
    a, b = _engines(2)
    a.inject("crash", after_tokens=1)
    with pytest.raises(EngineDeadError):
        asyncio.run(_collect(migrating(Pool(a, b).generate, request_, 2)))
    a, b = _engines(2)
    a.inject("crash", after_tokens=0)
    deltas = asyncio.run(_collect(migrating(Pool(a, b).generate, request_, 2)))
    assert deltas[-1].finish_reason == "tool_calls" and b.requests[0].continuation is None


def test_token_ids_travel_and_counts_are_rewritten():
    """An engine that reports token ids: the continuation carries the prompt's and the
    delivered ids; the continuation's own counts become the request's."""
    sent: list[EngineRequest] = []

    async def first(request):
        sent.append(request)
        yield Delta("a", 5, 1, token_ids=(11,), prompt_token_ids=(1, 2, 3, 4, 5))
        yield Delta(" b", 5, 2, token_ids=(12,))
        raise EngineDeadError("gone")

    async def second(request):
        sent.append(request)
        yield Delta(" c", 7, 1, token_ids=(13,), prompt_token_ids=(1, 2, 3, 4, 5, 11, 12))
        yield Delta("", 7, 2, "length", token_ids=(14,))

    backends = iter([first, second])
    stream = migrating(lambda r: next(backends)(r), _chat(max_tokens=4), 2)
    deltas = asyncio.run(_collect(stream))
    assert [(d.text, d.prompt_tokens, d.completion_tokens) for d in deltas] == [
        ("a", 5, 1),
        (" b", 5, 2),
        (" c", 5, 3),
        ("", 5, 4),
    ]
    cont = sent[1].continuation
    assert cont == Continuation("a b", 2, token_ids=(11, 12), prompt_token_ids=(1, 2, 3, 4, 5))
    assert sent[1].body.max_tokens == 2 and sent[1].request_id == "r1-m1"


def test_missing_finish_after_the_whole_budget_is_synthesized():
    async def dies_at_the_end(request):
        yield Delta("a b", 5, 2)
        raise EngineDeadError("gone")

    deltas = asyncio.run(_collect(migrating(dies_at_the_end, _chat(max_tokens=2), 2)))
    assert _summary(deltas) == ("a b", 5, 2, "length")


# -- through the ingress --------------------------------------------------------------


def _client(*engines, max_migrations=2):
    spec = DeploymentSpec.model_validate(
        {
            "models": [{"name": "m", "engine": "fake", "max_model_len": 256}],
            "server": {"max_migrations": max_migrations},
        }
    )
    app = create_app(spec, {"m": Pool(*engines)})
    return TestClient(
        app, base_url=LOCAL, client=("127.0.0.1", 50000)
    )  # loopback: /metrics answers


def _events(text):
    lines = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    return [json.loads(x) for x in lines if x != "[DONE]"], lines[-1] == "[DONE]"


def test_client_sees_one_complete_stream_with_one_id_and_undisturbed_usage():
    body = {
        "model": "m",
        "messages": MSG,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 10,
    }
    (solo,) = _engines(1)
    undisturbed, done = _events(_client(solo).post("/v1/chat/completions", json=body).text)
    a, b = _engines(2, token_delay_s=0.001)
    a.inject("crash", after_tokens=4)
    client = _client(a, b)
    events, done = _events(client.post("/v1/chat/completions", json=body).text)
    assert done and "error" not in json.dumps(events)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    expected = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in undisturbed if e["choices"]
    )
    assert text == expected == "echo: one two three four five six seven eight nine"
    assert len({e["id"] for e in events}) == 1
    assert events[-1]["usage"] == undisturbed[-1]["usage"]
    assert 'agentserve_migrations_total{model="m"} 1.0' in client.get("/metrics").text


def test_non_stream_request_migrates_too():
    a, b = _engines(2)
    a.inject("crash", after_tokens=2)
    r = _client(a, b).post("/v1/completions", json={"model": "m", "prompt": WORDS})
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == "echo: " + WORDS
    assert r.json()["usage"]["completion_tokens"] == 13


def test_without_migrations_the_stream_ends_with_an_error_event():
    a, b = _engines(2)
    a.inject("crash", after_tokens=2)
    body = {"model": "m", "messages": MSG, "stream": True}
    events, done = _events(
        _client(a, b, max_migrations=0).post("/v1/chat/completions", json=body).text
    )
    assert not done and events[-1]["error"]["code"] == "overloaded"


def test_a_replica_whose_engine_dies_exits_so_serve_replaces_it(monkeypatch):
    from agentserve.serve import replica as replica_module
    from agentserve_bench.fake_engine import FakeEngineFactory

    exits: list[bool] = []
    monkeypatch.setattr(replica_module, "_kill_this_actor", lambda: exits.append(True))
    monkeypatch.setattr(replica_module, "EXIT_DELAY_S", 0.0)
    model = DeploymentSpec.model_validate({"models": [{"name": "m", "engine": "fake"}]}).models[0]

    async def run():
        replica = replica_module.ModelReplica.__new__(replica_module.ModelReplica)
        await replica.__init__(model, FakeEngineFactory())
        replica.engine.inject("crash", after_tokens=2)
        with pytest.raises(EngineDeadError):
            async for _ in replica.generate(_chat()):
                pass
        await asyncio.sleep(0.01)
        await replica.__del__()

    asyncio.run(run())
    assert exits == [True]


def test_a_stuck_engine_fails_health_checks_in_time_and_the_watchdog_exits(monkeypatch):
    from agentserve.engine.protocol import EngineUnavailableError
    from agentserve.serve import replica as replica_module
    from agentserve_bench.fake_engine import FakeEngineFactory

    exits: list[bool] = []
    monkeypatch.setattr(replica_module, "_kill_this_actor", lambda: exits.append(True))
    monkeypatch.setattr(replica_module, "EXIT_DELAY_S", 0.0)
    replicas = {"health_check_timeout_s": 0.05, "health_check_period_s": 0.02}
    spec = {"models": [{"name": "m", "engine": "fake", "replicas": replicas}]}
    model = DeploymentSpec.model_validate(spec).models[0]

    async def run():
        replica = replica_module.ModelReplica.__new__(replica_module.ModelReplica)
        await replica.__init__(model, FakeEngineFactory())
        await replica.check_health()  # healthy: passes
        await asyncio.sleep(0.1)
        assert not exits and replica.health_failures == 0
        replica.engine.inject("stuck")
        with pytest.raises(EngineUnavailableError):
            await replica.check_health()  # answers within 0.04 s instead of hanging
        for _ in range(100):  # the watchdog probes on its own, Serve checking or not
            if exits:
                break
            await asyncio.sleep(0.01)
        assert replica.health_failures == replica_module.HEALTH_FAILURES_TO_EXIT
        await replica.__del__()

    asyncio.run(run())
    assert exits == [True]


def test_a_continuation_is_timed_from_its_own_send_a_retry_from_the_first():
    """A continuation's first delta is not the client's first token: its queue-wait span
    and TTFT sample run from its own send, not from the original one (which counted the
    dead replica's stream as queueing). A request with nothing delivered keeps the first
    send: its client still waits for a first token."""
    from agentserve.serve.spans import SENT_AT_HEADER

    original = dataclasses.replace(_chat(max_tokens=10), headers={SENT_AT_HEADER: "1000"})
    cont = continuation_request(original, _progress("echo: one", 2), 1, sent_at_ns=5000)
    assert cont.headers[SENT_AT_HEADER] == "5000" and original.headers[SENT_AT_HEADER] == "1000"
    retry = continuation_request(original, _progress("", 0), 1, sent_at_ns=5000)
    assert retry.headers[SENT_AT_HEADER] == "1000"
