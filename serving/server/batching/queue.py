"""Admission: the queue both batchers share (``serving.server.batching.dynamic``, ``serving.server.batching.step``).

A request is a list of payloads, each with a cost (e.g. its token count), a hashable key (items with different keys
never share a batch: e.g. different decoding options), a width (rows each payload decodes: its beams) and an
optional deadline. :class:`Batcher` admits requests (``serving.server.batching.items``: one :class:`Pending` each,
one :class:`Item` per payload) into a bounded queue and owns the one worker thread that runs the model; a subclass
decides how queued items run (its :meth:`Batcher.collect` loop), through the public methods below the admission ones.

The promises users expect from Triton / TF Serving:

- a full queue refuses a request at once with :class:`serving.engine.errors.Overloaded` (the caller answers 503 + Retry-After),
  before its body is even parsed when there is no room for one more sentence (:meth:`Batcher.check_unread`);
- a request past its deadline fails with :class:`serving.engine.errors.DeadlineExceeded` when the deadline passes, even while
  its items are running, and its queued items are dropped, never computed;
- cancelling the waiting task (client disconnect) removes the request's queued items.

And the capacity is spent on requests that can still make their deadline:

- admission by estimate: a request with a deadline that other queued work would make it miss is refused at once with
  Overloaded, its Retry-After the estimated time until it would fit (``serving.server.batching.estimate``: each batcher's
  :meth:`Batcher.estimate`, learned from what its worker ran; before the worker has timed its own work, no request is
  refused by a guess); with nothing queued a request is always admitted (a refusal would help nobody: the check before
  compute below still keeps doomed work off the worker);
- before compute: a queued request whose deadline passed, or that the learned estimate says would finish after it,
  fails with DeadlineExceeded instead of running (:meth:`Batcher.drop_expired`, :meth:`Batcher.drop_hopeless`);
- a sentence whose computation ends after its request's deadline is counted (``BatchStats.late``): wasted work.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from serving.engine.errors import DeadlineExceeded, InferenceFailed, ModelNotReady, Overloaded, ServingError
from serving.engine.planner import BatchBudget
from serving.engine.request import OnPartial
from serving.server.batching.estimate import BatchEstimate, Estimate, StepEstimate
from serving.server.batching.items import BatchObserver, BatchStats, Item, Pending, relay_partials
from serving.server.settings import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_QUEUE_DELAY_US

logger = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")
W = TypeVar("W")


@dataclass(frozen=True)
class BatchLimits:
    """How batches are formed and how much may wait.

    Attributes:
        max_items: most items in one batch.
        max_cost: most padded cost times width (items x width x largest cost: padded source tokens times beams) in one
            batch; a single larger item still runs alone. With ``max_items``, the engine's budget (:attr:`budget`).
        max_delay_s: how long the oldest item may wait for a fuller batch.
        queue_capacity: most items waiting (not yet running); beyond it new requests are refused.
        retry_after_s: the least delay suggested to refused clients (more when the estimate says so).
        prior_s_per_cost: engine seconds per unit of cost assumed before the worker has timed any work (the
            estimate's placeholder, ``serving.server.batching.estimate``: the Retry-After of a full queue; it never refuses
            or drops a request).
    """

    max_items: int = DEFAULT_MAX_BATCH_SIZE
    max_cost: int = DEFAULT_MAX_BATCH_TOKENS
    max_delay_s: float = DEFAULT_MAX_QUEUE_DELAY_US / 1e6
    queue_capacity: int = 512
    retry_after_s: float = 1.0
    prior_s_per_cost: float = 0.02

    @property
    def budget(self) -> BatchBudget:
        """What one batch may hold, as the engine's planner counts it (``serving.engine.planner.BatchBudget``)."""
        return BatchBudget(self.max_items, self.max_cost)



