"""Hugging Face id sources in a cluster: the pods' cache volume, HF_HOME, HF_TOKEN, offline."""

from __future__ import annotations

import pytest
from agentserve_operator import manifests as m
from agentserve_operator.resource import InvalidResource, desired_from_cr
from operator_cases import gpu_cr

KEYS = {"alice": "sk-alice-secret"}
HUB_MODEL = {"name": "qwen3-8b", "source": "Qwen/Qwen3-8B", "revision": "main",
             "drafter": {"enabled": True, "path": "z-lab/Qwen3-8B-DFlash-b16"},
             "replicas": {"num_gpus": 1}}  # fmt: skip
kv = pytest.importorskip("kubernetes_validate")


def _worker(kube: dict, models=None):
    d = desired_from_cr(gpu_cr(models=models or [HUB_MODEL], kubernetes=kube), KEYS)
    [worker] = m.rayservice(d)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return worker["template"]


def _env(template) -> dict:
    [container] = template["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_hub_sources_get_the_cache_volume_hf_home_and_token():
    kube = {"api_key_secret": "demo-keys", "hub_cache": {"claim_name": "hf"},
            "hf_token_secret": "hf-token"}  # fmt: skip
    template = _worker(kube)
    env = _env(template)
    assert "HF_HUB_OFFLINE" not in env  # the first replica downloads
    assert env["HF_HOME"] == "/hf-cache"
    # optional: a public model starts without the Secret (examples/07's README)
    ref = {"name": "hf-token", "key": "HF_TOKEN", "optional": True}
    assert env["HF_TOKEN"] == {"secretKeyRef": ref}
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["hf-cache"]["persistentVolumeClaim"] == {"claimName": "hf"}
    [container] = template["spec"]["containers"]
    assert {"name": "hf-cache", "mountPath": "/hf-cache"} in container["volumeMounts"]
    kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                 "template": template}, "1.30", strict=True)  # fmt: skip


def test_local_sources_stay_offline_and_hub_offline_forces_it():
    local = [{"name": "q", "source": "/models/q", "replicas": {"num_gpus": 1}}]
    assert _env(_worker({"api_key_secret": "demo-keys"}, local))["HF_HUB_OFFLINE"] == "1"
    kube = {"api_key_secret": "demo-keys", "hub_cache": {"claim_name": "hf"}, "hub_offline": True}
    assert _env(_worker(kube))["HF_HUB_OFFLINE"] == "1"


def test_hub_offline_without_a_cache_is_refused():
    with pytest.raises(InvalidResource, match=r"Qwen/Qwen3-8B.*set kubernetes\.hub_cache"):
        _worker({"api_key_secret": "demo-keys", "hub_offline": True})


def _head(kube: dict):
    d = desired_from_cr(gpu_cr(models=[HUB_MODEL], kubernetes=kube), KEYS)
    return m.rayservice(d)["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]


def test_the_head_mounts_neither_weights_nor_the_hub_cache():
    """The head has no GPU node selector: a ReadWriteOnce claim there would pin it to the
    wrong node (examples/05); it serves the ingress, which reads no weights."""
    kube = {"api_key_secret": "demo-keys", "hub_cache": {"claim_name": "hf"},
            "model_volume": {"claim_name": "models"}, "hf_token_secret": "hf-token"}  # fmt: skip
    head = _head(kube)
    assert "persistentVolumeClaim" not in str(head["spec"]["volumes"])
    assert not {"HF_HOME", "HF_TOKEN"} & set(_env(head))
    worker = _worker(kube)
    claims = [v["persistentVolumeClaim"]["claimName"] for v in worker["spec"]["volumes"]
              if "persistentVolumeClaim" in v]  # fmt: skip
    assert claims == ["models", "hf"]


def test_an_init_container_downloads_before_ray_starts():
    kube = {"api_key_secret": "demo-keys", "hub_cache": {"claim_name": "hf"}}
    template = _worker(kube)
    [init] = template["spec"]["initContainers"]
    assert init["command"] == ["python", "-m", "agentserve.sources.prefetch", "Qwen/Qwen3-8B@main",
                               "z-lab/Qwen3-8B-DFlash-b16"]  # fmt: skip
    [container] = template["spec"]["containers"]
    assert init["volumeMounts"] == container["volumeMounts"] and init["env"] == container["env"]
    assert "nvidia.com/gpu" not in str(init["resources"])
    kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                 "template": template}, "1.30", strict=True)  # fmt: skip


def test_without_a_claim_each_pod_downloads_into_its_own_volume():
    """No ReadWriteMany storage class needed: each replica pod gets an emptyDir cache."""
    template = _worker({"api_key_secret": "demo-keys"})
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["hf-cache"] == {"name": "hf-cache", "emptyDir": {}}
    assert _env(template)["HF_HOME"] == "/hf-cache"
    assert template["spec"]["initContainers"][0]["name"] == "hub-prefetch"
    local = [{"name": "q", "source": "/models/q", "replicas": {"num_gpus": 1}}]
    template = _worker({"api_key_secret": "demo-keys"}, local)
    assert "initContainers" not in template["spec"] and "hf-cache" not in str(template)


def _mounts(template) -> dict:
    [container] = template["spec"]["containers"]
    return {v["name"]: v["mountPath"] for v in container["volumeMounts"]}


def test_the_compile_cache_is_on_the_hub_claim_else_per_pod():
    """vLLM's compile cache (VLLM_CACHE_ROOT): a restarted engine loads it instead of
    compiling again. On the hub cache claim it outlives pods and is shared by replicas."""
    shared = _worker({"api_key_secret": "demo-keys", "hub_cache": {"claim_name": "hf"}})
    assert _env(shared)["VLLM_CACHE_ROOT"] == f"{_mounts(shared)['hf-cache']}/vllm"
    assert "engine-cache" not in _mounts(shared)
    alone = _worker({"api_key_secret": "demo-keys"})
    assert _env(alone)["VLLM_CACHE_ROOT"] == _mounts(alone)["engine-cache"] == "/engine-cache"
    volumes = {v["name"]: v for v in alone["spec"]["volumes"]}
    assert volumes["engine-cache"] == {"name": "engine-cache", "emptyDir": {}}
    mine = _worker({"api_key_secret": "demo-keys", "env": {"VLLM_CACHE_ROOT": "/mine"}})
    assert _env(mine)["VLLM_CACHE_ROOT"] == "/mine"  # the user's setting wins
