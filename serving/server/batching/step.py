"""Step-level batching (``mtgate serve --batching step``): queued sentences join the running decode batch at the next
decoder step instead of waiting for the running batch to finish.

:class:`StepBatcher` admits requests through the shared queue (``serving.server.batching.queue``: limits, deadlines,
cancellation) and replaces how they run. One *drive* loop on the worker thread calls ``runner.step()`` while anything
is in flight; at every step boundary it first adds the chunks the collector handed over. The collector (on the event
loop) hands queued items over, oldest first, while fewer than ``max_items`` sentences are in flight; items of
different keys (decoding options) share the batch, each chunk keeping its own options. A request whose client went
away or whose deadline passed leaves the batch at the next step. Work for the worker thread that is not a
translation (``call_in_worker``: reference scoring) runs at the next step boundary while the loop runs, after the
runner detached its state from the engine's reused buffers.

A request's items are handed over in order, so they join together when there is room for them all, and otherwise
take the next free rows (a row left empty would finish nothing sooner). Long items (paragraphs sent as one text)
hold their rows for many more steps than sentences do: under load they would end up holding every row while short
requests queue behind them. So at most ``max_long`` long items are in flight (a quarter of the rows by default: at
24 mixed requests/s, beam 4, both the sentences and the paragraphs finished sooner than with half;
benchmarks/README.md, "Mixed traffic"), and the short items queued behind the long ones beyond it go ahead. Likewise
a request of many sentences (a document) holds at most ``max_request`` rows (half by default) while other requests
wait: those join at the next free rows instead of after the whole document. The admission estimate
(:class:`serving.server.batching.estimate.StepEstimate`) is the decode-step rate: the drive loop times every step (by
sentences in flight) and each finished chunk says how many steps its longest sentence took per unit of cost. A
request whose learned latency would end after its deadline fails before it joins (``Batcher.drop_hopeless``).

The batcher knows nothing of models: a :class:`serving.server.batching.runner.StepRunner` does the decoding
(``DecoderRunner``: over the engine's ``serving.engine.continuous.ContinuousDecoder``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from serving.engine.continuous import LONG_TOKENS
from serving.engine.errors import InferenceFailed, ModelNotReady, ServingError
from serving.server.batching.estimate import Estimate, StepEstimate
from serving.server.batching.queue import (
    Batcher,
    BatchLimits,
    BatchObserver,
    BatchStats,
    Item,
    Pending,
    as_serving_error,
    relay_partials,
)
from serving.server.batching.runner import StepRunner

logger = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")
W = TypeVar("W")

LONG_COST = LONG_TOKENS
"""Items of more source tokens than this are long (``StepBatcher``'s ``long_cost``): the bound of the engine's long
lanes. The batcher caps every such item, greedy ones too (they hold their row as long); the engine decodes apart only
those with a beam (``serving.engine.continuous``)."""


@dataclass(eq=False)
class _Call:
    """A ``call_in_worker`` made while the drive loop runs; it runs at the next step boundary."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]

    def run(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run on the worker thread; the outcome goes to the event loop."""
        try:
            result = self.fn(*self.args)
        except BaseException as error:  # the caller gets it, as from an executor
            self.settle(loop, None, error)
        else:
            self.settle(loop, result, None)

    def settle(self, loop: asyncio.AbstractEventLoop, result: Any, error: BaseException | None) -> None:
        def deliver() -> None:
            if self.future.done():  # the caller stopped waiting
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        loop.call_soon_threadsafe(deliver)


@dataclass(eq=False)
class _Chunk:
    key: Hashable
    items: list[Item[Any]]
    handed_at: float
    joined_step: int | None = None  # decoder steps run before it joined (set by the drive loop)
    done_step: int | None = None  # ... when it was done

    @property
    def longest(self) -> int:
        return max(item.cost for item in self.items)


class StepBatcher(Batcher[P, R]):
    """A batcher whose batches are decoded step by step, joined and left at step boundaries.

    Arguments:
        make_runner: builds the step runner, called once on the worker thread when the first chunk arrives (after
            the model is loaded).
        limits: ``max_items`` bounds the sentences in flight; the queue limits are as in DynamicBatcher.
            ``max_delay_s`` and ``max_cost`` are not used: a sentence joins at the next step.
        observer: gets one :class:`BatchStats` per chunk, when it is done (``compute_s``: from joining to done), and,
            if it has ``on_step(sentences)``, the sentences in flight at every decoder step (from the worker thread).
        name: used in the worker thread's name and in log lines.
        long_cost: items of a larger cost (source tokens: a paragraph sent as one text, not a sentence) are long.
        max_long: most long items in flight (default: a quarter of ``max_items``, at least 1); short items overtake
            the long ones queued beyond it.
        max_request: most items of one request in flight while other requests' items wait (default: half of
            ``max_items``, at least 1); alone in the queue, a request takes every free row.
    """

    def __init__(
        self,
        make_runner: Callable[[], StepRunner],
        limits: BatchLimits,
        observer: BatchObserver | None = None,
        name: str = "model",
        *,
        long_cost: int = LONG_COST,
        max_long: int | None = None,
        max_request: int | None = None,
    ) -> None:
        super().__init__(limits, observer, name)
        self._make_runner = make_runner
        self.long_cost = long_cost
        self.max_long = max(1, limits.max_items // 4) if max_long is None else max_long
        self.max_request = max(1, limits.max_items // 2) if max_request is None else max_request
        self._runner: StepRunner | None = None
        self._lock = threading.Lock()
        self._joining: list[_Chunk] = []  # handed over, not yet added by the drive loop (guarded by _lock)
        self._driving = False  # a drive loop is running or scheduled (guarded by _lock)
        self._stopping = False
        self._chunks: set[_Chunk] = set()  # handed over and not finished (event loop only)
        # What is in flight, kept as the chunks come and go (event loop only): the admission estimate and the
        # collector ask for it at every request, and summing over every item then cost more than the rest of them.
        self._in_flight = 0  # sentences of the chunks
        self._long_in_flight = 0  # of them long (cost > long_cost)
        self._held: dict[int, int] = {}  # id of a request -> its items in flight
        self._ahead: tuple[tuple[int, int, float], float] | None = None  # (steps, changes, per_cost) -> work
        self._changes = 0  # hand-overs and finished chunks so far: part of _ahead's key
        self._calls: list[_Call] = []  # call_in_worker while the drive loop runs: run between steps (guarded by _lock)
        self._steps = 0  # decoder steps started (written by the drive loop only)
        self.estimator: StepEstimate = StepEstimate(limits.prior_s_per_cost)

    @property
    def in_flight(self) -> int:
        """Sentences handed to the decode batch and not finished."""
        return self._in_flight

    def estimate(self, costs: Sequence[int]) -> Estimate:
        limits = self.limits
        per_cost, steps_learned = self.estimator.steps_per_cost()
        sentences = self.in_flight + self.queued + len(costs)
        step_s, step_learned = self.estimator.step_seconds(min(limits.max_items, sentences))
        own = per_cost * max(costs, default=0) * step_s
        if sentences <= limits.max_items:  # it joins at the next step
            return Estimate(wait_s=0.0, own_s=own, learned=steps_learned and step_learned)
        # The work ahead in sentence-steps (what each sentence in flight still needs, then the queued ones), done
        # max_items at a time; the request's rows free up before all of it is done, so this errs on the long side.
        ahead = per_cost * self.queued_cost + self._work_in_flight(per_cost)
        full_step_s, full_learned = self.estimator.step_seconds(limits.max_items)
        return Estimate(wait_s=ahead / limits.max_items * full_step_s, own_s=own,
                        learned=steps_learned and full_learned)

    def _work_in_flight(self, per_cost: float) -> float:
        """The sentence-steps the sentences in flight still need (at least one each), by ``per_cost`` steps per unit
        of cost; the same until a step runs or a chunk comes or goes (an estimate per request would sum it again)."""
        steps = self._steps
        key = (steps, self._changes, per_cost)
        if self._ahead is None or self._ahead[0] != key:
            work = 0.0
            for chunk in self._chunks:
                done = steps - chunk.joined_step if chunk.joined_step is not None else 0
                work += sum(max(1.0, per_cost * item.cost - done) for item in chunk.items)
            self._ahead = (key, work)
        return self._ahead[1]

    async def call_in_worker(self, fn: Callable[..., W], *args: Any) -> W:
        """Run ``fn(*args)`` on the worker thread. While the drive loop runs, between two of its steps, so that
        work such as reference scoring does not wait for the decode batch to drain (under steady load it never
        does); otherwise as every batcher runs it."""
        loop = asyncio.get_running_loop()
        with self._lock:
            call = _Call(fn, args, loop.create_future()) if self._driving else None
            if call is not None:
                self._calls.append(call)
        if call is None:
            return await super().call_in_worker(fn, *args)
        return await call.future  # type: ignore[no-any-return]

    def abort_running(self, error: ServingError) -> None:
        self._stopping = True
        for chunk in list(self._chunks):
            for item in chunk.items:
                item.request.set_error(error)

    # -- the collector (event loop) ----------------------------------------------------------------------------------

    async def collect(self) -> None:
        while True:
            if self.groups:
                self.drop_expired()
                self._hand_over()
            await self.wait_for_arrival()

    def _hand_over(self) -> None:
        """Move queued items, oldest first, into the decode batch while it has room; a long item (``long_cost``)
        only while fewer than ``max_long`` long ones are in flight: the short items behind it go ahead."""
        room = self.limits.max_items - self.in_flight
        chosen: list[Item[P]] = []
        while room > 0 and self.groups:
            queued = sorted((item for group in self.groups.values() for item in group), key=lambda i: i.enqueued_at)
            chosen = self._admit(queued, room)
            if not self._drop_hopeless(chosen):
                break
            chosen = []
        if not chosen:
            return
        self.take(chosen)
        now = time.monotonic()
        chunks: list[_Chunk] = []
        for item in chosen:  # consecutive items of one request form one chunk
            if chunks and chunks[-1].items[-1].request is item.request:
                chunks[-1].items.append(item)
            else:
                chunks.append(_Chunk(item.request.key, [item], now))
        self._chunks.update(chunks)
        self._count(chosen, +1)
        with self._lock:
            self._joining.extend(chunks)
            start = not self._driving
            self._driving = True
        if start:
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(self.executor, self._drive, loop)
            future.add_done_callback(_log_drive_failure)

    def _admit(self, queued: list[Item[P]], room: int) -> list[Item[P]]:
        """The first ``room`` of the ``queued`` items (oldest first), passing over the long items beyond
        ``max_long`` long ones in flight; the items of a request beyond ``max_request`` in flight go after every
        other request's (they take what room is left)."""
        long_room = self.max_long - self._long_in_flight
        held = dict(self._held)  # request -> its items in flight or chosen
        chosen: list[Item[P]] = []
        later: list[Item[P]] = []  # items of requests past their share
        for item in queued:
            if len(chosen) >= room:
                break
            if item.cost > self.long_cost:
                if long_room <= 0:
                    continue
                long_room -= 1
            if held.get(id(item.request), 0) >= self.max_request:
                later.append(item)
                continue
            held[id(item.request)] = held.get(id(item.request), 0) + 1
            chosen.append(item)
        if not later:
            return chosen
        position = {id(item): i for i, item in enumerate(queued)}
        return sorted(chosen + later[: room - len(chosen)], key=lambda item: position[id(item)])

    def _count(self, items: Sequence[Item[P]], sign: int) -> None:
        """Count ``items`` in flight (``sign`` +1: handed over) or out of it (-1: their chunk finished)."""
        self._changes += 1
        self._in_flight += sign * len(items)
        self._long_in_flight += sign * sum(item.cost > self.long_cost for item in items)
        for item in items:
            key = id(item.request)
            held = self._held.get(key, 0) + sign
            if held:
                self._held[key] = held
            else:
                del self._held[key]

    def _drop_hopeless(self, chosen: list[Item[P]]) -> bool:
        """Fail the requests of ``chosen`` whose learned latency in the batch would end after their deadline."""
        per_cost, steps_learned = self.estimator.steps_per_cost()
        step_s, step_learned = self.estimator.step_seconds(self.in_flight + len(chosen))
        if not (steps_learned and step_learned):
            return False
        seconds: dict[Pending[Any], float] = {}
        for item in chosen:
            seconds[item.request] = max(seconds.get(item.request, 0.0), per_cost * item.cost * step_s)
        return self.drop_hopeless(seconds)

    def _finish(self, chunk: _Chunk, outcome: Sequence[Any] | BaseException) -> None:
        """A chunk's results (or error) arrived from the worker thread; deliver them and make room."""
        if chunk not in self._chunks:
            return
        self._chunks.discard(chunk)
        self._count(chunk.items, -1)
        ok = not isinstance(outcome, BaseException)
        if isinstance(outcome, BaseException) and all(item.request.done for item in chunk.items):
            if self.observer is not None:  # cancelled or expired while decoding: its rows left the batch
                self.observer.on_dropped("abandoned", len(chunk.items))
            self.notify()
            return
        if isinstance(outcome, BaseException):
            error = as_serving_error(outcome)
            for request in {id(item.request): item.request for item in chunk.items}.values():
                self.fail(request, error, "failed")
        elif len(outcome) != len(chunk.items):
            ok = False
            error = InferenceFailed(f"engine returned {len(outcome)} results for {len(chunk.items)} inputs")
            self.fail(chunk.items[0].request, error, "failed")
        else:
            if chunk.joined_step is not None and chunk.done_step is not None:
                self.estimator.observe_sentence(chunk.done_step - chunk.joined_step, chunk.longest)
            for item, result in zip(chunk.items, outcome, strict=True):
                item.request.set_result(item.index, result)
        if self.observer is not None:
            waits = [chunk.handed_at - item.enqueued_at for item in chunk.items]
            self.observer.on_batch(BatchStats.of(chunk.items, waits, time.monotonic() - chunk.handed_at, ok))
        self.notify()  # room for more

    # -- the drive loop (worker thread) ------------------------------------------------------------------------------

    def _drive(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._runner is None:
            try:
                self._runner = self._make_runner()
            except Exception as error:
                with self._lock:
                    joining, self._joining, self._driving = self._joining, [], False
                    calls, self._calls = self._calls, []
                for chunk in joining:
                    loop.call_soon_threadsafe(self._finish, chunk, error)
                for call in calls:
                    call.settle(loop, None, error)
                return
        runner = self._runner
        # Prometheus metrics are thread-safe: the step count goes to the observer without a hop to the event loop.
        observe_step = getattr(self.observer, "on_step", None)
        while True:
            with self._lock:
                joining, self._joining = self._joining, []
                calls, self._calls = self._calls, []
                if self._stopping or (not joining and not calls and runner.idle):
                    self._driving = False
                    if self._stopping and not runner.idle:
                        runner.fail(ModelNotReady("server is shutting down"))
                    for call in calls:
                        call.settle(loop, None, ModelNotReady("server is shutting down"))
                    return
            if calls:
                runner.detach()
                for call in calls:
                    call.run(loop)
            started = time.perf_counter()  # a step's time includes encoding the sentences that join at it
            for chunk in joining:
                self._add(runner, chunk, loop)
            if not runner.idle:
                sentences = runner.sentences
                self._steps += 1
                try:
                    runner.step()
                except Exception as error:  # the runner reports its own failures; this is a bug
                    logger.exception("batcher %s: step failed", self.name)
                    runner.fail(error)
                else:
                    self.estimator.observe_step(sentences, time.perf_counter() - started)
                if observe_step is not None:
                    observe_step(sentences)

    def _add(self, runner: StepRunner, chunk: _Chunk, loop: asyncio.AbstractEventLoop) -> None:
        requests = {id(item.request): item.request for item in chunk.items}

        def on_result(outcome: Sequence[Any] | BaseException) -> None:  # worker thread
            chunk.done_step = self._steps
            loop.call_soon_threadsafe(self._finish, chunk, outcome)

        def alive() -> bool:  # worker thread: a plain read of the futures' state
            return not all(request.done for request in requests.values())

        chunk.joined_step = self._steps
        try:
            runner.add(chunk.key, [item.payload for item in chunk.items], on_result, relay_partials(loop, chunk.items),
                       alive)
        except Exception as error:  # refused (e.g. too long): only this chunk fails
            on_result(error)


def _log_drive_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.error("step batcher: the drive loop died", exc_info=future.exception())
