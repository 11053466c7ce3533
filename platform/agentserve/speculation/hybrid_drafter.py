"""Hybrid drafting inside vLLM: n-gram prompt lookup where it finds a match, DFlash where not
(docs/vllm-fixes.md, docs/architecture.md).

vLLM 0.32 has no hybrid proposer, so the engine runs DFlash (method "dflash") and this
module wraps the model runner's `take_draft_token_ids`, called after every step, when the
runner's CPU token ids already hold the tokens just accepted. DFlash has drafted every
request (its drafter must see every accepted token; steps it need not draft store context
only: speculation/hybrid_block.py). Per request, the n-gram draft (vLLM's `NgramProposer`)
then replaces DFlash's where prompt lookup matches, and DFlash's draft is cut to
`dflash_tokens` where it does not. Lossless: both drafts are greedy (`check_engine` refuses
probabilistic drafting), a point mass for the rejection sampler. Async scheduling must be
off (the spec refuses it with hybrid).

The engine asks for it with `additional_config={"agentserve_hybrid": {...}}`
(`vllm_args.hybrid_config`). `install()` runs from the vLLM plugin in every engine process
and patches the runner class only when vLLM imports it (the worker process).

Acceptance per proposer: a request's accepted tokens are known one step later and counted
against the proposer that drafted them (its last draft is never counted). With `STATS_ENV`
set, the counts go to that file (JSON, at most every `STATS_INTERVAL_S`, and at the latest
that long after the last step), with the latest requests' own counts (`REQUESTS_KEPT`), for
the replica's /metrics, decode spans and the benchmarks. The path travels by environment:
vLLM hashes `additional_config` into its compile cache key.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from agentserve.speculation.hybrid_stats import proposer_rows, read_stats, request_counts

__all__ = [
    "CONFIG_KEY",
    "PROPOSERS",
    "HybridDrafts",
    "ProposerCounts",
    "install",
    "proposer_rows",
    "read_stats",
    "request_counts",
    "with_stats_path",
]

log = logging.getLogger(__name__)

CONFIG_KEY = "agentserve_hybrid"
PROPOSERS = ("ngram", "dflash")
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
STATS_INTERVAL_S = 0.5
STATS_ENV = "AGENTSERVE_HYBRID_STATS"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
RAY_COPY_ENV = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"
REQUESTS_KEPT = 256  # requests whose own counts the stats file keeps (the most recent)


@dataclass
class ProposerCounts:
    """Steps in which one proposer drafted for a request, tokens drafted, tokens accepted."""

    drafts: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.drafts += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted


@dataclass
class HybridDrafts:
    """Combines DFlash's drafts with n-gram drafts, request by request, and counts what
    each proposer got accepted."""

    ngram: Any  # vLLM NgramProposer (or anything with its `propose`)
    dflash_tokens: int
    stats_path: str | None = None
    dflash_max_batch: int | None = None  # bigger batches: n-gram drafts only (hybrid_block.py)
    counts: dict[str, ProposerCounts] = field(
        default_factory=lambda: {p: ProposerCounts() for p in PROPOSERS}
    )
    pending: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    by_request: OrderedDict[str, dict[str, ProposerCounts]] = field(default_factory=OrderedDict)
    context_only: bool = False  # this step's DFlash skipped its block (speculation/hybrid_block.py)
    steps: dict[str, int] = field(default_factory=lambda: {"block": 0, "context_only": 0})
    _written: float = 0.0
    _timer: threading.Timer | None = None

    def combine(
        self,
        req_ids: list[str],
        dflash: list[list[int]],
        rows: list[int],
        num_tokens_no_spec: Any,
        token_ids: Any,
    ) -> list[list[int]]:
        """Drafts for `req_ids` (at batch rows `rows`; -1 = not in the batch): the n-gram
        draft where prompt lookup matched, else DFlash's first `dflash_tokens`. `dflash`
        holds DFlash's drafts in the same order; their width is this step's k. After a
        context-only step they are placeholders: a request without a match drafts nothing."""
        self._settle(req_ids, rows, num_tokens_no_spec)
        context_only, self.context_only = self.context_only, False
        k = max((len(d) for d in dflash), default=0)
        if not k:
            return dflash
        self.steps["context_only" if context_only else "block"] += 1
        batch_size = max(rows, default=-1) + 1
        wanted = [[]] * batch_size  # NgramProposer looks up the rows with a sampled token
        for row in rows:
            if row >= 0:
                wanted[row] = [0]
        lookups = self.ngram.propose(k, wanted, num_tokens_no_spec, token_ids)
        out: list[list[int]] = []
        for req_id, row, drafted in zip(req_ids, rows, dflash, strict=True):
            found = lookups[row] if row >= 0 else []
            if found:
                draft, source = list(found), "ngram"
            else:
                draft = [] if context_only else list(drafted[: self.dflash_tokens])
                source = "dflash"
            out.append(draft)
            if draft and row >= 0:
                self.pending[req_id] = (source, len(draft), int(num_tokens_no_spec[row]))
        self._maybe_write()
        return out

    def _settle(self, req_ids: list[str], rows: list[int], num_tokens_no_spec: Any) -> None:
        """Count last step's drafts: a request that drafted n tokens and has grown by m
        tokens since had m - 1 of them accepted (a verify step emits accepted + 1)."""
        for req_id, row in zip(req_ids, rows, strict=True):
            entry = self.pending.pop(req_id, None)
            if entry is None or row < 0:
                continue
            source, drafted, length = entry
            grown = int(num_tokens_no_spec[row]) - length
            if grown >= 1:
                self.counts[source].add(drafted, min(grown - 1, drafted))
                self._of_request(req_id)[source].add(drafted, min(grown - 1, drafted))
        # what is left belongs to requests gone from the batch (finished, or preempted,
        # which drops the draft): nothing of theirs will settle
        self.pending.clear()

    def _of_request(self, req_id: str) -> dict[str, ProposerCounts]:
        counts = self.by_request.get(req_id)
        if counts is None:
            counts = self.by_request[req_id] = {p: ProposerCounts() for p in PROPOSERS}
            while len(self.by_request) > REQUESTS_KEPT:
                self.by_request.popitem(last=False)
        return counts

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {p: vars(c).copy() for p, c in self.counts.items()}

    def requests_snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        return {r: {p: vars(c).copy() for p, c in by.items()} for r, by in self.by_request.items()}

    def _maybe_write(self) -> None:
        """Write the counts now, or within STATS_INTERVAL_S of the last write: the last
        step before the engine goes idle is reported too (a one-shot timer)."""
        if not self.stats_path:
            return
        wait = STATS_INTERVAL_S - (time.monotonic() - self._written)
        if wait <= 0:
            self._write()
        elif self._timer is None:
            self._timer = threading.Timer(wait, self._write)
            self._timer.daemon = True
            self._timer.start()

    def _write(self) -> None:
        self._timer = None
        self._written = time.monotonic()
        if not self.stats_path:
            return
        tmp = f"{self.stats_path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                report = {"pid": os.getpid(), "proposers": self.snapshot(), "steps": self.steps}
                json.dump(report | {"requests": self.requests_snapshot()}, f)
            os.replace(tmp, self.stats_path)
        except OSError:  # stats are a report, never a reason to fail a step
            log.debug("agentserve hybrid: could not write %s", self.stats_path, exc_info=True)


def with_stats_path(
    kwargs: dict[str, Any], plugin_loaded: bool = True, environ: Any = None
) -> str | None:
    """For engine keyword arguments that ask for hybrid drafting: prepare the environment
    the engine inherits when it starts (`environ`, default os.environ): V1 model runner
    (the one hooked; vLLM picks V2 by default on GPU) and a fresh file to report the
    per-proposer counts in, whose path is returned; None for every other engine. Refuses
    (ValueError) where the hook would not run (plugin left out, V2 runner forced): the
    engine would draft with DFlash alone."""
    extra = kwargs.get("additional_config")
    if not isinstance(extra, dict) or CONFIG_KEY not in extra:
        return None
    if not plugin_loaded:
        raise ValueError(
            "drafter.method hybrid needs agentserve's vLLM plugin: VLLM_PLUGINS leaves out "
            "agentserve_fixes (add it to the list, or choose another method)"
        )
    env = os.environ if environ is None else environ
    if env.get(V2_RUNNER_ENV, "0").strip().lower() in ("1", "true"):
        raise ValueError(
            f"drafter.method hybrid hooks vLLM's V1 model runner: {V2_RUNNER_ENV}=1 would "
            "draft with DFlash alone"
        )
    env[V2_RUNNER_ENV] = "0"  # vLLM's default on GPU is the V2 runner, which has no hook
    fd, path = tempfile.mkstemp(prefix="agentserve-hybrid-", suffix=".json")
    os.close(fd)
    env[STATS_ENV] = path
    # the workers of a Ray executor (tensor/pipeline parallel) get VLLM_* and these only
    copied = [v for v in env.get(RAY_COPY_ENV, "").split(",") if v.strip()]
    if STATS_ENV not in copied:
        env[RAY_COPY_ENV] = ",".join([*copied, STATS_ENV])
    return path


def settings_of(vllm_config: Any) -> dict[str, Any] | None:
    """The hybrid settings this engine was started with, or None (no hybrid)."""
    extra = getattr(vllm_config, "additional_config", None)
    return extra.get(CONFIG_KEY) if isinstance(extra, dict) else None


def check_engine(vllm_config: Any) -> None:
    """Refuse engine settings under which hybrid drafting would not be lossless or would
    not reach the scheduler."""
    spec = vllm_config.speculative_config
    problems = []
    if spec is None or spec.method != "dflash":
        problems.append("speculative_config.method must be 'dflash'")
    elif getattr(spec, "draft_sample_method", "greedy") != "greedy":
        problems.append("DFlash must draft greedily (draft_sample_method 'greedy')")
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        problems.append("async scheduling must be off (drafts reach the scheduler by take)")
    if problems:
        raise ValueError("agentserve hybrid drafting: " + "; ".join(problems))


def build(vllm_config: Any, settings: dict[str, Any]) -> HybridDrafts:
    """A HybridDrafts for one engine: vLLM's NgramProposer with the spec's lookup window
    and the engine's k (it compiles its numba kernel here, under a second)."""
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    check_engine(vllm_config)
    spec = vllm_config.speculative_config
    ngram_config = SimpleNamespace(
        speculative_config=SimpleNamespace(
            prompt_lookup_min=int(settings["prompt_lookup_min"]),
            prompt_lookup_max=int(settings["prompt_lookup_max"]),
            num_speculative_tokens=spec.num_speculative_tokens,
        ),
        model_config=vllm_config.model_config,
        scheduler_config=vllm_config.scheduler_config,
        parallel_config=vllm_config.parallel_config,
    )
    return HybridDrafts(
        NgramProposer(ngram_config),  # type: ignore[arg-type]  # reads only these fields
        dflash_tokens=int(settings["dflash_tokens"]),
        stats_path=os.environ.get(STATS_ENV) or None,
        dflash_max_batch=_optional_int(settings.get("dflash_max_batch")),
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _hybrid_of(runner: Any) -> HybridDrafts | None:
    hybrid = runner.__dict__.get("_agentserve_hybrid", False)
    if hybrid is False:
        settings = settings_of(runner.vllm_config)
        hybrid = build(runner.vllm_config, settings) if settings else None
        runner._agentserve_hybrid = hybrid
    return hybrid


def _wrap(original: Any) -> Any:
    """The runner's `take_draft_token_ids`, which the engine core calls after each step
    (bookkeeping done: the CPU token ids hold this step's tokens) to hand the drafts to
    the scheduler. DFlash drafted inside the step, as vLLM runs it."""

    def take_draft_token_ids(self: Any) -> Any:
        taken = original(self)
        hybrid = _hybrid_of(self)
        if taken is None or hybrid is None:
            return taken
        batch = self.input_batch
        index = batch.req_id_to_index
        rows = [index.get(r, -1) for r in taken.req_ids]
        drafts = hybrid.combine(
            list(taken.req_ids),
            [list(d) for d in taken.draft_token_ids],
            rows,
            batch.num_tokens_no_spec,
            batch.token_ids_cpu,
        )
        return type(taken)(taken.req_ids, drafts)

    take_draft_token_ids.__wrapped__ = original  # type: ignore[attr-defined]
    take_draft_token_ids.agentserve_hybrid = True  # type: ignore[attr-defined]
    return take_draft_token_ids


def _wrap_init(original: Any) -> Any:
    """The runner's `__init__`, then the hybrid drafts for its engine: settings a hybrid
    engine cannot run with fail the start, not its first request."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _hybrid_of(self)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.agentserve_hybrid = True  # type: ignore[attr-defined]
    return __init__


def patch_runner(module: Any) -> None:
    from agentserve.speculation.hybrid_block import patch_proposer

    runner = module.GPUModelRunner
    patch_proposer(runner, _hybrid_of)
    if not getattr(runner.take_draft_token_ids, "agentserve_hybrid", False):
        runner.take_draft_token_ids = _wrap(runner.take_draft_token_ids)
    if not getattr(runner.__init__, "agentserve_hybrid", False):
        runner.__init__ = _wrap_init(runner.__init__)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` right after `name` is first imported (one shot)."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, then = spec.loader.exec_module, self.then

        def exec_then(module: Any) -> None:
            exec_module(module)
            then(module)

        spec.loader.exec_module = exec_then  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Patch vLLM's model runner for hybrid drafting now (if imported) or when it is."""
    if RUNNER_MODULE in sys.modules:
        patch_runner(sys.modules[RUNNER_MODULE])
    elif not any(isinstance(f, _AfterImport) and f.name == RUNNER_MODULE for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(RUNNER_MODULE, patch_runner))
