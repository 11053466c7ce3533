"""Engine factories for benchmarks and tests that run real vLLM replicas side by side on
a small CPU machine."""

from __future__ import annotations

import os
from typing import Any

from agentserve.engine.vllm_engine import VLLMEngine

__all__ = ["OneCoreVLLM"]


class OneCoreVLLM:
    """Engine factory: a VLLMEngine whose OpenMP threads are bound to one core picked by
    the replica's rank on its node (two replicas on two cores do not fight over both),
    with a 1 GiB KV cache."""

    def __call__(self, model: Any) -> Any:
        from ray import serve

        try:
            rank = serve.get_replica_context().rank.local_rank
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(rank % (os.cpu_count() or 1))
        except Exception:  # no rank (older Serve): leave vLLM's default binding
            pass
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
        return VLLMEngine(model)
