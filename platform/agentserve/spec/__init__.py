"""DeploymentSpec: the one validated config of an agentserve deployment (CLI YAML, operator CR,
generated CRD and Helm schema, vLLM args). Invalid input raises SpecError naming each field path.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from yaml.constructor import ConstructorError

from agentserve.engine.registry import BUILTIN_ENGINES, check_engine_name
from agentserve.model_sources import BUNDLED_ALIASES, BUNDLED_MODEL, is_hub_id, is_local_path

__all__ = [
    "BUNDLED_MODEL",
    "DeploymentSpec",
    "ModelNotInSpecError",
    "SpecError",
    "hash_api_key",
    "load_spec",
    "spec_from_dict",
    "spec_json_schema",
    "to_yaml",
]

_DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_SHA256_HEX = r"^[0-9a-f]{64}$"


TENANTS_APART = "tenants_apart"  # validation context key: tenants arrive separately


class SpecError(ValueError):
    """An invalid deployment spec; `errors` holds (field path, message) pairs."""

    def __init__(self, message: str, errors: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.errors = errors or []


class ModelNotInSpecError(SpecError, KeyError):
    """A model name (a `--model` flag, a policy's model) that the spec does not serve.

    A SpecError, so the CLI reports it as a user error, and a KeyError, as before."""

    def __str__(self) -> str:  # KeyError's str() would quote the message
        return str(self.args[0])


def hash_api_key(key: str) -> str:
    """Return the lowercase hex SHA-256 of an API key, the form stored in TenantSpec."""
    if not key:
        raise ValueError("API key must not be empty")
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _revision_field(of: str) -> Any:
    """The optional Hub revision of a Hugging Face id in field `of`."""
    return Field(
        None,
        max_length=255,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_./-]*$",
        description=f"Hub revision (branch, tag or commit) of a Hugging Face id `{of}`; "
        "null = main. Pin a commit for reproducible deployments.",
    )


DRAFTERLESS_METHODS = ("ngram", "suffix", "mtp")
"""Speculative methods that draft without a separate drafter model."""


class DrafterSpec(_Spec):
    """Speculative decoding drafter for one model (vLLM speculative_config)."""

    enabled: bool = Field(False, description="Speculate with the drafter.")
    path: str | None = Field(
        None,
        description="Drafter: a Hugging Face id (e.g. z-lab/Qwen3-8B-DFlash-b16, downloaded "
        "once into the hub cache before the engine starts) or a local directory (absolute "
        "or ./relative); null = the drafter shipped for the bundled model.",
    )
    revision: str | None = _revision_field("path")
    method: Literal["dflash", "ngram", "suffix", "eagle3", "mtp"] = Field(
        "dflash",
        description="vLLM speculative method: dflash (block-diffusion drafter; `path`, or the "
        "shipped one for the bundled model), ngram (prompt lookup, no drafter), suffix "
        "(suffix decoding, needs the arctic-inference package), eagle3 (an EAGLE-3 drafter "
        "at `path`), mtp (the model's own multi-token-prediction layers).",
    )
    num_speculative_tokens: int = Field(7, ge=1, le=64, description="Tokens drafted per step.")
    min_acceptance_length: float = Field(
        1.2,
        ge=1.0,
        description="Alert floor on the mean tokens per verify step (tau): the "
        "AgentserveAcceptanceCollapsed alert fires when the drafter stays below it "
        "(exported as agentserve_spec_decode_acceptance_floor); 1.0 = never.",
    )
    prompt_lookup_min: int = Field(
        2, ge=1, description="ngram: shortest suffix of the text matched in the prompt."
    )
    prompt_lookup_max: int = Field(
        4, ge=1, description="ngram: longest suffix of the text matched in the prompt."
    )
    num_speculative_tokens_per_batch_size: (
        list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=3, max_length=3)]] | None
    ) = Field(
        None,
        min_length=1,
        description="Drafted tokens by batch size: [[start, end, k], ...], inclusive ranges "
        "sorted from batch 1, non-overlapping, 0 <= k <= num_speculative_tokens (0 = no "
        "drafting); gaps and batches past the last range keep the previous k. null = always "
        "num_speculative_tokens, unless `speculation_schedule` is auto. `agentserve spec "
        "speculation-schedule` prints the schedule the latency model chooses.",
    )
    speculation_schedule: Literal["auto", "off"] = Field(
        "auto",
        description="auto: when num_speculative_tokens_per_batch_size is null and agentserve "
        "has a latency model for this model (today: the bundled model under vLLM on CPU), "
        "fill it from that model before serving, so drafting shrinks as the batch grows and "
        "a saturated replica gives back the compute speculation costs; off: always draft "
        "num_speculative_tokens. An explicit num_speculative_tokens_per_batch_size is used "
        "either way.",
    )

    @field_validator("path")
    @classmethod
    def _check_path(cls, path: str | None) -> str | None:
        if path is None or is_local_path(path) or is_hub_id(path):
            return path
        raise ValueError(
            f"{path!r} is neither a Hugging Face id (ORG/NAME) nor a local directory (an "
            "absolute path or one starting with ./)"
        )

    @model_validator(mode="after")
    def _check_schedule(self) -> DrafterSpec:
        if self.revision is not None and (self.path is None or not is_hub_id(self.path)):
            raise ValueError("drafter.revision: only a Hugging Face id `path` has revisions")
        if self.path is not None and self.method in DRAFTERLESS_METHODS:
            raise ValueError(f"drafter.path: method {self.method!r} uses no drafter model")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"drafter.prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        if self.num_speculative_tokens_per_batch_size is not None:
            check_speculation_schedule(
                self.num_speculative_tokens_per_batch_size, self.num_speculative_tokens
            )
        return self


def check_speculation_schedule(schedule: list[list[int]], num_speculative_tokens: int) -> None:
    """Raise ValueError unless `schedule` satisfies vLLM 0.32's rules for
    num_speculative_tokens_per_batch_size (vllm/v1/spec_decode/dynamic/utils.py): entries
    (start, end, k) with 1 <= start <= end, ranges sorted and non-overlapping, the first
    starting at 1, k >= 0. Stricter than vLLM: it sorts and clamps k, we require sorted
    ranges and k <= num_speculative_tokens."""
    previous_end = 0
    for i, (start, end, k) in enumerate(schedule):
        where = f"num_speculative_tokens_per_batch_size[{i}] {[start, end, k]}"
        if i == 0 and start != 1:
            raise ValueError(f"{where}: the first range must start at batch size 1")
        if not 1 <= start <= end:
            raise ValueError(f"{where}: needs 1 <= start <= end")
        if start <= previous_end:
            raise ValueError(f"{where}: ranges must be sorted and must not overlap")
        if k > num_speculative_tokens:
            raise ValueError(
                f"{where}: k must be <= num_speculative_tokens ({num_speculative_tokens})"
            )
        previous_end = end


class TolerationSpec(_Spec):
    """A Kubernetes toleration for replica pods (null key/effect match all)."""

    key: str | None = Field(None, description="Taint key.")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="How value is matched.")
    value: str | None = Field(None, description="Taint value, for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect."
    )
    toleration_seconds: int | None = Field(None, ge=0, description="NoExecute grace seconds.")


class ReplicaSpec(_Spec):
    """Replica bounds and per-replica resources for one model deployment."""

    min_replicas: int = Field(1, ge=0, description="Fewest replicas; 0 allows scale to zero.")
    max_replicas: int = Field(1, ge=1, description="Most replicas.")
    initial_replicas: int | None = Field(None, ge=0, description="Replicas at start; null = min.")
    num_gpus: int = Field(0, ge=0, description="GPUs per replica: 0 on CPU, 1 on GPU.")
    num_cpus: float = Field(2.0, gt=0, description="CPU cores per replica.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Kubernetes node labels replica pods require."
    )
    tolerations: list[TolerationSpec] = Field(
        default_factory=list, description="Kubernetes tolerations for replica pods."
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict,
        description="Kubernetes affinity of replica pods (a core/v1 Affinity, as is).",
    )
    gpu_resource_name: str = Field(
        "nvidia.com/gpu",
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Kubernetes extended resource replica pods request their GPUs as: "
        "nvidia.com/gpu, a MIG slice (nvidia.com/mig-3g.40gb) or another vendor's "
        "(amd.com/gpu).",
    )
    extra_resources: dict[str, str] = Field(
        default_factory=dict,
        description="Further extended resources each replica pod requests (and limits), "
        "e.g. {rdma/rdma_shared_device_a: '1'} for InfiniBand/RoCE between the nodes of a "
        "multi-node replica (NCCL).",
    )
    ipc_lock: bool = Field(
        False,
        description="Add the IPC_LOCK capability to replica containers (RDMA memory "
        "registration for NCCL over InfiniBand/RoCE). Kubernetes gives added capabilities "
        "to root processes only: the agentserve images run Ray as uid 1000, where this has "
        "no effect; NCCL then gets the locked-memory limit (RLIMIT_MEMLOCK) the container "
        "runtime sets (check `ulimit -l` in a replica pod: NCCL wants unlimited). Useful "
        "only with an image that runs Ray as root.",
    )
    health_check_period_s: float = Field(
        10.0, gt=0, description="Seconds between engine health checks of a replica."
    )
    health_check_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds a health check may take; 3 failed or late checks in a row "
        "and the replica is replaced (a stuck engine).",
    )
    graceful_shutdown_timeout_s: float = Field(
        120.0,
        ge=0,
        description="Seconds a stopping replica (scale-down, update, shutdown) lets its "
        "in-flight requests finish before it is killed (then they migrate).",
    )
    graceful_shutdown_wait_loop_s: float = Field(
        1.0, gt=0, description="Seconds between a stopping replica's in-flight checks."
    )
    nodes_per_replica: int = Field(
        1,
        ge=1,
        le=64,
        description="Nodes (worker pods) one replica spans: 1 = all its num_gpus on one node; "
        "more splits its pipeline stages over that many nodes of num_gpus / nodes_per_replica "
        "GPUs each (pipeline_parallel_size must be a multiple of it).",
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> ReplicaSpec:
        low, high, initial = self.min_replicas, self.max_replicas, self.initial_replicas
        if low > high:
            raise ValueError(f"min_replicas ({low}) must be <= max_replicas ({high})")
        if initial is not None and not low <= initial <= high:
            raise ValueError(f"initial_replicas ({initial}) must lie in [{low}, {high}]")
        return self


SPEC_OWNED_ENGINE_ARGS = {
    "model": "source",
    "tokenizer": "source",
    "served_model_name": "name",
    "dtype": "dtype",
    "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "speculative_config": "drafter",
    "async_scheduling": "async_scheduling",
    "disable_log_stats": "(always on: metrics and autoscaling read the engine's stats)",
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "distributed_executor_backend": "tensor_parallel_size x pipeline_parallel_size (ray when > 1)",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "quantization": "quantization",
    "kv_cache_dtype": "kv_cache_dtype",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "enable_prefix_caching": "enable_prefix_caching",
    "scheduling_policy": "priority_scheduling",
    "revision": "revision",
    "tokenizer_revision": "revision",
    "download_dir": "(the Hugging Face cache: HF_HOME / AGENTSERVE_HF_HOME)",
}
"""vLLM engine arguments that a ModelSpec field decides: `engine_args` may not set them."""


class ModelSpec(_Spec):
    """One served model: weights, engine settings, drafter and replicas."""

    name: str = Field(
        BUNDLED_MODEL,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        description="Served model id (the request's `model`).",
    )
    source: str = Field(
        BUNDLED_MODEL,
        description=f"{BUNDLED_MODEL} (alias: bundled), a Hugging Face id (e.g. "
        "Qwen/Qwen3-8B: downloaded once into the hub cache, $HF_HOME, before the engine "
        "starts; HF_TOKEN for gated repos; HF_HUB_OFFLINE=1 reads only the cache) or a local "
        "Hugging Face format directory (absolute or ./relative).",
    )
    revision: str | None = _revision_field("source")
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = Field(
        "bfloat16", description="Weight and activation dtype."
    )
    max_model_len: int = Field(2048, ge=16, description="Context length: prompt + output tokens.")
    engine: str = Field(
        "vllm",
        description="Serving engine (vLLM: its CPU and GPU builds alike).",
        # any registered engine validates (agentserve.engine.registry: e.g. the benchmarks'
        # fake); the schema, hence the CRD and Helm values schema, offers only the built-in
        json_schema_extra={"enum": list(BUILTIN_ENGINES)},
    )
    drafter: DrafterSpec = Field(default_factory=DrafterSpec, description="Speculative drafter.")
    replicas: ReplicaSpec = Field(default_factory=ReplicaSpec, description="Replicas, resources.")
    max_num_seqs: int = Field(8, ge=1, description="Engine batch cap: sequences run at once.")
    async_scheduling: bool = Field(
        False, description="vLLM async scheduling: prepare batch N+1 while the device runs N."
    )
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="GPUs each layer is split over (vLLM tensor parallelism)."
    )
    pipeline_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="Pipeline stages the layers are split into (vLLM pipeline parallelism). "
        "A replica uses tensor_parallel_size x pipeline_parallel_size GPUs (replicas.num_gpus "
        "must equal it when > 1): a Ray placement group of that many GPU bundles.",
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Fraction of each GPU's memory vLLM may use (weights + KV cache); "
        "null = vLLM's default (0.9).",
    )
    quantization: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[a-z0-9_-]+$",
        description="vLLM quantization method (e.g. fp8, awq, gptq, mxfp4); null = what the "
        "checkpoint's config says. Checked against the installed vLLM when an engine starts.",
    )
    kv_cache_dtype: Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="KV cache element type; auto = the model dtype."
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="Most tokens one engine step processes (prefill chunk + decodes); "
        "null = vLLM's default. At least max_num_seqs.",
    )
    enable_prefix_caching: bool = Field(
        True, description="Reuse the KV cache of shared prompt prefixes (agent system prompts)."
    )
    priority_scheduling: bool = Field(
        True,
        description="vLLM's priority scheduling: each request carries its tenant class's "
        "priority (batch after the others; the ingress sets it, never the client), so the "
        "engine's queue serves other classes first and, short of KV cache, preempts batch "
        "requests first. Off: first come, first served.",
    )
    dispatch_order: Literal["deadline", "arrival"] = Field(
        "deadline",
        description="Order in which requests waiting at the ingress for a replica slot are "
        "sent on: deadline = earliest arrival + tenant TTFT objective first, and a "
        "batch-class request still waiting past its deadline gets 429; arrival = first "
        "come, first served, none refused (with priority_scheduling off: no class priority "
        "anywhere, e.g. as a baseline).",
    )
    stream_interval_ms: float = Field(
        100.0,
        ge=0,
        le=1000,
        description="Streams: the first token goes out at once, then at most one message "
        "per interval with every token since the last (fewer wake-ups per token between "
        "replica, ingress, proxy and client, which share the CPUs with the engine). 0: one "
        "message per engine step.",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="More vLLM engine arguments, by vLLM's EngineArgs field names (e.g. "
        "{enforce_eager: true, kv_cache_dtype: fp8}); checked against the installed vLLM "
        "when an engine starts. Settings this spec has fields for are refused here.",
    )

    @field_validator("engine_args")
    @classmethod
    def _check_engine_args(cls, engine_args: dict[str, Any]) -> dict[str, Any]:
        for key in engine_args:
            if key in SPEC_OWNED_ENGINE_ARGS:
                raise ValueError(
                    f"engine_args.{key}: set by agentserve from "
                    f"`{SPEC_OWNED_ENGINE_ARGS[key]}`; use that field instead"
                )
            if not key.isidentifier():
                raise ValueError(f"engine_args: {key!r} is not a vLLM argument name")
        return engine_args

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, engine: str) -> str:
        return check_engine_name(engine)  # an unknown name: the error lists the known ones

    @field_validator("source")
    @classmethod
    def _check_source(cls, source: str) -> str:
        if source.strip().lower() in BUNDLED_ALIASES:
            return BUNDLED_MODEL
        if is_local_path(source) or is_hub_id(source):
            return source
        raise ValueError(
            f"{source!r} is neither the bundled model ({BUNDLED_MODEL!r}), a Hugging Face id "
            "(ORG/NAME) nor a local directory (an absolute path or one starting with ./)"
        )

    @model_validator(mode="after")
    def _check_drafter(self) -> ModelSpec:
        if self.revision is not None and not is_hub_id(self.source):
            raise ValueError("revision: only a Hugging Face id `source` has revisions")
        drafter = self.drafter
        if drafter.enabled and drafter.path is None and drafter.method == "eagle3":
            raise ValueError("drafter.path is required: method eagle3 needs an EAGLE-3 drafter")
        if (
            drafter.enabled
            and drafter.path is None
            and drafter.method == "dflash"
            and self.source != BUNDLED_MODEL
        ):
            raise ValueError(
                "drafter.path is required: the shipped drafter only fits the bundled model"
            )
        if drafter.enabled and drafter.num_speculative_tokens >= self.max_model_len:
            raise ValueError(
                f"drafter.num_speculative_tokens ({drafter.num_speculative_tokens}) "
                f"must be smaller than max_model_len ({self.max_model_len})"
            )
        return self

    @model_validator(mode="after")
    def _check_parallelism(self) -> ModelSpec:
        tp, pp, replicas = self.tensor_parallel_size, self.pipeline_parallel_size, self.replicas
        world = tp * pp
        if (world > 1 or replicas.num_gpus > 1) and replicas.num_gpus != world:
            raise ValueError(
                f"replicas.num_gpus ({replicas.num_gpus}) must equal tensor_parallel_size x "
                f"pipeline_parallel_size ({tp} x {pp} = {world}): one GPU per vLLM worker"
            )
        nodes = replicas.nodes_per_replica
        if nodes > 1 and replicas.num_gpus == 0:
            raise ValueError("replicas.nodes_per_replica > 1 needs GPUs (replicas.num_gpus)")
        if nodes > 1 and pp % nodes:
            raise ValueError(
                f"replicas.nodes_per_replica ({nodes}) must divide pipeline_parallel_size "
                f"({pp}): each node holds whole pipeline stages of {tp} GPUs"
            )
        batched = self.max_num_batched_tokens
        if batched is not None and batched < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({batched}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): every running sequence decodes each step"
            )
        return self


class SLASpec(_Spec):
    """Latency objectives, at the 95th percentile."""

    ttft_p95_ms: float = Field(1000.0, gt=0, description="Time to first token, ms.")
    tpot_p95_ms: float = Field(100.0, gt=0, description="Time per output token, ms.")


class RateLimitSpec(_Spec):
    """Per-tenant limits; null = unlimited."""

    requests_per_minute: int | None = Field(None, gt=0, description="Requests per minute.")
    tokens_per_minute: int | None = Field(None, gt=0, description="Prompt + output tokens/min.")
    max_concurrent_requests: int | None = Field(None, gt=0, description="Requests in flight.")


class TenantSpec(_Spec):
    """A tenant: its API key hash, SLA and limits."""

    name: str = Field(
        max_length=63,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Tenant name, used in metrics, traces and logs.",
    )
    api_key_sha256: str = Field(
        description="Lowercase hex SHA-256 of the API key (never the key itself).",
        json_schema_extra={"pattern": _SHA256_HEX},
    )
    sla: SLASpec = Field(description="Latency objectives.")
    rate_limit: RateLimitSpec = Field(default_factory=RateLimitSpec, description="Limits.")
    sla_class: str | None = Field(None, description="Class label for metrics, e.g. batch.")

    @field_validator("api_key_sha256")
    @classmethod
    def _check_hash(cls, value: str) -> str:
        if not re.fullmatch(_SHA256_HEX, value):
            raise ValueError(
                "must be the SHA-256 of the API key as 64 lowercase hex characters, never the "
                "key itself (agentserve.spec.hash_api_key, or `printf %s KEY | sha256sum`)"
            )
        return value


class AutoscalingSpec(_Spec):
    """How replicas follow load. SLA ratio = max over tenants of p95 latency / SLO."""

    policy: Literal["sla", "ray_default"] = Field("sla", description="sla, or Ray Serve's own.")
    upscale_sla_ratio: float = Field(1.0, gt=0, description="Scale up above this SLA ratio.")
    downscale_sla_ratio: float = Field(0.6, gt=0, description="Scale down below this SLA ratio.")
    interval_s: float = Field(5.0, gt=0, description="Seconds between decisions.")
    look_back_period_s: float = Field(
        30.0,
        gt=0,
        description="Seconds of history each decision sees: replicas' p95 latency windows "
        "and Ray Serve's metric averaging.",
    )
    upscale_delay_s: float = Field(10.0, ge=0, description="Upscale condition hold, seconds.")
    downscale_delay_s: float = Field(120.0, ge=0, description="Downscale condition hold, s.")
    scale_to_zero_idle_s: float | None = Field(
        None, gt=0, description="Idle seconds before going to zero replicas; null = never."
    )
    cold_start_hold_timeout_s: float = Field(
        120.0, gt=0, description="Seconds a request waits for a replica starting from zero."
    )
    target_utilization: float = Field(
        0.8, gt=0, le=1, description="Fraction of replica capacity (max_num_seqs) to plan for."
    )
    open_mode_sla: SLASpec = Field(
        default_factory=SLASpec, description="SLA used when no tenants are configured."
    )
    burst_ratio: float = Field(
        1.2,
        ge=0,
        description="Burst detection: when the arrival rate over the last 10 s reaches this "
        "multiple of the look-back rate (and beyond Poisson noise), the capacity floor plans "
        "for the rate projected one replica start ahead; 0 = off. Policy sla only.",
    )
    standby_replicas: int = Field(
        0,
        ge=0,
        description="Started replicas kept beyond the policy's target, so a scale-up does "
        "not wait for a replica start. Ray Serve routes to every running replica, so these "
        "serve traffic too; they cost replica-seconds all the time. Policy sla only.",
    )

    @model_validator(mode="after")
    def _check_band(self) -> AutoscalingSpec:
        if self.downscale_sla_ratio >= self.upscale_sla_ratio:
            raise ValueError(
                f"downscale_sla_ratio ({self.downscale_sla_ratio}) must be smaller than "
                f"upscale_sla_ratio ({self.upscale_sla_ratio}) to leave a hysteresis band"
            )
        return self


class TracingSpec(_Spec):
    """OpenTelemetry tracing; without an endpoint it stays off."""

    enabled: bool = Field(False, description="Export traces.")
    otlp_endpoint: str | None = Field(None, description="OTLP URL, e.g. http://otel:4318.")
    sample_ratio: float = Field(1.0, ge=0, le=1, description="Fraction of traces sampled.")
    service_name: str = Field("agentserve", min_length=1, description="OTel service.name.")

    @field_validator("otlp_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} must start with http:// or https://")
        return value


class ServerSpec(_Spec):
    """The HTTP ingress."""

    host: str = Field("127.0.0.1", min_length=1, description="Address the API binds to.")
    port: int = Field(8000, ge=1, le=65535, description="OpenAI-compatible API port.")
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Port of the admin endpoints (/metrics, /status), served by the ingress on "
        "host; null = they answer only loopback clients, on the API port.",
    )
    max_queue_len: int = Field(
        64, ge=1, description="Queued requests per model (per ingress replica), then 503."
    )
    max_request_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted, in bytes; a larger one gets 413.",
    )
    request_timeout_s: float = Field(300.0, gt=0, description="Seconds before a request fails.")
    trusted_hosts: list[str] = Field(
        default_factory=list,
        description="Host header names the API answers in open mode (no tenants), besides "
        "localhost, 127.0.0.1, ::1 and host; others get 400 (DNS rebinding). With tenants "
        "any Host is accepted.",
    )
    max_migrations: int = Field(
        2,
        ge=0,
        le=8,
        description="Times one request may be continued on another replica when its replica "
        "dies mid-request (prompt + output so far); 0 = fail the request instead.",
    )

    ingress_replicas: int | None = Field(
        None,
        ge=1,
        le=16,
        description="Ingress replicas, each serving the whole API (Serve's proxy spreads "
        "requests over them, so one can die without taking every stream); tenant limits hold "
        "across them (serve/shared_limits.py). With metrics_port set, replica k of a node "
        "serves the admin endpoints on metrics_port + k. null = 1 with `agentserve up`, 2 in "
        "a cluster (the operator).",
    )

    @model_validator(mode="after")
    def _check_ports(self) -> ServerSpec:
        if self.metrics_port is None:
            return self
        last = self.metrics_port + (self.ingress_replicas or 1) - 1
        if self.metrics_port <= self.port <= last:
            raise ValueError(
                f"metrics_port must differ from port ({self.port}); with ingress_replicas the "
                f"admin ports are metrics_port .. metrics_port + ingress_replicas - 1"
            )
        if last > 65535:
            raise ValueError(f"admin ports run past 65535 (up to {last})")
        return self


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class DeploymentSpec(_Spec):
    """A whole agentserve deployment. `DeploymentSpec()` is the embedded CPU deployment."""

    name: str = Field(
        "agentserve",
        max_length=63,
        json_schema_extra={"pattern": _DNS1123_LABEL},
        description="Deployment name, a DNS-1123 label (it names Kubernetes objects).",
    )
    models: list[ModelSpec] = Field(
        default_factory=lambda: [ModelSpec()], min_length=1, description="Models to serve."
    )
    tenants: list[TenantSpec] = Field(
        default_factory=list, description="Tenants; empty = open mode (no keys, loopback only)."
    )
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec, description="Scaling.")
    tracing: TracingSpec = Field(default_factory=TracingSpec, description="OpenTelemetry tracing.")
    server: ServerSpec = Field(default_factory=ServerSpec, description="HTTP ingress.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not re.fullmatch(_DNS1123_LABEL, name):
            raise ValueError(
                f"{name!r} must be a DNS-1123 label (it names Kubernetes objects): lowercase "
                "letters, digits and '-', starting and ending with a letter or digit"
            )
        return name

    @model_validator(mode="after")
    def _check_cross_fields(self, info: ValidationInfo) -> DeploymentSpec:
        problems = [
            *_duplicates("models", [m.name for m in self.models], "model name"),
            *_duplicates("tenants", [t.name for t in self.tenants], "tenant name"),
            *_duplicates("tenants", [t.api_key_sha256 for t in self.tenants], "api_key_sha256"),
        ]
        tenants_apart = bool((info.context or {}).get(TENANTS_APART))  # tenant_config.py
        if not self.tenants and not tenants_apart and not _is_loopback(self.server.host):
            problems.append(
                f"server.host: {self.server.host!r} is not a loopback address, but no tenants "
                "are configured, so the API would be open to the network; configure tenants "
                "(API keys) or bind to 127.0.0.1, ::1 or localhost"
            )
        if self.autoscaling.scale_to_zero_idle_s is None:
            problems += [
                f"models[{i}].replicas.min_replicas: is 0 but autoscaling.scale_to_zero_idle_s "
                "is not set; set it, or keep min_replicas >= 1"
                for i, m in enumerate(self.models)
                if m.replicas.min_replicas == 0
            ]
        if problems:
            raise ValueError("\n".join(problems))
        return self


def _duplicates(path: str, values: list[str], what: str) -> list[str]:
    seen: dict[str, int] = {}
    problems = []
    for i, value in enumerate(values):
        if value in seen:
            problems.append(f"{path}[{i}]: duplicate {what} (same as {path}[{seen[value]}])")
        else:
            seen[value] = i
    return problems


def _field_path(loc: tuple[int | str, ...]) -> str:
    """('models', 0, 'drafter', 'path') -> 'models[0].drafter.path'."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _error_pairs(err: ValidationError) -> list[tuple[str, str]]:
    pairs = []
    for e in err.errors(include_url=False):
        path = _field_path(tuple(e["loc"]))
        if e["type"] == "value_error":
            message = str(e["ctx"]["error"])
        elif e["type"] == "extra_forbidden":
            message = "unknown field (not part of the spec)"
        else:
            message = e["msg"]
        for line in message.splitlines():
            if path:
                pairs.append((path, line))
            else:  # top-level cross-field errors name their own path: "path: message"
                own_path, _, own_message = line.partition(": ")
                pairs.append((own_path, own_message) if own_message else ("", line))
    return pairs


def spec_from_dict(
    data: Any, *, source: str | None = None, tenants_apart: bool = False
) -> DeploymentSpec:
    """Validate a parsed spec (a mapping); raise SpecError naming every failing field.
    `tenants_apart`: the tenants come separately (agentserve.tenant_config), so an empty
    `tenants` does not mean open mode."""
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise SpecError(f"{source or 'spec'}: the top level must be a mapping, got {kind}")
    try:
        return DeploymentSpec.model_validate(data, context={TENANTS_APART: tenants_apart})
    except ValidationError as err:
        pairs = _error_pairs(err)
        lines = [f"  {path}: {msg}" if path else f"  {msg}" for path, msg in pairs]
        header = f"invalid spec {source}:" if source else "invalid spec:"
        raise SpecError("\n".join([header, *lines]), pairs) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: list[Any] = []
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.append(key)
        return super().construct_mapping(node, deep=deep)


def load_spec(path: str | Path) -> DeploymentSpec:
    """Load and validate a spec from a YAML (or JSON) file; an empty file is the default."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(f"{path}: cannot read spec: {err.strerror or err}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, _UniqueKeyLoader)
    except json.JSONDecodeError as err:
        raise SpecError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError(f"{where}: invalid YAML: {problem}") from None
    return spec_from_dict({} if data is None else data, source=str(path))


def to_yaml(spec: DeploymentSpec) -> str:
    """Dump a spec as YAML that `load_spec` reads back to an equal spec."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


def spec_json_schema() -> dict[str, Any]:
    """JSON schema of DeploymentSpec (validation mode): the source of the CRD and Helm schema."""
    return DeploymentSpec.model_json_schema(mode="validation")
