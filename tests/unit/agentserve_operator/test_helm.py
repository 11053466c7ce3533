"""The Helm chart: `helm lint --strict` and `helm template` with each ci/ values file; every
rendered object validates against Kubernetes' schemas, and the operator deploys the rendered
AgentServe. Needs helm (helm/install-helm.sh puts it in .venv/bin); skipped without it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kuberay_crds
import pytest
import yaml
from agentserve_operator import kuberay as kr
from agentserve_operator.chart import CHART_DIR
from agentserve_operator.fake import FakeCluster
from agentserve_operator.reconcile import reconcile
from operator_cases import allow_references
from tool_binaries import find_binary

VALUES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))
kv = pytest.importorskip("kubernetes_validate")


HELM = find_binary("helm")
pytestmark = pytest.mark.skipif(HELM is None, reason="helm not found: run helm/install-helm.sh")


@pytest.fixture(scope="module")
def chart(tmp_path_factory) -> Path:
    """A copy of the chart exactly as a checkout has it: nothing added, no `helm dependency
    build` (a declared subchart missing from charts/ fails every render, as it would fail
    a user's `helm install helm/agentserve`)."""
    root = tmp_path_factory.mktemp("chart") / "agentserve"
    shutil.copytree(CHART_DIR, root)
    return root


def helm(*args: str) -> str:
    done = subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# `helm template` has no cluster to keep a generated API key in: name a Secret instead
OFFLINE_KEYS = ("--set", "apiKeys.existingSecret=rel-api-keys")


def render(chart: Path, values: Path, *sets: str) -> list[dict]:
    out = helm("template", "rel", str(chart), "-f", str(values), *OFFLINE_KEYS, *sets)
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("values", VALUES, ids=[v.stem for v in VALUES])
def test_helm_lint_strict(chart, values):
    helm("lint", "--strict", str(chart), "-f", str(values))


@pytest.mark.parametrize("values", VALUES, ids=[v.stem for v in VALUES])
def test_rendered_objects_validate(chart, values):
    for obj in render(chart, values):
        if obj["apiVersion"].startswith(("agentserve.dev", "monitoring.coreos.com")):
            continue  # checked below / not in Kubernetes' own schemas
        kv.validate(obj, "1.30", strict=True)


def test_operator_pod_has_secure_defaults(chart):
    [deploy] = [o for o in render(chart, VALUES[0]) if o["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]
    assert "agentserve_operator.handlers" in container["args"]


def test_operator_has_a_writable_tmp_beside_its_read_only_root(chart):
    """The kubernetes client's DynamicClient keeps its discovery cache in
    tempfile.gettempdir(): with the root read-only and no /tmp volume it raises
    ("No usable temporary directory") and the operator never starts."""
    import inspect

    from kubernetes.dynamic import discovery

    assert "tempfile.gettempdir()" in inspect.getsource(discovery.Discoverer.__init__)
    [deploy] = [o for o in render(chart, VALUES[0]) if o["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert not any(e["name"] == "TMPDIR" for e in container.get("env", []))
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert not mount.get("readOnly")
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume


def test_no_agentserve_without_a_model(chart):
    kinds = {o["kind"] for o in render(chart, CHART_DIR / "ci" / "default-values.yaml")}
    assert "AgentServe" not in kinds and "Secret" not in kinds


def test_set_model_source_creates_a_deployable_agentserve(chart):
    """`helm install --set model.source=...`: the operator accepts the rendered CR."""
    objs = render(chart, CHART_DIR / "ci" / "default-values.yaml", "--set", "model.source=bundled")
    [cr] = [o for o in objs if o["kind"] == "AgentServe"]
    assert cr["spec"]["kubernetes"]["api_key_secret"] == "rel-api-keys"
    cluster = FakeCluster()
    cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rel-api-keys"},
                 "stringData": {"default": "sk-made-by-the-user"}})  # fmt: skip
    allow_references(cluster, cr)
    result = reconcile(cluster, cluster.put(cr), "2030-01-01T00:00:00Z")
    assert result.error is None
    assert {"RayService", "Service", "ConfigMap"} <= set(cluster.kinds())


@pytest.mark.parametrize("values", ["gpu-values.yaml", "full-values.yaml"])
def test_rendered_agentserve_is_valid_for_the_operator(chart, values):
    objs = render(chart, CHART_DIR / "ci" / values)
    [cr] = [o for o in objs if o["kind"] == "AgentServe"]
    tenants = [t["name"] for t in cr["spec"]["tenants"]]
    cluster = FakeCluster()
    secret = cr["spec"]["kubernetes"]["api_key_secret"]
    cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
                 "stringData": {t: f"sk-{t}" for t in tenants}})  # fmt: skip
    allow_references(cluster, cr)
    result = reconcile(cluster, cluster.put(cr), "2030-01-01T00:00:00Z")
    assert result.error is None, result.error


@pytest.mark.parametrize("version", kr.SUPPORTED)
@pytest.mark.parametrize("values", VALUES, ids=[v.stem for v in VALUES])
def test_rendered_rayservice_is_taken_by_each_kuberay(chart, values, version):
    """Every ci/ values file's AgentServe, deployed by the operator in a cluster running
    KubeRay `version`: the RayService passes that version's published CRD, strictly."""
    crs = [o for o in render(chart, values) if o["kind"] == "AgentServe"] or [
        o
        for o in render(chart, values, "--set", "model.source=bundled")
        if o["kind"] == "AgentServe"
    ]  # default-values.yaml has no model: the first `--set model.source` install
    for cr in crs:
        cluster = FakeCluster(crd_bodies={kr.RAYSERVICE_CRD: kuberay_crds.crd(version)})
        keys = {t["name"]: f"sk-{t['name']}" for t in cr["spec"]["tenants"]}
        cluster.put({"apiVersion": "v1", "kind": "Secret", "stringData": keys,
                     "metadata": {"name": cr["spec"]["kubernetes"]["api_key_secret"]}})  # fmt: skip
        allow_references(cluster, cr)
        assert reconcile(cluster, cluster.put(cr), "2030-01-01T00:00:00Z").error is None
        rs = cluster.find("RayService", cr["metadata"]["name"])
        kuberay_crds.validate({k: rs[k] for k in ("apiVersion", "kind", "spec")} | {
            "metadata": {"name": rs["metadata"]["name"]}}, version)  # fmt: skip
    assert crs, "no AgentServe rendered"


def test_values_schema_rejects_a_bad_model(chart):
    done = subprocess.run(
        [HELM, "template", "rel", str(chart), "--set", "model.max_num_seqs=0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0 and "max_num_seqs" in done.stderr


ALERT_RULES = CHART_DIR / "files" / "alerts" / "agentserve.rules.yaml"


def test_prometheus_rule_is_off_by_default(chart):
    kinds = {o["kind"] for o in render(chart, CHART_DIR / "ci" / "default-values.yaml")}
    assert "PrometheusRule" not in kinds


def test_prometheus_rule_renders_the_plain_rules_file(chart):
    """One source of truth: the PrometheusRule's spec is the plain rules file, unchanged."""
    objs = render(
        chart,
        CHART_DIR / "ci" / "default-values.yaml",
        "--set", "monitoring.prometheusRule.enabled=true",
        "--set", "monitoring.prometheusRule.labels.release=kps",
    )  # fmt: skip
    [rule] = [o for o in objs if o["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kps"
    plain = yaml.safe_load(ALERT_RULES.read_text())
    assert rule["spec"] == plain
    assert any("alert" in r for g in plain["groups"] for r in g["rules"])


def _serving_image(chart: Path, *sets: str) -> str:
    values = CHART_DIR / "ci" / "default-values.yaml"
    [cr] = [o for o in render(chart, values, *sets) if o["kind"] == "AgentServe"]
    return cr["spec"]["kubernetes"]["image"]


def test_cpu_models_get_the_cpu_image_and_gpu_models_the_cuda_one(chart):
    """The default serving tag follows the models: `<appVersion>` (docker/Dockerfile, vLLM's
    CPU build) when no model asks for GPUs, `<appVersion>-cuda` when one does; a tag given
    in servingImage.tag is used as it is."""
    version = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    repo = "ghcr.io/agentserve/agentserve"
    cpu = ("--set", "model.name=small", "--set", "model.source=bundled")
    assert _serving_image(chart, *cpu) == f"{repo}:{version}"
    assert _serving_image(chart, *cpu, "--set", "model.replicas.num_gpus=1") == (
        f"{repo}:{version}-cuda"
    )
    gpu = CHART_DIR / "ci" / "gpu-values.yaml"
    [cr] = [o for o in render(chart, gpu) if o["kind"] == "AgentServe"]
    assert cr["spec"]["kubernetes"]["image"] == f"{repo}:{version}-cuda"
    assert _serving_image(chart, *cpu, "--set", "servingImage.tag=x") == f"{repo}:x"
