"""Burst detection for the predictive floor: capacity ahead of a load step
(docs/autoscaling.md, "Burst detector", with the sweep that chose the defaults).

The detector fires when the arrival rate over a short recent window is both `burst_ratio`
x the look-back rate and `burst_z` Poisson standard deviations above its expectation; the
floor then plans for the rate projected one replica start ahead along the measured slope,
capped at `burst_max_factor` x the recent rate. Hysteresis: the planned rate only rises
until the burst ends, which is when the recent rate is back within `burst_exit_ratio` of
the look-back rate and `burst_hold_s` has passed; the end never scales down by itself
(the policy's scale-down rules still govern).

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
