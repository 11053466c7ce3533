"""The request as the platform reads it: one frozen `Ask` per chat or text completion,
built once at the edge from the parsed body (`ask_of`) or, for a body admitted before its
validation (admission/admit_first.py), from a few fields of its decoded JSON
(`ask_of_data`). Admission, budgets, dispatch, affinity and spans read the Ask; the parsed
body rides along unchanged as `payload`, the engine request's body (vLLM's OpenAI model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentserve.api.prompts import MAX_BATCH_CHOICES, MAX_PROMPTS, split_prompts
from agentserve.api.validate import MAX_CHOICES
from agentserve.engine.protocol import RequestKind, output_limit

__all__ = ["SPAN_PARAMS", "Ask", "ask_of", "ask_of_data"]

# The GenAI request parameters the ingress span records when the client set them
# (serve/spans.py); "max_tokens" is the output limit, whichever field set it.
SPAN_PARAMS = ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty", "stop")


@dataclass(frozen=True)
class Ask:
    """What one request asks for. `prompts`: a completion's single prompts (api/prompts.py),
    None for chat; `messages`: a chat request's. `output_limit`: max_completion_tokens or
    max_tokens (None: the rest of the context). `tools_chars`: an admission view's body size
    standing in for its tools' text (else `tools` are counted). `params`: the SPAN_PARAMS and
    max_tokens the client set. `payload`: the validated body (None for an admission view)."""

    kind: RequestKind
    model: str
    n: int = 1
    messages: tuple[Any, ...] = ()
    prompts: tuple[Any, ...] | None = None
    output_limit: int | None = None
    tools: tuple[Any, ...] = ()
    tools_chars: int | None = None
    stream: bool = False
    include_usage: bool = False
    logprobs_per_token: int = 0  # log-probability entries per output token (0: none)
    cache_salt: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    payload: Any = None

    @property
    def choices(self) -> int:
        """The engine requests it runs: prompts x n (n alone for chat)."""
        return self.n * max(1, len(self.prompts)) if self.prompts is not None else self.n

    @property
    def first_prompt(self) -> Any:
        """A completion's prompt, or a batch's first; None for chat or no prompt."""
        return self.prompts[0] if self.prompts else None


def ask_of(kind: RequestKind, body: Any) -> Ask:
    """The Ask of a validated chat or completion body (api/openai.py parse_request)."""
    given = body.model_fields_set
    params = {name: getattr(body, name) for name in SPAN_PARAMS if name in given}
    if {"max_tokens", "max_completion_tokens"} & given:
        params["max_tokens"] = output_limit(kind, body)
    options = body.stream_options
    return Ask(
        kind=kind,
        model=body.model,
        n=body.n or 1,
        messages=tuple(body.messages) if kind == "chat" else (),
        prompts=tuple(split_prompts(body.prompt)) if kind == "completion" else None,
        output_limit=output_limit(kind, body),
        tools=tuple(body.tools or ()) if kind == "chat" else (),
        stream=bool(body.stream),
        include_usage=bool(body.stream and options and options.include_usage),
        logprobs_per_token=_logprobs_per_token(kind, body),
        cache_salt=body.cache_salt,
        params=params,
        payload=body,
    )


def _logprobs_per_token(kind: RequestKind, body: Any) -> int:
    if kind == "chat":
        return 1 + (body.top_logprobs or 0) if body.logprobs else 0
    return 0 if body.logprobs is None else 1 + body.logprobs


def ask_of_data(kind: RequestKind, data: Any, body_bytes: int = 0) -> Ask | None:
    """The Ask admission reads, from a decoded body not yet validated; None when a field
    it reads has a type the validation will refuse (then it runs first and names the
    field). The tools' size for the token estimate is the body's (`body_bytes`):
    serializing 128 tool schemas again on the event loop would cost milliseconds."""
    if not isinstance(data, dict):
        return None
    model, n = data.get("model"), data.get("n")
    if not isinstance(model, str) or not model:
        return None
    if n is not None and not (_int(n) and 1 <= n <= MAX_CHOICES):
        return None
    limits = [data.get(k) for k in ("max_completion_tokens", "max_tokens")]
    if not all(v is None or (_int(v) and v >= 1) for v in limits):
        return None
    tools = data.get("tools")
    if tools is not None and not isinstance(tools, list):
        return None
    fields: dict[str, Any] = {"model": model, "n": n or 1, "output_limit": limits[0] or limits[1]}
    fields |= {"tools": tuple(tools), "tools_chars": body_bytes} if tools else {}
    if kind == "chat":
        if not isinstance(data.get("messages"), list):
            return None
        return Ask(kind, messages=tuple(data["messages"]), **fields)
    prompt = data.get("prompt")
    if not isinstance(prompt, (str, list)):
        return None
    prompts = split_prompts(prompt)
    if len(prompts) > MAX_PROMPTS or len(prompts) * (n or 1) > MAX_BATCH_CHOICES:
        return None  # validation's 400, not a place in the queue it will never use
    return Ask(kind, prompts=tuple(prompts), **fields)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
