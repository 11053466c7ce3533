"""The chart's API key under GitOps: `helm template` has no cluster to read a generated key
back from, so it must not make a new one on every render; it either uses
apiKeys.existingSecret or fails saying so. Needs helm; skipped without it."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from test_helm import CHART_DIR, HELM, chart  # noqa: F401  (the chart fixture)

pytestmark = pytest.mark.skipif(HELM is None, reason="helm not found: run helm/install-helm.sh")


def _template(chart_dir, *sets: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HELM, "template", "rel", str(chart_dir), "--set", "model.source=bundled", *sets],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_offline_render_without_an_existing_secret_fails_with_a_message(chart):  # noqa: F811
    done = _template(chart)
    assert done.returncode != 0, "rendered a new random key offline"
    assert "apiKeys.existingSecret" in done.stderr


def test_existing_secret_renders_the_same_every_time_and_creates_none(chart):  # noqa: F811
    first = _template(chart, "--set", "apiKeys.existingSecret=team-keys")
    assert first.returncode == 0, first.stderr
    objs = [o for o in yaml.safe_load_all(first.stdout) if o]
    assert "Secret" not in {o["kind"] for o in objs}
    [cr] = [o for o in objs if o["kind"] == "AgentServe"]
    assert cr["spec"]["kubernetes"]["api_key_secret"] == "team-keys"
    again = _template(chart, "--set", "apiKeys.existingSecret=team-keys")
    assert again.stdout == first.stdout, "GitOps sees no change between syncs"
    assert (CHART_DIR / "values.yaml").read_text().count("existingSecret:") == 1
