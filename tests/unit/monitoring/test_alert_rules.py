"""The shipped alert rules, checked by the real promtool: `promtool check rules`, the unit
tests in *_alerts_test.yaml (series that must fire and series that must not), and for every
alert two mutations of its expression that those unit tests must catch: one that silences
it (so a "must fire" case exists) and one that loosens it (so a "must not fire" case
exists). Needs promtool (Debian package prometheus; ./install.sh --dev puts it in .venv/bin).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from tool_binaries import find_binary

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "helm" / "agentserve" / "files" / "alerts" / "agentserve.rules.yaml"
HERE = Path(__file__).resolve().parent
SLA_TESTS = HERE / "sla_alerts_test.yaml"
SERVING_TESTS = HERE / "serving_alerts_test.yaml"


PROMTOOL = find_binary("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not found: ./install.sh --dev unpacks it into .venv/bin (Debian "
    "package prometheus), or apt-get install prometheus",
)

NEVER = "vector(1) == 0"
# alert -> (substring of its expr, replacement that loosens it): each makes a quiet series
# of the unit tests fire.
LOOSEN = {
    "AgentserveTTFTBurnRateFast": ("> 14.4", "> 0"),
    "AgentserveTTFTBurnRateSlow": ("> 6", "> 0"),
    "AgentserveTPOTBurnRateFast": ("> 14.4", "> 0"),
    "AgentserveTPOTBurnRateSlow": ("> 6", "> 0"),
    "AgentserveMetricsAbsent": ("absent(agentserve_sla_objective_seconds)", "vector(1)"),
    "AgentserveReplicaDown": ("< max by", "<= max by"),
    "AgentserveEngineUnhealthy": ("unless on (model)", "unless on (model) vector(1) == 0 and"),
    "AgentserveEngineHung": ("min_over_time", "max_over_time"),
    "AgentserveAcceptanceCollapsed": ("< on (model)", "> on (model)"),
    "AgentserveQueueSaturated": ("> 0.9", "> 0.8"),
}


def alerts(rules: dict) -> dict[str, dict]:
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


def unit_tests_for(alert: str) -> Path:
    return SLA_TESTS if "BurnRate" in alert else SERVING_TESTS


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def test_rules_pass_promtool_check():
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize("tests", [SLA_TESTS, SERVING_TESTS], ids=lambda p: p.stem)
def test_promtool_unit_tests_pass(tests):
    done = promtool("test", "rules", str(tests))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_loosening_mutation_and_unit_tests():
    shipped = alerts(yaml.safe_load(RULES.read_text()))
    assert set(LOOSEN) == set(shipped)
    for name in shipped:
        tested = yaml.safe_load(unit_tests_for(name).read_text())
        names = {t["alertname"] for g in tested["tests"] for t in g.get("alert_rule_test", [])}
        assert name in names, f"{name} has no alert_rule_test in {unit_tests_for(name).name}"


def run_mutated(tmp_path: Path, alert: str, mutate) -> subprocess.CompletedProcess:
    """promtool test rules on the alert's unit tests with `mutate(expr) -> expr` applied
    to that alert's expression in a copy of the rules."""
    rules = yaml.safe_load(RULES.read_text())
    rule = alerts(rules)[alert]
    mutated = mutate(rule["expr"])
    assert mutated != rule["expr"], f"mutation left {alert} unchanged"
    rule["expr"] = mutated
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    tests = yaml.safe_load(unit_tests_for(alert).read_text())
    tests["rule_files"] = ["rules.yaml"]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    assert promtool("check", "rules", str(tmp_path / "rules.yaml")).returncode == 0
    return promtool("test", "rules", str(tmp_path / "tests.yaml"))


@pytest.mark.parametrize("alert", sorted(LOOSEN))
def test_unit_tests_catch_a_silenced_alert(tmp_path, alert):
    done = run_mutated(tmp_path, alert, lambda expr: NEVER)
    assert done.returncode != 0, f"{alert} never firing went unnoticed"
    assert alert in done.stdout + done.stderr


@pytest.mark.parametrize("alert", sorted(LOOSEN))
def test_unit_tests_catch_a_loosened_alert(tmp_path, alert):
    old, new = LOOSEN[alert]
    done = run_mutated(tmp_path, alert, lambda expr: expr.replace(old, new))
    assert done.returncode != 0, f"{alert} with {old!r} -> {new!r} went unnoticed"
    assert alert in done.stdout + done.stderr


def test_status_attainment_and_burn_match_the_recording_rules(tmp_path):
    """`agentserve status` and Prometheus compute the same attainment and burn from the
    same counters: the exposition of a ServingMetrics, growing linearly over 5 minutes,
    fed to promtool; its recording rule must give what sla_rows shows."""
    from agentserve.cli.status import sla_rows
    from agentserve.sdk.metrics_snapshot import parse_metrics
    from agentserve.serve.metrics import ServingMetrics
    from prometheus_client.parser import text_string_to_metric_families

    metrics = ServingMetrics({"gold": (0.5, 0.05), "silver": (0.2, 0.02)})
    for i in range(9):  # gold: TTFT 7/9 within, TPOT 6/9; silver: TTFT 2/9, TPOT all
        metrics.observe_request(
            "a" if i % 2 else "b", "gold", ttft_s=0.1 if i < 7 else 0.9,
            decode_s=0.1 if i < 6 else 1.0, prompt_tokens=1, output_tokens=11, status=200,
        )  # fmt: skip
        metrics.observe_request(
            "a", "silver", ttft_s=0.1 if i < 2 else 0.9, decode_s=0.1, prompt_tokens=1,
            output_tokens=11, status=200,
        )  # fmt: skip
    text = metrics.exposition().decode()
    series = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith(("_count", "within_sla_total")):
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                values = " ".join(repr(s.value * step / 5) for step in range(6))
                series.append({"series": f"{s.name}{{{labels}}}", "values": values})
    exp_attainment, exp_burn = [], []
    for tenant, _, _, ttft_pct, ttft_burn, _, tpot_pct, tpot_burn, _ in sla_rows(
        parse_metrics(text)
    ):
        for objective, pct, burn in (("ttft", ttft_pct, ttft_burn), ("tpot", tpot_pct, tpot_burn)):
            labels = f'{{objective="{objective}",tenant="{tenant}"}}'
            exp_attainment.append({"labels": labels, "value": round(pct / 100, 3)})
            exp_burn.append({"labels": labels, "value": burn})
    assert {e["value"] for e in exp_attainment} == {0.778, 0.667, 0.222, 1.0}
    record = "agentserve:sla_attainment:ratio_rate5m"
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {"expr": f"round({record}, 0.001)", "eval_time": "5m",
                     "exp_samples": exp_attainment},
                    {"expr": f"round((1 - {record}) / 0.05, 0.01)", "eval_time": "5m",
                     "exp_samples": exp_burn},
                ],
            }
        ],
    }  # fmt: skip
    (tmp_path / "status_test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    done = promtool("test", "rules", str(tmp_path / "status_test.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
