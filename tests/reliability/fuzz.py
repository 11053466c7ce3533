"""The input_fuzz scenario: hypothesis-generated request bodies (valid, boundary and junk
values field by field; NaN, unpaired surrogates, bad schemas, raw bytes) against the real
ingress over the fake engine. Every answer must be a well-formed OpenAI response or error:
0 5xx, nothing lost, no engine restart, no leaked in-flight count."""

from __future__ import annotations

import json
from typing import Any

from tests.reliability.hostile_input import MODEL, check_answer, engine_down, fuzz_client
from tests.reliability.scenario import Outcome, scenario

__all__ = ["FUZZ_EXAMPLES", "FUZZ_SEED", "forget_leaks", "fuzz"]

FUZZ_EXAMPLES = 1000
FUZZ_SEED = 20261123


def _strategies() -> dict[str, Any]:
    """Hypothesis strategies: any JSON, and chat/completion bodies that mix valid values,
    boundary values and junk field by field (so many requests get past the parser)."""
    from hypothesis import strategies as st

    surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3)
    text = st.text(max_size=24) | surrogates | st.sampled_from(["", " ", "\x00", "m", "\n"])
    number = (
        st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.sampled_from([0, 1, -1, 2, 63, 64, 2**31, 2**63, 0.0, -0.0, 1e308])
    )
    leaf = st.none() | st.booleans() | number | text
    any_json = st.recursive(
        leaf,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
        max_leaves=12,
    )

    def maybe(strategy: Any) -> Any:
        return strategy | any_json

    role = st.sampled_from(["user", "system", "assistant", "developer", "tool", "hacker"])
    part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": text})
    message = st.fixed_dictionaries(
        {"role": maybe(role)},
        optional={"content": maybe(text | st.lists(part, max_size=2)), "name": text},
    )
    schema = maybe(
        st.fixed_dictionaries(
            {"type": maybe(st.sampled_from(["object", "string", "nonsense"]))},
            optional={
                "properties": st.dictionaries(
                    text, st.fixed_dictionaries({"type": st.sampled_from(["string", "integer"])})
                ),
                "required": maybe(st.lists(text, max_size=2)),
            },
        )
    )
    name = st.sampled_from(["lookup", "get_weather", "a.b", "bad name", ""]) | text
    tool = st.fixed_dictionaries(
        {"type": maybe(st.just("function"))},
        optional={
            "function": maybe(
                st.fixed_dictionaries(
                    {"name": name}, optional={"parameters": schema, "description": text}
                )
            )
        },
    )
    tool_choice = maybe(
        st.sampled_from(["none", "auto", "required", "sometimes"])
        | st.fixed_dictionaries(
            {"type": st.just("function"), "function": st.fixed_dictionaries({"name": name})}
        )
    )
    response_format = maybe(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "json_object", "json_schema", "yaml"])},
            optional={"json_schema": st.fixed_dictionaries({"name": text, "schema": schema})},
        )
    )
    small_int = st.integers(-3, 100) | st.sampled_from([2**31, 2**63, 2**64])
    sampling = {
        "max_tokens": maybe(small_int),
        "temperature": maybe(number),
        "top_p": maybe(number),
        "top_k": maybe(small_int),
        "min_p": maybe(number),
        "frequency_penalty": maybe(number),
        "presence_penalty": maybe(number),
        "repetition_penalty": maybe(number),
        "seed": maybe(number),
        "n": maybe(small_int),
        "stop": maybe(text | st.lists(text, max_size=6)),
        "stream": maybe(st.booleans()),
        "stream_options": maybe(st.fixed_dictionaries({"include_usage": st.booleans()})),
        "logit_bias": maybe(st.dictionaries(st.sampled_from(["1", "42", "x"]), number)),
        "user": text,
    }
    model = maybe(st.sampled_from([MODEL, MODEL, MODEL, "nope", ""]))
    chat = st.fixed_dictionaries(
        {"model": model, "messages": maybe(st.lists(message, min_size=1, max_size=3))},
        optional={
            **sampling,
            "max_completion_tokens": maybe(small_int),
            "logprobs": maybe(st.booleans()),
            "top_logprobs": maybe(small_int),
            "tools": maybe(st.lists(tool, max_size=2)),
            "tool_choice": tool_choice,
            "parallel_tool_calls": maybe(st.booleans()),
            "response_format": response_format,
        },
    )
    prompt = maybe(text | st.lists(st.integers(-1, 70_000), max_size=90) | st.lists(text))
    completion = st.fixed_dictionaries(
        {"model": model, "prompt": prompt},
        optional={**sampling, "echo": maybe(st.booleans()), "logprobs": maybe(small_int)},
    )
    garbage = st.binary(max_size=64) | any_json.map(lambda v: json.dumps(v).encode())
    return {"chat": chat, "completion": completion, "garbage": garbage, "json": any_json}


