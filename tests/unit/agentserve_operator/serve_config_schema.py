"""The subset of KubeRay's RayService (ray.io/v1) schema the operator writes, as JSON Schema.

Field names and types follow KubeRay's CRD (ray-operator/config/crd/bases/ray.io_rayservices);
unknown fields are rejected so a typo cannot slip through.
"""

from __future__ import annotations

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_TEMPLATE = {"type": "object", "required": ["spec"]}


def _obj(properties, required=()):
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_WORKER = _obj(
    {
        "groupName": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "replicas": {"type": "integer", "minimum": 0},
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
        "rayStartParams": _STR_MAP,
        "template": _TEMPLATE,
    },
    ["groupName", "template"],
)
RAYSERVICE_SCHEMA = _obj(
    {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayService"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": _obj(
            {
                "serveConfigV2": {"type": "string"},
                "rayClusterConfig": _obj(
                    {
                        "rayVersion": {"type": "string"},
                        "authOptions": _obj(
                            {
                                "mode": {"enum": ["disabled", "token"]},
                                "secretName": {"type": "string"},
                            }
                        ),
                        "enableInTreeAutoscaling": {"type": "boolean"},
                        "autoscalerOptions": _obj(
                            {
                                "upscalingMode": {
                                    "enum": ["Default", "Aggressive", "Conservative"]
                                },
                                "idleTimeoutSeconds": {"type": "integer", "minimum": 0},
                            }
                        ),
                        "headGroupSpec": _obj(
                            {"rayStartParams": _STR_MAP, "template": _TEMPLATE}, ["template"]
                        ),
                        "workerGroupSpecs": {"type": "array", "items": _WORKER},
                    },
                    ["headGroupSpec"],
                ),
            },
            ["serveConfigV2", "rayClusterConfig"],
        ),
    },
    ["apiVersion", "kind", "metadata", "spec"],
)
# Ray Serve config file (serveConfigV2), the parts the operator sets.
SERVE_CONFIG_SCHEMA = _obj(
    {
        "proxy_location": {"enum": ["EveryNode", "HeadOnly", "Disabled"]},
        "http_options": _obj(
            {
                "host": {"type": "string"},
                "port": {"type": "integer"},
                "request_timeout_s": {"type": "number"},
            }
        ),
        "applications": {
            "type": "array",
            "minItems": 1,
            "items": _obj(
                {
                    "name": {"type": "string"},
                    "route_prefix": {"type": "string"},
                    "import_path": {"type": "string", "pattern": r"^[\w.]+:\w+$"},
                    "args": {"type": "object"},
                    "deployments": {
                        "type": "array",
                        "items": _obj(
                            {
                                "name": {"type": "string"},
                                "ray_actor_options": {"type": "object"},
                                "user_config": {"type": "object"},
                                "placement_group_bundles": {
                                    "type": "array",
                                    "minItems": 1,
                                    "items": {
                                        "type": "object",
                                        "additionalProperties": {"type": "number", "minimum": 0},
                                    },
                                },
                                "placement_group_strategy": {
                                    "enum": ["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
                                },
                            },
                            ["name"],
                        ),
                    },
                },
                ["name", "import_path"],
            ),
        },
    },
    ["applications"],
)
