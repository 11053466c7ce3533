"""Slow request bodies (issue 64 item 3): one tenant with a valid key opens many
connections and sends each body a byte every BYTE_EVERY_S, while another tenant streams.
The ingress gives each body server.body_read_timeout_s (408 after it) and each tenant at
most server.max_unadmitted_per_tenant requests between authentication and admission (429
beyond, before the body is read), so the attacker holds a bounded number of the ingress's
slots and the other tenant's streams all complete, their TPOT within 1.2x of the rounds
without the attack (interleave.py).

The ingress's slots: uvicorn's limit_concurrency (INGRESS_SLOTS, answering 503 past it)
stands for Ray Serve's max_ongoing_requests on the ingress; the streaming tenant opens a
connection per stream (as through a load balancer), so each stream needs a free slot.
The attacker's own 503s (its first burst of connections past the slots) are counted in
the details, not as 5xx to a well-behaved tenant. A control run with both
mechanisms wide open (no cap that binds, an hour to send a body) must fail: the
attacker's connections take every slot and the other tenant gets 503s.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from tests.reliability.hostile_lists import (
    KEY_HOSTILE,
    MODEL,
    TPOT_RATIO_MAX,
    run_interleaved,
    two_tenant_spec,
)
from tests.reliability.interleave import Switch, tpot_details
from tests.reliability.scenario import Outcome, scenario

__all__ = ["attack", "slow_bodies"]

CONNECTIONS = 24  # the attacker's connections
INGRESS_SLOTS = 16  # uvicorn limit_concurrency: the ingress's max_ongoing_requests
MAX_UNADMITTED = 8  # server.max_unadmitted_per_tenant in the protected run
BODY_READ_TIMEOUT_S = 3.0  # server.body_read_timeout_s in the protected run
BYTE_EVERY_S = 1.0
RETRY_AFTER_S = 1.0  # the attacker reconnects this long after an answer
_BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 200}]})


def _head(host: str, path: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY_HOSTILE}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(_BODY)}\r\n\r\n"
    ).encode()


def _trickle(address: tuple[str, int], head: bytes, switch: Switch) -> str:
    """One connection sending the body a byte at a time until an answer comes (its
    status) or the switch goes off ("cut")."""
    with socket.create_connection(address, timeout=BYTE_EVERY_S) as sock:
        sock.sendall(head)
        for byte in _BODY.encode():
            if not switch.active():
                return "cut"
            try:
                answer = sock.recv(256)
                return answer.split(b" ", 2)[1].decode() if answer else "closed"
            except TimeoutError:
                pass  # nothing yet: one more byte
            except OSError:
                return "closed"
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return "closed"
    return "sent"


def _connection(address: tuple[str, int], head: bytes, switch: Switch, seen: dict) -> None:
    while switch.active():
        status = _trickle(address, head, switch)
        seen[status] = seen.get(status, 0) + 1
        time.sleep(RETRY_AFTER_S if status != "cut" else 0)


def attack(url: str, folder: str) -> dict[str, dict[str, int]]:
    """The slow client (its own process): CONNECTIONS connections trickling bodies while
    the Switch in `folder` is on; {"slow_body": status -> count}."""
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    head, switch, seen = _head(parts.netloc, parts.path), Switch(folder), {}
    while switch.wait_go():
        threads = [
            threading.Thread(target=_connection, args=(address, head, switch, seen))
            for _ in range(CONNECTIONS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return {"slow_body": seen}


def _run(protected: bool, rounds: int, per_round: int) -> tuple[Any, Any, dict]:
    server = (
        {"max_unadmitted_per_tenant": MAX_UNADMITTED, "body_read_timeout_s": BODY_READ_TIMEOUT_S}
        if protected
        else {"max_unadmitted_per_tenant": 10_000, "body_read_timeout_s": 3600.0}
    )
    return run_interleaved(
        two_tenant_spec(**server),
        "tests.reliability.slow_bodies",
        rounds,
        per_round,
        settle_s=2 * BYTE_EVERY_S,  # the connections are open and trickling
        keepalive=False,  # each stream needs a slot of its own, as through a balancer
        limit_concurrency=INGRESS_SLOTS,
    )


@scenario("input_slow_bodies")
def slow_bodies(rounds: int = 5, per_round: int = 4, control: bool = True) -> Outcome:
    """24 connections of one valid key send their bodies a byte a second while another
    tenant streams, on an ingress of 16 slots: the attacker gets 408/429, the other
    tenant's streams all complete, median TPOT within 1.2x of the quiet rounds; a control
    without the read deadline and the cap loses the other tenant's requests (503)."""
    quiet, attacked, hostile = _run(True, rounds, per_round)
    details = tpot_details(quiet, attacked, TPOT_RATIO_MAX) | {"attacker_statuses": hostile}
    if control:
        _, open_attacked, open_hostile = _run(False, 1, per_round)
        details["control_without_limits"] = {
            "good_statuses": open_attacked.statuses,
            "attacker_statuses": open_hostile,
            "good_lost": open_attacked.lost,
        }
    return Outcome(
        requests=quiet.sent + attacked.sent + sum(hostile["slow_body"].values()),
        lost=quiet.lost + attacked.lost,  # the attacker's 503s: details
        errors_5xx=quiet.errors_5xx + attacked.errors_5xx,  # the well-behaved tenant's
        restarts=0,
        details=details,
    )


if __name__ == "__main__":  # the slow client: URL SWITCH_FOLDER
    print(json.dumps(attack(sys.argv[1], sys.argv[2])))
