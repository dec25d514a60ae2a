"""The demo recipe's paragraphs (models/recipe/paragraphs.py): how training and scoring join consecutive pairs.

Spans are consecutive, within their size bounds, cover the corpus up to a short remainder, and depend only on the
seed; the test paragraphs of test_2016_flickr are the ones the model card's paragraph scores were measured on.
"""

from __future__ import annotations

import gzip
import importlib.util
import random
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _paragraphs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("paragraphs", ROOT / "models" / "recipe" / "paragraphs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


paragraphs = _paragraphs()


def test_spans_are_consecutive_within_bounds_and_seeded() -> None:
    for n in (0, 1, 7, 8, 100, 1013):
        got = paragraphs.spans(n, 2, 8, random.Random(5))
        assert got == paragraphs.spans(n, 2, 8, random.Random(5))
        assert [start for start, _ in got] == ([0] + [end for _, end in got])[: len(got)]
        assert all(2 <= end - start <= 8 for start, end in got)
        assert n - (got[-1][1] if got else 0) < 2
    assert paragraphs.spans(1000, 2, 8, random.Random(5)) != paragraphs.spans(1000, 2, 8, random.Random(6))


def test_join_puts_one_space_between_sentences() -> None:
    lines = ["A dog runs.", "Two men talk", "A cat sleeps."]
    assert paragraphs.join(lines, [(0, 2), (2, 3)]) == ["A dog runs. Two men talk", "A cat sleeps."]


def test_eval_paragraphs_of_test_2016_flickr() -> None:
    with gzip.open(ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    joined, groups = paragraphs.eval_paragraphs(lines)
    assert (len(joined), groups[-1][1]) == (162, 997)  # the counts models/README.md reports
    assert all(4 <= end - start <= 8 for start, end in groups)
    assert joined[0] == " ".join(lines[groups[0][0]:groups[0][1]])
