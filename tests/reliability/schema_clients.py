"""The two clients of the tool-schema scenario (tests/reliability/tool_schemas.py), each
in its own process, as real clients are: the ingress's process then holds only the
ingress, so the scenario measures what the server does to the well-behaved tenant, not
what the attack's own client (encoding and sending 140 KB bodies at full tilt) does to
the GIL of a server sharing its process.

    python -m tests.reliability.schema_clients good|hostile URL START_AT DURATION_S

waits until wall-clock START_AT, runs DURATION_S and prints one JSON line: the statuses
it saw and (good) the latency of each 200.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from tests.reliability.schema_bodies import GOOD_BODY, KEY_GOOD, KEY_HOSTILE, hostile_body

GOOD_GAP_S = 0.05  # the well-behaved tenant: 20 requests/s
HOSTILE_WORKERS = 8  # the hostile tenant: 8 connections at full tilt


def _count(by: dict[str, int], status: int) -> None:
    by[str(status)] = by.get(str(status), 0) + 1


class HostileBodies:
    """Unique hostile bodies from one encoded template (a byte substitution each), so
    the attacker's encoding costs its own process almost nothing."""

    def __init__(self) -> None:
        self.template = json.dumps(hostile_body(0)).encode()
        self.n = 0

    def next(self) -> bytes:
        self.n += 1
        tag = b"h%dx" % self.n
        return self.template.replace(b'"h0x', b'"' + tag).replace(b'"no0"', b'"no%d"' % self.n)


async def good(client: Any, url: str, until: float, out: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {KEY_GOOD}"}
    statuses: dict[str, int] = out.setdefault("statuses", {})
    latency: list[float] = out.setdefault("latency_s", [])

    async def one() -> None:
        start = time.perf_counter()
        try:
            r = await client.post(url, json=GOOD_BODY, headers=headers)
        except Exception:  # a dropped connection: counted as lost
            _count(statuses, 0)
            return
        _count(statuses, r.status_code)
        if r.status_code == 200 and r.json()["choices"]:
            latency.append(time.perf_counter() - start)

    tasks = []
    while time.monotonic() < until:
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(GOOD_GAP_S)
    await asyncio.gather(*tasks)


async def hostile(client: Any, url: str, until: float, out: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {KEY_HOSTILE}", "Content-Type": "application/json"}
    statuses: dict[str, int] = out.setdefault("statuses", {})
    bodies = HostileBodies()

    async def worker() -> None:
        while time.monotonic() < until:
            try:
                r = await client.post(url, content=bodies.next(), headers=headers)
                _count(statuses, r.status_code)
            except Exception:
                _count(statuses, 0)

    await asyncio.gather(*(worker() for _ in range(HOSTILE_WORKERS)))


async def _main(role: str, url: str, start_at: float, duration_s: float) -> dict[str, Any]:
    import httpx

    out: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=30, limits=limits, trust_env=False) as client:
        if role == "good":  # one request before the clock starts: connections warm
            await client.post(url, json=GOOD_BODY, headers={"Authorization": f"Bearer {KEY_GOOD}"})
        await asyncio.sleep(max(0.0, start_at - time.time()))
        until = time.monotonic() + duration_s
        await (good if role == "good" else hostile)(client, url, until, out)
    return out


if __name__ == "__main__":
    role, url, start_at, duration = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    if role not in ("good", "hostile"):
        sys.exit(f"role must be good or hostile, not {role!r}")
    print(json.dumps(asyncio.run(_main(role, url, start_at, duration))))
