"""DFlash drafters shipped with agentserve, and how to pick one for a model.

The package holds the drafters themselves as data: one directory per drafter beside this
file (weights, config, card, its dflash.py), shipped by pyproject's package-data.
"""

from __future__ import annotations

from pathlib import Path

from agentserve import profiles
from agentserve.profiles import Speculation
from agentserve.sources.models import BUNDLED_ALIASES, BUNDLED_MODEL

__all__ = [
    "BUNDLED_DRAFTER_DIR",
    "DRAFTER_ROOT",
    "default_dtype",
    "default_speculation",
    "default_speculation_reason",
    "default_speculation_tokens",
    "has_served_speculation",
    "machine_class",
    "mask_token_id_for",
    "shipped_drafter",
]

DRAFTER_ROOT = Path(__file__).parent
BUNDLED_DRAFTER_DIR = DRAFTER_ROOT / f"{BUNDLED_MODEL}-dflash"
"""Where the bundled model's drafter ships (and where train-drafter writes it)."""
_SHIPPED = {BUNDLED_MODEL: BUNDLED_DRAFTER_DIR.name}
# SmolLM2's `<empty_output>`: a special token chat never produces; the drafter's mask slot.
_MASK_TOKEN_IDS = {BUNDLED_MODEL: 16}


def _canonical(model: str) -> str:
    return BUNDLED_MODEL if model.strip().lower() in BUNDLED_ALIASES else model


def shipped_drafter(model: str) -> Path | None:
    """The drafter directory shipped for `model`, or None when there is none."""
    name = _SHIPPED.get(_canonical(model))
    path = DRAFTER_ROOT / name if name else None
    return path if path is not None and (path / "config.json").is_file() else None


def machine_class() -> str:
    """The kind of machine defaults are chosen for: "cuda" with a GPU, else the CPU class."""
    from agentserve.engine.cpu_info import read_cpu_info

    if any(Path(dev).exists() for dev in ("/dev/nvidiactl", "/dev/nvidia0")):
        return "cuda"  # cheap: `up --help` must not import torch to say its default
    return read_cpu_info().cpu_class


def _served_default(model: str, machine: str | None) -> tuple[str, Speculation | None]:
    """(machine, the default speculation `agentserve bench speculative-served` measured
    for `model` there: its profile's speculation section, None where not measured)."""
    machine = machine or machine_class()
    measured = profiles.section(machine, "speculation") or {}
    return machine, measured.get(_canonical(model))


def has_served_speculation(model: str, machine: str | None = None) -> bool:
    """Whether the served figures of this kind of machine decide `model`'s speculation."""
    return _served_default(model, machine)[1] is not None


def default_speculation(model: str, machine: str | None = None) -> str | None:
    """vLLM speculative method `up` uses for `model` by default on this kind of machine
    (`machine`: a cpu_class or "cuda"; default: this machine's), the one its profile
    records as fastest through the server; None = plain decoding (also where a kind of
    machine has no served figures: a choice made on one machine is not applied to another)."""
    measured = _served_default(model, machine)[1]
    return None if measured is None else measured.method


def default_speculation_tokens(model: str, machine: str | None = None) -> int | None:
    """num_speculative_tokens of the default method, as measured; None: the spec's own."""
    measured = _served_default(model, machine)[1]
    return None if measured is None else measured.num_speculative_tokens


def default_dtype(model: str, machine: str | None = None) -> str | None:
    """The dtype `up` serves `model` in on this kind of machine where the spec leaves it
    unset, as measured through the server; None: the spec's own."""
    measured = _served_default(model, machine)[1]
    return None if measured is None else measured.dtype


def default_speculation_reason(model: str, machine: str | None = None) -> str:
    """Why `default_speculation` chose what it chose, for `agentserve up` to say."""
    machine, measured = _served_default(model, machine)
    if measured is None:
        return (
            f"no served speculation figures for this kind of machine ({machine}) yet, so plain "
            "decoding (never slower than itself); measure with `agentserve bench "
            "speculative-served` or choose with --speculation"
        )
    if measured.method is None:
        return (
            f"on this kind of machine ({machine}) no speculative method was faster than plain "
            "decoding through the server (docs/benchmarks.md, served table); --speculation "
            "ngram|dflash turns one on"
        )
    return (
        f"{measured.method} measured fastest through the server on this kind of machine ({machine})"
    )


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
