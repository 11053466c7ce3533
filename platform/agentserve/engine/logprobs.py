"""Output-token log probabilities: one internal form, vLLM's two OpenAI shapes in and out.

Internal form (Delta.logprobs): a tuple with one dict per output token, OpenAI's chat
form whichever API the request came by:
    {"token": str, "logprob": float | None, "bytes": list[int] | None,
     "top_logprobs": [{"token": str, "logprob": float, "bytes": list[int] | None}] | None}
`logprob` None: the engine reported none for that token (vLLM's completion form has
nulls there); `top_logprobs` None: likewise (a chat answer then has []).

vLLM's SSE chunks carry `choices[i].logprobs` as
- chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}
  (top_logprobs: the first `top_logprobs` of the step's candidates, sampled one first);
- completion: {"text_offset": [...], "token_logprobs": [...], "tokens": [...],
  "top_logprobs": [{token: logprob, ...} | None, ...]} (up to `logprobs` + 1 entries).
A request continued on another replica (serve/migrate.py) may come back in the
completion form although the client asked by chat: `trim` keeps the chat count.
"""

from __future__ import annotations

from typing import Any

__all__ = ["from_vllm", "to_chat", "to_completion", "trim"]

Entry = dict[str, Any]
NO_LOGPROB = -9999.0  # what vLLM's chat form reports for a token without one


def from_vllm(kind: str, logprobs: dict[str, Any] | None) -> list[Entry]:
    """A vLLM chunk's `choices[i].logprobs` (chat or completion form) -> internal entries."""
    if not logprobs:
        return []
    if kind == "chat":
        return [
            {
                "token": e.get("token", ""),
                "logprob": e.get("logprob"),
                "bytes": e.get("bytes"),
                "top_logprobs": [_top(t) for t in e.get("top_logprobs") or ()],
            }
            for e in logprobs.get("content") or ()
        ]
    tokens = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or []
    out = []
    for i, token in enumerate(tokens):
        top = tops[i] if i < len(tops) else None
        out.append(
            {
                "token": token,
                "logprob": values[i] if i < len(values) else None,
                "bytes": None,
                "top_logprobs": None
                if top is None
                else [{"token": t, "logprob": v, "bytes": None} for t, v in top.items()],
            }
        )
    return out


def _top(t: dict[str, Any]) -> Entry:
    return {"token": t.get("token", ""), "logprob": t.get("logprob"), "bytes": t.get("bytes")}


def trim(entries: list[Entry], top: int) -> list[Entry]:
    """Entries with at most `top` alternatives each (a chat request's top_logprobs)."""
    return [
        e if e["top_logprobs"] is None or len(e["top_logprobs"]) <= top
        else {**e, "top_logprobs": e["top_logprobs"][:top]}
        for e in entries
    ]  # fmt: skip


def _bytes(token: str, given: list[int] | None) -> list[int]:
    return given if given is not None else list(token.encode("utf-8", errors="replace"))


def to_chat(entries: tuple[Entry, ...] | list[Entry]) -> dict[str, Any]:
    """OpenAI chat `logprobs`: {"content": [...]}."""
    content = []
    for e in entries:
        tops = e["top_logprobs"] or ()
        content.append(
            {
                "token": e["token"],
                "logprob": NO_LOGPROB if e["logprob"] is None else e["logprob"],
                "bytes": _bytes(e["token"], e["bytes"]),
                "top_logprobs": [
                    {
                        "token": t["token"],
                        "logprob": NO_LOGPROB if t["logprob"] is None else t["logprob"],
                        "bytes": _bytes(t["token"], t["bytes"]),
                    }
                    for t in tops
                ],
            }
        )
    return {"content": content}


def to_completion(entries: tuple[Entry, ...] | list[Entry], offset: int = 0) -> dict[str, Any]:
    """OpenAI completion `logprobs`, text offsets counted from `offset` (the characters of
    this choice's earlier tokens)."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
    return {
        "text_offset": offsets,
        "token_logprobs": [e["logprob"] for e in entries],
        "tokens": [e["token"] for e in entries],
        "top_logprobs": [
            None if e["top_logprobs"] is None
            else {t["token"]: t["logprob"] for t in e["top_logprobs"]}
            for e in entries
        ],
    }  # fmt: skip
