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
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
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
