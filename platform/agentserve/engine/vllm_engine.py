"""VLLMEngine: the production Engine, vLLM's AsyncLLM behind vLLM's own OpenAI serving layer.

vLLM does the work: AsyncLLM (continuous batching, prefix caching, DFlash speculative
decoding via speculative_config, abort) and OpenAIServingChat / OpenAIServingCompletion
(chat template, tool-call parsing, response_format -> structured outputs, sampling
parameters, context-length checks). This class only adapts their SSE output to Deltas:
it asks for continuous usage stats so every delta carries cumulative token counts, and
for token ids, so a request whose replica dies can continue elsewhere from the exact
tokens (`continuation_body`). A dead AsyncLLM surfaces as EngineDeadError; a hung one
(no engine step for health_check_timeout_s while requests are in flight) fails `health`,
which vLLM's own check_health cannot see (engine/progress.py).
vLLM is imported in start(), so importing this module stays cheap.
"""

from __future__ import annotations

import asyncio
import logging
from argparse import Namespace
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from agentserve.engine import core_slots
from agentserve.engine.cpu_settings import apply_cpu_engine_settings
from agentserve.engine.progress import StepProgress
from agentserve.engine.protocol import (
    Delta,
    Embeddings,
    EmbedRequest,
    EngineDeadError,
    EngineRequest,
    EngineRequestError,
    EngineStats,
    EngineUnavailableError,
    output_limit,
)
from agentserve.engine.vllm_args import (
    engine_kwargs,
    exports_vllm_metrics,
    frontend_kwargs,
    spec_decode_counters,
)
from agentserve.engine.vllm_embed import encode_all
from agentserve.engine.vllm_errors import error_from_payload, request_error_from_vllm
from agentserve.engine.vllm_fixes import ensure_enabled as ensure_fixes_enabled
from agentserve.engine.vllm_fixes import plugin_loaded
from agentserve.engine.vllm_lora import lora_modules
from agentserve.engine.vllm_paths import check_vllm_paths
from agentserve.engine.vllm_ray import config_in_placement_group, needs_placement_group
from agentserve.engine.vllm_sse import deltas_from_sse
from agentserve.sources.adapters import adapter_dirs
from agentserve.sources.models import resolve_model
from agentserve.spec import ModelSpec
from agentserve.speculation.by_batch import SpecByBatch, vllm_stat_logger
from agentserve.speculation.hybrid_drafter import (
    STATS_INTERVAL_S,
    proposer_rows,
    request_counts,
    with_stats_path,
)
from agentserve.speculation.hybrid_stats import step_rows

__all__ = [
    "VLLMEngine",
    "continuation_body",
    "deltas_from_sse",
    "stat_loggers",
]

log = logging.getLogger(__name__)
_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-"}
# sampling parameters a token-id continuation carries over (chat or completion -> completion)
_CARRIED = (
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "length_penalty", "logit_bias",
    "allowed_token_ids", "bad_words", "skip_special_tokens", "spaces_between_special_tokens",
    "priority", "cache_salt", "user",
)  # fmt: skip


