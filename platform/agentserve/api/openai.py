"""OpenAI request validation and response shaping, on vLLM's OpenAI protocol models.

Requests are parsed into vLLM's ChatCompletionRequest / CompletionRequest (the same
models vLLM's serving layer consumes in the replica), plus the edge checks we need
before a request is queued. Engine deltas become OpenAI JSON (non-stream) or chunk
payloads (stream) through ResponseBuilder.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError
from vllm.entrypoints.generate.base.protocol import DeltaMessage, DeltaToolCall, ToolCall
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from vllm.entrypoints.serve.engine.protocol import PromptTokenUsageInfo, UsageInfo
from vllm.exceptions import VLLMClientError

from agentserve.api.errors import InvalidRequestError
from agentserve.api.json_types import check_json_types
from agentserve.api.limits import check_list_limits, check_structured_limits
from agentserve.api.prompts import check_prompts, split_prompts
from agentserve.api.validate import (
    MAX_CHOICES,
    Checkpoint,
    SchemaCache,
    check_context,
    check_sampling,
    check_schemas,
    check_sizes,
    check_tool_limits,
    check_values,
    deadline_checkpoint,
    param_path,
    requested_max_tokens,
)
from agentserve.engine.logprobs import to_chat, to_completion
from agentserve.engine.protocol import Delta, RequestKind, cached_prompt_tokens

__all__ = ["ResponseBuilder", "parse_request"]

_MODELS = {"chat": ChatCompletionRequest, "completion": CompletionRequest}


def parse_request(
    kind: RequestKind,
    data: Any,
    max_model_len: Mapping[str, int] | None = None,
    *,
    schema_cache: SchemaCache | None = None,
    deadline: float | None = None,
    checkpoint: Checkpoint | None = None,
) -> ChatCompletionRequest | CompletionRequest:
    """Validate a decoded JSON body; raise InvalidRequestError (400) naming the parameter.

    `max_model_len` (model -> context tokens) adds the context checks for a served model;
    an unknown model passes here and is refused (404) at admission. `schema_cache` goes to
    check_schemas. `checkpoint()` (default: ValidationTimeoutError once time.monotonic()
    passes `deadline`) runs between the stages and inside the long walks, and the sizes
    that make the protocol model's one long call are capped before it (check_sizes), as
    are the lists engines walk at every step and structured-output constraints
    (api/limits.py).
    Thread-safe: the ingress runs it off its event loop for requests with schemas.
    """
    if not isinstance(data, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    checkpoint = checkpoint or deadline_checkpoint(deadline) or _no_checkpoint
    check_tool_limits(data)
    check_sizes(data)
    check_list_limits(data)  # api/limits.py: what engines walk at every step
    check_structured_limits(data)
    check_values(data, checkpoint)
    check_json_types(kind, data)
    checkpoint()
    if kind == "chat" and "messages" in data and not isinstance(data["messages"], list):
        # vLLM's before-validators iterate messages before pydantic checks its type
        raise InvalidRequestError(
            "Invalid messages: Input should be a valid list", param="messages"
        )
    try:
        request = _MODELS[kind].model_validate(data)
    except ValidationError as err:
        param, message = _first_error(err, data)
        raise InvalidRequestError(f"Invalid {param or 'body'}: {message}", param=param) from None
    except VLLMClientError as err:  # vLLM's own model validators raise these directly
        raise InvalidRequestError(str(err.args[0]), param=getattr(err, "parameter", None)) from None
    except ValueError as err:
        raise InvalidRequestError(str(err)) from None
    except (TypeError, KeyError, AttributeError, IndexError) as err:  # vLLM validator bugs
        raise InvalidRequestError(
            f"The request body does not fit the {kind} schema: {err}"
        ) from None
    if kind == "chat":
        _materialize_content(request)
    checkpoint()
    _check_edge(kind, request, data)
    check_schemas(data, schema_cache, checkpoint=checkpoint)
    context = (max_model_len or {}).get(request.model)
    if context is not None:
        check_context(kind, request, data, context)
    checkpoint()
    check_sampling(request, requested_max_tokens(data)[1] or context or 2**31 - 1)
    return request


def _no_checkpoint() -> None:
    pass


def _materialize_content(request: ChatCompletionRequest) -> None:
    """vLLM types a message's `content` as an Iterable of parts: what does not fit the list
    member stays a lazy pydantic iterator that has checked nothing (and cannot be pickled,
    so a Ray handle would fail on it with a 500). Iterate it here: its parts are validated
    now, and a bad one is a 400 naming the message."""
    for i, message in enumerate(request.messages):
        content = message.get("content") if isinstance(message, dict) else None
        if content is None or isinstance(content, (str, list)):
            continue
        param = f"messages[{i}].content"
        try:
            message["content"] = list(content)
        except ValidationError as err:
            error = err.errors(include_url=False)[0]
            part = next((f"[{p}]" for p in error["loc"] if isinstance(p, int)), "")
            text = f"Invalid {param}{part}: {error['msg']}"
            raise InvalidRequestError(text, param=param) from None
        except (TypeError, ValueError) as err:
            raise InvalidRequestError(f"Invalid {param}: {err}", param=param) from None


def _first_error(err: ValidationError, data: dict[str, Any]) -> tuple[str | None, str]:
    """(param path, message) of the most telling error. Pydantic reports each failed
    union member with its type as an extra `loc` part ('stop', 'str'); those parts are
    dropped; preferred are errors of members matching the sent JSON type, then errors on
    a value sent (not a missing field of another member), then not a literal mismatch."""
    best: tuple[int, str | None, str] | None = None
    for error in err.errors(include_url=False):
        path, mismatches, value = [], 0, data
        for i, part in enumerate(error["loc"]):
            if _has_key(value, part):
                path.append(part)
                value = value[part]
            elif error["type"] == "missing" and i == len(error["loc"]) - 1:
                path.append(part)
            else:  # a union member's tag, e.g. 'str', 'list[str]', 'function-after[...]'
                mismatches += not _tag_fits(str(part), value)
        score = 2 * mismatches + 3 * (error["type"] == "missing")
        score += error["type"] == "literal_error"
        if best is None or score < best[0]:
            best = (score, param_path(path), error["msg"])
    assert best is not None
    return best[1], best[2]


def _has_key(value: Any, part: str | int) -> bool:
    if isinstance(value, dict):
        return part in value
    return isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value)


def _tag_fits(tag: str, value: Any) -> bool:
    """Whether a union member tag names the JSON type of `value`."""
    if isinstance(value, str):
        return tag.startswith("str") or "literal" in tag
    if isinstance(value, list):
        return tag.startswith(("list", "tuple", "set", "generator", "iterable"))
    if isinstance(value, bool):
        return tag.startswith("bool")
    if isinstance(value, (int, float)):
        return tag.startswith(("int", "float", "constrained-int", "constrained-float"))
    if isinstance(value, dict):
        return not tag.startswith(("str", "list", "tuple", "int", "float", "bool", "literal"))
    return True


def _check_edge(kind: RequestKind, request: Any, data: dict[str, Any]) -> None:
    """Checks vLLM defers to sampling time, made here so no bad request is queued."""
    if not isinstance(data.get("model"), str) or not data["model"]:
        raise InvalidRequestError("You must provide a model parameter.", param="model")
    if kind == "chat" and not request.messages:
        raise InvalidRequestError("'messages' must contain at least one message.", param="messages")
    n = 1 if request.n is None else request.n
    if not 1 <= n <= MAX_CHOICES:
        raise InvalidRequestError(f"'n' must be between 1 and {MAX_CHOICES}.", param="n")
    if kind == "completion":
        check_prompts(split_prompts(request.prompt), n)
    if n > 1 and getattr(request, "use_beam_search", False):
        raise InvalidRequestError(
            "'use_beam_search' is not supported with n > 1.", param="use_beam_search"
        )
    if kind == "completion" and request.echo and request.logprobs is not None:
        raise InvalidRequestError(
            "'echo' with 'logprobs' is not supported: prompt log probabilities are not "
            "returned by this server.",
            param="echo",
            code="unsupported_parameter",
        )
    _check_refused(data)
    temperature, top_p = request.temperature, request.top_p
    if temperature is not None and not 0 <= temperature <= 2:
        raise InvalidRequestError("'temperature' must be in [0, 2].", param="temperature")
    if top_p is not None and not 0 < top_p <= 1:
        raise InvalidRequestError("'top_p' must be in (0, 1].", param="top_p")
    limit_name = requested_max_tokens(data)[0]
    limit = data.get(limit_name)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise InvalidRequestError(f"'{limit_name}' must be a positive integer.", param=limit_name)
    if request.stream_options is not None and not request.stream:
        raise InvalidRequestError("'stream_options' needs 'stream': true.", param="stream_options")


# (field, refused when) -> why: fields the engine would act on that a client must not set
_REFUSED: tuple[tuple[str, Any, str], ...] = (
    ("chat_template", lambda v: v is not None,
     "a request-supplied chat template is not accepted; the model's own template is used"),
    ("priority", lambda v: v not in (None, 0),
     "scheduling priority is set by the server, not by clients"),
    ("prompt_logprobs", lambda v: v is not None,
     "prompt log probabilities are not returned by this server"),
    ("logprob_token_ids", lambda v: bool(v),
     "log probabilities of chosen token ids are not returned; use 'top_logprobs'"),
)  # fmt: skip


def _check_refused(data: dict[str, Any]) -> None:
    """400 (code unsupported_parameter) for the _REFUSED fields, so such a request never
    reaches a replica (and logprobs are refused, not silently dropped)."""
    for name, refused, why in _REFUSED:
        if name in data and refused(data[name]):
            raise InvalidRequestError(
                f"'{name}' is not supported: {why}.", param=name, code="unsupported_parameter"
            )


def _tool_calls_from_deltas(deltas: Iterable[dict[str, Any]]) -> list[ToolCall]:
    """Merge streamed tool-call deltas by index (arguments concatenate), as clients do."""
    merged: dict[int, dict[str, Any]] = {}
    for d in deltas:
        call = merged.setdefault(d.get("index", 0), {"id": None, "name": "", "arguments": ""})
        call["id"] = d.get("id") or call["id"]
        function = d.get("function") or {}
        call["name"] += function.get("name") or ""
        call["arguments"] += function.get("arguments") or ""
    return [
        ToolCall(
            **({"id": c["id"]} if c["id"] else {}),
            function={"name": c["name"], "arguments": c["arguments"]},
        )
        for _, c in sorted(merged.items())
    ]


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> UsageInfo:
    """OpenAI's usage, with `prompt_tokens_details.cached_tokens` (as OpenAI reports it:
    always, 0 when nothing was cached)."""
    cached = cached_prompt_tokens(prompt_tokens, cached_tokens)
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=cached),
    )


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True)


class ResponseBuilder:
    """Shapes one request's deltas into OpenAI objects (id, model, created fixed per
    request); `n` choices, each delta's `index` naming its choice."""

    def __init__(
        self, kind: RequestKind, request_id: str, model: str, include_usage: bool, n: int = 1
    ):
        self.kind = kind
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + request_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self.n = n
        self._offsets = [0] * n  # completion logprobs: characters of each choice's tokens

    def first_chunk(self) -> dict[str, Any] | None:
        """The chat stream's opening chunk (role only, every choice); None for completions."""
        if self.kind != "chat":
            return None
        choices = [
            ChatCompletionResponseStreamChoice(
                index=i, delta=DeltaMessage(role="assistant", content="")
            )
            for i in range(self.n)
        ]
        return self._chunk(choices)

    def chunk(self, delta: Delta) -> dict[str, Any]:
        """One stream chunk for `delta`."""
        if self.kind == "chat":
            message = DeltaMessage(
                content=delta.text or None,
                reasoning=delta.reasoning or None,
                tool_calls=[DeltaToolCall(**t) for t in delta.tool_calls],
            )
            choice = ChatCompletionResponseStreamChoice(
                index=delta.index, delta=message, finish_reason=delta.finish_reason
            )
        else:
            choice = CompletionResponseStreamChoice(
                index=delta.index, text=delta.text, finish_reason=delta.finish_reason
            )
        chunk = self._chunk([choice])
        if delta.logprobs:
            chunk["choices"][0]["logprobs"] = self._logprobs(delta.index, delta.logprobs)
        return chunk

    def _logprobs(self, index: int, entries: Any) -> dict[str, Any]:
        if self.kind == "chat":
            return to_chat(entries)
        rendered = to_completion(entries, self._offsets[index])
        self._offsets[index] += sum(len(e["token"]) for e in entries)
        return rendered

    def usage_chunk(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
    ) -> dict[str, Any]:
        """The last stream chunk when include_usage: no choices, the usage."""
        return self._chunk([], usage=_usage(prompt_tokens, completion_tokens, cached_tokens))

    def _chunk(self, choices: list[Any], usage: UsageInfo | None = None) -> dict[str, Any]:
        cls = ChatCompletionStreamResponse if self.kind == "chat" else CompletionStreamResponse
        chunk = _dump(
            cls(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)
        )
        if self.include_usage and usage is None:
            chunk["usage"] = None  # OpenAI: every chunk carries usage, null until the last
        return chunk

    def final(self, deltas: list[Delta]) -> dict[str, Any]:
        """The non-stream response: all deltas of the request merged, per choice. Token
        counts are the request's (the largest seen: a fan-out's sum over choices)."""
        usage = _usage(
            max(d.prompt_tokens for d in deltas),
            max(d.completion_tokens for d in deltas),
            max(d.cached_tokens for d in deltas),
        )
        by_choice: dict[int, list[Delta]] = {}
        for d in deltas:
            by_choice.setdefault(d.index, []).append(d)
        grouped = sorted(by_choice.items())
        choices = [self._choice(i, ds) for i, ds in grouped]
        cls = ChatCompletionResponse if self.kind == "chat" else CompletionResponse
        body = _dump(
            cls(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)
        )
        for choice, (_, ds) in zip(body["choices"], grouped, strict=True):
            if self.kind == "chat":
                choice["message"].setdefault("content", None)
            entries = [e for d in ds for e in d.logprobs]
            if entries:
                choice["logprobs"] = (
                    to_chat(entries) if self.kind == "chat" else to_completion(entries)
                )
        return body

    def _choice(self, index: int, deltas: list[Delta]) -> Any:
        text = "".join(d.text for d in deltas)
        finish = deltas[-1].finish_reason
        if self.kind == "completion":
            return CompletionResponseChoice(index=index, text=text, finish_reason=finish)
        calls = _tool_calls_from_deltas(t for d in deltas for t in d.tool_calls)
        reasoning = "".join(d.reasoning for d in deltas) or None
        message = ChatMessage(
            role="assistant", content=text or None, tool_calls=calls, reasoning=reasoning
        )
        return ChatCompletionResponseChoice(index=index, message=message, finish_reason=finish)
