"""`agentserve bench autoscale` on a short trace: JSON, plot and the generated docs section."""

from __future__ import annotations

import json

from agentserve.cli import main
from agentserve_bench.autoscale.bench import markdown_summary

DOC = """# Autoscaling

Intro prose stays.

<!-- autoscale:begin -->
old table
<!-- autoscale:end -->

Closing prose stays.
"""


def test_bench_autoscale_writes_json_plot_and_docs_section(tmp_path, capsys):
    (tmp_path / "autoscaling.md").write_text(DOC)
    assert main(["bench", "autoscale", "--duration-s", "240", "--docs", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "benchmarks" / "autoscale.json").read_text())
    assert report["command"] == "agentserve bench autoscale --duration-s 240.0"
    assert {"sla_policy", "ttft_only", "ray_default_target_1"} <= set(report["policies"])
    for result in report["policies"].values():
        assert {"replica_seconds", "scaling_actions", "tenants"} <= set(result)
        assert set(result["tenants"]) == {"interactive", "batch"}
    assert (tmp_path / "benchmarks" / "autoscale.png").stat().st_size > 1000
    doc = (tmp_path / "autoscaling.md").read_text()
    assert "old table" not in doc and "Intro prose stays." in doc and "Closing prose" in doc
    headline = "| **SLA policy** (this; defaults, standby derived from the start) |"
    assert headline in doc and "Ray default, target_ongoing 1" in doc
    assert headline in capsys.readouterr().out
    assert "| SLA policy, no standby (`standby_replicas: 0`) |" in doc
    assert "standby set by hand (routed) |" in doc and "interactive in burst" in doc
    assert "| SLA policy, priority off (FIFO) | by batch |" in doc and "| shed |" in doc


def test_summary_states_savings_and_costs():
    policy = {
        "tenants": {"a": {"attainment": 0.99, "attainment_outside_burst": 1.0}},
        "replica_seconds": 1000.0,
        "scaling_actions": 3,
    }
    report = {
        "slas": {"a": {}},
        "scenario": {"max_drafted": 7},
        "policies": {
            "sla_policy": policy,
            "sla_policy_fixed_k": policy,
            "sla_policy_no_spec": policy,
            "ray_default_target_2": policy,
        },
        "at_equal_attainment": [
            {
                "metric": "attainment",
                "ours": 0.99,
                "ray_default": "ray_default_target_2",
                "ray_default_attainment": 0.995,
                "saving": -0.1,
            },
            {"metric": "attainment_outside_burst", "ours": 1.0, "ray_default": None},
        ],
    }
    text = markdown_summary(report)
    row = "| Ray default, target_ongoing 2 | by batch | 99.00% | 100.00% | - | 0 | 1,000 | 3 |"
    assert row in text
    assert "| SLA policy, fixed 7 drafted tokens (no schedule) | fixed 7 | 99.00%" in text
    assert "| SLA policy, no speculation | none | 99.00%" in text
    fixed_fleet = markdown_summary(
        {**report, "scenario": {"max_drafted": 5, "speculation": "fixed"}}
    )
    assert "| Ray default, target_ongoing 2 | fixed 5 | 99.00%" in fixed_fleet
    assert "**10% more replica-seconds**" in text and "no Ray-default setting" in text


def test_the_headline_row_runs_the_policy_defaults():
    """The SLA policy row is the default policy, not a variant tuned on the trace: every
    knob but the scenario's SLAs, bounds and model is PolicySpec's, the standby derived."""
    from agentserve.autoscale.policy import PolicySpec
    from agentserve_bench.autoscale.compare import Scenario, policy_spec_for

    ours, default = policy_spec_for(Scenario()), PolicySpec()
    assert ours.standby_replicas is None and default.standby_replicas is None
    assert ours.staffing_z == default.staffing_z
    assert ours.burst._replace(lead_s=0.0) == default.burst._replace(lead_s=0.0)
