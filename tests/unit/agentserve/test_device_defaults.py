"""Defaults by device: ModelSpec's CPU/GPU engine defaults, and the resolution that gives a GPU
model its own context length (config.json, from a local dir or the hub cache, never
downloaded) and the catalog's DFlash drafter (k = block_size - 1)."""

from __future__ import annotations

import json

import agentserve.spec.defaults as spec_defaults
import agentserve.spec.device_defaults as device_defaults
import pytest
from agentserve.drafters.catalog import CatalogEntry
from agentserve.engine.vllm_args import batch_kwargs
from agentserve.spec import ModelSpec, SpecError, spec_from_dict
from agentserve.spec.overrides import with_speculation

QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "max_position_embeddings": 40960}
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline Hugging Face cache holding Qwen/Qwen3-8B's config.json (no weights)."""
    cache = tmp_path / "hub"
    repo = cache / "models--Qwen--Qwen3-8B"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN3_8B))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _gpu(source: str = "Qwen/Qwen3-8B", **fields) -> dict:
    return {"name": "m", "source": source, "replicas": {"num_gpus": 1}, **fields}


def test_cpu_replicas_keep_the_measured_values_left_unset():
    model = ModelSpec()
    assert (model.dtype, model.max_model_len, model.max_num_seqs) == ("bfloat16", 2048, 16)
    assert not {"dtype", "max_model_len", "max_num_seqs"} & model.model_fields_set
    assert model.engine_slots == 16


def test_gpu_replicas_leave_them_to_the_model_and_vllm():
    model = spec_from_dict({"models": [_gpu()]}).models[0]
    assert (model.dtype, model.max_model_len, model.max_num_seqs) == ("auto", None, None)
    assert model.engine_slots == 256  # vLLM's smallest GPU default, for planning
    explicit = spec_from_dict({"models": [_gpu(dtype="float16", max_num_seqs=32)]}).models[0]
    assert (explicit.dtype, explicit.max_num_seqs, explicit.engine_slots) == ("float16", 32, 32)


def test_cuda_resolution_of_an_8b_model(hub_cache):
    decisions: dict = {}
    spec = spec_from_dict({"models": [_gpu()]})
    resolved, notes = spec_defaults.resolve_drafters(spec, decisions=decisions, machine="cuda")
    model = resolved.models[0]
    assert (model.dtype, model.max_model_len) == ("auto", 40960)
    drafter = model.drafter
    assert (drafter.enabled, drafter.method, drafter.path) == (
        True,
        "dflash",
        "z-lab/Qwen3-8B-DFlash-b16",
    )
    assert drafter.num_speculative_tokens == 15  # block_size 16 - 1
    assert any("z-lab/Qwen3-8B-DFlash-b16" in n and "thinking off" in n for n in notes)
    assert any("40960" in n for n in notes)
    assert decisions["m"]["decided_by"] == "drafter catalog"
    assert batch_kwargs(model) == {"max_model_len": 40960}  # vLLM's own max_num_seqs


def test_up_on_a_cuda_machine_gives_unset_replicas_a_gpu(hub_cache, monkeypatch):
    monkeypatch.setattr(spec_defaults, "machine_class", lambda: "cuda")
    spec = spec_from_dict({"models": [{"name": "m", "source": "Qwen/Qwen3-8B"}]})
    model = spec_defaults.resolve_drafters(spec)[0].models[0]
    assert model.replicas.num_gpus == 1
    assert (model.dtype, model.max_model_len, model.max_num_seqs) == ("auto", 40960, None)
    assert model.drafter.path == "z-lab/Qwen3-8B-DFlash-b16"
    cpu = {"name": "m", "source": "Qwen/Qwen3-8B", "replicas": {"num_gpus": 0}}
    kept = spec_defaults.resolve_drafters(spec_from_dict({"models": [cpu]}))[0].models[0]
    assert (kept.replicas.num_gpus, kept.dtype, kept.max_model_len) == (0, "bfloat16", 2048)
    assert not kept.drafter.enabled  # the catalog is for GPU replicas


@pytest.mark.parametrize(
    ("speculation", "flag"),
    [("none", None), (None, False)],  # --speculation none, --no-drafter
)
def test_opting_out_keeps_plain_decoding(hub_cache, speculation, flag):
    spec = with_speculation(spec_from_dict({"models": [_gpu()]}), speculation)
    model = spec_defaults.resolve_drafters(spec, flag=flag, machine="cuda")[0].models[0]
    assert not model.drafter.enabled
    assert model.max_model_len == 40960  # the device defaults still apply