class VLLMEngine:
    """Engine over vLLM's AsyncLLM for one ModelSpec (CPU build or CUDA build alike).

    `model_dir` overrides where the weights are (default: resolve_model(spec.source));
    `overrides` are extra AsyncEngineArgs keywords (e.g. {"seed": 0}).
    """

    def __init__(
        self,
        model: ModelSpec,
        *,
        model_dir: str | Path | None = None,
        overrides: Mapping[str, Any] | None = None,
    ):
        self.spec = model
        self.model_name = model.name
        self.max_model_len = model.max_model_len
        self._model_dir = model_dir
        self._overrides = dict(overrides or {})
        self._client: Any = None
        self._serving: dict[str, Any] = {}
        self._by_batch = SpecByBatch()  # fed per engine step by a vLLM stat logger
        self._progress = StepProgress()  # ... and marks each step (a hung engine has none)
        self._watch_steps = False
        self._hybrid_stats: str | None = None

    @classmethod
    def from_model(cls, model: ModelSpec) -> VLLMEngine:
        """The engine a spec's `engine: vllm` builds (agentserve.engine.registry)."""
        return cls(model)

    @classmethod
    def expected_start_s(cls, model: ModelSpec) -> float:
        """Replica start: vLLM on CPU compiles for 80-140 s, on GPU about a minute."""
        return 120.0 if model.replicas.num_gpus == 0 else 60.0

    async def start(self) -> None:
        """Load the model and start AsyncLLM (minutes on CPU: torch.compile warm-up)."""
        check_vllm_paths()  # an unsupported vLLM release: one clear error, not an ImportError
        from starlette.datastructures import State
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.cli_args import FrontendArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        slot = apply_cpu_engine_settings(self.spec.name)  # None: every core (or a GPU)
        ensure_fixes_enabled()
        # off the event loop: a first start may download a model and its drafter for hours
        model_dir = self._model_dir or await asyncio.to_thread(
            resolve_model, self.spec.source, revision=self.spec.revision, progress=True
        )
        kwargs = await asyncio.to_thread(engine_kwargs, self.spec, model_dir, **self._overrides)
        adapters = await asyncio.to_thread(adapter_dirs, self.spec)  # hub ids: downloaded once
        self._hybrid_stats = with_stats_path(kwargs, plugin_loaded())  # hybrid's counts
        engine_args = AsyncEngineArgs(**kwargs)
        self._watch_steps = not kwargs.get("disable_log_stats")  # steps come with stats
        loggers = stat_loggers(
            vllm_stat_logger(self._by_batch, on_step=self._progress.step), exports_vllm_metrics()
        )
        if needs_placement_group(kwargs):  # TP x PP > 1: workers in the replica's bundles
            config = await asyncio.to_thread(config_in_placement_group, engine_args)
            self._client = AsyncLLM.from_vllm_config(config, stat_loggers=loggers)
        else:
            with core_slots.confined(slot):  # the engine core process keeps the slot's mask
                self._client = AsyncLLM.from_engine_args(engine_args, stat_loggers=loggers)
        frontend = vars(FrontendArgs()) | frontend_kwargs(self.spec, model_dir)
        frontend["lora_modules"] = lora_modules(self.spec, adapters)  # loaded by init_app_state
        args = Namespace(**(frontend | vars(engine_args)))
        state = State()
        tasks = await self._client.get_supported_tasks()
        await init_app_state(self._client, state, args, supported_tasks=tasks)
        self._serving = servings(state)

    @property
    def async_llm(self) -> Any:
        """The started AsyncLLM, for callers that bypass the serving layer (the platform
        overhead benchmark's bare-engine side); raises before start()."""
        if self._client is None:
            raise EngineUnavailableError(f"vLLM engine for {self.model_name!r} is not started")
        return self._client

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        """Run through vLLM's serving layer; closing this iterator aborts the request."""
        kind, body = request.kind, request.body
        if request.continuation is not None:
            kind, body = continuation_body(request)
        serving = self._serving.get(kind)
        if self._client is not None and self.spec.task == "embed":
            raise EngineRequestError(
                f"model {self.model_name!r} is an embedding model", code="model_not_generative"
            )
        if self._client is None or serving is None:
            raise EngineUnavailableError(f"vLLM engine for {self.model_name!r} is not started")
        body = _streaming_body(body, request.request_id)
        raw = _raw_request({**request.headers, "x-request-id": request.request_id})
        self._progress.begin()
        try:
            if kind == "chat":
                result = await serving.create_chat_completion(body, raw)
            else:
                result = await serving.create_completion(body, raw)
            if not hasattr(result, "__aiter__"):
                raise error_from_payload(result.model_dump())
            try:
                async for delta in deltas_from_sse(kind, result, _chat_top(request, kind)):
                    yield delta
            finally:
                await result.aclose()
        except Exception as err:
            failure = self._request_failure(self._client, err)
            if failure is err:
                raise
            raise failure from err
        finally:
            self._progress.end()

    def _request_failure(self, client: Any, err: Exception) -> Exception:
        """What a failed request raises: EngineDeadError where AsyncLLM's engine core died,
        the client's 4xx for a request vLLM refused, else the error itself."""
        if getattr(client, "errored", False):
            return EngineDeadError(f"vLLM engine for {self.model_name!r} died: {err}")
        return request_error_from_vllm(err) or err

    async def embed(self, request: EmbedRequest) -> Embeddings:
        """vLLM's pooling runner (engine/vllm_embed.py); 400 for a model that generates."""
        if self.spec.task != "embed":
            raise EngineRequestError(
                f"model {self.model_name!r} does not embed", code="model_not_embedding"
            )
        client = self.async_llm  # EngineUnavailableError before start()
        self._progress.begin()
        try:
            return await encode_all(client, request)
        except Exception as err:
            failure = self._request_failure(client, err)
            if failure is err:
                raise
            raise failure from err
        finally:
            self._progress.end()

    async def abort(self, request_id: str) -> None:
        if self._client is not None:
            await self._client.abort([p + request_id for p in _PREFIX.values()])

    async def health(self) -> None:
        if self._client is None:
            raise EngineUnavailableError("vLLM engine not started")
        try:
            await self._client.check_health()
        except Exception as err:  # vLLM raises EngineDeadError and others
            raise EngineUnavailableError(f"vLLM engine unhealthy: {err}") from err
        stalled_s = self._progress.stalled_for() if self._watch_steps else 0.0
        if stalled_s > self.spec.replicas.health_check_timeout_s:
            raise EngineUnavailableError(
                f"vLLM engine hung: no engine step for {stalled_s:.0f} s with "
                f"{self._progress.owed} requests waiting on it"
            )

    async def stats(self) -> EngineStats:
        from vllm.v1.metrics.reader import get_metrics_snapshot

        metrics = get_metrics_snapshot()
        spec = spec_decode_counters(metrics)
        gauges = {m.name: m.value for m in metrics if hasattr(m, "value")}
        return EngineStats(
            running=int(gauges.get("vllm:num_requests_running", 0)),
            waiting=int(gauges.get("vllm:num_requests_waiting", 0)),
            spec_drafts=spec["drafts"],
            spec_draft_tokens=spec["draft_tokens"],
            spec_accepted_tokens=spec["accepted_tokens"],
            spec_by_batch=self._by_batch.snapshot(),
            spec_by_proposer=proposer_rows(self._hybrid_stats),
            spec_steps=step_rows(self._hybrid_stats),
        )

    @property
    def proposer_counts(self) -> Any:
        """With hybrid drafting: an async function of a finished request's id giving its
        drafts and accepted tokens per proposer (for its decode span); else None."""
        return self._request_counts if self._hybrid_stats else None

    async def _request_counts(self, request_id: str) -> dict[str, dict[str, int]] | None:
        await asyncio.sleep(STATS_INTERVAL_S + 0.2)  # the engine writes its last step's
        return request_counts(self._hybrid_stats, request_id) if self._hybrid_stats else None

    async def sleep(self) -> None:
        """vLLM sleep mode level 1 (needs enable_sleep_mode: replicas.sleep_when_idle_s,
        CUDA only): weights to CPU RAM, KV cache freed. The caller ensures nothing runs;
        mode "wait" lets a request that slipped in finish rather than abort it."""
        await self.async_llm.sleep(1, mode="wait")

    async def wake_up(self) -> None:
        """Weights back on the GPU and a fresh KV cache (the prefix cache starts empty)."""
        await self.async_llm.wake_up()

    async def is_sleeping(self) -> bool:
        return bool(await self.async_llm.is_sleeping())

    async def stop(self) -> None:
        if self._client is not None:
            self._client.shutdown()
            self._client = None
        if self._hybrid_stats:
            Path(self._hybrid_stats).unlink(missing_ok=True)


