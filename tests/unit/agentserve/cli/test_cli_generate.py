"""`agentserve generate`: a thin registration of dflash/reference.py that hands it the
resolved weights, the model's mask token and its shipped drafter."""

from __future__ import annotations

from pathlib import Path

from agentserve.cli import build_parser
from agentserve.cli import generate as command
from agentserve.drafters import shipped_drafter
from agentserve.sources.models import BUNDLED_MODEL

from dflash.reference import load_drafter_choice


def test_generate_parses_the_reference_loops_options_with_the_bundled_model_by_default():
    args = build_parser().parse_args(["generate", "hi", "--drafter", "none", "--top-k", "5"])
    assert args.handler is command.run
    assert (args.model, args.prompts, args.drafter, args.top_k) == (
        BUNDLED_MODEL,
        ["hi"],
        "none",
        5,
    )


def test_generate_hands_the_loop_the_resolved_model_and_its_shipped_drafter(monkeypatch):
    seen = {}
    monkeypatch.setattr(command, "resolve_model", lambda model: Path("/weights") / model)
    monkeypatch.setattr(
        command.reference, "run_reference", lambda *a: seen.setdefault("call", a) and 0
    )
    args = build_parser().parse_args(["generate"])
    command.run(args)
    _, model_dir, mask_token_id, shipped = seen["call"]
    assert model_dir == Path("/weights") / BUNDLED_MODEL
    assert shipped == shipped_drafter(BUNDLED_MODEL) is not None
    assert mask_token_id(object()) == command.mask_token_id_for(BUNDLED_MODEL, object())


def test_no_drafter_when_none_is_asked_or_auto_finds_none_shipped():
    def never(_tokenizer):
        raise AssertionError("a plain run needs no mask token")

    assert load_drafter_choice("none", None, None, never, Path("/shipped")) is None
    assert load_drafter_choice("auto", None, None, never, None) is None
