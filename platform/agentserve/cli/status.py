"""`agentserve status`: deployments, replicas, live TTFT/TPOT and SLA burn of a server.

Reads three endpoints of the ingress: GET /status (Serve deployments and replica states),
GET /health (per-model engine health) and GET /metrics (latency histograms, queue and
DFlash counters, per-tenant SLA objectives and requests within them). Latency and SLA
attainment are cumulative since the server started; with --watch each refresh shows the
window since the previous one. Rows are built by pure functions.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any

from agentserve.autoscale.model import LatencyModel
from agentserve.cli.console import Console
from agentserve.engine.cpu_info import CpuInfo
from agentserve.sdk.metrics_snapshot import MetricsSnapshot, parse_metrics
from agentserve.sdk.server_env import resolve_api_key, resolve_base_url, server_root

__all__ = ["Report", "add_parser", "burn_rate", "report_rows", "run_status", "sla_rows"]

TIMEOUT_S = 10.0
SLA_BUDGET = 0.05  # objectives are p95: 5% of requests may miss them
FAST_BURN, SLOW_BURN = 14.4, 6.0  # the burn-rate alerts' thresholds (docs/operations.md)


class ServerUnreachableError(ConnectionError):
    """Nothing answers at the URL."""


@dataclass
class Report:
    """What the server said: /health and /status bodies (None when absent) and metrics."""

    url: str
    health: dict[str, Any] | None
    status: dict[str, Any] | None
    metrics: MetricsSnapshot


def fetch_report(url: str, api_key: str | None = None, admin_url: str | None = None) -> Report:
    """Query the three endpoints (/status and /metrics at `admin_url`, default `url`: the
    server answers them only on loopback or on server.metrics_port); raise
    ServerUnreachableError when nothing answers."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    admin_url = admin_url or url
    try:
        with httpx.Client(timeout=TIMEOUT_S, headers=headers) as http:
            health = _json_or_none(http.get(f"{url}/health"))
            status = _json_or_none(http.get(f"{admin_url}/status"))
            metrics = http.get(f"{admin_url}/metrics")
    except httpx.HTTPError as err:
        raise ServerUnreachableError(
            f"nothing answers at {url} ({type(err).__name__}); start it with `agentserve up`"
        ) from None
    text = metrics.text if metrics.status_code == 200 else ""
    return Report(url, health, status, parse_metrics(text))


def _json_or_none(response: Any) -> dict[str, Any] | None:
    # /health answers 503 with a JSON body when a model is down: still worth showing
    if response.status_code not in (200, 503):
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


# -- rows (pure) -------------------------------------------------------------------------------
DEPLOYMENT_HEADER = ("app", "deployment", "status", "replicas", "message")
MODEL_HEADER = (
    "model",
    "health",
    "in_flight",
    "queued",
    "engine_running",
    "engine_waiting",
    "acceptance_length",
    "accepted_tokens",
    "draft_tokens",
    "est_speedup",
)
LATENCY_HEADER = (
    "model",
    "tenant",
    "requests",
    "errors",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "output_tokens",
)
SLA_HEADER = (
    "tenant",
    "requests",
    "ttft_slo_ms",
    "ttft_attained_pct",
    "ttft_burn",
    "tpot_slo_ms",
    "tpot_attained_pct",
    "tpot_burn",
    "state",
)


def deployment_rows(status: dict[str, Any] | None) -> list[tuple]:
    """One row per Serve deployment: app, name, status, replica states, first message line."""
    rows = []
    for app_name, app in sorted((status or {}).get("applications", {}).items()):
        for name, dep in sorted(app.get("deployments", {}).items()):
            replicas = ", ".join(f"{n} {s}" for s, n in sorted(dep.get("replicas", {}).items()))
            message = (dep.get("message") or "").strip().splitlines()
            rows.append(
                (app_name, name, dep["status"], replicas or "0", message[0] if message else "")
            )
    return rows


def model_rows(health: dict[str, Any] | None, metrics: MetricsSnapshot) -> list[tuple]:
    """One row per model: health from /health, queue and DFlash values from /metrics."""
    states = (health or {}).get("models", {})
    rows = []
    for model in sorted(set(states) | set(metrics.models)):
        v = metrics.models.get(model, {})
        drafted = v.get("draft_tokens")
        rows.append(
            (
                model,
                states.get(model, "-"),
                _int(v.get("in_flight")),
                _int(v.get("queued")),
                _int(v.get("running")),
                _int(v.get("waiting")),
                round(v["acceptance_length"], 2) if drafted else None,
                _int(v.get("accepted_tokens")),
                _int(drafted),
                speedup_estimate(v),
            )
        )
    return rows


