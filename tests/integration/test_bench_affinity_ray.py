"""`agentserve bench affinity --engine fake` end to end through a real local Ray Serve app:
the two models (affinity router, Serve's default) with two replicas each, agent
conversations that resend their context (each its own opening), and the fake engine's
per-replica prefix cache (agentserve_bench/fake_prefix.py). The affinity router keeps each
conversation on the replica that holds its prefix, so its prefix hit rate beats Serve's
default routing, which sends a turn to the other replica about half the time (~80 s)."""

from __future__ import annotations

import json

import pytest
from agentserve.cli import main

pytest.importorskip("ray.serve")


def test_affinity_routing_keeps_conversations_where_their_prefix_is(tmp_path):
    argv = ["bench", "affinity", "--engine", "fake", "--rounds", "1", "--conversations", "4",
            "--turns", "4", "--max-tokens", "4", "--port", "8733"]  # fmt: skip
    argv += ["--openings", "distinct"]
    # the fake engine's loads jitter from request to request: a loose bound holds the homes
    argv += ["--max-imbalance", "8", "--docs", str(tmp_path)]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "benchmarks" / "affinity.json").read_text())
    runs = {(r["arm"], r["workload"]): r for r in rows if r["kind"] == "run"}
    assert set(runs) == {
        (a, w) for a in ("spread", "affinity") for w in ("agent-distinct", "single-turn")
    }
    agent = {arm: runs[(arm, "agent-distinct")] for arm in ("spread", "affinity")}
    assert all(r["requests"] == 4 * 4 for r in agent.values())
    assert agent["affinity"]["prefix_hit_rate"] > agent["spread"]["prefix_hit_rate"]
    # every turn after the first finds its whole earlier context on its replica
    assert agent["affinity"]["prefix_hit_rate"] >= 0.5
    summary = [r for r in rows if r["kind"] == "summary"]
    assert {s["workload"] for s in summary} == {"agent-distinct", "single-turn"}
    assert "## Session and prefix affinity" in (tmp_path / "benchmarks.md").read_text()
