"""Autoscaler comparison on one seeded trace: our SLA policy vs Ray Serve's default
(target ongoing requests, swept to its best attainment), a TTFT-only policy, fixed fleets,
and speculation ablations; per-tenant SLA attainment, replica-seconds, scaling actions.
Every row shares one ingress: deadline-ordered with batch shed past its deadline (the
runtime's default, `Scenario.priority`), except the "priority off" ablation (FIFO), which
runs the SLA policy with first come, first served.

    python -m agentserve_bench.autoscale.compare --out docs/benchmarks/autoscale.json \
        --plot docs/benchmarks/autoscale.png
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from agentserve.autoscale.burst import BurstKnobs
from agentserve.autoscale.latency_stat import nearest_rank
from agentserve.autoscale.model import LatencyModel, drafted_for, speculation_schedule
from agentserve.autoscale.policy import (
    PolicySpec,
    PolicyState,
    ScaleDecision,
    Sla,
    Snapshot,
    decide,
)
from agentserve.autoscale.standby import plan_fleet

from agentserve_bench.autoscale.measured_start import engine_start_s
from agentserve_bench.autoscale.ray_default import RayDefaultController
from agentserve_bench.autoscale.simulate import QueueClass, SimConfig, SimResult, simulate
from agentserve_bench.autoscale.trace import Trace, TraceConfig, generate_trace
from agentserve_bench.report import default_docs

__all__ = ["PolicyController", "RayDefaultController", "Scenario", "main", "run_comparison"]
__all__ += ["burst_window", "fixed_schedule", "policy_spec_for", "saturated_capacity"]
__all__ += ["replica_start_for", "sim_config_for", "summarize"]

SLAS = {"interactive": Sla(1500.0, 60.0), "batch": Sla(15_000.0, 150.0)}
SLA_CLASSES = {"interactive": "interactive", "batch": "batch"}
"""Each tenant's sla_class: the ingress sheds the batch class past its deadline."""
RAY_TARGETS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0)


PolicyFunction = Callable[[Snapshot, PolicySpec, PolicyState], ScaleDecision]
"""The policy interface: decide(snapshot, spec, state) -> ScaleDecision (pure)."""


class PolicyController:
    """A policy in the simulator: `policy` (default: our `decide`, the same function the
    Ray adapter runs), its state carried between ticks; the routed standby margin
    (`spec.standby_replicas`, derived from the replica start when None) applies exactly
    as the Ray adapter applies it (standby.plan_fleet)."""

    def __init__(self, spec: PolicySpec, policy: PolicyFunction = decide):
        self.spec, self.policy, self.state = spec, policy, PolicyState()

    def __call__(self, snap: Snapshot) -> int:
        fleet, decision, _ = plan_fleet(snap, self.spec, self.state, self.policy)
        self.state = decision.state
        return fleet


def _p95_ms(values: list[float]) -> float | None:
    p95 = nearest_rank(values, 0.95)
    return None if p95 is None else round(p95, 1)


def _tenant_report(result: SimResult, slas: dict[str, Sla], burst: tuple[float, float]):
    report = {}
    for name, sla in slas.items():
        qs = [q for q in result.requests if q.tenant == name and q.status != "open"]
        ok = [
            q.status == "served"
            and q.ttft_ms <= sla.ttft_ms  # type: ignore[operator]
            and (q.tpot_ms is None or q.tpot_ms <= sla.tpot_ms)
            for q in qs
        ]
        served = [q for q in qs if q.status == "served"]
        in_burst = [o for q, o in zip(qs, ok, strict=True) if burst[0] <= q.arrival_s < burst[1]]
        report[name] = {
            "requests": len(qs),
            "attainment": round(float(np.mean(ok)), 4) if ok else None,
            "attainment_outside_burst": round(
                float(
                    np.mean(
                        [
                            o
                            for q, o in zip(qs, ok, strict=True)
                            if not burst[0] <= q.arrival_s < burst[1]
                        ]
                    )
                ),
                4,
            ),
            "attainment_in_burst": round(float(np.mean(in_burst)), 4) if in_burst else None,
            "shed": len(qs) - len(served),
            "ttft_p95_ms": _p95_ms([q.ttft_ms for q in served]),
            "tpot_p95_ms": _p95_ms([q.tpot_ms for q in served if q.tpot_ms]),
        }
    return report


