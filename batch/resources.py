"""Resource planning: how many worker processes and runtime threads each, from the cores and memory this process
may use (its CPU affinity and cgroup v2 limits, as in a container) and the size of one loaded model."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def available_cores() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota (containers)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def available_memory() -> int | None:
    """Bytes this process can still use: the cgroup v2 limit minus usage, else MemAvailable; None if unknown."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            return max(0, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def plan_parallelism(workers: int | None, threads: int | None, cores: int, per_worker_bytes: int | None = None,
                     memory: int | None = None) -> tuple[int, int]:
    """(workers, threads per worker): every core by default, without oversubscribing them.

    Each worker process holds its own copy of the model, so the default is also capped so that the workers fit in
    80% of the available memory (``per_worker_bytes``: what one loaded model costs, roughly).
    """
    if workers is None:
        workers = cores
        if per_worker_bytes and memory is not None:
            fits = max(1, int(memory * 0.8) // per_worker_bytes)
            if fits < workers:
                logger.warning("%d worker(s) instead of %d: each needs about %d MB and %d MB are available",
                               fits, workers, per_worker_bytes >> 20, memory >> 20)
                workers = fits
    if threads is None:
        threads = max(1, cores // workers)
    return workers, threads


def model_bytes(model_dir: Path, manifest: dict[str, Any], runtime: str, precision: str) -> int:
    """Rough memory of one loaded model: its graph files and a half again for the runtime's own buffers."""
    from serving.package import find_artifact

    artifact = find_artifact(manifest, runtime, precision)
    size = 0
    for rel in (artifact.encoder, artifact.decoder):
        path = model_dir / rel
        size += sum(p.stat().st_size for p in (path, path.with_suffix(".bin")) if p.is_file())
    return int(size * 1.5)
