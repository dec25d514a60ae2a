"""An asyncio dynamic batcher: requests of one or more items go into a bounded queue, and batches of items run on
one worker thread.

The batcher knows nothing of models. A request is a list of payloads, each with a cost (e.g. its token count), a
hashable key (items with different keys never share a batch: e.g. different decoding options) and an optional
deadline. The collector forms a batch when the oldest queued item's group is full (``max_items`` or padded cost
``max_cost``), or when the oldest item has waited ``max_delay_s``; it picks items of similar cost around the oldest
one (less padding) and hands them to ``run_batch`` in cost order, on the single worker thread that owns the runtime.
Only one batch runs at a time: while it runs, the next one accumulates.

Admission control and cancellation (the promises users expect from Triton / TF Serving):

- a full queue refuses a request at once with :class:`serving.errors.Overloaded` (the caller answers 503 + Retry-After);
- a request past its deadline fails with :class:`serving.errors.DeadlineExceeded` when the deadline passes, even while
  its batch is running, and its queued items are dropped, never computed;
- cancelling the waiting task (client disconnect) removes the request's queued items;
- if a batch fails, its items are retried one by one so that one bad input fails only its own request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from serving.errors import DeadlineExceeded, InferenceFailed, ModelNotReady, Overloaded, ServingError

logger = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")
W = TypeVar("W")

StepCallback = Callable[[int, Any], None]
"""``on_step(index, progress)``: ``index`` of the item within its request; called on the event loop."""


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


class BatchObserver(Protocol):
    """Receives the batcher's events (implemented by the metrics layer); called on the event loop."""

    def on_queue_depth(self, depth: int) -> None: ...

    def on_batch(self, stats: BatchStats) -> None: ...

    def on_dropped(self, reason: str, items: int) -> None: ...


RunBatch = Callable[[Hashable, list[P], StepCallback | None], Sequence[R]]
"""``run_batch(key, payloads, on_step)`` -> one result per payload; runs on the worker thread."""


@dataclass(eq=False)
class _Item(Generic[P]):
    request: Pending[Any]
    index: int
    payload: P
    cost: int
    enqueued_at: float


@dataclass(eq=False)
class Pending(Generic[R]):
    """One admitted request: await :meth:`wait` for its results in order, or :meth:`cancel` it."""

    batcher: DynamicBatcher[Any, R]
    key: Hashable
    deadline: float | None
    on_step: StepCallback | None
    tag: str
    future: asyncio.Future[list[R]]
    results: list[Any]
    remaining: int
    items: list[_Item[Any]] = field(default_factory=list)

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
            self.batcher._fail(self, DeadlineExceeded(f"request deadline passed after {self._age():.3f}s"), "deadline")
        return await self.future

    def cancel(self, reason: str = "cancelled") -> None:
        """Drop the request's queued items; results still computing are discarded."""
        if not self.future.done():
            self.batcher._abandon(self, reason)
            self.future.cancel()

    def _age(self) -> float:
        return time.monotonic() - self.items[0].enqueued_at if self.items else 0.0

    def _fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)
            # Nobody else may await it (e.g. cancelled meanwhile): mark the exception retrieved.
            self.future.exception()

    def _deliver(self, index: int, result: Any) -> None:
        if self.future.done():
            return
        self.results[index] = result
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(self.results)


