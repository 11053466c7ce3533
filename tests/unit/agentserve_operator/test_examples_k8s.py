"""The GPU example deployments (examples/0[5-7]-k8s-*/values.yaml), run the only way they
can run here: rendered by `helm template`, deployed by the operator into a fake cluster,
every manifest validated (kubernetes-validate --strict; the RayService against KubeRay's
published CRD of each supported version, strictly; Ray Serve's own config schema), and
the vLLM engine arguments each replica would get built by engine/vllm_args.py, with its Hugging
Face sources resolved offline from a hub cache laid out as huggingface_hub writes it."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import yaml
from agentserve.engine.vllm_args import engine_kwargs
from agentserve.sources.models import resolve_model
from agentserve.tenant_config import spec_from_app_args
from agentserve_operator import kuberay as kr
from agentserve_operator.fake import FakeCluster
from agentserve_operator.reconcile import reconcile
from hub_cache import write_snapshot
from kuberay_crds import crd
from kuberay_crds import validate as validate_against_kuberay
from operator_cases import allow_references
from serve_config_schema import SERVE_CONFIG_SCHEMA
from test_helm import HELM, chart, helm  # noqa: F401  (the chart fixture)

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = {p.parent.name: p for p in sorted((ROOT / "examples").glob("*-k8s-*/values.yaml"))}
kv = pytest.importorskip("kubernetes_validate")
pytestmark = pytest.mark.skipif(HELM is None, reason="helm not found: run helm/install-helm.sh")
K8S = "1.30"

# published drafters' config.json shapes (z-lab model cards: layers, hidden, block size,
# target layers); the block size is what the engine-args check reads
DRAFTERS = {
    "z-lab/gpt-oss-120b-DFlash": dict(hidden_size=2880, vocab_size=201088, num_target_layers=36,
                                      target_layer_ids=[1, 9, 17, 25, 33], block_size=10,
                                      mask_token_id=200017, num_hidden_layers=8,
                                      num_attention_heads=64, num_key_value_heads=8,
                                      head_dim=64, intermediate_size=7680),
    "z-lab/Qwen3-8B-DFlash-b16": dict(hidden_size=4096, vocab_size=151936, num_target_layers=36,
                                      target_layer_ids=[1, 9, 17, 25, 33], block_size=16,
                                      mask_token_id=151669, num_hidden_layers=5,
                                      num_attention_heads=32, num_key_value_heads=8,
                                      head_dim=128, intermediate_size=12288),
}  # fmt: skip


def test_every_gpu_example_has_a_readme_and_a_case_here():
    assert set(EXAMPLES) == set(EXPECTED)
    for name in EXAMPLES:
        assert (ROOT / "examples" / name / "README.md").is_file(), name


@functools.cache
def _rendered(chart_dir: Path, example: str) -> str:
    return helm("template", "rel", str(chart_dir), "-f", str(EXAMPLES[example]))


def _render(chart_dir: Path, example: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(_rendered(chart_dir, example)) if d]


def _deploy(cr: dict, version: str = kr.DEFAULT) -> FakeCluster:
    """The operator reconciles the rendered CR in a cluster running KubeRay `version` (its
    RayService CRD installed); the tenants' keys come from the Secret."""
    cluster = FakeCluster(crd_bodies={kr.RAYSERVICE_CRD: crd(version)})
    secret = cr["spec"]["kubernetes"]["api_key_secret"]
    keys = {t["name"]: f"sk-{t['name']}" for t in cr["spec"]["tenants"]}
    cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
                 "stringData": keys})  # fmt: skip
    allow_references(cluster, cr)
    result = reconcile(cluster, cluster.put(cr), "2030-01-01T00:00:00Z")
    assert result.error is None, result.error
    return cluster


def _validate_children(cluster: FakeCluster, version: str = kr.DEFAULT) -> tuple[dict, dict]:
    """Validate what the operator applied (the RayService against KubeRay `version`'s CRD);
    return (RayService, its Serve config)."""
    [rs] = [o for o in cluster.objects.values() if o["kind"] == "RayService"]
    for obj in cluster.objects.values():
        if obj["kind"] in ("ConfigMap", "Service"):
            kv.validate(_applied(obj), K8S, strict=True)
    ray_cluster = rs["spec"]["rayClusterConfig"]
    for group in [ray_cluster["headGroupSpec"], *ray_cluster["workerGroupSpecs"]]:
        kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                     "template": group["template"]}, K8S, strict=True)  # fmt: skip
    import jsonschema
    from ray.serve.schema import ServeDeploySchema

    validate_against_kuberay(_applied(rs), version)
    serve_config = yaml.safe_load(rs["spec"]["serveConfigV2"])
    jsonschema.validate(serve_config, SERVE_CONFIG_SCHEMA)
    ServeDeploySchema.model_validate(serve_config)  # Ray Serve's own schema (bundles, ...)
    return rs, serve_config


