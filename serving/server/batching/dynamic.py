"""Request-level batching (``mtgate serve --batching request``): an asyncio dynamic batcher whose batches of items
run to the end on one worker thread.

The collector forms a batch when the oldest queued item's group (its key) is full (``max_items`` or padded cost
``max_cost``), or when the oldest item has waited ``max_delay_s``; it picks items of similar cost around the oldest
one (less padding) and hands them to ``run_batch`` in cost order, on the single worker thread that owns the runtime.
Only one batch runs at a time: while it runs, the next one accumulates. Admission, limits, deadlines and
cancellation are the queue's (``serving.server.batching.queue``); if a batch fails, its items are retried one by one so that
one bad input fails only its own request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from serving.engine.errors import InferenceFailed, ServingError
from serving.engine.request import OnPartial
from serving.server.batching.queue import (
    Batcher,
    BatchLimits,
    BatchObserver,
    BatchStats,
    Item,
    as_serving_error,
    relay_partials,
)

logger = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")

RunBatch = Callable[[Hashable, list[P], OnPartial | None], Sequence[R]]
"""``run_batch(key, payloads, on_partial)`` -> one result per payload; runs on the worker thread."""


class DynamicBatcher(Batcher[P, R]):
    """Groups items of concurrent requests into batches run by ``run_batch`` on one worker thread.

    Arguments:
        run_batch: ``(key, payloads, on_partial) -> results``; ``on_partial(i, partial)`` may be called from the
            worker thread for payload ``i``; it is None when no request of the batch asked for partial results.
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
        super().__init__(limits, observer, name)
        self._run_batch = run_batch
        self._running: list[Item[P]] = []

    def abort_running(self, error: ServingError) -> None:
        for item in self._running:  # its results will never be delivered: the collector is cancelled
            item.request.set_error(error)

    async def collect(self) -> None:
        while True:
            if not self.groups:
                await self.wait_for_arrival()
                continue
            self.drop_expired()
            if not self.groups:
                continue
            key, group = min(self.groups.items(), key=lambda kv: kv[1][0].enqueued_at)
            wait = group[0].enqueued_at + self.limits.max_delay_s - time.monotonic()
            if wait > 0 and not self._full(group):
                await self.wait_for_arrival(wait)
                continue
            batch = self._select(group)
            self.take(batch)
            try:
                await self._execute(key, batch)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the collector die: the batch's requests are already failed
                logger.exception("batcher %s: unexpected error while running a batch", self.name)

    def _full(self, group: list[Item[P]]) -> bool:
        if len(group) >= self.limits.max_items:
            return True
        longest = max(item.cost for item in group)
        return longest * len(group) >= self.limits.max_cost

    def _select(self, group: list[Item[P]]) -> list[Item[P]]:
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

    async def _execute(self, key: Hashable, batch: list[Item[P]]) -> None:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        waits = [started - item.enqueued_at for item in batch]
        self._running = batch
        payloads = [item.payload for item in batch]
        ok = True
        try:
            results = await loop.run_in_executor(
                self.executor, self._run_batch, key, payloads, relay_partials(loop, batch)
            )
            if len(results) != len(batch):
                raise InferenceFailed(f"engine returned {len(results)} results for {len(batch)} inputs")
            for item, result in zip(batch, results, strict=True):
                item.request.set_result(item.index, result)
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
                self.fail(batch[0].request, as_serving_error(error), "failed")
        finally:
            self._running = []
        if self.observer is not None:
            self.observer.on_batch(BatchStats.of(batch, waits, time.monotonic() - started, ok))

