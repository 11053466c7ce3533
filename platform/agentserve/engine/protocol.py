"""Engine protocol: what a model replica needs from a serving engine (vLLM, or the fake of
agentserve_bench.fake_engine in tests).

An engine takes one validated OpenAI request (vLLM's protocol models) and yields typed
deltas; the API layer turns deltas into OpenAI JSON or SSE. Token counts ride on every
delta (cumulative), so callers measure TTFT and time per output token without parsing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "Continuation",
    "Delta",
    "EmbedRequest",
    "Embeddings",
    "Engine",
    "EngineDeadError",
    "EngineError",
    "EngineGoneError",
    "EngineRequest",
    "EngineRequestError",
    "EngineStats",
    "EngineUnavailableError",
    "Sleeper",
    "aclose_stream",
    "cached_prompt_tokens",
    "can_sleep",
    "output_limit",
]

RequestKind = Literal["chat", "completion"]


class EngineError(RuntimeError):
    """Base of the errors an engine raises on purpose."""


class EngineRequestError(EngineError):
    """The request cannot be served as given (a client mistake): maps to an HTTP 4xx.

    `status` is the HTTP status, `type`/`code`/`param` the OpenAI error fields.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.code = code
        self.param = param

    def __reduce__(self):  # survive pickling across Ray processes with keyword fields
        return (
            _rebuild_request_error,
            (self.message, self.status, self.type, self.code, self.param),
        )


def _rebuild_request_error(message, status, type, code, param) -> EngineRequestError:
    return EngineRequestError(message, status=status, type=type, code=code, param=param)


class EngineUnavailableError(EngineError):
    """The engine is not started, stopped, overloaded or dead: maps to HTTP 503."""


class EngineDeadError(EngineUnavailableError):
    """The engine, or the replica hosting it, died while serving: nothing more will come
    from it. The ingress continues the request on another replica (serve/migrate.py).
    `replica`: which one died, where known (Ray's actor id), so choices of one request on
    the same replica count its death once (serve/poison.py)."""

    def __init__(self, message: str = "", replica: str | None = None):
        super().__init__(message)
        self.replica = replica


class EngineGoneError(EngineDeadError):
    """The request reached a replica whose engine had already died: it ran nothing there,
    so that death is not counted against it (serve/poison.py)."""


@dataclass(frozen=True)
class Continuation:
    """Output already delivered for a request whose replica died: the engine generates
    what follows it, as if it had produced it itself.

    `text` is that output and `completion_tokens` its token count. `token_ids` are its
    token ids and `prompt_token_ids` the original prompt's, when the first engine
    reported them (both or neither); an engine then continues from exactly those tokens,
    which is what makes greedy output equal the undisturbed one.
    """

    text: str
    completion_tokens: int
    token_ids: tuple[int, ...] = ()
    prompt_token_ids: tuple[int, ...] = ()


def output_limit(kind: RequestKind, body: Any) -> int | None:
    """The output limit of an OpenAI body of `kind` (vLLM's protocol model): a chat
    request's max_completion_tokens, else max_tokens; None: the rest of the context. The one
    place that reads it (api/ask.py, serve/migrate.py, engine/vllm_engine.py)."""
    limit = body.max_completion_tokens if kind == "chat" else None
    return limit or body.max_tokens


@dataclass(frozen=True)
class EngineRequest:
    """One generation request.

    `body` is a validated vLLM protocol model (ChatCompletionRequest for kind "chat",
    CompletionRequest for "completion"); engines must not mutate it. `headers` carries
    pass-through headers (lowercase names), e.g. `traceparent`, `x-request-id`.
    With `continuation`, the body's max_tokens is already reduced by the tokens delivered,
    and the deltas count as for a request whose prompt is the original prompt followed by
    the continuation (prompt_tokens includes it, completion_tokens counts new tokens only).
    """

    request_id: str
    kind: RequestKind
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    continuation: Continuation | None = None


@dataclass(frozen=True)
class EmbedRequest:
    """One embeddings request of an embedding model (ModelSpec.task "embed").

    `inputs` are embedded independently, each a text or a prompt's token ids; `headers` as
    for EngineRequest (trace context, the ingress's send time).
    """

    request_id: str
    inputs: tuple[str | tuple[int, ...], ...]
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Embeddings:
    """The answer to an EmbedRequest: one vector per input, in the inputs' order, all of
    the model's embedding size; `prompt_tokens` the inputs' tokens, summed."""

    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: int


