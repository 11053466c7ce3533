"""Step costs of a model on the CPU it runs on: what one decode step and one k-token
verification step cost, per dtype and batch size, measured in seconds at start-up
(docs/autoscaling.md, "Where the step costs come from").

`measure_profile` times the projections (GEMMs) of every layer and the LM head, with weights
of the model's shapes (only its config.json is read), at each batch x tokens, in each dtype,
on the threads this process may use: seconds of work. They are GEMM costs, not vLLM's whole
step, so verify(k) / decode here is an upper bound of the engine's (speculation.choice's
served factor corrects it where measured). Profiles are cached per machine (CPU model,
features, usable cores) and model directory under the state dir.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentserve.engine.cpu_info import CpuInfo, read_cpu_info

__all__ = [
    "DTYPES",
    "TOKENS",
    "cached_profile",
    "measure_profile",
    "profile_cache_path",
]

DTYPES = ("bfloat16", "float32")
TOKENS = (1, 2, 3, 4, 5, 8)  # tokens verified per sequence: k = 0 (plain) .. 7 drafted
BATCHES = (1, 4)
PROMPT_TOKENS = 128  # the context the steps run on (and the prefill that is timed)
PROFILE_VERSION = 1


def measure_profile(
    model_dir: str | Path,
    dtypes: Sequence[str] = DTYPES,
    batches: Sequence[int] = BATCHES,
    tokens: Sequence[int] = TOKENS,
    repeats: int = 7,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """{"machine", "model", "dtypes": {dtype: {"prefill_ms_per_token", "step_ms": {batch:
    {tokens: median ms}}}}} for the model whose config.json is in `model_dir`."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    cpu = read_cpu_info()
    out: dict[str, Any] = {
        "version": PROFILE_VERSION,
        "machine": cpu.as_dict(),
        "model": Path(model_dir).name,
        "prompt_tokens": PROMPT_TOKENS,
        "threads": torch.get_num_threads(),
        "gemm": _gemm_backend(),
        "dtypes": {},
    }
    for dtype in dtypes:
        started = time.perf_counter()
        torch_dtype = getattr(torch, dtype)
        layers, head = _weights(config, torch_dtype)
        width = config.hidden_size
        steps = {
            str(b): {
                str(n): _pass_ms(layers, head, b * n, repeats, width, torch_dtype) for n in tokens
            }
            for b in batches
        }
        prefill = _pass_ms(layers, head, PROMPT_TOKENS, 2, width, torch_dtype, 1) / PROMPT_TOKENS
        out["dtypes"][dtype] = {"prefill_ms_per_token": round(prefill, 4), "step_ms": steps}
        if progress:
            progress(f"{dtype}: {time.perf_counter() - started:.1f} s")
        del layers, head
    return out


def _weights(config, dtype):
    """Per layer the projections of a Llama-style block (q, k, v, o, gate, up, down), and
    the LM head, as GEMM callables x -> x @ W.T: random weights of the model's shapes (a
    GEMM's time does not depend on the values), each layer its own, so a pass streams all
    the weights from memory as a real forward pass does. With vLLM installed the callables
    are vLLM's own CPU GEMM dispatch (pre-packed oneDNN or sgl kernels), the ones its
    engine runs; otherwise torch's linear."""

    hidden, inter = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    kv_dim = hidden // heads * kv
    shapes = [(hidden, hidden), (kv_dim, hidden), (kv_dim, hidden), (hidden, hidden)]
    shapes += [(inter, hidden), (inter, hidden), (hidden, inter)]
    layers = [[_gemm(o, i, dtype) for o, i in shapes] for _ in range(config.num_hidden_layers)]
    return layers, _gemm(config.vocab_size, hidden, dtype)


def _gemm_backend() -> str:
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # noqa: F401
    except Exception:
        return "torch"
    return "vllm"


def _gemm(out_features: int, in_features: int, dtype):
    import torch
    import torch.nn.functional as F

    layer = torch.nn.Module()
    weight = torch.randn(out_features, in_features, dtype=dtype) * 0.02
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        linear = layer.cpu_linear
    except Exception:  # no vLLM (or not its CPU build): torch's own GEMM
        linear = F.linear
    return lambda x: linear(x, layer.weight, None)


def _pass_ms(
    layers, head, rows: int, repeats: int, hidden: int, dtype, logits_rows: int | None = None
) -> float:
    """Median ms of one pass of `rows` token rows through every layer's projections and the
    LM head (on `logits_rows` rows, default all: a verification step scores every drafted
    position; a prefill only its last)."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(rows, hidden, dtype=dtype)
    times = []
    with torch.inference_mode():
        for i in range(repeats + 2):  # two passes warm up (allocation, kernel choice)
            t0 = time.perf_counter()
            for q, k, v, o, gate, up, down in layers:
                q(x), k(x), v(x)
                a = o(x)
                x = down(F.silu(gate(a)) * up(a))
            head(x[-(logits_rows or rows) :])
            if i > 1:
                times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 3)


def profile_cache_path(model_dir: str | Path, cpu: CpuInfo, root: Path) -> Path:
    """Where the profile of this model on this machine is cached (one file per pair)."""
    key = json.dumps([str(Path(model_dir).resolve()), cpu.as_dict(), PROFILE_VERSION])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return root / "calibration" / f"{Path(model_dir).name}-{cpu.cpu_class}-{digest}.json"


def cached_profile(
    model_dir: str | Path,
    root: Path,
    measure: Callable[[], dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], bool]:
    """(profile, was_cached): the cached profile of this model on this machine, else a new
    measurement (`measure`, default measure_profile(model_dir)) written to the cache."""
    path = profile_cache_path(model_dir, read_cpu_info(), root)
    try:
        profile = json.loads(path.read_text(encoding="utf-8"))
        if profile.get("version") == PROFILE_VERSION:
            return profile, True
    except (OSError, ValueError):
        pass
    profile = (measure or (lambda: measure_profile(model_dir)))()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(profile, indent=1), encoding="utf-8")
    tmp.replace(path)
    return profile, False
