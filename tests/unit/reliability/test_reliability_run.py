"""tests/reliability/run.py: every scenario is found by its tag, and the records render
into docs/benchmarks/reliability.json and docs/reliability.md's table (merged by name)."""

from __future__ import annotations

import json
import types

import pytest

from tests.reliability import run
from tests.reliability.scenario import Outcome, scenario, scenarios_in

SCENARIOS = {
    "faults_backpressure",
    "faults_drain",
    "faults_engine_crash",
    "faults_replica_killed",
    "faults_soak_memory",
    "faults_stuck_engine",
    "faults_vllm",
    "input_explicit_cases",
    "input_fuzz",
    "input_hostile_lists",
    "input_slow_bodies",
    "input_structured_outputs",
    "memory_n_logprobs",
    "tenant_isolation",
    "tenant_keeper_faults",
    "tenant_poison_accounting",
    "tenant_tool_schemas",
}


def test_every_scenario_module_is_collected_by_name():
    assert set(run.all_scenarios()) == SCENARIOS


def test_a_name_defined_twice_is_an_error():
    def one() -> Outcome:
        return Outcome(1, 0, 0, 0)

    def two() -> Outcome:
        return Outcome(1, 0, 0, 0)

    first = types.SimpleNamespace(a=scenario("same")(one))
    second = types.SimpleNamespace(b=scenario("same")(two))
    with pytest.raises(ValueError, match="'same' defined twice"):
        scenarios_in([first, second])


def test_records_merge_into_the_json_and_the_docs_table(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "reliability.md").write_text(
        "# Reliability\n\n<!-- reliability-table:begin -->\nold\n"
        "<!-- reliability-table:end -->\n\nprose stays\n"
    )
    old = {"requests": 5, "lost": 0, "errors_5xx": 0, "restarts": 0, "engine": "fake"}
    (docs / "benchmarks").mkdir()
    (docs / "benchmarks" / "reliability.json").write_text(json.dumps({"a": old | {"wall_s": 1}}))
    new = {"requests": 7, "lost": 1, "errors_5xx": 2, "restarts": 3, "engine": "vllm"}
    run.write_docs({"b": new | {"details": {}, "wall_s": 2.5}}, docs)
    merged = json.loads((docs / "benchmarks" / "reliability.json").read_text())
    assert set(merged) == {"a", "b"}
    text = (docs / "reliability.md").read_text()
    assert "old" not in text and text.endswith("prose stays\n")
    assert "Command: `python -m tests.reliability.run`" in text
    assert "| a | fake | 5 | 0 | 0 | 0 | 1 |" in text
    assert "| b | vllm | 7 | 1 | 2 | 3 | 2.5 |" in text


def test_docs_default_to_the_repository_not_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert run.DOCS.is_absolute() and (run.DOCS / "reliability.md").is_file()


def test_the_command_lists_every_scenario_and_refuses_unknown_ones(capsys):
    assert run.main(["--list"]) == 0
    listed = {line.split(":")[0] for line in capsys.readouterr().out.splitlines()}
    assert listed == SCENARIOS
    with pytest.raises(SystemExit, match="unknown scenario"):
        run.main(["--only", "no_such_scenario"])


def test_a_lost_request_or_a_failed_check_fails_the_record():
    clean = {"lost": 0, "errors_5xx": 0, "details": {"tpot_within_1_2x": True}}
    assert run.failed(clean) == []
    assert run.failed(clean | {"lost": 2}) == ["lost=2"]
    slow = clean | {"details": {"tpot_within_1_2x": False, "deaths_within_bound": True}}
    assert run.failed(slow) == ["tpot_within_1_2x is False"]
    assert run.failed({"lost": 0, "errors_5xx": 1}) == ["errors_5xx=1"]
