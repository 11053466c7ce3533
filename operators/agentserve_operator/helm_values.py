"""values.schema.json of the Helm chart: chart settings + the AgentServe parts generated
from the same source as the CRD (`model` is a ModelSpec, `agentServe.spec` the CR spec)."""

from __future__ import annotations

from typing import Any

from agentserve.spec import ModelSpec

from agentserve_operator.crd import cr_spec_schema, inline_schema, json_schema

__all__ = ["values_schema"]


def _obj(properties: dict[str, Any], description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "description": description, "properties": properties, **extra}


def _str(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _bool(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def _free(description: str) -> dict[str, Any]:
    return {"type": "object", "description": description}


def _image() -> dict[str, Any]:
    return _obj(
        {
            "repository": _str("Image repository."),
            "tag": _str("Image tag; empty = the chart's appVersion."),
            "pullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]},
        },
        "Container image.",
        required=["repository"],
    )


def _operator() -> dict[str, Any]:
    port = {"type": "integer", "minimum": 1, "maximum": 65535}
    return _obj(
        {
            "image": _image(),
            "replicas": {"type": "integer", "minimum": 0, "maximum": 1,
                         "description": "Operator replicas (one at a time: kopf has no "
                         "leader election here)."},
            "logLevel": {"type": "string", "enum": ["debug", "info", "warning", "error"]},
            "watchNamespaces": {"type": "array", "items": {"type": "string"},
                                "description": "Namespaces to watch; empty = all."},
            "metricsPort": {**port, "description": "Prometheus metrics port."},
            "healthPort": {**port, "description": "Liveness probe port."},
            "resources": _free("Operator container resources."),
            "nodeSelector": _free("Operator pod node selector."),
            "tolerations": {"type": "array", "description": "Operator pod tolerations."},
            "podAnnotations": _free("Extra operator pod annotations."),
            "serviceMonitor": _obj(
                {"enabled": _bool("Create a ServiceMonitor for the operator's metrics.")},
                "Prometheus Operator scraping of the operator.",
            ),
        },
        "The agentserve operator (kopf).",
    )  # fmt: skip


def _first_resource() -> dict[str, Any]:
    return _obj(
        {
            "enabled": _bool("Create an AgentServe when model.source or spec.models is set."),
            "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                     "maxLength": 63, "description": "Name of the AgentServe resource."},
            "spec": json_schema(_optional_tenant_keys(cr_spec_schema()))
            | {"description": "AgentServe spec (DeploymentSpec + kubernetes); models here "
               "replace `model`."},
        },
        "The first AgentServe resource the chart creates.",
    )  # fmt: skip


def _optional_tenant_keys(schema: dict[str, Any]) -> dict[str, Any]:
    schema.pop("required", None)  # values hold partial specs; the operator validates fully
    return schema


def _api_keys() -> dict[str, Any]:
    return _obj(
        {
            "create": _bool("Create a Secret with a random key for tenant `tenant` (kept "
                            "across upgrades; needs a live cluster, see existingSecret)."),
            "secretName": _str("Secret with tenant name -> API key; empty = <release>-api-keys."),
            "existingSecret": _str("A Secret you created (tenant name -> API key) to use "
                                   "instead of a generated one; needed by helm template / "
                                   "GitOps."),
            "tenant": _str("Tenant name of the generated key."),
        },
        "API keys of the first AgentServe (never inline in the CR).",
    )  # fmt: skip


def _hub() -> dict[str, Any]:
    return {
        "hubCache": _obj(
            {"create": _bool("Create the PersistentVolumeClaim (kept on uninstall)."),
             "existingClaim": _str("Use this existing claim instead."),
             "size": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(Mi|Gi|Ti|M|G|T)$",
                      "description": "Requested storage."},
             "accessModes": {"type": "array", "minItems": 1, "items": {"type": "string", "enum": [
                 "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"]},
                 "description": "PVC access modes (ReadWriteMany to share across nodes)."},
             "storageClassName": _str("Storage class; empty = the cluster default."),
             "mountPath": {"type": "string", "pattern": "^/", "description": "HF_HOME in pods."}},
            "Hugging Face cache (HF_HOME) for Hugging Face id sources of the first AgentServe.",
        ),
        "hfToken": _obj(
            {"secretName": _str("Secret with a Hugging Face token; empty = none."),
             "key": _str("Key of the token in that Secret.")},
            "Hugging Face token (HF_TOKEN) for gated or private repositories.",
        ),
    }  # fmt: skip


def _addons() -> dict[str, Any]:
    return {
        "phoenix": _obj(
            {"enabled": _bool("Deploy the Phoenix trace UI (tracing issue)."),
             "image": _image(),
             "networkPolicy": _obj(
                 {"enabled": _bool("Only the release namespace's Ray pods and pods of "
                                   "ingressNamespaces may reach Phoenix (it has no auth)."),
                  "ingressNamespaces": {
                      "type": "array", "items": {"type": "string", "minLength": 1},
                      "description": "Namespaces whose pods may reach the UI (6006)."}},
                 "NetworkPolicy of the Phoenix pod.")},
            "Phoenix trace UI (OTLP receiver + UI).",
        ),
        "grafana": _obj(
            {"dashboards": _obj(
                {"enabled": _bool("Ship dashboards as ConfigMaps for the Grafana sidecar."),
                 "label": _str("Label the Grafana sidecar selects ConfigMaps by."),
                 "labelValue": _str("Value of that label.")},
                "Grafana dashboards.")},
            "Grafana integration.",
        ),
        "monitoring": _obj(
            {"prometheusRule": _obj(
                {"enabled": _bool("Create a PrometheusRule with the SLA burn-rate and "
                                  "serving alerts (needs the Prometheus Operator CRDs)."),
                 "labels": {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "Extra labels, e.g. the release label your "
                            "Prometheus selects rules by."}},
                "The alert rules of files/alerts/agentserve.rules.yaml as a PrometheusRule.")},
            "Prometheus Operator integration of the serving metrics.",
        ),
    }  # fmt: skip


def _exposure() -> dict[str, Any]:
    """modelDefaults, service and ingress: the device default and how the endpoint is
    reached from outside (templates/ingress.yaml, agentserve.checkExposure)."""
    return {
        "modelDefaults": _obj(
            {"numGpus": {"type": "integer", "minimum": 0,
                         "description": "GPUs of `model` when replicas.num_gpus is unset "
                         "(not for source `bundled`, the CPU demo)."}},
            "Defaults of `model`.",
        ),
        "service": _obj(
            {"allowPlaintext": _bool("Allow a LoadBalancer/NodePort endpoint Service or an "
                                     "Ingress without TLS (plain HTTP).")},
            "The OpenAI endpoint Service.",
        ),
        "ingress": _obj(
            {"enabled": _bool("Create an Ingress (TLS) for the OpenAI endpoint."),
             "className": _str("IngressClass; empty = the cluster default."),
             "host": _str("Host name clients use."),
             "annotations": {"type": "object", "additionalProperties": {"type": "string"},
                             "description": "Extra Ingress annotations."},
             "tls": _obj({"secretName": _str("kubernetes.io/tls Secret; empty = "
                                             "<agentServe.name>-tls (cert-manager).")},
                         "TLS certificate."),
             "certManager": _obj(
                 {"clusterIssuer": _str("cert-manager ClusterIssuer."),
                  "issuer": _str("cert-manager Issuer of the release namespace.")},
                 "cert-manager annotations.")},
            "HTTPS Ingress (networking.k8s.io/v1) for the OpenAI endpoint.",
        ),
    }  # fmt: skip


def values_schema() -> dict[str, Any]:
    """The whole values.schema.json (draft-07)."""
    model = json_schema(inline_schema(ModelSpec.model_json_schema(mode="validation")))
    model["description"] = "The one model of the first AgentServe (a ModelSpec); set source."
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "agentserve Helm chart values (GENERATED by agentserve_operator.chart)",
        "type": "object",
        "properties": {
            "nameOverride": _str("Override the chart name in object names."),
            "fullnameOverride": _str("Override the full object name prefix."),
            "imagePullSecrets": {"type": "array", "description": "Pull secrets for all pods."},
            "operator": _operator(),
            "servingImage": _image(),
            "rbac": _obj({"create": _bool("Create ClusterRole/Binding (Roles/RoleBindings "
                                          "per namespace with operator.watchNamespaces).")},
                         "RBAC."),
            "networkPolicy": _obj(
                {"enabled": _bool("NetworkPolicy for the operator pod (the Ray pods get "
                                  "theirs from the operator)."),
                 "monitoringNamespaces": {
                     "type": "array",
                     "items": {"type": "string", "minLength": 1, "maxLength": 63},
                     "description": "Namespaces whose pods may scrape the operator's "
                     "metrics; empty = every namespace."}},
                "NetworkPolicy.",
            ),
            "serviceAccount": _obj(
                {"create": _bool("Create the operator's ServiceAccount."),
                 "name": _str("Its name; empty = the release fullname.")},
                "Operator ServiceAccount.",
            ),
            "model": model,
            "agentServe": _first_resource(),
            "apiKeys": _api_keys(),
            **_hub(),
            **_exposure(),
            **_addons(),
        },
    }  # fmt: skip
