"""`agentserve train-drafter`: a thin registration of dflash/train/pipeline.py that hands it
what agentserve knows of the target (weights, shipped drafter, mask token, responses)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentserve.cli import build_parser
from agentserve.cli import train_drafter as command
from agentserve.drafters import BUNDLED_DRAFTER_DIR
from agentserve.sources.models import BUNDLED_MODEL


def test_the_command_parses_the_pipelines_options_with_the_bundled_model_by_default():
    args = build_parser().parse_args(["train-drafter", "--stage", "eval", "--layers", "3"])
    assert args.handler is command.run
    assert (args.model, args.stage, args.layers) == (BUNDLED_MODEL, "eval", 3)


@pytest.fixture
def resolved(monkeypatch, tmp_path):
    monkeypatch.setattr(command, "resolve_model", lambda model: tmp_path / model)
    return tmp_path


def test_the_bundled_model_gets_its_drafter_its_mask_token_and_the_committed_responses(
    resolved,
):
    info = command.target_info(BUNDLED_MODEL)
    assert info.model_dir == resolved / BUNDLED_MODEL
    assert info.shipped_drafter == BUNDLED_DRAFTER_DIR == info.export_dir
    assert info.responses_archive is not None and info.responses_archive.exists()
    assert info.mask_token_id(object()) == command.mask_token_id_for(BUNDLED_MODEL, object())


def test_another_model_trains_from_scratch_and_exports_beside_the_bundled_drafter(resolved):
    info = command.target_info("/models/other")
    assert info.model_dir == Path("/models/other")
    assert info.shipped_drafter is None and info.responses_archive is None
    assert info.export_dir == BUNDLED_DRAFTER_DIR


def test_run_hands_the_pipeline_the_targets_info(monkeypatch, resolved):
    seen = {}
    monkeypatch.setattr(command.pipeline, "run", lambda args, info: seen.setdefault("i", info))
    args = build_parser().parse_args(["train-drafter", "--model", "/models/other"])
    command.run(args)
    assert seen["i"].model_dir == Path("/models/other")


def test_another_models_mask_token_is_its_tokenizers(resolved):
    class Tokenizer:
        mask_token_id = 7

    assert command.target_info("/models/other").mask_token_id(Tokenizer()) == 7
