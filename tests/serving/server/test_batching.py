"""The dynamic batcher on its own, with a run_batch that records what it was given (no model involved)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Hashable
from typing import Any

import pytest

from serving.engine.decoding import Alive
from serving.engine.errors import DeadlineExceeded, InvalidInput, ModelNotReady, Overloaded
from serving.engine.request import OnPartial
from serving.server.batching import BatchLimits, BatchStats, DynamicBatcher


class Recorder:
    """run_batch that upper-cases payloads, optionally slowly, and records every batch and its thread."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.batches: list[tuple[Hashable, list[str]]] = []
        self.threads: set[str] = set()
        self.gate: threading.Event | None = None

    def __call__(self, key: Hashable, payloads: list[str], on_partial: OnPartial | None, alive: Alive | None = None
                 ) -> list[str]:
        self.threads.add(threading.current_thread().name)
        if self.gate is not None:
            self.gate.wait(5)
        self.batches.append((key, list(payloads)))
        if any(p == "boom" for p in payloads):
            raise InvalidInput("boom is not translatable")
        for step in range(3):
            if on_partial is not None:
                for i, p in enumerate(payloads):
                    on_partial(i, p[: step + 1].upper())
            time.sleep(self.delay / 3)
        return [p.upper() for p in payloads]


class Stats:
    def __init__(self) -> None:
        self.batches: list[BatchStats] = []
        self.dropped: list[tuple[str, int]] = []
        self.depths: list[int] = []

    def on_queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def on_batch(self, stats: BatchStats) -> None:
        self.batches.append(stats)

    def on_dropped(self, reason: str, items: int) -> None:
        self.dropped.append((reason, items))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def make(run_batch: Recorder, stats: Stats | None = None, **limits: Any) -> DynamicBatcher[str, str]:
    defaults: dict[str, Any] = {"max_items": 8, "max_cost": 1000, "max_delay_s": 0.01, "queue_capacity": 64}
    defaults.update(limits)
    return DynamicBatcher(run_batch, BatchLimits(**defaults), stats, name="test")


def test_concurrent_requests_share_batches_and_results_stay_in_order() -> None:
    recorder = Recorder(delay=0.03)

    async def main() -> list[list[str]]:
        batcher = make(recorder)
        batcher.start()
        texts = [[f"r{i}a", f"r{i}b"] for i in range(10)]
        out = await asyncio.gather(*(batcher.submit(t, [len(x) for x in t]) for t in texts))
        await batcher.stop()
        return out

    results = run(main())
    assert results == [[f"R{i}A", f"R{i}B"] for i in range(10)]
    sizes = [len(p) for _, p in recorder.batches]
    assert max(sizes) > 1 and max(sizes) <= 8 and sum(sizes) == 20
    assert len(recorder.threads) == 1  # one worker thread owns the runtime


def test_different_keys_never_share_a_batch() -> None:
    recorder = Recorder()

    async def main() -> None:
        batcher = make(recorder, max_delay_s=0.02)
        batcher.start()
        await asyncio.gather(
            batcher.submit(["a", "b"], [1, 1], key="greedy"),
            batcher.submit(["c"], [1], key="beam4"),
            batcher.submit(["d"], [1], key="greedy"),
        )
        await batcher.stop()

    run(main())
    for key, payloads in recorder.batches:
        assert {"greedy": {"a", "b", "d"}, "beam4": {"c"}}[str(key)] >= set(payloads)


def test_batches_are_sorted_and_respect_the_cost_limit() -> None:
    recorder = Recorder(delay=0.0)

    async def main() -> None:
        batcher = make(recorder, max_items=4, max_cost=40, max_delay_s=0.05)
        batcher.start()
        costs = [10, 1, 9, 2, 8, 3]
        await asyncio.gather(*(batcher.submit([str(c).zfill(2)], [c]) for c in costs))
        await batcher.stop()

    run(main())
    for _, payloads in recorder.batches:
        costs = [int(p) for p in payloads]
        assert costs == sorted(costs)
        assert len(costs) * max(costs) <= 40 or len(costs) == 1


def test_full_queue_refuses_with_retry_after_and_accepted_requests_complete() -> None:
    recorder = Recorder()
    recorder.gate = threading.Event()
    stats = Stats()

    async def main() -> tuple[list[Any], DynamicBatcher[str, str]]:
        batcher = make(recorder, stats, queue_capacity=4, max_items=2, max_delay_s=0.0, retry_after_s=3)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(["x0", "x1"], [1, 1]))
        await asyncio.sleep(0.05)  # the first batch is now running (blocked on the gate), the queue is empty
        tasks = [asyncio.ensure_future(batcher.submit([f"y{i}"], [1])) for i in range(10)]
        await asyncio.sleep(0.01)
        recorder.gate.set()  # type: ignore[union-attr]
        out = await asyncio.gather(first, *tasks, return_exceptions=True)
        await batcher.stop()
        return out, batcher

    out, _ = run(main())
    refused = [r for r in out if isinstance(r, Overloaded)]
    accepted = [r for r in out if isinstance(r, list)]
    assert len(refused) == 6 and all(r.retry_after == 3 for r in refused)
    assert accepted[0] == ["X0", "X1"] and len(accepted) == 5
    assert ("overloaded", 1) in stats.dropped


