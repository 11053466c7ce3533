"""Issue 30 item 10: validating a huge message array is bounded. The protocol model's one
long call (it holds the GIL) gets at most MAX_MESSAGES messages and MAX_CONTENT_PARTS
parts, and the deadline is checked inside parse_request: between its stages and during
the walk of the values, not only before schemas."""

from __future__ import annotations

import time

import pytest
from agentserve.api.errors import InvalidRequestError
from agentserve.api.openai import parse_request
from agentserve.api.validate import (
    CHECK_EVERY,
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    ValidationTimeoutError,
    check_values,
)

MSG = {"role": "user", "content": "hi"}


def test_too_many_messages_is_a_400_before_the_protocol_model():
    data = {"model": "m", "messages": [MSG] * (MAX_MESSAGES + 1)}
    started = time.perf_counter()
    with pytest.raises(InvalidRequestError) as err:
        parse_request("chat", data)
    assert err.value.code == "too_many_messages" and err.value.param == "messages"
    assert time.perf_counter() - started < 0.5
    assert parse_request("chat", {"model": "m", "messages": [MSG] * MAX_MESSAGES}).messages


def test_too_many_content_parts_names_the_message_where_the_cap_passed():
    parts = [{"type": "text", "text": ""}] * (MAX_CONTENT_PARTS // 2)
    data = {"model": "m", "messages": [{"role": "user", "content": parts}] * 3}
    with pytest.raises(InvalidRequestError) as err:
        parse_request("chat", data)
    assert err.value.code == "too_many_content_parts"
    assert err.value.param == "messages[2].content"


def test_the_deadline_is_checked_inside_parse_request_without_schemas():
    data = {"model": "m", "messages": [MSG] * 100}  # no tools: the old check never ran
    with pytest.raises(ValidationTimeoutError):
        parse_request("chat", data, deadline=time.monotonic() - 1)
    assert parse_request("chat", data, deadline=time.monotonic() + 30).messages


def test_the_walk_of_the_values_calls_the_checkpoint_as_it_goes():
    calls = []
    data = {"model": "m", "messages": [{"role": "user", "content": "x" * 3}] * 3000}

    def checkpoint() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise ValidationTimeoutError()

    with pytest.raises(ValidationTimeoutError):
        check_values(data, checkpoint)  # ~9,000 values: stops at the second checkpoint
    assert len(calls) == 2 and 9000 // CHECK_EVERY >= 2
