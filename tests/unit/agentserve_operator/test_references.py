"""What an AgentServe may reference, and salted key hashes (issue 30 item 7): a CR names
only Secrets and claims labelled agentserve.dev/allow-reference=true; the key hashes the
operator writes are HMAC-SHA256 under a per-AgentServe salt the ingress reads from a Secret."""

from __future__ import annotations

import hashlib
import json

import pytest
from agentserve.api.auth import KEY_SALT_ENV, TenantResolver, salted_key_hash
from agentserve.api.errors import AuthenticationError
from agentserve.spec import hash_api_key
from agentserve_operator import manifests as m
from agentserve_operator.chart import CHART_DIR
from agentserve_operator.key_salt import salt_secret_name
from agentserve_operator.reconcile import reconcile
from agentserve_operator.references import ALLOW_LABEL
from operator_cases import SECRET
from test_helm import HELM, chart, render  # noqa: F401  (chart: the fixture)
from test_helm_rbac import _allows, operator_rules
from test_reconcile import T0, T1, conditions, conditions_message, cr

KEY = SECRET["stringData"]["alice"]


def _unlabel(cluster, kind, name):
    cluster.find(kind, name)["metadata"]["labels"].pop(ALLOW_LABEL)


def test_an_unlabelled_key_secret_is_refused_and_nothing_is_deployed(cluster):
    _unlabel(cluster, "Secret", "demo-keys")
    result = reconcile(cluster, cr(cluster), T0)
    assert result.error is not None and result.actions == []
    assert conditions(cluster)["Degraded"] == ("True", "InvalidSpec")
    message = conditions_message(cluster)
    assert f"Secret 'demo-keys' is not labelled {ALLOW_LABEL}=true" in message
    assert hash_api_key(KEY) not in json.dumps(list(cluster.objects.values()))
    assert cluster.kinds() == ["AgentServe", "PersistentVolumeClaim", "Secret"]


