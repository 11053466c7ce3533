"""The installed KubeRay is detected from its ~1 MB RayService CRD once, then again only
after a TTL: reconciling every CR every 30 s must not read and parse the CRD each time
(review of issue 28, item 4)."""

from __future__ import annotations

import copy

import kuberay_crds
import pytest
from agentserve_operator import kuberay as kr
from agentserve_operator.fake import FakeCluster
from agentserve_operator.reconcile import RetriableClusterError, SchemaMismatch, reconcile
from operator_cases import MODELS_PVC, SECRET, gpu_cr

T0 = "2030-01-01T00:00:00Z"


class CountingCluster(FakeCluster):
    """FakeCluster that counts CRD reads."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.crd_reads = 0

    def read_crd(self, name: str):
        self.crd_reads += 1
        return super().read_crd(name)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _cluster(version: str) -> CountingCluster:
    crd = copy.deepcopy(kuberay_crds.crd(version))
    cluster = CountingCluster(crd_bodies={kr.RAYSERVICE_CRD: crd})
    cluster.put(SECRET)
    cluster.put(MODELS_PVC)
    return cluster


def test_reconciles_share_one_crd_read_until_the_ttl_passes():
    cluster, clock = _cluster("1.4"), Clock()
    detector = kr.Detector(cluster.read_crd, ttl_s=600, clock=clock)
    cr = cluster.put(gpu_cr())
    for _ in range(5):
        assert reconcile(cluster, cr, T0, kuberay=detector).error is None
    assert cluster.crd_reads == 1
    rs = cluster.find("RayService", "demo")
    assert "authOptions" not in rs["spec"]["rayClusterConfig"]  # rendered for 1.4
    # KubeRay upgraded under the running operator: seen once the TTL has passed
    cluster.crd_bodies[kr.RAYSERVICE_CRD] = kuberay_crds.crd("1.6")
    clock.t = 599
    assert detector.installed() == kr.KubeRay("1.4") and cluster.crd_reads == 1
    clock.t = 600
    assert detector.installed() == kr.KubeRay("1.6") and cluster.crd_reads == 2


def test_an_unsupported_kuberay_is_cached_too_and_a_named_version_reads_nothing():
    cluster, clock = _cluster("1.4"), Clock()
    cluster.crd_bodies[kr.RAYSERVICE_CRD]["spec"]["versions"] = []  # no ray.io/v1: too old
    detector = kr.Detector(cluster.read_crd, ttl_s=600, clock=clock)
    for _ in range(3):
        with pytest.raises(kr.UnsupportedKubeRay, match=r"older than 1\.4"):
            detector.installed()
    assert cluster.crd_reads == 1
    cr = gpu_cr()
    cr["spec"]["kubernetes"]["kuberay_version"] = "1.5"
    fresh = _cluster("1.6")
    result = reconcile(fresh, fresh.put(cr), T0, kuberay=kr.Detector(fresh.read_crd))
    assert result.error is None and fresh.crd_reads == 0


def test_without_a_detector_each_reconcile_reads_the_crd():
    cluster = _cluster("1.5")
    cr = cluster.put(gpu_cr())
    reconcile(cluster, cr, T0)
    reconcile(cluster, cr, T0)
    assert cluster.crd_reads == 2


class StrictCluster(CountingCluster):
    """FakeCluster whose API server validates a RayService strictly against the installed
    CRD, as KubeCluster.apply asks (fieldValidation=Strict): 422 "unknown field"."""

    def apply(self, obj):
        installed = self.crd_bodies.get(kr.RAYSERVICE_CRD)
        if obj["kind"] == "RayService" and installed is not None:
            version = kr.from_crd(installed).version
            body = {k: obj[k] for k in ("apiVersion", "kind", "spec")}
            if kuberay_crds.errors(body | {"metadata": {}}, version):
                raise SchemaMismatch(f"apply RayService: 422 unknown field ({version})")
            self.applied_rayservice = obj
        return super().apply(obj)


def test_a_refused_field_makes_the_next_reconcile_read_the_crd_again():
    """KubeRay replaced under the running operator (1.6 detected, 1.4 now installed): the
    apply is refused and the very next reconcile renders for 1.4, not one TTL later
    (issue 62: `authOptions` sent to a 1.4 cluster for 10 minutes)."""
    cluster, clock = StrictCluster(crd_bodies={kr.RAYSERVICE_CRD: kuberay_crds.crd("1.6")}), Clock()
    cluster.put(SECRET)
    cluster.put(MODELS_PVC)
    detector = kr.Detector(cluster.read_crd, ttl_s=600, clock=clock)
    cr = cluster.put(gpu_cr())
    assert reconcile(cluster, cr, T0, kuberay=detector).error is None
    cluster.crd_bodies[kr.RAYSERVICE_CRD] = kuberay_crds.crd("1.4")
    cr["spec"]["kubernetes"]["worker_memory"] = "64Gi"  # a change: the RayService is applied
    with pytest.raises(RetriableClusterError, match="re-reading the installed KubeRay"):
        reconcile(cluster, cr, T0, kuberay=detector)
    clock.t = 1  # far inside the TTL
    assert reconcile(cluster, cr, T0, kuberay=detector).error is None
    rs = cluster.applied_rayservice  # as applied (the fake merges; the server would not)
    assert "authOptions" not in rs["spec"]["rayClusterConfig"] and cluster.crd_reads == 2


def test_no_crd_yet_is_not_remembered():
    """The operator started before KubeRay: DEFAULT is rendered, and the CRD is read again
    on the next call, so a KubeRay installed a moment later is seen at once."""
    cluster, clock = _cluster("1.4"), Clock()
    installed = cluster.crd_bodies.pop(kr.RAYSERVICE_CRD)
    detector = kr.Detector(cluster.read_crd, ttl_s=600, clock=clock)
    assert detector.installed() == kr.KubeRay(kr.DEFAULT)
    cluster.crd_bodies[kr.RAYSERVICE_CRD] = installed
    clock.t = 1
    assert detector.installed() == kr.KubeRay("1.4") and cluster.crd_reads == 2
    assert detector.installed() == kr.KubeRay("1.4") and cluster.crd_reads == 2  # cached now


def test_kube_cluster_applies_ray_objects_strictly_and_names_a_refused_field():
    """KubeCluster: ray.io objects are applied with fieldValidation=Strict (else the API
    server prunes an unknown field and the operator re-applies it every resync), and the
    422 it answers is a SchemaMismatch."""
    from agentserve_operator import k8s
    from kubernetes.client.exceptions import ApiException

    calls = []

    class Dynamic:
        def server_side_apply(self, res, **kwargs):
            calls.append(kwargs)
            err = ApiException(status=422, reason="Unprocessable Entity")
            err.body = b'{"message":"strict decoding error: unknown field \\"spec.x\\""}'
            raise err

    kube = k8s.KubeCluster.__new__(k8s.KubeCluster)
    kube.dynamic = Dynamic()
    kube._resource = lambda api_version, kind: kind
    with pytest.raises(SchemaMismatch, match="unknown field"):
        kube.apply({"apiVersion": "ray.io/v1", "kind": "RayService",
                    "metadata": {"name": "demo", "namespace": "default"}})  # fmt: skip
    assert calls[0]["query_params"] == [("fieldValidation", "Strict")]
