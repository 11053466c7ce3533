"""n=8 x top_logprobs=20 through the ingress (tests/reliability/memory_amplification.py):
the non-stream request is refused before it is buffered, so the ingress's traced peak
stays far below the cap-lifted control's; the stream is served whole."""

from __future__ import annotations

from tests.reliability.memory_amplification import memory_n_logprobs


def test_buffering_amplification_is_refused_and_the_control_shows_it():
    outcome = memory_n_logprobs()
    assert outcome.clean, outcome
    capped = outcome.details["non_stream_capped"]
    control = outcome.details["control_uncapped_non_stream"]
    assert capped["status"] == 400 and capped["code"] == "response_too_large"
    assert control["status"] == 200 and control["peak_traced_mib"] > 50, control
    assert capped["peak_traced_mib"] < control["peak_traced_mib"] / 10
    assert outcome.details["stream"]["status"] == 200
