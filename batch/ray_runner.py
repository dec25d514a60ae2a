"""batch-score on Ray Data (``--ray [ADDRESS]``): the same chunks, parsing, commits and assembly as the local runner,
with the translation spread over a pool of Ray actors.

The pipeline (``batch.run_loop`` for every step that decides bytes, so the output is the local runner's, byte for
byte):

    ray.data.read_datasource(ChunkSource)        read tasks on the driver's node: ``batch.run_loop.read_chunks``
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
each input Example as it was. Reads run on the driver's node (only it needs the inputs): a datasource without
distributed reads is pinned there by Ray Data (a ``ray.io/node-id`` label selector; before Ray 2.60, node affinity).
The read tasks get the inputs by absolute path (a Ray worker's working directory is not the command's), and the
entries keep the names the command was given, so rejects read as the local runner's. Before any work,
:func:`check_read_node` has a task on that node look at the inputs: with Ray Client (``ray://``) the driver runs on
the cluster's head, not where the command runs, and inputs that are not there at the same path are a one-line usage
error rather than a failed read task. The actors need the model package at the same path on every node.

Resuming is the local runner's: committed chunks are not read again. A killed actor is restarted by Ray and its
chunks are retried (``max_restarts``/``max_task_retries`` of Ray Data's actor pool); a chunk that arrives twice is
committed once. A killed driver takes a Ray it started with it (Ray's fate sharing), or has its actors stopped by
the cluster; the rerun resumes. A failure in a task's own code (not Ray's: a lost actor or node) is reported as
such, since a rerun would repeat it: :class:`RayFailure` says which. Starting or joining Ray is the run's startup
(``startup_seconds``, as a local run's is its worker's set-up) and part of its ``wall_seconds``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import pickle
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from batch.errors import IOFailure, JobError
from batch.job import EngineConfig, Job
from batch.ray_session import first_line
from batch.run_loop import Bar, Committer, ParsedChunk, parse_chunk, parser_for, read_chunks
from batch.state import ChunkMeta
from batch.workers import LocalChunkWorker, Outcome, Source

logger = logging.getLogger(__name__)

_READ_TASKS_PER_ACTOR = 2

class RayFailure(Exception):
    """The Ray run failed; committed chunks stay. ``resumable``: Ray's own failure (an actor kept dying, the cluster
    went away), which a rerun resumes past; else the code of a task failed, and a rerun would fail the same way."""

    def __init__(self, message: str, resumable: bool = True) -> None:
        super().__init__(message)
        self.resumable = resumable

# ---------------------------------------------------------------------------------------------------------------
# Read: one row per chunk


def _read(job: Job, chunks: list[int], names: dict[str, str]) -> Iterator[Any]:
    """Read task body: the chunks of ``chunks`` (consecutive chunk numbers of the job), one pyarrow row each; each
    entry named by the input's name as the command was given it (``names``: :func:`for_read_tasks`)."""
    import pyarrow as pa

    parser = parser_for(job)
    wanted = set(chunks)
    for chunk, read in read_chunks(job, wanted.__contains__, last=max(chunks)):
        entries = [replace(entry, file=names.get(entry.file, entry.file)) for entry in read]
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


def for_read_tasks(job: Job) -> tuple[Job, dict[str, str]]:
    """``job`` with absolute input, reference and vocabulary paths, as a Ray worker must open them (its working
    directory is not the command's), and each input's name as given, by its absolute one."""
    inputs = [replace(item, path=item.path.absolute(),
                      references=item.references.absolute() if item.references is not None else None)
              for item in job.inputs]
    names = {str(new.path): str(old.path) for new, old in zip(inputs, job.inputs, strict=True)}
    return replace(job, inputs=inputs, vocab=job.vocab.absolute() if job.vocab is not None else None), names


def _input_files(job: Job) -> list[str]:
    files = [str(path) for item in job.inputs for path in (item.path, item.references) if path is not None]
    return files + ([str(job.vocab)] if job.vocab is not None else [])


def _sizes(paths: list[str]) -> dict[str, int | None]:
    """(On the read node) each file's size, None for one that is not there or not readable."""
    sizes: dict[str, int | None] = {}
    for path in paths:
        sizes[path] = os.stat(path).st_size if os.access(path, os.R_OK) and os.path.isfile(path) else None
    return sizes


