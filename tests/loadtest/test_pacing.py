"""loadtest/pacing.py: the locustfile's ``--arrival-rate`` pacing, on a simulated clock (no Locust, no server)."""

from __future__ import annotations

import random

import pytest

from loadtest.pacing import Pacer, arrival_interval, pacing_wait


def test_pacing_wait_is_what_remains_of_the_interval() -> None:
    assert pacing_wait(1.0, 0.25) == 0.75
    assert pacing_wait(1.0, 1.0) == 0.0
    assert pacing_wait(1.0, 3.0) == 0.0  # late: the next request goes at once, the lost time is not made up
    assert pacing_wait(0.5, 0.0) == 0.5


def test_arrival_interval_splits_the_rate_over_the_users() -> None:
    assert arrival_interval(10.0, 40) == 4.0
    assert arrival_interval(0.5, 1) == 2.0
    assert arrival_interval(2.0, 0) == 0.5  # no user count known: one user
    with pytest.raises(ValueError, match="must be positive"):
        arrival_interval(0.0, 4)


def test_pacer_starts_requests_one_interval_apart() -> None:
    pacer = Pacer(random.Random(0))
    phase = pacer.wait(2.0, now=10.0)
    assert 0.0 <= phase < 2.0
    start = 10.0 + phase
    # requests that take 0.5 s, 1.9 s, 3 s (longer than the interval), then 0.1 s
    assert pacer.wait(2.0, now=start + 0.5) == pytest.approx(1.5)
    assert pacer.wait(2.0, now=start + 2.0 + 1.9) == pytest.approx(0.1)
    assert pacer.wait(2.0, now=start + 4.0 + 3.0) == 0.0
    assert pacer.wait(2.0, now=start + 7.0 + 0.1) == pytest.approx(1.9)


def _arrivals(users: int, rate: float, latency_s: float, seconds: float) -> list[float]:
    """Request start times of ``users`` paced users whose requests all take ``latency_s``."""
    rng = random.Random(1)
    starts = []
    for _ in range(users):
        pacer = Pacer(rng)
        now = pacer.wait(arrival_interval(rate, users), now=0.0)
        while now < seconds:
            starts.append(now)
            now += latency_s
            now += pacer.wait(arrival_interval(rate, users), now=now)
    return sorted(starts)


@pytest.mark.parametrize("latency_s", [0.01, 0.5, 3.9])
def test_users_together_send_the_rate_whatever_the_latency(latency_s: float) -> None:
    starts = _arrivals(users=40, rate=10.0, latency_s=latency_s, seconds=60.0)
    assert len(starts) == pytest.approx(600, abs=40)  # each user is off by at most one request
    # spread over the run, not in bursts: every 5-second window gets its share
    per_window = [sum(1 for t in starts if w <= t < w + 5) for w in range(0, 60, 5)]
    assert min(per_window) >= 35 and max(per_window) <= 65, per_window


def test_a_latency_beyond_the_interval_lowers_the_rate() -> None:
    # 40 users at 10/s: 4 s each; requests that take 8 s leave each user one request per 8 s (closed loop again)
    starts = _arrivals(users=40, rate=10.0, latency_s=8.0, seconds=64.0)
    assert len(starts) == pytest.approx(40 * 8, abs=40)
