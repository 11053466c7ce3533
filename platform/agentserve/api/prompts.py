"""Batched completion prompts. A /v1/completions `prompt` is one prompt (a string or a
token-id list) or several (a list of strings or a list of token-id lists), as in OpenAI's
API and vLLM's server. Each prompt's `n` choices run as engine requests of their own
(serve/fanout.py), so a batch is admitted, reserved and buffered as prompts x n choices;
choice `p * n + j` is prompt p's choice j (OpenAI's and vLLM's order).

Functions of a parsed body or an admission view (admission/admit_first.py); check_prompts
raises the 400s a bad batch gets at the ingress (api/openai.py).
"""

from __future__ import annotations

from typing import Any

from agentserve.api.errors import InvalidRequestError

__all__ = ["MAX_BATCH_CHOICES", "MAX_PROMPTS", "check_prompts", "prompts_of"]
__all__ += ["split_prompts"]

# A batch's prompts, and its prompts x n, at most: every choice is one engine request and
# one place in the model's queue and a slot toward its replicas (admission/priority.py: a
# request needing more slots than a replica has waits for it to drain), and a stream's
# first chunk waits for every choice's first token (serve/fanout.py).
MAX_PROMPTS = 16
MAX_BATCH_CHOICES = 16


def split_prompts(prompt: Any) -> list[Any]:
    """The single prompts of a completion `prompt`: [] when it holds none."""
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        return []
    if isinstance(prompt[0], int) and not isinstance(prompt[0], bool):
        return [prompt]
    return list(prompt)


def prompts_of(kind: str, body: Any) -> list[Any] | None:
    """A completion body's single prompts; None for any other kind of request."""
    if kind != "completion":
        return None
    return split_prompts(getattr(body, "prompt", None))


def check_prompts(prompts: list[Any], n: int) -> None:
    """400 for a completion with no prompt, an empty token list, an empty prompt in a
    batch, or a batch past MAX_PROMPTS or MAX_BATCH_CHOICES (prompts x n)."""
    if not prompts:
        raise InvalidRequestError(
            "'prompt' must be a string, a token list, or a non-empty list of either.",
            param="prompt",
        )
    if any(isinstance(p, list) and not p for p in prompts) or (
        len(prompts) > 1 and not all(prompts)
    ):
        raise InvalidRequestError(
            "A token-list prompt, and each prompt of a batch, must be non-empty.", param="prompt"
        )
    if len(prompts) > MAX_PROMPTS:
        raise InvalidRequestError(
            f"'prompt' holds {len(prompts)} prompts; at most {MAX_PROMPTS} are taken in one "
            "request (send the rest in further requests: they run concurrently).",
            param="prompt",
        )
    if len(prompts) * n > MAX_BATCH_CHOICES:
        raise InvalidRequestError(
            f"{len(prompts)} prompts x n={n} is {len(prompts) * n} completions; at most "
            f"{MAX_BATCH_CHOICES} are taken in one request.",
            param="n",
        )
