"""The step batcher on its own, with a fake step runner (no model): sentences join the running batch at step
boundaries, leave when done, and keep the dynamic batcher's promises (limits, deadlines, cancellation, errors)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from serving.engine.errors import DeadlineExceeded, InferenceFailed, InvalidInput, ModelNotReady, ServingError
from serving.engine.request import OnPartial
from serving.server.batching import BatchLimits, StepBatcher
from tests.serving.server.test_batching import Stats


@dataclass
class _Chunk:
    key: Hashable
    payloads: list[str]
    on_result: Callable[[Sequence[Any] | BaseException], None]
    on_partial: OnPartial | None
    alive: Callable[[], bool]
    steps_left: int
    steps: int = 0


@dataclass
class FakeRunner:
    """A payload ``"word:N"`` needs N steps; a chunk is done when its longest payload is. Records every step's
    batch (the payloads in flight), and the thread it ran on."""

    step_delay: float = 0.0
    chunks: list[_Chunk] = field(default_factory=list)
    steps: list[list[str]] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)
    gate: threading.Event | None = None
    crash_next: bool = False
    detached: int = 0  # detach() calls: before every run of calls made while decoding

    @property
    def idle(self) -> bool:
        return not self.chunks

    @property
    def sentences(self) -> int:
        return sum(len(c.payloads) for c in self.chunks)

    def add(self, key: Hashable, payloads: list[str], on_result: Any, on_partial: OnPartial | None,
            alive: Callable[[], bool]) -> None:
        if any(p.startswith("refuse") for p in payloads):
            raise InvalidInput("refused")
        need = max(int(p.split(":")[1]) if ":" in p else 1 for p in payloads)
        self.chunks.append(_Chunk(key, payloads, on_result, on_partial, alive, need))

    def step(self) -> None:
        self.threads.add(threading.current_thread().name)
        if self.gate is not None:
            self.gate.wait(5)
        if self.crash_next:
            self.crash_next = False
            raise RuntimeError("the runtime broke")
        for chunk in [c for c in self.chunks if not c.alive()]:
            self.chunks.remove(chunk)
            chunk.on_result(ServingError("abandoned"))
        self.steps.append([p for c in self.chunks for p in c.payloads])
        time.sleep(self.step_delay)
        for chunk in list(self.chunks):
            chunk.steps += 1
            if chunk.on_partial is not None:
                for i, p in enumerate(chunk.payloads):
                    chunk.on_partial(i, f"{p}@{chunk.steps}")
            if chunk.steps >= chunk.steps_left:
                self.chunks.remove(chunk)
                chunk.on_result([p.upper() for p in chunk.payloads])

    def fail(self, error: BaseException) -> None:
        chunks, self.chunks = self.chunks, []
        for chunk in chunks:
            chunk.on_result(error)

    def detach(self) -> None:
        self.detached += 1


def make(runner: FakeRunner, **limits: Any) -> tuple[StepBatcher[str, str], Stats]:
    stats = Stats()
    batcher: StepBatcher[str, str] = StepBatcher(lambda: runner, BatchLimits(**limits), stats)
    batcher.start()
    return batcher, stats


def test_a_late_request_joins_the_running_batch_and_leaves_before_it() -> None:
    async def scenario() -> None:
        runner = FakeRunner(step_delay=0.01)
        batcher, stats = make(runner)
        long = asyncio.ensure_future(batcher.submit(["long:30"], [1]))
        await asyncio.sleep(0.05)  # the long one is decoding
        assert not long.done()
        started = time.monotonic()
        short = await batcher.submit(["short:2", "other:3"], [1, 1], key="greedy")
        assert short == ["SHORT:2", "OTHER:3"]
        assert time.monotonic() - started < 0.2, "the short request waited for the long one"
        assert not long.done()
        assert await long == ["LONG:30"]
        shared = [s for s in runner.steps if "long:30" in s and "short:2" in s]
        assert shared, "the two requests never shared a step"
        assert all(thread.startswith("mtgate-worker-") for thread in runner.threads)
        assert sorted(b.size for b in stats.batches) == [1, 2] and all(b.ok for b in stats.batches)
        await batcher.stop()

    asyncio.run(scenario())


def test_a_worker_call_runs_between_two_steps_not_after_the_batch() -> None:
    """call_in_worker (reference scoring) while a long batch decodes runs at the next step boundary, on the worker
    thread, after the runner detached; its error reaches the caller; a caller that gave up is skipped."""
    async def scenario() -> None:
        runner = FakeRunner(step_delay=0.01)
        batcher, _ = make(runner)
        long = asyncio.ensure_future(batcher.submit(["long:60"], [1]))
        await asyncio.sleep(0.05)  # decoding
        started = time.monotonic()
        steps_before = len(runner.steps)
        thread = await batcher.call_in_worker(lambda: threading.current_thread().name)
        assert time.monotonic() - started < 0.2 and not long.done(), "the call waited for the batch"
        assert thread.startswith("mtgate-worker-") and runner.detached == 1
        assert len(runner.steps) - steps_before <= 2

        def broken() -> None:
            raise ValueError("scoring failed")

        with pytest.raises(ValueError, match="scoring failed"):
            await batcher.call_in_worker(broken)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(batcher.call_in_worker(time.sleep, 0.05), 0.001)
        assert await long == ["LONG:60"]
        assert await batcher.call_in_worker(lambda: 42) == 42  # idle: through the executor, as before
        await batcher.stop()

    asyncio.run(scenario())


def test_a_worker_call_made_while_the_runner_fails_to_build_gets_its_error() -> None:
    async def scenario() -> None:
        gate = threading.Event()

        def make_runner() -> FakeRunner:
            gate.wait(5)
            raise ModelNotReady("no engine")

        batcher: StepBatcher[str, str] = StepBatcher(make_runner, BatchLimits(), Stats())
        batcher.start()
        submitted = asyncio.ensure_future(batcher.submit(["a:1"], [1]))
        await asyncio.sleep(0.02)  # the drive loop is building its runner
        call = asyncio.ensure_future(batcher.call_in_worker(lambda: 42))
        await asyncio.sleep(0.02)
        gate.set()
        with pytest.raises(ModelNotReady, match="no engine"):
            await asyncio.wait_for(call, 2)
        with pytest.raises(ModelNotReady):
            await submitted
        await batcher.stop()

    asyncio.run(scenario())


def test_in_flight_sentences_are_bounded_by_max_items() -> None:
    async def scenario() -> None:
        runner = FakeRunner(step_delay=0.002)
        batcher, _ = make(runner, max_items=3)
        results = await asyncio.gather(*(batcher.submit([f"s{i}:3"], [1]) for i in range(8)))
        assert results == [[f"S{i}:3"] for i in range(8)]
        assert max(len(step) for step in runner.steps) == 3
        assert batcher.in_flight == 0 and batcher.queued == 0
        await batcher.stop()

    asyncio.run(scenario())


def test_progress_reaches_each_request() -> None:
    async def scenario() -> None:
        runner = FakeRunner()
        batcher, _ = make(runner)
        seen: list[tuple[int, str]] = []
        result = await batcher.submit(["a:2", "b:2"], [1, 1], on_partial=lambda i, p: seen.append((i, p)))
        assert result == ["A:2", "B:2"]
        assert (0, "a:2@2") in seen and (1, "b:2@2") in seen
        await batcher.stop()

    asyncio.run(scenario())


def test_a_refused_chunk_fails_only_its_request() -> None:
    async def scenario() -> None:
        runner = FakeRunner(step_delay=0.01)
        batcher, stats = make(runner)
        good = asyncio.ensure_future(batcher.submit(["fine:5"], [1]))
        with pytest.raises(InvalidInput, match="refused"):
            await batcher.submit(["refuse"], [1])
        assert await good == ["FINE:5"]
        assert batcher.in_flight == 0
        assert [b.ok for b in stats.batches].count(False) == 1
        await batcher.stop()

    asyncio.run(scenario())


def test_deadline_and_cancellation_take_sentences_out_of_the_batch() -> None:
    async def scenario() -> None:
        runner = FakeRunner(step_delay=0.01)
        batcher, stats = make(runner, max_items=2)
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(["slow:1000"], [1], deadline=time.monotonic() + 0.05)
        waiter = asyncio.ensure_future(batcher.submit(["gone:1000"], [1]))
        await asyncio.sleep(0.05)
        waiter.cancel()
        await asyncio.sleep(0.05)
        # Both left the batch: the room is free again and a new request completes at once.
        assert await asyncio.wait_for(batcher.submit(["next:2", "next2:2"], [1, 1]), 1) == ["NEXT:2", "NEXT2:2"]
        assert batcher.in_flight == 0
        assert ("abandoned", 1) in stats.dropped
        await batcher.stop()

    asyncio.run(scenario())


def test_a_failing_step_fails_the_requests_in_flight_and_the_batcher_goes_on() -> None:
    async def scenario() -> None:
        runner = FakeRunner(step_delay=0.01)
        batcher, _ = make(runner)
        doomed = asyncio.ensure_future(batcher.submit(["x:100"], [1]))
        await asyncio.sleep(0.03)
        runner.crash_next = True
        with pytest.raises(InferenceFailed, match="the runtime broke"):
            await doomed
        assert await batcher.submit(["after:1"], [1]) == ["AFTER:1"]
        await batcher.stop()

    asyncio.run(scenario())


def test_stop_fails_in_flight_requests_instead_of_leaving_them_hanging() -> None:
    async def scenario() -> None:
        runner = FakeRunner(step_delay=0.01)
        batcher, _ = make(runner)
        running = asyncio.ensure_future(batcher.submit(["forever:100000"], [1]))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(batcher.stop(), 5)
        with pytest.raises(ModelNotReady):
            await running
        with pytest.raises(ModelNotReady):
            batcher.enqueue(["late"], [1])

    asyncio.run(scenario())


def test_long_items_hold_at_most_max_long_rows_and_short_ones_go_ahead() -> None:
    """Paragraphs (cost above long_cost) queued ahead of a sentence take at most max_long rows: the sentence joins
    at once and is done within a few steps although paragraphs hold the batch, and the paragraphs still all finish."""
    async def scenario() -> None:
        runner = FakeRunner(step_delay=0.001)
        batcher, _ = make(runner, max_items=8)
        assert batcher.max_long == 2  # a quarter of the rows by default
        paragraphs = [asyncio.ensure_future(batcher.submit([f"p{i}:40"], [100])) for i in range(4)]
        await asyncio.sleep(0)
        short = await batcher.submit(["s:2"], [12])
        assert short == ["S:2"]
        with_short = [i for i, step in enumerate(list(runner.steps)) if "s:2" in step]
        assert with_short[0] <= 10 and len(with_short) == 2  # joined at once (not after 40 steps), left after 2
        assert await asyncio.gather(*paragraphs) == [[f"P{i}:40"] for i in range(4)]
        assert max(sum(p.startswith("p") for p in step) for step in runner.steps) == 2
        await batcher.stop()

    asyncio.run(scenario())


def test_a_request_of_many_sentences_holds_at_most_max_request_rows_while_others_wait() -> None:
    """A document of 8 sentences queued just before a sentence, 4 rows: the document takes 2 rows (max_request), the
    sentence joins at the first step instead of after the document's first 4 sentences; alone, the document takes
    every free row."""
    async def scenario() -> None:
        runner = FakeRunner(step_delay=0.001)
        batcher, _ = make(runner, max_items=4)
        assert batcher.max_request == 2
        document = asyncio.ensure_future(batcher.submit([f"d{i}:5" for i in range(8)], [1] * 8))
        sentence = asyncio.ensure_future(batcher.submit(["s:5"], [1]))
        assert await sentence == ["S:5"]
        assert await document == [f"D{i}:5" for i in range(8)]
        assert "s:5" in runner.steps[0]
        assert max(len(step) for step in runner.steps) == 4  # the room left is the document's
        alone = await batcher.submit([f"e{i}:2" for i in range(4)], [1] * 4)
        assert alone == [f"E{i}:2" for i in range(4)] and len(runner.steps[-1]) == 4  # every free row
        await batcher.stop()

    asyncio.run(scenario())