class DynamicBatcher(Generic[P, R]):
    """Groups items of concurrent requests into batches run by ``run_batch`` on one worker thread.

    Arguments:
        run_batch: ``(key, payloads, on_step) -> results``; ``on_step(i, progress)`` may be called from the worker
            thread for payload ``i``; it is None when no request of the batch asked for progress.
        limits: batch and queue limits.
        observer: receives queue depth and batch statistics.
        name: used in the worker thread's name and in log lines.
    """

    def __init__(
        self,
        run_batch: RunBatch[P, R],
        limits: BatchLimits,
        observer: BatchObserver | None = None,
        name: str = "model",
    ) -> None:
        self._run_batch = run_batch
        self.limits = limits
        self._observer = observer
        self.name = name
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"mtgate-worker-{name}")
        self._groups: dict[Hashable, list[_Item[P]]] = {}
        self._queued = 0
        self._running: list[_Item[P]] = []
        self._outstanding: set[Pending[R]] = set()
        self._arrival = asyncio.Event()
        self._room = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the collector task on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._collect(), name=f"batcher-{self.name}")

    async def call_in_worker(self, fn: Callable[..., W], *args: Any) -> W:
        """Run ``fn(*args)`` on the worker thread (model loading and warm-up use the thread that owns the runtime)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def stop(self) -> None:
        """Refuse new requests, fail queued ones with ModelNotReady and stop the worker thread."""
        self._closed = True
        for group in list(self._groups.values()):
            for item in list(group):
                self._fail(item.request, ModelNotReady("server is shutting down"), "shutdown")
        for item in self._running:  # its results will never be delivered: the collector is cancelled below
            item.request._fail(ModelNotReady("server is shutting down"))
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)

    # -- admission -----------------------------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Items waiting (not yet running)."""
        return self._queued

    @property
    def outstanding(self) -> int:
        """Requests admitted and not yet finished."""
        return len(self._outstanding)

    def enqueue(
        self,
        payloads: Sequence[P],
        costs: Sequence[int],
        *,
        key: Hashable = None,
        deadline: float | None = None,
        on_step: StepCallback | None = None,
        tag: str = "",
    ) -> Pending[R]:
        """Admit a request now or refuse it.

        Arguments:
            payloads: the request's items (at least one).
            costs: one cost per item (e.g. source tokens).
            key: items with different keys never share a batch.
            deadline: ``time.monotonic()`` value after which the request fails with DeadlineExceeded.
            on_step: called on the event loop with ``(item index, progress)`` while items are computed.
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
            if self._observer is not None:
                self._observer.on_dropped("overloaded", len(payloads))
            raise Overloaded(
                f"queue full ({self._queued} of {self.limits.queue_capacity} sentences waiting); retry later",
                retry_after=self.limits.retry_after_s,
            )
        return self._admit(payloads, costs, key, deadline, on_step, tag)

    async def enqueue_when_room(
        self,
        payloads: Sequence[P],
        costs: Sequence[int],
        *,
        key: Hashable = None,
        deadline: float | None = None,
        on_step: StepCallback | None = None,
        tag: str = "",
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
        return self.enqueue(payloads, costs, key=key, deadline=deadline, on_step=on_step, tag=tag)

    async def submit(
        self,
        payloads: Sequence[P],
        costs: Sequence[int],
        *,
        key: Hashable = None,
        deadline: float | None = None,
        on_step: StepCallback | None = None,
        tag: str = "",
    ) -> list[R]:
        """Enqueue and wait: ``await batcher.submit(...)`` returns one result per payload, in order.

        Raises:
            Overloaded, DeadlineExceeded, ModelNotReady, ServingError: see :meth:`enqueue` and :meth:`Pending.wait`.
        """
        pending = self.enqueue(payloads, costs, key=key, deadline=deadline, on_step=on_step, tag=tag)
        return await pending.wait()

    def _admit(
        self,
        payloads: Sequence[P],
        costs: Sequence[int],
        key: Hashable,
        deadline: float | None,
        on_step: StepCallback | None,
        tag: str,
    ) -> Pending[R]:
        loop = asyncio.get_running_loop()
        pending: Pending[R] = Pending(
            batcher=self,
            key=key,
            deadline=deadline,
            on_step=on_step,
            tag=tag,
            future=loop.create_future(),
            results=[None] * len(payloads),
            remaining=len(payloads),
        )
        now = time.monotonic()
        pending.items = [
            _Item(pending, i, p, max(1, int(c)), now) for i, (p, c) in enumerate(zip(payloads, costs, strict=True))
        ]
        self._groups.setdefault(key, []).extend(pending.items)
        self._queued += len(pending.items)
        self._outstanding.add(pending)
        pending.future.add_done_callback(lambda _: self._outstanding.discard(pending))
        self._arrival.set()
        self._report_depth()
        return pending

    def _abandon(self, pending: Pending[Any], reason: str) -> None:
        """Remove a request's queued items (it failed, expired or was cancelled)."""
        group = self._groups.get(pending.key)
        removed = 0
        if group:
            kept = [item for item in group if item.request is not pending]
            removed = len(group) - len(kept)
            if kept:
                self._groups[pending.key] = kept
            else:
                del self._groups[pending.key]
        if removed:
            self._queued -= removed
            self._report_depth()
            self._room.set()
            if self._observer is not None:
                self._observer.on_dropped(reason, removed)

    def _fail(self, pending: Pending[Any], error: BaseException, reason: str) -> None:
        self._abandon(pending, reason)
        pending._fail(error)

    def _report_depth(self) -> None:
        if self._observer is not None:
            self._observer.on_queue_depth(self._queued)

    # -- the collector -------------------------------------------------------------------------------------------

    async def _collect(self) -> None:
        while True:
            if not self._groups:
                self._arrival.clear()
                await self._arrival.wait()
                continue
            self._drop_expired()
            if not self._groups:
                continue
            key, group = min(self._groups.items(), key=lambda kv: kv[1][0].enqueued_at)
            wait = group[0].enqueued_at + self.limits.max_delay_s - time.monotonic()
            if wait > 0 and not self._full(group):
                self._arrival.clear()
                try:
                    await asyncio.wait_for(self._arrival.wait(), wait)
                except TimeoutError:
                    pass
                continue
            batch = self._select(group)
            chosen = set(map(id, batch))
            rest = [item for item in group if id(item) not in chosen]
            if rest:
                self._groups[key] = rest
            else:
                del self._groups[key]
            self._queued -= len(batch)
            self._report_depth()
            self._room.set()
            try:
                await self._execute(key, batch)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the collector die: the batch's requests are already failed
                logger.exception("batcher %s: unexpected error while running a batch", self.name)

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for group in list(self._groups.values()):
            for item in list(group):
                request = item.request
                if request.deadline is not None and request.deadline <= now and not request.done:
                    self._fail(request, DeadlineExceeded("request deadline passed while queued"), "deadline")

    def _full(self, group: list[_Item[P]]) -> bool:
        if len(group) >= self.limits.max_items:
            return True
        longest = max(item.cost for item in group)
        return longest * len(group) >= self.limits.max_cost

    def _select(self, group: list[_Item[P]]) -> list[_Item[P]]:
        """The oldest item plus the items of closest cost that fit; returned in cost order."""
        limits = self.limits
        candidates = sorted(group[: 4 * limits.max_items], key=lambda item: item.cost)
        head = group[0]
        lo = hi = next(i for i, item in enumerate(candidates) if item is head)
        longest = head.cost
        while hi - lo + 1 < limits.max_items:
            n = hi - lo + 1
            left = candidates[lo - 1] if lo > 0 else None
            right = candidates[hi + 1] if hi + 1 < len(candidates) else None
            # Padding each choice adds: a shorter item pads itself up to `longest`; a longer one pads everybody.
            left_ok = left is not None and (n + 1) * longest <= limits.max_cost
            right_ok = right is not None and (n + 1) * max(longest, right.cost) <= limits.max_cost
            if not left_ok and not right_ok:
                break
            take_left = left_ok and (
                not right_ok
                or (longest - left.cost if left else 0) <= n * (max(longest, right.cost if right else 0) - longest)
            )
            if take_left:
                lo -= 1
            else:
                hi += 1
                longest = max(longest, candidates[hi].cost)
        return candidates[lo : hi + 1]

    async def _execute(self, key: Hashable, batch: list[_Item[P]]) -> None:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        waits = [started - item.enqueued_at for item in batch]
        self._running = batch
        wants_steps = any(item.request.on_step is not None for item in batch)

        def on_step(i: int, progress: Any) -> None:  # worker thread
            item = batch[i]
            callback = item.request.on_step
            if callback is not None and not item.request.done:
                loop.call_soon_threadsafe(_call_if_pending, item.request, callback, item.index, progress)

        payloads = [item.payload for item in batch]
        ok = True
        try:
            results = await loop.run_in_executor(
                self._executor, self._run_batch, key, payloads, on_step if wants_steps else None
            )
            if len(results) != len(batch):
                raise InferenceFailed(f"engine returned {len(results)} results for {len(batch)} inputs")
            for item, result in zip(batch, results, strict=True):
                item.request._deliver(item.index, result)
        except Exception as error:
            ok = False
            if len(batch) > 1:
                logger.warning(
                    "batcher %s: batch of %d failed (%s); retrying its items one by one", self.name, len(batch), error
                )
                for item in batch:
                    if not item.request.done:
                        await self._execute(key, [item])
            else:
                self._fail(batch[0].request, _as_serving_error(error), "failed")
        finally:
            self._running = []
        if self._observer is not None:
            self._observer.on_batch(
                BatchStats(
                    size=len(batch),
                    padded_cost=len(batch) * max(item.cost for item in batch),
                    cost=sum(item.cost for item in batch),
                    queue_waits=waits,
                    compute_s=time.monotonic() - started,
                    tags=sorted({item.request.tag for item in batch}),
                    ok=ok,
                )
            )


def _call_if_pending(request: Pending[Any], callback: StepCallback, index: int, progress: Any) -> None:
    if not request.done:
        try:
            callback(index, progress)
        except Exception:  # a consumer's bug must not reach the event loop's exception handler
            logger.exception("on_step callback failed")


def _as_serving_error(error: BaseException) -> ServingError:
    if isinstance(error, ServingError):
        return error
    logger.error("inference failed: %s: %s", type(error).__name__, error, exc_info=error)
    return InferenceFailed(f"inference failed: {type(error).__name__}: {error}")
