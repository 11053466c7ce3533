"""A real Prometheus scraping a live `agentserve up` (fake engine, two tenants with API keys)
on loopback, with the shipped alert rules loaded: every query of the shipped Grafana
dashboard (variables and panel targets, template variables substituted the way Grafana
does) must parse and return data, every recording rule must produce series for both
tenants, and no serving alert may be pending or firing on the healthy server.

Needs the prometheus binary (Debian package prometheus; ./install.sh --dev unpacks it into
.venv/bin); skipped where it is absent. Installs nothing itself. About a minute, most of it
`up` starting local Ray.

Run: .venv/bin/python -m pytest -q -m slow tests/integration/test_prometheus_live.py
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import yaml
from tool_binaries import find_binary
from up_server import free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "helm" / "agentserve" / "files" / "dashboards" / "agentserve.json"
RULES = ROOT / "helm" / "agentserve" / "files" / "alerts" / "agentserve.rules.yaml"
SERVING_ALERTS = "agentserve-serving.alerts"  # the rules group that watches the servers
MODEL = "fake-live"
KEYS = {"alpha": "sk-alpha-live-test", "beta": "sk-beta-live-test"}  # tenant -> API key
ROUNDS = 3  # traffic rounds, each seen by its own scrape, so every rate() has an increase
SCRAPE_S = 1
WAIT_S = 30  # for Prometheus to come up, scrape a round, evaluate the rules
# Grafana's $__rate_interval is max(4 x scrape interval, $__interval + scrape interval),
# 1m for its default 15 s scrape interval; 1m also covers all the traffic here.
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}


PROMETHEUS = find_binary("prometheus")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="prometheus binary not found ($PROMETHEUS, beside sys.executable, PATH): "
        "./install.sh --dev unpacks it into .venv/bin (Debian package prometheus), "
        "or apt-get install prometheus",
    ),
]


def _spec() -> str:
    tenants = [
        {
            "name": name,
            "api_key_sha256": hashlib.sha256(key.encode()).hexdigest(),
            # generous: a cold first request on a busy CPU must not make this flaky
            "sla": {"ttft_p95_ms": 60_000, "tpot_p95_ms": 2_000},
        }
        for name, key in KEYS.items()
    ]
    models = [
        {"name": MODEL, "engine": "fake", "max_model_len": 512, "replicas": {"num_cpus": 0.1}}
    ]
    return yaml.safe_dump({"models": models, "tenants": tenants})


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_targets() -> list[tuple[str, str]]:
    """(id, expr) for every target of every panel, rows' nested panels included."""
    panels = list(dashboard()["panels"])
    for panel in dashboard()["panels"]:
        panels.extend(panel.get("panels", []))
    return [
        (f"{p['title']} [{t.get('refId', i)}]", t["expr"])
        for p in panels
        for i, t in enumerate(p.get("targets", []))
    ]


def query_variables() -> list[dict]:
    return [v for v in dashboard()["templating"]["list"] if v.get("type") == "query"]


class Prom:
    """A Prometheus on 127.0.0.1 (its own temp config and storage), read over its HTTP API."""

    def __init__(self, binary: str, target: str, workdir: Path):
        self.url = f"http://127.0.0.1:{free_port()}"
        config = workdir / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {
                        "scrape_interval": f"{SCRAPE_S}s",
                        "evaluation_interval": f"{SCRAPE_S}s",
                    },
                    "rule_files": [str(RULES)],
                    "scrape_configs": [
                        {"job_name": "agentserve", "static_configs": [{"targets": [target]}]}
                    ],
                }
            )
        )
        self.log_path = workdir / "prometheus.log"
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address={self.url.removeprefix('http://')}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def api(self, path: str, **params) -> dict | list:
        """`data` of a /api/v1 answer; fails the test on an error answer."""
        body = self.http.get(f"/api/v1/{path}", params=params).json()
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", f"{expr!r} gave a {data['resultType']}"
        return data["result"]

    def wait_until(self, what: str, ok: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited ({self.proc.returncode}):\n{self.log()}")
            try:
                if ok():
                    return
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.25)
        pytest.fail(f"waited {timeout_s} s for {what}; prometheus log:\n{self.log()}")

    def stop(self) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _requests_seen(prom: Prom) -> float:
    result = prom.query(f'sum(agentserve_requests_total{{model="{MODEL}"}})')
    return float(result[0]["value"][1]) if result else 0.0


