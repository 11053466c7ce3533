"""Issue 64 items 1-2: the lists an engine walks at every step and the structured-output
constraints a replica compiles are capped at the ingress (api/limits.py), with a 400 that
names the field and the limit; structured outputs are checked like schemas and on their
tenant's turns (admission/parsing.py)."""

from __future__ import annotations

import asyncio

import pytest
from agentserve.admission.parsing import RequestParser
from agentserve.api import limits
from agentserve.api.errors import InvalidRequestError
from agentserve.api.openai import parse_request
from agentserve.api.validate import SchemaCache, all_cached, has_schemas

BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
CONTEXT = {"m": 4096}


def _refused(**fields) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as err:
        parse_request("chat", {**BASE, **fields}, CONTEXT)
    return err.value


@pytest.mark.parametrize(
    ("fields", "param", "limit", "code"),
    [
        ({"stop": ["ab"] * 5}, "stop", limits.MAX_STOP, "too_many_items"),
        ({"stop": "x" * 257}, "stop[0]", limits.MAX_STOP_CHARS, "value_too_long"),
        ({"stop": ["a", "b" * 1000]}, "stop[1]", limits.MAX_STOP_CHARS, "value_too_long"),
        ({"bad_words": ["w"] * 33}, "bad_words", limits.MAX_BAD_WORDS, "too_many_items"),
        ({"bad_words": ["w" * 300]}, "bad_words[0]", limits.MAX_STOP_CHARS, "value_too_long"),
        ({"stop_token_ids": list(range(1025))}, "stop_token_ids", 1024, "too_many_items"),
        ({"allowed_token_ids": list(range(1025))}, "allowed_token_ids", 1024, "too_many_items"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", 300, "too_many_items"),
    ],
)
def test_a_list_past_its_limit_is_a_400_naming_the_field_and_the_limit(fields, param, limit, code):
    err = _refused(**fields)
    assert (err.status, err.param, err.code) == (400, param, code)
    assert f"at most {limit}" in err.message


def test_lists_at_their_limits_are_accepted():
    request = parse_request(
        "chat",
        {
            **BASE,
            "stop": ["s" * limits.MAX_STOP_CHARS] * limits.MAX_STOP,
            "bad_words": ["w"] * limits.MAX_BAD_WORDS,
            "stop_token_ids": list(range(limits.MAX_TOKEN_IDS)),
            "allowed_token_ids": list(range(limits.MAX_TOKEN_IDS)),
            "logit_bias": {str(i): 1 for i in range(limits.MAX_LOGIT_BIAS)},
        },
        CONTEXT,
    )
    assert len(request.stop) == limits.MAX_STOP and len(request.logit_bias) == 300


def test_a_completion_request_is_capped_too():
    with pytest.raises(InvalidRequestError) as err:
        parse_request("completion", {"model": "m", "prompt": "hi", "stop": ["a"] * 900}, CONTEXT)
    assert err.value.param == "stop"


def test_a_hostile_stop_list_is_refused_before_the_protocol_model_walks_it():
    """900k stop strings: refused by count, not after pydantic built 900k strings."""
    err = _refused(stop=["ab"] * 900_000)
    assert "900000 stop sequences" in err.message


@pytest.mark.parametrize(
    ("structured", "param"),
    [
        ({"grammar": 'root ::= "a"\n' * 3000}, "structured_outputs.grammar"),
        ({"regex": "a" * (limits.MAX_REGEX_CHARS + 1)}, "structured_outputs.regex"),
        ({"structural_tag": "{" + " " * limits.MAX_GRAMMAR_CHARS + "}"},
         "structured_outputs.structural_tag"),
        ({"json_object": True, "whitespace_pattern": "x" * 5000},
         "structured_outputs.whitespace_pattern"),
    ],
)  # fmt: skip
def test_an_oversized_structured_output_constraint_is_a_400(structured, param):
    err = _refused(structured_outputs=structured)
    assert (err.param, err.code) == (param, "structured_output_too_large")


def test_too_many_choice_options_are_a_400():
    err = _refused(structured_outputs={"choice": ["a"] * (limits.MAX_CHOICE_OPTIONS + 1)})
    assert (err.param, err.code) == ("structured_outputs.choice", "too_many_items")


def test_an_oversized_structural_tag_response_format_is_a_400():
    tag = {"begin": "<f>", "schema": {"type": "object", "description": "d" * 40_000}, "end": "</f>"}
    fmt = {"type": "structural_tag", "structures": [tag], "triggers": ["<f>"]}
    err = _refused(response_format=fmt)
    assert (err.param, err.code) == ("response_format", "structured_output_too_large")


def test_small_structured_outputs_are_accepted():
    for structured in (
        {"grammar": 'root ::= "yes" | "no"'},
        {"regex": "[a-z]+"},
        {"choice": ["yes", "no"]},
        {"json": {"type": "object"}},
        {"json": '{"type": "object"}'},
    ):
        request = parse_request("chat", {**BASE, "structured_outputs": structured}, CONTEXT)
        assert request.structured_outputs is not None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"structured_outputs": {"json": {"type": 5}}}, "structured_outputs.json"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ],
)
def test_structured_output_schemas_are_checked_like_tool_schemas(fields, param):
    err = _refused(**fields)
    assert err.param == param and "JSON Schema" in err.message


def test_a_structural_tag_with_a_bad_schema_is_a_400():
    tag = {"begin": "<f>", "schema": {"type": 5}, "end": "</f>"}
    err = _refused(response_format={"type": "structural_tag", "triggers": ["<f>"],
                                    "structures": [tag]})  # fmt: skip
    assert err.param.startswith("response_format")


def test_structured_output_schemas_count_toward_the_schema_size_cap():
    big = {"type": "object", "description": "d" * (300 * 1024)}
    err = _refused(structured_outputs={"json": big})
    assert (err.param, err.code) == ("structured_outputs.json", "schemas_too_large")


def test_structured_outputs_are_validated_on_the_tenants_turns():
    """Like schemas: heavy (admitted first, then checked on a worker's turn through the
    fair gate), never answered from the per-tenant cache on the loop."""
    data = {**BASE, "structured_outputs": {"grammar": 'root ::= "a"'}}
    assert has_schemas(data)
    assert not all_cached(data, SchemaCache())
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "x"}}
    assert has_schemas({**BASE, "response_format": tag})
    parser = RequestParser(CONTEXT)
    turns: list[str] = []
    acquire = parser.gate.acquire

    def counted(tenant, deadline=None):
        turns.append(tenant)
        return acquire(tenant, deadline)

    parser.gate.acquire = counted
    try:
        request = asyncio.run(parser.validate("chat", data, "t"))
    finally:
        parser.close()
    assert request.structured_outputs.grammar == 'root ::= "a"'
    assert turns == ["t"]
