"""argparse `type=` parsers shared by the `agentserve bench` commands: comma lists."""

from __future__ import annotations

__all__ = ["floats", "ints"]


def ints(text: str) -> list[int]:
    """Comma list of integers, "1,4,16" -> [1, 4, 16]; empty items are skipped."""
    return [int(x) for x in text.split(",") if x.strip()]


def floats(text: str) -> list[float]:
    """Comma list of numbers, "0,0.7" -> [0.0, 0.7]; empty items are skipped."""
    return [float(x) for x in text.split(",") if x.strip()]
