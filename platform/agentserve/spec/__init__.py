"""DeploymentSpec: the one validated config of an agentserve deployment (CLI YAML, operator CR,
generated CRD and Helm schema, vLLM args). Invalid input raises SpecError naming each field path.

One module per part of the spec; import from here (`from agentserve.spec import X`):
  base.py         the strict base model every section derives from (unknown fields refused)
  drafter.py      DrafterSpec: speculative decoding, the drafted-tokens-by-batch schedule
  replicas.py     ReplicaSpec, TolerationSpec: replica bounds, resources, placement
  models.py       ModelSpec: weights, engine settings; SPEC_OWNED_ENGINE_ARGS
  lora.py         LoraSpec: LoRA adapters served beside a model's base weights
  routing.py      RoutingSpec: session and prefix affinity over a model's replicas
  aliases.py      vLLM's / Ray Serve LLM's field names (engine_kwargs, ...) -> ModelSpec's
  tenants.py      TenantSpec, SLASpec, RateLimitSpec; hash_api_key
  autoscaling.py  AutoscalingSpec
  server.py       ServerSpec (HTTP ingress), TracingSpec
  deployment.py   DeploymentSpec; SpecError; spec_from_dict, load_spec, to_yaml,
                  spec_json_schema
The sections and constants are re-exported here too (`X as X`), beside the small __all__.
"""

from __future__ import annotations

from agentserve.sources.models import BUNDLED_MODEL
from agentserve.spec.autoscaling import AutoscalingSpec as AutoscalingSpec
from agentserve.spec.deployment import TENANTS_APART as TENANTS_APART
from agentserve.spec.deployment import (
    DeploymentSpec,
    ModelNotInSpecError,
    SpecError,
    load_spec,
    spec_from_dict,
    spec_json_schema,
    to_yaml,
)
from agentserve.spec.drafter import DFLASH_METHODS as DFLASH_METHODS
from agentserve.spec.drafter import DRAFTERLESS_METHODS as DRAFTERLESS_METHODS
from agentserve.spec.drafter import DrafterSpec as DrafterSpec
from agentserve.spec.drafter import check_speculation_schedule as check_speculation_schedule
from agentserve.spec.latency import LatencyModelSpec as LatencyModelSpec
from agentserve.spec.lora import LoraSpec as LoraSpec
from agentserve.spec.models import SPEC_OWNED_ENGINE_ARGS as SPEC_OWNED_ENGINE_ARGS
from agentserve.spec.models import ModelSpec as ModelSpec
from agentserve.spec.replicas import ReplicaSpec as ReplicaSpec
from agentserve.spec.replicas import TolerationSpec as TolerationSpec
from agentserve.spec.routing import RoutingSpec as RoutingSpec
from agentserve.spec.server import ServerSpec as ServerSpec
from agentserve.spec.server import TracingSpec as TracingSpec
from agentserve.spec.tenants import RateLimitSpec as RateLimitSpec
from agentserve.spec.tenants import SLASpec as SLASpec
from agentserve.spec.tenants import TenantSpec as TenantSpec
from agentserve.spec.tenants import hash_api_key

__all__ = [
    "BUNDLED_MODEL",
    "DeploymentSpec",
    "ModelNotInSpecError",
    "SpecError",
    "hash_api_key",
    "load_spec",
    "spec_from_dict",
    "spec_json_schema",
    "to_yaml",
]
