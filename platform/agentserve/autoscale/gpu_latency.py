"""The latency model the SLA policy starts from: the measured one where there is one, else
on GPU replicas the roofline prior of the model's size on the GPU it runs on.

`policy_latency_model(model)` is speculation.schedule.latency_model_for's model (the model's own
`latency_model`, the bundled model's measured or calibrated one), else, for a vLLM model on
GPU replicas, `gpu_prior_latency_model`: roofline.roofline_latency_model of the model's
shape (its config.json where readable without a download, else the parameter count its id
states) on the GPU named by NVML or torch on this machine (`local_gpu_name`; a head node
without GPUs, or an unlisted GPU, gets gpus.json's conservative default row), times the
replica's tensor-parallel GPUs. The prior assumes no draft is accepted (tau 1): the
replicas' own time per output token corrects it online (step_refit.py). The default
speculation schedule does not use the prior (latency_model_for alone decides that).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from agentserve.autoscale.model import LatencyModel
from agentserve.autoscale.roofline import (
    Assumptions,
    GpuTable,
    ModelShape,
    gpu_for,
    load_gpu_table,
    roofline_latency_model,
    shape_from_config,
    shape_from_model_id,
)
from agentserve.spec import DFLASH_METHODS, ModelSpec
from agentserve.speculation.schedule import latency_model_for

__all__ = [
    "gpu_prior_latency_model",
    "is_roofline_prior",
    "local_gpu_name",
    "model_shape",
    "policy_latency_model",
]

ConfigOf = Callable[[str, str | None], Path | None]


def _source_config(source: str, revision: str | None) -> Path | None:
    from agentserve.spec.device_defaults import source_config  # lazy: hub ids need the hub

    return source_config(source, revision)


def local_gpu_name() -> str | None:
    """The name of this machine's first GPU: NVML's (it creates no CUDA context in this
    process), else torch.cuda.get_device_name where CUDA is available; None without one."""
    try:
        import pynvml  # nvidia-ml-py, a vLLM dependency on CUDA

        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
        return name.decode() if isinstance(name, bytes) else str(name)
    except ImportError:
        pass
    except Exception:  # pynvml.NVMLError: no driver, no device
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def model_shape(model: ModelSpec, a: Assumptions, config_of: ConfigOf) -> ModelShape | None:
    """The model's shape from its config.json (`config_of(source, revision)`), else from the
    parameter count in its id; None with neither."""
    path = config_of(model.source, model.revision)
    if path is not None:
        try:
            shape = shape_from_config(json.loads(path.read_text(encoding="utf-8")), model.dtype)
        except (OSError, ValueError, AttributeError):
            shape = None
        if shape is not None:
            return shape
    return shape_from_model_id(model.source, a, model.dtype)


def gpu_prior_latency_model(
    model: ModelSpec,
    gpu_name: str | None,
    config_of: ConfigOf = _source_config,
    table: GpuTable | None = None,
) -> LatencyModel | None:
    """The roofline prior of a vLLM model on GPU replicas of `gpu_name` (None: unknown, the
    table's default row); None on CPU replicas or where the model's size is unknown."""
    if model.engine != "vllm" or not model.on_gpu:
        return None
    table = table or load_gpu_table()
    a = table.assumptions
    shape = model_shape(model, a, config_of)
    if shape is None:
        return None
    gpu = dataclasses.replace(gpu_for(gpu_name, table), count=model.tensor_parallel_size)
    context = min(a.context_tokens, model.max_model_len or a.context_tokens)
    drafting = model.drafter.enabled and model.drafter.method in DFLASH_METHODS
    base = LatencyModel(alpha_1=0.0, alpha_drop_per_doubling=0.0, drafter_every_step=drafting)
    return roofline_latency_model(shape, gpu, a, model.engine_slots, context, base)


def policy_latency_model(
    model: ModelSpec,
    gpu_name: Callable[[], str | None] | None = None,
    config_of: ConfigOf | None = None,
) -> LatencyModel | None:
    """The model's measured latency model (latency_model_for), else on GPU replicas the
    roofline prior on the GPU `gpu_name()` names (default local_gpu_name; `config_of`
    default: the config.json readable without a download); None otherwise."""
    measured = latency_model_for(model)
    if measured is not None or not model.on_gpu:
        return measured
    name = (gpu_name or local_gpu_name)()
    return gpu_prior_latency_model(model, name, config_of or _source_config)


def is_roofline_prior(model: ModelSpec) -> bool:
    """Whether the policy plans `model` with the roofline prior (GPU replicas, nothing
    measured): the one it refits online from the replicas' TPOT (step_refit.py)."""
    return model.on_gpu and latency_model_for(model) is None
