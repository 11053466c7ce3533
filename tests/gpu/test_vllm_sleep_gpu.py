"""On a CUDA GPU: idle sleep of a replica's real engine (replicas.sleep_when_idle_s ->
vLLM's enable_sleep_mode, level 1). VLLMEngine starts the bundled model in float16; the
replica's sleep gate (serve/sleep_gate.py) puts it to sleep once idle, which frees GPU
memory (weights to CPU RAM, KV cache discarded); the next request wakes it in under
WAKE_LIMIT_S and greedy output is the same before and after. Skipped on CPU
(tests/conftest.py), where vLLM has no sleep mode.

The engine runs in its own spawned process, so GPU memory is free after it.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

PROMPTS = ["What is 12 plus 30?", "Name three colours of the rainbow."]
MAX_TOKENS = 32
IDLE_S = 1.0
WAKE_LIMIT_S = 10.0
MODEL = {"name": "smollm2-fp16", "source": "bundled", "dtype": "float16",
         "replicas": {"num_gpus": 1, "sleep_when_idle_s": IDLE_S},
         "max_model_len": 2048, "max_num_seqs": 8, "gpu_memory_utilization": 0.3}  # fmt: skip


def _sleep_and_wake() -> dict:
    """In a fresh process: start the engine, decode, let it fall asleep, decode again."""
    import asyncio

    import torch
    from agentserve.engine.vllm_engine import VLLMEngine
    from agentserve.serve.sleep_gate import SleepGate
    from agentserve.spec import ModelSpec
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)

    async def decode(engine: VLLMEngine, gate: SleepGate, tag: str) -> list[list[int]]:
        outputs = []
        for i, prompt in enumerate(PROMPTS):
            async with gate.serving():
                final = None
                async for out in engine.async_llm.generate(prompt, params, f"{tag}-{i}"):
                    final = out
            outputs.append(list(final.outputs[0].token_ids))
        return outputs

    async def run() -> dict:
        engine = VLLMEngine(ModelSpec.model_validate(MODEL), overrides={"seed": 0})
        await engine.start()
        try:
            gate = SleepGate(engine, IDLE_S)
            before = await decode(engine, gate, "before")
            free_awake = torch.cuda.mem_get_info()[0]
            for _ in range(600):  # the gate sleeps IDLE_S after the last request
                if gate.sleeping:
                    break
                await asyncio.sleep(0.1)
            slept = await engine.is_sleeping()
            free_asleep = torch.cuda.mem_get_info()[0]
            after = await decode(engine, gate, "after")
            gate.close()
            return {"before": before, "after": after, "slept": slept,
                    "awake_now": not await engine.is_sleeping(), "wake_s": gate.wake_s,
                    "freed_bytes": free_asleep - free_awake}  # fmt: skip
        finally:
            await engine.stop()

    return asyncio.run(run())


def test_an_idle_engine_sleeps_frees_gpu_memory_and_wakes_fast_with_the_same_output():
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        result = pool.submit(_sleep_and_wake).result(timeout=900)
    assert result["slept"] and result["awake_now"]
    assert result["freed_bytes"] > 100 * 2**20, result["freed_bytes"]  # weights + KV cache
    assert result["wake_s"] is not None and result["wake_s"] < WAKE_LIMIT_S, result["wake_s"]
    assert result["before"] == result["after"] and all(len(o) > 5 for o in result["after"])
