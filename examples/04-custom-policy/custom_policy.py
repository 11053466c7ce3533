"""Write your own autoscaling policy: a queue-length policy with the same shape as the
built-in SLA policy, replayed through the simulator on a seeded trace beside it.

A policy is a pure function `policy(snapshot, spec, state) -> ScaleDecision` (see
agentserve/autoscale/policy.py). The simulator and the Ray Serve adapter call it the same
way, so what you measure here is what runs in Ray Serve.

    python examples/04-custom-policy/custom_policy.py [--seed 7] [--target-utilization 0.8]
    python examples/04-custom-policy/custom_policy.py --ray-config   # Ray Serve wiring
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from dataclasses import asdict, replace

from agentserve.autoscale.policy import PolicySpec, PolicyState, ScaleDecision, Snapshot, decide
from agentserve.autoscale.ray_policy import SlaAutoscalingPolicy, ray_autoscaling_config
from agentserve.spec import DeploymentSpec
from agentserve_bench.autoscale.compare import (
    SLAS,
    PolicyController,
    Scenario,
    burst_window,
    policy_spec_for,
    sim_config_for,
    summarize,
)
from agentserve_bench.autoscale.simulate import simulate
from agentserve_bench.autoscale.trace import TraceConfig, generate_trace


# -- the custom policy ------------------------------------------------------------------------
def queue_length_policy(
    snap: Snapshot, spec: PolicySpec, state: PolicyState | None = None
) -> ScaleDecision:
    """Enough replicas for every request in flight at `max_num_seqs x target_utilization`
    per replica, within [min_replicas, max_replicas]. Scales up at once; scales down only
    after wanting fewer replicas for `downscale_delay_s`, and never while one warms.
    Latency is ignored: no SLA ratio, no latency model."""
    state = state or PolicyState()
    current, now = snap.current_replicas, snap.now_s
    per_replica = max(1.0, spec.max_num_seqs * spec.target_utilization)
    wanted = math.ceil(snap.in_flight / per_replica - 1e-9)
    wanted = min(spec.max_replicas, max(spec.min_replicas, wanted))
    if wanted > current:
        return ScaleDecision(wanted, "queue_up", replace(state, down_since_s=None, last_up_s=now))
    if wanted == current or snap.warming_ages_s:
        return ScaleDecision(current, "hold", replace(state, down_since_s=None))
    since = now if state.down_since_s is None else state.down_since_s
    if now - since < spec.downscale_delay_s:
        return ScaleDecision(current, "hold_downscale_delay", replace(state, down_since_s=since))
    return ScaleDecision(wanted, "queue_down", replace(state, down_since_s=None))


# -- Ray Serve: the same function behind the adapter -------------------------------------------
class QueueLengthRayPolicy(SlaAutoscalingPolicy):
    """Ray Serve custom autoscaling policy running `queue_length_policy` (the adapter turns
    Ray's AutoscalingContext into a Snapshot and keeps the state between ticks)."""

    policy = staticmethod(queue_length_policy)


def ray_config(spec: DeploymentSpec) -> dict:
    """The `autoscaling_config` for the spec's first model with this policy. Ray imports
    the path where the app is deployed and ships the module to its controller by value."""
    return ray_autoscaling_config(spec, policy_function="custom_policy:QueueLengthRayPolicy")


# -- the comparison ---------------------------------------------------------------------------
def compare(scenario: Scenario, custom: PolicySpec) -> dict[str, dict]:
    """Replay the scenario's trace under the built-in policy and the custom one, both
    without standby replicas: the adapter adds the same derived standby headroom to any
    policy's target (standby.plan_fleet), and it would hide the decisions compared here
    (the benchmark's "no standby" row)."""
    trace = generate_trace(scenario.trace)
    alone = {"standby_replicas": 0}
    policies = {
        "built-in SLA policy": PolicyController(
            replace(policy_spec_for(scenario), **alone), decide
        ),
        "queue-length (custom)": PolicyController(replace(custom, **alone), queue_length_policy),
    }
    rows = {}
    for name, controller in policies.items():
        result = simulate(trace, controller, sim_config_for(scenario))
        rows[name] = summarize(result, SLAS, burst_window(scenario))
    return rows


def print_table(rows: dict[str, dict]) -> None:
    for name, row in rows.items():
        tenants = "  ".join(f"{t}={v['attainment']:.2%}" for t, v in row["tenants"].items())
        ttft = row["tenants"]["interactive"]["ttft_p95_ms"]
        print(
            f"{name:24s} {tenants}  interactive_ttft_p95_ms={ttft:.0f}  "
            f"replica_s={row['replica_seconds']:.0f}  actions={row['scaling_actions']}  "
            f"peak={row['peak_replicas']}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=TraceConfig().seed)
    parser.add_argument("--duration-s", type=float, default=TraceConfig().duration_s)
    parser.add_argument(
        "--target-utilization",
        type=float,
        default=0.8,
        help="the custom policy's requests per replica as a fraction of max_num_seqs",
    )
    parser.add_argument("--ray-config", action="store_true", help="print the Ray Serve config")
    args = parser.parse_args()
    if args.ray_config:
        spec = DeploymentSpec.model_validate(
            {"models": [{"replicas": {"min_replicas": 1, "max_replicas": 4}}]}
        )
        config = ray_config(spec)
        print(json.dumps(config, indent=2))
        from ray.serve.config import AutoscalingConfig

        policy = AutoscalingConfig(**config).policy.get_policy()  # what Serve's controller runs
        print(f"Ray Serve accepts it: {policy.__name__} runs {policy.policy.__name__}")
        return 0
    cfg = replace(TraceConfig(), seed=args.seed, duration_s=args.duration_s)
    scenario = Scenario(trace=replace(cfg, burst_start_s=cfg.duration_s * 7 / 12))
    custom = replace(policy_spec_for(scenario), target_utilization=args.target_utilization)
    trace = generate_trace(scenario.trace)
    digest = hashlib.sha256(json.dumps(asdict(trace), sort_keys=True).encode()).hexdigest()
    print(
        f"trace: seed {cfg.seed}, {cfg.duration_s:.0f} s, {len(trace.sessions)} sessions, "
        f"{trace.num_calls} calls, sha256 {digest[:12]}"
    )
    slas = ", ".join(
        f"{n} TTFT {v.ttft_ms:.0f} ms / TPOT {v.tpot_ms:.0f} ms" for n, v in SLAS.items()
    )
    print(f"SLAs (p95): {slas}; fleet {scenario.min_replicas}-{scenario.max_replicas} replicas")
    started = time.perf_counter()
    print_table(compare(scenario, custom))
    print(f"({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
