"""`agentserve up --model HF_ID|PATH [--dtype] [--max-model-len]`: the spec it serves, on a
CPU machine and on a CUDA one (no Ray, no engine)."""

from __future__ import annotations

import io
import json

import agentserve.spec.defaults as spec_defaults
import pytest
from agentserve.cli import build_parser
from agentserve.cli.console import Console
from agentserve.cli.up import base_spec, load_up_spec, run_up
from agentserve.spec import BUNDLED_MODEL, SpecError
from agentserve.spec.overrides import served_name
from agentserve.speculation.calibration import DECISIONS_ENV


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "my-model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    return path


@pytest.fixture
def machine(monkeypatch):
    """Which kind of machine `up` sees (spec_defaults.machine_class)."""
    monkeypatch.setenv(DECISIONS_ENV, "{}")  # load_up_spec exports its decisions here

    def set_to(kind: str) -> None:
        monkeypatch.setattr(spec_defaults, "machine_class", lambda: kind)

    return set_to


def _up(*argv: str):
    return build_parser().parse_args(["up", *argv])


def test_up_model_dir_serves_it_on_cpu_with_cpu_defaults(model_dir, machine):
    machine("avx2")
    spec, _ = load_up_spec(_up("--model", str(model_dir)))
    (model,) = spec.models
    assert (model.name, model.source) == ("my-model", str(model_dir))
    assert model.replicas.num_gpus == 0
    assert (model.dtype, model.max_model_len, model.max_num_seqs) == ("bfloat16", 2048, 16)
    assert not model.drafter.enabled  # no CPU figures for this model: plain decoding


def test_the_same_command_on_a_cuda_machine_gets_the_gpu_defaults(model_dir, machine):
    machine("cuda")
    spec, notes = load_up_spec(_up("--model", str(model_dir)))
    (model,) = spec.models
    assert model.replicas.num_gpus == 1
    assert (model.dtype, model.max_model_len, model.max_num_seqs) == ("auto", 8192, None)
    assert not model.drafter.enabled and any("no published DFlash drafter" in n for n in notes)


def test_dtype_and_context_flags_win(model_dir, machine):
    machine("cuda")
    args = _up("--model", str(model_dir), "--dtype", "float16", "--max-model-len", "4096")
    (model,) = load_up_spec(args)[0].models
    assert (model.dtype, model.max_model_len) == ("float16", 4096)


def test_a_bare_directory_name_is_served_by_its_absolute_path(model_dir, monkeypatch):
    monkeypatch.chdir(model_dir.parent)
    (model,) = base_spec(_up("--model", "my-model")).models
    assert (model.name, model.source) == ("my-model", str(model_dir))


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"),
        ("bundled", BUNDLED_MODEL),
        ("/models/My Model (v2)", "My-Model--v2-"),
    ],
)
def test_served_name(source, name):
    assert served_name(source) == name


def test_no_model_serves_the_bundled_one():
    (model,) = base_spec(_up()).models
    assert model.source == BUNDLED_MODEL


def test_model_with_spec_is_refused(tmp_path, model_dir):
    spec = tmp_path / "spec.yaml"
    spec.write_text("models: []\n")
    with pytest.raises(SpecError, match="--model and --spec"):
        base_spec(_up("--model", str(model_dir), "--spec", str(spec)))
    out, err = io.StringIO(), io.StringIO()
    code = run_up(_up("--model", str(model_dir), "--spec", str(spec)), Console(out, err))
    assert code == 2 and "--model and --spec" in err.getvalue()