def servings(state: Any) -> dict[str, Any]:
    """vLLM's chat and completion serving objects from its app state, by request kind; a
    pooling model's state has neither (it serves embeddings through encode_all)."""
    found = {
        "chat": getattr(state, "openai_serving_chat", None),
        "completion": getattr(state, "openai_serving_completion", None),
    }
    return {kind: serving for kind, serving in found.items() if serving is not None}


def stat_loggers(ours: Any, export: bool) -> list[Any]:
    """AsyncLLM's stat-logger factories: ours (acceptance by batch, step progress), and with
    `export` vLLM's Ray logger (vllm:* as ray_vllm_* on Ray's metrics port) beside vLLM's
    own Prometheus logger, which `stats()` reads and which vLLM leaves out once any
    Prometheus-type logger is passed."""
    if not export:
        return [ours]
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

    return [ours, PrometheusStatLogger, RayPrometheusStatLogger]


def _streaming_body(body: Any, request_id: str) -> Any:
    """A copy of the body that streams with per-chunk usage and token ids (not with echo:
    vLLM then leaves the echoed text out), under our request id."""
    from vllm.entrypoints.generate.base.protocol import StreamOptions

    options = StreamOptions(include_usage=True, continuous_usage_stats=True)
    update: dict[str, Any] = {"stream": True, "stream_options": options}
    fields = type(body).model_fields
    if "request_id" in fields:
        update["request_id"] = request_id
    if "return_token_ids" in fields and not body.echo:
        update["return_token_ids"] = True
    return body.model_copy(update=update)


