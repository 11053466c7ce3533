"""Step-cost profiles (engine/step_costs.py): measured from a model's config alone, cached
per machine and model; and the decisions `agentserve up` exports reach /metrics."""

from __future__ import annotations

import json

from agentserve.engine import step_costs
from agentserve.engine.cpu_info import read_cpu_info
from agentserve.serve.metrics import ServingMetrics
from agentserve.speculation.calibration import DECISIONS_ENV, export_decisions

TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
}


def _tiny(tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    return model


def test_a_profile_has_every_dtype_batch_and_token_count(tmp_path):
    profile = step_costs.measure_profile(_tiny(tmp_path), batches=(1, 2), tokens=(1, 3), repeats=1)
    assert profile["machine"] == read_cpu_info().as_dict()
    assert profile["model"] == "tiny" and profile["gemm"] in ("vllm", "torch")
    assert set(profile["dtypes"]) == set(step_costs.DTYPES)
    for costs in profile["dtypes"].values():
        assert set(costs["step_ms"]) == {"1", "2"}
        for by_tokens in costs["step_ms"].values():
            assert set(by_tokens) == {"1", "3"} and all(v > 0 for v in by_tokens.values())
        assert costs["prefill_ms_per_token"] > 0


def test_the_profile_is_measured_once_per_machine_and_model(tmp_path):
    model, calls = _tiny(tmp_path), []

    def measure():
        calls.append(1)
        return {"version": step_costs.PROFILE_VERSION, "dtypes": {}, "n": len(calls)}

    first, cached = step_costs.cached_profile(model, tmp_path / "cache", measure)
    assert not cached and calls == [1]
    again, cached = step_costs.cached_profile(model, tmp_path / "cache", measure)
    assert cached and again == first and calls == [1]
    path = step_costs.profile_cache_path(model, read_cpu_info(), tmp_path / "cache")
    assert path.is_file() and read_cpu_info().cpu_class in path.name
    path.write_text("{not json")  # a damaged cache is measured again, not an error
    _, cached = step_costs.cached_profile(model, tmp_path / "cache", measure)
    assert not cached and calls == [1, 1]


def test_exported_decisions_are_metrics(monkeypatch):
    monkeypatch.setenv(DECISIONS_ENV, "{}")  # restored (removed) after the test
    export_decisions(
        {
            "m": {
                "decided_by": "calibration",
                "method": "ngram",
                "k": 7,
                "dtype": "bfloat16",
                "machine": "avx512",
                "predicted_speedup": 2.4,
            }
        }
    )
    text = ServingMetrics().exposition().decode()
    assert (
        'agentserve_speculation_choice{decided_by="calibration",dtype="bfloat16",k="7",'
        'machine="avx512",method="ngram",model="m"} 1.0'
    ) in text
    assert 'agentserve_speculation_predicted_speedup{model="m"} 2.4' in text
