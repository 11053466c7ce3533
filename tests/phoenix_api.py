"""Reading a trace back from Phoenix's REST API (for tests/e2e and tests/integration)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest


def phoenix_spans(
    url: str,
    trace_id: str,
    want: set[str],
    timeout_s: float = 60,
    until: Callable[[list[dict]], bool] | None = None,
) -> list[dict]:
    """The trace's spans (project `default`), once every name in `want` has arrived and
    `until(spans)` holds. Spans reach Phoenix one export batch at a time from each process
    (agent, ingress, replica), so a name being there does not mean its parents are."""
    deadline = time.monotonic() + timeout_s
    spans: list[dict] = []
    while time.monotonic() < deadline:
        try:
            r = httpx.get(
                f"{url}/v1/projects/default/spans",
                params={"trace_id": trace_id, "limit": 1000},
                timeout=10,
                trust_env=False,
            )
        except httpx.TransportError:  # Phoenix busy ingesting on a loaded machine: ask again
            time.sleep(1)
            continue
        if r.is_success:
            spans = r.json()["data"]
            if want <= {s["name"] for s in spans} and (until is None or until(spans)):
                return spans
        time.sleep(1)
    chains = decode_chains(spans)
    pytest.fail(
        f"Phoenix has {sorted(s['name'] for s in spans)}; wanted {sorted(want)}"
        f"{' and a condition on them' if until else ''}; decode chains: {chains}"
    )


def ancestry(span: dict, by_id: dict[str, dict]) -> list[str]:
    """Names of `span`'s ancestors, nearest first, as far as `by_id` reaches."""
    names = []
    while span.get("parent_id") in by_id:
        span = by_id[span["parent_id"]]
        names.append(span["name"])
    return names


def decode_chains(spans: list[dict]) -> list[list[str]]:
    """The ancestry of every `decode` span, as far as the spans received reach."""
    by_id = {s["context"]["span_id"]: s for s in spans}
    return [ancestry(s, by_id) for s in spans if s["name"] == "decode"]


def has_decode_chain(chain: list[str]) -> Callable[[list[dict]], bool]:
    """A condition for `phoenix_spans`: some decode span's ancestry is exactly `chain`."""
    return lambda spans: chain in decode_chains(spans)
