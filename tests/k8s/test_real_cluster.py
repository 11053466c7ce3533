"""The operator against a real Kubernetes API server (KubeCluster + reconcile + the CRD).

Runs only with AGENTSERVE_K8S_TEST=1 and a reachable cluster (current kubeconfig context)
that has KubeRay's RayService CRD; it creates and deletes namespace agentserve-k8s-test.
No API server can run on the development machines (no Docker, no kube-apiserver binary in
the package registries), so these tests are skipped there.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from agentserve_operator.chart import CRD_PATH

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(
        os.environ.get("AGENTSERVE_K8S_TEST") != "1",
        reason="set AGENTSERVE_K8S_TEST=1 with a kubeconfig for a cluster that has KubeRay",
    ),
]
NS = "agentserve-k8s-test"


def kubectl(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def cluster():
    from agentserve_operator.k8s import KubeCluster

    kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    kubectl("wait", "--for=condition=Established", "crd/agentserves.agentserve.dev")
    kubectl("create", "namespace", NS)
    kubectl("-n", NS, "create", "secret", "generic", "keys", "--from-literal=alice=sk-test")
    kubectl("-n", NS, "label", "secret", "keys", "agentserve.dev/allow-reference=true")
    yield KubeCluster()
    kubectl("delete", "namespace", NS, "--wait=false")


CR = f"""
apiVersion: agentserve.dev/v1alpha1
kind: AgentServe
metadata: {{name: demo, namespace: {NS}}}
spec:
  models: [{{source: bundled, replicas: {{num_cpus: 1}}}}]
  tenants: [{{name: alice, sla: {{}}}}]
  kubernetes: {{api_key_secret: keys}}
"""


def _cr(cluster):
    from agentserve_operator.plan import ObjectRef

    return cluster.get(ObjectRef("agentserve.dev/v1alpha1", "AgentServe", NS, "demo"))


def test_crd_accepts_a_cr_and_rejects_a_bad_one(cluster):
    kubectl("apply", "-f", "-", stdin=CR)
    bad = CR.replace("num_cpus: 1", "num_cpus: 0")
    done = subprocess.run(["kubectl", "apply", "--dry-run=server", "-f", "-"], input=bad,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0 and "num_cpus" in done.stderr


def test_reconcile_creates_children_then_is_idempotent_and_repairs(cluster):
    from agentserve_operator.reconcile import reconcile

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    first = reconcile(cluster, _cr(cluster), now)
    assert {a.ref.kind for a in first.actions} >= {"ConfigMap", "RayService", "Service"}
    assert reconcile(cluster, _cr(cluster), now).actions == []
    kubectl("-n", NS, "delete", "service", "demo-admin")  # demo-openai is KubeRay's
    again = reconcile(cluster, _cr(cluster), now)
    assert [a.ref.kind for a in again.actions] == ["Service"]
    assert _cr(cluster)["status"]["observedGeneration"] >= 1
    assert len(cluster.read_secret(NS, "demo-key-salt")["salt"]) == 64  # created (issue 30)


def test_a_binary_secret_value_is_an_invalid_resource(cluster, tmp_path):
    from agentserve_operator.resource import InvalidResource

    (tmp_path / "alice").write_bytes(b"\xff\xfe\x00")
    kubectl("-n", NS, "create", "secret", "generic", "binary", f"--from-file={tmp_path / 'alice'}")
    with pytest.raises(InvalidResource, match="key 'alice' is not UTF-8"):
        cluster.read_secret(NS, "binary")
