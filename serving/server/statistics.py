"""Triton's statistics extension (``GET /v2/models[/{name}[/versions/{v}]]/stats``): per model, cumulative counts
and nanoseconds, in the JSON Triton serves, so that ``perf_analyzer``'s "Server:" section and tritonclient's
``get_inference_statistics`` read mtgate as they read Triton.

What each duration holds here (Triton's names; each a ``{"count", "ns"}`` pair, ``count`` in requests; the
durations after ``fail`` are those of the successful requests, as perf_analyzer divides them by their count):

- ``success`` / ``fail``: requests admitted to the model that completed / failed (a failed batch, a deadline, the
  server stopping), with their time from admission (before tokenizing) to the result;
- ``compute_input``: tokenizing and checking the request's sentences;
- ``queue``: the time its sentences waited for a batch (a request of several sentences counts their mean);
- ``compute_infer``: the engine time of the batches its sentences ran in (the search and detokenizing, which the
  engine does in the batch), again the mean over its sentences;
- ``compute_output``: 0 ns: the outputs leave the engine as text, so there is no separate output step to time.

They are the model's, not a protocol's: every translation request of the model counts, whichever route or transport
sent it (``/v1``, its stream and bulk lines, ``/v2``, gRPC), as Triton counts a model's inference requests from
every frontend (HTTP, gRPC, SageMaker, Vertex AI, the C API); ``/metrics`` has the counts per route.

``inference_count`` counts sentences and ``execution_count`` engine batches (with ``--batching step``: groups of
sentences that joined the running batch together); ``batch_stats`` has one entry per batch size.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from serving.server.batching import BatchStats

_NS = 1e9


@dataclass
class _Duration:
    count: int = 0
    ns: float = 0.0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += seconds * _NS

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": int(self.ns)}


class ModelStatistics:
    """The cumulative statistics of one model; fed by its batcher (batches) and the service (requests)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.success = _Duration()
        self.fail = _Duration()
        self.compute_input = _Duration()
        self.queue = _Duration()
        self.compute_infer = _Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self._batches: dict[int, _Duration] = {}  # batch size -> executions and their engine time

    def on_batch(self, stats: BatchStats) -> None:
        """One engine batch has run: its sentences' queue waits and their share of the batch's time."""
        with self._lock:
            self.execution_count += 1
            self.inference_count += stats.size
            self.last_inference_ms = int(time.time() * 1000)
            self._batches.setdefault(stats.size, _Duration()).add(stats.compute_s)
            self.queue.ns += sum(wait * share for wait, share in zip(stats.queue_waits, stats.shares, strict=True)) * _NS
            self.compute_infer.ns += stats.compute_s * sum(stats.shares) * _NS

    def on_request(self, ok: bool, total_s: float, input_s: float) -> None:
        """A request admitted to the model is done: ``total_s`` from admission, ``input_s`` of it tokenizing."""
        with self._lock:
            if not ok:
                self.fail.add(total_s)
                return
            self.success.add(total_s)
            self.compute_input.add(input_s)
            self.queue.count += 1  # the batches added its sentences' time; the request is counted when it is done
            self.compute_infer.count += 1

    def to_json(self, name: str, version: str) -> dict[str, Any]:
        """One entry of Triton's ``model_stats``."""
        with self._lock:
            zero = _Duration(self.success.count, 0.0).to_json()
            return {
                "name": name,
                "version": version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {
                    "success": self.success.to_json(),
                    "fail": self.fail.to_json(),
                    "queue": self.queue.to_json(),
                    "compute_input": self.compute_input.to_json(),
                    "compute_infer": self.compute_infer.to_json(),
                    "compute_output": zero,
                    "cache_hit": _Duration().to_json(),
                    "cache_miss": _Duration().to_json(),
                },
                "batch_stats": [
                    {"batch_size": size, "compute_input": _Duration(d.count).to_json(), "compute_infer": d.to_json(),
                     "compute_output": _Duration(d.count).to_json()}
                    for size, d in sorted(self._batches.items())
                ],
                "memory_usage": [],
            }