def _wait_for_scrape_of(prom: Prom, requests: int) -> None:
    prom.wait_until(f"a scrape with {requests} requests", lambda: _requests_seen(prom) == requests)


def _chat(client: httpx.Client, key: str, stream: bool) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "count the words in this prompt please"}],
        "max_tokens": 12,
        "stream": stream,
    }
    headers = {"Authorization": f"Bearer {key}"}  # json= sends Content-Type application/json
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as reply:
        reply.read()
        assert reply.status_code == 200, reply.text


def _drive_traffic(server_url: str, prom: Prom) -> None:
    """ROUNDS rounds of one request per tenant (the middle ones streamed); each round is
    scraped before the next starts, so each tenant's counters rise between scrapes."""
    sent = 0
    with httpx.Client(base_url=server_url, timeout=60) as client:
        for round_ in range(ROUNDS):
            for key in KEYS.values():
                _chat(client, key, stream=0 < round_ < ROUNDS - 1)
                sent += 1
            _wait_for_scrape_of(prom, sent)


def _rule_groups(prom: Prom) -> dict[str, dict]:
    return {g["name"]: g for g in prom.api("rules")["groups"]}


@pytest.fixture(scope="module")
def prom(start_up, tmp_path_factory) -> Iterator[Prom]:
    """A live server with traffic from both tenants, and a Prometheus that has scraped all
    of it and evaluated every rule group since."""
    spec = tmp_path_factory.mktemp("spec") / "tenants.yaml"
    spec.write_text(_spec())
    server = start_up("--spec", str(spec))
    prom = Prom(PROMETHEUS, server.url.removeprefix("http://"), tmp_path_factory.mktemp("prom"))
    try:
        prom.wait_until("ready", lambda: prom.http.get("/-/ready").status_code == 200)
        prom.wait_until(
            "the target to be up",
            lambda: [t["health"] for t in prom.api("targets")["activeTargets"]] == ["up"],
        )
        _drive_traffic(server.url, prom)
        scraped_all = time.time()
        prom.wait_until(
            "every rule group evaluated after the traffic",
            lambda: all(
                _evaluated_at(g) > scraped_all + SCRAPE_S for g in _rule_groups(prom).values()
            ),
        )
        yield prom
    finally:
        prom.stop()


def _evaluated_at(group: dict) -> float:
    """lastEvaluation (RFC 3339, nanoseconds, any zone) as Unix seconds (year 1 before any)."""
    stamp = group.get("lastEvaluation") or "0001-01-01T00:00:00Z"
    micro = re.sub(r"(\.\d{6})\d+", r"\1", stamp)  # fromisoformat stops at microseconds
    return datetime.fromisoformat(micro).timestamp()


def _grafana_substitute(expr: str, variables: dict[str, str]) -> str:
    """$name / ${name} / [[name]] -> value; an unknown variable fails the test."""

    def value(match: re.Match) -> str:
        name = match[1] or match[2] or match[3]
        if name not in variables:
            pytest.fail(f"dashboard variable ${name} has no value in this test: {expr!r}")
        return variables[name]

    return re.sub(r"\$\{(\w+)[^}]*\}|\$(\w+)|\[\[(\w+)\]\]", value, expr)


