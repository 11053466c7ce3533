"""Which KubeRay the operator renders for (issue 28, item 2): read from the installed
RayService CRD (KubeRay's published ones, tests/data/kuberay-crds), or named in the CR; an
unsupported one is refused with the supported versions named."""

from __future__ import annotations

import copy

import kuberay_crds
import pytest
from agentserve_operator import kuberay as kr
from agentserve_operator.fake import FakeCluster
from agentserve_operator.reconcile import reconcile
from operator_cases import MODELS_PVC, SECRET, gpu_cr

T0 = "2030-01-01T00:00:00Z"


@pytest.mark.parametrize("version", kr.SUPPORTED)
def test_the_installed_crd_tells_the_version(version):
    assert kr.from_crd(kuberay_crds.crd(version)) == kr.KubeRay(version)


def test_a_crd_older_than_1_4_is_refused():
    old = copy.deepcopy(kuberay_crds.crd("1.4"))
    for v in old["spec"]["versions"]:
        v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"].pop(
            "upgradeStrategy", None
        )
    with pytest.raises(kr.UnsupportedKubeRay, match=r"older than 1\.4.*1\.4, 1\.5, 1\.6"):
        kr.from_crd(old)


def test_kuberay_1_3_is_refused():
    """KubeRay 1.3's RayService CRD already has spec.upgradeStrategy; the one field 1.4
    added (v1.3.2 -> v1.4.2, outside pod templates) is rayClusterConfig.autoscalerOptions
    .version: the 1.4.2 CRD without it is 1.3's schema as far as detection goes."""
    old = copy.deepcopy(kuberay_crds.crd("1.4"))
    for v in old["spec"]["versions"]:
        spec = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        options = spec["rayClusterConfig"]["properties"]["autoscalerOptions"]["properties"]
        options.pop("version", None)
    assert "upgradeStrategy" in old["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]["properties"]  # fmt: skip
    with pytest.raises(kr.UnsupportedKubeRay, match=r"older than 1\.4.*1\.4, 1\.5, 1\.6"):
        kr.from_crd(old)


def test_a_named_version_wins_and_an_unknown_one_is_refused():
    assert kr.resolve("v1.4.2", kuberay_crds.crd("1.6")) == kr.KubeRay("1.4")
    assert kr.resolve(None, None) == kr.KubeRay(kr.DEFAULT)
    with pytest.raises(kr.UnsupportedKubeRay, match=r"1\.3"):
        kr.resolve("1.3", None)


def _deploy(version_crd: str | None, **kube):
    cluster = FakeCluster(crd_bodies={kr.RAYSERVICE_CRD: kuberay_crds.crd(version_crd)}
                          if version_crd else None)  # fmt: skip
    cluster.put(SECRET)
    cluster.put(MODELS_PVC)
    cr = gpu_cr()
    cr["spec"]["kubernetes"].update(kube)
    return cluster, reconcile(cluster, cluster.put(cr), T0)


@pytest.mark.parametrize("version", kr.SUPPORTED)
def test_the_operator_renders_what_the_installed_kuberay_takes(version):
    cluster, result = _deploy(version)
    assert result.error is None
    rs = cluster.find("RayService", "demo")
    rs = {k: rs[k] for k in ("apiVersion", "kind", "metadata", "spec")}
    kuberay_crds.validate(rs, version)  # on 1.4: no authOptions
    assert ("authOptions" in rs["spec"]["rayClusterConfig"]) is (version != "1.4")


def test_an_unsupported_named_version_is_reported_not_applied():
    cluster, result = _deploy(None, kuberay_version="1.2")
    assert result.error is not None and cluster.find("RayService", "demo") is None
    degraded = next(c for c in result.status["conditions"] if c["type"] == "Degraded")
    assert "1.4, 1.5, 1.6" in degraded["message"]
