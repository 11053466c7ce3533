"""The test tree must not shadow the project's packages.

pytest (prepend import mode) puts on sys.path every folder that holds a test module or a
conftest.py and no __init__.py. If such a folder has a subfolder named like one of the
project's packages (tests/unit/ holds agentserve/, agentserve_bench/, dflash/ ...), a
process that imports that package fresh (a spawned vLLM or benchmark worker inherits
sys.path) finds the test folder first, as a namespace package, and fails with
"No module named agentserve.engine..." (CI failed this way once).
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
PACKAGES = {"agentserve", "agentserve_bench", "agentserve_operator", "dflash"}


def _on_sys_path(folder: Path) -> bool:
    if (folder / "__init__.py").exists():
        return False
    return (folder / "conftest.py").exists() or any(folder.glob("test_*.py"))


def test_no_folder_pytest_puts_on_sys_path_holds_a_package_named_folder():
    offending = [
        f"{folder.relative_to(TESTS.parent)}/{child.name}"
        for folder in [TESTS, *(p for p in TESTS.rglob("*") if p.is_dir())]
        if _on_sys_path(folder)
        for child in folder.iterdir()
        if child.is_dir() and child.name in PACKAGES
    ]
    assert offending == [], f"move the test files out of these folders' parents: {offending}"


def test_the_check_sees_the_layout_that_broke_ci(tmp_path):
    (tmp_path / "agentserve").mkdir()
    (tmp_path / "test_x.py").write_text("")
    assert _on_sys_path(tmp_path) and (tmp_path / "agentserve").is_dir()


def test_test_modules_outside_packages_have_unique_basenames():
    """Outside a package, pytest imports a test module by its basename: two files with
    one name (tests/integration/test_x.py and tests/unit/y/test_x.py) fail collection
    with "import file mismatch" (CI failed this way once)."""
    seen: dict[str, list[str]] = {}
    for path in TESTS.rglob("test_*.py"):
        if not (path.parent / "__init__.py").exists():
            seen.setdefault(path.name, []).append(str(path.relative_to(TESTS.parent)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert clashes == {}, f"rename one of each: {clashes}"