def _grafana_regex_escape(value: str) -> str:
    """A value as Grafana puts it into a PromQL regex matcher: regex metacharacters get a
    backslash, written doubled because the regex sits inside a PromQL string literal."""
    escaped = value.replace("\\", "\\" * 4)
    return re.sub(r"([\^$*+?.()|{}\[\]'])", r"\\\\\1", escaped)


def _label_values(prom: Prom, definition: str) -> list[str]:
    """Grafana's label_values(metric, label) through /api/v1/label/<label>/values."""
    match = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*", definition)
    assert match, f"variable query {definition!r} is not label_values(metric, label)"
    return prom.api(f"label/{match[2]}/values", **{"match[]": match[1]})


@pytest.fixture(scope="module")
def variables(prom) -> dict[str, str]:
    """Each query variable with every value it lists selected (Grafana's multi-value
    regex form, a|b), plus Grafana's built-in intervals."""
    chosen = dict(GRAFANA_BUILTINS)
    for var in query_variables():
        values = _label_values(prom, var["definition"])
        chosen[var["name"]] = "|".join(_grafana_regex_escape(v) for v in values)
    return chosen


def test_variables_list_the_model_and_both_tenants(prom):
    listed = {v["name"]: set(_label_values(prom, v["definition"])) for v in query_variables()}
    assert listed == {"model": {MODEL}, "tenant": set(KEYS)}


@pytest.mark.parametrize(
    "expr", [e for _, e in panel_targets()], ids=[i for i, _ in panel_targets()]
)
def test_every_panel_query_returns_data(prom, variables, expr):
    promql = _grafana_substitute(expr, variables)
    result = prom.query(promql)
    assert result, f"no data on a live server: {promql}"
    values = [float(series["value"][1]) for series in result]
    assert any(math.isfinite(v) for v in values), f"only NaN/Inf {values}: {promql}"
    tenants = {series["metric"]["tenant"] for series in result if "tenant" in series["metric"]}
    if tenants:  # a per-tenant panel shows every tenant that had traffic
        assert tenants == set(KEYS), f"tenants {tenants} in {promql}"


def _rules(prom: Prom, kind: str) -> list[dict]:
    return [
        rule
        for group in _rule_groups(prom).values()
        for rule in group["rules"]
        if rule["type"] == kind
    ]


def test_the_whole_rules_file_is_loaded_and_evaluates_cleanly(prom):
    shipped = yaml.safe_load(RULES.read_text())["groups"]
    loaded = _rule_groups(prom)
    assert {g["name"]: len(g["rules"]) for g in shipped} == {
        name: len(g["rules"]) for name, g in loaded.items()
    }
    unhealthy = [
        (r["name"], r.get("labels"), r.get("lastError"))
        for g in loaded.values()
        for r in g["rules"]
        if r["health"] != "ok"
    ]
    assert unhealthy == []


def test_recording_rules_produce_series_for_both_tenants(prom):
    recording = _rules(prom, "recording")
    assert recording, "the rules file records nothing"
    for rule in recording:
        matchers = ", ".join(f'{k}="{v}"' for k, v in sorted(rule.get("labels", {}).items()))
        series = prom.query(f"{rule['name']}{{{matchers}}}")
        assert {s["metric"].get("tenant") for s in series} == set(KEYS), (rule, series)
        assert all(math.isfinite(float(s["value"][1])) for s in series), (rule, series)


def test_no_serving_alert_is_pending_or_firing_on_a_healthy_server(prom):
    serving = _rule_groups(prom)[SERVING_ALERTS]["rules"]
    names = {rule["name"] for rule in serving}
    assert {
        "AgentserveReplicaDown",
        "AgentserveEngineUnhealthy",
        "AgentserveMetricsAbsent",
    } <= names
    active = {rule["name"]: rule["state"] for rule in serving if rule["state"] != "inactive"}
    assert active == {}, [rule["alerts"] for rule in serving if rule["state"] != "inactive"]
    assert prom.query(f'ALERTS{{alertname=~"{"|".join(sorted(names))}"}}') == []
