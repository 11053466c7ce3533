"""Edge checks on an OpenAI request that vLLM's protocol models leave to the engine or to
sampling time, made at the ingress so a bad request never reaches a replica and gets the
same 400 with the fake engine as with vLLM.

- check_values: on the decoded JSON, before the protocol model: every number finite (JSON
  has no NaN/Infinity, Python's parser accepts them), every string valid Unicode (no
  unpaired surrogates from `\\ud800` escapes), nesting at most MAX_DEPTH levels;
- check_sampling: vLLM's own SamplingParams checks (penalties, top_k, min_p, stop, ...);
- check_context: max_tokens and token-id prompts against the model's context length
  (text prompts are tokenized, and so checked, by the engine);
- check_tool_limits: at most MAX_TOOLS tools (cheap: run on the event loop);
- check_sizes: at most MAX_MESSAGES messages and MAX_CONTENT_PARTS content parts, so the
  protocol model's validation (one call that holds the GIL: ~10 us per part) stays short;
- check_schemas: tool names, tool parameter schemas, response_format json_schema and the
  structured-output schemas (api/limits.py) must be valid JSON Schema, together at most
  MAX_SCHEMA_BYTES; top_logprobs at most
  MAX_LOGPROBS. Meta-validating a schema costs milliseconds, so results are kept in a
  SchemaCache (by SHA-256 of the canonical JSON) and a `deadline` bounds the work; the
  ingress runs it off its event loop (admission/parsing.py), one cache per tenant.

The long walks call a `checkpoint` (every CHECK_EVERY values, before each uncached schema):
the ingress's raises ValidationTimeoutError past the request's deadline and lets another
tenant's validation take its turn (admission/fair_gate.py).

Error `param`s are OpenAI-style paths: `messages[0].content`, `tools[1].function.name`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from vllm.exceptions import VLLMClientError

from agentserve.api.errors import InvalidRequestError
from agentserve.api.limits import (
    MAX_SCHEMA_BYTES,
    has_structured_outputs,
    schemas_too_large,
    structured_schemas,
)
from agentserve.api.prompts import prompts_of
from agentserve.api.schema_check import SchemaTimeoutError
from agentserve.api.schema_check import schema_error as _schema_error

__all__ = [
    "MAX_CHOICES",
    "MAX_DEPTH",
    "MAX_LOGPROBS",
    "MAX_SCHEMA_BYTES",
    "MAX_TOOLS",
    "SchemaCache",
    "ValidationTimeoutError",
    "all_cached",
    "check_context",
    "check_sampling",
    "check_schemas",
    "check_sizes",
    "check_tool_limits",
    "check_values",
    "deadline_checkpoint",
    "has_schemas",
    "param_path",
]

MAX_DEPTH = 64  # JSON nesting levels; tool schemas rarely pass 10
MAX_LOGPROBS = 20  # vLLM's default max_logprobs and OpenAI's top_logprobs bound
MAX_CHOICES = 8  # n: each choice is one engine request (serve/fanout.py)
MAX_TOOLS = 128  # OpenAI's limit on tools per request
MAX_MESSAGES = 4096  # chat messages per request
MAX_CONTENT_PARTS = 8192  # content parts over all messages
SCHEMA_CACHE_ENTRIES = 4096
CHECK_EVERY = 4096  # JSON values walked between checkpoints
Checkpoint = Callable[[], None]
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")  # OpenAI's set plus '.' and ':' (MCP)


def param_path(loc: Sequence[str | int]) -> str | None:
    """('messages', 0, 'content') -> 'messages[0].content'; () -> None."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def deadline_checkpoint(deadline: float | None) -> Checkpoint | None:
    """A checkpoint raising ValidationTimeoutError once time.monotonic() > `deadline`."""
    if deadline is None:
        return None

    def checkpoint() -> None:
        if time.monotonic() > deadline:
            raise ValidationTimeoutError()

    return checkpoint


def check_values(data: Any, checkpoint: Checkpoint | None = None) -> None:
    """Reject non-finite numbers, unpaired surrogates and nesting past MAX_DEPTH;
    `checkpoint()` every CHECK_EVERY values. The walk keeps no paths (a 128-tool body is
    ~12,000 values: paths were most of its cost); a body that fails is walked again with
    paths, to name the value."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    walked = 0
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if not all(_fine(key) for key in value):
                _explain(data)
            items: Any = value.values()
        elif isinstance(value, list):
            items = value
        elif _fine(value):
            continue  # the body itself is a scalar
        else:
            _explain(data)
        if items and depth >= MAX_DEPTH:  # its items are past MAX_DEPTH levels
            _explain(data)
        walked += len(items)
        if checkpoint is not None and walked >= CHECK_EVERY:
            checkpoint()
            walked = 0
        for item in items:
            if isinstance(item, (dict, list)):
                stack.append((item, depth + 1))
            elif not _fine(item):
                _explain(data)


def _fine(value: Any) -> bool:
    """A scalar JSON can carry: finite if a float, valid Unicode if a string."""
    if isinstance(value, str):
        if value.isascii():
            return True
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    return not isinstance(value, float) or math.isfinite(value)


def _explain(data: Any) -> None:
    """Walk `data` with paths and raise the InvalidRequestError naming its first bad value."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise InvalidRequestError(
                f"The request body nests deeper than {MAX_DEPTH} levels (at "
                f"{param_path(path[:3])}...).",
                param=param_path(path[:1]),
            )
        if isinstance(value, float) and not math.isfinite(value):
            name = param_path(path)
            raise InvalidRequestError(
                f"'{name}' must be a finite number, got {value}: NaN and Infinity are not JSON.",
                param=name,
            )
        if isinstance(value, str):
            _check_text(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, (*path, key))
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))
    raise AssertionError("check_values found a bad value that _explain did not")


