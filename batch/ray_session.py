"""The Ray a ``batch-score --ray`` run uses (``batch.ray_runner`` runs the job on it): a local Ray started here, the
Ray job's cluster (``$RAY_ADDRESS``), the cluster running on this machine (``auto``) or one at ``HOST:PORT`` /
``ray://HOST:PORT``; an address nothing listens at fails in seconds, not after Ray's minutes of retries. Also how
many actors x threads its CPUs hold, and Ray Data's console output kept quiet.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# Ray binds to the node's address, not loopback, unless it runs single-node as on macOS: a Ray started by batch-score
# is for this machine only, so it listens on 127.0.0.1 (set before ray is imported).
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayUnavailable(Exception):
    """Ray cannot be started or reached (the message says which address and why)."""


@dataclass(frozen=True)
class RaySession:
    """The Ray this run uses; ``started``: when the command began to start or join it (``time.monotonic()``)."""

    address: str
    dashboard_url: str | None
    cpus: int
    started_here: bool
    started: float = 0.0

    def describe(self) -> dict[str, Any]:
        return {"address": self.address, "dashboard": self.dashboard_url, "cluster_cpus": self.cpus,
                "started_here": self.started_here}


def connect(address: str | None, cores: int, debug: bool = False) -> RaySession:
    """Start a local Ray (``address`` None or ``local``, unless ``$RAY_ADDRESS`` names one: inside a Ray job) or
    connect to one (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``).

    Raises:
        RayUnavailable: it cannot be started or reached.
    """
    started = time.monotonic()
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    local = address == "local"
    if local or _is_loopback(address):
        os.environ.setdefault(_LOOPBACK_ENV, "0")  # else Ray would look for a loopback cluster at the node's address
    if not local and address != "auto":
        _check_reachable(address)
    import ray

    kwargs: dict[str, Any] = {"address": address, "log_to_driver": debug, "namespace": "mtgate-batch-score",
                              "logging_level": logging.DEBUG if debug else logging.ERROR}
    if local:
        kwargs["num_cpus"] = cores
    try:
        context = ray.init(**kwargs)
    except Exception as e:  # ConnectionError, RuntimeError, ValueError: Ray's own words, on one line
        raise RayUnavailable(f"cannot {'start Ray' if local else f'connect to Ray at {address}'}: "
                             f"{first_line(e)}") from e
    _quiet_ray_data(debug)
    dashboard = getattr(context, "dashboard_url", "") or None
    if dashboard and "://" not in dashboard:
        dashboard = f"http://{dashboard}"
    resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    cpus = int(resources.get("CPU", 0))
    gcs = getattr(context, "address_info", {}).get("gcs_address") or address
    return RaySession(str(gcs), dashboard, cpus, local, started)


def _host_port(address: str) -> tuple[str, int]:
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


def _is_loopback(address: str) -> bool:
    if address in ("local", "auto"):
        return False
    host = _host_port(address)[0]
    return host == "localhost" or host == "::1" or host.startswith("127.")


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail in seconds on an address nothing listens at (Ray itself retries for minutes)."""
    try:
        host, port = _host_port(address)
        socket.create_connection((host, port), timeout=timeout).close()
    except (OSError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise RayUnavailable(f"cannot connect to Ray at {address}: {reason}") from e


def shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def plan_actors(workers: int | None, threads: int | None, cpus: int) -> tuple[int, int]:
    """(actors, threads per actor): by default every CPU of the cluster, one runtime thread per actor."""
    threads = threads or 1
    actors = workers or max(1, cpus // threads)
    if actors * threads > cpus:
        logger.warning("%d actor(s) x %d thread(s) need %d CPUs and the Ray cluster has %d: the others wait for "
                       "CPUs (an autoscaling cluster adds nodes)", actors, threads, actors * threads, cpus)
    return actors, threads


def _quiet_ray_data(debug: bool) -> None:
    """Ray Data's own progress bars and INFO log stay off the console: batch-score shows its own progress."""
    from ray.data import DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    if not debug:
        logging.getLogger("ray").setLevel(logging.ERROR)
        # Ray Data logs a failed task's whole traceback (over a hundred lines) before raising it: batch-score
        # reports the failure in one line (--log-level DEBUG shows Ray Data's log).
        logging.getLogger("ray.data").setLevel(logging.CRITICAL)


def first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