@pytest.mark.parametrize(
    ("kube", "field", "kind", "name"),
    [
        ({"hf_token_secret": "db-password"}, "hf_token_secret", "Secret", "db-password"),
        ({"env_from_secrets": ["db-password"]}, "env_from_secrets[0]", "Secret", "db-password"),
        ({"model_volume": {"claim_name": "db-data", "read_only": False}},
         "model_volume.claim_name", "PersistentVolumeClaim", "db-data"),
        ({"hub_cache": {"claim_name": "db-data"}},
         "hub_cache.claim_name", "PersistentVolumeClaim", "db-data"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("label", [None, "false"])
def test_every_secret_and_claim_needs_the_label(cluster, kube, field, kind, name, label):
    """Another team's Secret or claim in the namespace, labelled otherwise or not at all."""
    labels = {} if label is None else {ALLOW_LABEL: label}
    cluster.put({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "labels": labels}})
    body = cr(cluster)
    body["spec"]["kubernetes"].update(kube)
    result = reconcile(cluster, body, T0)
    assert result.error is not None and result.actions == []
    assert f"kubernetes.{field}: {kind} {name!r} is not labelled" in conditions_message(cluster)
    cluster.find(kind, name)["metadata"]["labels"] = {ALLOW_LABEL: "true"}  # its owner agrees
    assert reconcile(cluster, body, T1).error is None


def test_a_missing_claim_is_named(cluster):
    body = cr(cluster)
    body["spec"]["kubernetes"]["hub_cache"] = {"claim_name": "nope"}
    reconcile(cluster, body, T0)
    assert "PersistentVolumeClaim 'nope' not found" in conditions_message(cluster)


def test_a_missing_hf_token_secret_deploys_without_the_token(cluster):
    """The token Secret is optional (a public model needs none; the pod's secretKeyRef is
    optional): absent, the AgentServe deploys and the pod's HF_TOKEN stays optional
    (issue 62); present but unlabelled, it is still refused (above)."""
    body = cr(cluster)
    body["spec"]["kubernetes"]["hf_token_secret"] = "hf-token-not-yet-made"
    result = reconcile(cluster, body, T0)
    assert result.error is None
    worker = cluster.find("RayService", "demo")["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    env = worker["template"]["spec"]["containers"][0]["env"]
    [token] = [e for e in env if e["name"] == "HF_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {
        "name": "hf-token-not-yet-made", "key": "HF_TOKEN", "optional": True}  # fmt: skip


def _salt(cluster) -> str:
    return cluster.read_secret("default", salt_secret_name("demo"))["salt"]


def test_key_hashes_are_salted_and_the_head_pod_reads_the_salt(cluster):
    reconcile(cluster, cr(cluster), T0)
    salt_secret = cluster.find("Secret", salt_secret_name("demo"))
    owner = salt_secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("AgentServe", cr(cluster)["metadata"]["uid"])
    salt = _salt(cluster)
    assert len(salt) == 64
    children = json.dumps([cluster.find(k, n) for k, n in [
        ("ConfigMap", "demo-spec"), ("RayService", "demo")]])  # fmt: skip
    assert salted_key_hash(salt, KEY) in children
    assert hashlib.sha256(KEY.encode()).hexdigest() not in children  # the plain hash
    head = cluster.find("RayService", "demo")["spec"]["rayClusterConfig"]["headGroupSpec"]
    [env] = [e for e in head["template"]["spec"]["containers"][0]["env"]
             if e["name"] == KEY_SALT_ENV]  # fmt: skip
    assert env["valueFrom"]["secretKeyRef"] == {"name": salt_secret_name("demo"), "key": "salt"}
    [cache] = [e for e in head["template"]["spec"]["containers"][0]["env"]
               if e["name"] == "AGENTSERVE_CACHE_SALT_KEY"]  # fmt: skip
    assert cache["valueFrom"]["secretKeyRef"]["key"] == "cache"  # issue 30 item 4's shared key
    cache_key = cluster.read_secret("default", salt_secret_name("demo"))["cache"]
    assert len(cache_key) == 64 and cache_key != salt
    reconcile(cluster, cr(cluster), T1)
    assert _salt(cluster) == salt  # created once, never replaced


def test_head_pods_started_without_the_salt_keep_plain_hashes(cluster):
    """An AgentServe deployed by an operator without salts: until its head pod has the
    salt (KubeRay replaced it), the hashes stay plain SHA-256, which it can check."""
    labels = {m.LABEL_DEPLOYMENT: "demo", "ray.io/node-type": "head"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "head", "labels": labels},
        "spec": {"containers": [{"name": "ray-head", "env": [{"name": "X", "value": "1"}]}]},
    }
    cluster.put(pod)
    reconcile(cluster, cr(cluster), T0)
    spec = cluster.find("ConfigMap", "demo-spec")["data"]["spec.yaml"]
    assert hash_api_key(KEY) in spec and salted_key_hash(_salt(cluster), KEY) not in spec
    cluster.find("Pod", "head")["spec"]["containers"][0]["env"].append({"name": KEY_SALT_ENV})
    reconcile(cluster, cr(cluster), T1)
    spec = cluster.find("ConfigMap", "demo-spec")["data"]["spec.yaml"]
    assert salted_key_hash(_salt(cluster), KEY) in spec


def test_the_ingress_checks_salted_and_plain_hashes(monkeypatch):
    from agentserve.spec import DeploymentSpec

    salt = "ab" * 32
    spec = DeploymentSpec.model_validate({"models": [{"source": "bundled"}], "tenants": [
        {"name": "a", "api_key_sha256": salted_key_hash(salt, "sk-a"), "sla": {}},
        {"name": "b", "api_key_sha256": hash_api_key("sk-b"), "sla": {}}]})  # fmt: skip
    monkeypatch.setenv(KEY_SALT_ENV, salt)
    resolver = TenantResolver(spec)  # the salt from the pod's environment
    assert resolver.resolve("Bearer sk-a").name == "a"
    assert resolver.resolve("Bearer sk-b").name == "b"
    with pytest.raises(AuthenticationError):
        resolver.resolve("Bearer sk-c")
    with pytest.raises(AuthenticationError):  # wrong salt: the salted hash does not match
        TenantResolver(spec, key_salt="cd" * 32).resolve("Bearer sk-a")
    monkeypatch.delenv(KEY_SALT_ENV)
    with pytest.raises(AuthenticationError):
        TenantResolver(spec).resolve("Bearer sk-a")


@pytest.mark.skipif(HELM is None, reason="helm not found")
def test_chart_rbac_and_the_chart_made_claim(chart):  # noqa: F811
    """The operator may read Secrets and claims and create Secrets (the salt), never update
    or delete them; the claim the chart makes is labelled for its AgentServe."""
    values = CHART_DIR / "ci" / "gpu-values.yaml"
    objs = render(chart, values, "--set", "hubCache.create=true")
    rules = operator_rules(objs, "default")
    allowed = {(res, verb) for res in ("secrets", "persistentvolumeclaims")
               for verb in ("get", "create", "patch", "update", "delete")
               if any(_allows(rule, "", res, verb) for rule in rules)}  # fmt: skip
    assert allowed == {("secrets", "get"), ("secrets", "create"), ("persistentvolumeclaims", "get")}
    [pvc] = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    assert pvc["metadata"]["labels"][ALLOW_LABEL] == "true"
