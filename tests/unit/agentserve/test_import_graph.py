"""No import circle among the project's own modules (issue 18).

A circle makes import order matter: the first module of the loop to be imported sees the
others half-built, and whoever adds a module-level name to one side breaks the other. A
lazy import inside a function hides the loop from `import` but not from the reader, so the
walk counts imports at every depth. Imports under `if TYPE_CHECKING:` are left out: they
never run, and annotations are strings here (`from __future__ import annotations`).

Edges follow what Python runs: `import a.b.c` depends on a.b.c; `from a.b import c`
depends on a.b.c when that is a module, else on a.b. A package's `__init__` is a module
of its own (named after the package); a module does not depend on its parent packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import agentserve
import agentserve_bench
import agentserve_operator

ROOTS = [
    Path(package.__file__).parent for package in (agentserve, agentserve_bench, agentserve_operator)
]


def _module_name(root: Path, path: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(roots: list[Path]) -> dict[str, Path]:
    """Every module of the packages under `roots`, by dotted name."""
    return {_module_name(root, path): path for root in roots for path in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Import statements at any depth, except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, modules) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if node.level:  # relative: `from . import x` inside a.b.c (or a.b's __init__)
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return {
        f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
        for alias in node.names
    }


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports (third-party ones are left out)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        graph[name] = {
            target
            for node in _imports(tree)
            for target in _targets(node, name, is_package, modules)
            if target in modules and target != name
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_project_has_no_import_circle():
    modules = project_modules(ROOTS)
    assert len(modules) > 80  # the walk found the three packages, not empty folders
    graph = import_graph(modules)
    found = cycles(graph)
    for component in found:
        print("import circle:", " <-> ".join(component))
        for module in component:
            print("   ", module, "->", sorted(graph[module] & set(component)))
    assert found == []


def test_the_runtime_does_not_import_its_cli():
    """The CLI sits on top: a runtime module that imports `agentserve.cli.x` runs the CLI
    package's __init__ (every command's imports) and ties itself to the command line.
    Helpers two commands share live below it (drafter_card and the benchmarks take
    chat_prompt_ids from dflash.train.prompts, not from `agentserve generate`)."""
    graph = import_graph(project_modules(ROOTS[:1]))
    offenders = {
        module: sorted(name for name in imported if name.startswith("agentserve.cli"))
        for module, imported in graph.items()
        if not module.startswith("agentserve.cli")
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_walk_finds_a_circle_closed_by_a_lazy_relative_import(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import helper\n",
            "pkg/b.py": "def helper():\n    from . import a\n",
            "pkg/c.py": "import pkg.a\n",
        },
    )
    graph = import_graph(project_modules([tmp_path / "pkg"]))
    assert graph["pkg.b"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_the_walk_resolves_submodules_packages_and_skips_type_checking(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .sub import thing\n",
            "pkg/sub/__init__.py": "from .leaf import thing\n",
            "pkg/sub/leaf.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    import pkg\n"
                "from .. import other\nimport json\nthing = 1\n"
            ),
            "pkg/other.py": "from pkg.sub import leaf, thing\n",
        },
    )
    graph = import_graph(project_modules([tmp_path / "pkg"]))
    assert graph == {
        "pkg": {"pkg.sub"},
        "pkg.sub": {"pkg.sub.leaf"},
        "pkg.sub.leaf": {"pkg.other"},
        "pkg.other": {"pkg.sub.leaf", "pkg.sub"},
    }
    assert cycles(graph) == [["pkg.other", "pkg.sub", "pkg.sub.leaf"]]


def test_admission_and_api_do_not_import_the_request_path():
    """Dependencies point one way (docs/architecture.md): serve/ -> admission/ -> api/;
    neither admission/ nor api/ reaches up into agentserve.serve (issue 65 item 3)."""
    graph = import_graph(project_modules(ROOTS[:1]))
    lower = ("agentserve.admission", "agentserve.api")
    offenders = {
        module: sorted(name for name in imported if name.startswith("agentserve.serve"))
        for module, imported in graph.items()
        if module.startswith(lower)
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_the_admit_stage_lives_in_admission():
    """Parse-and-admit is admission's (issue 65 item 3): the stage and the adapter names it
    rewrites are defined under agentserve.admission, which the test above keeps clear of
    serve/; serve/stages.py only wires it to the other stages."""
    from agentserve.admission.adapter_names import ModelNames
    from agentserve.admission.admit import Admit
    from agentserve.serve import stages

    assert Admit.__module__ == "agentserve.admission.admit"
    assert ModelNames.__module__ == "agentserve.admission.adapter_names"
    assert not hasattr(stages, "ModelNames") and "Admit" not in stages.__all__