def _check_text(text: str, path: tuple[str | int, ...]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        name = param_path(path)
        raise InvalidRequestError(
            f"'{name}' is not valid Unicode: unpaired surrogate "
            f"\\u{ord(text[err.start]):04x} at character {err.start}.",
            param=name,
        ) from None


def check_sampling(request: Any, max_tokens: int) -> None:
    """Build vLLM's SamplingParams from the request (what the engine will do) and turn its
    validation errors into 400s naming the parameter."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            request.to_sampling_params(max_tokens, {})
    except (VLLMClientError, ValueError, TypeError) as err:
        message = str(err.args[0]) if err.args else str(err)
        param = getattr(err, "parameter", None) or _leading_field(message, request)
        raise InvalidRequestError(message, param=param) from None


def _leading_field(message: str, request: Any) -> str | None:
    """'presence_penalty must be in [-2, 2]' -> 'presence_penalty' when it is a field."""
    word = message.split(" ", 1)[0].strip("`'\":,.")
    return word if word in type(request).model_fields else None


def requested_max_tokens(data: dict[str, Any]) -> tuple[str, int | None]:
    """(the parameter's name, its value) of the output token limit a body asks for."""
    completion = data.get("max_completion_tokens") is not None
    name = "max_completion_tokens" if completion else "max_tokens"
    value = data.get(name)
    return name, value if isinstance(value, int) and not isinstance(value, bool) else None


def check_context(kind: str, request: Any, data: dict[str, Any], context: int) -> None:
    """400 (code context_length_exceeded) when max_tokens cannot fit the model's context,
    or a token-id prompt (completions) plus max_tokens exceeds it."""
    name, limit = requested_max_tokens(data)
    if limit is not None and limit >= context:
        raise InvalidRequestError(
            f"'{name}' is {limit}, but this model's maximum context length is {context} "
            f"tokens (prompt + output), so at most {context - 1} output tokens fit.",
            param=name,
            code="context_length_exceeded",
        )
    for prompt in prompts_of(kind, request) or []:  # each of a batch's prompts
        if not isinstance(prompt, list):
            continue
        needed = len(prompt) + (limit or 0)
        if len(prompt) >= context or needed > context:
            raise InvalidRequestError(
                f"This model's maximum context length is {context} tokens; the request has "
                f"{len(prompt)} prompt tokens and asks for {limit or 0} more.",
                param="prompt",
                code="context_length_exceeded",
            )


class ValidationTimeoutError(InvalidRequestError):
    """400: checking the request's schemas took longer than the ingress allows."""

    def __init__(self, limit_s: float | None = None):
        limit = "the ingress allows" if limit_s is None else f"{limit_s:g} s"
        super().__init__(
            f"Checking the request's JSON schemas took longer than {limit}; send fewer or "
            "simpler tool and response_format schemas.",
            param="tools",
            code="validation_timeout",
        )


class SchemaCache:
    """Thread-safe LRU of meta-validation results: SHA-256 of a schema's canonical JSON
    -> None (valid) or the SchemaError's message and path."""

    def __init__(
        self,
        entries: int = SCHEMA_CACHE_ENTRIES,
        checker: Callable[[dict, str], tuple[str, str] | None] | None = None,
    ):
        """`checker(schema, canonical_text)` meta-validates a schema not in the cache
        (default: in this thread; the ingress passes a SchemaProcess's check)."""
        self.entries = entries
        self.checker = checker
        self.hits = self.misses = 0
        self._results: OrderedDict[str, tuple[str, str] | None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, digest: object) -> bool:
        """Whether a result is kept (not counted as a hit or a miss, order unchanged)."""
        with self._lock:
            return digest in self._results

    def get(self, digest: str) -> tuple[bool, tuple[str, str] | None]:
        """(found, result)."""
        with self._lock:
            if digest not in self._results:
                self.misses += 1
                return False, None
            self.hits += 1
            self._results.move_to_end(digest)
            return True, self._results[digest]

    def put(self, digest: str, result: tuple[str, str] | None) -> None:
        with self._lock:
            self._results[digest] = result
            self._results.move_to_end(digest)
            while len(self._results) > self.entries:
                self._results.popitem(last=False)


def all_cached(data: dict[str, Any], cache: SchemaCache) -> bool:
    """Whether every tool and response_format schema of `data` has a result in `cache`
    (then checking them costs a hash each: cheap enough for the event loop). Never for a
    structured-output constraint: those are checked on their tenant's turns."""
    if has_structured_outputs(data):
        return False
    tools = data.get("tools") or []
    if not isinstance(tools, list):
        return False  # malformed: the full validation answers it with a 400
    schemas = [
        tool["function"].get("parameters")
        for tool in tools
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
    ]
    response_format = data.get("response_format")
    if isinstance(response_format, dict) and isinstance(response_format.get("json_schema"), dict):
        schemas.append(response_format["json_schema"].get("schema"))
    for schema in schemas:
        if schema is None:
            continue
        if not isinstance(schema, dict) or _digest(schema) not in cache:
            return False
    return True


def _digest(schema: dict) -> str:
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def check_tool_limits(data: dict[str, Any]) -> None:
    """400 (code too_many_tools) past MAX_TOOLS; O(1), safe on the event loop."""
    tools = data.get("tools")
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        raise InvalidRequestError(
            f"'tools' has {len(tools)} tools; at most {MAX_TOOLS} are accepted per request.",
            param="tools",
            code="too_many_tools",
        )


def check_sizes(data: dict[str, Any]) -> None:
    """400 past MAX_MESSAGES messages or MAX_CONTENT_PARTS content parts (O(messages))."""
    messages = data.get("messages")
    if not isinstance(messages, list):
        return
    if len(messages) > MAX_MESSAGES:
        raise InvalidRequestError(
            f"'messages' has {len(messages)} messages; at most {MAX_MESSAGES} are accepted "
            "per request.",
            param="messages",
            code="too_many_messages",
        )
    parts = 0
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        parts += len(content) if isinstance(content, list) else 1
        if parts > MAX_CONTENT_PARTS:
            raise InvalidRequestError(
                f"The messages have more than {MAX_CONTENT_PARTS} content parts (at "
                f"'messages[{i}].content'); send fewer, longer parts.",
                param=f"messages[{i}].content",
                code="too_many_content_parts",
            )


def has_schemas(data: dict[str, Any]) -> bool:
    """Whether the request carries tool, response_format or structured-output schemas
    or constraints to check (then it is validated on its tenant's turns)."""
    if bool(data.get("tools")) or isinstance(data.get("response_format"), dict):
        return True
    return has_structured_outputs(data)


def check_schemas(
    data: dict[str, Any],
    cache: SchemaCache | None = None,
    deadline: float | None = None,
    checkpoint: Checkpoint | None = None,
) -> None:
    """Tool names and parameter schemas, response_format's JSON Schema, the structured-output
    schemas (api/limits.py structured_schemas), top_logprobs.

    `checkpoint()` runs before each uncached schema (default: ValidationTimeoutError
    past `deadline`, time.monotonic()); `cache` skips schemas seen before."""
    check_tool_limits(data)
    found: list[tuple[Any, str, str]] = []  # (schema, param, what)
    for i, tool in enumerate(data.get("tools") or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            continue  # the protocol model reports a missing function
        where = f"tools[{i}].function"
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise InvalidRequestError(
                f"Invalid '{where}.name' {name!r}: tool names are 1-128 characters from "
                "a-z, A-Z, 0-9, '_', '-', '.' and ':'.",
                param=f"{where}.name",
            )
        if function.get("parameters") is not None:
            found.append((function["parameters"], f"{where}.parameters", f"tool {name!r}"))
    response_format = data.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        if isinstance(spec, dict) and spec.get("schema") is not None:
            found.append((spec["schema"], "response_format.json_schema.schema", "response_format"))
    found += structured_schemas(data)
    checkpoint = checkpoint or deadline_checkpoint(deadline)
    _check_all(found, cache or SchemaCache(0), checkpoint)
    for field in ("top_logprobs", "logprobs"):
        value = data.get(field)
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and not 0 <= value <= MAX_LOGPROBS
        ):
            raise InvalidRequestError(
                f"'{field}' is {value}; between 0 and {MAX_LOGPROBS} log probabilities per "
                "token are returned.",
                param=field,
            )


def _check_all(
    found: list[tuple[Any, str, str]], cache: SchemaCache, checkpoint: Checkpoint | None
) -> None:
    """Size cap over all schemas first, then each schema's meta-validation (cached)."""
    texts, total = [], 0
    for schema, param, what in found:
        if not isinstance(schema, dict):
            raise InvalidRequestError(
                f"Invalid JSON Schema for {what}: '{param}' must be an object.", param=param
            )
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        total += len(text)
        if total > MAX_SCHEMA_BYTES:
            raise schemas_too_large(param)
        texts.append(text)
    for (schema, param, what), text in zip(found, texts, strict=True):
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        known, result = cache.get(digest)
        if not known:
            if checkpoint is not None:
                checkpoint()
            try:
                result = (cache.checker or _check_here)(schema, text)
            except SchemaTimeoutError:
                raise ValidationTimeoutError() from None
            cache.put(digest, result)
        if result is not None:
            inner, message = result
            raise InvalidRequestError(
                f"Invalid JSON Schema for {what} at '{param}{inner}': {message}", param=param
            )


def _check_here(schema: dict, _text: str) -> tuple[str, str] | None:
    return _schema_error(schema)
