"""with_speculation_schedule fills the drafter's per-batch schedule; the CLI prints it."""

from __future__ import annotations

import pytest
import yaml
from agentserve.autoscale.model import LatencyModel, speculation_schedule
from agentserve.cli import main
from agentserve.engine.vllm_args import speculative_config
from agentserve.spec import DeploymentSpec, load_spec
from agentserve.speculation.schedule import latency_model_for, with_speculation_schedule

SPEC = DeploymentSpec.model_validate(
    {
        "models": [
            {"name": "a", "drafter": {"enabled": True}, "max_num_seqs": 8},
            {"name": "b", "max_num_seqs": 4},
        ]
    }
)


def _schedule(model):
    """The schedule `with_speculation_schedule` derives for `model` on this machine."""
    drafted = model.drafter.num_speculative_tokens
    return speculation_schedule(latency_model_for(model) or LatencyModel(), model.max_num_seqs,
                                drafted)  # fmt: skip


def test_schedule_is_set_on_drafter_models_only():
    """Without --latency-model each model's own (what a deployment of it would use)."""
    out = with_speculation_schedule(SPEC)
    a, b = out.models
    expected = speculation_schedule(latency_model_for(SPEC.models[0]) or LatencyModel(), 8, 7)
    assert a.drafter.num_speculative_tokens_per_batch_size == [list(r) for r in expected]
    docs = speculation_schedule(LatencyModel(), 8, 7)
    assert docs == [(1, 1, 4), (2, 2, 3), (3, 4, 2), (5, 8, 1)]  # docs/autoscaling.md
    assert b.drafter.num_speculative_tokens_per_batch_size is None
    assert SPEC.models[0].drafter.num_speculative_tokens_per_batch_size is None  # a copy


def test_schedule_follows_the_latency_model_and_reaches_vllm_args():
    flat = LatencyModel(alpha_1=0.0)  # nothing accepted: drafting never pays
    out = with_speculation_schedule(SPEC, flat, "a")
    assert out.models[0].drafter.num_speculative_tokens_per_batch_size == [[1, 8, 0]]
    with pytest.raises(KeyError):
        with_speculation_schedule(SPEC, model_name="b")


def test_cli_prints_a_spec_that_loads_back(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC.model_dump(mode="json")))
    assert main(["spec", "speculation-schedule", str(path), "--model", "a"]) == 0
    out = tmp_path / "out.yaml"
    out.write_text(capsys.readouterr().out)
    spec = load_spec(out)
    first = _schedule(SPEC.models[0])[0]  # this machine's latency model decides it
    assert spec.models[0].drafter.num_speculative_tokens_per_batch_size[0] == list(first)
    assert main(["spec", "speculation-schedule", str(path), "--model", "b"]) == 2


def test_speculative_config_carries_the_filled_schedule(drafter_dir):
    spec = DeploymentSpec.model_validate(
        {"models": [{"drafter": {"enabled": True, "path": str(drafter_dir)}}]}
    )
    cfg = speculative_config(with_speculation_schedule(spec).models[0])
    assert cfg["num_speculative_tokens_per_batch_size"][0] == _schedule(spec.models[0])[0]
