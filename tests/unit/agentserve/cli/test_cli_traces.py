"""`agentserve traces` / `up --traces` without starting anything: where Phoenix is looked
for, the error when it is missing, the flags, and `up --traces` failing fast."""

from __future__ import annotations

import argparse
import os
import stat

import pytest
from agentserve.cli import build_parser
from agentserve.cli import traces as cli_traces
from agentserve.cli.console import Console
from agentserve.cli.traces import PhoenixNotInstalledError, phoenix_executable


def _executable(path):
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_env_override_wins(tmp_path):
    exe = _executable(tmp_path / "phoenix")
    assert phoenix_executable({"AGENTSERVE_PHOENIX": str(exe)}) == exe


def test_missing_phoenix_names_the_install_step(monkeypatch, tmp_path):
    monkeypatch.setattr(cli_traces.sys, "prefix", str(tmp_path))
    monkeypatch.setattr(cli_traces.shutil, "which", lambda _: None)
    with pytest.raises(PhoenixNotInstalledError, match=r"install\.sh --traces"):
        phoenix_executable({"AGENTSERVE_PHOENIX": str(tmp_path / "nope")})


def test_flags_parse():
    args = build_parser().parse_args(["traces", "--traces-port", "7006"])
    assert (args.traces_port, args.traces_grpc_port) == (7006, 4317)
    args = build_parser().parse_args(["up", "--traces"])
    assert args.traces and args.traces_port == 6006


def test_up_traces_without_phoenix_fails_before_anything_starts(monkeypatch, tmp_path, capsys):
    from agentserve.cli.up import run_up

    monkeypatch.setattr(cli_traces.sys, "prefix", str(tmp_path))
    monkeypatch.setattr(cli_traces.shutil, "which", lambda _: None)
    monkeypatch.setitem(os.environ, "AGENTSERVE_PHOENIX", str(tmp_path / "nope"))
    spec = tmp_path / "spec.yaml"
    spec.write_text("models: [{name: m, engine: fake}]\n")
    args = build_parser().parse_args(["up", "--spec", str(spec), "--port", "1", "--traces"])
    monkeypatch.setattr("agentserve.cli.up.check_port_free", lambda *_: None)
    assert run_up(args, Console(plain=True)) == 2
    assert "install.sh --traces" in capsys.readouterr().err


def test_traces_for_up_is_a_no_op_without_the_flag():
    with cli_traces.traces_for_up(argparse.Namespace(traces=False), Console(plain=True)) as url:
        assert url is None
