"""Large request bodies decoded in the schema child process (api/body_check.py, issue 64
item 9): the lists past their limits are refused there, with the same 400 as in the
ingress; the parser sends bodies over INLINE_BODY_BYTES there, small ones stay inline."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from agentserve.admission.parsing import INLINE_BODY_BYTES, RequestParser
from agentserve.api.body_check import decode_checked, decoded_or_raise
from agentserve.api.errors import InvalidRequestError
from agentserve.api.limits import MAX_TOKEN_IDS
from agentserve.api.schema_check import SchemaProcess

PAD = "x" * INLINE_BODY_BYTES  # makes a body large


def _raw(**fields) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": PAD}], **fields}
    return json.dumps(body).encode()


class RecordingProcess:
    """A SchemaProcess stand-in: runs the child's function here and records it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def run(self, fn, args, local):
        self.calls.append((fn, args))
        return fn(*args)


def test_a_hostile_list_is_refused_where_it_is_decoded():
    status, (message, param, code) = decode_checked(_raw(stop_token_ids=[1] * 5000), True)
    assert (status, param, code) == ("error", "stop_token_ids", "too_many_items")
    assert str(MAX_TOKEN_IDS) in message
    with pytest.raises(InvalidRequestError) as err:
        decoded_or_raise(decode_checked(_raw(stop_token_ids=[1] * 5000), True))
    assert (err.value.param, err.value.code, err.value.status) == (
        "stop_token_ids",
        "too_many_items",
        400,
    )


def test_a_grammar_past_its_limit_is_refused_and_bad_json_named():
    grammar = decode_checked(_raw(structured_outputs={"grammar": "g" * 40_000}), True)
    assert grammar[0] == "error" and grammar[1][2] == "structured_output_too_large"
    status, (message, _, _) = decode_checked(b'{"model": ', True)
    assert status == "error" and "not valid JSON" in message


def test_a_body_to_translate_is_decoded_unchecked_and_a_good_body_comes_back():
    hostile = _raw(stop_token_ids=[1] * 5000)
    assert decode_checked(hostile, False) == ("ok", json.loads(hostile))
    good = _raw(stop=["end"])
    assert decoded_or_raise(decode_checked(good, True)) == json.loads(good)


def test_the_parser_decodes_large_bodies_through_the_child_and_small_ones_inline():
    parser = RequestParser({"m": 1024})
    parser.schemas = RecordingProcess()
    try:
        with pytest.raises(InvalidRequestError) as err:
            asyncio.run(parser.decode(_raw(logit_bias={str(i): 1 for i in range(400)}), None))
        assert err.value.code == "too_many_items"  # refused before any admission
        assert [fn for fn, _ in parser.schemas.calls] == [decode_checked]
        assert parser.schemas.calls[0][1][1] is True  # checked: nothing to translate
        small = json.dumps({"model": "m", "messages": []}).encode()
        assert asyncio.run(parser.decode(small, None)) == {"model": "m", "messages": []}
        assert len(parser.schemas.calls) == 1  # the small one stayed inline
        translated = asyncio.run(parser.decode(_raw(stop=["a"] * 9), lambda d: {"t": d["stop"]}))
        assert translated == {"t": ["a"] * 9}  # a body to translate is checked after it
        assert parser.schemas.calls[1][1][1] is False
    finally:
        parser.close()


def test_a_real_child_decodes_the_body():
    process = SchemaProcess()
    try:
        assert process.ready(120), "the child process did not come up"
        raw = _raw(stop=["end"])
        assert decoded_or_raise(process.run(decode_checked, (raw, True), lambda: None)) == (
            json.loads(raw)
        )
    finally:
        process.close()


def test_ready_answers_at_once_where_no_child_is_used(monkeypatch):
    monkeypatch.setenv("AGENTSERVE_SCHEMA_PROCESS", "0")
    start = time.monotonic()
    assert SchemaProcess().ready(30) is False
    assert time.monotonic() - start < 1


def test_schemas_past_their_size_are_refused_where_the_body_is_decoded():
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}
    status, (_, param, code) = decode_checked(_raw(structured_outputs={"json": big}), True)
    assert (status, param, code) == ("error", "structured_outputs.json", "schemas_too_large")
    tool = {"type": "function", "function": {"name": "f", "parameters": big}}
    status, (_, param, code) = decode_checked(_raw(tools=[tool]), True)
    assert (status, param, code) == ("error", "tools[0].function.parameters", "schemas_too_large")
    small = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert decode_checked(_raw(structured_outputs={"json": small}), True)[0] == "ok"


def test_a_schema_given_as_long_json_text_is_refused_before_it_is_decoded():
    text = json.dumps({"enum": ["v"] * 100_000})
    status, (_, param, code) = decode_checked(_raw(structured_outputs={"json": text}), True)
    assert (status, param, code) == (
        "error",
        "structured_outputs.json",
        "structured_output_too_large",
    )
