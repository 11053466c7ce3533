"""Mid-stream migration: when the replica serving a request dies, continue it on another.

The ingress reads every model stream through `migrating`. When the stream raises
EngineDeadError (the replica actor died, or its engine crashed), the request is sent again
as a continuation: the original prompt followed by the output already passed on, with
max_tokens (and min_tokens) reduced by the tokens passed on, at most `max_migrations` times.
Deltas from a continuation are rewritten to count as parts of the one original request
(prompt_tokens of the original, cumulative completion_tokens), so the client sees one
uninterrupted stream with one id and the usage of an undisturbed run.

What is exact: with token ids (the engine reported the prompt's and every delivered
delta's), the next engine sees the very token sequence the dead one had, so greedy
output is the undisturbed output (up to the kernels' own floating-point nondeterminism,
as with vLLM's recompute preemption). Without them the engine continues from the text,
which is exact when re-tokenizing prompt + text gives the same tokens (always for the
fake engine; usually, not always, for BPE tokenizers). Sampled output continues validly
but not identically. Output that tool-call, reasoning or structured-output parsers shape
cannot be continued (their state does not travel): such a request is re-issued only
when nothing was passed on yet, else the error reaches the client as before.

Poison: a request under which POISON_DEATHS (2) replicas died is not sent to a third; it
ends with PoisonRequestError (400, serve/poison.py) whatever `max_migrations` allows. The
choices of one request share one count (`deaths`, serve/poison.Deaths).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from agentserve.engine.delta_tracker import DeltaTracker
from agentserve.engine.protocol import (
    Continuation,
    Delta,
    EngineDeadError,
    EngineGoneError,
    EngineRequest,
    aclose_stream,
    output_limit,
)
from agentserve.serve.poison import POISON_DEATHS, Deaths, PoisonRequestError
from agentserve.serve.spans import SENT_AT_HEADER

__all__ = ["DEFAULT_MAX_MIGRATIONS", "Progress", "continuation_request", "migrating"]

log = logging.getLogger(__name__)
DEFAULT_MAX_MIGRATIONS = 2
BACKOFF_S = (0.05, 0.25, 1.0)  # wait before the 1st, 2nd, 3rd+ re-issue

Generate = Callable[[EngineRequest], AsyncIterator[Delta]]


@dataclass
class Progress(DeltaTracker):
    """What one request has passed on so far (fed each delivered delta, in order, untimed):
    its counts (DeltaTracker), and the text and token ids a continuation starts from."""

    text: str = ""
    token_ids: list[int] | None = field(default_factory=list)  # None: some delta had none
    prompt_token_ids: tuple[int, ...] = ()
    shaped: bool = False  # tool calls or reasoning were passed on

    @property
    def delivered(self) -> bool:
        """Whether the client has had anything. `text or shaped` is Delta.carries_output
        over the deltas so far (reasoning counts, as for TTFT); completion tokens count too,
        deliberately: tokens whose text the engine holds back (a stop-string prefix, part
        of a character) were generated and spent budget, so a retry continues after them."""
        return bool(self.completion_tokens or self.text or self.shaped)

    def record(self, delta: Delta) -> None:
        if delta.prompt_token_ids and not self.prompt_token_ids:
            self.prompt_token_ids = tuple(delta.prompt_token_ids)
        new_tokens = self.tally(delta)
        self.text += delta.text
        self.shaped = self.shaped or bool(delta.tool_calls or delta.reasoning)
        if self.token_ids is not None:
            if delta.token_ids or not new_tokens:
                self.token_ids.extend(delta.token_ids)
            else:  # output without ids: continue from text from now on
                self.token_ids = None

    def continuation(self) -> Continuation:
        exact = self.token_ids is not None and bool(self.prompt_token_ids)
        return Continuation(
            text=self.text,
            completion_tokens=self.completion_tokens,
            token_ids=tuple(self.token_ids) if exact else (),
            prompt_token_ids=self.prompt_token_ids if exact else (),
        )


def continuable(request: EngineRequest) -> bool:
    """Whether delivered output of `request` can be continued: no tools, no reasoning
    or structured-output constraints (their parser or grammar state would restart)."""
    body = request.body  # vLLM's OpenAI model of request.kind
    if request.kind == "chat" and body.tools and body.tool_choice != "none":
        return False
    fmt = body.response_format
    if fmt is not None and fmt.type != "text":
        return False
    return body.structured_outputs is None


def continuation_request(
    request: EngineRequest, progress: Progress, attempt: int, sent_at_ns: int | None = None
) -> EngineRequest:
    """The request to send after the `attempt`-th replica death (pure). With nothing
    delivered yet it is the original request (its client still waits for a first token,
    timed from the first send); else a Continuation with the budget reduced, stamped as
    sent at `sent_at_ns` (wall clock): its first delta is not the client's first token, so
    the replica's queue-wait span and TTFT window time it from this send, not from the
    original one (which would count the dead replica's whole stream as queueing)."""
    request_id = f"{request.request_id}-m{attempt}"
    if not progress.delivered:
        return dataclasses.replace(request, request_id=request_id)
    body = request.body.model_copy(update=_reduced_budget(request, progress))
    headers = dict(request.headers)
    if sent_at_ns is not None:
        headers[SENT_AT_HEADER] = str(sent_at_ns)
    return dataclasses.replace(
        request,
        request_id=request_id,
        body=body,
        continuation=progress.continuation(),
        headers=headers,
    )


def _reduced_budget(request: EngineRequest, progress: Progress) -> dict[str, Any]:
    """max_tokens (and a chat request's max_completion_tokens) and min_tokens less the
    tokens delivered."""
    body, sent = request.body, progress.completion_tokens
    limits = {"max_tokens": body.max_tokens}
    if request.kind == "chat":
        limits["max_completion_tokens"] = body.max_completion_tokens
    update: dict[str, Any] = {
        name: max(1, limit - sent) for name, limit in limits.items() if limit is not None
    }
    if body.min_tokens:
        update["min_tokens"] = max(0, body.min_tokens - sent)
    return update


def _budget_spent(request: EngineRequest, progress: Progress) -> bool:
    """Every allowed token was delivered; only the finish delta went missing."""
    limit = output_limit(request.kind, request.body)
    return limit is not None and progress.completion_tokens >= limit


async def migrating(
    generate: Generate,
    request: EngineRequest,
    max_migrations: int = DEFAULT_MAX_MIGRATIONS,
    on_migrate: Callable[[int], None] | None = None,
    poison_deaths: int | None = POISON_DEATHS,
    on_poison: Callable[[], None] | None = None,
    deaths: Deaths | None = None,
) -> AsyncIterator[Delta]:
    """`generate(request)`'s deltas; on EngineDeadError, the continuation's (see module
    docstring). `on_migrate(attempt)` is called before each re-issue. Deltas that carry
    nothing for the client (token ids only) are folded into the progress, not yielded.
    The `poison_deaths`-th replica death (None: never) raises PoisonRequestError after
    calling `on_poison()`; deaths are counted in `deaths`, which the choices of one request
    share (default: this stream's own)."""
    progress = Progress()
    deaths = deaths if deaths is not None else Deaths()
    attempt, current = 0, request
    while True:
        stream = generate(current)
        base = None if current.continuation is None else progress
        offset = progress.completion_tokens if base is not None else 0
        prompt_tokens = progress.prompt_tokens
        try:
            async for delta in stream:
                if base is not None:  # counts of a continuation -> counts of the request
                    delta = dataclasses.replace(
                        delta,
                        prompt_tokens=prompt_tokens,
                        completion_tokens=offset + delta.completion_tokens,
                        prompt_token_ids=(),
                    )
                progress.record(delta)
                if _empty(delta):
                    continue
                yield delta
            return
        except EngineDeadError as err:
            # a replica that was already dead when the request reached it did not die of it
            died = len(deaths.replicas) if isinstance(err, EngineGoneError) else deaths.add(err)
            if poison_deaths is not None and died >= poison_deaths:
                log.error(
                    "request %s: %d replicas died under it; failed as a poison request",
                    request.request_id,
                    died,
                )
                if on_poison is not None:
                    on_poison()
                raise PoisonRequestError(died) from err
            if attempt >= max_migrations or not _can_continue(request, progress):
                raise
            if _budget_spent(request, progress):
                yield Delta("", progress.prompt_tokens, progress.completion_tokens, "length")
                return
            attempt += 1
            log.warning(
                "request %s: replica died after %d tokens (%s); continuing elsewhere (%d/%d)",
                request.request_id,
                progress.completion_tokens,
                err,
                attempt,
                max_migrations,
            )
        finally:
            await aclose_stream(stream)
        if on_migrate is not None:
            on_migrate(attempt)
        await asyncio.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S)) - 1])
        current = continuation_request(request, progress, attempt, time.time_ns())


def _can_continue(request: EngineRequest, progress: Progress) -> bool:
    return not progress.delivered or (not progress.shaped and continuable(request))


def _empty(delta: Delta) -> bool:
    return not delta.visible
