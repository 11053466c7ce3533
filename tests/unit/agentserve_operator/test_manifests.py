"""Child manifests: what one CR deploys, validated against Kubernetes' schemas and KubeRay's
published RayService CRDs (every supported version, strict: unknown fields fail)."""

from __future__ import annotations

import importlib

import jsonschema
import kuberay_crds
import pytest
import yaml
from agentserve.spec import hash_api_key
from agentserve_operator import kuberay as kr
from agentserve_operator import manifests as m
from agentserve_operator.resource import desired_from_cr
from operator_cases import GPU_CR, gpu_cr
from serve_config_schema import SERVE_CONFIG_SCHEMA

KEYS = {"alice": "sk-alice-secret"}
kv = pytest.importorskip("kubernetes_validate")


def desired(cr=GPU_CR):
    cr = {**cr, "metadata": {**cr["metadata"], "uid": "u-1"}}
    return desired_from_cr(cr, KEYS)


def by_kind(d=None, monitoring=True, kuberay=None):
    """Children by role: the kind, or AdminService for the admin Service."""
    objs = m.children(d or desired(), monitoring_available=monitoring, kuberay=kuberay)
    return {_role(o): o for o in objs}


def _role(obj):
    admin = obj["metadata"]["labels"][m.LABEL_COMPONENT] == "admin"
    return "AdminService" if obj["kind"] == "Service" and admin else obj["kind"]


def test_children_kinds_and_owner_references():
    objs = by_kind()
    assert list(objs) == [
        "ConfigMap", "NetworkPolicy", "RayService", "AdminService", "PodDisruptionBudget",
        "ServiceMonitor", "PodMonitor",
    ]  # fmt: skip
    for obj in objs.values():
        [owner] = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("AgentServe", "u-1", True)
    assert not {"ServiceMonitor", "PodMonitor"} & set(by_kind(monitoring=False))


@pytest.mark.parametrize("kind", ["ConfigMap", "AdminService"])
def test_core_objects_validate_strictly(kind):
    kv.validate(by_kind()[kind], "1.30", strict=True)


def test_openai_service_is_kuberays_serve_service_of_the_active_cluster():
    """<name>-openai is RayService serveService: KubeRay selects only the active cluster's
    ready Serve pods (an upgrade's pending cluster gets no traffic until it takes over)."""
    d = desired()
    rs = by_kind(d)["RayService"]["spec"]
    svc = rs["serveService"]
    assert svc["metadata"]["name"] == "demo-openai" and "selector" not in svc["spec"]
    assert svc["spec"]["type"] == "ClusterIP"
    assert [p["port"] for p in svc["spec"]["ports"]] == [d.spec.server.port]
    head = rs["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "serve", "containerPort": d.spec.server.port} in head["ports"]
    service = {"apiVersion": "v1", "kind": "Service", **svc}
    kv.validate(service, "1.30", strict=True)


def test_pod_templates_validate_strictly():
    rs = by_kind()["RayService"]["spec"]["rayClusterConfig"]
    groups = [rs["headGroupSpec"], *rs["workerGroupSpecs"]]
    for group in groups:
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                        "metadata": {"name": "t"}, "template": group["template"]}  # fmt: skip
        kv.validate(pod_template, "1.30", strict=True)


@pytest.mark.parametrize("version", kr.SUPPORTED)
def test_rayservice_validates_against_kuberays_crd(version):
    rs = by_kind(kuberay=kr.KubeRay(version))["RayService"]
    kuberay_crds.validate(rs, version)
    jsonschema.validate(yaml.safe_load(rs["spec"]["serveConfigV2"]), SERVE_CONFIG_SCHEMA)


def test_rayservice_fields_follow_the_kuberay_version():
    """1.4's CRD has no authOptions (Ray token auth): rendered only for 1.5 and later."""
    cluster = {v: by_kind(kuberay=kr.KubeRay(v))["RayService"]["spec"]["rayClusterConfig"]
               for v in kr.SUPPORTED}  # fmt: skip
    assert "authOptions" not in cluster["1.4"]
    assert cluster["1.5"]["authOptions"] == cluster["1.6"]["authOptions"] == {"mode": "token"}


