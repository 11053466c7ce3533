"""Served workloads of different copy rates, each split into a tuning and a reporting half.

Every prompt is built from functions of the held-out third-party packages
(dflash.train.code_prompts.HELDOUT_PACKAGES: no drafter training prompt uses them; never
HumanEval or the standard library). The kinds differ in how much of the answer the prompt
already holds, which is what decides between n-gram, DFlash and plain decoding:

- "write": a function's signature and the first paragraph of its docstring, asking for the
  body. The answer is new code: little to copy (DFlash's case).
- "edit": a whole function and an edit that keeps most of it (type hints, a docstring,
  renamed locals, input checks). The answer repeats the prompt (n-gram's case).
- "explain": a whole function, asking for prose about it with no code. Names are copied,
  sentences are not.

`half_of` splits by a fixed rule, a hash of the function's dotted name: a function is in
the same half in every workload, so nothing tuned on one half is reported on the other.
Choices (method, k, schedule, dtype, fits) read "tune"; docs report "report".
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache
from typing import Any

__all__ = ["HALVES", "KINDS", "half_of", "kind_messages", "text_half"]

HALVES = ("tune", "report")
KINDS = ("write", "edit", "explain")

_EDITS = (
    "Add type hints to this function and return the whole updated function.",
    "Write a docstring for this function and return the whole function with it.",
    "Rename the local variables in this function to clearer names and return the code.",
    "Rewrite this function so it raises a ValueError with a clear message on invalid input. "
    "Return the whole function.",
    "Add a comment above each non-trivial line of this function and return the code.",
)
_EXPLAIN = (
    "Explain in plain prose (no code) what `{name}` from `{module}` does: its "
    "arguments, what it returns and when it fails.",
    "A colleague asks what `{name}` in `{module}` is for. Answer in two short paragraphs of "
    "prose (no code): the problem it solves and how it goes about it.",
)


def half_of(key: str) -> str:
    """ "tune" or "report" for a function's dotted name (or any text), by a fixed rule: the
    parity of the first byte of its SHA-1. Pure and stable across runs and machines."""
    return HALVES[hashlib.sha1(key.encode()).digest()[0] % 2]


def text_half(messages: list[dict[str, Any]]) -> str:
    """The half of a conversation with no single source function (the older "coding" and
    "agent" workloads): by the text of its last message."""
    return half_of(str(messages[-1].get("content", "")))


def _fence(code: str) -> str:
    return f"```python\n{code}\n```"


def _signature(source: str) -> str | None:
    """A function's decorators and `def` line(s) up to the colon that opens its body (None
    when that takes more than 8 lines)."""
    lines: list[str] = []
    in_def = False
    for line in source.splitlines()[:8]:
        lines.append(line)
        in_def = in_def or line.lstrip().startswith(("def ", "async def "))
        if in_def and line.split("#")[0].rstrip().endswith(":"):
            return "\n".join(lines)
    return None


def _write(snippet: Any, rng: random.Random) -> str | None:
    summary = (snippet.doc or "").strip().split("\n\n")[0].strip()
    signature = _signature(snippet.source)
    if len(summary) < 20 or signature is None:
        return None
    return (
        f"Write the Python function below for the module `{snippet.module}`. What it does: "
        f"{summary}\n\nReply with the complete function only.\n\n{_fence(signature)}"
    )


def _edit(snippet: Any, rng: random.Random) -> str:
    return f"{rng.choice(_EDITS)}\n\n{_fence(snippet.source)}"


def _explain(snippet: Any, rng: random.Random) -> str:
    ask = rng.choice(_EXPLAIN).format(name=snippet.name, module=snippet.module)
    return f"{ask}\n\n{_fence(snippet.source)}"


_BUILDERS = {"write": _write, "edit": _edit, "explain": _explain}


@lru_cache(maxsize=4)
def _snippets(seed: int) -> tuple[Any, ...]:
    from dflash.train.code_prompts import HELDOUT_PACKAGES, StdlibIndex, collect_snippets

    return tuple(collect_snippets(HELDOUT_PACKAGES, StdlibIndex(), per_package=60, seed=seed))


def kind_messages(
    kind: str, n: int, half: str | None, seed: int = 10_000, snippets: Any = None
) -> list[list[dict[str, str]]]:
    """`n` one-message conversations of `kind` from the functions of `half` (None: both), in
    a seeded order; `snippets` (CodeSnippet-like: module, name, source, doc) defaults to the
    held-out packages' functions. Raises ValueError when fewer than `n` can be built."""
    if kind not in _BUILDERS:
        raise ValueError(f"unknown workload kind {kind!r}; choose from {', '.join(KINDS)}")
    if half not in (None, *HALVES):
        raise ValueError(f"unknown half {half!r}; choose from {', '.join(HALVES)}")
    pool = list(_snippets(seed) if snippets is None else snippets)
    rng = random.Random(f"{seed}-{kind}")
    rng.shuffle(pool)
    out: list[list[dict[str, str]]] = []
    for snippet in pool:
        if len(out) >= n:
            break
        if half is not None and half_of(f"{snippet.module}.{snippet.name}") != half:
            continue
        text = _BUILDERS[kind](snippet, rng)
        if text is not None:
            out.append([{"role": "user", "content": text}])
    if len(out) < n:
        raise ValueError(f"only {len(out)} {kind} prompts in half {half!r}, {n} asked")
    return out
