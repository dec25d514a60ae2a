"""Triton's metric names on ``/metrics``, beside mtgate's own, so that dashboards, alerts and autoscaling recipes
written for Triton read mtgate unchanged.

Per served model and version (labels ``model`` and ``version``), from the version's Triton statistics
(``serving.server.statistics``: the same numbers ``/v2/models/{name}/stats`` answers, in microseconds instead of
nanoseconds): ``nv_inference_request_success`` / ``_failure`` (requests), ``nv_inference_count`` (sentences),
``nv_inference_exec_count`` (engine batches), the cumulative ``nv_inference_request_duration_us``,
``nv_inference_queue_duration_us``, ``nv_inference_compute_input_duration_us``,
``nv_inference_compute_infer_duration_us`` and ``nv_inference_compute_output_duration_us`` (of successful
requests), and the gauge ``nv_inference_pending_request_count`` (requests with sentences still waiting for a batch).
A version that is retired or unloaded leaves them, as in Triton.

For the host, as Triton reads them from ``/proc`` (absent where there is none): ``nv_cpu_utilization`` (the busy
share of all CPUs between two scrapes, 0 to 1), ``nv_cpu_memory_total_bytes`` and ``nv_cpu_memory_used_bytes``
(total minus available). Inside a container these are the host's numbers, as Triton's are; the process's own are
``process_cpu_seconds_total`` and ``process_resident_memory_bytes`` (``serving.server.metrics``).

Triton's counters have no ``_total`` suffix, which prometheus_client adds to every counter it renders, so these
families are written here in the text format (0.0.4) that Prometheus scrapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serving.server.statistics import ModelStatistics

_US_PER_NS = 1e-3

# (name, help, the value in a model_stats entry of serving.server.statistics)
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("nv_inference_request_success", "Successful requests (a request of n sentences counts 1)", "success.count"),
    ("nv_inference_request_failure", "Failed requests (a failed batch, a deadline, the server stopping)",
     "fail.count"),
    ("nv_inference_count", "Inferences performed (sentences translated)", "inference_count"),
    ("nv_inference_exec_count", "Model executions (engine batches)", "execution_count"),
    ("nv_inference_request_duration_us", "Cumulative request time in the server of successful requests "
     "(microseconds)", "success.ns"),
    ("nv_inference_queue_duration_us", "Cumulative time requests waited for a batch (microseconds)", "queue.ns"),
    ("nv_inference_compute_input_duration_us", "Cumulative time preparing requests' inputs: tokenizing "
     "(microseconds)", "compute_input.ns"),
    ("nv_inference_compute_infer_duration_us", "Cumulative engine time of requests: search and detokenizing "
     "(microseconds)", "compute_infer.ns"),
    ("nv_inference_compute_output_duration_us", "Cumulative time preparing outputs (0: the engine's outputs are "
     "text already) (microseconds)", "compute_output.ns"),
)
_PENDING = ("nv_inference_pending_request_count", "Requests with sentences waiting for a batch")


def _value(entry: dict[str, Any], path: str) -> float:
    if "." not in path:
        return float(entry[path])
    duration, field = path.split(".")
    value = float(entry["inference_stats"][duration][field])
    return value * _US_PER_NS if field == "ns" else value


def _number(value: float) -> str:
    return repr(float(value))  # finite here: 12.0, 3.5e-05 (Prometheus reads Python's float syntax)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(lines: list[str], name: str, help_text: str, kind: str) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")


def render_triton(served: Sequence[tuple[str, str, ModelStatistics, int]], host: HostCpu) -> str:
    """Triton's families in the text format: per ``(model, version, statistics, pending requests)``, then the host."""
    entries = [(f'{{model="{_escape(model)}",version="{_escape(version)}"}}', statistics.to_json(model, version),
                pending) for model, version, statistics, pending in served]
    lines: list[str] = []
    for name, help_text, path in _COUNTERS:
        _family(lines, name, help_text, "counter")
        lines.extend(f"{name}{labels} {_number(_value(entry, path))}" for labels, entry, _ in entries)
    _family(lines, *_PENDING, "gauge")
    lines.extend(f"{_PENDING[0]}{labels} {_number(pending)}" for labels, _, pending in entries)
    utilization, memory = host.utilization(), host.memory()
    if utilization is not None:
        _family(lines, "nv_cpu_utilization", "Host CPU utilization between two scrapes (0 to 1)", "gauge")
        lines.append(f"nv_cpu_utilization {_number(utilization)}")
    if memory is not None:
        total, used = memory
        _family(lines, "nv_cpu_memory_total_bytes", "Host memory (bytes)", "gauge")
        lines.append(f"nv_cpu_memory_total_bytes {total}")
        _family(lines, "nv_cpu_memory_used_bytes", "Host memory in use: total minus available (bytes)", "gauge")
        lines.append(f"nv_cpu_memory_used_bytes {used}")
    return "\n".join(lines) + "\n"


class HostCpu:
    """The host's CPU utilization and memory from ``/proc/stat`` and ``/proc/meminfo`` (None where unreadable)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._last = self._times()  # the first scrape measures from here (the server's start)
        self._utilization = 0.0

    def _times(self) -> tuple[int, int] | None:
        """(busy, total) CPU time of all CPUs, in clock ticks."""
        try:
            first = (self._proc / "stat").read_text(encoding="ascii").split("\n", 1)[0].split()
        except (OSError, UnicodeDecodeError):
            return None
        if not first or first[0] != "cpu" or len(first) < 5:
            return None
        # user nice system idle iowait irq softirq steal (guest time is already in user and nice)
        ticks = [int(t) for t in first[1:9]]
        idle = sum(ticks[3:5])
        return sum(ticks) - idle, sum(ticks)

    def utilization(self) -> float | None:
        """The busy share of CPU time since the previous call (the last value when no tick passed since)."""
        now = self._times()
        if now is None or self._last is None:
            return None
        busy, total = now[0] - self._last[0], now[1] - self._last[1]
        if total > 0:
            self._utilization = min(1.0, max(0.0, busy / total))
            self._last = now
        return self._utilization

    def memory(self) -> tuple[int, int] | None:
        """(total, used) host memory in bytes; used is total minus available."""
        try:
            lines = (self._proc / "meminfo").read_text(encoding="ascii").splitlines()
        except (OSError, UnicodeDecodeError):
            return None
        kib = {}
        for line in lines:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                kib[key] = int(parts[0])
        if "MemTotal" not in kib or "MemAvailable" not in kib:
            return None
        return kib["MemTotal"] * 1024, (kib["MemTotal"] - kib["MemAvailable"]) * 1024
