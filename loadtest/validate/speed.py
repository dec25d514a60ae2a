"""In-process decoding speed for ``mtgate validate``: output tokens per second over repeated passes of the test set.

One pass over a test set on a shared machine is one sample of a noisy quantity: six reruns of the same comparison
gave 562 to 2006 output tokens/s for the same fp32 model, and an int8 candidate once looked twice as slow as its
fp32 baseline. So the speed is the median of ``--speed-repeats`` timed passes, shown with their range (min-max), and
when two systems are compared their passes alternate (candidate, baseline, candidate, ...) so that a change in the
machine's load falls on both. The pass that translates the test set for quality is not one of them: it warms the
runtime up (first-run allocations, caches).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serving.engine.translator import DecodeOptions, Translator

DEFAULT_REPEATS = 3


@dataclass(frozen=True)
class Speed:
    """Output tokens per second of each timed pass over the test set, in the order they ran."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    def text(self) -> str:
        """``812.4 (median of 3 passes, 790.1-850.0)``."""
        if len(self.samples) == 1:
            return f"{self.median:.1f} (1 pass)"
        return f"{self.median:.1f} (median of {len(self.samples)} passes, {self.low:.1f}-{self.high:.1f})"

    def to_json(self) -> dict[str, Any]:
        return {"repeats": len(self.samples), "median": self.median, "min": self.low, "max": self.high,
                "samples": list(self.samples)}


@dataclass(frozen=True)
class Pass:
    """One translation of the test set: the hypotheses, output tokens, and seconds (tokenizing and decoding)."""

    hypotheses: list[str]
    output_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0


def translate_pass(translator: Translator, sources: list[str], options: DecodeOptions, batch_size: int,
                   progress: Callable[[int], object] | None = None) -> Pass:
    """Translate ``sources`` in engine calls of ``batch_size`` sentences, timed from tokenizing to the last one;
    ``progress`` is told how many sentences each call translated."""
    hypotheses: list[str] = []
    tokens = 0
    start = time.perf_counter()
    prepared = translator.prepare(sources, options)  # tokenized and length-checked once, before any decoding
    for i in range(0, len(sources), batch_size):
        for t in translator.run(prepared.take(range(i, min(i + batch_size, len(sources))))):
            hypotheses.append(t.text)
            tokens += int(t.output_tokens)
        if progress is not None:
            progress(min(batch_size, len(sources) - i))
    return Pass(hypotheses, tokens, time.perf_counter() - start)


def measure_speed(systems: Mapping[str, Translator], sources: list[str], options: DecodeOptions, batch_size: int,
                  repeats: int) -> dict[str, Speed]:
    """``repeats`` timed passes of every system over ``sources``, the systems' passes alternating."""
    samples: dict[str, list[float]] = {role: [] for role in systems}
    for _ in range(repeats):
        for role, translator in systems.items():
            samples[role].append(translate_pass(translator, sources, options, batch_size).tokens_per_s)
    return {role: Speed(tuple(values)) for role, values in samples.items()}
