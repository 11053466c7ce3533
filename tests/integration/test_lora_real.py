"""LoRA adapters through the real engine: a small rank-8 adapter for the bundled model
(SmolLM2-135M, nothing downloaded), written in PEFT's format by the test itself with
nonzero B matrices, served beside the base weights (vLLM's multi-LoRA on CPU) by `agentserve
up --spec` as a user runs it (local Ray, the bundled model's default speculation). One engine
start for the module.

Run: .venv/bin/python -m pytest -q -m slow tests/integration/test_lora_real.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentserve.sources.models import BUNDLED_MODEL

pytestmark = pytest.mark.slow

RANK = 8
TARGETS = ("q_proj", "v_proj", "o_proj")
PROMPT = [{"role": "user", "content": "Name three colours of the rainbow."}]


def write_adapter(out: Path, model_dir: Path, seed: int = 0) -> Path:
    """A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) for
    the attention projections of every layer of the model at `model_dir`: random A and B
    (B nonzero, unlike a fresh PEFT adapter), so the adapter changes the model's output."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads", heads) * head_dim
    shapes = {
        "q_proj": (hidden, heads * head_dim),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
    }  # (in, out) features of each target
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in TARGETS:
            fan_in, fan_out = shapes[target]
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            a = torch.randn(RANK, fan_in, generator=generator) / fan_in**0.5  # [r, in]
            b = torch.randn(fan_out, RANK, generator=generator) * 0.05  # [out, r]
            tensors[f"{prefix}.lora_A.weight"] = a.contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.contiguous()
    out.mkdir(parents=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": 2 * RANK,
        "lora_dropout": 0.0, "target_modules": list(TARGETS), "bias": "none",
        "fan_in_fan_out": False, "base_model_name_or_path": str(model_dir),
    }  # fmt: skip
    (out / "adapter_config.json").write_text(json.dumps(adapter_config))
    return out


@pytest.fixture(scope="module")
def client(start_up, tmp_path_factory):
    """`agentserve up --spec` (local Ray, the real engine) serving the bundled model with one
    adapter written by the test; an httpx client on its URL."""
    import httpx
    from agentserve.sources.models import resolve_model

    root = tmp_path_factory.mktemp("lora")
    adapter = write_adapter(root / "tuned", resolve_model("bundled"))
    spec = root / "lora.yaml"
    spec.write_text(
        json.dumps(
            {
                "models": [
                    {
                        "name": BUNDLED_MODEL,
                        "max_model_len": 512,
                        "lora": {"adapters": {"tuned": str(adapter)}, "max_lora_rank": RANK},
                    }
                ]
            }
        )
    )
    server = start_up("--spec", str(spec), ready_timeout_s=900)
    with httpx.Client(base_url=server.url, timeout=300, trust_env=False) as http:
        yield http


def _greedy(client, model):
    body = {"model": model, "messages": PROMPT, "max_tokens": 16, "temperature": 0}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    return answer["model"], answer["choices"][0]["message"]["content"]


def test_the_adapter_changes_greedy_output(client):
    base_model, base = _greedy(client, BUNDLED_MODEL)
    named, tuned = _greedy(client, "tuned")
    assert (base_model, named) == (BUNDLED_MODEL, "tuned")
    assert base and tuned and tuned != base
    assert _greedy(client, f"{BUNDLED_MODEL}:tuned") == ("tuned", tuned)  # the same adapter
    assert _greedy(client, BUNDLED_MODEL) == (BUNDLED_MODEL, base)  # the base is untouched


def test_models_lists_the_adapter_and_unknown_adapters_are_404(client):
    cards = client.get("/v1/models").json()["data"]
    assert [(c["id"], c.get("parent")) for c in cards] == [
        (BUNDLED_MODEL, None),
        ("tuned", BUNDLED_MODEL),
    ]
    r = client.post(
        "/v1/chat/completions", json={"model": f"{BUNDLED_MODEL}:other", "messages": PROMPT}
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
