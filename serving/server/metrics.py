"""Prometheus metrics of the HTTP server: one registry per app, so that tests and several apps never share counters;
and, from the same batch events, each model's Triton statistics (``serving.server.statistics``).

Names follow Prometheus conventions (``mtgate_..._total`` counters, ``mtgate_..._seconds`` histograms) and mirror
Triton's split: requests by route and status; queue wait vs compute time; batch size (sentences per execution);
queue depth; tokens in and out; dropped work by reason; sentences computed after their deadline; model info (the
versions served: a version retired or unloaded leaves it). Beside them: Triton's own names per model and version
(``serving.server.triton_metrics``), and the process's CPU and memory (prometheus_client's ``process_*``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from serving.server.batching import BatchObserver, BatchStats
from serving.server.statistics import ModelStatistics
from serving.server.triton_metrics import HostCpu, render_triton

logger = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServingMetrics:
    """Every metric of one app, registered in its own :class:`CollectorRegistry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "mtgate_requests_total",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "mtgate_request_duration_seconds",
            "HTTP request duration until the response is complete",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge("mtgate_inflight_requests", "inference requests being served", registry=r)
        self.queue_seconds = Histogram(
            "mtgate_queue_wait_seconds",
            "time a sentence waits in the batch queue before its batch runs",
            ["model"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.compute_seconds = Histogram(
            "mtgate_batch_compute_seconds",
            "engine time per batch (tokenize, decode, detokenize)",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "mtgate_batch_size", "sentences per engine batch", ["model"], buckets=_BATCH_BUCKETS, registry=r
        )
        self.batches = Counter("mtgate_batches_total", "engine batches run", ["model", "outcome"], registry=r)
        self.step_sentences = Histogram(
            "mtgate_step_sentences",
            "sentences in flight at each decoder step (step-level batching only)",
            ["model"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("mtgate_queue_depth", "sentences waiting in the batch queue", ["model"], registry=r)
        self.dropped = Counter(
            "mtgate_dropped_sentences_total",
            "sentences refused, removed from the queue or stopped while decoding, by reason (overloaded, deadline, "
            "cancelled, failed, shutdown; abandoned: stopped between decoder steps, deadline passed or client gone)",
            ["model", "reason"],
            registry=r,
        )
        self.late = Counter(
            "mtgate_late_sentences_total",
            "sentences computed but done after their request's deadline (wasted work)",
            ["model"],
            registry=r,
        )
        self.sentences = Counter("mtgate_sentences_total", "sentences translated", ["model"], registry=r)
        self.input_tokens = Counter("mtgate_input_tokens_total", "source tokens translated", ["model"], registry=r)
        self.output_tokens = Counter("mtgate_output_tokens_total", "target tokens generated", ["model"], registry=r)
        self.model_info = Gauge(
            "mtgate_model_info", "loaded models (value 1)", ["model", "version", "runtime", "precision"], registry=r
        )
        self.model_load_seconds = Gauge(
            "mtgate_model_load_seconds", "time to load and warm up a model", ["model"], registry=r
        )
        self.ready = Gauge(
            "mtgate_ready", "1 when every model is loaded and warm and the server is not draining", registry=r
        )
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, ... (Linux)
        self.served: dict[tuple[str, str], Served] = {}  # the versions served, by model and version
        self.host = HostCpu()

    def observer(self, model: str, statistics: ModelStatistics) -> BatchObserver:
        """A batch observer that records the batcher's events under ``model`` (and in ``statistics``, its version's
        Triton statistics)."""
        return _ModelObserver(self, model, statistics)

    def publish(self, served: Served) -> None:
        """A version is loaded and serves: its ``mtgate_model_info`` and Triton series appear."""
        self.served[(served.model, served.version)] = served
        self.model_info.labels(served.model, served.version, served.runtime, served.precision).set(1)

    def withdraw(self, served: Served) -> None:
        """A version no longer serves (retired by the version policy, unloaded, or failed): its series leave (those of
        a newer load of the same version stay)."""
        if self.served.get((served.model, served.version)) is served:
            del self.served[(served.model, served.version)]
            self.model_info.remove(served.model, served.version, served.runtime, served.precision)

    def record_translations(self, model: str, sentences: int, input_tokens: int, output_tokens: int) -> None:
        self.sentences.labels(model).inc(sentences)
        self.input_tokens.labels(model).inc(input_tokens)
        self.output_tokens.labels(model).inc(output_tokens)

    def render(self) -> bytes:
        """The text exposition format of every metric (Triton's names last)."""
        return generate_latest(self.registry) + render_triton(
            [(model, version, s.statistics, s.pending()) for (model, version), s in sorted(self.served.items())],
            self.host,
        ).encode()


@dataclass(eq=False)
class Served:
    """A version being served, as the metrics see it: its labels, its Triton statistics, and how many of its requests
    wait for the engine (read at each scrape)."""

    model: str
    version: str
    runtime: str
    precision: str
    statistics: ModelStatistics
    pending: Callable[[], int]


class _ModelObserver:
    def __init__(self, metrics: ServingMetrics, model: str, statistics: ModelStatistics) -> None:
        self._statistics = statistics
        self._depth = metrics.queue_depth.labels(model)
        self._queue = metrics.queue_seconds.labels(model)
        self._compute = metrics.compute_seconds.labels(model)
        self._size = metrics.batch_size.labels(model)
        self._step = metrics.step_sentences.labels(model)
        self._late = metrics.late.labels(model)
        self._metrics = metrics
        self._model = model
        self._depth.set(0)

    def on_queue_depth(self, depth: int) -> None:
        self._depth.set(depth)

    def on_batch(self, stats: BatchStats) -> None:
        self._statistics.on_batch(stats)
        self._size.observe(stats.size)
        self._compute.observe(stats.compute_s)
        for wait in stats.queue_waits:
            self._queue.observe(wait)
        self._metrics.batches.labels(self._model, "ok" if stats.ok else "error").inc()
        if stats.late:
            self._late.inc(stats.late)
        logger.info(
            "batch model=%s batch_size=%d padded_tokens=%d queue_ms=%.1f infer_ms=%.1f ok=%s request_ids=%s",
            self._model,
            stats.size,
            stats.padded_cost,
            1000 * max(stats.queue_waits, default=0.0),
            1000 * stats.compute_s,
            stats.ok,
            ",".join(stats.tags),
        )

    def on_dropped(self, reason: str, items: int) -> None:
        self._metrics.dropped.labels(self._model, reason).inc(items)

    def on_step(self, sentences: int) -> None:
        self._step.observe(sentences)
