"""A GPU replica's latency prior from the roofline: the model's size and the GPU's published
memory bandwidth and FLOPs (pure; the figures are data, autoscale/gpus.json; the method:
docs/autoscaling.md, "On GPU without a measured model").

A step of `b` sequences verifying `t` tokens over `context` tokens of KV cache costs
overhead + max(mem, compute), mem = (weights_bytes + b x context x kv_bytes_per_token) /
(bandwidth x bw_efficiency), compute = 2 x active_params x b x t / (bf16_flops x
flops_efficiency); `roofline_latency_model` samples it at batches 1, 2, 4, ...,
max_num_seqs and fits the LatencyModel's knee form (model.fit). The efficiencies, overhead
and context are assumptions (gpus.json "assumptions"), corrected online (step_refit.py).
The model's shape comes from its config.json (`shape_from_config`) or, without one, from
the parameter count in its id (`shape_from_model_id`: "Qwen3-8B" -> 8e9).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentserve.autoscale.model import LatencyModel, Measurement, fit

__all__ = [
    "Assumptions",
    "GpuSpec",
    "GpuTable",
    "ModelShape",
    "gpu_for",
    "load_gpu_table",
    "prefill_ms_per_token",
    "roofline_latency_model",
    "roofline_step_ms",
    "shape_from_config",
    "shape_from_model_id",
]

GPU_TABLE_PATH = Path(__file__).with_name("gpus.json")
_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "half": 2.0, "float32": 4.0, "float": 4.0}
_QUANT_BYTES = {"fp8": 1.0, "mxfp4": 0.5}  # quantization_config.quant_method -> bytes/param
_SIZE = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)([BM])(?![A-Za-z0-9])", re.IGNORECASE)
_ACTIVE = re.compile(r"(?<![A-Za-z0-9])A(\d+(?:\.\d+)?)B(?![A-Za-z0-9])", re.IGNORECASE)


@dataclass(frozen=True)
class ModelShape:
    """What a step reads and computes: `params` weights of `bytes_per_param` each (all read
    every step), `active_params` multiplied per token (a mixture of experts' routed share),
    `kv_bytes_per_token` of KV cache per token of context."""

    params: float
    active_params: float
    bytes_per_param: float
    kv_bytes_per_token: float

    @property
    def weights_bytes(self) -> float:
        return self.params * self.bytes_per_param


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's published peak figures (gpus.json row); `count` GPUs sharing the model
    (tensor parallel) add up."""

    name: str
    memory_bandwidth_gb_s: float
    bf16_dense_tflops: float
    source: str = ""
    count: int = 1


@dataclass(frozen=True)
class Assumptions:
    """The prior's guesses (gpus.json "assumptions"), not measurements."""

    bandwidth_efficiency: float
    flops_efficiency: float
    step_overhead_ms: float
    context_tokens: int
    kv_bytes_per_token_per_billion_params: float
    default_gpu: str


@dataclass(frozen=True)
class GpuTable:
    """gpus.json: rows in match order, each with the substrings its device name holds."""

    gpus: tuple[tuple[tuple[str, ...], GpuSpec], ...]
    assumptions: Assumptions


def load_gpu_table(path: Path = GPU_TABLE_PATH) -> GpuTable:
    """The GPU table; ValueError naming the file when a row or assumption is missing."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        names = {f.name for f in dataclasses.fields(Assumptions)}
        assumptions = Assumptions(**{k: v for k, v in data["assumptions"].items() if k in names})
        rows = tuple(
            (
                tuple(m.upper() for m in row["match"]),
                GpuSpec(
                    row["name"],
                    float(row["memory_bandwidth_gb_s"]),
                    float(row["bf16_dense_tflops"]),
                    row.get("source", ""),
                ),
            )
            for row in data["gpus"]
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: not a GPU table: {err!r}") from None
    return GpuTable(rows, assumptions)


def gpu_for(name: str | None, table: GpuTable) -> GpuSpec:
    """The first row whose every match substring `name` holds (case-insensitive), else the
    table's default_gpu row (an unknown or unlisted GPU)."""
    upper = (name or "").upper()
    for match, gpu in table.gpus:
        if name and all(m in upper for m in match):
            return gpu
    default = table.assumptions.default_gpu
    return next(gpu for _, gpu in table.gpus if gpu.name == default)


def _dtype_bytes(dtype: str, config: Mapping[str, Any]) -> float:
    """Bytes per activation/KV value: the spec's dtype, or for "auto" the config's."""
    if dtype == "auto":
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return _DTYPE_BYTES.get(dtype, 2.0)


def _weight_bytes(config: Mapping[str, Any], activation_bytes: float) -> float:
    """Bytes per weight: a quantized checkpoint's (bits, or fp8/mxfp4), else the dtype's."""
    quant = config.get("quantization_config") or {}
    if isinstance(quant, Mapping):
        if isinstance(quant.get("bits"), (int, float)):
            return float(quant["bits"]) / 8.0
        method = str(quant.get("quant_method", "")).lower()
        if method in _QUANT_BYTES:
            return _QUANT_BYTES[method]
    return activation_bytes


def shape_from_config(config: Mapping[str, Any], dtype: str = "auto") -> ModelShape | None:
    """The shape of a transformer from its config.json (a multimodal one's text_config);
    None when a needed size is missing. Parameters: embeddings (twice unless tied), and per
    layer attention (q, k, v, o with grouped KV heads) and a gated MLP (3 matrices; a
    mixture of experts' every expert, of which num_experts_per_tok are active)."""
    text = config.get("text_config") or config
    try:
        h, layers = int(text["hidden_size"]), int(text["num_hidden_layers"])
        vocab, heads = int(text["vocab_size"]), int(text["num_attention_heads"])
        inter = int(text.get("intermediate_size") or text["moe_intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return None
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or h // heads)
    attn = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
    experts = int(text.get("num_experts") or text.get("num_local_experts") or 0)
    expert_inter = int(text.get("moe_intermediate_size") or inter)
    shared = 3 * h * int(text.get("shared_expert_intermediate_size") or 0)
    if experts:
        mlp_all = experts * 3 * h * expert_inter + shared
        mlp_active = int(text.get("num_experts_per_tok") or 1) * 3 * h * expert_inter + shared
    else:
        mlp_all = mlp_active = 3 * h * inter
    embed = (
        vocab * h * (1 if text.get("tie_word_embeddings", config.get("tie_word_embeddings")) else 2)
    )
    act_bytes = _dtype_bytes(dtype, text if "torch_dtype" in text else config)
    return ModelShape(
        params=float(embed + layers * (attn + mlp_all)),
        active_params=float(embed + layers * (attn + mlp_active)),
        bytes_per_param=_weight_bytes(config, act_bytes),
        kv_bytes_per_token=float(2 * layers * kv_heads * head_dim * act_bytes),
    )


def shape_from_model_id(
    model_id: str, assumptions: Assumptions, dtype: str = "auto"
) -> ModelShape | None:
    """A shape from the parameter count a model id states ("Qwen3-8B", "gpt-oss-20b",
    "SmolLM2-135M"; "-A3B": 3B active of a mixture of experts), the largest one named; KV
    per token from assumptions.kv_bytes_per_token_per_billion_params. None without one."""
    name = model_id.rstrip("/").rsplit("/", 1)[-1]
    sizes = [float(n) * (1e9 if unit.upper() == "B" else 1e6) for n, unit in _SIZE.findall(name)]
    if not sizes:
        return None
    params = max(sizes)
    active = _ACTIVE.search(name)
    bytes_per = _DTYPE_BYTES.get(dtype, 2.0)
    kv = assumptions.kv_bytes_per_token_per_billion_params * params / 1e9 * bytes_per / 2.0
    return ModelShape(
        params=params,
        active_params=float(active.group(1)) * 1e9 if active else params,
        bytes_per_param=bytes_per,
        kv_bytes_per_token=kv,
    )


def roofline_step_ms(
    shape: ModelShape,
    gpu: GpuSpec,
    a: Assumptions,
    batch: int,
    tokens_per_seq: int = 1,
    context_tokens: float | None = None,
) -> float:
    """One decode step of `batch` sequences verifying `tokens_per_seq` tokens each over
    `context_tokens` (default a.context_tokens) of KV cache, ms (module docstring)."""
    context = a.context_tokens if context_tokens is None else context_tokens
    bandwidth = gpu.memory_bandwidth_gb_s * 1e9 * gpu.count * a.bandwidth_efficiency  # B/s
    flops = gpu.bf16_dense_tflops * 1e12 * gpu.count * a.flops_efficiency  # FLOP/s
    read = shape.weights_bytes + batch * context * shape.kv_bytes_per_token
    compute = 2.0 * shape.active_params * batch * tokens_per_seq
    return a.step_overhead_ms + 1e3 * max(read / bandwidth, compute / flops)


def prefill_ms_per_token(shape: ModelShape, gpu: GpuSpec, a: Assumptions) -> float:
    """What one prompt token adds to the step it is prefilled in, ms (compute bound)."""
    flops = gpu.bf16_dense_tflops * 1e12 * gpu.count * a.flops_efficiency
    return 1e3 * 2.0 * shape.active_params / flops


def roofline_latency_model(
    shape: ModelShape,
    gpu: GpuSpec,
    a: Assumptions,
    max_num_seqs: int,
    context_tokens: float | None = None,
    base: LatencyModel | None = None,
) -> LatencyModel:
    """`base` (default LatencyModel(): its acceptance and drafting fields) with the step and
    prefill costs of the roofline: model.fit through roofline_step_ms at batches 1, 2, 4,
    ... up to max_num_seqs (at least 1 and 2)."""
    batches, b = [], 1
    while b < max(2, max_num_seqs):
        batches.append(b)
        b *= 2
    batches.append(max(2, max_num_seqs))
    records = [
        Measurement(b, 0, roofline_step_ms(shape, gpu, a, b, 1, context_tokens)) for b in batches
    ]
    base = base or LatencyModel()
    fitted = fit(records, base=base)
    return dataclasses.replace(
        base,
        base_ms=fitted.base_ms,
        knee_tokens=fitted.knee_tokens,
        per_token_ms=fitted.per_token_ms,
        prefill_ms_per_token=round(prefill_ms_per_token(shape, gpu, a), 5),
    )
