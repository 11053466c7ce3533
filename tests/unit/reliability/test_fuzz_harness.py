"""Issue 64 item 10: the fuzz harness zeroes a leak in place, so the ingress's in_flight
stays admission's own dict and a second leak is counted too."""

from __future__ import annotations

from agentserve.api.auth import OPEN_TENANT

from tests.reliability.fuzz import forget_leaks
from tests.reliability.hostile_input import MODEL, fuzz_client


def test_forgetting_a_leak_keeps_in_flight_attached_to_admission():
    client, _ = fuzz_client()
    shares = client.app.state.ingress.admit_stage.shares
    in_flight = shares.in_flight  # the dict admission counts in
    shares.in_flight[MODEL] = 3  # a leak
    shares._mine[MODEL][OPEN_TENANT] = 3
    forget_leaks(client.app.state.ingress)
    assert shares.in_flight is in_flight
    assert in_flight[MODEL] == 0 and not shares._mine[MODEL]
    shares.in_flight[MODEL] += 1  # a later leak
    assert in_flight[MODEL] == 1, "the harness would see it"
