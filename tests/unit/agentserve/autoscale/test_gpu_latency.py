"""The policy's latency model on GPU: the roofline prior where nothing is measured."""

from __future__ import annotations

import json

import pytest
from agentserve.autoscale.gpu_latency import gpu_prior_latency_model, policy_latency_model
from agentserve.spec import DeploymentSpec

LLAMA_8B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}


def _model(source="org/Some-8B", num_gpus=1, **extra):
    replicas = {"min_replicas": 1, "max_replicas": 4, "num_gpus": num_gpus}
    data = {"name": "m", "source": source, "replicas": replicas, "max_num_seqs": 32} | extra
    return DeploymentSpec.model_validate({"models": [data]}).models[0]


def _no_config(source, revision):
    return None


def test_prior_from_config_json_on_h100(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    model = _model(source=str(tmp_path), max_model_len=8192)
    prior = gpu_prior_latency_model(
        model, "NVIDIA H100 80GB HBM3", lambda s, r: tmp_path / "config.json"
    )
    # 10.12 ms at batch 1 by hand (test_roofline.py); context 2048 of the 8192 allowed
    assert prior.step_ms(1) == pytest.approx(10.12, abs=0.05)
    assert prior.alpha_1 == 0.0  # no acceptance assumed
    assert prior.prefill_ms_per_token == pytest.approx(0.0325, abs=2e-4)


def test_prior_from_the_model_id_without_a_config():
    prior = gpu_prior_latency_model(_model("Qwen/Qwen3-8B"), "NVIDIA H100 PCIe", _no_config)
    # 16e9 B at 2.0 TB/s x 0.6: 13.3 ms + 2 ms overhead, + KV 2048 x 128 KiB per sequence
    assert prior.step_ms(1) == pytest.approx(15.33 + 0.224, abs=0.1)


def test_tensor_parallel_halves_the_weight_read():
    one = gpu_prior_latency_model(_model("Qwen/Qwen3-8B"), "H100", _no_config)
    two = gpu_prior_latency_model(
        _model("Qwen/Qwen3-8B", num_gpus=2, tensor_parallel_size=2), "H100", _no_config
    )
    assert two.step_ms(1) - 2.0 == pytest.approx((one.step_ms(1) - 2.0) / 2, rel=0.02)


def test_unknown_gpu_gets_the_conservative_default():
    known = gpu_prior_latency_model(_model("Qwen/Qwen3-8B"), "NVIDIA H100", _no_config)
    unknown = gpu_prior_latency_model(_model("Qwen/Qwen3-8B"), None, _no_config)
    assert unknown.step_ms(8) > 2 * known.step_ms(8)


def test_no_prior_on_cpu_or_without_a_size():
    assert gpu_prior_latency_model(_model(num_gpus=0), "H100", _no_config) is None
    assert gpu_prior_latency_model(_model("org/big-model"), "H100", _no_config) is None


def test_policy_model_prefers_the_measured_one():
    own = {"base_ms": 12.0, "per_token_ms": 0.05, "knee_tokens": 16, "prefill_ms_per_token": 0.1}
    measured = _model("Qwen/Qwen3-8B", latency_model=own)
    assert policy_latency_model(measured, lambda: "H100", _no_config).base_ms == 12.0
    prior = policy_latency_model(_model("Qwen/Qwen3-8B"), lambda: "H100", _no_config)
    assert prior.step_ms(1) == pytest.approx(gpu_prior_latency_model(
        _model("Qwen/Qwen3-8B"), "H100", _no_config).step_ms(1))  # fmt: skip
    assert policy_latency_model(_model(num_gpus=0), lambda: "H100", _no_config) is None


def test_the_prior_reaches_the_deployments_autoscaling_policy(monkeypatch):
    from agentserve.autoscale import gpu_latency
    from agentserve.serve.app import deployment_options

    monkeypatch.setattr(gpu_latency, "local_gpu_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(gpu_latency, "_source_config", _no_config)
    model = _model("Qwen/Qwen3-8B")
    spec = DeploymentSpec.model_validate({"models": [model.model_dump(exclude_unset=True)]})
    options = deployment_options(spec.models[0], spec)
    planned = options["autoscaling_config"]["policy"]["policy_kwargs"]["model"]
    # 16e9 B at 4.8 TB/s x 0.6 = 5.56 ms + 2 ms
    assert planned["base_ms"] + planned["per_token_ms"] == pytest.approx(7.56 + 0.093, abs=0.1)