_ROUTES = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


def fuzz(examples: int = FUZZ_EXAMPLES, seed: int = FUZZ_SEED) -> Outcome:
    """Run `examples` hypothesis-generated requests; see the module docstring."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed
    from hypothesis import strategies as st

    client, engine = fuzz_client()
    ingress = client.app.state.ingress
    s = _strategies()
    request = st.one_of(
        st.tuples(st.just("chat"), s["chat"]),
        st.tuples(st.just("completion"), s["completion"]),
        st.tuples(st.sampled_from(["chat", "completion"]), s["garbage"]),
        st.tuples(st.just("models"), st.dictionaries(st.sampled_from(["limit", "x"]), s["json"])),
    )
    stats: dict[str, Any] = {"by_route": {}, "by_status": {}, "failures": [], "leaked": 0}
    counts = {"requests": 0, "lost": 0, "5xx": 0, "restarts": 0}

    @fixed_seed(seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(request)
    def one(req: tuple[str, Any]) -> None:
        route, body = req
        if route == "models":
            r = client.get("/v1/models", params={k: json.dumps(v) for k, v in body.items()})
            stream = False
        else:
            raw = body if isinstance(body, bytes) else _dumps(body)
            r = client.post(_ROUTES[route], content=raw)
            stream = isinstance(body, dict) and body.get("stream") is True
        counts["requests"] += 1
        counts["5xx"] += r.status_code >= 500
        stats["by_route"][route] = stats["by_route"].get(route, 0) + 1
        stats["by_status"][str(r.status_code)] = stats["by_status"].get(str(r.status_code), 0) + 1
        problem = check_answer(r, stream)
        if problem is not None:
            counts["lost"] += 1
            if len(stats["failures"]) < 10:
                stats["failures"].append({"route": route, "body": repr(body)[:300], "why": problem})
        counts["restarts"] += engine_down(engine)
        if any(ingress.admit_stage.shares.in_flight.values()):
            stats["leaked"] += 1
            forget_leaks(ingress)

    one()
    stats["seed"] = seed
    return Outcome(counts["requests"], counts["lost"], counts["5xx"], counts["restarts"], stats)


def forget_leaks(ingress: Any) -> None:
    """Zero the ingress's places in flight in place, so a later leak is counted again:
    a new dict in place of QueueShares.in_flight would hide every later leak from a
    reference taken before."""
    shares = ingress.admit_stage.shares
    for model in shares.in_flight:
        shares.in_flight[model] = 0
        shares._mine[model].clear()


def _dumps(body: Any) -> bytes:
    """JSON with NaN/Infinity literals kept and unpaired surrogates escaped (both are what
    a hostile client can send)."""
    return json.dumps(body, allow_nan=True).encode()


@scenario("input_fuzz")
def fuzz_scenario() -> Outcome:
    """1,000 hypothesis-generated requests (chat, completions, models; valid, boundary and
    junk values; NaN, surrogates, bad schemas, raw bytes): 0 5xx, only OpenAI errors."""
    return fuzz()
