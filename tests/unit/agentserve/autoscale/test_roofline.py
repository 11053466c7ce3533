"""The roofline latency prior: model shapes, the GPU table, step and prefill costs."""

from __future__ import annotations

import json

import pytest
from agentserve.autoscale.roofline import (
    GPU_TABLE_PATH,
    gpu_for,
    load_gpu_table,
    prefill_ms_per_token,
    roofline_latency_model,
    roofline_step_ms,
    shape_from_config,
    shape_from_model_id,
)

# Llama-3.1-8B's config.json (the sizes the shape needs)
LLAMA_8B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
TABLE = load_gpu_table()
A = TABLE.assumptions


def test_llama_8b_shape_by_hand():
    # embeddings + lm_head 2 x 128256 x 4096 = 1.0507e9; per layer attention
    # 2 x 4096 x 4096 + 2 x 4096 x 1024 = 41.94e6, MLP 3 x 4096 x 14336 = 176.16e6:
    # 32 x 218.1e6 = 6.979e9; total 8.030e9. KV: 2 x 32 layers x 8 heads x 128 x 2 B = 128 KiB
    shape = shape_from_config(LLAMA_8B)
    assert shape is not None
    assert shape.params == pytest.approx(8.030e9, rel=1e-3)
    assert shape.active_params == shape.params
    assert shape.bytes_per_param == 2.0
    assert shape.kv_bytes_per_token == 131072
    assert shape_from_config(LLAMA_8B, "float32").kv_bytes_per_token == 262144


def test_moe_shape_counts_every_expert_and_the_active_ones():
    moe = LLAMA_8B | {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 1024}
    shape = shape_from_config(moe)
    expert = 3 * 4096 * 1024
    attn = 2 * 4096 * 4096 + 2 * 4096 * 1024
    embed = 2 * 128256 * 4096
    assert shape.params == embed + 32 * (attn + 8 * expert)
    assert shape.active_params == embed + 32 * (attn + 2 * expert)


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"quantization_config": {"quant_method": "fp8"}}, 1.0),
        ({"quantization_config": {"bits": 4, "quant_method": "gptq"}}, 0.5),
        ({"text_config": LLAMA_8B}, 2.0),  # multimodal: the text model's sizes
    ],
)
def test_weight_bytes_of_quantized_and_nested_configs(config, expected):
    shape = shape_from_config(LLAMA_8B | config if "text_config" not in config else config)
    assert shape.bytes_per_param == expected


def test_config_without_sizes_gives_no_shape():
    assert shape_from_config({"hidden_size": 4096}) is None


@pytest.mark.parametrize(
    "model_id, params, active",
    [
        ("Qwen/Qwen3-8B", 8e9, 8e9),
        ("meta-llama/Llama-3.1-8B-Instruct", 8e9, 8e9),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", 30e9, 3e9),
        ("openai/gpt-oss-20b", 20e9, 20e9),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", 135e6, 135e6),
    ],
)
def test_parameter_count_from_the_model_id(model_id, params, active):
    shape = shape_from_model_id(model_id, A)
    assert (shape.params, shape.active_params) == (params, active)
    # the assumed KV per token: 16 KiB per billion parameters in bf16
    assert shape.kv_bytes_per_token == pytest.approx(16384 * params / 1e9)


def test_a_model_id_without_a_size_gives_no_shape():
    assert shape_from_model_id("/models/my-finetune", A) is None


@pytest.mark.parametrize(
    "device, row",
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA GeForce RTX 4090", A.default_gpu),  # unlisted: the conservative default
        (None, A.default_gpu),
    ],
)
def test_gpu_rows_by_device_name(device, row):
    assert gpu_for(device, TABLE).name == row


def test_every_gpu_row_names_its_source():
    rows = json.loads(GPU_TABLE_PATH.read_text())["gpus"]
    assert rows and all(r["source"] for r in rows)


def test_8b_bf16_decode_step_on_h100_by_hand():
    # weights 8.03e9 x 2 B = 16.06 GB at 3.35 TB/s x 0.6 = 2.01 TB/s: 7.99 ms, + 2 ms overhead
    # = 9.99 ms; each sequence reads 2048 x 128 KiB = 268 MB of KV: + 0.1335 ms per sequence.
    # batch 1: 10.12 ms; batch 32: 14.26 ms (memory bound: 32 tokens x 16.06 GFLOP at
    # 989 TFLOPS x 0.5 is 1.04 ms of compute)
    shape, h100 = shape_from_config(LLAMA_8B), gpu_for("NVIDIA H100 80GB HBM3", TABLE)
    assert roofline_step_ms(shape, h100, A, 1) == pytest.approx(10.12, abs=0.02)
    assert roofline_step_ms(shape, h100, A, 32) == pytest.approx(14.26, abs=0.03)
    # 2 x 8.03e9 FLOP per prompt token at 494.5 TFLOPS: 0.0325 ms
    assert prefill_ms_per_token(shape, h100, A) == pytest.approx(0.0325, abs=2e-4)
    model = roofline_latency_model(shape, h100, A, max_num_seqs=64)
    for batch in (1, 8, 32, 64):
        assert model.step_ms(batch) == pytest.approx(roofline_step_ms(shape, h100, A, batch), 0.02)


def test_compute_bound_when_tokens_pass_the_ridge():
    # H100 bf16: 494.5 TFLOPS / 2.01 TB/s = 246 FLOP per byte read; with no KV read, a step
    # of 8B weights turns compute bound past ~246 tokens
    shape = shape_from_config(LLAMA_8B)
    h100 = gpu_for("H100", TABLE)
    few, many = (roofline_step_ms(shape, h100, A, 1, t, context_tokens=0) for t in (100, 1000))
    assert few == pytest.approx(9.99, abs=0.02)  # memory bound: the weights alone
    assert many == pytest.approx(2.0 + 1e3 * 2 * shape.params * 1000 / 494.5e12, rel=1e-3)


def test_tensor_parallel_gpus_add_bandwidth():
    import dataclasses

    shape = shape_from_config(LLAMA_8B)
    one = gpu_for("H100", TABLE)
    two = dataclasses.replace(one, count=2)
    solo, pair = (roofline_step_ms(shape, g, A, 1) for g in (one, two))
    assert pair - A.step_overhead_ms == pytest.approx((solo - A.step_overhead_ms) / 2)


def test_faster_gpu_gives_faster_steps():
    shape = shape_from_config(LLAMA_8B)
    steps = [roofline_step_ms(shape, gpu_for(n, TABLE), A, 8) for n in ("L4", "A100", "H200")]
    assert steps == sorted(steps, reverse=True)
