"""The load tests' and the validation's sentence files: the bundled test set, the one reader of sentence files
(``serving.package.text_files``: plain text or gzip, one sentence per line), and paragraphs made of them (the mixed
workloads' long texts).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from serving.package.text_files import CorpusError, read_lines

__all__ = ["DEFAULT_REFERENCE", "DEFAULT_SOURCE", "CorpusError", "default_corpus", "paragraph", "paragraph_range",
           "read_lines"]

# The bundled Multi30k test set (models/data/multi30k/README.md), present in a source checkout.
_REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = _REPO_ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz"
DEFAULT_REFERENCE = _REPO_ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.de.gz"


def default_corpus() -> Path:
    """The bundled test set's source side, or raise CorpusError when this install has none."""
    if not DEFAULT_SOURCE.is_file():
        raise CorpusError(f"no bundled test set at {DEFAULT_SOURCE}; pass --corpus FILE")
    return DEFAULT_SOURCE


def paragraph_range(text: str) -> tuple[int, int]:
    """``MIN-MAX`` (or ``N``) sentences per paragraph (ValueError: not 1 <= MIN <= MAX)."""
    low, _, high = text.partition("-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise ValueError(f"{text!r}: expected MIN-MAX sentences, e.g. 4-8") from None
    if bounds[0] < 1 or bounds[1] < bounds[0]:
        raise ValueError(f"{text!r}: expected 1 <= MIN <= MAX")
    return bounds


def paragraph(sentences: Sequence[str], rng: random.Random, sizes: tuple[int, int]) -> tuple[int, str]:
    """A paragraph: a random count (within ``sizes``, inclusive) of consecutive ``sentences`` from a random start,
    joined with spaces as one text; returns the count and the text."""
    count = rng.randint(*sizes)
    start = rng.randrange(len(sentences) - count + 1)
    return count, " ".join(s.strip() for s in sentences[start:start + count])
