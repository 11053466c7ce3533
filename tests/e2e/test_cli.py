"""The `agentserve` command as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from agentserve.cli import main


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentserve.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_help_lists_the_commands():
    out = _run("--help")
    assert out.returncode == 0
    for command in ("generate", "model", "spec"):
        assert command in out.stdout


def test_no_arguments_prints_help(capsys):
    assert main([]) == 0
    assert "usage: agentserve" in capsys.readouterr().out


def test_spec_validate_reports_field_paths(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: m\n    drafter: {num_speculative_tokens: 999}\n")
    assert main(["spec", "validate", str(bad)]) == 2
    assert "models[0].drafter.num_speculative_tokens" in capsys.readouterr().err


def test_spec_schema_is_json(capsys):
    assert main(["spec", "schema"]) == 0
    assert "properties" in json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_generate_with_random_drafter_reports_tau_and_matches_plain():
    out = _run(
        "generate",
        "Say hello.",
        "--drafter",
        "random",
        "--max-new-tokens",
        "12",
        "--compare",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["outputs_identical"] is True
    assert report["tau"] >= 1.0 and report["tokens"] > 0