def summarize(result: SimResult, slas: dict[str, Sla], burst: tuple[float, float]) -> dict:
    """Per-tenant SLA attainment (overall, outside and inside `burst`, an arrival-time
    window; a shed request counts as a miss, each retry as one more request), requests
    shed, p95 TTFT/TPOT of the served ones, replica-seconds, scaling actions and peak
    replicas."""
    tenants = _tenant_report(result, slas, burst)
    return {
        "tenants": tenants,
        "min_attainment": min(t["attainment"] for t in tenants.values()),
        "replica_seconds": round(result.replica_seconds, 1),
        "scaling_actions": result.scaling_actions,
        "peak_replicas": max(p["replicas"] for p in result.timeline),
    }


@dataclass(frozen=True)
class Scenario:
    """Everything one comparison run depends on (all seeded)."""

    trace: TraceConfig = field(default_factory=TraceConfig)
    model: LatencyModel = field(default_factory=LatencyModel)
    min_replicas: int = 1
    max_replicas: int = 16
    max_num_seqs: int = 8
    max_drafted: int = 7
    replica_start_s: float | None = None
    """None: the simulated engine's measured start (startup.json, measured_start.py)."""
    staffing_z: float | None = None
    """None: the policy's default (PolicySpec.staffing_z)."""
    standby_replicas: int = 4
    """The hand-set count of the "+ N standby" rows; the SLA policy row derives its own."""
    speculation: Literal["schedule", "fixed"] = "schedule"
    """How every replica drafts: "schedule", the per-batch schedule the deployments fill by
    default (speculation shed at large batches); "fixed", max_drafted at every batch size."""
    priority: bool = True
    """The ingress of every row but the FIFO ablation: deadline order, batch shed past its
    deadline (the runtime's default); False: first come, first served everywhere."""


def fixed_schedule(sc: Scenario) -> tuple[tuple[int, int, int], ...]:
    """max_drafted at every batch size: a drafter with `speculation_schedule: off`."""
    return ((1, sc.max_num_seqs, sc.max_drafted),)


def replica_start_for(sc: Scenario) -> float:
    """The scenario's replica start: its override, else the measured one (vLLM's)."""
    return engine_start_s() if sc.replica_start_s is None else sc.replica_start_s


def policy_spec_for(sc: Scenario) -> PolicySpec:
    """The policy knobs of the scenario (SLAS, its fleet bounds and latency model; every
    other knob the policy's default, the standby margin derived); the policy plans with
    the drafting the replicas run (`sc.speculation`) and the start the replicas report
    (expected: the same figure, until they do)."""
    start_s = replica_start_for(sc)
    staffing = {} if sc.staffing_z is None else {"staffing_z": sc.staffing_z}
    return PolicySpec(
        schedule=fixed_schedule(sc) if sc.speculation == "fixed" else None,
        min_replicas=sc.min_replicas,
        max_replicas=sc.max_replicas,
        max_num_seqs=sc.max_num_seqs,
        slas=SLAS,
        max_drafted=sc.max_drafted,
        model=sc.model,
        replica_start_s=start_s,
        burst=BurstKnobs(lead_s=start_s),
        **staffing,
    )


def sim_config_for(sc: Scenario) -> SimConfig:
    """The simulated fleet of the scenario, its ingress knowing each tenant's TTFT
    objective and SLA class."""
    return SimConfig(
        model=sc.model,
        max_num_seqs=sc.max_num_seqs,
        max_drafted=sc.max_drafted,
        adaptive_speculation=sc.speculation == "schedule",
        replica_start_s=sc.replica_start_s,
        priority=sc.priority,
        tenants={
            name: QueueClass(sla.seconds()[0], SLA_CLASSES.get(name)) for name, sla in SLAS.items()
        },
    )


def burst_window(sc: Scenario) -> tuple[float, float]:
    """Arrivals counted as "in burst": from the burst start to 2 minutes after it ends."""
    return sc.trace.burst_start_s, sc.trace.burst_start_s + sc.trace.burst_s + 120.0


