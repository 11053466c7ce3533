"""`agentserve bench` is a plugin: the CLI loads it from the `agentserve.commands` entry
point group (or, with metadata older than the plugin, by its name in SOURCE_PLUGINS), and
a missing plugin becomes a command that says how to get it."""

from __future__ import annotations

import pytest
from agentserve import cli
from agentserve_bench import command as bench_command


def test_a_discovered_entry_point_loads_its_register_function():
    found = cli.plugin_commands([("bench", "agentserve_bench.command:register")])
    assert found["bench"] is bench_command.register


def test_a_plugin_that_is_not_installed_becomes_a_message():
    found = cli.plugin_commands([("lab", "no_such_package_here.command:register")])
    assert found["lab"].startswith("`agentserve lab` is not installed")
    assert "bench" in found  # the shipped plugin is still found by name


def test_bench_is_found_without_entry_point_metadata(monkeypatch, capsys):
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for kind in ("speculative", "sampling", "autoscale", "autoscale-live", "overhead"):
        assert kind in out


def test_without_the_benchmarks_bench_says_how_to_get_them(monkeypatch, capsys):
    monkeypatch.setattr(cli, "entry_points", lambda group: [])
    monkeypatch.setattr(cli, "SOURCE_PLUGINS", {"bench": "no_such_package_here.cmd:register"})
    assert cli.main(["bench", "speculative", "--engines", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "`agentserve bench` is not installed" in err
    assert "./install.sh" in err
