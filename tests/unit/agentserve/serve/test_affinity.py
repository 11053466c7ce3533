"""Session and prefix affinity decisions (serve/affinity.py): keys, ranking, key homes."""

from __future__ import annotations

import pytest
from agentserve.api.ask import Ask
from agentserve.api.prompts import split_prompts
from agentserve.serve.affinity import (
    KeyHomes,
    affinity_key,
    affinity_prefix_chars,
    leading_prompt,
    route,
)
from agentserve.spec import spec_from_dict

SYSTEM = {"role": "system", "content": "You are a coding agent with tools."}
FIRST = {"role": "user", "content": "Fix the failing test in repo A."}


def chat(*messages):
    return Ask("chat", "m", messages=messages)


def completion(prompt):
    return Ask("completion", "m", prompts=tuple(split_prompts(prompt)))


def key(headers=None, ask=None, tenant="t", model="m", chars=2048):
    return affinity_key(tenant, model, headers or {}, ask or chat(SYSTEM, FIRST), chars)


# -- route: (home, loads, max_imbalance) -> (first choice, reason) ------------------------
@pytest.mark.parametrize(
    ("home", "loads", "bound", "first", "reason"),
    [
        ("a", {"a": 3, "b": 0}, 4, "a", "home"),  # within the bound: stay
        ("a", {"a": 4, "b": 0}, 4, "a", "home"),  # at the bound: stay
        ("a", {"a": 5, "b": 0}, 4, "b", "overloaded"),  # past it: least loaded
        ("a", {"a": 1, "b": 0}, 0, "b", "overloaded"),  # bound 0: always the least loaded
        ("a", {"a": 1, "b": 1}, 0, "a", "home"),  # ... and a tie keeps the home
        ("a", {"b": 2, "c": 1}, 4, "c", "gone"),  # its replica died: least loaded
        (None, {"a": 2, "b": 1}, 4, "b", "new"),  # a new key: least loaded
        ("a", {"a": None, "b": 3}, 0, "a", "home"),  # unknown load counts as 0
        ("a", {"a": 1}, 0, "a", "home"),  # one replica
    ],
)
def test_route_table(home, loads, bound, first, reason):
    chosen = route("k", home, loads, bound)
    assert (chosen.order[0], chosen.reason) == (first, reason)
    assert sorted(chosen.order) == sorted(loads)  # every replica ranked once


def test_route_ranks_the_rest_by_load():
    assert route("k", "a", {"a": 0, "b": 5, "c": 2, "d": 9}, 4).order == ("a", "c", "b", "d")


def test_route_without_replicas_is_empty():
    assert route("k", "a", {}, 4).order == ()


def test_new_keys_spread_over_equally_loaded_replicas_and_agree():
    loads = {f"r{i}": 0 for i in range(4)}
    firsts = [route(f"key-{n}", None, loads, 4).order[0] for n in range(200)]
    assert set(firsts) == set(loads)  # rendezvous hashing uses every replica
    assert max(firsts.count(r) for r in loads) < 80  # and none takes most keys
    # the same key and loads: the same choice (two ingress replicas agree)
    assert route("key-7", None, loads, 4) == route("key-7", None, dict(loads), 4)


# -- keys ---------------------------------------------------------------------------------
def test_a_conversation_keeps_its_key_turn_after_turn():
    turn_1 = chat(SYSTEM, FIRST)
    turn_3 = chat(
        SYSTEM,
        FIRST,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "content": "3 failed", "tool_call_id": "c1"},
        {"role": "assistant", "content": "Fixed."},
        {"role": "user", "content": "Now run the linter."},
    )
    assert key(ask=turn_1) == key(ask=turn_3)


def test_different_conversations_and_tenants_and_models_get_different_keys():
    other = chat(SYSTEM, {"role": "user", "content": "Fix the failing test in repo B."})
    assert key(ask=other) != key()
    assert key(tenant="u") != key()
    assert key(model="n") != key()


def test_session_header_wins_over_the_prompt():
    a = key({"X-Session-Id": "conv-1"}, chat(SYSTEM, FIRST))
    b = key({"x-session-id": "conv-1"}, chat({"role": "user", "content": "other"}))
    assert a == b
    assert key({"x-session-id": "conv-2"}) != a
    assert key({"x-session-id": "  "}) == key()  # blank: the prompt decides


def test_completion_prompts_single_batched_and_token_ids():
    single = completion("def add(a, b):")
    batch = completion(["def add(a, b):", "def sub(a, b):"])
    tokens = completion([1, 2, 3])
    assert key(ask=single) == key(ask=batch)
    assert leading_prompt(tokens, 100) == "[1,2,3]"
    assert leading_prompt(completion(None), 100) is None
    assert key(ask=completion("")) is None


def test_each_leading_message_is_cut_at_prefix_chars():
    long = chat({"role": "system", "content": "x" * 5000}, FIRST)
    assert len(leading_prompt(long, 100)) < 250
    # a long shared system prompt: the first user message still tells conversations apart
    other = chat({"role": "system", "content": "x" * 5000}, {"role": "user", "content": "B"})
    assert key(ask=long, chars=100) != key(ask=other, chars=100)
    # ... and past the cut, messages that differ count as the same
    longer = chat({"role": "system", "content": "x" * 5000 + "y"}, FIRST)
    assert key(ask=long, chars=100) == key(ask=longer, chars=100)
    assert len(leading_prompt(completion("z" * 500), 100)) == 100


def test_content_parts_count_as_text():
    parts = chat({"role": "user", "content": [{"type": "text", "text": "hi"}]})
    assert "hi" in leading_prompt(parts, 100)


# -- homes --------------------------------------------------------------------------------
def test_key_homes_are_bounded_and_forget_a_dead_replica():
    homes = KeyHomes(capacity=2)
    homes.set("k1", "a")
    homes.set("k2", "b")
    homes.set("k1", "a")  # k1 used again: k2 is now the oldest
    homes.set("k3", "a")
    assert (homes.get("k1"), homes.get("k2"), homes.get("k3")) == ("a", None, "a")
    assert homes.forget_replica("a") == 2
    assert len(homes) == 0


def test_affinity_models_follow_the_spec_switch():
    spec = spec_from_dict(
        {
            "models": [
                {"name": "on", "replicas": {"min_replicas": 1, "max_replicas": 2}},
                {
                    "name": "off",
                    "replicas": {"min_replicas": 1, "max_replicas": 2},
                    "routing": {"affinity": False},
                },
                {"name": "single", "replicas": {"min_replicas": 1, "max_replicas": 1}},
            ]
        }
    )
    assert affinity_prefix_chars(spec) == {"on": 2048}
