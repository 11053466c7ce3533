"""The CLI starts light: importing it and building its parser (every command's module)
loads none of the heavy runtimes; commands import them when they run."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("vllm", "torch", "ray", "transformers")


def test_cli_and_its_parser_import_no_heavy_runtime():
    code = (
        "import sys, agentserve.cli as cli; cli.build_parser(); "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_serving_app_module_does_import_ray():
    """The check above can fail: the same probe sees Ray where a module does import it."""
    code = f"import sys, agentserve.serve.app; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "ray" in out.stdout
