"""The server's own view of a load test: ``/metrics`` scraped once a second while Locust runs.

From mtgate's Prometheus metrics (``serving/server/metrics.py``) each sample keeps the cumulative queue-wait histogram
(``mtgate_queue_wait_seconds``), the batch-size histogram (``mtgate_batch_size``, sentences per engine batch), the
sentences in flight per decoder step (``mtgate_step_sentences``, step-level batching) and the queue depth gauge,
summed over models. Differences between consecutive samples give, per interval, the mean and p95 queue wait and the
mean batch size, as ``rate(sum) / rate(count)`` and ``histogram_quantile`` would on a dashboard. A server without
these metrics (Triton, or no ``/metrics``) gives no samples, and the report says so.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtest.metrics_text import MetricsUnavailable, parse_families, read_metrics

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

logger = logging.getLogger(__name__)

INTERVAL_S = 1.0
QUEUE = "mtgate_queue_wait_seconds"
BATCH = "mtgate_batch_size"
STEP = "mtgate_step_sentences"
DEPTH = "mtgate_queue_depth"


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram summed over label sets: upper bounds -> cumulative counts, sum, count."""

    buckets: dict[float, float]
    sum: float
    count: float

    def minus(self, earlier: Histogram) -> Histogram:
        return Histogram({b: c - earlier.buckets.get(b, 0.0) for b, c in self.buckets.items()},
                         self.sum - earlier.sum, self.count - earlier.count)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def upper_bound(self) -> float | None:
        """The smallest bucket bound that holds every observation (None without observations)."""
        if self.count <= 0:
            return None
        return min((b for b, c in self.buckets.items() if c >= self.count), default=None)

    def quantile(self, q: float) -> float | None:
        """Prometheus' ``histogram_quantile``: linear within the bucket that holds the q-th observation."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cumulative in sorted(self.buckets.items()):
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower  # beyond the last finite bucket: its bound is what is known
                inside = cumulative - below
                return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
            lower, below = bound, cumulative
        return lower


@dataclass(frozen=True)
class Sample:
    """One scrape: its time (epoch seconds) and the cumulative values."""

    time: float
    queue_wait: Histogram
    batch_size: Histogram
    step_sentences: Histogram
    queue_depth: float


@dataclass(frozen=True)
class Interval:
    """What the server did between two scrapes (``time`` is the later one)."""

    time: float
    queue_wait_mean_ms: float | None
    queue_wait_p95_ms: float | None
    batch_size_mean: float | None
    step_sentences_mean: float | None
    queue_depth: float


@dataclass
class ServerMetrics:
    """The samples of one run (possibly none)."""

    samples: list[Sample] = field(default_factory=list)

    def intervals(self) -> list[Interval]:
        out = []
        for a, b in zip(self.samples, self.samples[1:], strict=False):
            queue, batch, step = (b.queue_wait.minus(a.queue_wait), b.batch_size.minus(a.batch_size),
                                  b.step_sentences.minus(a.step_sentences))
            p95 = queue.quantile(0.95)
            out.append(Interval(b.time, None if queue.mean is None else queue.mean * 1000,
                                None if p95 is None else p95 * 1000, batch.mean, step.mean, b.queue_depth))
        return out

    def whole_run(self) -> Interval | None:
        """The same figures over the whole run (first to last sample)."""
        if len(self.samples) < 2:
            return None
        return ServerMetrics([self.samples[0], self.samples[-1]]).intervals()[0]

    def to_json(self) -> dict[str, Any]:
        return {"samples": [asdict(s) for s in self.samples]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServerMetrics:
        def histogram(h: dict[str, Any]) -> Histogram:
            return Histogram({float(b): float(c) for b, c in h["buckets"].items()}, float(h["sum"]),
                             float(h["count"]))

        return cls([Sample(float(s["time"]), histogram(s["queue_wait"]), histogram(s["batch_size"]),
                           histogram(s["step_sentences"]), float(s["queue_depth"])) for s in data["samples"]])


def parse(text: str, now: float) -> Sample | None:
    """One sample from the text exposition format, or None when it has none of mtgate's batching metrics (raises
    ``MetricsUnavailable`` when the text is not that format)."""
    return sample_of(parse_families(text), now)


def sample_of(families: Iterable[Metric], now: float) -> Sample | None:
    """One sample from a ``/metrics``' families, or None when they hold none of mtgate's batching metrics."""
    buckets: dict[str, dict[float, float]] = {QUEUE: {}, BATCH: {}, STEP: {}}
    sums: dict[str, float] = dict.fromkeys(buckets, 0.0)
    counts: dict[str, float] = dict.fromkeys(buckets, 0.0)
    depth, seen = 0.0, False
    for family in families:
        if family.name == DEPTH:
            depth += sum(s.value for s in family.samples)
        if family.name not in buckets:
            continue
        seen = True
        for s in family.samples:
            if s.name.endswith("_bucket"):
                bound = float(s.labels["le"])
                buckets[family.name][bound] = buckets[family.name].get(bound, 0.0) + s.value
            elif s.name.endswith("_sum"):
                sums[family.name] += s.value
            elif s.name.endswith("_count"):
                counts[family.name] += s.value
    if not seen:
        return None
    queue, batch, step = (Histogram(buckets[n], sums[n], counts[n]) for n in (QUEUE, BATCH, STEP))
    return Sample(now, queue, batch, step, depth)


def scrape_once(host: str, timeout_s: float = 2.0) -> Sample | None:
    """One sample of ``host``'s ``/metrics``, or None when it does not answer with mtgate's metrics."""
    try:
        return sample_of(read_metrics(host, timeout_s), time.time())
    except MetricsUnavailable:
        return None


@contextmanager
def scraping(host: str, interval_s: float = INTERVAL_S) -> Iterator[ServerMetrics]:
    """Scrape ``host`` every ``interval_s`` in a thread while the block runs (and once more at its end)."""
    metrics = ServerMetrics()
    stop = threading.Event()

    def loop() -> None:
        while True:
            sample = scrape_once(host)
            if sample is not None:
                metrics.samples.append(sample)
            if stop.wait(interval_s):
                return

    thread = threading.Thread(target=loop, name="metrics-scraper", daemon=True)
    thread.start()
    try:
        yield metrics
    finally:
        stop.set()
        thread.join(timeout=10)
        if (last := scrape_once(host)) is not None:
            metrics.samples.append(last)


def write(path: Path, metrics: ServerMetrics) -> None:
    from serving.package.files import atomic_write_text

    atomic_write_text(path, json.dumps(metrics.to_json()) + "\n")


def read(path: Path) -> ServerMetrics | None:
    """The samples a run wrote, or None when it wrote none (an older run, or a server without the metrics)."""
    if not path.exists():
        return None
    try:
        return ServerMetrics.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("%s: unreadable server metrics (%s)", path, e)
        return None
