"""batch-score on Ray Data (``--ray [ADDRESS]``): the same chunks, parsing, commits and assembly as the local runner,
with the translation spread over a pool of Ray actors.

The pipeline (``batch.runner`` for every step that decides bytes, so the output is the local runner's, byte for
byte):

    ray.data.read_datasource(ChunkSource)        read tasks on the driver's node: ``batch.runner.read_chunks``
        |  one row per chunk: its sources,        (mtgate's framing: corrupt TFRecords, positions and the input
        |  the parsed chunk (pickled)             hash of each chunk) and ``parse_chunk`` (the T2T id schema, rejects)
        v
    .map_batches(ChunkTranslator, batch_size=1,  one chunk per call; each actor loads the package once
                 compute=ActorPoolStrategy(size=N), num_cpus=threads)
        v
    driver: iter_rows() -> Committer.commit       every chunk committed (written as its own shard file) as it arrives
        v
    batch.assembly.assemble                       the shards merged in input order, rejects, summary and scores

Ray's own readers (``read_tfrecords``, ``read_text``, ``read_json``) do not fit: they stop at a corrupt record
instead of rejecting it, number no record positions, and decode Examples into columns, whereas the output carries
each input Example as it was. Reads run on the driver's node (only it needs the inputs); the actors need the model
package at the same path on every node.

Resuming is the local runner's: committed chunks are not read again. A killed actor is restarted by Ray and its
chunks are retried (``max_restarts``/``max_task_retries`` of Ray Data's actor pool); a chunk that arrives twice is
committed once. A killed driver takes a Ray it started with it (Ray's fate sharing), or has its actors stopped by
the cluster; the rerun resumes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import pickle
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from batch.job import EngineConfig, Job
from batch.runner import Bar, Committer, ParsedChunk, parse_chunk, parser_for, read_chunks
from batch.state import ChunkMeta
from batch.workers import LocalChunkWorker, Outcome, Source

logger = logging.getLogger(__name__)

# Ray binds to the node's address, not loopback, unless it runs single-node as on macOS: a Ray started by batch-score
# is for this machine only, so it listens on 127.0.0.1 (set before ray is imported).
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_READ_TASKS_PER_ACTOR = 2


class RayUnavailable(Exception):
    """Ray cannot be started or reached (the message says which address and why)."""


class RayFailure(Exception):
    """The Ray run failed (an actor kept dying, the cluster went away): committed chunks stay for the rerun."""


@dataclass(frozen=True)
class RaySession:
    """The Ray this run uses."""

    address: str
    dashboard_url: str | None
    cpus: int
    started_here: bool

    def describe(self) -> dict[str, Any]:
        return {"address": self.address, "dashboard": self.dashboard_url, "cluster_cpus": self.cpus,
                "started_here": self.started_here}


def connect(address: str | None, cores: int, debug: bool = False) -> RaySession:
    """Start a local Ray (``address`` None or ``local``, unless ``$RAY_ADDRESS`` names one: inside a Ray job) or
    connect to one (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``).

    Raises:
        RayUnavailable: it cannot be started or reached.
    """
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
                             f"{_first_line(e)}") from e
    _quiet_ray_data(debug)
    dashboard = getattr(context, "dashboard_url", "") or None
    if dashboard and "://" not in dashboard:
        dashboard = f"http://{dashboard}"
    resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    cpus = int(resources.get("CPU", 0))
    gcs = getattr(context, "address_info", {}).get("gcs_address") or address
    return RaySession(str(gcs), dashboard, cpus, local)


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
        for name in ("ray", "ray.data"):
            logging.getLogger(name).setLevel(logging.ERROR)


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


# ---------------------------------------------------------------------------------------------------------------
# Read: one row per chunk


def _read(job: Job, chunks: list[int]) -> Iterator[Any]:
    """Read task body: the chunks of ``chunks`` (consecutive chunk numbers of the job), one pyarrow row each."""
    import pyarrow as pa

    parser = parser_for(job)
    wanted = set(chunks)
    for chunk, entries in read_chunks(job, wanted.__contains__, last=max(chunks)):
        item = parse_chunk(parser, chunk, entries)
        yield pa.table({"chunk": pa.array([chunk], pa.int64()),
                        "sources": pa.array([_pickled(item.sources(job))], pa.large_binary()),
                        "payload": pa.array([_pickled(item)], pa.large_binary())})


def _pickled(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _groups(todo: list[int], tasks: int) -> list[list[int]]:
    """``todo`` cut into at most ``tasks`` runs of consecutive items (each read task scans to its first chunk)."""
    size = math.ceil(len(todo) / max(1, tasks))
    return [todo[i:i + size] for i in range(0, len(todo), size)]


def _datasource(job: Job, todo: list[int], tasks: int) -> Any:
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class ChunkSource(Datasource):  # type: ignore[misc]
        """The chunks still to translate, read and parsed by batch.runner in read tasks on the driver's node."""

        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]

        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                           data_context: Any = None) -> list[ReadTask]:
            out = []
            for group in _groups(todo, tasks):
                meta = BlockMetadata(num_rows=len(group), size_bytes=None, input_files=None, exec_stats=None)
                out.append(ReadTask(functools.partial(_read, job, group), meta))
            return out

        @property
        def supports_distributed_reads(self) -> bool:
            return False  # only the driver's node needs the inputs

    return ChunkSource()


# ---------------------------------------------------------------------------------------------------------------
# Translate: the actors


