"""What a reliability scenario returns (`Outcome`) and how it is named (`@scenario`).

A scenario is a plain function tagged with `@scenario("name")`; it returns an `Outcome`.
The test suite calls the same functions and asserts on the outcome, and
`python -m tests.reliability.run` (run.py) runs them to record the figures in
docs/benchmarks/reliability.json, so the published figures come from exactly the code
the tests check. The tag is an attribute of the function, not a global registry: run.py
collects the tagged functions of the modules it names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

__all__ = ["Outcome", "scenario", "scenarios_in"]

_NAME_ATTR = "reliability_scenario"


@dataclass
class Outcome:
    """What one scenario saw. `lost` counts requests that got no complete answer (no
    response, a truncated stream, or a 5xx where a 4xx/2xx was due)."""

    requests: int
    lost: int
    errors_5xx: int
    restarts: int
    details: dict[str, Any] = field(default_factory=dict)
    engine: str = "fake"  # the replicas' engine: "fake" (deterministic) or "vllm" (real)

    @property
    def clean(self) -> bool:
        return self.lost == 0 and self.errors_5xx == 0


def scenario(name: str) -> Callable[[Callable[..., Outcome]], Callable[..., Outcome]]:
    """Tag a scenario function with `name` (a test id-like string, unique)."""

    def tag(fn: Callable[..., Outcome]) -> Callable[..., Outcome]:
        setattr(fn, _NAME_ATTR, name)
        return fn

    return tag


def scenarios_in(modules: Iterable[ModuleType]) -> dict[str, Callable[..., Outcome]]:
    """name -> function for every tagged function the modules define; a name used twice
    raises ValueError."""
    found: dict[str, Callable[..., Outcome]] = {}
    for module in modules:
        for value in vars(module).values():
            name = getattr(value, _NAME_ATTR, None)
            if name is None or not callable(value):
                continue
            if name in found and found[name] is not value:
                raise ValueError(f"reliability scenario {name!r} defined twice")
            found[name] = value
    return found
