"""Request-level batching (``mtgate serve --batching request``): an asyncio dynamic batcher whose batches of items
run to the end on one worker thread.

The collector forms a batch when the oldest queued item's group (its key) is full (``max_items``, or padded cost
times width ``max_cost``), or when the oldest item has waited ``max_delay_s``. A batch is made of whole requests, oldest
first: the oldest request's items, then every later request (among those of the first ``4 x max_items`` items, the
last one whole) whose items all fit beside them, so that a request's sentences run together and it is done when its
batch is (a request too big for one batch fills consecutive batches). It fits the engine's budget as the planner
counts it (``BatchLimits.budget``, ``serving.engine.planner``: the engine runs the batch without cutting it again).
The batch goes to ``run_batch`` in cost order (less padding inside the engine), on the single worker thread that
owns the runtime. Only one batch runs at a time: while it runs, the next one accumulates.

Admission, limits, deadlines and cancellation are the queue's (``serving.server.batching.queue``). The admission estimate
(:class:`serving.server.batching.estimate.BatchEstimate`) learns engine seconds per unit of cost, by batch size, from every
batch that ran; before a batch runs, its requests that the learned estimate says would finish after their deadline
fail instead (``Batcher.drop_hopeless``). A batch that started in time may still be slowed under it (a busy machine):
the engine polls ``alive`` between decoder steps and stops the sentences whose request's deadline passed or whose
client went away (the request fails with DeadlineExceeded, its sentences are counted ``abandoned``), so that no
sentence is computed to its end after its deadline. If a batch fails, its items are retried one by one so that one bad input
fails only its own request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

from serving.engine.decoding import Alive
from serving.engine.errors import DeadlineExceeded, InferenceFailed, ServingError
from serving.engine.request import OnPartial
from serving.server.batching.estimate import BatchEstimate, Estimate
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

RunBatch = Callable[[Hashable, list[P], OnPartial | None, Alive], Sequence[R]]
"""``run_batch(key, payloads, on_partial, alive)`` -> one result per payload; runs on the worker thread. ``alive(indexes)``
says which of the payloads ``indexes`` are still wanted (``serving.engine.decoding.Alive``): the engine polls it between
decoder steps and stops the others, whose results are then ignored."""


class DynamicBatcher(Batcher[P, R]):
    """Groups items of concurrent requests into batches run by ``run_batch`` on one worker thread.

    Arguments:
        run_batch: ``(key, payloads, on_partial, alive) -> results``; ``on_partial(i, partial)`` may be called from
            the worker thread for payload ``i``; it is None when no request of the batch asked for partial results.
            ``alive(indexes)`` (:data:`RunBatch`) is False for the payloads whose request's deadline passed or whose
            client went away.
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
        self._running_until = 0.0  # when the running batch should be done, by the estimate
        self.estimator: BatchEstimate = BatchEstimate(limits.prior_s_per_cost)

    def estimate(self, costs: Sequence[int]) -> Estimate:
        # Batches take requests oldest first: this one runs after what is queued, in batches as full as the queue
        # (or as recent batches, when more was arriving than is queued now).
        size = min(self.limits.max_items, max(self.queued + len(costs), self.estimator.recent_size))
        running = max(0.0, self._running_until - time.monotonic()) if self._running else 0.0
        ahead, learned = self.estimator.seconds(size, self.queued_cost)
        own, _ = self.estimator.seconds(size, sum(costs))
        return Estimate(wait_s=running + ahead, own_s=own, learned=learned)

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
            seconds, learned = self.estimator.seconds(len(batch), sum(item.cost for item in batch))
            if learned and self.drop_hopeless({item.request: seconds for item in batch}):
                continue  # the batch is formed again from what is left
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
        return self.limits.budget.cost(len(group), longest, group[0].request.width) >= self.limits.max_cost

    def _select(self, group: list[Item[P]]) -> list[Item[P]]:
        """Whole requests, oldest first: the oldest request's items (as many as fit, shortest first, when it is too
        big for one batch), then each later request whose items all fit beside them; returned in cost order."""
        limits = self.limits
        budget, width = limits.budget, group[0].request.width  # items of one key share their width
        end = min(len(group), 4 * limits.max_items)  # the requests looked at: the first items', none cut short
        while end < len(group) and group[end].request is group[end - 1].request:
            end += 1
        requests: list[list[Item[P]]] = []  # a request's queued items are consecutive in its group
        for item in group[:end]:
            if requests and requests[-1][0].request is item.request:
                requests[-1].append(item)
            else:
                requests.append([item])
        head = sorted(requests[0], key=lambda item: item.cost)
        batch = head[:1]
        for item in head[1:]:
            if not budget.fits(len(batch) + 1, item.cost, width):
                return batch  # the rest of the oldest request comes first in the next batch
            batch.append(item)
        longest = batch[-1].cost
        for items in requests[1:]:
            size, top = len(batch) + len(items), max(longest, *(item.cost for item in items))
            if budget.fits(size, top, width):
                batch.extend(items)
                longest = top
            if len(batch) >= limits.max_items:
                break
        return sorted(batch, key=lambda item: item.cost)

    async def _execute(self, key: Hashable, batch: list[Item[P]]) -> None:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        waits = [started - item.enqueued_at for item in batch]
        self._running = batch
        cost = sum(item.cost for item in batch)
        self._running_until = started + self.estimator.seconds(len(batch), cost)[0]
        payloads = [item.payload for item in batch]
        stopped: set[int] = set()  # the items the engine stopped between decoder steps
        ok = True
        try:
            results = await loop.run_in_executor(
                self.executor, self._run_batch, key, payloads, relay_partials(loop, batch), _alive(batch, stopped)
            )
            if len(results) != len(batch):
                raise InferenceFailed(f"engine returned {len(results)} results for {len(batch)} inputs")
            if not stopped:  # a batch cut short would teach the estimate a rate too fast
                self.estimator.observe(len(batch), cost, time.monotonic() - started)
            for i, (item, result) in enumerate(zip(batch, results, strict=True)):
                if i not in stopped:
                    item.request.set_result(item.index, result)
            self._stopped([batch[i] for i in sorted(stopped)])
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
            computed = [item for i, item in enumerate(batch) if i not in stopped]
            self.observer.on_batch(BatchStats.of(batch, waits, time.monotonic() - started, ok, computed))

    def _stopped(self, items: list[Item[P]]) -> None:
        """Fail the requests of ``items``, which the engine stopped between decoder steps (deadline passed or client
        gone), and count them."""
        if not items:
            return
        for request in {id(item.request): item.request for item in items}.values():  # and its items still queued
            self.fail(request, DeadlineExceeded("request deadline passed while its batch was decoding; its sentences "
                                                "stopped"), "deadline")  # no error for one failed or cancelled
        if self.observer is not None:
            self.observer.on_dropped("abandoned", len(items))


def _alive(batch: Sequence[Item[Any]], stopped: set[int]) -> Alive:
    """The batch's ``alive(indexes)`` (:data:`RunBatch`), polled by the engine on the worker thread: a payload is
    wanted while its request is pending (a plain read of its future's state) and its deadline has not passed; the
    ones it answers False for are added to ``stopped``."""

    def alive(indexes: np.ndarray) -> np.ndarray:
        now = time.monotonic()
        wanted = np.ones(len(indexes), dtype=bool)
        for j, i in enumerate(indexes.tolist()):
            request = batch[i].request
            if request.done or (request.deadline is not None and request.deadline <= now):
                wanted[j] = False
                stopped.add(i)
        return wanted

    return alive

