"""Deadline-aware admission and scheduling (``serving.server.batching.queue``, ``serving.server.batching.estimate``) behind the real
batchers, with fake engines of known speed: refusal by estimate with a Retry-After from it, a request's sentences in
one batch, doomed or expired work never computed, the estimator learning from what ran and starting from its prior,
sentences done after their deadline counted."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Hashable
from typing import Any

import numpy as np
import pytest

from serving.engine.decoding import Alive
from serving.engine.errors import DeadlineExceeded, Overloaded
from serving.engine.request import OnPartial
from serving.server.batching import BatchLimits, DynamicBatcher, StepBatcher
from serving.server.batching.estimate import BatchEstimate, StepEstimate
from serving.server.metrics import ServingMetrics
from serving.server.statistics import ModelStatistics
from tests.serving.server.test_batching import Recorder, Stats
from tests.serving.server.test_step_batching import FakeRunner


class Timed:
    """run_batch of a known speed: sleeps ``per_cost`` seconds per unit of the batch's cost (payload ``"name:cost"``)
    and records every batch."""

    def __init__(self, per_cost: float) -> None:
        self.per_cost = per_cost
        self.batches: list[list[str]] = []

    def __call__(self, key: Hashable, payloads: list[str], on_partial: OnPartial | None, alive: Alive | None = None
                 ) -> list[str]:
        self.batches.append(list(payloads))
        time.sleep(self.per_cost * sum(int(p.split(":")[1]) for p in payloads))
        return [p.upper() for p in payloads]


async def until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        await asyncio.sleep(0.005)


def dynamic(run_batch: Any, stats: Stats | None = None, **limits: Any) -> DynamicBatcher[str, str]:
    defaults: dict[str, Any] = {"max_items": 8, "max_cost": 10_000, "max_delay_s": 0.01, "queue_capacity": 1000}
    defaults.update(limits)
    batcher: DynamicBatcher[str, str] = DynamicBatcher(run_batch, BatchLimits(**defaults), stats, name="test")
    batcher.start()
    return batcher


# -- admission by estimate ------------------------------------------------------------------------------------------


def test_a_request_the_queue_would_make_late_is_refused_at_once_with_retry_after_from_the_estimate() -> None:
    """Nothing runs (the oldest item waits 10 s for a fuller batch), so the estimate is plain arithmetic on the learned
    rate: 10 queued requests of cost 100 at 10 ms per unit are 10 s of work."""
    recorder = Recorder()
    stats = Stats()

    async def main() -> None:
        batcher = dynamic(recorder, stats, max_items=100, max_delay_s=10.0)
        batcher.estimator.observe(100, 10_000, 100.0)  # learned: 10 ms per unit of cost in batches of 100
        queued = [batcher.enqueue([f"q{i}"], [100], deadline=time.monotonic() + 60) for i in range(10)]
        assert batcher.estimate([100]).wait_s == pytest.approx(10.0)
        with pytest.raises(Overloaded, match="after its deadline") as refused:
            batcher.enqueue(["late"], [100], deadline=time.monotonic() + 2.5)
        # 10 s ahead + 1 s of its own, 2.5 s allowed: it would fit 8.5 s from now.
        assert refused.value.retry_after == 9
        # The same request with room in its deadline is admitted behind them.
        fits = batcher.enqueue(["fits"], [100], deadline=time.monotonic() + 11.5)
        assert batcher.queued == 11 and ("overloaded", 1) in stats.dropped
        for pending in [*queued, fits]:
            pending.cancel()
        await batcher.stop()

    asyncio.run(main())
    assert recorder.batches == []


def test_step_a_request_the_queue_would_make_late_is_refused_with_retry_after_from_the_decode_step_rate() -> None:
    """The decode-step arithmetic (learned: 1.5 steps per unit of cost, 6.7 ms a step with one sentence): 5 queued
    requests of cost 100 behind a full batch of one are 751 sentence-steps, 5 s."""
    async def scenario() -> None:
        runner = FakeRunner()
        runner.gate = threading.Event()
        batcher: StepBatcher[str, str] = StepBatcher(lambda: runner, BatchLimits(max_items=1), Stats())
        batcher.start()
        batcher.estimator.observe_step(1, 0.01 / 1.5)
        batcher.estimator.observe_sentence(3, 2)
        running = asyncio.ensure_future(batcher.submit(["busy:1"], [1]))
        await until(lambda: runner.threads)  # its first step started, blocked: the batch is full
        queued = [batcher.enqueue([f"q{i}:1"], [100], deadline=time.monotonic() + 60) for i in range(5)]
        with pytest.raises(Overloaded, match="after its deadline") as refused:
            batcher.enqueue(["late:1"], [100], deadline=time.monotonic() + 2.5)
        assert refused.value.retry_after == 4  # 5 s ahead + 1 s of its own, 2.5 s allowed
        admitted = batcher.enqueue(["fits:1"], [100], deadline=time.monotonic() + 10)
        runner.gate.set()
        assert await running == ["BUSY:1"]
        assert await asyncio.gather(*(p.wait() for p in [*queued, admitted])) == [
            [f"Q{i}:1"] for i in range(5)] + [["FITS:1"]]
        await batcher.stop()

    asyncio.run(scenario())


def test_the_prior_never_refuses_a_request() -> None:
    """Before the worker has timed its own work, the estimate is a guess: it would refuse requests a fast server can
    serve, so only a full queue refuses then."""
    recorder = Recorder()

    async def main() -> None:
        batcher = dynamic(recorder, max_items=100, max_delay_s=10.0, prior_s_per_cost=10.0)  # 1000 s per request
        queued = [batcher.enqueue([f"q{i}"], [100], deadline=time.monotonic() + 1) for i in range(5)]
        assert batcher.queued == 5 and batcher.estimate([100]).total_s > 1000
        for pending in queued:
            pending.cancel()
        await batcher.stop()

    asyncio.run(main())


def test_a_request_without_work_ahead_is_admitted_whatever_the_estimate() -> None:
    """With nothing queued a refusal would help nobody: the request is admitted and fails at its deadline."""
    recorder = Recorder()
    recorder.gate = threading.Event()

    async def main() -> None:
        batcher = dynamic(recorder, max_items=1, max_delay_s=0.0)
        batcher.estimator.observe(1, 1, 100.0)  # learned: 100 s per unit of cost
        running = asyncio.ensure_future(batcher.submit(["slow"], [1]))
        await until(lambda: recorder.threads)  # running, blocked: the queue is empty
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(["short"], [5], deadline=time.monotonic() + 0.05)
        recorder.gate.set()  # type: ignore[union-attr]
        await running
        await batcher.stop()

    asyncio.run(main())


def test_a_full_queue_suggests_retrying_when_room_is_estimated() -> None:
    async def main() -> None:
        batcher = dynamic(Recorder(), max_items=100, max_delay_s=10.0, queue_capacity=4, prior_s_per_cost=1.0,
                          retry_after_s=1)
        queued = [batcher.enqueue([f"q{i}"], [2]) for i in range(4)]
        with pytest.raises(Overloaded, match="queue full") as refused:
            batcher.enqueue(["x", "y"], [2, 2])
        # 8 s of queued work; the room for 2 items comes when 2 of the 4 have started: 4 s.
        assert refused.value.retry_after == 4
        for pending in queued:
            pending.cancel()
        await batcher.stop()

    asyncio.run(main())


def test_waiting_for_room_also_waits_for_the_estimate_to_fit() -> None:
    """Bulk requests wait instead of being refused: here until the batches that run have shown the engine to be much
    faster than it was."""
    timed = Timed(per_cost=0.001)

    async def main() -> None:
        batcher = dynamic(timed, max_items=1, max_delay_s=0.0)
        batcher.estimator.observe(1, 20, 2.0)  # learned: 2 s per request of cost 20
        ahead = [asyncio.ensure_future(batcher.submit([f"a{i}:20"], [20])) for i in range(5)]
        await asyncio.sleep(0)
        with pytest.raises(Overloaded):  # 10 s by the estimate, 5 s allowed
            batcher.enqueue(["b:20"], [20], deadline=time.monotonic() + 5)
        pending = await batcher.enqueue_when_room(["b:20"], [20], deadline=time.monotonic() + 5)
        assert await pending.wait() == ["B:20"]
        await asyncio.gather(*ahead)
        await batcher.stop()

    asyncio.run(main())


# -- whole requests in one batch ----------------------------------------------------------------------------------


def test_a_requests_sentences_run_in_the_same_batch_when_they_fit() -> None:
    """Items of similar cost from different requests no longer pull a request apart: each request's items run
    together, requests oldest first."""
    recorder = Recorder()
    recorder.gate = threading.Event()

    async def main() -> None:
        batcher = dynamic(recorder, max_items=4, max_cost=400, max_delay_s=0.0)
        blocker = asyncio.ensure_future(batcher.submit(["block"], [1]))
        await until(lambda: recorder.threads)  # running, blocked: what follows is queued together
        requests = [[f"r{r}short", f"r{r}long"] for r in range(4)]
        costs = [[1 + r, 40 - r] for r in range(4)]
        done = [asyncio.ensure_future(batcher.submit(texts, c)) for texts, c in zip(requests, costs, strict=True)]
        await until(lambda: batcher.queued == 8)
        recorder.gate.set()  # type: ignore[union-attr]
        assert await asyncio.gather(*done) == [[t.upper() for t in texts] for texts in requests]
        await blocker
        await batcher.stop()

    asyncio.run(main())
    batches = [set(payloads) for _, payloads in recorder.batches[1:]]
    assert batches == [{"r0short", "r0long", "r1short", "r1long"}, {"r2short", "r2long", "r3short", "r3long"}]


def test_a_request_that_does_not_fit_beside_the_oldest_waits_whole_for_the_next_batch() -> None:
    recorder = Recorder()
    recorder.gate = threading.Event()

    async def main() -> None:
        batcher = dynamic(recorder, max_items=4, max_cost=100, max_delay_s=0.0)
        blocker = asyncio.ensure_future(batcher.submit(["block"], [1]))
        await until(lambda: recorder.threads)
        first = asyncio.ensure_future(batcher.submit(["a1", "a2"], [10, 10]))
        wide = asyncio.ensure_future(batcher.submit(["b1", "b2"], [5, 40]))  # 4 x 40 > 100: not beside a
        small = asyncio.ensure_future(batcher.submit(["c1", "c2"], [10, 10]))
        big = asyncio.ensure_future(batcher.submit([f"d{i}" for i in range(6)], [1] * 6))  # more than a batch
        await until(lambda: batcher.queued == 12)
        recorder.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(first, wide, small, big, blocker)
        await batcher.stop()

    asyncio.run(main())
    batches = [set(payloads) for _, payloads in recorder.batches[1:]]
    assert batches == [{"a1", "a2", "c1", "c2"}, {"b1", "b2"}, {"d0", "d1", "d2", "d3"}, {"d4", "d5"}]


def test_a_request_cut_by_the_window_of_requests_looked_at_is_not_pulled_apart() -> None:
    """Batches look at the requests of the first 4 x max_items items: the request that window cuts counts whole (the
    real server split one into two batches: its first item fitted beside a request of 3 in a batch of 4)."""
    recorder = Recorder()
    recorder.gate = threading.Event()

    async def main() -> None:
        batcher = dynamic(recorder, max_items=4, max_delay_s=0.0)
        blocker = asyncio.ensure_future(batcher.submit(["block"], [1]))
        await until(lambda: recorder.threads)
        done = [asyncio.ensure_future(batcher.submit([f"r{r}-{i}" for i in range(3)], [5] * 3)) for r in range(6)]
        await until(lambda: batcher.queued == 18)  # the window of 16 cuts the last request after its first item
        recorder.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(blocker, *done)
        await batcher.stop()

    asyncio.run(main())
    assert [sorted(payloads) for _, payloads in recorder.batches[1:]] == [[f"r{r}-{i}" for i in range(3)]
                                                                         for r in range(6)]


# -- doomed and expired work is never computed ---------------------------------------------------------------------


def test_a_request_the_learned_estimate_says_would_finish_late_is_not_computed() -> None:
    recorder = Recorder()
    stats = Stats()

    async def main() -> None:
        batcher = dynamic(recorder, stats, max_delay_s=0.0)
        batcher.estimator.observe(1, 10, 1.0)  # learned: 0.1 s per unit of cost for a batch of 1
        with pytest.raises(DeadlineExceeded, match="not computed"):
            await batcher.submit(["doomed"], [10], deadline=time.monotonic() + 0.5)
        assert await batcher.submit(["quick"], [1], deadline=time.monotonic() + 5) == ["QUICK"]
        await batcher.stop()

    asyncio.run(main())
    assert [payloads for _, payloads in recorder.batches] == [["quick"]]
    assert ("deadline", 1) in stats.dropped


def test_the_prior_never_fails_a_request_before_compute() -> None:
    recorder = Recorder()

    async def main() -> None:
        batcher = dynamic(recorder, max_delay_s=0.0, prior_s_per_cost=10.0)  # 100 s by the prior
        assert await batcher.submit(["fine"], [10], deadline=time.monotonic() + 5) == ["FINE"]
        await batcher.stop()

    asyncio.run(main())


def test_step_a_queued_request_whose_deadline_passes_never_joins() -> None:
    async def scenario() -> None:
        runner = FakeRunner()
        runner.gate = threading.Event()
        batcher: StepBatcher[str, str] = StepBatcher(lambda: runner, BatchLimits(max_items=1), Stats())
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(["busy:2"], [1]))
        await until(lambda: batcher.in_flight == 1)  # its step blocked: the batch is full
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(["expired:1"], [1], deadline=time.monotonic() + 0.05)
        runner.gate.set()
        assert await running == ["BUSY:2"]
        assert await batcher.submit(["after:1"], [1]) == ["AFTER:1"]
        assert all("expired:1" not in step for step in runner.steps)
        await batcher.stop()

    asyncio.run(scenario())


def test_step_a_request_the_learned_estimate_says_would_finish_late_never_joins() -> None:
    async def scenario() -> None:
        runner = FakeRunner()
        stats = Stats()
        batcher: StepBatcher[str, str] = StepBatcher(lambda: runner, BatchLimits(max_items=4), stats)
        batcher.start()
        batcher.estimator.observe_step(1, 0.1)  # learned: 0.1 s per step, 10 steps per unit of cost
        batcher.estimator.observe_sentence(10, 1)
        with pytest.raises(DeadlineExceeded, match="not computed"):
            await batcher.submit(["doomed:1"], [1], deadline=time.monotonic() + 0.5)
        assert runner.steps == [] and ("deadline", 1) in stats.dropped
        await batcher.stop()

    asyncio.run(scenario())


# -- the estimator ---------------------------------------------------------------------------------------------------


def test_the_estimate_starts_from_the_prior_and_the_first_batch_replaces_it() -> None:
    estimate = BatchEstimate(prior_s_per_cost=0.02)
    assert estimate.seconds(32, 500) == (pytest.approx(10.0), False)
    estimate.observe(32, 500, 2.0)
    assert estimate.seconds(32, 500) == (pytest.approx(2.0), True)
    estimate.observe(32, 500, 4.0)  # an EWMA: between the two, nearer the newer
    seconds, _ = estimate.seconds(32, 500)
    assert 3.0 < seconds < 4.0
    # Smaller batches share each step among fewer sentences: an unseen size borrows the pessimistic way.
    assert estimate.seconds(8, 500)[0] > seconds and estimate.seconds(8, 500)[1] is False


def test_batches_of_whole_requests_short_of_their_size_class_still_teach_it() -> None:
    """Requests of 3 sentences, at most 4 per batch, run in batches of 3: a queue's batches of 4 are estimated at that
    (only slower) learned rate, or admission would never refuse."""
    estimate = BatchEstimate(prior_s_per_cost=0.02)
    estimate.observe(3, 300, 3.0)
    assert estimate.seconds(4, 100) == (pytest.approx(1.0), True)
    assert estimate.seconds(8, 100)[1] is False  # two classes above: borrowed, not learned


def test_a_short_queue_is_estimated_at_the_size_recent_batches_ran_at() -> None:
    """Under load the queue is short between two batches while requests keep arriving: what is queued runs in
    batches as full as the recent ones, not at the (unobserved, much slower) rate of a batch its size."""
    recorder = Recorder()

    async def main() -> None:
        batcher = dynamic(recorder, max_items=32, max_delay_s=10.0)
        for _ in range(4):
            batcher.estimator.observe(32, 500, 5.0)  # 10 ms per unit of cost in full batches
        queued = [batcher.enqueue([f"q{i}"], [20], deadline=time.monotonic() + 60) for i in range(8)]
        assert batcher.estimate([20]).total_s == pytest.approx(180 * 0.01)
        for pending in queued:
            pending.cancel()
        await batcher.stop()

    asyncio.run(main())


def test_the_step_estimate_is_the_decode_step_rate() -> None:
    estimate = StepEstimate(prior_s_per_cost=0.02)
    assert estimate.steps_per_cost() == (pytest.approx(1.5), False)
    estimate.observe_step(32, 0.08)
    estimate.observe_sentence(30, 20)
    assert estimate.step_seconds(32) == (pytest.approx(0.08), True)
    assert estimate.steps_per_cost() == (pytest.approx(1.5), True)
    assert estimate.step_seconds(64)[0] >= 0.16  # an unseen, bigger step: at most linear in the rows


def test_the_batcher_learns_its_engines_speed_from_the_batches_it_runs() -> None:
    timed = Timed(per_cost=0.002)  # a known speed: 2 ms per unit of cost, 80 ms per batch of 4 x 10

    async def main() -> DynamicBatcher[str, str]:
        batcher = dynamic(timed, max_items=4, max_delay_s=0.05, prior_s_per_cost=1.0)
        for _ in range(3):
            await asyncio.gather(*(batcher.submit([f"s{i}:10"], [10]) for i in range(4)))
        await batcher.stop()
        return batcher

    batcher = asyncio.run(main())
    assert all(len(batch) == 4 for batch in timed.batches)
    seconds, learned = batcher.estimator.seconds(4, 1000)
    # The engine sleeps 2 s per 1000 units (the rest is overhead, large on a busy machine); the prior said 1000 s.
    assert learned and 2.0 <= seconds < 20.0


def test_the_step_batcher_learns_steps_per_cost_and_step_time() -> None:
    async def scenario() -> StepBatcher[str, str]:
        runner = FakeRunner(step_delay=0.01)
        batcher: StepBatcher[str, str] = StepBatcher(lambda: runner, BatchLimits(max_items=4), Stats())
        batcher.start()
        assert await batcher.submit(["a:6", "b:6"], [3, 2]) == ["A:6", "B:6"]  # 6 steps for the longest, cost 3
        await batcher.stop()
        return batcher

    batcher = asyncio.run(scenario())
    assert batcher.estimator.steps_per_cost() == (pytest.approx(2.0), True)
    step_s, learned = batcher.estimator.step_seconds(2)
    assert learned and step_s >= 0.01


# -- late work is counted ---------------------------------------------------------------------------------------------


def test_sentences_done_after_their_deadline_are_counted_and_exported() -> None:
    recorder = Recorder()
    recorder.gate = threading.Event()
    stats = Stats()

    async def main() -> None:
        batcher = dynamic(recorder, stats, max_delay_s=0.0)
        late = asyncio.ensure_future(batcher.submit(["x", "y"], [1, 1], deadline=time.monotonic() + 0.05))
        await until(lambda: recorder.threads)
        await asyncio.sleep(0.1)  # running (blocked) past the deadline
        recorder.gate.set()  # type: ignore[union-attr]
        with pytest.raises(DeadlineExceeded):
            await late
        assert await batcher.submit(["z"], [1], deadline=time.monotonic() + 5) == ["Z"]
        await batcher.stop()

    asyncio.run(main())
    assert [b.late for b in stats.batches] == [2, 0]
    metrics = ServingMetrics()
    observer = metrics.observer("m", ModelStatistics())
    for batch in stats.batches:
        observer.on_batch(batch)
    assert 'mtgate_late_sentences_total{model="m"} 2.0' in metrics.render().decode()


class Stepped:
    """run_batch that decodes in steps of ``step_s``, each payload for its cost in steps (payload ``"name:cost"``),
    polling ``alive`` before every step as the engine does; records every batch and the steps it ran."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.batches: list[list[str]] = []
        self.steps: dict[str, int] = {}

    def __call__(self, key: Hashable, payloads: list[str], on_partial: OnPartial | None, alive: Alive | None = None
                 ) -> list[str]:
        self.batches.append(list(payloads))
        left = {i: int(p.split(":")[1]) for i, p in enumerate(payloads)}
        while left:
            decoding = np.array(sorted(left))
            wanted = np.ones(decoding.size, dtype=bool) if alive is None else alive(decoding)
            for i in decoding[~wanted].tolist():
                del left[i]
            time.sleep(self.step_s)
            for i in list(left):
                self.steps[payloads[i]] = self.steps.get(payloads[i], 0) + 1
                left[i] -= 1
                if not left[i]:
                    del left[i]
        return [p.upper() for p in payloads]