@dataclass(frozen=True)
class Delta:
    """One step of output for one choice (`index`; engines always yield choice 0, the
    ingress's fan-out of an n > 1 request sets it: serve/fanout.py).

    `text` is new content (may be ""), `tool_calls` new OpenAI tool-call deltas
    (dicts with index/id/type/function), `prompt_tokens` the prompt length and
    `completion_tokens` the output tokens so far (cumulative, >= the previous delta's).
    `finish_reason` is set on the last delta only ("stop", "length", "tool_calls").
    `token_ids` are the output token ids whose text this delta delivers, and
    `prompt_token_ids` (first delta only) the prompt's, when the engine reports them.
    `logprobs` (when the request asked for them) has one entry per output token this
    delta delivers, in OpenAI chat form, whichever API the request came by:
    {"token", "logprob" (None: not reported), "bytes" (None: not reported),
    "top_logprobs": [{"token", "logprob", "bytes"}, ...] or None}
    (engine/logprobs.py converts vLLM's chat and completion shapes to and from it).
    In a merged n > 1 stream, prompt_tokens and completion_tokens count the whole
    request: completion tokens summed over its choices. `cached_tokens` (the finish delta
    only; 0 when the engine does not say) is how many of the prompt's tokens the engine's
    prefix cache served, so prefill computed only the rest.
    """

    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    reasoning: str = ""
    token_ids: tuple[int, ...] = ()
    prompt_token_ids: tuple[int, ...] = ()
    logprobs: tuple[dict[str, Any], ...] = ()
    index: int = 0
    cached_tokens: int = 0

    @property
    def carries_output(self) -> bool:
        """Whether the client receives output in this delta: text, tool-call deltas or
        reasoning. The one definition of "output" for TTFT (ingress, replica statistics,
        replica spans) and for what a migration has already passed on (serve/migrate.py)."""
        return bool(self.text or self.tool_calls or self.reasoning)

    @property
    def visible(self) -> bool:
        """Whether the client sees this delta at all: output, or the finish (an empty
        answer's first and only visible event, so its TTFT is the time to finish)."""
        return self.carries_output or bool(self.finish_reason)


def cached_prompt_tokens(prompt_tokens: int, cached_tokens: int) -> int:
    """The prompt tokens the prefix cache served, as a usage reports them: never more than
    the prompt (a migrated request's continuation prompt is longer than the client's)."""
    return min(prompt_tokens, max(0, cached_tokens))


@dataclass(frozen=True)
class EngineStats:
    """Counters since start (monotonic) and gauges now.

    Speculative decoding: `spec_drafts` verify steps with a draft, `spec_draft_tokens`
    tokens proposed, `spec_accepted_tokens` tokens accepted. Mean acceptance length
    (tokens emitted per verify step) = 1 + accepted / drafts. `spec_by_batch` splits the
    same counters by the running batch size of each step: (batch, drafts, drafted tokens,
    accepted tokens) sorted by batch; empty when the engine does not report it.
    `spec_by_proposer` splits them by the proposer that drafted (hybrid drafting: "ngram",
    "dflash"): (proposer, drafts, drafted tokens, accepted tokens); empty otherwise.
    `spec_steps`: hybrid drafting's steps by kind, ("block", n) with DFlash's block forward
    and ("context_only", n) with its context K/V only; empty otherwise.
    """

    running: int = 0
    waiting: int = 0
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_by_batch: tuple[tuple[int, int, int, int], ...] = ()
    spec_by_proposer: tuple[tuple[str, int, int, int], ...] = ()
    spec_steps: tuple[tuple[str, int], ...] = ()

    @property
    def acceptance_length(self) -> float:
        """Mean tokens per verify step (1.0 when nothing was drafted)."""
        return 1.0 + self.spec_accepted_tokens / self.spec_drafts if self.spec_drafts else 1.0


@runtime_checkable
class Engine(Protocol):
    """A serving engine for one model. Lifecycle: start() once, then requests, then stop().

    Contracts:
    - generate() yields at least one Delta and exactly one with finish_reason (the last);
      it raises EngineRequestError for client mistakes (e.g. prompt longer than the
      context, before any delta), EngineUnavailableError when it cannot serve now, and
      EngineDeadError when it died (also mid-stream). It honours
      EngineRequest.continuation. Closing the iterator early aborts the request.
    - embed() answers an EmbedRequest of an embedding model (task "embed") with one
      vector per input; it raises EngineRequestError for client mistakes (an input
      longer than the context; a model that does not embed), EngineUnavailableError and
      EngineDeadError as generate() does.
    - health() raises EngineUnavailableError when the engine cannot serve.
    """

    model_name: str
    max_model_len: int | None  # None: the model's own, as the engine decides (GPU)

    async def start(self) -> None: ...

    def generate(self, request: EngineRequest) -> AsyncIterator[Delta]: ...

    async def embed(self, request: EmbedRequest) -> Embeddings: ...

    async def abort(self, request_id: str) -> None: ...

    async def health(self) -> None: ...

    async def stats(self) -> EngineStats: ...

    async def stop(self) -> None: ...


@runtime_checkable
class Sleeper(Protocol):
    """Optional part of an Engine: sleep while idle and wake before serving (vLLM's sleep
    mode level 1 on CUDA: weights offloaded to CPU RAM, KV cache freed).

    Contracts: sleep() is called only with no request in flight and no generate() call
    until wake_up() returned; wake_up() restores the engine to serve exactly as before;
    is_sleeping() says which state the engine is in.
    """

    async def sleep(self) -> None: ...

    async def wake_up(self) -> None: ...

    async def is_sleeping(self) -> bool: ...


def can_sleep(engine: object) -> bool:
    """Whether `engine` implements the optional Sleeper part."""
    return isinstance(engine, Sleeper)


async def aclose_stream(stream: AsyncIterator[Delta]) -> None:
    """Close a delta stream early when it can be closed (an async generator): the engine
    aborts the request. A plain iterator without `aclose` is left alone."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()