def test_deadline_fires_on_time_and_queued_work_is_dropped() -> None:
    recorder = Recorder()
    recorder.gate = threading.Event()
    stats = Stats()

    async def main() -> tuple[Any, float]:
        batcher = make(recorder, stats, max_items=1, max_delay_s=0.0)
        batcher.start()
        blocker = asyncio.ensure_future(batcher.submit(["slow"], [1]))
        await asyncio.sleep(0.02)
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(["late"], [1], deadline=time.monotonic() + 0.05)
        elapsed = time.monotonic() - start
        assert batcher.queued == 0
        recorder.gate.set()  # type: ignore[union-attr]
        await blocker
        await batcher.stop()
        return None, elapsed

    _, elapsed = run(main())
    assert elapsed < 0.5  # not after the running batch: it is still blocked
    assert all("late" not in payloads for _, payloads in recorder.batches)
    assert ("deadline", 1) in stats.dropped


def test_cancelled_waiter_drops_its_queued_items() -> None:
    recorder = Recorder()
    recorder.gate = threading.Event()

    async def main() -> None:
        batcher = make(recorder, max_items=1, max_delay_s=0.0)
        batcher.start()
        blocker = asyncio.ensure_future(batcher.submit(["slow"], [1]))
        await asyncio.sleep(0.02)
        gone = asyncio.ensure_future(batcher.submit(["gone1", "gone2"], [1, 1]))
        await asyncio.sleep(0.01)
        assert batcher.queued == 2
        gone.cancel()
        await asyncio.sleep(0)
        assert batcher.queued == 0
        recorder.gate.set()  # type: ignore[union-attr]
        await blocker
        await batcher.stop()

    run(main())
    assert all(not p[0].startswith("gone") for _, p in recorder.batches)


def test_a_bad_item_fails_only_its_own_request() -> None:
    recorder = Recorder(delay=0.0)

    async def main() -> list[Any]:
        batcher = make(recorder, max_delay_s=0.05)
        batcher.start()
        out = await asyncio.gather(
            batcher.submit(["good1"], [1]),
            batcher.submit(["boom"], [1]),
            batcher.submit(["good2"], [1]),
            return_exceptions=True,
        )
        await batcher.stop()
        return out

    out = run(main())
    assert out[0] == ["GOOD1"] and out[2] == ["GOOD2"]
    assert isinstance(out[1], InvalidInput)


def test_progress_reaches_the_event_loop_per_request() -> None:
    recorder = Recorder()

    async def main() -> dict[int, list[str]]:
        batcher = make(recorder)
        batcher.start()
        seen: dict[int, list[str]] = {}
        loop_thread = threading.current_thread()

        def on_partial(index: int, progress: Any) -> None:
            assert threading.current_thread() is loop_thread
            seen.setdefault(index, []).append(progress)

        await asyncio.gather(batcher.submit(["abc", "de"], [3, 2], on_partial=on_partial), batcher.submit(["zz"], [2]))
        await batcher.stop()
        return seen

    seen = run(main())
    assert seen == {0: ["A", "AB", "ABC"], 1: ["D", "DE", "DE"]}


def test_stopped_batcher_refuses_and_fails_queued_requests() -> None:
    recorder = Recorder()
    recorder.gate = threading.Event()

    async def main() -> None:
        batcher = make(recorder, max_items=1, max_delay_s=0.0)
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(["slow"], [1]))
        await asyncio.sleep(0.02)
        queued = asyncio.ensure_future(batcher.submit(["queued"], [1]))
        await asyncio.sleep(0.01)
        recorder.gate.set()  # type: ignore[union-attr]
        stop = asyncio.ensure_future(batcher.stop())
        with pytest.raises(ModelNotReady):
            await queued
        await stop
        with pytest.raises(ModelNotReady):
            batcher.enqueue(["late"], [1])
        running.cancel()

    run(main())


def test_enqueue_when_room_waits_instead_of_refusing() -> None:
    recorder = Recorder(delay=0.01)

    async def main() -> list[list[str]]:
        batcher = make(recorder, queue_capacity=2, max_items=2, max_delay_s=0.0)
        batcher.start()

        async def one(i: int) -> list[str]:
            pending = await batcher.enqueue_when_room([f"b{i}"], [1], deadline=time.monotonic() + 5)
            return await pending.wait()

        out = await asyncio.gather(*(one(i) for i in range(12)))
        await batcher.stop()
        return out

    assert run(main()) == [[f"B{i}"] for i in range(12)]


def test_stop_fails_a_running_batch_instead_of_leaving_it_hanging() -> None:
    recorder = Recorder()
    recorder.gate = threading.Event()

    async def main() -> None:
        batcher = make(recorder, max_items=1, max_delay_s=0.0)
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(["slow"], [1]))
        await asyncio.sleep(0.02)
        stop = asyncio.ensure_future(batcher.stop())
        await asyncio.sleep(0.02)
        recorder.gate.set()  # type: ignore[union-attr]
        with pytest.raises(ModelNotReady):
            await asyncio.wait_for(running, 2)
        await stop

    run(main())