@pytest.mark.parametrize("strategy", ["NewCluster", "None"])
def test_upgrade_strategy_is_explicit(strategy):
    """Never KubeRay's implicit default: the GPU cost of a cluster change is a choice."""
    cr = gpu_cr()
    cr["spec"]["kubernetes"]["upgrade_strategy"] = strategy
    for version in kr.SUPPORTED:
        rs = by_kind(desired(cr), kuberay=kr.KubeRay(version))["RayService"]
        assert rs["spec"]["upgradeStrategy"] == {"type": strategy}
        assert strategy in kr.UPGRADE_TYPES[version]
        kuberay_crds.validate(rs, version)


def test_head_has_no_gpus_and_workers_get_gpu_selector_tolerations():
    cluster = by_kind()["RayService"]["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert m.GPU not in str(head["template"])
    [worker] = cluster["workerGroupSpecs"]
    pod = worker["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"][m.GPU] == "1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert (worker["minReplicas"], worker["maxReplicas"]) == (1, 4)
    assert "replicas" not in worker  # owned by Ray's autoscaler
    assert cluster["enableInTreeAutoscaling"] is True


def test_serve_config_runs_the_spec_and_pins_replicas_to_their_group():
    d = desired()
    config = yaml.safe_load(by_kind(d)["RayService"]["spec"]["serveConfigV2"])
    [app] = config["applications"]
    assert app["import_path"] == m.APP_IMPORT_PATH
    assert app["args"]["spec"] == d.spec.model_dump(mode="json") | {"tenants": []}
    assert app["args"]["tenant_slas"] == {t.name: t.sla.model_dump() for t in d.spec.tenants}
    deployment, keeper, ingress = app["deployments"]
    assert d.spec.server.ingress_replicas == 2  # the cluster default: no single ingress
    assert keeper == {
        "name": "tenant-limits",
        "ray_actor_options": {"num_cpus": 0, "resources": {m.HEAD_RESOURCE: 1}},
    }
    group = m.worker_group_name("qwen3-8b")
    assert deployment["ray_actor_options"]["resources"] == {group: 1}
    worker = by_kind(d)["RayService"]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert group in worker["rayStartParams"]["resources"]
    tenants = ingress.pop("user_config")["tenants"]
    assert [t["api_key_sha256"] for t in tenants] == [t.api_key_sha256 for t in d.spec.tenants]
    assert ingress == {
        "name": "ingress",
        "ray_actor_options": {"num_cpus": 0, "resources": {m.HEAD_RESOURCE: 1}},
    }


def test_admin_endpoints_only_on_the_head_pods_admin_port():
    d = desired()
    objs = by_kind(d)
    port = d.spec.server.metrics_port
    assert port == 9400 and port != d.spec.server.port
    head = objs["RayService"]["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert m.HEAD_RESOURCE in head["rayStartParams"]["resources"]
    container_ports = head["template"]["spec"]["containers"][0]["ports"]
    # one admin port per ingress replica (two by default), metrics_port + its rank
    assert {"name": "admin", "containerPort": port} in container_ports
    assert {"name": "admin-1", "containerPort": port + 1} in container_ports
    admin = objs["AdminService"]["spec"]
    assert admin["type"] == "ClusterIP"
    assert admin["selector"] == {m.LABEL_DEPLOYMENT: d.name, "ray.io/node-type": "head"}
    assert admin["ports"] == [
        {"name": "admin", "port": port, "targetPort": port, "protocol": "TCP"},
        {"name": "admin-1", "port": port + 1, "targetPort": port + 1, "protocol": "TCP"},
    ]
    monitor = objs["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"][m.LABEL_COMPONENT] == "admin"
    assert monitor["endpoints"] == [
        {"port": name, "path": "/metrics", "interval": "15s"} for name in ("admin", "admin-1")
    ]
    kv.validate(objs["AdminService"], "1.30", strict=True)


def test_api_keys_only_as_hashes():
    objs = by_kind()
    text = yaml.safe_dump(objs)
    assert "sk-alice-secret" not in text
    assert hash_api_key("sk-alice-secret") in objs["ConfigMap"]["data"]["spec.yaml"]


def test_drafter_change_changes_only_the_serve_config():
    before = by_kind()["RayService"]["spec"]
    cr = gpu_cr()
    cr["spec"]["models"][0]["drafter"]["num_speculative_tokens"] = 3
    after = by_kind(desired(cr))["RayService"]["spec"]
    assert after["rayClusterConfig"] == before["rayClusterConfig"]
    assert "num_speculative_tokens: 3" in after["serveConfigV2"]


def test_one_worker_group_per_model():
    cr = gpu_cr()
    cr["spec"]["models"].append({"name": "org/small:v1", "source": "/models/small"})
    groups = by_kind(desired(cr))["RayService"]["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    names = [g["groupName"] for g in groups]
    assert len(set(names)) == 2 and names[1].startswith("org-small-v1-")
    assert m.GPU not in str(groups[1]["template"])  # num_gpus 0 -> no GPU request


def test_serve_deployment_names_match_the_serving_app():
    """The RayService's serveConfigV2 names the deployments the serving app builds."""
    app = pytest.importorskip("agentserve.serve.app")
    d = desired()
    [served] = m.serve_config(d)["applications"]
    built = [app.deployment_options(model, d.spec)["name"] for model in d.spec.models]
    built += [app.quota_options()["name"], app.ingress_options(d.spec)["name"]]
    assert [dep["name"] for dep in served["deployments"]] == built


def test_app_import_path_builds_the_serve_app():
    module, attr = m.APP_IMPORT_PATH.split(":")
    builder = getattr(importlib.import_module(module), attr)
    spec = {"models": [{"name": "m", "engine": "fake"}]}
    app = builder({"spec": spec})
    assert type(app).__name__ == "Application"
    with pytest.raises(ValueError, match="spec"):
        builder({})


def test_key_rotation_changes_only_the_ingress_user_config():
    """Ray Serve restarts every replica when an app's code version (import path, args,
    ...) changes; a new key must only change the ingress's user_config."""
    pytest.importorskip("ray.serve")
    from ray.serve._private.deploy_utils import get_app_code_version
    from ray.serve.schema import ServeApplicationSchema

    def app(keys):
        cr = {**GPU_CR, "metadata": {**GPU_CR["metadata"], "uid": "u-1"}}
        [only] = m.serve_config(desired_from_cr(cr, keys))["applications"]
        return only

    old, new = app(KEYS), app({"alice": "sk-alice-rotated"})
    assert old["args"] == new["args"]
    assert old["deployments"][:-1] == new["deployments"][:-1]  # the model deployments
    assert old["deployments"][-1]["user_config"] != new["deployments"][-1]["user_config"]
    version = [get_app_code_version(ServeApplicationSchema(**a)) for a in (old, new)]
    assert version[0] == version[1]


def test_podmonitor_scrapes_rays_metrics_port_on_every_ray_pod():
    """Ray's metrics export (and vLLM's, reported through Ray) on head and workers: each
    group pins the port, names it `metrics`, and the NetworkPolicy admits it."""
    objs = by_kind()
    monitor = objs["PodMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"] == {m.LABEL_DEPLOYMENT: "demo",
                                                  m.LABEL_COMPONENT: "ray"}  # fmt: skip
    assert monitor["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s"}
    ]
    cluster = objs["RayService"]["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert group["rayStartParams"]["metrics-export-port"] == "8080"
        labels = group["template"]["metadata"]["labels"]
        assert labels[m.LABEL_COMPONENT] == "ray" and labels[m.LABEL_DEPLOYMENT] == "demo"
        ports = group["template"]["spec"]["containers"][0]["ports"]
        assert {"name": "metrics", "containerPort": 8080} in ports
    admitted = [p["port"] for rule in objs["NetworkPolicy"]["spec"]["ingress"]
                for p in rule.get("ports", [])]  # fmt: skip
    assert 8080 in admitted
