"""Paragraphs made of consecutive sentence pairs: how the demo recipe trains and scores whole paragraphs.

A paragraph pair joins ``k`` consecutive pairs of a parallel corpus, source with source and target with target, with
one space between sentences. The spans are drawn from a seeded ``random.Random``, so the same seed gives the same
paragraphs. Used by ``train_demo.py`` (training paragraphs of 2-8 pairs, validation paragraphs) and ``score_demo.py``
(test paragraphs of 4-8 sentences); stdlib only.
"""

from __future__ import annotations

import random


def spans(n: int, low: int, high: int, rng: random.Random) -> list[tuple[int, int]]:
    """Consecutive ``[start, end)`` spans of ``low..high`` items covering ``range(n)``; a last remainder shorter than
    ``low`` is left out."""
    out: list[tuple[int, int]] = []
    start = 0
    while n - start >= low:
        end = min(start + rng.randint(low, high), n)
        out.append((start, end))
        start = end
    return out


def join(lines: list[str], groups: list[tuple[int, int]]) -> list[str]:
    return [" ".join(lines[start:end]) for start, end in groups]


def eval_paragraphs(lines: list[str], seed: int = 1) -> tuple[list[str], list[tuple[int, int]]]:
    """The evaluation paragraphs of a test or validation set: consecutive groups of 4-8 sentences."""
    groups = spans(len(lines), 4, 8, random.Random(seed))
    return join(lines, groups), groups