def speedup_estimate(values: dict[str, float]) -> float | None:
    """Decode speedup over no speculation implied by the measured acceptance: tokens per
    step (tau) divided by how much longer a step verifying k drafts takes than a plain step
    at the current batch (the autoscaler's fitted step-cost model). None without drafts."""
    drafts, drafted = values.get("drafts"), values.get("draft_tokens")
    if not drafts or not drafted:
        return None
    tau = 1.0 + values.get("accepted_tokens", 0.0) / drafts
    batch = max(round(values.get("running") or 1), 1)
    k = max(round(drafted / drafts), 1)
    model = LatencyModel()
    return round(tau * model.step_ms(batch, 0) / model.step_ms(batch, k), 2)


def latency_rows(metrics: MetricsSnapshot) -> list[tuple]:
    """One row per (model, tenant): requests, non-2xx, TTFT and TPOT p50/p95 in ms, tokens."""
    rows = []
    for (model, tenant), s in sorted(metrics.tenants.items()):
        total = sum(s.requests.values())
        errors = sum(n for status, n in s.requests.items() if not status.startswith("2"))
        rows.append(
            (
                model,
                tenant,
                _int(total),
                _int(errors),
                _ms(s.ttft.quantile(0.5)),
                _ms(s.ttft.quantile(0.95)),
                _ms(s.tpot.quantile(0.5)),
                _ms(s.tpot.quantile(0.95)),
                _int(s.output_tokens),
            )
        )
    return rows


def burn_rate(measured: float, within: float) -> float | None:
    """Error-budget burn rate of one objective: (1 - attainment) / SLA_BUDGET, attainment =
    within / measured (the alert rules' formula); None without measured requests."""
    if measured <= 0:
        return None
    return (1.0 - min(within, measured) / measured) / SLA_BUDGET


def sla_state(burns: list[float | None]) -> str:
    """The worst burn against the alerts' thresholds: fast-burn (> 14.4), slow-burn (> 6),
    over-budget (> 1), ok, or '-' without requests."""
    known = [b for b in burns if b is not None]
    if not known:
        return "-"
    worst = max(known)
    for limit, state in ((FAST_BURN, "fast-burn"), (SLOW_BURN, "slow-burn"), (1.0, "over-budget")):
        if worst > limit:
            return state
    return "ok"


def sla_rows(metrics: MetricsSnapshot) -> list[tuple]:
    """One row per tenant with objectives: requests measured, then per objective (TTFT,
    TPOT) its p95 target in ms, % of requests within it and the burn rate, summed over
    models from the same counters the alert rules read; last the sla_state."""
    rows = []
    for tenant in sorted({t for t, _ in metrics.objectives}):
        mine = [s for (_, t), s in metrics.tenants.items() if t == tenant]
        row: list = [tenant, _int(sum(s.ttft.count for s in mine))]
        burns = []
        for objective in ("ttft", "tpot"):
            measured = sum(getattr(s, objective).count for s in mine)
            within = sum(s.within_sla.get(objective, 0.0) for s in mine)
            burn = burn_rate(measured, within)
            burns.append(burn)
            pct = None if burn is None else round(100.0 * min(within, measured) / measured, 1)
            target = metrics.objectives.get((tenant, objective))
            row += [_ms(target), pct, None if burn is None else round(burn, 2)]
        rows.append((*row, sla_state(burns)))
    return rows


