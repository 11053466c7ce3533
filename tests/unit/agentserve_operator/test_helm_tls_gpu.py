"""The chart's quick start and its exposure (issue 62 item 1, issue 64 item 4): a bare
`--set model.source=<hub id>` is a 1-GPU model whose RayService every supported KubeRay
takes; HTTPS through an opt-in Ingress; an external plain-HTTP Service refused unless
acknowledged."""

from __future__ import annotations

import subprocess

import kuberay_crds
import pytest
import yaml
from agentserve_operator import kuberay as kr
from agentserve_operator.chart import CHART_DIR
from agentserve_operator.fake import FakeCluster
from agentserve_operator.reconcile import reconcile
from operator_cases import allow_references
from test_helm import HELM, OFFLINE_KEYS, chart, kv, render  # noqa: F401  (chart: fixture)

pytestmark = pytest.mark.skipif(HELM is None, reason="helm not found: run helm/install-helm.sh")
DEFAULT = CHART_DIR / "ci" / "default-values.yaml"
QWEN = ("--set", "model.source=Qwen/Qwen3-8B")


def _cr(chart, *sets):  # noqa: F811
    [cr] = [o for o in render(chart, DEFAULT, *sets) if o["kind"] == "AgentServe"]
    return cr


def _fails(chart, *sets) -> str:  # noqa: F811
    args = [HELM, "template", "rel", str(chart), "-f", str(DEFAULT), *OFFLINE_KEYS, *sets]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, "rendered, but should have been refused"
    return done.stderr


def test_a_bare_model_source_gets_one_gpu_and_the_cuda_image(chart):  # noqa: F811
    """Was num_gpus 0: a CPU replica of an 8B model on a GPU cluster."""
    cr = _cr(chart, *QWEN)
    [model] = cr["spec"]["models"]
    assert model["replicas"] == {"num_gpus": 1}
    assert cr["spec"]["kubernetes"]["image"].endswith("-cuda")


def test_the_cpu_demo_and_an_explicit_gpu_count_are_kept(chart):  # noqa: F811
    [demo] = _cr(chart, "--set", "model.source=bundled")["spec"]["models"]
    assert "num_gpus" not in demo.get("replicas", {})
    cpu = _cr(chart, *QWEN, "--set", "model.replicas.num_gpus=0", "--set",
              "model.replicas.max_replicas=2")["spec"]["models"][0]  # fmt: skip
    assert cpu["replicas"] == {"num_gpus": 0, "max_replicas": 2}
    two = _cr(chart, *QWEN, "--set", "model.replicas.max_replicas=2")["spec"]["models"][0]
    assert two["replicas"] == {"num_gpus": 1, "max_replicas": 2}


@pytest.mark.parametrize("version", kr.SUPPORTED)
def test_a_bare_model_source_renders_a_gpu_rayservice_each_kuberay_takes(chart, version):  # noqa: F811
    cr = _cr(chart, *QWEN)
    cluster = FakeCluster(crd_bodies={kr.RAYSERVICE_CRD: kuberay_crds.crd(version)})
    cluster.put({"apiVersion": "v1", "kind": "Secret", "stringData": {"default": "sk-x"},
                 "metadata": {"name": cr["spec"]["kubernetes"]["api_key_secret"]}})  # fmt: skip
    allow_references(cluster, cr)
    assert reconcile(cluster, cluster.put(cr), "2030-01-01T00:00:00Z").error is None
    rs = cluster.find("RayService", cr["metadata"]["name"])
    kuberay_crds.validate({k: rs[k] for k in ("apiVersion", "kind", "spec")}
                          | {"metadata": {"name": rs["metadata"]["name"]}}, version)  # fmt: skip
    [worker] = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    limits = worker["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1" and worker["rayStartParams"]["num-gpus"] == "1"
    assert rs["spec"]["upgradeStrategy"] == {"type": "None"}  # never twice the GPUs
    [model] = _served_models(rs)
    assert model["dtype"] == "auto" and model["max_model_len"] is None  # vLLM fits the context
    drafter = model["drafter"]
    assert (drafter["enabled"], drafter["method"]) == (True, "dflash")
    assert drafter["path"] == "z-lab/Qwen3-8B-DFlash-b16"  # the drafter catalog's row
    assert drafter["num_speculative_tokens"] == 15  # block size 16 - 1


def _served_models(rs) -> list[dict]:
    """The model specs the RayService's Serve application is built with."""
    [app] = yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"]
    return app["args"]["spec"]["models"]


def test_ingress_is_off_by_default(chart):  # noqa: F811
    assert "Ingress" not in {o["kind"] for o in render(chart, DEFAULT, *QWEN)}


@pytest.mark.parametrize(
    ("sets", "secret", "annotation"),
    [(("--set", "ingress.tls.secretName=openai-cert"), "openai-cert", None),
     (("--set", "ingress.certManager.clusterIssuer=letsencrypt"), "agentserve-tls",
      ("cert-manager.io/cluster-issuer", "letsencrypt"))],
)  # fmt: skip
def test_ingress_serves_the_endpoint_over_tls(chart, sets, secret, annotation):  # noqa: F811
    objs = render(chart, DEFAULT, *QWEN, "--set", "ingress.enabled=true",
                  "--set", "ingress.host=llm.example.com", *sets)  # fmt: skip
    [ing] = [o for o in objs if o["kind"] == "Ingress"]
    kv.validate(ing, "1.30", strict=True)
    assert ing["spec"]["tls"] == [{"hosts": ["llm.example.com"], "secretName": secret}]
    backend = ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "agentserve-openai", "port": {"number": 8000}}
    if annotation:
        assert ing["metadata"]["annotations"][annotation[0]] == annotation[1]


@pytest.mark.parametrize("service_type", ["LoadBalancer", "NodePort"])
def test_an_external_plain_http_service_is_refused_unless_acknowledged(chart, service_type):  # noqa: F811
    given = ("--set", f"agentServe.spec.kubernetes.service_type={service_type}")
    assert "service.allowPlaintext" in _fails(chart, *QWEN, *given)
    cr = _cr(chart, *QWEN, *given, "--set", "service.allowPlaintext=true")
    assert cr["spec"]["kubernetes"]["service_type"] == service_type


def test_an_ingress_without_tls_is_refused_unless_acknowledged(chart):  # noqa: F811
    sets = (*QWEN, "--set", "ingress.enabled=true", "--set", "ingress.host=llm.example.com")
    assert "ingress.tls.secretName" in _fails(chart, *sets)
    objs = render(chart, DEFAULT, *sets, "--set", "service.allowPlaintext=true")
    [ing] = [o for o in objs if o["kind"] == "Ingress"]
    assert "tls" not in ing["spec"]
