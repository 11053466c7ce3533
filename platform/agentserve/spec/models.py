"""ModelSpec: one served model (weights, engine settings, drafter, replicas) and the vLLM
engine arguments its fields decide."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from agentserve.drafters.catalog import catalog_drafter
from agentserve.engine.registry import BUILTIN_ENGINES, check_engine_name
from agentserve.sources.models import (
    BUNDLED_ALIASES,
    BUNDLED_MODEL,
    is_hub_id,
    is_local_path,
    served_name,
)
from agentserve.spec.aliases import canonical_model_fields
from agentserve.spec.base import _revision_field, _Spec
from agentserve.spec.drafter import DFLASH_METHODS, DrafterSpec
from agentserve.spec.latency import LatencyModelSpec
from agentserve.spec.lora import LoraSpec
from agentserve.spec.replicas import ReplicaSpec
from agentserve.spec.routing import RoutingSpec

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
    "enable_sleep_mode": "replicas.sleep_when_idle_s",
    "tokenizer_revision": "revision",
    "download_dir": "(the Hugging Face cache: HF_HOME / AGENTSERVE_HF_HOME)",
    "stream_interval": "stream_interval_tokens",
    "enable_lora": "lora",
    "max_loras": "lora.max_loras",
    "max_lora_rank": "lora.max_lora_rank",
}
"""vLLM engine arguments that a ModelSpec field decides: `engine_args` may not set them."""

CPU_ENGINE_DEFAULTS: dict[str, Any] = {
    "dtype": "bfloat16",
    "max_model_len": 2048,
    "max_num_seqs": 16,
}
"""What a model on CPU replicas (replicas.num_gpus 0) gets where its spec leaves the field
null: the settings the CPU benchmarks were measured with (docs/benchmarks.md)."""
GPU_ENGINE_DEFAULTS: dict[str, Any] = {"dtype": "auto"}
"""... and on GPU replicas; max_model_len comes from the model's config when the spec is
resolved (agentserve.spec.device_defaults), max_num_seqs stays null (vLLM's own default)."""
VLLM_GPU_MAX_NUM_SEQS = 256
"""vLLM's default max_num_seqs on GPUs under 70 GiB (vllm/engine/arg_utils.py; 1024 above):
the batch slots the autoscaler and admission plan with where a GPU replica leaves
max_num_seqs to vLLM (the smaller of its defaults: never more requests than it runs)."""


class ModelSpec(_Spec):
    """One served model: weights, engine settings, drafter and replicas."""

    name: str = Field(
        BUNDLED_MODEL,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        description="Served model id (the request's `model`); unset: the source's Hugging "
        "Face id, or its directory's name.",
    )
    source: str = Field(
        BUNDLED_MODEL,
        description=f"{BUNDLED_MODEL} (alias: bundled), a Hugging Face id (e.g. "
        "Qwen/Qwen3-8B: downloaded once into the hub cache, $HF_HOME, before the engine "
        "starts; HF_TOKEN for gated repos; HF_HUB_OFFLINE=1 reads only the cache) or a local "
        "Hugging Face format directory (absolute or ./relative).",
    )
    revision: str | None = _revision_field("source")
    task: Literal["generate", "embed"] = Field(
        "generate",
        description="What the model serves: generate (chat, completions, responses) or "
        "embed (/v1/embeddings: vLLM's pooling runner, the model converted to an embedding "
        "model: runner pooling, convert embed; no drafter).",
    )
    dtype: Literal["bfloat16", "float16", "float32", "auto"] | None = Field(
        None,
        description="Weight and activation dtype. null = by device: on CPU replicas "
        "(replicas.num_gpus 0) bfloat16 (float32 on kinds of CPU where it measured faster "
        "through the server); on GPU replicas auto (the checkpoint's own).",
    )
    max_model_len: int | None = Field(
        None,
        ge=16,
        description="Context length: prompt + output tokens. null = by device: 2048 on CPU "
        "replicas; on GPU replicas the model's own (config.json max_position_embeddings, "
        "read from a local directory or the hub cache when the spec is resolved), which the "
        "engine fits to the GPU's memory (vLLM's auto-fit; an explicit value is used as is).",
    )
    engine: str = Field(
        "vllm",
        description="Serving engine (vLLM: its CPU and GPU builds alike).",
        # any registered engine validates (agentserve.engine.registry: e.g. the benchmarks'
        # fake); the schema, hence the CRD and Helm values schema, offers only the built-in
        json_schema_extra={"enum": list(BUILTIN_ENGINES)},
    )
    drafter: DrafterSpec = Field(default_factory=DrafterSpec, description="Speculative drafter.")
    replicas: ReplicaSpec = Field(default_factory=ReplicaSpec, description="Replicas, resources.")
    routing: RoutingSpec = Field(
        default_factory=RoutingSpec,
        description="How requests are spread over the replicas (session and prefix affinity).",
    )
    lora: LoraSpec | None = Field(
        None,
        description="LoRA adapters served beside the base weights (vLLM multi-LoRA): a "
        "request's `model` names one as <name> or <this model's name>:<name>; null = none.",
    )
    latency_model: LatencyModelSpec | None = Field(
        None,
        description="Measured step costs of this model on its replicas' hardware "
        "(`agentserve bench fit-latency` prints them): the SLA policy's capacity floor and "
        "burst detection plan with them. null = the platform's own model for the bundled "
        "model on CPU; none elsewhere (reactive scaling only).",
    )
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        description="Engine batch cap: sequences run at once. null = by device: 8 on CPU "
        "replicas; vLLM's own default on GPU replicas (256; 1024 on GPUs of 70 GiB or more), "
        f"which the autoscaler and admission plan as {VLLM_GPU_MAX_NUM_SEQS}.",
    )
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
        "null = vLLM's default (0.9). GPU replicas only.",
    )
    quantization: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[a-z0-9_-]+$",
        description="vLLM quantization method (e.g. fp8, awq, gptq, mxfp4); null = what the "
        "checkpoint's config says. Checked against the installed vLLM when an engine starts.",
    )
    tool_call_parser: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="vLLM tool-call parser that turns the model's tool-call text into "
        "`tool_calls` (e.g. hermes, llama3_json, mistral, qwen3_xml, openai); null = openai "
        "for gpt-oss models, else hermes (SmolLM2's and Qwen's format). Checked against the "
        "installed vLLM when an engine starts.",
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
    stream_interval_max_ms: float = Field(
        400.0,
        ge=0,
        le=5000,
        description="The interval grows with the streams a replica serves at once: "
        "stream_interval_ms x open streams, at most this (and never below "
        "stream_interval_ms), so the messages a replica sends per second stay about "
        "1000 / stream_interval_ms however many clients stream. Set it to "
        "stream_interval_ms for a fixed interval.",
    )
    stream_interval_tokens: int = Field(
        8,
        ge=1,
        le=256,
        description="vLLM engines: the engine hands a stream's output to the replica every "
        "this many tokens (vLLM's stream_interval; the first token and the last at once), "
        "so the replica builds and reads one chunk per interval instead of one per token. "
        "Applies only while stream_interval_ms > 0 (with 0, every step's tokens go out).",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="More vLLM engine arguments, by vLLM's EngineArgs field names (e.g. "
        "{enforce_eager: true, kv_cache_dtype: fp8}); checked against the installed vLLM "
        "when an engine starts. Settings this spec has fields for are refused here.",
    )

    @model_validator(mode="before")
    @classmethod
    def _read_aliases(cls, data: Any) -> Any:
        data = canonical_model_fields(data)  # vLLM's and Ray Serve LLM's names (aliases.py)
        if isinstance(data, dict) and "name" not in data and isinstance(data.get("source"), str):
            data = {**data, "name": served_name(data["source"])}  # Qwen/Qwen3-8B serves as that
        return data

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
    def _device_defaults(self) -> ModelSpec:
        """Fill the null engine fields with the device's defaults (CPU_ENGINE_DEFAULTS or
        GPU_ENGINE_DEFAULTS by replicas.num_gpus), leaving them out of model_fields_set: a
        dump with exclude_unset still says the spec left them to the device."""
        defaults = GPU_ENGINE_DEFAULTS if self.on_gpu else CPU_ENGINE_DEFAULTS
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)  # not __setattr__: fields_set unchanged
        return self

    @property
    def on_gpu(self) -> bool:
        """Whether this model's replicas run on GPUs (replicas.num_gpus > 0)."""
        return self.replicas.num_gpus > 0

    @property
    def engine_slots(self) -> int:
        """Sequences one replica's engine runs at once, for planning (autoscaler, admission,
        Serve's max_ongoing_requests): max_num_seqs, or VLLM_GPU_MAX_NUM_SEQS where a GPU
        replica leaves it to vLLM."""
        return self.max_num_seqs if self.max_num_seqs is not None else VLLM_GPU_MAX_NUM_SEQS

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
            and drafter.method in DFLASH_METHODS
            and self.source != BUNDLED_MODEL
            and catalog_drafter(self.source) is None  # resolution fills the catalog's
        ):
            raise ValueError(
                "drafter.path is required: the shipped drafter only fits the bundled model, "
                "and the drafter catalog lists none for this source"
            )
        if drafter.enabled and drafter.method == "hybrid" and self.async_scheduling:
            raise ValueError(
                "async_scheduling: hybrid drafting needs it off (vLLM cannot schedule "
                "asynchronously with per-request draft lengths)"
            )
        if self.lora is not None and self.task == "embed":
            raise ValueError("lora: an embedding model (task embed) serves no adapters")
        if drafter.enabled and self.task == "embed":
            raise ValueError("drafter.enabled: an embedding model (task embed) never drafts")
        context = self.max_model_len
        if drafter.enabled and context is not None and drafter.num_speculative_tokens >= context:
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
        if batched is not None and self.max_num_seqs and batched < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({batched}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): every running sequence decodes each step"
            )
        return self