def report_rows(report: Report, metrics: MetricsSnapshot | None = None) -> dict[str, list]:
    """{"deployment": rows, "model": rows, "latency": rows, "sla": rows}; `metrics`
    overrides the report's (e.g. a --watch window)."""
    m = report.metrics if metrics is None else metrics
    return {
        "deployment": deployment_rows(report.status),
        "model": model_rows(report.health, m),
        "latency": latency_rows(m),
        "sla": sla_rows(m),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


# -- output ------------------------------------------------------------------------------------
_HEADERS = {
    "deployment": DEPLOYMENT_HEADER,
    "model": MODEL_HEADER,
    "latency": LATENCY_HEADER,
    "sla": SLA_HEADER,
}


def render(console: Console, report: Report, rows: dict[str, list], window: str) -> None:
    """Plain: one JSON line per row ({"kind": ..., column: value}). Human: four tables."""
    overall = (report.health or {}).get("status", "unknown")
    machine = (report.status or {}).get("machine")
    if console.plain:
        server = {"kind": "server", "url": report.url, "health": overall, "window": window}
        console.record({**server, "machine": machine})
        for kind, kind_rows in rows.items():
            for row in kind_rows:
                console.record({"kind": kind, **dict(zip(_HEADERS[kind], row, strict=True))})
        return
    colour = "green" if overall == "ok" else "red"
    console.say(f"agentserve at {report.url}: {console.style(overall, 'bold', colour)}")
    if machine:
        cpu = CpuInfo(machine["model"], machine["cores"], tuple(machine["features"]))
        console.say(f"machine: {cpu.describe()} ({machine['cpu_class']})")
    if report.status is None:
        console.say("(no /status endpoint: deployments unknown)")
    for kind in ("deployment", "model", "latency", "sla"):
        if rows[kind]:
            console.say()
            console.table([h.upper() for h in _HEADERS[kind]], rows[kind])
    console.say()
    console.say(
        console.style(
            f"latency and SLA over {window}; burn = (1 - attained) / 5% budget "
            f"(alerts: > {FAST_BURN:g} fast, > {SLOW_BURN:g} slow); '-' = no data yet",
            "dim",
        )
    )


def run_status(args: argparse.Namespace, console: Console | None = None) -> int:
    """`agentserve status`: exit 0 when healthy, 1 unreachable or unhealthy."""
    console = console or Console()
    base = resolve_base_url(args.url, os.environ)  # agentserve.sdk.server_env
    if base.note:
        console.error(base.note)
    url = server_root(str(base.value))
    key = resolve_api_key(args.api_key, getattr(args, "api_key_file", None), os.environ).value
    admin = (getattr(args, "admin_url", None) or url).rstrip("/")
    for name, value in (("--url", url), ("--admin-url", admin)):
        if not value.startswith(("http://", "https://")):
            console.error(f"{name} {value!r} is not an http:// or https:// URL")
            return 2
    if not 0 <= args.watch < float("inf"):
        console.error("--watch takes a number of seconds >= 0 (0: report once)")
        return 2
    try:
        report = fetch_report(url, key, admin)
        render(console, report, report_rows(report), "the server's lifetime")
        while args.watch:
            time.sleep(args.watch)
            previous, report = report, fetch_report(url, key, admin)
            window = report.metrics.minus(previous.metrics)
            console.say()
            render(console, report, report_rows(report, window), f"the last {args.watch:g} s")
    except ServerUnreachableError as err:
        console.error(str(err))
        return 1
    except KeyboardInterrupt:
        return 0
    return 0 if (report.health or {}).get("status") == "ok" else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `status` on the CLI's subparsers."""
    p = sub.add_parser(
        "status",
        help="deployments, replicas, live TTFT/TPOT and per-tenant SLA burn of a server",
        description="Show a running agentserve's Serve deployments and replica states, "
        "per-model health, queue and DFlash acceptance, per model+tenant TTFT/TPOT "
        "percentiles, and per tenant its SLA: the TTFT and TPOT p95 targets (the server "
        "exports them from its DeploymentSpec, so no flag is needed), the share of "
        "requests within each, and the error-budget burn rate = (1 - attained) / 0.05, "
        "the series and formula the alert rules use; the burn-rate alerts fire above "
        "14.4 (over 1h and 5m) and 6 (over 6h and 30m). Figures cover the server's "
        "lifetime, or with --watch each interval (from its /status, /health and /metrics "
        "endpoints).",
    )
    p.add_argument(
        "--url",
        help="server URL, /v1 optional (default: $AGENTSERVE_BASE_URL, else $OPENAI_BASE_URL, "
        "else the deprecated $AGENTSERVE_URL, else http://127.0.0.1:8000)",
    )
    p.add_argument(
        "--admin-url",
        default=os.environ.get("AGENTSERVE_ADMIN_URL"),
        help="where /status and /metrics answer: the server's metrics port when "
        "server.metrics_port is set (default: $AGENTSERVE_ADMIN_URL, else --url)",
    )
    p.add_argument(
        "--api-key",
        help="sent as a Bearer token: a remote server's /health names its models only to a "
        "valid key (loopback and the metrics port need none), and a gateway in front of the "
        "server may require one (default: $AGENTSERVE_API_KEY, else $OPENAI_API_KEY; the "
        "flag shows in process lists: prefer those or --api-key-file)",
    )
    p.add_argument("--api-key-file", help="read the API key from this file")
    p.add_argument(
        "--watch",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="refresh every SECONDS, showing latency over each interval (Ctrl-C stops)",
    )
    p.set_defaults(handler=run_status)
