"""Ray Serve adapter (Ray 2.60): runs the pure `decide` as a deployment's custom
autoscaling policy, fed by the replicas' `record_autoscaling_stats` metrics
(docs/autoscaling.md describes the inputs).

`ray_autoscaling_config(spec, model)` returns the deployment's `autoscaling_config`, Ray's
own delays and factors set neutral because `decide` holds its own. Ray calls
`SlaAutoscalingPolicy(**policy_kwargs)` every control-loop tick with an
`AutoscalingContext`; it decides once per `autoscaling.interval_s` (keeping the target in
between) and returns (target replicas, policy_state). Ray's cold-start fast path runs before
it. Replicas publish `encode_replica_stats(...)`: Ray averages each over
`look_back_period_s`, except the latency histograms, read from each replica's latest report
and pooled with `latency_stat.pooled_tenant_latency` (as in the simulator); the replica start
is the largest reported (`start_stat.measured_start_s`), kept in policy_state. Sleeping
replicas and their last wake are observed in policy_state's "agentserve_last", not planned
with. Requests the ingresses hold (serve/held_board.py) are read from Ray's GCS store once
per decision (bounded by a second; a failed read decides without them) and added to the
queue, the requests in flight and the TTFT windows. Another policy with decide's shape runs
the same way: subclass SlaAutoscalingPolicy with `policy = staticmethod(my_decide)` and pass
its import path as `policy_function`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import Any

from agentserve.autoscale.burst import BurstKnobs
from agentserve.autoscale.latency_stat import LatencyWindow, pooled_tenant_latency
from agentserve.autoscale.model import LatencyModel
from agentserve.autoscale.policy import (
    PolicySpec,
    PolicyState,
    ScaleDecision,
    Sla,
    Snapshot,
    decide,
)
from agentserve.autoscale.policy_types import DEFAULT_REPLICA_START_S
from agentserve.autoscale.standby import plan_fleet
from agentserve.autoscale.start_stat import measured_start_s
from agentserve.autoscale.step_refit import (
    BATCH_MEAN_KEY,
    SAMPLES_KEY,
    TPOT_MEAN_KEY,
    StepRefit,
    refit_from_reports,
    refit_model,
)
from agentserve.serve.held_board import HELD_SCOPE, HeldReport, HeldStore, read_held
from agentserve.spec import DeploymentSpec

__all__ = [
    "SlaAutoscalingPolicy",
    "encode_replica_stats",
    "policy_spec_from_json",
    "policy_spec_to_json",
    "ray_autoscaling_config",
    "replica_sleep",
    "replica_starts",
    "snapshot_from_context",
]

log = logging.getLogger("ray.serve")
POLICY_PATH = "agentserve.autoscale.ray_policy:SlaAutoscalingPolicy"
STATE_KEY = "agentserve"
START_KEY = "agentserve_replica_start_s"  # policy_state: the last measured replica start
DECIDED_KEY = "agentserve_decided_at"  # policy_state: when `decide` last ran
WARMING_KEY = "agentserve_warming"  # policy_state: [replicas warming, since when]
REFIT_STATE_KEY = "agentserve_refit"  # policy_state: step_refit ratios by batch bucket
BOARD_KEY = "held_board"  # policy_kwargs: {"scope", "model"} of the held-requests board
REFIT_KEY = "refit_online"  # policy_kwargs: refit the latency prior (step_refit.py)
RAY_METRICS_INTERVAL_S = 10.0  # Ray 2.60's default AutoscalingConfig.metrics_interval_s
_TTFT, _TPOT, _REQS = "agentserve_ttft_hist:", "agentserve_tpot_hist:", "agentserve_requests:"
_RECENT = "agentserve_arrival_rps_recent"
_START = "agentserve_replica_start_s"
_SLEEPING, _WAKE = "agentserve_replica_sleeping", "agentserve_replica_wake_s"
_RATE, _PROMPT, _OUTPUT, _FINISHED = (
    "agentserve_arrival_rps",
    "agentserve_prompt_tokens",
    "agentserve_output_tokens",
    "agentserve_finished_requests",
)
_RUNNING, _WAITING, _ACCEPT = (
    "agentserve_engine_running",
    "agentserve_engine_waiting",
    "agentserve_acceptance_length:",
)


def policy_spec_to_json(spec: PolicySpec) -> dict[str, Any]:
    """PolicySpec as JSON-able data (Ray requires JSON policy_kwargs)."""
    data = asdict(spec)
    data["slas"] = {name: list(sla) for name, sla in spec.slas.items()}
    data["default_sla"] = list(spec.default_sla)
    return data


def policy_spec_from_json(data: Mapping[str, Any]) -> PolicySpec:
    """Inverse of policy_spec_to_json (the adapter's own policy_kwargs, BOARD_KEY, left out)."""
    data = dict(data)
    data.pop(BOARD_KEY, None)
    data.pop(REFIT_KEY, None)
    data["slas"] = {name: Sla(*sla) for name, sla in data.get("slas", {}).items()}
    data["default_sla"] = Sla(*data["default_sla"]) if "default_sla" in data else Sla(1000, 100)
    model = data.get("model")
    data["model"] = LatencyModel(**model) if model is not None else None
    if "burst" in data:
        data["burst"] = BurstKnobs(*data["burst"])
    if data.get("schedule") is not None:
        data["schedule"] = tuple(tuple(r) for r in data["schedule"])
    return PolicySpec(**data)


def ray_autoscaling_config(
    spec: DeploymentSpec,
    model_name: str | None = None,
    *,
    latency_model: LatencyModel | None = None,
    replica_start_s: float = DEFAULT_REPLICA_START_S,
    look_back_period_s: float | None = None,
    policy_function: str = POLICY_PATH,
    tenant_slas: Mapping[str, Any] | None = None,
    refit_online: bool = False,
) -> dict[str, Any]:
    """The `autoscaling_config` for one model's deployment. Policy "sla" runs
    `policy_function` (our SlaAutoscalingPolicy, or a subclass running another policy);
    "ray_default" keeps Ray's policy: target ongoing requests = max_num_seqs x
    target_utilization per replica, with the spec's bounds and delays.
    `look_back_period_s` defaults to spec.autoscaling.look_back_period_s; a look-back of
    10 s or less also shortens Ray's metrics push interval (`metrics_interval_s`, 10 s by
    default, a field Ray 2.60 deprecates) to a third of it, since Ray requires the
    look-back to exceed the push interval. `replica_start_s` is the expected replica start
    the policy plans with until the replicas report their measured one. `refit_online`:
    `latency_model` is a prior (gpu_latency.py) the policy refits from the replicas' own
    TPOT (step_refit.py)."""
    policy = PolicySpec.from_deployment(
        spec,
        model_name,
        latency_model=latency_model,
        replica_start_s=replica_start_s,
        tenant_slas=tenant_slas,
    )
    look_back = look_back_period_s or spec.autoscaling.look_back_period_s
    config: dict[str, Any] = {
        "min_replicas": policy.min_replicas,
        "max_replicas": policy.max_replicas,
        "look_back_period_s": look_back,
    }
    if look_back <= RAY_METRICS_INTERVAL_S:  # Ray needs look_back > push interval
        config["metrics_interval_s"] = look_back / 3
    model = next(m for m in spec.models if model_name in (None, m.name))
    if model.replicas.initial_replicas is not None:
        config["initial_replicas"] = model.replicas.initial_replicas
    if spec.autoscaling.policy == "ray_default":
        target = model.engine_slots * spec.autoscaling.target_utilization
        config["target_ongoing_requests"] = max(1.0, target)
        config["upscale_delay_s"] = spec.autoscaling.upscale_delay_s
        config["downscale_delay_s"] = spec.autoscaling.downscale_delay_s
        return config
    kwargs = policy_spec_to_json(policy)
    kwargs[BOARD_KEY] = {"scope": HELD_SCOPE, "model": model.name}  # serve/held_board.py
    kwargs[REFIT_KEY] = bool(refit_online and latency_model is not None)
    config.update(
        upscale_delay_s=0.0,
        downscale_delay_s=0.0,
        upscaling_factor=1.0,
        downscaling_factor=1.0,
        policy={"policy_function": policy_function, "policy_kwargs": kwargs},
    )
    return config


def encode_replica_stats(
    tenants: Mapping[str, LatencyWindow],
    *,
    arrival_rate_rps: float,
    mean_prompt_tokens: float,
    mean_output_tokens: float,
    finished_requests: int = 0,
    engine_running: float = 0.0,
    engine_waiting: float = 0.0,
    acceptance_by_batch: Mapping[str, float] | None = None,
    recent_arrival_rate_rps: float | None = None,
    replica_start_s: float | None = None,
    sleeping: bool | None = None,
    wake_s: float | None = None,
    tpot_mean: tuple[float, float, int] | None = None,
) -> dict[str, float]:
    """One replica's `record_autoscaling_stats` result: flat name -> float (Ray's contract).
    Tenant latencies are the replica's window as bucket counts
    (`agentserve_ttft_hist:<tenant>:<bucket>`, empty buckets omitted; see latency_stat),
    so the adapter can pool them across replicas. `engine_running` / `engine_waiting` are
    the engine's batch and queue now; `acceptance_by_batch` maps a batch-size bucket ("1",
    "3-4", ...) to the mean DFlash acceptance length over the window (exported for
    observation; the policy plans with its LatencyModel); `recent_arrival_rate_rps` covers
    the burst detector's short window (burst.RECENT_WINDOW_S); `replica_start_s` how long
    the replica took to start, construction to engine ready (`agentserve_replica_start_s`,
    omitted when None); `sleeping` whether its engine sleeps now and `wake_s` its last
    wake, seconds (idle sleep, serve/sleep_gate.py; each omitted when None). The token means
    are over the `finished_requests` the window holds, which weight them when pooled.
    `tpot_mean`: (mean TPOT ms, mean engine batch, TPOT samples) over the window, what the
    policy refits a latency prior from (step_refit.py; omitted when None)."""
    out = {_RATE: arrival_rate_rps, _PROMPT: mean_prompt_tokens, _OUTPUT: mean_output_tokens}
    out[_FINISHED] = float(finished_requests)
    if recent_arrival_rate_rps is not None:
        out[_RECENT] = float(recent_arrival_rate_rps)
    if replica_start_s is not None:
        out[_START] = float(replica_start_s)
    if sleeping is not None:
        out[_SLEEPING] = float(sleeping)
    if wake_s is not None:
        out[_WAKE] = float(wake_s)
    if tpot_mean is not None:
        out[TPOT_MEAN_KEY], out[BATCH_MEAN_KEY] = float(tpot_mean[0]), float(tpot_mean[1])
        out[SAMPLES_KEY] = float(tpot_mean[2])
    out[_RUNNING], out[_WAITING] = float(engine_running), float(engine_waiting)
    for bucket, length in (acceptance_by_batch or {}).items():
        out[_ACCEPT + bucket] = float(length)
    for name, window in tenants.items():
        out[_REQS + name] = float(window.requests)
        for prefix, hist in ((_TTFT, window.ttft), (_TPOT, window.tpot)):
            for index, count in hist.items():
                out[f"{prefix}{name}:{index}"] = float(count)
    return out


def _latest_reports(ctx: Any) -> dict[Any, dict[str, float]]:
    """Per replica, the metrics of its latest report (`raw_metrics`: the points sharing
    the newest timestamp), falling back to Ray's look-back averages (`aggregated_metrics`)
    for a replica without raw series. Latency histograms must not be time-averaged: a
    bucket missing from later reports would keep its old count."""
    points: dict[Any, dict[str, tuple[float, float]]] = {}
    for key, per_replica in (getattr(ctx, "raw_metrics", None) or {}).items():
        if not key.startswith("agentserve_"):
            continue  # Ray's own series: a failed stats call must not hide ours
        for rid, series in (per_replica or {}).items():
            if series:
                points.setdefault(rid, {})[key] = (series[-1].timestamp, series[-1].value)
    out: dict[Any, dict[str, float]] = {}
    for key, per_replica in (ctx.aggregated_metrics or {}).items():
        for rid, value in per_replica.items():
            if rid not in points:
                out.setdefault(rid, {})[key] = value
    for rid, by_key in points.items():
        newest = max(t for t, _ in by_key.values())
        out[rid] = {k: v for k, (t, v) in by_key.items() if t == newest}
    return out


def _windows(report: Mapping[str, float]) -> dict[str, LatencyWindow]:
    """One replica's tenant windows decoded from its published stats."""
    ttft: dict[str, dict[int, float]] = {}
    tpot: dict[str, dict[int, float]] = {}
    requests: dict[str, int] = {}
    for key, value in report.items():
        if math.isnan(value):
            continue
        if key.startswith(_REQS):
            requests[key[len(_REQS) :]] = int(value)
            continue
        for prefix, into in ((_TTFT, ttft), (_TPOT, tpot)):
            if key.startswith(prefix):
                name, _, index = key[len(prefix) :].rpartition(":")
                into.setdefault(name, {})[int(index)] = value
    names = set(ttft) | set(tpot) | set(requests)
    return {n: LatencyWindow(ttft.get(n, {}), tpot.get(n, {}), requests.get(n, 0)) for n in names}


def replica_starts(reports: Mapping[Any, Mapping[str, float]]) -> list[float]:
    """The start times (seconds) in the replicas' reports (replica -> decoded stats)."""
    return [r[_START] for r in reports.values() if _START in r]


def replica_sleep(reports: Mapping[Any, Mapping[str, float]]) -> tuple[int, float | None]:
    """(replicas whose engine sleeps now, the largest last wake in seconds or None) from
    the replicas' reports (replica -> decoded stats)."""
    asleep = sum(1 for r in reports.values() if r.get(_SLEEPING, 0.0) >= 0.5)
    wakes = [r[_WAKE] for r in reports.values() if _WAKE in r and math.isfinite(r[_WAKE])]
    return asleep, max(wakes) if wakes else None


def _pooled_mean(metrics: Mapping[str, Mapping[Any, float]], key: str) -> float:
    """The fleet's mean of a per-replica token mean: weighted by the requests each replica
    finished, so a replica that finished none (just started, idle) does not halve it."""
    means, counts = metrics.get(key) or {}, metrics.get(_FINISHED) or {}
    weight = sum(counts.get(r, 0.0) for r in means)
    if weight > 0:
        return sum(m * counts.get(r, 0.0) for r, m in means.items()) / weight
    return 0.0


def snapshot_from_context(
    ctx: Any,
    state: PolicyState,
    last_start_s: float | None = None,
    warming_since_s: float | None = None,
    held: HeldReport | None = None,
) -> Snapshot:
    """Snapshot from a Ray `AutoscalingContext`. Replicas above the current count up to
    the target are warming, aged from the last scale-up or from `warming_since_s` (when
    more began warming without one: a replica replacing a crashed one), whichever is later;
    those above the target drain.
    Queued = requests waiting at handles, inside engines (no batch slot) and in the
    ingresses' deadline queues (`held`: the board's fresh publications), like the
    simulator's ingress queue; the held requests' waits join the tenants' TTFT windows and
    count in flight. Latency windows and the recent arrival rate come
    from each replica's latest report (a replica's own windows already cover the look-back;
    averaging them again over it would lag the burst detector and blur the histograms).
    The replica start is the largest the replicas report, else `last_start_s` (the last
    measured one)."""
    now = ctx.current_time if ctx.current_time is not None else 0.0
    running, target = ctx.current_num_replicas, ctx.target_num_replicas
    metrics = ctx.aggregated_metrics or {}
    warming = max(0, target - running)
    started = max((s for s in (state.last_up_s, warming_since_s) if s is not None), default=None)
    age = 0.0 if started is None else max(0.0, now - started)
    queued = (ctx.total_queued_requests or 0.0) + sum((metrics.get(_WAITING) or {}).values())
    reports = _latest_reports(ctx)
    recent = [r[_RECENT] for r in reports.values() if _RECENT in r]
    windows = [_windows(r) for r in reports.values()]
    held_slots = 0 if held is None else held.held
    if held is not None:
        windows.append(dict(held.tenants))
    return Snapshot(
        now_s=now,
        ready_replicas=min(running, target),
        warming_ages_s=(age,) * warming,
        draining_replicas=max(0, running - target),
        tenants=pooled_tenant_latency(windows),
        arrival_rate_rps=sum((metrics.get(_RATE) or {}).values()),
        mean_prompt_tokens=_pooled_mean(metrics, _PROMPT),
        mean_output_tokens=_pooled_mean(metrics, _OUTPUT),
        in_flight=math.ceil(ctx.total_num_requests or 0.0) + held_slots,
        queued=math.ceil(queued) + held_slots,
        recent_arrival_rate_rps=sum(recent) if recent else None,
        replica_start_s=measured_start_s(replica_starts(reports), last_start_s),
    )


def _warming_since(ctx: Any, policy_state: dict[str, Any], now: float) -> float | None:
    """When the replicas warming now began to (kept in policy_state): reset whenever more
    warm than at the last decision, which a replica replacing a crashed one does without a
    scale-up; None when none warms."""
    warming = max(0, ctx.target_num_replicas - ctx.current_num_replicas)
    seen, since = policy_state.get(WARMING_KEY) or (0, None)
    since = None if warming == 0 else now if warming > seen else since
    policy_state[WARMING_KEY] = [warming, since]
    return since


class SlaAutoscalingPolicy:
    """Ray Serve class-callable custom policy: built once from policy_kwargs, then
    `policy(ctx) -> (target_replicas, policy_state)` every tick. It runs `policy`
    (our `decide`; a subclass may set any function of the same shape)."""

    policy: Callable[[Snapshot, PolicySpec, PolicyState], ScaleDecision] = staticmethod(decide)

    def __init__(self, **policy_spec: Any):
        board = policy_spec.pop(BOARD_KEY, None)
        self.refit_online = bool(policy_spec.pop(REFIT_KEY, False))
        self.spec = policy_spec_from_json(policy_spec)
        self.board = None if board is None else (str(board["scope"]), str(board["model"]))

    @staticmethod
    def held_store(app: str) -> HeldStore:
        """The board's store for Serve application `app` (Ray's GCS; tests replace it)."""
        from agentserve.serve.gcs_board import GcsHeldStore

        return GcsHeldStore(app)

    def _held(self, ctx: Any, now: float) -> HeldReport | None:
        """What the ingresses hold for this model now (None: no board, nothing fresh, or
        the read failed: then the policy decides without it)."""
        if self.board is None:
            return None
        scope, model = self.board
        try:
            return read_held(self.held_store(ctx.app_name), scope, model, now)
        except Exception as err:
            log.warning("agentserve policy: reading the held-requests board failed: %r", err)
            return None

    def _refitted(self, ctx: Any, policy_state: dict[str, Any]) -> PolicySpec:
        """The spec with its latency prior refitted from the replicas' latest reports
        (kept in policy_state[REFIT_STATE_KEY]); the spec itself when not refitting."""
        prior = self.spec.model
        if not self.refit_online or prior is None:
            return self.spec
        refit = StepRefit.from_dict(policy_state.get(REFIT_STATE_KEY))
        reports = _latest_reports(ctx).values()
        refit = refit_from_reports(refit, reports, prior, self.spec.schedule)
        policy_state[REFIT_STATE_KEY] = refit.to_dict()
        return replace(self.spec, model=refit_model(prior, refit, self.spec.max_num_seqs))

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        policy_state = dict(ctx.policy_state or {})
        now = ctx.current_time if ctx.current_time is not None else 0.0
        decided = policy_state.get(DECIDED_KEY)
        if decided is not None and 0 <= now - decided < self.spec.interval_s:
            # one decision per autoscaling.interval_s, as the simulator decides (Ray calls
            # every control-loop tick); in between the target stands
            return ctx.target_num_replicas, policy_state
        policy_state[DECIDED_KEY] = now
        state = PolicyState.from_dict(policy_state.get(STATE_KEY) or {})
        since = _warming_since(ctx, policy_state, now)
        held = self._held(ctx, now)
        seen = snapshot_from_context(ctx, state, policy_state.get(START_KEY), since, held)
        spec = self._refitted(ctx, policy_state)
        target, decision, snap = plan_fleet(seen, spec, state, self.policy)
        standby = target - decision.target_replicas
        if decision.target_replicas != snap.current_replicas:
            log.info(
                "agentserve policy: %d -> %d replicas%s (%s; sla ratio %s, floor %d, "
                "in flight %d, queued %d, replica start %s s)",
                snap.current_replicas,
                decision.target_replicas,
                f" + {standby} standby" if standby else "",
                decision.reason,
                None if decision.sla_ratio is None else round(decision.sla_ratio, 2),
                decision.capacity_floor,
                snap.in_flight,
                snap.queued,
                None if snap.replica_start_s is None else round(snap.replica_start_s, 1),
            )
        policy_state[STATE_KEY] = decision.state.to_dict()
        policy_state[START_KEY] = snap.replica_start_s
        asleep, wake_s = replica_sleep(_latest_reports(ctx))
        policy_state["agentserve_last"] = {
            "sleeping_replicas": asleep,
            "wake_s": wake_s,
            "reason": decision.reason,
            "sla_ratio": decision.sla_ratio,
            "capacity_floor": decision.capacity_floor,
            "hold_requests": decision.hold_requests,
            "replica_start_s": snap.replica_start_s,
        }
        return target, policy_state