def continuation_body(request: EngineRequest) -> tuple[str, Any]:
    """(kind, vLLM body) that continues `request.continuation` (its max_tokens already
    reduced by the caller).

    With token ids: a completion whose prompt is the original prompt's token ids followed
    by the delivered output's, the very sequence the dead engine had (exact for greedy;
    frequency/presence penalties no longer see the delivered tokens), sampling
    parameters carried over. Without: chat continues its assistant message
    (continue_final_message), a completion appends the text to its prompt; exact only
    when re-tokenizing gives the same tokens.
    """
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    body, c = request.body, request.continuation
    assert c is not None
    if c.prompt_token_ids:
        limit = output_limit(request.kind, body)
        given = body.model_fields_set
        carried = {k: v for k, v in body if k in _CARRIED and k in given}  # pydantic: (name, value)
        carried |= _carried_logprobs(request)
        prompt = [*c.prompt_token_ids, *c.token_ids]
        return "completion", CompletionRequest(
            model=body.model, prompt=prompt, max_tokens=limit, **carried
        )
    if request.kind == "chat":
        messages = [*body.messages, {"role": "assistant", "content": c.text}]
        update = {"continue_final_message": True, "add_generation_prompt": False}
        return "chat", body.model_copy(update={"messages": messages, **update})
    if not isinstance(body.prompt, str):
        raise EngineRequestError("a token prompt can only be continued from token ids")
    return "completion", body.model_copy(update={"prompt": body.prompt + c.text})


def _carried_logprobs(request: EngineRequest) -> dict[str, Any]:
    """A completion's `logprobs` asking what the request asked (chat: top_logprobs)."""
    body = request.body
    if request.kind == "completion":
        return {} if body.logprobs is None else {"logprobs": body.logprobs}
    return {"logprobs": body.top_logprobs or 0} if body.logprobs else {}


def _chat_top(request: EngineRequest, kind: str) -> int | None:
    """The alternatives per token a chat request continued as a completion keeps."""
    if request.kind == "chat" and kind == "completion" and request.body.logprobs:
        return request.body.top_logprobs or 0
    return None


def _raw_request(headers: Mapping[str, str]) -> Any:
    """A minimal Starlette request carrying pass-through headers (traceparent, request id)."""
    from starlette.requests import Request

    pairs = [(k.lower().encode(), str(v).encode()) for k, v in headers.items()]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": pairs, "query_string": b""}
    return Request(scope)
