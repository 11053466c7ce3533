"""The parts of a Ray Serve config file (a RayService's serveConfigV2) the operator writes,
as JSON Schema with unknown fields refused (a typo cannot slip through). The RayService
itself is checked against KubeRay's own CRDs: kuberay_crds.py."""

from __future__ import annotations


def _obj(properties, required=()):
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


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
