"""Pacing for ``--arrival-rate``: when each Locust user sends its next request so that all of them together send a
fixed number of requests per second, whatever the latency.

Stdlib only, so that it can be tested without importing Locust (which monkey-patches the standard library).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


def pacing_wait(interval_s: float, task_s: float) -> float:
    """Seconds to wait after a task that took ``task_s`` so that the next one starts ``interval_s`` after it started.

    Zero when the task took longer than the interval: the next one starts at once, and the time lost is not made up
    (Locust's ``constant_pacing``).
    """
    return max(0.0, interval_s - task_s)


def arrival_interval(rate: float, users: int) -> float:
    """Seconds between one user's requests so that ``users`` users together send ``rate`` requests per second.

    Raises:
        ValueError: ``rate`` is not positive.
    """
    if rate <= 0:
        raise ValueError(f"the arrival rate must be positive (got {rate:g})")
    return max(1, users) / rate


@dataclass
class Pacer:
    """When one user's requests start under ``--arrival-rate`` (``rng`` draws the first one's delay).

    The first request waits a random part of an interval: Locust starts users in groups (each second's users at
    once), and without that delay their requests would arrive in bursts, one per user, once per interval.
    """

    rng: random.Random
    task_started: float | None = None

    def wait(self, interval_s: float, now: float) -> float:
        """Seconds to wait at ``now`` (the end of a task, or the user's start) before the next request."""
        if self.task_started is None:
            wait = self.rng.random() * interval_s
        else:
            wait = pacing_wait(interval_s, now - self.task_started)
        self.task_started = now + wait
        return wait