def saturated_capacity(sc: Scenario) -> dict[str, float]:
    """Decode tokens/s of one replica at max_num_seqs sequences, modelled: without
    speculation, drafting max_drafted, and drafting what the schedule gives that batch
    (what shedding speculation under overload frees)."""
    b, m = sc.max_num_seqs, sc.model
    scheduled = drafted_for(speculation_schedule(m, b, sc.max_drafted), b)
    return {
        "batch": b,
        "plain": round(m.tokens_per_s(b, 0), 1),
        "fixed_k": round(m.tokens_per_s(b, sc.max_drafted), 1),
        "schedule": round(m.tokens_per_s(b, scheduled), 1),
        "schedule_k": scheduled,
    }


def _matched(results: dict[str, dict], ours: str, key: str) -> dict[str, Any]:
    """Cheapest Ray-default setting whose every tenant's `key` attainment is >= ours, and
    our replica-second saving against it (None when no setting matches)."""

    def floor(r: dict) -> float:
        return min(t[key] for t in r["tenants"].values() if t[key] is not None)

    target = floor(results[ours])
    ray = {k: v for k, v in results.items() if k.startswith("ray_default_target_")}
    matches = [k for k, v in ray.items() if floor(v) >= target]
    if not matches:
        return {"metric": key, "policy": ours, "ours": target, "ray_default": None, "saving": None}
    best = min(matches, key=lambda k: ray[k]["replica_seconds"])
    saving = 1 - results[ours]["replica_seconds"] / ray[best]["replica_seconds"]
    return {
        "metric": key,
        "policy": ours,
        "ours": target,
        "ray_default": best,
        "ray_default_attainment": floor(ray[best]),
        "saving": round(saving, 3),
    }


