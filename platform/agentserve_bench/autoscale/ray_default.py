"""Ray Serve's default autoscaling policy as a simulator controller (the baseline of
compare.py)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from agentserve.autoscale.policy import Snapshot

__all__ = ["RayDefaultController"]


@dataclass
class RayDefaultController:
    """Ray Serve's default policy (2.60 `replica_queue_length_autoscaling_policy` with its
    delay logic): desired = ceil(mean ongoing requests over look_back_period_s /
    target_ongoing_requests), applied after upscale_delay_s / downscale_delay_s of
    consistent wanting, in [min, max]; from zero it scales up at once."""

    target_ongoing_requests: float
    min_replicas: int
    max_replicas: int
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_period_s: float = 30.0
    target: int | None = None
    since: float | None = None
    direction: int = 0
    history: deque = field(default_factory=deque)

    def __call__(self, snap: Snapshot) -> int:
        now = snap.now_s
        self.history.append((now, snap.in_flight))
        while self.history[0][0] < now - self.look_back_period_s:
            self.history.popleft()
        current = snap.current_replicas if self.target is None else self.target
        ongoing = float(np.mean([v for _, v in self.history]))
        desired = math.ceil(ongoing / self.target_ongoing_requests - 1e-9)
        desired = min(self.max_replicas, max(self.min_replicas, desired))
        if current == 0 and snap.in_flight > 0:
            self.target = max(1, desired)
            return self.target
        direction = (desired > current) - (desired < current)
        if direction != self.direction:
            self.direction, self.since = direction, now
        delay = self.upscale_delay_s if direction > 0 else self.downscale_delay_s
        if direction and self.since is not None and now - self.since >= delay:
            current, self.since, self.direction = desired, None, 0
        self.target = current
        return current
