"""Engine registry: a ModelSpec's `engine` name -> the Engine class that serves it.

"vllm" is built in. Packages beside the runtime add engines with an entry point in the
group `agentserve.engines` (name -> "module:Class"); agentserve_bench registers its
deterministic fake, "fake", this way, for tests and benchmarks. A registered class
declares, besides the Engine protocol:
- `from_model(model) -> Engine` (classmethod): an unstarted engine for one ModelSpec;
- `expected_start_s(model) -> float` (classmethod): how long a replica takes to start
  (the autoscaling policy's credit for warming replicas).
Names are checked without importing anything; a class is imported only when resolved
(on the replica that runs it), so production never imports a test engine. A built-in name
wins over an entry point of the same name. The JSON schema (CRD, Helm values schema)
offers only the built-in engines.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agentserve.engine.protocol import Engine
    from agentserve.spec import ModelSpec

__all__ = [
    "BUILTIN_ENGINES",
    "ENTRY_POINT_GROUP",
    "EngineClass",
    "UnknownEngineError",
    "check_engine_name",
    "engine_class",
    "engine_names",
]

ENTRY_POINT_GROUP = "agentserve.engines"
BUILTIN_ENGINES: dict[str, str] = {"vllm": "agentserve.engine.vllm_engine:VLLMEngine"}
"""The production engines: name -> "module:Class" (the only names the JSON schema offers)."""


class UnknownEngineError(ValueError):
    """An engine name that neither agentserve nor an installed package registers."""


class EngineClass(Protocol):
    """What an engine name resolves to (an Engine class; its classmethods)."""

    def from_model(self, model: ModelSpec) -> Engine: ...

    def expected_start_s(self, model: ModelSpec) -> float: ...


def engine_names() -> list[str]:
    """Every known engine name: the built-in ones first, then the registered ones, sorted."""
    extra = sorted(set(_registered()) - set(BUILTIN_ENGINES))
    return [*BUILTIN_ENGINES, *extra]


def check_engine_name(name: str) -> str:
    """`name` when an engine is known by it; else UnknownEngineError listing the known ones.
    A built-in name is checked without reading the installed packages' entry points."""
    if name in BUILTIN_ENGINES or name in _registered():
        return name
    known = ", ".join(repr(n) for n in engine_names())
    raise UnknownEngineError(f"unknown engine {name!r}: known engines are {known}")


def engine_class(name: str) -> EngineClass:
    """The Engine class registered as `name`, imported now."""
    target = BUILTIN_ENGINES.get(name) or _registered().get(name)
    if target is None:
        check_engine_name(name)  # raises, naming the known engines
    module, _, attr = str(target).partition(":")
    found: object = importlib.import_module(module)
    for part in attr.split("."):
        found = getattr(found, part)
    return found  # type: ignore[return-value]  (the registration's contract)


def _registered() -> dict[str, str]:
    """Entry points of ENTRY_POINT_GROUP: name -> "module:Class" (nothing imported)."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