class ChunkTranslator:
    """A Ray Data actor: loads the package once and translates one chunk per call (``LocalChunkWorker``, so the
    batches of a chunk are those of the local runner). A package it cannot load is reported, not raised: the driver
    turns it into the same usage error as locally."""

    def __init__(self, config: EngineConfig) -> None:
        from serving.package import PackageError

        self.worker: LocalChunkWorker | None = None
        self.error: str | None = None
        try:
            self.worker = LocalChunkWorker.load(config)
        except PackageError as e:
            self.error = str(e)

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        chunks, outcomes, errors = [], [], []
        for chunk, pickled in zip(batch.column("chunk").to_pylist(), batch.column("sources").to_pylist(),
                                  strict=True):
            sources: list[Source] = pickle.loads(pickled)  # text, or ids (Job.source_ids)
            result: list[Outcome] = []
            if self.worker is not None and sources:
                result = self.worker.translate_chunk(sources, _no_progress)
            chunks.append(chunk)
            outcomes.append(_pickled(result))
            errors.append(self.error)
        return pa.table({"chunk": pa.array(chunks, pa.int64()), "outcomes": pa.array(outcomes, pa.large_binary()),
                         "payload": batch.column("payload"), "error": pa.array(errors, pa.string())})


def _no_progress(_n: int) -> None:
    pass


# ---------------------------------------------------------------------------------------------------------------
# The driver


# Ray's core worker logs this at ERROR for every Ray Data actor pool (Ray Data passes the actors' arguments by
# reference; ray-project/ray#53727); it is not an error of the run, so it does not reach the console.
_BENIGN_NATIVE_LOG = re.compile(rb"^\[[^]]* E \d+ \d+\] core_worker\.cc:\d+: Actor with class name: .* has constructor "
                                rb"arguments in the object store and max_restarts > 0\.")


@contextlib.contextmanager
def _without_benign_native_log(enabled: bool) -> Iterator[None]:
    """While the block runs, this process's stderr (fd 2, where Ray's C++ logging writes) passes through a filter
    that drops :data:`_BENIGN_NATIVE_LOG` and forwards every other line as it comes."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    original = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward() -> None:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            pending = b""
            while block := pipe.read(65536):
                pending += block
                *lines, pending = pending.split(b"\n")
                kept = b"".join(line + b"\n" for line in lines if not _BENIGN_NATIVE_LOG.match(line))
                if pending and not _BENIGN_NATIVE_LOG.match(pending) and not pending.startswith(b"["):
                    kept, pending = kept + pending, b""  # a progress bar's line without its newline yet
                if kept:
                    os.write(original, kept)
            if pending:
                os.write(original, pending)

    thread = threading.Thread(target=forward, name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # the pipe's last writer goes: the thread drains it and ends
        thread.join(timeout=10)
        os.close(original)


class RayChunks:
    """``batch.runner.ChunkRunner`` on Ray Data: read tasks, an actor pool, commits on the driver."""

    def __init__(self, engine: EngineConfig, actors: int, threads: int, debug: bool = False) -> None:
        self.engine = replace(engine, workers=actors, threads=threads)
        self.actors = actors
        self.threads = threads
        self.debug = debug  # Ray's own log on the console too

    def __call__(self, job: Job, done: dict[int, ChunkMeta], committer: Committer, bar: Bar,
                 owned: int | None) -> int:
        import ray.data

        assert owned is not None
        n_chunks = math.ceil(owned / job.chunk_size)
        todo = [c for c in range(n_chunks) if c not in done]
        if not todo:
            return n_chunks
        tasks = min(len(todo), _READ_TASKS_PER_ACTOR * self.actors)
        # Reads take no CPU of their own (the actors hold them all; a read is a small part of a chunk's work) and
        # run one at a time, in input order.
        dataset = ray.data.read_datasource(_datasource(job, todo, tasks), num_cpus=0, concurrency=1)
        dataset = dataset.map_batches(ChunkTranslator, fn_constructor_kwargs={"config": self.engine}, batch_size=1,
                                      batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=self.actors),
                                      num_cpus=self.threads)
        committed: set[int] = set()
        t0 = time.monotonic()
        try:
            with _without_benign_native_log(not self.debug):
                self._commit_rows(dataset, committed, committer, bar, t0)
        except Exception as e:
            if type(e).__module__.split(".")[0] != "ray":
                raise
            raise RayFailure(_ray_reason(e)) from e
        missing = sorted(set(todo) - committed)
        if missing:
            raise RayFailure(f"Ray Data delivered no result for chunk(s) {missing[:5]}")
        return n_chunks

    @staticmethod
    def _commit_rows(dataset: Any, committed: set[int], committer: Committer, bar: Bar, t0: float) -> None:
        """Commit every chunk the dataset delivers, once each, as it arrives."""
        for row in dataset.iter_rows():
            chunk = int(row["chunk"])
            if row["error"]:
                from serving.package import PackageError

                raise PackageError(row["error"])
            if chunk in committed:  # a retried read or task delivered it again
                continue
            item: ParsedChunk = pickle.loads(row["payload"])
            outcomes: list[Outcome] = pickle.loads(row["outcomes"])
            if not committed:
                logger.info("first chunk after %.1f s (actors started, package loaded)", time.monotonic() - t0)
            committer.commit(item, outcomes)
            committed.add(chunk)
            bar.update(len(item.entries))


def _ray_reason(e: BaseException) -> str:
    """The innermost cause of a Ray error, on one line (Ray's own messages hold whole tracebacks)."""
    seen: set[int] = set()
    inner: BaseException = e
    while id(inner) not in seen:
        seen.add(id(inner))
        cause = getattr(inner, "cause", None) or inner.__cause__
        if not isinstance(cause, BaseException):
            break
        inner = cause
    if inner is e:
        return f"{type(e).__name__}: {_first_line(e)}"
    return f"{type(e).__name__} ({type(inner).__name__}: {_first_line(inner)})"
