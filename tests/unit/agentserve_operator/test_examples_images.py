"""The GPU examples' `helm install` lines name the images (issue 28 item 8): each README's
command, run as `helm template` with the same arguments, puts the images it sets on the
operator and on the Ray pods, and they are the ones .github/workflows/images.yml pushes
for the chart's appVersion (tag v<appVersion> -> :<appVersion> and :<appVersion>-cuda).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from agentserve_operator.chart import CHART_DIR
from test_helm import HELM, chart, helm  # noqa: F401  (chart: the fixture)

ROOT = Path(__file__).resolve().parents[3]
READMES = sorted((ROOT / "examples").glob("*-k8s-*/README.md"))
needs_helm = pytest.mark.skipif(HELM is None, reason="helm not found: run helm/install-helm.sh")


def helm_install_args(readme: Path) -> list[str]:
    """The arguments after `helm install` in the README's bash blocks (one command)."""
    blocks = re.findall(r"```bash\n(.*?)```", readme.read_text(), flags=re.S)
    text = re.sub(r"\\\n", " ", "\n".join(blocks))
    [line] = [x for x in text.splitlines() if x.strip().startswith("helm install ")]
    return shlex.split(line.split("#")[0])[2:]


def pushed_images() -> tuple[str, str]:
    meta = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    repo = "ghcr.io/" + meta["home"].removeprefix("https://github.com/")
    return f"{repo}:{meta['appVersion']}", f"{repo}:{meta['appVersion']}-cuda"


@needs_helm
@pytest.mark.parametrize("readme", READMES, ids=[p.parent.name for p in READMES])
def test_readme_install_line_sets_the_pushed_images(chart, readme):  # noqa: F811
    args = helm_install_args(readme)
    release, chart_path, *rest = args
    assert Path(ROOT / chart_path).resolve() == CHART_DIR.resolve()
    sets = " ".join(rest)
    for key in ("operator.image.repository", "operator.image.tag", "servingImage.repository",
                "servingImage.tag"):  # fmt: skip
        assert f"{key}=" in sets, f"{readme.parent.name}: no --set {key}"
    rest = [str(ROOT / a) if a.startswith("examples/") else a for a in rest]
    objs = [o for o in yaml.safe_load_all(helm("template", release, str(chart), *rest)) if o]
    [deploy] = [
        o for o in objs if o["kind"] == "Deployment" and "operator" in o["metadata"]["name"]
    ]
    [cr] = [o for o in objs if o["kind"] == "AgentServe"]
    operator_image = deploy["spec"]["template"]["spec"]["containers"][0]["image"]
    assert (operator_image, cr["spec"]["kubernetes"]["image"]) == pushed_images()


def test_install_line_parser(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("x\n```bash\nkubectl get x\nhelm install a helm/agentserve -f v.yaml \\\n"
                      "  --set k=v   # note\n```\n")  # fmt: skip
    assert helm_install_args(readme) == ["a", "helm/agentserve", "-f", "v.yaml", "--set", "k=v"]
