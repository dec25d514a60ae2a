"""Service-time estimates for admission (``serving.server.batching.queue``): how long the work ahead of a request, and the
request itself, will take on the worker, learned from what the worker has run.

Engine time per sentence depends on how many sentences share the work: a batch of 32 spreads each decoder step over
32 rows, a batch of 1 does not, so one rate for every size would be wrong by several times. Both estimates are
therefore kept per *size class* (sizes 1, 2-3, 4-7, 8-15, ...: powers of two):

- request-level batching (:class:`BatchEstimate`): engine seconds per unit of cost (source tokens) of a batch, by
  batch size; a batch of n items and total cost C takes about C x rate(n);
- step-level batching (:class:`StepEstimate`): seconds per decoder step, by the sentences in the step, and decoder
  steps per unit of a sentence's cost (a sentence of cost c needs about c x steps_per_cost steps), from the steps the
  drive loop times and the chunks that finish.

Each rate is a ratio of exponentially decayed sums (seconds over units, the recent observations weighing most), so
the first observation replaces the prior outright and a change of load or model speed shows within a few batches.
A size class not observed yet borrows the nearest observed one, scaled the pessimistic way; the class just below
it, observed, counts as learned (its rate per unit of cost is only higher: batches of whole requests may never
reach the lower end of the size class the queue asks for). Before anything has been
observed the prior stands in: ``prior_s_per_cost``, engine seconds per unit of cost of a sentence decoded alone. It
is only a placeholder: an estimate says whether it was ``learned`` (every rate it used observed at its own size), and
only a learned estimate refuses or drops work (a server that has not timed its own work yet cannot know it is too
slow; a guess would refuse requests it could serve, while the work it admits is still checked before compute).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

# Steps a sentence needs per unit of its cost (source tokens) until a finished sentence has said: a translation is
# about as long as its source; a little more is the safe side.
STEPS_PER_COST_PRIOR = 1.5


@dataclass(frozen=True)
class Estimate:
    """When a request would be done if admitted now.

    Attributes:
        wait_s: until the work ahead of it (running and queued) lets its items start.
        own_s: its own items, once they start.
        learned: every rate it used was observed at the size it was used for, or just below it (not the prior, not
            borrowed from further).
    """

    wait_s: float
    own_s: float
    learned: bool

    @property
    def total_s(self) -> float:
        return self.wait_s + self.own_s


def size_class(size: int) -> int:
    """1 for size 1, 2 for 2-3, 3 for 4-7, ... (the bit length)."""
    return max(1, size).bit_length()


class Ratio:
    """Seconds per unit as a ratio of exponentially decayed sums: each observation counts ``decay`` times less than
    the one after it (an EWMA weighted by units)."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.seconds = 0.0
        self.units = 0.0

    def observe(self, seconds: float, units: float) -> None:
        if units > 0 and seconds >= 0:
            self.seconds = self.seconds * self.decay + seconds
            self.units = self.units * self.decay + units

    @property
    def value(self) -> float | None:
        """None until something was observed."""
        return self.seconds / self.units if self.units > 0 else None


class BySize:
    """A :class:`Ratio` per size class.

    Arguments:
        decay: of each class's ratio.
        prior: the value for a size before any class was observed.
        grows: whether the value grows with the size (seconds per step: more rows per step) or shrinks (seconds per
            unit of cost: the rows share each step). A class not observed borrows the nearest observed class, scaled
            by the size ratio in the direction that can only overestimate.
    """

    def __init__(self, decay: float, prior: Callable[[int], float], grows: bool) -> None:
        self.decay = decay
        self.prior = prior
        self.grows = grows
        self.classes: dict[int, Ratio] = {}

    def observe(self, size: int, seconds: float, units: float) -> None:
        self.classes.setdefault(size_class(size), Ratio(self.decay)).observe(seconds, units)

    def value(self, size: int) -> tuple[float, bool]:
        """The value at ``size`` and whether it was observed (its own class, or for a shrinking value the class just
        below)."""
        wanted = size_class(size)
        own = self.classes.get(wanted)
        own_value = None if own is None else own.value
        if own_value is not None:  # the common case, asked at every request: no scan
            return own_value, True
        observed = {k: r.value for k, r in self.classes.items() if r.value is not None}
        if not observed:
            return self.prior(size), False
        nearest = min(observed, key=lambda k: (abs(k - wanted), k))
        value = observed[nearest]
        if self.grows and nearest < wanted:  # at most linear in the rows
            value *= 2.0 ** (wanted - nearest)
        elif not self.grows and nearest > wanted:  # a smaller batch shares its steps among fewer rows
            value *= 2.0 ** (nearest - wanted)
        elif not self.grows and nearest == wanted - 1:
            # The class just below, a rate per unit of cost only higher: as good as learned (batches of whole requests
            # may never reach the size the queue asks for: requests of 3 fill batches of 30 of 32, or 3 of 4).
            return value, True
        return value, False


class BatchEstimate:
    """Request-level batching: engine seconds per unit of cost, by batch size (learned from each batch that ran)."""

    def __init__(self, prior_s_per_cost: float) -> None:
        self._rate = BySize(decay=0.75, prior=lambda size: prior_s_per_cost, grows=False)
        self._sizes = Ratio(decay=0.75)  # items per batch, recently

    def observe(self, items: int, cost: int, seconds: float) -> None:
        """A batch of ``items`` items and total cost ``cost`` took ``seconds``."""
        self._rate.observe(items, seconds, cost)
        self._sizes.observe(float(items), 1.0)

    @property
    def recent_size(self) -> int:
        """How many items recent batches had (1 before any): the queue's next batches will be about as full, as
        the requests that keep arriving join what is queued now."""
        return round(self._sizes.value or 1.0)

    def seconds(self, items: int, cost: int) -> tuple[float, bool]:
        """How long ``cost`` units of work take in batches of ``items`` items, and whether that size was observed."""
        rate, learned = self._rate.value(items)
        return cost * rate, learned


class StepEstimate:
    """Step-level batching: seconds per decoder step by the sentences in it, and steps per unit of a sentence's cost.

    Steps are observed on the worker thread and read on the event loop, hence the lock.
    """

    def __init__(self, prior_s_per_cost: float) -> None:
        # A step of n sentences sharing nothing: n sentences' worth of the prior, each needing the prior's steps.
        self._step = BySize(decay=0.9, prior=lambda size: prior_s_per_cost * size / STEPS_PER_COST_PRIOR, grows=True)
        self._steps = Ratio(decay=0.75)  # "seconds" are steps here: steps per unit of cost
        self._lock = threading.Lock()

    def observe_step(self, sentences: int, seconds: float) -> None:
        """A decoder step over ``sentences`` sentences took ``seconds`` (worker thread)."""
        with self._lock:
            self._step.observe(sentences, seconds, 1.0)

    def observe_sentence(self, steps: int, cost: int) -> None:
        """A sentence of cost ``cost`` (a chunk's longest) was done after ``steps`` decoder steps."""
        with self._lock:
            self._steps.observe(float(steps), float(cost))

    def steps_per_cost(self) -> tuple[float, bool]:
        with self._lock:
            value = self._steps.value
        return (STEPS_PER_COST_PRIOR, False) if value is None else (value, True)

    def step_seconds(self, sentences: int) -> tuple[float, bool]:
        """Seconds per decoder step with ``sentences`` in flight, and whether that size was observed."""
        with self._lock:
            return self._step.value(sentences)
