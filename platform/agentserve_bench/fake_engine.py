"""Deterministic fake Engine for tests and benchmarks: words are tokens, output echoes the prompt.

Registered as engine "fake" (entry point group agentserve.engines): a spec may name it where
agentserve_bench is installed; the CRD and Helm values schema never offer it.

Behaviour (all deterministic): the prompt is the last user message (chat) or the prompt text
(completion); prompt tokens = whitespace words over all messages. The reply is "echo:
<prompt words>" repeated up to max tokens (finish "length") or once (finish "stop"); `stop`
strings cut it (finish "stop"). With `response_format` json the reply is a JSON object; with
tool_choice "required" it calls every tool (the first only when parallel_tool_calls is
false), with a named function that one (finish "tool_calls"); arguments fill the tool's
parameter schema from the prompt (strings get the prompt text, numbers its word count; no
properties: {"text": prompt}). With logprobs (chat logprobs + top_logprobs k, completion
logprobs k) each word token gets a log probability from a hash of it and k alternatives
(itself first). Tokens are emitted `accept_per_step` at a time, like a speculative engine,
and counted in stats as drafts/drafted/accepted (also by running batch size). Each step
sleeps `token_delay_s + per_seq_delay_s x running requests`, and at most `max_num_seqs`
requests run at once (the rest wait, counted in stats.waiting), so load slows a replica the
way batching does. The finish delta's cached_tokens come from a per-engine prefix cache
(fake_prefix.py), so routing that keeps a conversation on one replica shows as prefix hits.
`FakeEngineFactory` builds one per ModelSpec.

Continuations (EngineRequest.continuation) behave like an autoregressive model's: given the
prompt plus the words already delivered, it says the rest of the reply when those words are
the reply's beginning, and something else (words derived from a hash of the context) when
they are not, so a wrong continuation shows in the output. Faults (tests only):
`inject("crash" | "stuck", after_tokens)` makes the engine die (every stream and health()
raise EngineDeadError) or hang (steps and health() never return) once that many more tokens
were emitted; with `fault_prompts`, a prompt starting "FAULT crash" or "FAULT stuck" injects
it once that request has emitted FAULT_AFTER_TOKENS tokens (so its own continuation
elsewhere does not inject it again).
Embeddings (`task="embed"`, as ModelSpec.task): deterministic unit vectors of `embed_size`
(agentserve_bench/fake_embed.py); a generate model refuses them with 400.
Sleep mode (engine/protocol.Sleeper, like vLLM's level 1 on GPU): sleep() and wake_up()
take `wake_delay_s` each; a request submitted while asleep raises EngineUnavailableError
(the replica's sleep gate must never let one through).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from agentserve.engine.protocol import (
    Delta,
    Embeddings,
    EmbedRequest,
    EngineDeadError,
    EngineRequest,
    EngineRequestError,
    EngineStats,
    EngineUnavailableError,
)
from agentserve.speculation.by_batch import SpecByBatch

from agentserve_bench.fake_embed import DEFAULT_EMBED_SIZE, fake_embeddings
from agentserve_bench.fake_prefix import FakePrefixCache

__all__ = ["FakeEngine", "FakeEngineFactory"]

DEFAULT_MAX_TOKENS = 32
FAULT_AFTER_TOKENS = 4
REQUESTS_KEPT = 256  # engine.requests keeps the latest ones (bounded for soak runs)
CONTEXT_WHERE_UNSET = 2048  # a GPU model's spec may leave max_model_len to its config


class FakeEngine:
    """Fake engine. A step sleeps `token_delay_s + per_seq_delay_s x running`;
    `max_num_seqs` (None = unlimited) caps running requests; `num_speculative_tokens` and
    `accept_per_step` shape the spec-decode counters (accept_per_step tokens per step);
    `requests` keeps the latest `requests_kept` requests (a load scenario keeps few: kept
    requests are heap a real engine does not hold, which the GC scans)."""

    def __init__(
        self,
        model_name: str = "fake-model",
        max_model_len: int = 256,
        *,
        token_delay_s: float = 0.0,
        num_speculative_tokens: int = 4,
        accept_per_step: int = 2,
        per_seq_delay_s: float = 0.0,
        max_num_seqs: int | None = None,
        fault_prompts: bool = False,
        wake_delay_s: float = 0.0,
        requests_kept: int = REQUESTS_KEPT,
        task: str = "generate",
        embed_size: int = DEFAULT_EMBED_SIZE,
    ):
        self.model_name = model_name
        self.task, self.embed_size = task, embed_size
        self.wake_delay_s = wake_delay_s
        self.asleep = False
        self.max_model_len = max_model_len
        self.token_delay_s = token_delay_s
        self.per_seq_delay_s = per_seq_delay_s
        self._slots = asyncio.Semaphore(max_num_seqs) if max_num_seqs else None
        self._waiting = 0
        self.num_speculative_tokens = num_speculative_tokens
        self.accept_per_step = max(1, accept_per_step)
        self.started = False
        self.healthy = True
        self.aborted: list[str] = []
        self.requests: deque[EngineRequest] = deque(maxlen=requests_kept)
        self.fault_prompts = fault_prompts
        self.fault: str | None = None  # "crash" or "stuck" once a fault is active
        self._fault_pending: tuple[str, int] | None = None  # (fault, tokens before it)
        self._forever = asyncio.Event()  # never set: what a stuck engine waits on
        self._running = 0
        self._drafts = self._draft_tokens = self._accepted = 0
        self._by_batch = SpecByBatch()
        self.prefix_cache = FakePrefixCache()  # reports usage's cached_tokens

    @classmethod
    def from_model(cls, model: Any) -> FakeEngine:
        """What `engine: fake` in a spec builds (the registry's contract)."""
        return cls(model.name, model.max_model_len or CONTEXT_WHERE_UNSET, task=model.task)

    @classmethod
    def expected_start_s(cls, model: Any) -> float:
        """The fake engine starts at once (a replica still takes a few seconds)."""
        return 5.0

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def sleep(self) -> None:
        await asyncio.sleep(self.wake_delay_s)
        self.asleep = True

    async def wake_up(self) -> None:
        await asyncio.sleep(self.wake_delay_s)
        self.asleep = False

    async def is_sleeping(self) -> bool:
        return self.asleep

    async def health(self) -> None:
        await self._check_fault()
        if not (self.started and self.healthy):
            raise EngineUnavailableError(f"fake engine {self.model_name!r} is not serving")

    def inject(self, fault: str, after_tokens: int = 0) -> None:
        """Tests only: after `after_tokens` more output tokens (engine-wide) the engine
        "crash"es or gets "stuck" (see the module docstring)."""
        if fault not in ("crash", "stuck"):
            raise ValueError(f"unknown fault {fault!r}: crash or stuck")
        self._fault_pending = (fault, after_tokens)
        if after_tokens <= 0:
            self._fault_pending, self.fault = None, fault

    async def _check_fault(self, tokens: int = 0) -> None:
        """Let `tokens` more tokens out, or act out the fault that is (or becomes) active."""
        if self._fault_pending is not None:
            fault, left = self._fault_pending
            if left >= tokens:
                self._fault_pending = (fault, left - tokens)
            else:
                self._fault_pending, self.fault = None, fault
        if self.fault == "stuck":
            await self._forever.wait()
        if self.fault == "crash":
            raise EngineDeadError(f"fake engine {self.model_name!r} crashed")

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def stats(self) -> EngineStats:
        return EngineStats(
            running=self._running,
            waiting=self._waiting,
            spec_drafts=self._drafts,
            spec_draft_tokens=self._draft_tokens,
            spec_accepted_tokens=self._accepted,
            spec_by_batch=self._by_batch.snapshot(),
        )

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """See the module docstring: one step's delay, then the vectors."""
        if not self.started or self.asleep:
            raise EngineUnavailableError("fake engine not started or asleep")
        if self.task != "embed":
            raise EngineRequestError(
                f"model {self.model_name!r} does not embed", code="model_not_embedding"
            )
        await self._check_fault()
        await asyncio.sleep(self.token_delay_s)
        return fake_embeddings(request, self.max_model_len, self.embed_size)

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        """See the module docstring; raises EngineRequestError before any delta."""
        if not self.started or self.asleep:
            raise EngineUnavailableError("fake engine not started or asleep")
        await self._check_fault()
        self.requests.append(request)
        body = request.body
        prompt_words, prompt_tokens = _prompt(request)
        cached = min(prompt_tokens, self.prefix_cache.serve(_prompt_sequence(request)))
        prefix = request.continuation.text if request.continuation else ""
        prompt_tokens += len(prefix.split())  # a continuation's prompt includes the prefix
        max_tokens = _max_tokens(body, request.kind)
        _check_context(prompt_tokens, max_tokens, self.max_model_len)
        default_budget = DEFAULT_MAX_TOKENS - len(prefix.split())
        budget = max_tokens if max_tokens is not None else default_budget
        trigger = None  # the fault this request's prompt asks for, if enabled
        if self.fault_prompts and request.continuation is None and prompt_words[:1] == ["FAULT"]:
            trigger = " ".join(prompt_words[1:2])
        tools = _forced_tools(body) if request.kind == "chat" else []
        finished = False
        await self._acquire_slot()
        self._running += 1
        try:
            if tools:
                async for delta in self._tool_calls(tools, prompt_words, prompt_tokens):
                    yield replace(delta, cached_tokens=cached) if delta.finish_reason else delta
            else:
                rest = _words_after(_reply_words(body, prompt_words), prefix.split())
                words, natural_end = rest[:budget], len(rest) <= budget
                top = _top_logprobs(body, request.kind)
                stream = self._stream_words(words, natural_end, body, prompt_tokens, prefix, top)
                async for delta in stream:
                    yield replace(delta, cached_tokens=cached) if delta.finish_reason else delta
                    if trigger and delta.completion_tokens >= FAULT_AFTER_TOKENS:
                        self.inject(trigger)
                        trigger = None
            finished = True
        finally:
            self._running -= 1
            if self._slots is not None:
                self._slots.release()
            if not finished:
                self.aborted.append(request.request_id)

    async def _stream_words(
        self,
        words: list[str],
        natural_end: bool,
        body: Any,
        prompt_tokens: int,
        prefix: str,
        top: int | None = None,
    ) -> AsyncIterator[Delta]:
        """Reply words after `prefix` (the text delivered before, "" for a new request);
        with `top` (not None), each word's log probabilities with `top` alternatives."""
        stops = _stops(body)
        text, emitted = prefix, 0
        for i in range(0, len(words), self.accept_per_step):
            step = words[i : i + self.accept_per_step]
            tokens = [w if not (text or j) else " " + w for j, w in enumerate(step)]
            piece = "".join(tokens)
            lps = () if top is None else tuple(_logprob(t, top) for t in tokens)
            await self._check_fault(len(step))
            emitted += len(step)
            self._count_step(len(step))
            cut = _cut_at_stop(text + piece, stops)
            if cut is not None:
                yield Delta(
                    cut[len(text) :], prompt_tokens, emitted, finish_reason="stop", logprobs=lps
                )
                return
            text += piece
            last = i + self.accept_per_step >= len(words)
            finish = ("stop" if natural_end else "length") if last else None
            await asyncio.sleep(self._step_delay_s())
            yield Delta(piece, prompt_tokens, emitted, finish_reason=finish, logprobs=lps)

    async def _tool_calls(
        self, tools: list[tuple[str, dict]], prompt_words: list[str], prompt_tokens: int
    ) -> AsyncIterator[Delta]:
        """Two steps per call: name, then arguments; the last delta finishes "tool_calls"."""
        emitted = 0
        for index, (name, schema) in enumerate(tools):
            head = {"index": index, "id": f"call_fake{index}", "type": "function"}
            await self._check_fault(1)
            self._count_step(1)
            emitted += 1
            yield Delta(
                "", prompt_tokens, emitted, tool_calls=({**head, "function": {"name": name}},)
            )
            await asyncio.sleep(self._step_delay_s())
            args = json.dumps(_fake_arguments(schema, " ".join(prompt_words)))
            await self._check_fault(1)
            self._count_step(1)
            emitted += 1
            tail = {"index": index, "function": {"arguments": args}}
            finish = "tool_calls" if index == len(tools) - 1 else None
            yield Delta("", prompt_tokens, emitted, finish_reason=finish, tool_calls=(tail,))

    async def _acquire_slot(self) -> None:
        """Wait for a batch slot (max_num_seqs); counted as waiting meanwhile."""
        if self._slots is None:
            return
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1

    def _step_delay_s(self) -> float:
        return self.token_delay_s + self.per_seq_delay_s * self._running

    def _count_step(self, tokens: int) -> None:
        """One verify step that emitted `tokens` (= 1 bonus + tokens - 1 accepted)."""
        self._drafts += 1
        self._draft_tokens += self.num_speculative_tokens
        self._accepted += tokens - 1
        self._by_batch.add(self._running, 1, self.num_speculative_tokens, tokens - 1)


@dataclass(frozen=True)
class FakeEngineFactory:
    """Picklable EngineFactory for Ray tests: a FakeEngine per ModelSpec (its name, context
    and max_num_seqs) with these step delays."""

    token_delay_s: float = 0.0
    per_seq_delay_s: float = 0.0
    accept_per_step: int = 2
    fault_prompts: bool = False
    wake_delay_s: float = 0.0

    def __call__(self, model: Any) -> FakeEngine:
        return FakeEngine(
            model.name,
            model.max_model_len or CONTEXT_WHERE_UNSET,
            token_delay_s=self.token_delay_s,
            per_seq_delay_s=self.per_seq_delay_s,
            accept_per_step=self.accept_per_step,
            max_num_seqs=model.engine_slots,
            fault_prompts=self.fault_prompts,
            wake_delay_s=self.wake_delay_s,
            task=model.task,
        )


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _prompt_sequence(request: EngineRequest) -> list[str]:
    """The whole prompt as the words a prefix cache sees, in order: each chat message's
    role, then its content's words; a completion prompt's words (or token ids)."""
    body = request.body
    if request.kind != "chat":
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        return (prompt if isinstance(prompt, str) else " ".join(map(str, prompt or []))).split()
    words: list[str] = []
    for message in body.messages:
        m = message if isinstance(message, dict) else dict(message)
        words += [f"<{m.get('role', '')}>", *_content_text(m.get("content")).split()]
    return words


def _prompt(request: EngineRequest) -> tuple[list[str], int]:
    """(words of the text to echo, prompt token count)."""
    body = request.body
    if request.kind == "chat":
        messages = [m if isinstance(m, dict) else dict(m) for m in body.messages]
        total = sum(len(_content_text(m.get("content")).split()) + 1 for m in messages)
        users = [m for m in messages if m.get("role") == "user"] or messages
        return _content_text(users[-1].get("content")).split(), total
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return [str(t) for t in prompt], len(prompt)
    text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt or []))
    return text.split(), len(text.split())


