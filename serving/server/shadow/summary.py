"""What ``GET /v1/shadow`` shows: running means since start, quantiles over the recent pairs, and the recent pairs on
which the candidate disagrees most with production. Fed by the shadow worker thread, read by the event loop (one
lock)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.server.shadow.candidate import CROSS_SCORES

RECENT_PAIRS = 1000  # quantiles are over the last this many pairs
RECENT_EXAMPLES = 256  # the most-disagreeing examples are picked among the last this many pairs
WORST_SHOWN = 5


@dataclass
class _Running:
    """A mean since start and the recent values (for quantiles)."""

    count: int = 0
    total: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_PAIRS))

    def add(self, value: float | None) -> None:
        if value is None:
            return
        self.count += 1
        self.total += value
        self.recent.append(value)

    def to_json(self, quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {"count": self.count,
                                               "mean": round(self.total / self.count, 4) if self.count else None}
        values = np.fromiter(self.recent, dtype=np.float64) if self.recent else None
        for q in quantiles:
            out[f"p{round(q * 100)}"] = None if values is None else round(float(np.quantile(values, q)), 4)
        return out


class ShadowSummary:
    """The running comparison of one candidate with production."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pairs = 0
        self.identical = 0
        self.chrf = _Running()
        self.bleu = _Running()
        self.length_ratio = _Running()
        self.production_seconds = _Running()
        self.candidate_seconds = _Running()
        self.log_prob = {name: _Running() for name in CROSS_SCORES}
        self._examples: deque[dict[str, Any]] = deque(maxlen=RECENT_EXAMPLES)

    def add_request(self, production_s: float, candidate_s: float) -> None:
        with self._lock:
            self.production_seconds.add(production_s)
            self.candidate_seconds.add(candidate_s)

    def add_pair(self, record: dict[str, Any]) -> None:
        """One compared pair, as the pair log writes it (texts or their hashes, scores)."""
        with self._lock:
            self.pairs += 1
            self.identical += bool(record["identical"])
            self.chrf.add(record["chrf"])
            self.bleu.add(record["bleu"])
            self.length_ratio.add(record["length_ratio"])
            for name, running in self.log_prob.items():
                running.add(record.get(f"{name}_log_prob"))
            self._examples.append(record)

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            def disagreement(r: dict[str, Any]) -> tuple[float, float]:
                return r["chrf"], -abs(1 - r["length_ratio"])

            worst = sorted((r for r in self._examples if not r["identical"]), key=disagreement)[:WORST_SHOWN]
            return {
                "pairs": self.pairs,
                "identical": self.identical,
                "agreement": round(self.identical / self.pairs, 4) if self.pairs else None,
                "chrf": self.chrf.to_json(),
                "bleu": self.bleu.to_json(),
                "length_ratio": self.length_ratio.to_json(),
                "latency_seconds": {
                    "production": self.production_seconds.to_json((0.5, 0.95)),
                    "candidate": self.candidate_seconds.to_json((0.5, 0.95)),
                },
                "cross_likelihood": {f"{name}_mean_log_prob": running.to_json()
                                     for name, running in self.log_prob.items() if running.count},
                "worst": [dict(r) for r in worst],
            }
