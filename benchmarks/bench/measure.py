"""The measuring loop every engine process runs: mtgate's (``mtgate_worker``) and the peers' (``benchmarks/peers.py``).

This module imports only the standard library and numpy, so the peers' interpreter, which has none of mtgate's
dependencies, imports it too (not even ``serving``: importing ``serving.package.files`` runs the package's
``__init__``, which needs pydantic).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

GenerateFn = Callable[[list[list[int]], int], list[list[int]]]
"""``generate(batch, beam_size)``: source ids of each sentence (EOS not included; the engine appends it as its
tokenizer would) -> the generated ids of each sentence (no start token, no EOS)."""

TranslateFn = Callable[[list[str], int], list[tuple[str, int]]]
"""The real-text mode's engine (``--text``): ``translate(texts, beam_size)`` -> each sentence's translation and
the number of target tokens the engine generated for it (EOS not counted): text in, text out, the engine's own
tokenizer and detokenizer timed with it."""


@dataclass(frozen=True)
class Case:
    """One measured configuration: beam size and sentences per batch."""

    beam: int
    batch: int

    @property
    def name(self) -> str:
        return f"{'greedy' if self.beam == 1 else f'beam{self.beam}'} b{self.batch}"


def measure(
    generate: GenerateFn,
    sentences: list[list[int]],
    cases: Sequence[Case],
    repeats: int,
    warmup_sentences: int | None = None,
) -> list[dict[str, Any]]:
    """Time ``generate`` on every case: a warm-up, then ``repeats`` passes over all sentences.

    Sentences are cut into batches of ``case.batch`` in their given order (the same batches for every engine).

    Arguments:
        generate: the engine (:data:`GenerateFn`).
        sentences: source ids, EOS not included.
        cases: beam size x batch size combinations.
        repeats: timed passes per case (>= 1).
        warmup_sentences: sentences decoded before timing (None: ``max(4, 2 x batch)``, at most all).

    Returns:
        One dict per case: ``beam``, ``batch``, ``seconds`` and ``cpu_seconds`` of each pass, ``tokens`` generated
        per pass, ``lengths`` of each output and the ``outputs`` of the last pass.
    """
    results: list[dict[str, Any]] = []
    for case in cases:
        seconds, cpu_seconds, outputs = _timed_passes(generate, sentences, case, repeats, warmup_sentences)
        results.append({
            "beam": case.beam,
            "batch": case.batch,
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "tokens": sum(len(o) for o in outputs),
            "lengths": [len(o) for o in outputs],
            "outputs": outputs,
        })
        logger.info("%s: %d tokens, median %.3fs", case.name, results[-1]["tokens"], statistics.median(seconds))
    return results


def measure_text(
    translate: TranslateFn,
    sentences: list[str],
    cases: Sequence[Case],
    repeats: int,
    warmup_sentences: int | None = None,
) -> list[dict[str, Any]]:
    """:func:`measure` for the real-text mode: the same batches, warm-up and passes over source texts.

    Returns:
        One dict per case: ``beam``, ``batch``, ``seconds`` and ``cpu_seconds`` of each pass, ``sentences``,
        ``tokens`` generated per pass, and the ``outputs`` (translations) and ``lengths`` (tokens) of the last pass.
    """
    results: list[dict[str, Any]] = []
    for case in cases:
        seconds, cpu_seconds, outputs = _timed_passes(translate, sentences, case, repeats, warmup_sentences)
        results.append({
            "beam": case.beam,
            "batch": case.batch,
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "sentences": len(outputs),
            "tokens": sum(n for _, n in outputs),
            "lengths": [n for _, n in outputs],
            "outputs": [text for text, _ in outputs],
        })
        logger.info("%s: %d sentences, median %.3fs", case.name, len(outputs), statistics.median(seconds))
    return results


def _timed_passes(run: Callable[[list[T], int], list[R]], sentences: list[T], case: Case, repeats: int,
                  warmup_sentences: int | None) -> tuple[list[float], list[float], list[R]]:
    """One case of :func:`measure` or :func:`measure_text`: ``sentences`` cut into batches of ``case.batch`` in
    their order, a warm-up (``warmup_sentences``; None: ``max(4, 2 x batch)``, at most all), then ``repeats`` timed
    passes. Returns each pass's wall and CPU seconds and the last pass's outputs."""
    batches = [sentences[i : i + case.batch] for i in range(0, len(sentences), case.batch)]
    warm = warmup_sentences if warmup_sentences is not None else max(4, 2 * case.batch)
    warm = min(len(sentences), warm)
    for i in range(0, warm, case.batch):
        run(sentences[i : min(warm, i + case.batch)], case.beam)
    seconds: list[float] = []
    cpu_seconds: list[float] = []
    outputs: list[R] = []
    for _ in range(repeats):
        gc.collect()
        outputs = []
        cpu_start = time.process_time()
        start = time.perf_counter()
        for batch in batches:
            outputs.extend(run(batch, case.beam))
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu_start)
    return seconds, cpu_seconds, outputs


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, MiB (``getrusage``)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib() -> float | None:
    """This process's current resident set size, MiB (Linux ``/proc``; None elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def package_versions(names: Sequence[str]) -> dict[str, str]:
    """Installed distribution versions (absent ones omitted)."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def write_json(path: Path, data: Any) -> None:
    """``data`` as indented JSON, written atomically (the parent directory is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.",
                                     delete=False) as file:
        file.write(json.dumps(data, indent=1) + "\n")
    os.replace(file.name, path)


def run_worker(config: dict[str, Any], load: Callable[[dict[str, Any]], tuple[Any, dict[str, Any]]]) -> None:
    """Load one engine, measure it and write its result JSON (``config["result"]``).

    Arguments:
        config: the worker config the harness wrote (engine, workload, threads...; ``"mode": "text"`` for the
            real-text mode).
        load: builds the engine: ``config -> (generate, {"versions": ..., "settings": ...})``, ``generate`` a
            :data:`GenerateFn`, or in the real-text mode a :data:`TranslateFn`.
    """
    workload = json.loads(Path(config["workload"]).read_text(encoding="utf-8"))
    cases = [Case(**c) for c in config["cases"]]
    started = time.perf_counter()
    generate, about = load(config)
    load_seconds = time.perf_counter() - started
    load_rss = current_rss_mib()
    run = measure_text if config.get("mode") == "text" else measure
    results = run(generate, workload["sentences"], cases, int(config["repeats"]), config.get("warmup_sentences"))
    result = {
        "engine": config["engine"],
        "load_seconds": load_seconds,
        "rss_after_load_mib": load_rss,
        "peak_rss_mib": peak_rss_mib(),
        "python": sys.executable,
        **about,
        "cases": results,
    }
    write_json(Path(config["result"]), result)