def _max_tokens(body: Any, kind: str) -> int | None:
    if kind == "chat":
        return body.max_completion_tokens or body.max_tokens
    return body.max_tokens


def _check_context(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    needed = prompt_tokens + (max_tokens or 0)
    if prompt_tokens >= max_model_len or needed > max_model_len:
        raise EngineRequestError(
            f"This model's maximum context length is {max_model_len} tokens; the request "
            f"has {prompt_tokens} prompt tokens and asks for {max_tokens or 0} more",
            code="context_length_exceeded",
            param="messages",
        )


def _forced_tools(body: Any) -> list[tuple[str, dict]]:
    """(name, parameter schema) of the tools the request forces; [] when none is forced."""
    tools, choice = body.tools or [], body.tool_choice
    if not tools or choice in (None, "none", "auto"):
        return []
    found = [(t.function.name, t.function.parameters or {}) for t in tools]
    if choice == "required":
        return found if getattr(body, "parallel_tool_calls", True) is not False else found[:1]
    return [f for f in found if f[0] == choice.function.name][:1]


def _fake_arguments(schema: dict, prompt: str) -> dict[str, Any]:
    """Arguments matching a JSON schema's properties (required ones, else all)."""
    props = schema.get("properties") or {}
    if not props:
        return {"text": prompt}
    names = schema.get("required") or list(props)
    by_type = {"integer": len(prompt.split()), "number": float(len(prompt.split()))}
    by_type |= {"boolean": True, "array": [], "object": {}, "null": None}
    return {n: by_type.get(props.get(n, {}).get("type"), prompt) for n in names}


def _reply_words(body: Any, prompt_words: list[str]) -> list[str]:
    """The whole reply to a prompt (before max_tokens)."""
    fmt = getattr(body, "response_format", None)
    if fmt is not None and fmt.type in ("json_object", "json_schema"):
        return json.dumps({"echo": " ".join(prompt_words)}).split(" ")
    return ["echo:", *prompt_words]


def _words_after(reply: list[str], prefix: list[str]) -> list[str]:
    """What follows `prefix`: the rest of `reply` when prefix begins it; else as many
    words derived from a hash of reply and prefix (deterministic, visibly different)."""
    if reply[: len(prefix)] == prefix:
        return reply[len(prefix) :]
    seed = zlib.crc32(" ".join([*reply, "|", *prefix]).encode())
    return [f"x{(seed + i) % 9973:04d}" for i in range(max(1, len(reply) - len(prefix)))]


def _top_logprobs(body: Any, kind: str) -> int | None:
    """Alternatives per token the request asks for; None: no log probabilities."""
    if kind == "chat":
        return (body.top_logprobs or 0) if body.logprobs else None
    return body.logprobs


def _logprob(token: str, top: int) -> dict[str, Any]:
    """A token's log probability (from a hash of it, in (-10, 0]), with `top` alternatives:
    the token itself first, then "<alt1>", "<alt2>", ... each 1 lower."""
    value = -(zlib.crc32(token.encode()) % 1000) / 100
    alts = [(token, value)] + [(f"<alt{j}>", round(value - j, 2)) for j in range(1, top)]
    return {
        "token": token,
        "logprob": value,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in alts][
            :top
        ],
    }


def _stops(body: Any) -> list[str]:
    stop = getattr(body, "stop", None)
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [s for s in stop if s]


def _cut_at_stop(text: str, stops: list[str]) -> str | None:
    """`text` up to the earliest stop string, or None when none occurs."""
    hits = [text.index(s) for s in stops if s in text]
    return text[: min(hits)] if hits else None