def _applied(obj: dict) -> dict:
    """The object as the operator applied it (fake-server bookkeeping removed)."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "generation")}
    return {k: v for k, v in {**obj, "metadata": meta}.items() if k != "status"}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An offline hub cache holding each example's model config and drafter (stand-ins)."""
    from dflash.config import DFlashConfig

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hf" / "hub"
    for repo, shape in DRAFTERS.items():
        write_snapshot(cache, repo, {"config.json": DFlashConfig(**shape).to_hf_dict()})
    for case in EXPECTED.values():
        write_snapshot(cache, case["source"], {"config.json": {"model_type": "stand-in"}})
    return cache


EXPECTED = {
    "05-k8s-gpt-oss-120b": {
        "source": "openai/gpt-oss-120b", "tp": 8, "pp": 1, "pod_gpus": 8, "pods": (1, 1),
        "drafter": ("z-lab/gpt-oss-120b-DFlash", 9), "strategy": "STRICT_PACK",
    },
    "06-k8s-qwen3-8b-dflash": {
        "source": "Qwen/Qwen3-8B", "tp": 1, "pp": 1, "pod_gpus": 1, "pods": (1, 8),
        "drafter": ("z-lab/Qwen3-8B-DFlash-b16", 15), "strategy": None,
    },
    "07-k8s-pipeline-parallel": {
        "source": "Qwen/Qwen3-235B-A22B-Instruct-2507", "tp": 8, "pp": 2, "pod_gpus": 8,
        "pods": (2, 2), "drafter": None, "strategy": "PACK",
    },
}  # fmt: skip


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_example_renders_validates_and_deploys(chart, example):  # noqa: F811
    case = EXPECTED[example]
    helm("lint", "--strict", str(chart), "-f", str(EXAMPLES[example]))
    objs = _render(chart, example)
    for obj in objs:
        if not obj["apiVersion"].startswith(("agentserve.dev", "monitoring.coreos.com")):
            kv.validate(obj, K8S, strict=True)
    [pvc] = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    [cr] = [o for o in objs if o["kind"] == "AgentServe"]
    assert cr["spec"]["kubernetes"]["hub_cache"]["claim_name"] == pvc["metadata"]["name"]
    for version in kr.SUPPORTED:
        rs, serve_config = _validate_children(_deploy(cr, version), version)

    [group] = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    pod = group["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(case["pod_gpus"])
    assert (group["minReplicas"], group["maxReplicas"]) == case["pods"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_HOME"]["value"] == "/hf-cache" and "HF_HUB_OFFLINE" not in env
    [model_deployment] = [d for d in serve_config["applications"][0]["deployments"]
                          if d["name"].startswith("model-")]  # fmt: skip
    bundles = model_deployment.get("placement_group_bundles", [])
    world = case["tp"] * case["pp"]
    assert len(bundles) == (world if world > 1 else 0)
    assert model_deployment.get("placement_group_strategy") == case["strategy"]


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_example_replica_gets_the_intended_vllm_engine_args(chart, hub, example):  # noqa: F811
    """The spec the pods receive (serveConfigV2 args) -> engine/vllm_args.py's arguments, with
    the model and drafter resolved from the hub cache as a replica resolves them."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    case = EXPECTED[example]
    [cr] = [o for o in _render(chart, example) if o["kind"] == "AgentServe"]
    _, serve_config = _validate_children(_deploy(cr))
    spec, _ = spec_from_app_args(serve_config["applications"][0]["args"])  # as the pods do
    [model] = spec.models
    model_dir = resolve_model(model.source, revision=model.revision, progress=False)
    assert json.loads((model_dir / "config.json").read_text()) == {"model_type": "stand-in"}
    kwargs = engine_kwargs(model, model_dir)
    assert kwargs["tensor_parallel_size"] == case["tp"]
    assert kwargs["pipeline_parallel_size"] == case["pp"]
    assert kwargs.get("distributed_executor_backend") == ("ray" if case["tp"] * case["pp"] > 1
                                                          else None)  # fmt: skip
    assert kwargs["model"] == str(model_dir) and kwargs["enable_prefix_caching"] is True
    if case["drafter"] is None:
        assert kwargs["speculative_config"] is None
    else:
        repo, k = case["drafter"]
        drafter_dir = hub / ("models--" + repo.replace("/", "--"))
        assert kwargs["speculative_config"]["method"] == "dflash"
        assert kwargs["speculative_config"]["num_speculative_tokens"] == k
        assert Path(kwargs["speculative_config"]["model"]).is_relative_to(drafter_dir)
    AsyncEngineArgs(**kwargs)  # vLLM takes every argument name and type
