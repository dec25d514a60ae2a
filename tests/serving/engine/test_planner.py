"""The one batch planner (``serving.engine.planner``): one budget (sentences; padded source tokens times beams), one
order (decreasing length, ties in their order), one cut; a batch planned under a budget is not cut again under it,
and a batch of referenced sentences is gathered once, in the planner's order."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from serving.engine.planner import DEFAULT_BUDGET, BatchBudget, decode_together, in_order, order, plan
from serving.engine.request import DecodeOptions, Prepared, Sentence
from tests.fakes import EchoTranslator, echo


def test_plan_cuts_from_the_longest_down_under_sentences_and_tokens_times_beams() -> None:
    lengths = [5, 40, 7, 40, 12, 3, 12]
    budget = BatchBudget(max_batch_size=2, max_batch_tokens=160)
    batches = plan(lengths, budget, beams=4)
    assert [b.tolist() for b in batches] == [[1], [3], [4, 6], [2, 0], [5]]  # 40*4 = 160; then 2 sentences at most
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        assert budget.fits(len(batch), longest, 4) and BatchBudget.cost(len(batch), longest, 4) <= 160
    # over the budget on its own: still runs, alone
    assert [b.tolist() for b in plan([500, 2], BatchBudget(None, 100))] == [[0], [1]]
    assert plan([], DEFAULT_BUDGET) == []
    # ties keep their order; no sentence bound of its own: only the tokens cut
    assert order([3, 5, 3, 5]).tolist() == [1, 3, 0, 2]
    assert [b.tolist() for b in plan([3, 5, 3, 5], BatchBudget(None, 10))] == [[1, 3], [0, 2]]


def test_a_batch_planned_under_a_budget_is_one_batch_under_it() -> None:
    """What the dynamic batcher and batch-score rely on: a batch that fits the budget, in the planner's order, is
    planned again as itself (the engine decodes it without cutting or reordering it)."""
    rng = random.Random(7)
    for _ in range(300):
        budget = BatchBudget(rng.choice([None, 1, 4, 32]), rng.choice([16, 100, 4096]))
        beams = rng.choice([1, 2, 4])
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 40))]
        for batch in plan(lengths, budget, beams):
            sub = [lengths[i] for i in batch]
            again = plan(sub, budget, beams)
            assert len(again) == 1 and in_order(again[0]) and again[0].size == len(sub)
            assert len(batch) == 1 or budget.fits(len(batch), max(sub), beams)
    assert in_order(np.arange(3)) and not in_order(np.array([1, 0])) and not in_order(np.array([1, 2]))


def test_budget_room_is_what_fits() -> None:
    for budget in (BatchBudget(None, 100), BatchBudget(3, 100), BatchBudget(1, 1)):
        for longest in (1, 7, 30, 200):
            for beams in (1, 4):
                room = budget.room(longest, beams)
                assert room >= 1
                assert room == 1 or budget.fits(room, longest, beams)
                assert not budget.fits(room + 1, longest, beams)


def test_decode_together_gathers_once_in_the_planners_order() -> None:
    engine = EchoTranslator()
    first = engine.prepare(["a b", "c d e f", "g"], DecodeOptions(beam_size=2))
    second = engine.prepare(["h i j", "k"], DecodeOptions(beam_size=2))
    sentences = [first.sentences()[2], second.sentences()[0], first.sentences()[1], second.sentences()[1]]
    partials: list[tuple[int, str]] = []
    got = decode_together(engine, sentences, lambda i, text: partials.append((i, text)))
    assert [t.text for t in got] == [echo(t) for t in ("g", "h i j", "c d e f", "k")]
    assert engine.batches == [["c d e f", "h i j", "g", "k"]]  # longest first, ties in the order given
    assert {i for i, _ in partials} == {0, 1, 2, 3}
    streamed: dict[int, str] = {}  # on_partial carries deltas that can no longer change
    for i, delta in partials:
        streamed[i] = streamed.get(i, "") + delta
    assert streamed == {i: echo(t) for i, t in enumerate(["g", "h i j", "c d e f", "k"])}


def test_gather_is_the_one_copy_and_keeps_every_sentence_field() -> None:
    engine = EchoTranslator()
    a = engine.prepare(["one two", "three"], DecodeOptions(beam_size=1))
    b = engine.prepare(["four five six", "seven eight"], DecodeOptions(beam_size=1))
    object.__setattr__(b, "truncated", (False, True))
    object.__setattr__(b, "seeds", np.array([5, 6], dtype=np.uint64))
    object.__setattr__(a, "prefixes", [[1], [2, 3]])
    gathered = Prepared.gather([Sentence(b, 1), Sentence(a, 0), Sentence(b, 0)])
    assert gathered.sources == [b.sources[1], a.sources[0], b.sources[0]]
    assert gathered.truncated == (True, False, False)
    assert gathered.seeds is not None and gathered.seeds.tolist() == [6, 0, 5] and gathered.seeds.dtype == np.uint64
    assert gathered.prefixes == [[], [1], []]
    assert gathered.caps.tolist() == [b.caps[1], a.caps[0], b.caps[0]]
    assert Prepared.gather(a.sentences()) is a  # a whole request in its order is not copied
    assert Prepared.join([a, b]).sources == a.sources + b.sources
    assert [p.sources for p in a.split()] == [[s] for s in a.sources]
    with pytest.raises(ValueError, match="different search options"):
        Prepared.gather([Sentence(a, 0), Sentence(engine.prepare(["x"], DecodeOptions(beam_size=3)), 0)])
    with pytest.raises(ValueError, match="nothing to join"):
        Prepared.gather([])


def test_the_engine_takes_its_budget_from_its_caller(tiny_package: Any) -> None:
    from serving.engine.translator import Translator

    default = Translator.load(tiny_package, threads=1)
    assert default.budget == DEFAULT_BUDGET
    given = Translator.load(tiny_package, threads=1, max_batch_size=3, max_batch_tokens=50)
    assert given.budget == BatchBudget(3, 50) and given.max_batch_tokens == 50
    texts = ["the man", "a dog runs in the park today", "hi", "two cats sit", "one"]
    want = [t.text for t in default.translate(texts, DecodeOptions(beam_size=2))]
    assert [t.text for t in given.translate(texts, DecodeOptions(beam_size=2))] == want
