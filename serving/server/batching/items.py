"""What the queue (``serving.server.batching.queue``) holds and reports: :class:`Item` (one payload of a request),
:class:`Pending` (one admitted request, awaited by its caller), and per batch :class:`BatchStats`, given to a
:class:`BatchObserver` (the metrics layer); :func:`relay_partials` hands a running item's partial results to its
request on the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from serving.engine.errors import DeadlineExceeded
from serving.engine.request import OnPartial

if TYPE_CHECKING:  # a request knows its batcher, to drop its queued items
    from serving.server.batching.queue import Batcher

logger = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")


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
    late: int = 0  # items computed but done after their request's deadline (wasted work)

    @classmethod
    def of(cls, items: Sequence[Item[Any]], queue_waits: list[float], compute_s: float, ok: bool,
           computed: Sequence[Item[Any]] | None = None) -> BatchStats:
        """The statistics of the batch ``items``, done now; ``computed``: those decoded to their end (default: all;
        the others were stopped between decoder steps and are not late)."""
        costs = [item.cost for item in items]
        now = time.monotonic()
        late = sum(1 for item in (items if computed is None else computed)
                   if item.request.deadline is not None and item.request.deadline < now) if ok else 0
        return cls(size=len(items), padded_cost=len(costs) * max(costs), cost=sum(costs), queue_waits=queue_waits,
                   compute_s=compute_s, tags=sorted({item.request.tag for item in items}), ok=ok,
                   shares=[1.0 / max(1, len(item.request.items)) for item in items], late=late)


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
    width: int  # rows each item decodes (its beams): the budget counts padded cost times width
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
