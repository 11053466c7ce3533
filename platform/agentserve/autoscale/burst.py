"""Burst detection for the predictive floor: capacity ahead of a load step.

The floor (policy.capacity_floor) plans for the arrival rate averaged over the look-back
window (30 s by default). After a step in load that average lags: 10 s into a 3x step it
shows 1.67x. With replicas taking 45-120 s to start, every second of lag is a second
more of the burst served short. The detector compares the arrival rate over a short
recent window with the look-back rate and, when the recent rate is both relatively
higher (`burst_ratio`) and statistically so (the recent window's arrivals exceed the
look-back rate's expectation by `burst_z` Poisson standard deviations, so a quiet
deployment's noise does not trigger it), plans the floor for a rate projected one
replica start ahead along the measured slope, capped at `burst_max_factor` x the
recent rate (a step is not a ramp: unbounded extrapolation of a step overshoots).

Hysteresis: once triggered, the planned rate only rises until the burst ends, and the
burst ends only when the recent rate has fallen back to within `burst_exit_ratio` of
the look-back rate (the look-back window has caught up) and `burst_hold_s` has passed
since the trigger. Exit never scales down by itself: the policy's scale-down rules
(delay, cooldown after a scale-up, consolidation check) still govern, so the detector
adds no 2 <-> 1 oscillation.

Defaults (ratio 1.2, z 2, x2 cap) are the best of a sweep on the benchmark trace
(docs/autoscaling.md): agent traffic is a closed loop (a session's next call waits for the
previous one), so a 3x step in new sessions shows as only ~1.2-1.3x in the call rate
before the queue throttles it; a 1.5 ratio never fired. The price is false triggers on
ordinary ramps (two on that trace), each holding a raised floor for burst_hold_s.

Pure: no Ray import; the state is two JSON-able numbers kept in PolicyState.
"""

from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["RECENT_WINDOW_S", "BurstKnobs", "BurstState", "planned_rate"]

RECENT_WINDOW_S = 10.0
"""The short arrival-rate window replicas and the simulator publish."""


class BurstKnobs(NamedTuple):
    """Detector settings. `burst_ratio` <= 0 disables it. Windows in seconds: the
    look-back (long) and recent (short) arrival-rate windows; `lead_s` is how far ahead
    to project (the expected replica start)."""

    burst_ratio: float = 1.2
    burst_exit_ratio: float = 1.1
    burst_z: float = 2.0
    burst_max_factor: float = 2.0
    burst_hold_s: float = 60.0
    look_back_s: float = 30.0
    recent_window_s: float = RECENT_WINDOW_S
    lead_s: float = 60.0


class BurstState(NamedTuple):
    """When the current burst was detected (None: no burst) and the rate it plans for."""

    since_s: float | None = None
    rate_rps: float = 0.0


def _rising(long_rps: float, recent_rps: float, k: BurstKnobs) -> bool:
    """Recent rate at least burst_ratio x the look-back rate, and beyond Poisson noise:
    recent arrivals exceed the look-back rate's expectation by burst_z sigma."""
    if recent_rps < k.burst_ratio * long_rps:
        return False
    expected = long_rps * k.recent_window_s
    excess = (recent_rps - long_rps) * k.recent_window_s
    return excess >= k.burst_z * math.sqrt(max(expected, 1.0))


def _projected(long_rps: float, recent_rps: float, k: BurstKnobs) -> float:
    """Recent rate plus the slope between the two windows' centres times lead_s, at most
    burst_max_factor x the recent rate."""
    gap_s = max(1e-6, (k.look_back_s - k.recent_window_s) / 2)
    slope = max(0.0, recent_rps - long_rps) / gap_s
    return min(recent_rps + slope * k.lead_s, k.burst_max_factor * recent_rps)


def planned_rate(
    now_s: float,
    long_rps: float,
    recent_rps: float | None,
    knobs: BurstKnobs,
    state: BurstState,
) -> tuple[float, BurstState]:
    """The arrival rate the floor should plan for now, and the detector's next state.
    Without a recent rate (an older replica or a test snapshot) or with the detector off,
    the look-back rate."""
    if recent_rps is None or knobs.burst_ratio <= 0:
        return long_rps, BurstState()
    if _rising(long_rps, recent_rps, knobs):
        rate = max(state.rate_rps, _projected(long_rps, recent_rps, knobs))
        since = now_s if state.since_s is None else state.since_s
        return max(long_rps, rate), BurstState(since, rate)
    if state.since_s is None:
        return long_rps, BurstState()
    caught_up = recent_rps <= knobs.burst_exit_ratio * long_rps
    if caught_up and now_s - state.since_s >= knobs.burst_hold_s:
        return long_rps, BurstState()
    return max(long_rps, state.rate_rps), state
