"""The replica start time both worlds feed the policy: each replica reports how long it took
to start (construction to engine ready, seconds); the Ray adapter (from the replicas'
autoscaling stats, ray_policy.py) and the simulator (from its simulated replicas) reduce
the reports with `measured_start_s`, and the policy plans with the result
(`Snapshot.replica_start_s`: warming credit, burst lead time).

Pure: no Ray import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["measured_start_s"]


def measured_start_s(reports: Iterable[float], last_s: float | None = None) -> float | None:
    """The start time to plan with: the largest start among the replicas reporting now
    (the conservative side: a warming replica is credited more slowly and a burst is
    projected further ahead); `last_s`, the previous result, when none reports (every
    replica went away, or none is ready yet); None when nothing was ever reported.
    NaN, infinite and negative reports are ignored."""
    valid = [r for r in reports if math.isfinite(r) and r >= 0]
    return max(valid) if valid else last_s
