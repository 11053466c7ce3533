"""The runtime package (platform/agentserve) imports neither the benchmarks
(agentserve_bench) nor the tests: they import it, never the other way round."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import agentserve

RUNTIME = Path(agentserve.__file__).parent
FORBIDDEN = ("agentserve_bench", "tests")


def _imported_modules(path: Path) -> set[str]:
    """Every module an import statement in `path` names (at any depth: lazy ones too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_runtime_module_imports_benchmarks_or_tests():
    modules = sorted(RUNTIME.rglob("*.py"))
    assert len(modules) > 50  # the walk found the package, not an empty folder
    offenders = {
        str(path.relative_to(RUNTIME)): sorted(
            name for name in _imported_modules(path) if name.split(".")[0] in FORBIDDEN
        )
        for path in modules
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_walk_sees_lazy_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from agentserve_bench import command\n    import tests.x\n")
    assert _imported_modules(module) == {"agentserve_bench", "tests.x"}


def test_importing_the_cli_and_the_serving_path_loads_neither():
    code = (
        "import json, sys\n"
        "import agentserve.cli, agentserve.serve.local, agentserve.serve.ready\n"
        "import agentserve.autoscale.ray_policy\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{FORBIDDEN!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
