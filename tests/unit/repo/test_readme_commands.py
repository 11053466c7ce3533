"""Every command README.md names still parses, with every flag README shows for it, and
has a test that runs it (issue 18: "every command in README still works and is exercised
by a test").

What runs each command for real, where it needs more than a unit test may start (Ray, a
real model, pip):
  up, status, chat       tests/e2e/test_up.py (the CLI in a subprocess on local Ray, the
                         fake engine) and tests/integration/test_up_real.py (vLLM)
  traces                 tests/unit/agentserve/cli/test_cli_traces.py, tests/e2e/test_examples.py
  generate               tests/e2e/test_cli.py (slow: the DFlash reference loop)
  model prepare          here (a local HF dir); the bundled conversion: tests/integration/
                         test_bundled_model.py
  spec show|validate|schema   tests/unit/agentserve/cli/test_cli_main.py, tests/e2e/test_cli.py
  train-drafter          tests/unit/agentserve/cli/test_train_drafter.py,
                         tests/integration/test_train_drafter_real.py
  bench speculative      tests/unit/agentserve_bench/test_bench_speculative.py (the driver,
                         engines faked); the vLLM runs themselves only as measured in docs
  bench speculative-served   tests/integration/test_bench_served_ray.py (Ray, fake engine);
                         the vLLM runs themselves only as measured in docs
  bench startup          tests/unit/agentserve_bench/test_bench_startup.py (phases, the
                         rule, --report-only through the CLI); the engine starts only as
                         measured in docs
  bench sampling|overhead|autoscale   tests/unit/agentserve_bench/ (fake engines),
                         tests/integration/test_bench_overhead_ray.py (Ray)
  python -m tests.reliability.run   tests/unit/reliability/test_reliability_run.py (--list,
                         rendering), tests/integration/test_vllm_faults.py (scenarios)
  ./install.sh           here (--help and option parsing; an install needs pip and the network)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from agentserve.cli import main

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text(encoding="utf-8")

# Each README command (its words before the first argument) -> a test file that runs it.
RUN_BY = {
    "up": "tests/e2e/test_up.py",
    "status": "tests/e2e/test_up.py",
    "chat": "tests/e2e/test_up.py",
    "traces": "tests/unit/agentserve/cli/test_cli_traces.py",
    "generate": "tests/e2e/test_cli.py",
    "model prepare": "tests/unit/repo/test_readme_commands.py",
    "spec show": "tests/unit/agentserve/cli/test_cli_main.py",
    "spec validate": "tests/e2e/test_cli.py",
    "spec schema": "tests/e2e/test_cli.py",
    "spec speculation-schedule": "tests/unit/agentserve/cli/test_cli_main.py",
    "train-drafter": "tests/integration/test_train_drafter_real.py",
    "bench speculative": "tests/unit/agentserve_bench/test_bench_speculative.py",
    "bench speculative-served": "tests/integration/test_bench_served_ray.py",
    "bench startup": "tests/unit/agentserve_bench/test_bench_startup.py",
    "bench sampling": "tests/unit/agentserve_bench/test_bench_sampling_check.py",
    "bench overhead": "tests/unit/agentserve_bench/test_bench_overhead.py",
    "bench autoscale": "tests/unit/agentserve_bench/test_bench_autoscale.py",
    "bench fit-latency": "tests/unit/agentserve_bench/test_fit_latency.py",
}


def _readme_agentserve_commands() -> dict[str, set[str]]:
    """command words -> the flags README shows with them, from every code block."""
    commands: dict[str, set[str]] = {}
    for block in re.findall(r"```[a-z]*\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            match = re.match(r"\s*(?:\.venv/bin/)?agentserve ((?:[a-z][a-z-]*[ |]?)+)(.*)", line)
            if not match:
                continue
            words, rest = match.group(1).split(), match.group(2)
            flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest.split("  ")[0]))
            *path, last = words
            for alternative in last.split("|"):
                commands.setdefault(" ".join([*path, alternative]), set()).update(flags)
    return commands


def _help(words: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*words.split(), "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_readme_names_the_commands_this_test_knows():
    found = _readme_agentserve_commands()
    assert set(found) == set(RUN_BY)
    assert found["up"] >= {"--spec", "--port", "--speculation", "--no-drafter", "--traces"}


@pytest.mark.parametrize("words", sorted(RUN_BY))
def test_each_readme_command_parses_with_its_flags_and_has_a_test(words, capsys):
    out = _help(words, capsys)
    assert out.startswith(f"usage: agentserve {words.split()[0]}")
    assert all(word in out for word in words.split())  # `spec show`: a choice of `spec`
    for flag in _readme_agentserve_commands()[words]:
        assert flag in out, f"README shows `agentserve {words} {flag}`; its --help lacks it"
    test_file = (ROOT / RUN_BY[words]).read_text(encoding="utf-8")
    assert words.split()[-1] in test_file


def test_model_prepare_prints_a_local_model_dir(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    assert main(["model", "prepare", str(tmp_path), "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path.resolve())


def test_model_prepare_of_nothing_is_a_user_error(tmp_path, capsys):
    assert main(["model", "prepare", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("agentserve: error:")


def test_the_reliability_command_runs_from_the_checkout_root():
    assert "python -m tests.reliability.run" in README
    out = subprocess.run(
        [sys.executable, "-m", "tests.reliability.run", "--list"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "tenant_isolation:" in out.stdout and "faults_engine_crash:" in out.stdout


def test_install_sh_help_lists_its_options_and_refuses_unknown_ones():
    for usage in re.findall(r"\./install\.sh( --[a-z]+)?", README):
        assert usage in ("", " --dev", " --help"), usage
    out = subprocess.run(
        ["bash", str(ROOT / "install.sh"), "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    for option in ("--dev", "--traces", "--agents", "--gpu", "--cpu"):
        assert f"./install.sh {option}" in out.stdout
    bad = subprocess.run(
        ["bash", str(ROOT / "install.sh"), "--nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown option '--nope'" in bad.stderr