def test_a_request_whose_deadline_passes_while_its_batch_runs_stops_there_and_its_queued_rest_never_runs() -> None:
    """A request of 3 sentences in batches of 2 (nothing learned: nothing refuses it before): its deadline passes
    in its first batch, whose sentences stop at the next step (504, counted abandoned, never late); its third sentence,
    still queued, is dropped, and the next request runs."""
    stepped = Stepped(step_s=0.02)
    stats = Stats()

    async def main() -> None:
        batcher = dynamic(stepped, stats, max_items=2, max_delay_s=0.05)
        doomed = batcher.enqueue(["d1:50", "d2:50", "d3:50"], [1, 1, 1], deadline=time.monotonic() + 0.3)
        other = batcher.enqueue(["o:20"], [1])
        with pytest.raises(DeadlineExceeded):
            await doomed.wait()
        assert await other.wait() == ["O:20"]
        await until(lambda: len(stats.batches) == 2)
        await batcher.stop()

    asyncio.run(main())
    assert stepped.batches == [["d1:50", "d2:50"], ["o:20"]]  # d3 never ran
    assert stepped.steps["o:20"] == 20 and 5 <= stepped.steps["d1:50"] < 30, stepped.steps
    assert ("abandoned", 2) in stats.dropped and ("deadline", 1) in stats.dropped, stats.dropped
    assert stats.batches[0].late == 0