class Batcher(Generic[P, R]):
    """Admits requests into a bounded queue; a subclass's :meth:`collect` loop runs them on the worker thread.

    Arguments:
        limits: batch and queue limits.
        observer: receives queue depth and batch statistics.
        name: used in the worker thread's name and in log lines.
    """

    def __init__(self, limits: BatchLimits, observer: BatchObserver | None = None, name: str = "model") -> None:
        self.limits = limits
        self.observer = observer
        self.name = name
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"mtgate-worker-{name}")
        self.groups: dict[Hashable, list[Item[P]]] = {}  # queued items by key, oldest first
        self._queued = 0
        self._queued_cost = 0
        self.estimator: BatchEstimate | StepEstimate  # each batcher's, set by its constructor
        self._arrival = asyncio.Event()
        self._room = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the collector task on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.collect(), name=f"batcher-{self.name}")

    async def call_in_worker(self, fn: Callable[..., W], *args: Any) -> W:
        """Run ``fn(*args)`` on the worker thread (model loading and warm-up use the thread that owns the runtime)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def stop(self) -> None:
        """Refuse new requests, fail queued and running ones with ModelNotReady and stop the worker thread."""
        self._closed = True
        self.abort_running(ModelNotReady("server is shutting down"))
        for group in list(self.groups.values()):
            for item in list(group):
                self.fail(item.request, ModelNotReady("server is shutting down"), "shutdown")
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await asyncio.to_thread(self.executor.shutdown, wait=True, cancel_futures=True)

    # -- admission -----------------------------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Items waiting (not yet running)."""
        return self._queued

    @property
    def queued_cost(self) -> int:
        """The total cost of the items waiting."""
        return self._queued_cost

    def estimate(self, costs: Sequence[int]) -> Estimate:
        """When a request of items of ``costs`` would be done if admitted now, behind what is running and queued
        (each batcher knows how its work runs)."""
        raise NotImplementedError

    def check_admission(self, deadline: float | None, costs: Sequence[int] = (), items: int | None = None) -> None:
        """Refuse a request that would finish after ``deadline`` because of the work queued ahead of it, by the learned
        estimate (the prior never refuses).

        With no ``costs`` (the request is not tokenized yet: ``items`` says how many items it has, for the count of
        refused items) only the work ahead counts: a cheap early refusal.

        Raises:
            Overloaded: the estimate says so; its ``retry_after`` is when the request would fit (at least
                ``limits.retry_after_s``).
        """
        late = self._late_by(deadline, costs)
        if late is None:
            return
        late_by, estimate = late
        if self.observer is not None:
            self.observer.on_dropped("overloaded", len(costs) or items or 1)
        assert deadline is not None
        raise Overloaded(
            f"overloaded: the queued work ({self._queued} sentences) would finish this request in an estimated "
            f"{estimate.total_s:.1f}s, after its deadline ({max(0.0, deadline - time.monotonic()):.1f}s); retry later",
            retry_after=self._retry_after(late_by),
        )

    def check_unread(self, deadline: float) -> None:
        """Refuse a request whose body is not read yet (its sentences unknown: counted as one) that cannot fit
        whatever it holds: the queue has no room for one more sentence, or the work queued ahead alone would end
        after ``deadline`` (the latest any request may have: the server's timeout). The cheapest refusal: nothing
        is parsed nor tokenized.

        Raises:
            Overloaded: as :meth:`enqueue` or :meth:`check_admission` refuse it.
        """
        self._check_room(1)
        self.check_admission(deadline, items=1)

    def _check_room(self, items: int) -> None:
        """Refuse ``items`` more sentences if the queue has no room for them.

        Raises:
            Overloaded: its ``retry_after`` the time until the excess would have started.
        """
        if self._queued + items <= self.limits.queue_capacity:
            return
        if self.observer is not None:
            self.observer.on_dropped("overloaded", items)
        # Room comes as the items ahead start: the time the excess takes of the whole queue's.
        excess = self._queued + items - self.limits.queue_capacity
        raise Overloaded(
            f"queue full ({self._queued} of {self.limits.queue_capacity} sentences waiting); retry later",
            retry_after=self._retry_after(self.estimate(()).wait_s * min(1.0, excess / max(1, self._queued))),
        )

    def _late_by(self, deadline: float | None, costs: Sequence[int]) -> tuple[float, Estimate] | None:
        """How late a request of ``costs`` would be behind the queued work, and the estimate (None: in time, or
        nothing queued)."""
        if deadline is None or self._queued == 0:
            return None
        estimate = self.estimate(costs)
        late_by = time.monotonic() + estimate.total_s - deadline
        return (late_by, estimate) if late_by > 0 and estimate.learned else None

    def enqueue(self, payloads: Sequence[P], costs: Sequence[int], *, key: Hashable = None,
                deadline: float | None = None, on_partial: OnPartial | None = None, tag: str = "",
                width: int = 1) -> Pending[R]:
        """Admit a request now or refuse it.

        Arguments:
            payloads: the request's items (at least one).
            costs: one cost per item (e.g. source tokens).
            key: items with different keys never share a batch.
            width: rows each item decodes (its beams), counted by the budget; items of one key share it.
            deadline: ``time.monotonic()`` value after which the request fails with DeadlineExceeded.
            on_partial: called on the event loop with ``(item index, partial result)`` while items are computed.
            tag: an id for log lines (e.g. the request id).

        Raises:
            Overloaded: the queue has no room for every item.
            ModelNotReady: the batcher is stopped.
            ValueError: no payloads, or costs of another length.
        """
        if self._closed or self._task is None:
            raise ModelNotReady("server is shutting down" if self._closed else "batcher is not started")
        if not payloads or len(costs) != len(payloads):
            raise ValueError("enqueue needs one cost per payload and at least one payload")
        self._check_room(len(payloads))
        self.check_admission(deadline, costs)
        pending: Pending[R] = Pending(
            batcher=self, key=key, deadline=deadline, on_partial=on_partial, tag=tag, width=max(1, int(width)),
            future=asyncio.get_running_loop().create_future(), results=[None] * len(payloads), remaining=len(payloads),
        )
        now = time.monotonic()
        pending.items = [
            Item(pending, i, p, max(1, int(c)), now) for i, (p, c) in enumerate(zip(payloads, costs, strict=True))
        ]
        self.groups.setdefault(key, []).extend(pending.items)
        self._queued += len(pending.items)
        self._queued_cost += sum(item.cost for item in pending.items)
        self.notify()
        self._report_depth()
        return pending

    async def enqueue_when_room(
        self, payloads: Sequence[P], costs: Sequence[int], *, key: Hashable = None, deadline: float | None = None,
        on_partial: OnPartial | None = None, tag: str = "", width: int = 1,
    ) -> Pending[R]:
        """Like :meth:`enqueue` but wait for room, and for the estimate to fit the deadline, instead of refusing
        (bulk requests).

        Raises:
            DeadlineExceeded: no room before the deadline.
            ModelNotReady: the batcher stopped meanwhile.
        """
        while self._queued > 0 and not self._fits(costs, deadline):
            if self._closed:
                break
            self._room.clear()
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                raise DeadlineExceeded("request deadline passed while waiting for room in the queue")
            try:
                await asyncio.wait_for(self._room.wait(), timeout)
            except TimeoutError:
                raise DeadlineExceeded("request deadline passed while waiting for room in the queue") from None
        return self.enqueue(payloads, costs, key=key, deadline=deadline, on_partial=on_partial, tag=tag, width=width)

    def _fits(self, costs: Sequence[int], deadline: float | None) -> bool:
        return self._queued + len(costs) <= self.limits.queue_capacity and self._late_by(deadline, costs) is None

    def _retry_after(self, seconds: float) -> float:
        return float(max(self.limits.retry_after_s, math.ceil(seconds)))

    async def submit(self, payloads: Sequence[P], costs: Sequence[int], *, key: Hashable = None,
                     deadline: float | None = None, on_partial: OnPartial | None = None, tag: str = "",
                     width: int = 1) -> list[R]:
        """Enqueue and wait: ``await batcher.submit(...)`` returns one result per payload, in order.

        Raises:
            Overloaded, DeadlineExceeded, ModelNotReady, ServingError: see :meth:`enqueue` and :meth:`Pending.wait`.
        """
        pending = self.enqueue(payloads, costs, key=key, deadline=deadline, on_partial=on_partial, tag=tag,
                               width=width)
        return await pending.wait()

    # -- for the batchers: what their collect loops use ----------------------------------------------------------

    async def collect(self) -> None:
        """The loop that runs queued items, started by :meth:`start` (each batcher has its own)."""
        raise NotImplementedError

    def abort_running(self, error: ServingError) -> None:
        """Fail the requests whose items are running (the batcher stops); each batcher knows which they are."""
        raise NotImplementedError

    def take(self, items: Sequence[Item[P]]) -> None:
        """Remove ``items`` from the queue: they start running (room for new requests)."""
        taken = set(map(id, items))
        for key in [key for key, group in self.groups.items() if any(id(item) in taken for item in group)]:
            rest = [item for item in self.groups[key] if id(item) not in taken]
            if rest:
                self.groups[key] = rest
            else:
                del self.groups[key]
        self._queued -= len(items)
        self._queued_cost -= sum(item.cost for item in items)
        self._report_depth()
        self._room.set()

    def drop_expired(self) -> None:
        """Fail the queued requests whose deadline passed."""
        now = time.monotonic()
        for group in list(self.groups.values()):
            for item in list(group):
                request = item.request
                if request.deadline is not None and request.deadline <= now and not request.done:
                    self.fail(request, DeadlineExceeded("request deadline passed while queued"), "deadline")

    def drop_hopeless(self, seconds: Mapping[Pending[Any], float]) -> bool:
        """Fail the requests about to run that would be done after their deadline: ``seconds[request]`` from now, by
        the learned estimate. Returns whether any was.

        The caller passes only an estimate learned from observations: a prior never fails a request.
        """
        now = time.monotonic()
        dropped = False
        for request, needed in seconds.items():
            if request.deadline is None or request.done:
                continue
            if now + needed > request.deadline:
                error = DeadlineExceeded(f"request would finish after its deadline (estimated {needed:.2f}s to "
                                         f"compute, {max(0.0, request.deadline - now):.2f}s left); not computed")
                self.fail(request, error, "deadline")
                dropped = True
        return dropped

    def fail(self, pending: Pending[Any], error: BaseException, reason: str) -> None:
        """Fail a request and drop its queued items (``reason``: what the observer counts them as)."""
        self.abandon(pending, reason)
        pending.set_error(error)

    def abandon(self, pending: Pending[Any], reason: str) -> None:
        """Remove a request's queued items (it failed, expired or was cancelled)."""
        group = self.groups.get(pending.key) or []
        kept = [item for item in group if item.request is not pending]
        removed = len(group) - len(kept)
        if kept:
            self.groups[pending.key] = kept
        elif group:
            del self.groups[pending.key]
        if removed:
            self._queued -= removed
            self._queued_cost -= sum(item.cost for item in group if item.request is pending)
            self._report_depth()
            self._room.set()
            if self.observer is not None:
                self.observer.on_dropped(reason, removed)

    def notify(self) -> None:
        """Wake the collect loop (an arrival, or room in a running batch)."""
        self._arrival.set()

    async def wait_for_arrival(self, timeout: float | None = None) -> None:
        """Sleep until :meth:`notify` (or ``timeout`` seconds)."""
        self._arrival.clear()
        try:
            await asyncio.wait_for(self._arrival.wait(), timeout)
        except TimeoutError:
            pass

    def _report_depth(self) -> None:
        if self.observer is not None:
            self.observer.on_queue_depth(self._queued)


def as_serving_error(error: BaseException) -> ServingError:
    """``error`` as the ServingError a request fails with (an unexpected one is logged and is InferenceFailed)."""
    if isinstance(error, ServingError):
        return error
    logger.error("inference failed: %s: %s", type(error).__name__, error, exc_info=error)
    return InferenceFailed(f"inference failed: {type(error).__name__}: {error}")


__all__ = ["BatchLimits", "BatchObserver", "BatchStats", "Batcher", "Item", "Pending", "as_serving_error",
           "relay_partials"]
