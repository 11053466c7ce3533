"""DFlash drafters shipped with agentserve, and how to pick one for a model."""

from __future__ import annotations

from pathlib import Path

from agentserve.model_sources import BUNDLED_ALIASES, BUNDLED_MODEL

__all__ = [
    "BUNDLED_DRAFTER_DIR",
    "DEFAULT_SPECULATION",
    "DRAFTER_ROOT",
    "default_speculation",
    "mask_token_id_for",
    "shipped_drafter",
]

DRAFTER_ROOT = Path(__file__).parent / "drafters"
BUNDLED_DRAFTER_DIR = DRAFTER_ROOT / f"{BUNDLED_MODEL}-dflash"
"""Where the bundled model's drafter ships (and where train-drafter writes it)."""
_SHIPPED = {BUNDLED_MODEL: BUNDLED_DRAFTER_DIR.name}
# SmolLM2's `<empty_output>`: a special token chat never produces; the drafter's mask slot.
_MASK_TOKEN_IDS = {BUNDLED_MODEL: 16}
# The speculative method `agentserve up` uses for a model whose spec picks none: the one
# `agentserve bench speculative` measured fastest at batch 1 (geometric mean over T=0 and
# T=1; docs/benchmarks.md). tests/unit/agentserve/test_default_speculation.py checks this
# table against the committed figures, so a new benchmark that changes the winner fails
# until the default follows it.
DEFAULT_SPECULATION = {BUNDLED_MODEL: "ngram"}


def _canonical(model: str) -> str:
    return BUNDLED_MODEL if model.strip().lower() in BUNDLED_ALIASES else model


def shipped_drafter(model: str) -> Path | None:
    """The drafter directory shipped for `model`, or None when there is none."""
    name = _SHIPPED.get(_canonical(model))
    path = DRAFTER_ROOT / name if name else None
    return path if path is not None and (path / "config.json").is_file() else None


def default_speculation(model: str) -> str | None:
    """vLLM speculative method `up` uses for `model` by default; None = plain decoding."""
    return DEFAULT_SPECULATION.get(_canonical(model))


def mask_token_id_for(model: str, tokenizer) -> int:
    """Mask token for a new drafter: a known unused special token, else the tokenizer's mask."""
    known = _MASK_TOKEN_IDS.get(_canonical(model))
    if known is not None:
        return known
    if getattr(tokenizer, "mask_token_id", None) is not None:
        return int(tokenizer.mask_token_id)
    raise ValueError(
        f"no mask token known for {model!r}: pass a drafter trained for it, or pick an unused "
        "special token id for the drafter config"
    )
