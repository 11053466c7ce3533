"""`agentserve bench autoscale-live --engine fake` end to end: a local Ray Serve, the SLA
policy between 1 and 2 replicas of the fake engine, the two-tenant trace (20 s) replayed
over HTTP with priority off then on; the JSON report and the markdown table.

The fake engine's step is 20 ms + 20 ms per running sequence: 4 running on one replica
(the burst) give 100 ms per token against the interactive 90 ms objective.
"""

from __future__ import annotations

import json

import pytest
from agentserve.cli import main


def test_the_live_bench_runs_both_phases_and_writes_its_report(tmp_path, capsys):
    pytest.importorskip("ray")
    out = tmp_path / "live.json"
    assert main(["bench", "autoscale-live", "--engine", "fake", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["command"].startswith("agentserve bench autoscale-live --engine fake")
    assert report["machine"]["cpus"] and report["machine"]["ray"]
    assert list(report["phases"]) == ["off", "on"]
    calls = report["trace"]["calls"]
    for name, phase in report["phases"].items():
        records = phase["records"]
        assert len(records) == calls, name  # every call of every session was sent
        tenants = {r["tenant"] for r in records}
        assert tenants == {"interactive", "batch"}
        served = [r for r in records if r["status"] == 200 and r["error"] is None]
        assert len(served) >= 0.9 * calls, (name, [r for r in records if r not in served][:3])
        assert all(r["output_tokens"] > 0 and r["ttft_ms"] > 0 for r in served)
        assert any(r["in_burst"] for r in records) and not all(r["in_burst"] for r in records)
        for tenant in ("interactive", "batch"):
            t = phase["tenants"][tenant]
            assert t["requests"] == sum(r["tenant"] == tenant for r in records)
            assert t["ttft_p50_ms"] <= t["ttft_p95_ms"]
            assert 0.0 <= t["attainment"] <= 1.0
        timeline = phase["timeline"]
        assert timeline and timeline[0]["running"] == 1  # each phase starts from 1 replica
        assert phase["replica_seconds"] >= phase["replay_s"] * 0.9  # 1 replica at least
        assert phase["back_to_one_replica_after_replay_s"] is not None
    off, on = report["phases"]["off"], report["phases"]["on"]
    assert off["priority"] is False and on["priority"] is True
    # the burst breaks the interactive TPOT objective on one replica: the policy scales up
    assert max(off["peak_replicas"], on["peak_replicas"]) == 2, (
        off["timeline"],
        on["timeline"],
    )
    table = capsys.readouterr().out
    assert "| off | interactive |" in table and "| on | batch |" in table
    print(table)
    print({p: (r["timeline"], r["policy_decisions"]) for p, r in report["phases"].items()})
