"""Delta's output facts: the one definition TTFT (ingress, replica statistics, replica
spans) and migration (what was passed on) share."""

from __future__ import annotations

import pytest
from agentserve.admission.shares import AdmittedCall
from agentserve.engine.protocol import Delta
from agentserve.serve.migrate import Progress

TOOL = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize(
    ("delta", "output", "visible"),
    [
        (Delta(), False, False),
        (Delta(prompt_tokens=7, completion_tokens=2), False, False),  # usage only
        (Delta("hi"), True, True),
        (Delta(tool_calls=(TOOL,)), True, True),
        (Delta(reasoning="think"), True, True),
        (Delta(finish_reason="stop"), False, True),  # an empty answer's finish
    ],
)
def test_carries_output_and_visible(delta, output, visible):
    assert delta.carries_output is output
    assert delta.visible is visible


def test_ingress_ttft_and_migration_count_a_reasoning_delta_alike():
    call = AdmittedCall("m", "t", 0.0, None)
    call.see(Delta(prompt_tokens=3), 1.0)
    assert call.first is None
    call.see(Delta(reasoning="r", prompt_tokens=3, completion_tokens=1), 2.0)
    assert call.first == 2.0
    progress = Progress()
    progress.record(Delta(reasoning="r", prompt_tokens=3))
    assert progress.delivered  # no restart from scratch once reasoning reached the client
