"""Admission: the queue both batchers share (``serving.server.batching.dynamic``, ``serving.server.batching.step``).

A request is a list of payloads, each with a cost (e.g. its token count), a hashable key (items with different keys
never share a batch: e.g. different decoding options) and an optional deadline. :class:`Batcher` admits requests
into a bounded queue and owns the one worker thread that runs the model; a subclass decides how queued items run
(its :meth:`Batcher.collect` loop), through the public methods below the admission ones.

The promises users expect from Triton / TF Serving:

- a full queue refuses a request at once with :class:`serving.engine.errors.Overloaded` (the caller answers 503 + Retry-After);
- a request past its deadline fails with :class:`serving.engine.errors.DeadlineExceeded` when the deadline passes, even while
  its items are running, and its queued items are dropped, never computed;
- cancelling the waiting task (client disconnect) removes the request's queued items.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from serving.engine.errors import DeadlineExceeded, InferenceFailed, ModelNotReady, Overloaded, ServingError
from serving.engine.request import OnPartial

logger = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")
W = TypeVar("W")


@dataclass(frozen=True)
class BatchLimits:
    """How batches are formed and how much may wait.

    Attributes:
        max_items: most items in one batch.
        max_cost: most padded cost (items x largest cost) in one batch; a single larger item still runs alone.
        max_delay_s: how long the oldest item may wait for a fuller batch.
        queue_capacity: most items waiting (not yet running); beyond it new requests are refused.
        retry_after_s: the delay suggested to refused clients.
    """

    max_items: int = 32
    max_cost: int = 8192
    max_delay_s: float = 0.005
    queue_capacity: int = 512
    retry_after_s: float = 1.0


@dataclass(frozen=True)
class BatchStats:
    """What one batch did, for metrics and the per-batch log line."""

    size: int
    padded_cost: int
    cost: int
    queue_waits: list[float]
    compute_s: float
    tags: list[str]
    ok: bool
    shares: list[float]  # each item's share of its request (1 / the request's items): per-request statistics

    @classmethod
    def of(cls, items: Sequence[Item[Any]], queue_waits: list[float], compute_s: float, ok: bool) -> BatchStats:
        """The statistics of the batch ``items``."""
        costs = [item.cost for item in items]
        return cls(size=len(items), padded_cost=len(costs) * max(costs), cost=sum(costs), queue_waits=queue_waits,
                   compute_s=compute_s, tags=sorted({item.request.tag for item in items}), ok=ok,
                   shares=[1.0 / max(1, len(item.request.items)) for item in items])


class BatchObserver(Protocol):
    """Receives the batcher's events (implemented by the metrics layer); called on the event loop."""

    def on_queue_depth(self, depth: int) -> None: ...

    def on_batch(self, stats: BatchStats) -> None: ...

    def on_dropped(self, reason: str, items: int) -> None: ...


@dataclass(eq=False)
class Item(Generic[P]):
    """One payload of an admitted request, queued or running."""

    request: Pending[Any]
    index: int  # within its request
    payload: P
    cost: int
    enqueued_at: float