def check_read_node(job: Job) -> None:
    """Before any work: the node the read tasks run on (the driver's) holds the inputs as this command sees them.

    Raises:
        JobError: an input is not there (with Ray Client, ``ray://``, reads run on the cluster's head), or differs.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    absolute, _ = for_read_tasks(job)
    here = {path: os.stat(path).st_size for path in _input_files(absolute)}
    node = ray.get_runtime_context().get_node_id()
    pinned = NodeAffinitySchedulingStrategy(node, soft=False)  # where Ray Data pins reads (see the docstring)
    look = ray.remote(num_cpus=0, max_retries=0, scheduling_strategy=pinned)(_sizes)  # type: ignore[call-overload]
    try:
        there = ray.get(look.remote(list(here)))
    except Exception as e:
        if type(e).__module__.split(".")[0] != "ray":
            raise
        _raise_ray_failure(e)
    wrong = [path for path, size in here.items() if there.get(path) != size]
    if wrong:
        state = "is not there" if there.get(wrong[0]) is None else "differs (another size)"
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise JobError(f"{wrong[0]}{more}: Ray reads the inputs on node {node[:12]}, where it {state}; with "
                       "ray://HOST:PORT the reads run on the cluster: put the inputs at the same path on a volume it "
                       "shares, or run batch-score on a node of the cluster (--ray auto)")


def _datasource(job: Job, todo: list[int], tasks: int, names: dict[str, str]) -> Any:
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class ChunkSource(Datasource):  # type: ignore[misc]
        """The chunks still to translate, read and parsed by batch.run_loop in read tasks on the driver's node."""

        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]

        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                           data_context: Any = None) -> list[ReadTask]:
            out = []
            for group in _groups(todo, tasks):
                meta = BlockMetadata(num_rows=len(group), size_bytes=None, input_files=None, exec_stats=None)
                out.append(ReadTask(functools.partial(_read, job, group, names), meta))
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
    """``batch.run_loop.ChunkRunner`` on Ray Data: read tasks, an actor pool, commits on the driver."""

    def __init__(self, engine: EngineConfig, actors: int, threads: int, debug: bool = False,
                 started: float | None = None) -> None:
        self.engine = replace(engine, workers=actors, threads=threads, checked=engine.options())
        self.actors = actors
        self.threads = threads
        self.debug = debug  # Ray's own log on the console too
        self.started = started  # when Ray was started or joined (RaySession.started)

    def __call__(self, job: Job, done: dict[int, ChunkMeta], committer: Committer, bar: Bar,
                 owned: int | None) -> int:
        import ray.data

        assert owned is not None
        # The run began when Ray was being started or joined: that is its startup (as a local run's is the worker's
        # set-up), and part of its wall time. The actors' start and the package's load count as the local workers'.
        stats = committer.stats
        if self.started is not None and self.started < stats.started:
            stats.startup += stats.started - self.started
            stats.started = self.started
        n_chunks = math.ceil(owned / job.chunk_size)
        todo = [c for c in range(n_chunks) if c not in done]
        if not todo:
            return n_chunks
        tasks = min(len(todo), _READ_TASKS_PER_ACTOR * self.actors)
        # Reads take no CPU of their own (the actors hold them all; a read is a small part of a chunk's work) and
        # run one at a time, in input order.
        read_job, names = for_read_tasks(job)
        dataset = ray.data.read_datasource(_datasource(read_job, todo, tasks, names), num_cpus=0, concurrency=1)
        dataset = dataset.map_batches(ChunkTranslator, fn_constructor_kwargs={"config": self.engine}, batch_size=1,
                                      batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=self.actors),
                                      num_cpus=self.threads)
        committed: set[int] = set()
        try:
            with _without_benign_native_log(not self.debug):
                self._commit_rows(dataset, committed, committer, bar)
        except Exception as e:
            if type(e).__module__.split(".")[0] != "ray":
                raise
            _raise_ray_failure(e)
        missing = sorted(set(todo) - committed)
        if missing:
            raise RayFailure(f"Ray Data delivered no result for chunk(s) {missing[:5]}")
        return n_chunks

    @staticmethod
    def _commit_rows(dataset: Any, committed: set[int], committer: Committer, bar: Bar) -> None:
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
                logger.info("first chunk after %.1f s (Ray, actors started, package loaded)",
                            time.monotonic() - committer.stats.started)
            committer.commit(item, outcomes)
            committed.add(chunk)
            bar.update(len(item.entries))


def _raise_ray_failure(e: BaseException) -> None:
    """Raise what a Ray error stands for: the error of our own that a task raised when batch-score knows it (an
    input that cannot be read, a package that cannot be loaded), else :class:`RayFailure`, resumable unless the
    code of a task failed (a rerun would repeat it)."""
    from serving.package import PackageError

    inner = _innermost(e)
    if isinstance(inner, IOFailure | PackageError | JobError):
        raise inner from e
    own_code = not type(inner).__module__.startswith("ray") or type(e).__name__ == "UnserializableException"
    raise RayFailure(_ray_reason(e), resumable=not own_code) from e


def _innermost(e: BaseException) -> BaseException:
    seen: set[int] = set()
    inner: BaseException = e
    while id(inner) not in seen:
        seen.add(id(inner))
        cause = getattr(inner, "cause", None) or inner.__cause__
        if not isinstance(cause, BaseException):
            break
        inner = cause
    return inner


def _ray_reason(e: BaseException) -> str:
    """The innermost cause of a Ray error, on one line (Ray's own messages hold whole tracebacks)."""
    inner = _innermost(e)
    if inner is e:
        return f"{type(e).__name__}: {first_line(e)}"
    return f"{type(e).__name__} ({type(inner).__name__}: {first_line(inner)})"
