"""One budget from the settings to the engine: ``mtgate serve`` loads the engine with ``max_batch_size`` and
``max_batch_tokens`` (padded source tokens times beams), the dynamic batcher cuts under the same budget as the
engine's planner counts it, and so the engine runs every batch the batcher formed as one sub-batch, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import numpy as np

from serving.engine.decoding import Alive
from serving.engine.planner import BatchBudget, in_order
from serving.engine.request import OnPartial
from serving.engine.translator import Translator
from serving.server.batching import BatchLimits, DynamicBatcher
from serving.server.settings import ServingSettings
from tests.serving.server.conftest import loaded_runner
from tests.utils.marian_factory import corpus

SENTENCES = corpus("en")


def test_the_batcher_cuts_under_the_budget_with_the_items_width() -> None:
    batches: list[list[int]] = []

    def run_batch(key: Hashable, payloads: list[int], on_partial: OnPartial | None, alive: Alive | None = None
                  ) -> list[int]:
        batches.append(list(payloads))
        return payloads

    async def main() -> None:
        batcher: DynamicBatcher[int, int] = DynamicBatcher(
            run_batch, BatchLimits(max_items=8, max_cost=40, max_delay_s=0.05, queue_capacity=64))
        batcher.start()
        costs = [3, 2, 3, 1, 3, 2, 3, 3]
        await asyncio.gather(batcher.submit(costs, costs, key="beam4", width=4),
                             batcher.submit([5], [5], key="greedy"))
        await batcher.stop()

    asyncio.run(main())
    budget = BatchLimits(max_items=8, max_cost=40).budget
    assert budget == BatchBudget(8, 40)
    beam = [b for b in batches if b != [5]]
    assert sum(len(b) for b in beam) == 8 and len(beam) >= 3  # 3 x 4 x 3 = 36: at most 3 a batch
    assert all(budget.fits(len(b), max(b), 4) for b in beam)


def test_serve_loads_the_engine_with_its_budget(tiny_package: Path) -> None:
    settings = ServingSettings(model_dirs=[tiny_package], max_batch_size=5, max_batch_tokens=300, threads=1,
                               warmup=False)
    runner = loaded_runner(settings, tiny_package)
    assert isinstance(runner.translator, Translator)
    assert runner.translator.budget == BatchBudget(5, 300)


def test_the_engine_never_cuts_a_batch_the_batcher_formed(live: Callable[..., Any], tiny_package: Path) -> None:
    translator = Translator.load(tiny_package, threads=1, max_batch_size=8, max_batch_tokens=200)
    plans: list[tuple[list[np.ndarray], list[int], int]] = []
    batches = translator._batches

    def recorded(lengths: np.ndarray, beam_size: int) -> list[np.ndarray]:
        plan = batches(lengths, beam_size)
        plans.append((plan, lengths.tolist(), beam_size))
        return plan

    translator._batches = recorded  # type: ignore[method-assign]
    import httpx

    texts = SENTENCES[:12]
    with live(translator, max_batch_size=8, max_batch_tokens=200, max_queue_delay_us=200_000) as url:
        plans.clear()  # the warm-up's
        response = httpx.post(url + "/v1/translate", json={"text": texts, "beam_size": 4}, timeout=120)
        assert response.status_code == 200, response.text
    want = [t.text for t in Translator.load(tiny_package, threads=1).translate(texts, _beam(4))]
    assert [t["text"] for t in response.json()["translations"]] == want
    assert len(plans) >= 2  # the batcher cut the request (12 sentences x 4 beams do not fit 200)
    for plan, lengths, beams in plans:
        assert beams == 4 and len(plan) == 1 and in_order(plan[0]) and plan[0].size == len(lengths)
        assert len(lengths) == 1 or BatchBudget(8, 200).fits(len(lengths), max(lengths), 4)


def _beam(beam: int) -> Any:
    from serving.engine.request import DecodeOptions

    return DecodeOptions(beam_size=beam)
