"""What one run of ``python -m benchmarks.bench`` does: its :class:`Plan` (the options resolved by
``benchmarks.bench.cli``, carried out by ``benchmarks.bench.run``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench.measure import Case

NAME = "mtgate bench"  # how the reports and the error lines name the benchmark


@dataclass
class Plan:
    """Resolved arguments."""

    checkpoint: Path | None  # None: a random-weight model of ``preset``'s shape
    preset: str
    seed: int
    sentences_file: Path
    num_sentences: int
    new_tokens: int
    cases: list[Case]
    engine_ids: list[str] | None  # None: every available engine of the selected families
    families: set[str]
    rounds: int
    interleave: str
    repeats: int
    warmup_sentences: int | None
    threads: int
    peer_python: Path
    cache_dir: Path
    output_dir: Path
    name: str
    verify: bool
    timeout: float
    precisions: list[str]
    check_targets: bool
    text: bool = False  # the real-text mode (benchmarks.bench.text): text in, text out, the trained model
    package: Path | None = None  # an mtgate package already converted from ``checkpoint`` (else converted once)
    references_file: Path | None = None  # the text mode's reference translations (BLEU), one per source line