def test_speculation_dflash_drafts_with_the_catalogs_drafter(hub_cache):
    spec = with_speculation(spec_from_dict({"models": [_gpu()]}), "dflash")
    model = spec_defaults.resolve_drafters(spec, machine="cuda")[0].models[0]
    assert (model.drafter.path, model.drafter.num_speculative_tokens) == (
        "z-lab/Qwen3-8B-DFlash-b16",
        15,
    )


def test_an_uncatalogued_gpu_model_decodes_plainly_and_says_why(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    spec = spec_from_dict({"models": [_gpu(str(tmp_path))]})
    resolved, notes = spec_defaults.resolve_drafters(spec, machine="cuda")
    model = resolved.models[0]
    assert not model.drafter.enabled
    assert model.max_model_len == 8192  # a local directory's config.json
    assert any("no published DFlash drafter" in n and "catalog" in n for n in notes)


def test_a_spec_that_sets_them_wins(hub_cache):
    fields = {"max_model_len": 4096, "drafter": {"method": "ngram"}, "dtype": "bfloat16"}
    spec = spec_from_dict({"models": [_gpu(**fields)]})
    model = spec_defaults.resolve_drafters(spec, machine="cuda")[0].models[0]
    assert (model.dtype, model.max_model_len) == ("bfloat16", 4096)
    assert model.drafter.path is None  # ngram: no catalog drafter


def test_a_model_not_cached_leaves_the_context_to_the_engine(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = spec_from_dict({"models": [_gpu()]})
    resolved, notes = spec_defaults.resolve_drafters(spec, machine="cuda")
    model = resolved.models[0]
    assert model.max_model_len is None
    assert any("read by the engine when it starts" in n for n in notes)
    assert batch_kwargs(model) == {"max_model_len": -1}  # vLLM's auto-fit


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({}, {"max_model_len": -1}),  # the model's own length: fitted to the GPU's memory
        ({"max_model_len": 40960}, {"max_model_len": -1}),
        ({"max_model_len": 4096}, {"max_model_len": 4096}),  # another length: as set
        ({"max_num_seqs": 64}, {"max_model_len": -1, "max_num_seqs": 64}),
    ],
)
def test_gpu_engine_args(tmp_path, fields, want):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    model = spec_from_dict({"models": [_gpu(**fields)]}).models[0]
    assert batch_kwargs(model, tmp_path) == want


def test_cpu_engine_args_are_the_specs():
    assert batch_kwargs(ModelSpec()) == {"max_model_len": 2048, "max_num_seqs": 16}


def test_a_drafter_that_needs_remote_code_gets_it():
    entry = CatalogEntry("Qwen/Qwen3-8B", "org/d", None, 4, False, True, "https://x.invalid")
    spec = spec_from_dict({"models": [_gpu()]})
    out, _, decided = device_defaults.with_catalog_drafters(spec, None, {"qwen/qwen3-8b": entry})
    model = out.models[0]
    assert decided == {"m"} and model.engine_args == {"trust_remote_code": True}
    assert model.drafter.num_speculative_tokens == 3


@pytest.mark.parametrize("num_gpus", [1, 0])
def test_drafting_asked_for_without_a_path_takes_the_catalogs(hub_cache, num_gpus):
    qwen = {**_gpu(), "replicas": {"num_gpus": num_gpus}, "drafter": {"enabled": True}}
    model = spec_defaults.resolve_drafters(spec_from_dict({"models": [qwen]}), machine="avx2")[0]
    drafter = model.models[0].drafter
    assert (drafter.enabled, drafter.path) == (True, "z-lab/Qwen3-8B-DFlash-b16")


def test_drafting_asked_for_an_uncatalogued_model_still_needs_a_path():
    other = {**_gpu("Org/Unknown-7B"), "drafter": {"enabled": True}}
    with pytest.raises(SpecError, match="drafter catalog lists none"):
        spec_from_dict({"models": [other]})


def test_a_cpu_model_left_unset_gets_no_catalog_drafter(hub_cache):
    qwen = {**_gpu(), "replicas": {"num_gpus": 0}}
    model = spec_defaults.resolve_drafters(spec_from_dict({"models": [qwen]}), machine="avx2")[0]
    assert not model.models[0].drafter.enabled
