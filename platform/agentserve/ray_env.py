"""The environment Ray's own processes run with when `agentserve up` starts a local cluster:
Ray's defaults, or "quiet" where it was measured to serve the first token sooner.

On a small machine the engine's OpenMP threads hold every core while it decodes, and every
other process that wakes up takes a core from one of them (an OpenMP step waits for its
slowest thread). Ray's defaults cost twice on such a machine:

- Ray starts its workers at nice 15 (`worker_niceness`): the Serve proxy, the ingress and
  the replica's streaming side, which carry every token to the caller, get about 1/30 of a
  core against the engine's threads (brought back to nice 0: engine/cpu_settings.py) and
  deliver tokens late, in bursts. vLLM's own server runs its API process at nice 0.
- Serve's controller runs its control loop every 0.1 s and every replica exports its
  cached metrics every 0.1 s: an idle `agentserve up` used 15% of a core on the 2-core
  development machine (the controller alone 4%), 11% with the loop at 0.5 s and metrics
  at 1 s.

"quiet" sets workers to nice 0 (the first token sooner; on two cores decoding can lose a
little, as the token path now preempts the engine's threads), the control loop to 0.5 s
(autoscaling decisions come up to 0.4 s later; a replica takes tens of seconds to start)
and metrics export to 1 s (Ray's metrics only; agentserve's /metrics reads the replicas
itself). The kind of CPU's profile (profiles/<cpu_class>.json, engine.quiet_ray) holds
whether it is the default there, from the
measurements (docs/benchmarks.md, "Reading the served figures" and "ray-priority"); a kind
never measured keeps Ray's defaults. `AGENTSERVE_RAY_ENV=quiet|ray`
overrides; any of the variables set in the environment wins over both.

Either environment adds UNREAD: Ray's own metrics and task events, which every Ray
process records and ships (to the dashboard agent, to the GCS) for a dashboard that a
local cluster does not run (`include_dashboard=False`; agentserve's /metrics reads the
replicas itself). The log monitor, the third such reader-less loop, is stopped by
serve/local.py. Idle, an
`agentserve up` with the fake engine used 2.25 CPU-s per 30 s in its processes without
them, 2.59 with (log monitor about 0.2, dashboard agent 0.12; `agentserve bench ray-idle`,
2-core EPYC); a vLLM server decoding beside it moved less than that machine's noise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

__all__ = [
    "QUIET",
    "RAY_DEFAULTS",
    "RAY_ENVS",
    "UNREAD",
    "apply_ray_env",
    "ray_env_name",
]

# Ray 2.60's own values, spelled out so a benchmark row labelled with them means them
RAY_DEFAULTS: dict[str, str] = {
    "RAY_worker_niceness": "15",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "100",
}
QUIET: dict[str, str] = {
    "RAY_worker_niceness": "0",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
}
RAY_ENVS: dict[str, dict[str, str]] = {"ray": RAY_DEFAULTS, "quiet": QUIET}
# Ray's observability with no reader in a local cluster: off with either environment
UNREAD: dict[str, str] = {
    "RAY_enable_metrics_collection": "0",  # RayConfig: no metrics recorded or exported
    "RAY_task_events_report_interval_ms": "0",  # RayConfig: 0 = no task events to the GCS
}


def ray_env_name(environ: Mapping[str, str] | None = None, cpu_class: str | None = None) -> str:
    """ "quiet" or "ray": AGENTSERVE_RAY_ENV when set, else the measured choice for this
    kind of CPU (None: this machine's)."""
    environ = os.environ if environ is None else environ
    forced = environ.get("AGENTSERVE_RAY_ENV")
    if forced is not None:
        if forced not in RAY_ENVS:
            raise ValueError(f"AGENTSERVE_RAY_ENV={forced!r}: one of {', '.join(RAY_ENVS)}")
        return forced
    if cpu_class is None:
        from agentserve.engine.cpu_info import read_cpu_info

        cpu_class = read_cpu_info().cpu_class
    from agentserve import profiles

    measured = profiles.section(cpu_class, "engine")
    return "quiet" if measured is not None and measured.quiet_ray else "ray"


def apply_ray_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Before a local Ray cluster starts (its processes inherit this environment): set the
    chosen environment's variables and UNREAD's that the environment does not already set;
    returns those."""
    environ = os.environ if environ is None else environ
    chosen = {**RAY_ENVS[ray_env_name(environ)], **UNREAD}
    added = {key: value for key, value in chosen.items() if key not in environ}
    environ.update(added)
    return added
