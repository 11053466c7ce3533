"""Issue 64 item 5: replica deaths are counted per request (its choices share one count,
a replica counts once), and a victim that died beside a poison request is retried on
probation instead of being refused for ten minutes (serve/poison.py)."""

from __future__ import annotations

import pytest
from agentserve.engine.protocol import EngineDeadError
from agentserve.serve.poison import (
    POISON_DEATHS,
    PROBATION_DEATHS,
    Deaths,
    PoisonList,
    PoisonRequestError,
)
from test_serve_migrate import MSG, _chat
from test_serve_poison import _client, _crashing


def test_choices_on_one_replica_count_its_death_once():
    deaths = Deaths()
    assert deaths.add(EngineDeadError("x", replica="r1")) == 1
    assert deaths.add(EngineDeadError("x", replica="r1")) == 1  # another choice, same replica
    assert deaths.add(EngineDeadError("x", replica="r2")) == 2
    assert deaths.add(EngineDeadError("no id")) == 3  # unknown replica: a death of its own


def test_a_batch_of_choices_shares_one_death_count_and_kills_one_wave_at_most():
    """n=2 on four crashing replicas: each choice counted its own deaths before, so each
    was replayed once (four replicas hit); one count per request stops at the second."""
    engines = _crashing(4)
    client = _client(*engines)
    body = {"model": "m", "messages": MSG, "max_tokens": 8, "n": 2}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "request_crashed_engine"
    dead = client.app.state.ingress.backends["m"].dead  # the Pool's dead replicas
    assert len(dead) == 2, f"{len(dead)} replicas died"


def _die(book: PoisonList, tenant: str, body, *replicas: str) -> Deaths:
    deaths = book.deaths(tenant, "chat", body)
    for replica in replicas:
        deaths.add(EngineDeadError("died", replica=replica))
    return deaths


def test_a_victim_that_died_beside_another_request_is_retried_on_probation():
    book = PoisonList()
    victim, cause = _chat(max_tokens=3).body, _chat(max_tokens=4).body
    for tenant, body in (("v", victim), ("c", cause)):
        book.add(tenant, "chat", body, _die(book, tenant, body, "r1", "r2"))
    assert book.check("v", "chat", victim) == PROBATION_DEATHS  # not refused
    assert book.check("c", "chat", cause) == PROBATION_DEATHS  # which one? both may retry
    assert book.check("v", "chat", _chat(max_tokens=5).body) == POISON_DEATHS


def test_a_request_that_died_alone_or_failed_its_probation_is_refused():
    book = PoisonList()
    alone, other = _chat(max_tokens=3).body, _chat(max_tokens=4).body
    _die(book, "o", other, "r1")  # another request died on one of its replicas only
    book.add("t", "chat", alone, _die(book, "t", alone, "r1", "r2"))
    with pytest.raises(PoisonRequestError):
        book.check("t", "chat", alone)
    shared = _chat(max_tokens=6).body
    for tenant in ("t", "u"):
        deaths = _die(book, tenant, shared, "r7", "r8")
    book.add("t", "chat", shared, deaths, confirmed=True)  # its probation retry died too
    with pytest.raises(PoisonRequestError):
        book.check("t", "chat", shared)
