"""DFlash drafters shipped with agentserve, and how to pick one for a model."""

from __future__ import annotations

from pathlib import Path

from agentserve.models import BUNDLED_ALIASES, BUNDLED_MODEL

__all__ = ["DRAFTER_ROOT", "mask_token_id_for", "shipped_drafter"]

DRAFTER_ROOT = Path(__file__).parent / "drafters"
_SHIPPED = {BUNDLED_MODEL: "smollm2-135m-instruct-dflash"}
# SmolLM2's `<empty_output>`: a special token chat never produces; the drafter's mask slot.
_MASK_TOKEN_IDS = {BUNDLED_MODEL: 16}


def _canonical(model: str) -> str:
    return BUNDLED_MODEL if model.strip().lower() in BUNDLED_ALIASES else model


def shipped_drafter(model: str) -> Path | None:
    """The drafter directory shipped for `model`, or None when there is none."""
    name = _SHIPPED.get(_canonical(model))
    path = DRAFTER_ROOT / name if name else None
    return path if path is not None and (path / "config.json").is_file() else None


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
