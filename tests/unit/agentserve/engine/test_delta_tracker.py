"""DeltaTracker (engine/delta_tracker.py): the one bookkeeping of a delta stream that the
ingress, migration, replica spans and replica statistics share."""

from __future__ import annotations

import pytest
from agentserve.admission.shares import AdmittedCall
from agentserve.engine.delta_tracker import DeltaTracker
from agentserve.engine.protocol import Delta
from agentserve.serve.migrate import Progress
from agentserve.serve.replica_stats import _Open

TOOL = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f"}}


def _fed(*timed: tuple[Delta, float]) -> tuple[DeltaTracker, list[bool]]:
    tracker = DeltaTracker()
    return tracker, [tracker.see(delta, now) for delta, now in timed]


def test_a_stream_records_first_output_counts_steps_and_finish():
    tracker, firsts = _fed(
        (Delta(prompt_tokens=5), 1.0),  # usage only: no output yet
        (Delta("a", 5, 1), 2.0),
        (Delta("bcd", 5, 4), 3.0),  # one speculative step, three tokens
        (Delta("", 5, 4), 3.5),  # held-back text: no new tokens, no step
        (Delta("e", 5, 5, finish_reason="stop"), 4.0),
    )
    assert firsts == [False, True, False, False, False]
    assert (tracker.first, tracker.last) == (2.0, 4.0)
    assert (tracker.prompt_tokens, tracker.completion_tokens, tracker.steps) == (5, 5, 3)
    assert tracker.finish_reason == "stop"
    assert tracker.ttft(0.5) == 1.5 and tracker.decode_time() == 2.0


@pytest.mark.parametrize(
    "delta",
    [Delta("x"), Delta(tool_calls=(TOOL,)), Delta(reasoning="r"), Delta(finish_reason="stop")],
)
def test_any_visible_delta_is_the_first_output(delta):
    tracker, firsts = _fed((Delta(prompt_tokens=3, completion_tokens=1), 1.0), (delta, 2.0))
    assert firsts == [False, True] and tracker.first == 2.0


def test_counts_never_go_down_and_a_finish_reason_stays():
    tracker, _ = _fed((Delta("a", 7, 3, finish_reason="length"), 1.0), (Delta("", 2, 1), 2.0))
    assert (tracker.prompt_tokens, tracker.completion_tokens, tracker.steps) == (7, 3, 1)
    assert tracker.finish_reason == "length"


def test_without_output_there_is_no_ttft_nor_decode_time():
    tracker, firsts = _fed((Delta(prompt_tokens=4), 1.0))
    assert firsts == [False] and tracker.ttft(0.0) is None and tracker.decode_time() is None
    assert tracker.last == 1.0


def test_tally_counts_untimed_and_returns_the_tokens_added():
    tracker = DeltaTracker()
    deltas = (Delta("a", 3, 2), Delta("", 3, 2), Delta("b", 3, 1))
    assert [tracker.tally(d) for d in deltas] == [2, 0, 0]
    assert (tracker.first, tracker.last) == (None, None)
    assert (tracker.completion_tokens, tracker.steps) == (2, 1)


def test_the_four_users_share_the_one_tracker():
    assert issubclass(AdmittedCall, DeltaTracker)
    assert issubclass(Progress, DeltaTracker)
    assert issubclass(_Open, DeltaTracker)
    call = AdmittedCall("m", "t", 0.0, None, count=2)
    assert call.see(Delta("x", 1, 1), 1.0) and call.count == 2