def run_comparison(sc: Scenario | None = None, trace: Trace | None = None) -> dict[str, Any]:
    """Run every policy on the scenario's trace; returns the JSON-able report."""
    sc = sc or Scenario()
    trace = trace or generate_trace(sc.trace)
    sim, burst, ours = sim_config_for(sc), burst_window(sc), policy_spec_for(sc)
    no_burst = replace(ours, burst=ours.burst._replace(burst_ratio=0.0))
    no_standby = replace(ours, standby_replicas=0)  # the elastic policy alone
    # the ablation, when the fleet sheds speculation: the same policy and fleet drafting
    # the fixed k at every batch size (the policy planning with that)
    fixed_k = replace(ours, schedule=fixed_schedule(sc)), replace(sim, adaptive_speculation=False)
    runs: dict[str, tuple[Any, SimConfig]] = {
        "sla_policy": (PolicyController(ours), sim),
        **(
            {"sla_policy_fifo": (PolicyController(ours), replace(sim, priority=False))}
            if sc.priority
            else {}
        ),
        "ttft_only": (PolicyController(replace(ours, use_tpot=False, model=None)), sim),
        f"fixed_{sc.max_replicas}": (lambda _s: sc.max_replicas, sim),
        **(
            {"sla_policy_fixed_k": (PolicyController(fixed_k[0]), fixed_k[1])}
            if sc.speculation == "schedule"
            else {}
        ),
        "sla_policy_no_spec": (
            PolicyController(replace(ours, max_drafted=0)),
            replace(sim, max_drafted=0),
        ),
        "sla_policy_no_burst": (PolicyController(no_burst), sim),
        "sla_policy_no_standby": (PolicyController(no_standby), sim),
        "sla_policy_standby_routed": (
            PolicyController(replace(ours, standby_replicas=sc.standby_replicas)),
            sim,
        ),
        "sla_policy_standby_routed_no_burst": (
            PolicyController(replace(no_burst, standby_replicas=sc.standby_replicas)),
            sim,
        ),
        "sla_policy_standby_unrouted": (
            PolicyController(no_standby),
            replace(sim, standby_replicas=sc.standby_replicas),
        ),
    }
    for t in RAY_TARGETS:
        ctl = RayDefaultController(t, sc.min_replicas, sc.max_replicas)
        runs[f"ray_default_target_{t:g}"] = (ctl, sim)
    results, timelines = {}, {}
    for name, (controller, cfg) in runs.items():
        result = simulate(trace, controller, cfg)
        results[name] = summarize(result, SLAS, burst)
        timelines[name] = result.timeline
    ray = {k: v for k, v in results.items() if k.startswith("ray_default_target_")}
    best = max(ray, key=lambda k: (ray[k]["min_attainment"], -ray[k]["replica_seconds"]))
    trace_json = json.dumps(asdict(trace), sort_keys=True).encode()
    return {
        "command": "python -m agentserve_bench.autoscale.compare",
        "trace": {
            "config": asdict(sc.trace),
            "sessions": len(trace.sessions),
            "calls": trace.num_calls,
            "sha256": hashlib.sha256(trace_json).hexdigest(),
        },
        "scenario": {
            **{k: v for k, v in asdict(sc).items() if k != "trace"},
            "replica_start_s": replica_start_for(sc),
            "replica_start_from": "override" if sc.replica_start_s else "benchmarks/startup.json",
        },
        "slas": {k: {"ttft_p95_ms": v.ttft_ms, "tpot_p95_ms": v.tpot_ms} for k, v in SLAS.items()},
        "speculation_schedule": speculation_schedule(sc.model, sc.max_num_seqs, sc.max_drafted),
        "replica_capacity_tok_s": saturated_capacity(sc),
        "ray_default_best": best,
        "at_equal_attainment": [
            _matched(results, "sla_policy", "attainment"),
            _matched(results, "sla_policy", "attainment_outside_burst"),
            _matched(results, "sla_policy", "attainment_in_burst"),
            _matched(results, "sla_policy_no_standby", "attainment"),
            _matched(results, "sla_policy_standby_routed", "attainment_in_burst"),
            _matched(results, "sla_policy_standby_routed_no_burst", "attainment_in_burst"),
        ],
        "policies": results,
        "_timelines": timelines,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """Replicas and interactive p95 TTFT over time for the main policies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["sla_policy", report["ray_default_best"], "ttft_only"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for name in names:
        tl = report["_timelines"][name]
        t = [p["t"] / 60 for p in tl]
        top.step(t, [p["replicas"] for p in tl], where="post", label=name)
        ttft = [(p["ttft_p95_ms"].get("interactive") or np.nan) / 1000 for p in tl]
        bottom.plot(t, ttft, label=name)
    top.set_ylabel("replicas")
    bottom.set_ylabel("interactive p95 TTFT (s, 30 s window)")
    bottom.axhline(SLAS["interactive"].seconds()[0], color="k", linestyle="--", linewidth=0.8)
    bottom.set_yscale("log")
    bottom.set_xlabel("minutes")
    top.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=TraceConfig().seed)
    parser.add_argument("--duration-s", type=float, default=TraceConfig().duration_s)
    parser.add_argument("--model", type=Path, help="LatencyModel JSON (default: built-in)")
    parser.add_argument(
        "--out", type=Path, default=default_docs() / "benchmarks" / "autoscale.json"
    )
    parser.add_argument("--plot", type=Path, help="write a PNG of replicas and TTFT")
    parser.add_argument("--trace-out", type=Path, help="save the generated trace as JSON")
    parser.add_argument(
        "--speculation",
        choices=["schedule", "fixed"],
        default="schedule",
        help="replicas draft by the per-batch schedule (default) or the fixed k",
    )
    args = parser.parse_args(argv)
    cfg = replace(TraceConfig(), seed=args.seed, duration_s=args.duration_s)
    cfg = replace(cfg, burst_start_s=cfg.duration_s * 7 / 12)
    model = LatencyModel.load(args.model) if args.model else LatencyModel()
    sc = Scenario(trace=cfg, model=model, speculation=args.speculation)
    trace = generate_trace(cfg)
    if args.trace_out:
        trace.save(args.trace_out)
    report = run_comparison(sc, trace)
    if args.plot:
        plot(report, args.plot)
    public = {k: v for k, v in report.items() if not k.startswith("_")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(public, indent=2) + "\n", encoding="utf-8")
    for m in public["at_equal_attainment"]:
        print(f"at equal {m['metric']}: vs {m['ray_default']}, saving {m['saving']}")
    for name, r in public["policies"].items():
        att = " ".join(f"{t}={v['attainment']:.4f}" for t, v in r["tenants"].items())
        cost = f"replica_s={r['replica_seconds']:9.0f}  actions={r['scaling_actions']}"
        print(f"{name:28s} {att}  {cost}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
