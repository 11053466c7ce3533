"""A fresh user's mistakes at the command line (found by review): a command group without
its action is a usage error, a latency model file that is not one names itself, and a
plugin that fails to load takes only its own command down."""

from __future__ import annotations

import json

import pytest
from agentserve.autoscale.model import LatencyModel
from agentserve.cli import main


@pytest.mark.parametrize("argv", [["model"], ["bench"]])
def test_a_group_without_its_action_prints_its_help_and_exits_2(argv, capsys):
    assert main(argv) == 2
    assert "usage: agentserve" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [('{"foo": 1}', "unknown latency model fields ['foo']"), ("[1]", "JSON object"),
     ("{}", "JSON object"), ("not json", "Expecting value")],
)  # fmt: skip
def test_a_bad_latency_model_file_is_a_clear_error_naming_it(tmp_path, capsys, content, message):
    path = tmp_path / "lm.json"
    path.write_text(content)
    assert main(["spec", "speculation-schedule", "--latency-model", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err and "Traceback" not in err


def test_fit_latencys_figures_file_loads_as_a_latency_model(tmp_path):
    section = {
        "base_ms": 12.0,
        "knee_tokens": 4.0,
        "per_token_ms": 0.1,
        "prefill_ms_per_token": 0.2,
    }
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"figures": {"decode": []}, "latency_model": section}))
    assert LatencyModel.load(path).base_ms == 12.0


def test_a_plugin_that_fails_to_load_leaves_the_other_commands(monkeypatch, capsys):
    import agentserve.cli as cli

    def broken(sub):
        raise NameError("name 'fit_latency' is not defined")

    plugins = dict(cli.plugin_commands())
    plugins["bench"] = broken
    monkeypatch.setattr(cli, "plugin_commands", lambda: plugins)
    assert main(["spec", "validate"]) == 0
    assert main(["bench", "speculative"]) == 2
    assert "failed to load" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "--url", "notaurl"], "not an http"),
        (["status", "--watch", "-1"], "--watch"),
        (["status", "--watch", "inf"], "--watch"),
    ],
)
def test_status_refuses_a_url_that_is_not_one_and_a_negative_watch(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_up_reports_a_busy_port_before_it_prepares_the_default_speculation(monkeypatch, capsys):
    """The default speculation may convert and time the model first (a CPU without served
    figures): a busy port must be reported before that, not after."""
    import socket

    import agentserve.cli.up as up

    def never(*args, **kwargs):
        raise AssertionError("the spec's drafters were resolved before the port was checked")

    monkeypatch.setattr(up, "load_up_spec", never)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["up", "--port", str(port)]) == 2
    assert str(port) in capsys.readouterr().err


def test_up_refuses_a_port_out_of_range_before_anything_else(capsys):
    assert main(["up", "--port", "70000"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_plugin_that_fails_halfway_through_registering_is_undone(monkeypatch, capsys):
    """Review: `bench` registered itself, then a benchmark's parser raised: the stand-in
    for it must not collide with the half-registered one."""
    import agentserve_bench.fit_latency as fit_latency

    def broken(kinds):
        raise NameError("name 'fit_latency' is not defined")

    monkeypatch.setattr(fit_latency, "add_parser", broken)
    assert main(["spec", "validate"]) == 0
    assert main(["bench", "speculative"]) == 2
    assert "failed to load" in capsys.readouterr().err


def test_a_latency_model_with_a_field_that_is_not_a_number_is_refused(tmp_path, capsys):
    path = tmp_path / "lm.json"
    path.write_text('{"base_ms": "x"}')
    assert main(["spec", "speculation-schedule", "--latency-model", str(path)]) == 2
    assert "must be numbers" in capsys.readouterr().err
