"""Reading a trace back from Phoenix's REST API (for tests/e2e and tests/integration)."""

from __future__ import annotations

import time

import httpx
import pytest


def phoenix_spans(url: str, trace_id: str, want: set[str], timeout_s: float = 60) -> list[dict]:
    """The trace's spans (project `default`), once every name in `want` has arrived."""
    deadline = time.monotonic() + timeout_s
    spans: list[dict] = []
    while time.monotonic() < deadline:
        r = httpx.get(
            f"{url}/v1/projects/default/spans",
            params={"trace_id": trace_id, "limit": 1000},
            timeout=10,
            trust_env=False,
        )
        if r.is_success:
            spans = r.json()["data"]
            if want <= {s["name"] for s in spans}:
                return spans
        time.sleep(1)
    pytest.fail(f"Phoenix has {sorted(s['name'] for s in spans)}; wanted {sorted(want)}")


def ancestry(span: dict, by_id: dict[str, dict]) -> list[str]:
    """Names of `span`'s ancestors, nearest first, as far as `by_id` reaches."""
    names = []
    while span.get("parent_id") in by_id:
        span = by_id[span["parent_id"]]
        names.append(span["name"])
    return names
