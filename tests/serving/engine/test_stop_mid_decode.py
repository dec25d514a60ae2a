"""Sentences stopped between decoder steps (issue 34): ``Engine.run``'s ``alive`` says a sentence of a running batch is
no longer wanted (its request's deadline passed, its client went away); its rows leave the batch at the next step,
and every other sentence gets the tokens it gets alone (fp32), with the numpy searches and the native core's."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from serving.engine.translator import DecodeOptions, Translator
from serving.server.settings import DEFAULT_MODEL_DIR

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def demo() -> Translator:
    return Translator.load(DEFAULT_MODEL_DIR, precision="fp32", threads=1)


def _sources(count: int) -> list[str]:
    with gzip.open(ROOT / "tests" / "data" / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines()[:count]


class FlipsAfter:
    """``alive`` that answers False for the sentences ``gone`` from its ``after``-th poll on; records every poll."""

    def __init__(self, gone: set[int], after: int) -> None:
        self.gone, self.after = gone, after
        self.polls: list[list[int]] = []

    def __call__(self, indexes: np.ndarray) -> np.ndarray:
        self.polls.append(indexes.tolist())
        flipped = len(self.polls) > self.after
        return np.array([not (flipped and i in self.gone) for i in indexes.tolist()], dtype=bool)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_sentence_no_longer_wanted_leaves_its_batch_and_the_others_translate_as_alone(
    demo: Translator, search_core: str, beam_size: int
) -> None:
    sources = _sources(6)
    options = DecodeOptions(beam_size=beam_size)
    alone = [demo.translate([source], options)[0].token_ids for source in sources]
    alive = FlipsAfter(gone={2, 4}, after=3)

    translations = demo.run(demo.prepare(sources, options), None, alive)

    assert [t.token_ids for i, t in enumerate(translations) if i not in alive.gone] == [
        ids for i, ids in enumerate(alone) if i not in alive.gone
    ]
    assert all(translations[i].token_ids == [] and translations[i].text == "" for i in alive.gone)
    # Polled before every step with the sentences still decoding: 2 and 4 were, and are never again once stopped.
    assert all(2 in poll and 4 in poll for poll in alive.polls[:4]), alive.polls[:4]
    assert all(2 not in poll and 4 not in poll for poll in alive.polls[4:]) and len(alive.polls) > 5, alive.polls
    assert len(alive.polls[-1]) < 4  # finished sentences are not polled


def test_a_batch_whose_every_sentence_is_stopped_ends_at_once(demo: Translator, search_core: str) -> None:
    sources = _sources(4)
    alive = FlipsAfter(gone={0, 1, 2, 3}, after=2)
    translations = demo.run(demo.prepare(sources, DecodeOptions(beam_size=4)), None, alive)
    assert [t.token_ids for t in translations] == [[], [], [], []]
    assert len(alive.polls) == 3