@dataclass(eq=False)
class Pending(Generic[R]):
    """One admitted request: await :meth:`wait` for its results in order, or :meth:`cancel` it."""

    batcher: Batcher[Any, R]
    key: Hashable
    deadline: float | None
    on_partial: OnPartial | None
    tag: str
    future: asyncio.Future[list[R]]
    results: list[Any]
    remaining: int
    items: list[Item[Any]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.future.done()

    async def wait(self) -> list[R]:
        """Wait for every result.

        Raises:
            DeadlineExceeded: the deadline passed first (queued items are dropped).
            ServingError: the batch failed (InferenceFailed, or the engine's own error for this input).
            asyncio.CancelledError: the waiting task was cancelled; queued items are dropped.
        """
        timeout = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        try:
            done, _ = await asyncio.wait({self.future}, timeout=timeout)
        except asyncio.CancelledError:
            self.cancel("cancelled")
            raise
        if not done:
            self.batcher.fail(self, DeadlineExceeded(f"request deadline passed after {self._age():.3f}s"), "deadline")
        return await self.future

    def cancel(self, reason: str = "cancelled") -> None:
        """Drop the request's queued items; results still computing are discarded."""
        if not self.future.done():
            self.batcher.abandon(self, reason)
            self.future.cancel()

    def set_error(self, error: BaseException) -> None:
        """Fail the request (a no-op once it is done)."""
        if not self.future.done():
            self.future.set_exception(error)
            # Nobody else may await it (e.g. cancelled meanwhile): mark the exception retrieved.
            self.future.exception()

    def set_result(self, index: int, result: Any) -> None:
        """The result of item ``index``; the request is done with its last one."""
        if self.future.done():
            return
        self.results[index] = result
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(self.results)

    def _age(self) -> float:
        return time.monotonic() - self.items[0].enqueued_at if self.items else 0.0


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

    def enqueue(self, payloads: Sequence[P], costs: Sequence[int], *, key: Hashable = None,
                deadline: float | None = None, on_partial: OnPartial | None = None, tag: str = "") -> Pending[R]:
        """Admit a request now or refuse it.

        Arguments:
            payloads: the request's items (at least one).
            costs: one cost per item (e.g. source tokens).
            key: items with different keys never share a batch.
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
        if self._queued + len(payloads) > self.limits.queue_capacity:
            if self.observer is not None:
                self.observer.on_dropped("overloaded", len(payloads))
            raise Overloaded(
                f"queue full ({self._queued} of {self.limits.queue_capacity} sentences waiting); retry later",
                retry_after=self.limits.retry_after_s,
            )
        pending: Pending[R] = Pending(
            batcher=self, key=key, deadline=deadline, on_partial=on_partial, tag=tag,
            future=asyncio.get_running_loop().create_future(), results=[None] * len(payloads), remaining=len(payloads),
        )
        now = time.monotonic()
        pending.items = [
            Item(pending, i, p, max(1, int(c)), now) for i, (p, c) in enumerate(zip(payloads, costs, strict=True))
        ]
        self.groups.setdefault(key, []).extend(pending.items)
        self._queued += len(pending.items)
        self.notify()
        self._report_depth()
        return pending

    async def enqueue_when_room(
        self, payloads: Sequence[P], costs: Sequence[int], *, key: Hashable = None, deadline: float | None = None,
        on_partial: OnPartial | None = None, tag: str = "",
    ) -> Pending[R]:
        """Like :meth:`enqueue` but wait for room instead of refusing (bulk requests).

        Raises:
            DeadlineExceeded: no room before the deadline.
            ModelNotReady: the batcher stopped meanwhile.
        """
        while self._queued + len(payloads) > self.limits.queue_capacity and self._queued > 0:
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
        return self.enqueue(payloads, costs, key=key, deadline=deadline, on_partial=on_partial, tag=tag)

    async def submit(self, payloads: Sequence[P], costs: Sequence[int], *, key: Hashable = None,
                     deadline: float | None = None, on_partial: OnPartial | None = None, tag: str = "") -> list[R]:
        """Enqueue and wait: ``await batcher.submit(...)`` returns one result per payload, in order.

        Raises:
            Overloaded, DeadlineExceeded, ModelNotReady, ServingError: see :meth:`enqueue` and :meth:`Pending.wait`.
        """
        pending = self.enqueue(payloads, costs, key=key, deadline=deadline, on_partial=on_partial, tag=tag)
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

    def fail(self, pending: Pending[Any], error: BaseException, reason: str) -> None:
        """Fail a request and drop its queued items (``reason``: what the observer counts them as)."""
        self.abandon(pending, reason)
        pending.set_error(error)

    def abandon(self, pending: Pending[Any], reason: str) -> None:
        """Remove a request's queued items (it failed, expired or was cancelled)."""
        group = self.groups.get(pending.key)
        removed = 0
        if group:
            kept = [item for item in group if item.request is not pending]
            removed = len(group) - len(kept)
            if kept:
                self.groups[pending.key] = kept
            else:
                del self.groups[pending.key]
        if removed:
            self._queued -= removed
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


def relay_partials(loop: asyncio.AbstractEventLoop, items: Sequence[Item[Any]]) -> OnPartial | None:
    """The ``on_partial(i, partial)`` a worker thread calls for ``items[i]``: hands the partial result to its
    request's callback on the event loop. None when no request of ``items`` asked for partial results."""
    if not any(item.request.on_partial is not None for item in items):
        return None

    def on_partial(i: int, partial: str) -> None:  # worker thread
        item = items[i]
        callback = item.request.on_partial
        if callback is not None and not item.request.done:
            loop.call_soon_threadsafe(_call_if_pending, item.request, callback, item.index, partial)

    return on_partial


def _call_if_pending(request: Pending[Any], callback: OnPartial, index: int, partial: str) -> None:
    if not request.done:
        try:
            callback(index, partial)
        except Exception:  # a consumer's bug must not reach the event loop's exception handler
            logger.exception("on_partial callback failed")


def as_serving_error(error: BaseException) -> ServingError:
    """``error`` as the ServingError a request fails with (an unexpected one is logged and is InferenceFailed)."""
    if isinstance(error, ServingError):
        return error
    logger.error("inference failed: %s: %s", type(error).__name__, error, exc_info=error)
    return InferenceFailed(f"inference failed: {type(error).__name__}: {error}")
