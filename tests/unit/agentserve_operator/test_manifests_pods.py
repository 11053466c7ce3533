"""Pod settings GPU users set on day one (issue 28, item 7), rendered into the Ray pods and
taken by Kubernetes' schema and KubeRay's CRDs: head scheduling, pull secrets, priority and
runtime classes, env / envFrom, /dev/shm size, IPC_LOCK and RDMA resources, the GPU
resource name (MIG, other vendors)."""

from __future__ import annotations

from pathlib import Path

import kuberay_crds
import pytest
from agentserve_operator import kuberay as kr
from agentserve_operator import manifests as m
from agentserve_operator.resource import InvalidResource, desired_from_cr
from operator_cases import gpu_cr

ROOT = Path(__file__).resolve().parents[3]

KEYS = {"alice": "sk-alice-secret"}
kv = pytest.importorskip("kubernetes_validate")
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "pool", "operator": "In", "values": ["cpu"]}]}]}}}  # fmt: skip
KUBE = {
    "api_key_secret": "demo-keys",
    "image_pull_secrets": ["regcred"],
    "priority_class_name": "llm-serving",
    "runtime_class_name": "nvidia",
    "env": {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5"},
    "env_from_secrets": ["nccl-secrets"],
    "env_from_config_maps": ["nccl-tuning"],
    "shm_size": "64Gi",
    "head_node_selector": {"pool": "cpu"},
    "head_tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ray",
                          "effect": "NoSchedule"}],
    "head_affinity": AFFINITY,
}  # fmt: skip
MODEL = {"name": "big", "source": "/models/big", "tensor_parallel_size": 8,
         "pipeline_parallel_size": 2,
         "replicas": {"num_gpus": 16, "nodes_per_replica": 2, "ipc_lock": True,
                      "gpu_resource_name": "nvidia.com/mig-7g.80gb",
                      "extra_resources": {"rdma/rdma_shared_device_a": "1"},
                      "affinity": AFFINITY}}  # fmt: skip


def _cluster(kube=KUBE, model=MODEL, version=kr.DEFAULT):
    d = desired_from_cr({**gpu_cr(models=[model], kubernetes=kube),
                         "metadata": {"name": "demo", "uid": "u"}}, KEYS)  # fmt: skip
    rs = m.rayservice(d, kr.KubeRay(version))
    kuberay_crds.validate(rs, version)
    return rs["spec"]["rayClusterConfig"]


def _validate_pod(group):
    kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                 "template": group["template"]}, "1.30", strict=True)  # fmt: skip


@pytest.mark.parametrize("version", kr.SUPPORTED)
def test_pod_settings_reach_the_pods(version):
    cluster = _cluster(version=version)
    head, [worker] = cluster["headGroupSpec"], cluster["workerGroupSpecs"]
    for group in (head, worker):
        _validate_pod(group)
        pod = group["template"]["spec"]
        [container] = pod["containers"]
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["priorityClassName"] == "llm-serving"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_IB_HCA"] == "mlx5"
        assert container["envFrom"] == [{"secretRef": {"name": "nccl-secrets"}},
                                        {"configMapRef": {"name": "nccl-tuning"}}]  # fmt: skip
        shm = next(v for v in pod["volumes"] if v["name"] == "shm")
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    head_pod, worker_pod = head["template"]["spec"], worker["template"]["spec"]
    assert head_pod["nodeSelector"] == {"pool": "cpu"} and head_pod["affinity"] == AFFINITY
    assert head_pod["tolerations"][0]["key"] == "dedicated"
    assert "runtimeClassName" not in head_pod  # no GPUs on the head
    assert worker_pod["runtimeClassName"] == "nvidia" and worker_pod["affinity"] == AFFINITY


def test_multi_node_nccl_gets_ipc_lock_rdma_and_the_gpu_resource_name():
    [worker] = _cluster()["workerGroupSpecs"]
    [container] = worker["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    assert limits["nvidia.com/mig-7g.80gb"] == "8" and "nvidia.com/gpu" not in limits
    assert limits["rdma/rdma_shared_device_a"] == "1"
    assert container["resources"]["requests"] == limits
    caps = container["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert worker["rayStartParams"]["num-gpus"] == "8"  # not guessed from the resource name


def test_defaults_add_nothing_new():
    cluster = _cluster(
        kube={"api_key_secret": "demo-keys"},
        model={"name": "q", "source": "/models/q", "replicas": {"num_gpus": 1}},
    )
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        pod = group["template"]["spec"]
        assert not {"imagePullSecrets", "priorityClassName", "runtimeClassName",
                    "affinity"} & set(pod)  # fmt: skip
        assert "envFrom" not in pod["containers"][0]
        assert "add" not in pod["containers"][0]["securityContext"]["capabilities"]
    assert "head" not in str(cluster["headGroupSpec"]["template"]["spec"].get("nodeSelector"))


@pytest.mark.parametrize("name", ["HF_TOKEN", "AGENTSERVE_SPEC", "RAY_AUTH_TOKEN", "1BAD"])
def test_env_cannot_replace_the_operators_own(name):
    with pytest.raises(InvalidResource, match=r"kubernetes\.env"):
        desired_from_cr(gpu_cr(kubernetes={"api_key_secret": "demo-keys", "env": {name: "x"}}),
                        KEYS)  # fmt: skip


def test_ipc_lock_says_it_does_nothing_for_the_non_root_images():
    """Capabilities Kubernetes adds reach root processes only (no ambient capabilities):
    the images run Ray as uid 1000, so NCCL's locked memory comes from the runtime's
    RLIMIT_MEMLOCK instead; the field and the docs must say so (review of issue 28, item 7)."""
    from agentserve.spec import ReplicaSpec

    text = ReplicaSpec.model_fields["ipc_lock"].description or ""
    assert "uid 1000" in text and "ulimit -l" in text
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    assert "ipc_lock" in docs and "RLIMIT_MEMLOCK" in docs


@pytest.mark.parametrize(
    ("name", "ok"),
    [("a" * 47, True), ("qwen3-8b-dflash", True), ("a" * 48, False), ("8b-model", False),
     ("my_model", False), ("Model", False), ("model-", False)],
)  # fmt: skip
def test_names_kuberay_would_refuse_are_refused_saying_why(name, ok):
    """KubeRay takes a RayService only with a DNS-1035 name of at most 47 characters
    (ValidateRayServiceMetadata); the RayService is named after the AgentServe."""
    cr = gpu_cr(kubernetes={"api_key_secret": "demo-keys"})
    cr["metadata"]["name"] = name
    if ok:
        assert m.rayservice(desired_from_cr(cr, KEYS))["metadata"]["name"] == name
    else:
        with pytest.raises(InvalidResource, match="DNS-1035 label") as err:
            desired_from_cr(cr, KEYS)
        assert err.value.errors[0][0] == "metadata.name"
