"""The sharded, resumable batch-score runner.

The records a shard owns (global index ``i`` with ``i % num_shards == shard_index``) are cut into chunks of
``chunk_size`` consecutive records. A chunk is the unit of work and of commit:

- one worker translates a whole chunk: it sorts the chunk's sources by token length and cuts them into batches of at
  most ``max_tokens`` padded source tokens, so batch composition depends only on the chunk's content;
- the parent writes the chunk's output items to ``<state>/NNNNNN.data`` and then, as the commit point, its record
  (``NNNNNN.json``: counts, rejects, hypotheses and references for scoring), each through a temporary file and an
  atomic rename;
- once every chunk is committed, the parent concatenates the data files into the output (again through a temporary
  file and a rename), writes the rejects file and summary.json, and removes the state directory.

Killed at any moment and rerun with the same command, the runner finds the committed chunks, translates only the
others, and writes the same bytes as an uninterrupted run. The state directory (``<output>.partial``) holds a job
fingerprint so that a different command does not reuse it by mistake.

Workers: in process (one worker: a thread next to the reader), N spawned processes each with its own Translator
(threads per worker chosen so cores are not oversubscribed), or N threads talking to a server (``batch.remote``).
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import fcntl
import hashlib
import json
import logging
import math
import multiprocessing
import os
import queue
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from batch import scoring
from batch.records import (
    Entry,
    Format,
    InputFile,
    IOFailure,
    OutputEncoder,
    Record,
    RecordParser,
    Reject,
    Schema,
    Translated,
    encode_items,
    load_vocab,
    scan,
)
from serving.files import atomic_write_bytes, atomic_writer

logger = logging.getLogger(__name__)

STATE_SUFFIX = ".partial"
STATE_VERSION = 2  # 2: chunk records carry the sha256 of their input records
Outcome = Translated | str  # a translation, or why the record was rejected


class JobError(Exception):
    """The job cannot run as asked (state of another job in the way, output locked, model missing...)."""


class InputChanged(JobError):
    """The input is not the one the committed chunks were made from."""


# ---------------------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class EngineConfig:
    """How records are translated: a local model package or a server.

    Attributes:
        model_dir: model package for in-process translation.
        runtime: ``onnxruntime`` or ``openvino``.
        precision: ``fp32`` or ``int8``.
        beam_size: beam width (None: the package's default).
        max_length: most generated tokens (None: the package's default).
        max_tokens: most padded source tokens in one batch.
        max_batch_size: most sentences in one batch.
        workers: worker processes (local) or concurrent requests (server).
        threads: runtime threads per worker.
        server: Open Inference Protocol server URL; when set, ``model_dir`` is not used.
        model_name: model name on the server.
    """

    model_dir: Path | None = None
    runtime: str = "onnxruntime"
    precision: str = "fp32"
    beam_size: int | None = None
    max_length: int | None = None
    max_tokens: int = 2048
    max_batch_size: int = 64
    workers: int = 1
    threads: int = 1
    server: str | None = None
    model_name: str | None = None

    def fingerprint(self) -> dict[str, Any]:
        """What changes translations (not workers/threads: a job may resume with other parallelism)."""
        out: dict[str, Any] = {
            "beam_size": self.beam_size,
            "max_length": self.max_length,
            "max_tokens": self.max_tokens,
            "max_batch_size": self.max_batch_size,
        }
        if self.server:
            out |= {"server": self.server, "model_name": self.model_name}
        else:
            assert self.model_dir is not None
            manifest = self.model_dir / "manifest.json"
            digest = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None
            out |= {"model_dir": str(self.model_dir.resolve()), "manifest_sha256": digest, "runtime": self.runtime,
                    "precision": self.precision}
        return out


@dataclass(frozen=True)
class Job:
    """What to read and where to write.

    Attributes:
        inputs: input files, in order.
        schema: where sources and references live.
        vocab: subword vocabulary decoding int64 ids (None when the schema has none).
        output: output file.
        output_format: ``tfrecord``, ``jsonl`` or ``text``.
        rejects: rejects file (JSON lines: index, file, position, reason).
        summary: summary.json path.
        chunk_size: records per chunk (the unit of commit and resume).
        num_shards: how many shards the inputs are split into.
        shard_index: which shard this run handles.
    """

    inputs: list[InputFile]
    schema: Schema
    vocab: Path | None
    output: Path
    output_format: Format
    rejects: Path
    summary: Path
    chunk_size: int = 1000
    num_shards: int = 1
    shard_index: int = 0

    @property
    def state_dir(self) -> Path:
        return self.output.with_name(self.output.name + STATE_SUFFIX)

    def owns(self, index: int) -> bool:
        return index % self.num_shards == self.shard_index

    def chunk_of(self, index: int) -> int:
        return (index // self.num_shards) // self.chunk_size

    def fingerprint(self) -> dict[str, Any]:
        # Paths and sizes only, no mtime: the content itself is checked, chunk by chunk (see ``chunk_digest``), so
        # a rewrite that keeps size and mtime (cp -p, rsync -t, tar) is caught and a mere touch is not refused.
        files = []
        for item in self.inputs:
            for path in (item.path, item.references):
                if path is not None:
                    files.append({"path": str(path.resolve()), "size": path.stat().st_size})
        return {
            "files": files,
            "format": self.inputs[0].format if self.inputs else None,
            "schema": self.schema.to_dict(),
            "vocab": str(self.vocab.resolve()) if self.vocab else None,
            "output_format": self.output_format,
            "chunk_size": self.chunk_size,
            "num_shards": self.num_shards,
            "shard_index": self.shard_index,
        }


# ---------------------------------------------------------------------------------------------------------------
# Batching and chunk workers


def make_batches(lengths: Sequence[int], max_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Length-bucketed batches: positions sorted by length, cut so that ``size * longest <= max_tokens``.

    Deterministic for a given input (ties keep input order), so a resumed run batches a chunk as the first run did.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = max(1, lengths[i])
        grown = max(longest, n)
        if current and (grown * (len(current) + 1) > max_tokens or len(current) >= max_batch_size):
            batches.append(current)
            current, grown = [], n
        current.append(i)
        longest = grown
    if current:
        batches.append(current)
    return batches


Progress = Callable[[int], None]


class ChunkWorker(Protocol):
    """Translates the sources of one chunk; an outcome per source, in order."""

    def translate_chunk(self, sources: list[str], progress: Progress) -> list[Outcome]: ...


class TranslatorLike(Protocol):
    """What the runner needs from ``serving.engine.Translator``."""

    @property
    def info(self) -> Any: ...

    def count_tokens(self, texts: list[str]) -> list[int]: ...

    def translate(self, texts: list[str], options: Any = None) -> list[Any]: ...


class LocalChunkWorker:
    """Runs a chunk through an in-process Translator in length-bucketed batches.

    A source the engine refuses (``serving.errors.ServingError``: too long, invalid) becomes a reject; any other
    exception aborts the run (the chunk is not committed, so a rerun retries it).
    """

    def __init__(self, translator: TranslatorLike, options: Any, max_tokens: int, max_batch_size: int) -> None:
        self.translator = translator
        self.options = options
        self.max_tokens = max_tokens
        self.max_batch_size = max_batch_size

    @classmethod
    def load(cls, config: EngineConfig) -> LocalChunkWorker:
        """Load the package's Translator with ``config.threads`` runtime threads."""
        from serving.engine import DecodeOptions, Translator

        assert config.model_dir is not None
        translator = Translator.load(config.model_dir, runtime=config.runtime, precision=config.precision,
                                     threads=config.threads)
        options = DecodeOptions(beam_size=config.beam_size, max_length=config.max_length)
        return cls(translator, options, config.max_tokens, config.max_batch_size)

    def translate_chunk(self, sources: list[str], progress: Progress) -> list[Outcome]:
        lengths = self.translator.count_tokens(sources)
        limit = getattr(self.translator.info, "max_input_tokens", None)
        outcomes: list[Outcome | None] = [None] * len(sources)
        fits = []
        for i, n in enumerate(lengths):
            if limit and n > limit:
                outcomes[i] = f"source has {n} tokens; the model accepts at most {limit}"
            else:
                fits.append(i)
        if len(fits) < len(sources):
            progress(len(sources) - len(fits))
        for batch in make_batches([lengths[i] for i in fits], self.max_tokens, self.max_batch_size):
            positions = [fits[j] for j in batch]
            for i, outcome in zip(positions, self._translate([sources[i] for i in positions]), strict=True):
                outcomes[i] = outcome
            progress(len(positions))
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]

    def _translate(self, texts: list[str]) -> list[Outcome]:
        from serving.errors import ServingError

        try:
            return [_translated(t) for t in self.translator.translate(texts, self.options)]
        except ServingError as e:
            if len(texts) == 1:
                return [f"translation refused: {e}"]
        # Some source of the batch is refused: translate one by one so that only that one is rejected.
        out: list[Outcome] = []
        for text in texts:
            try:
                out.append(_translated(self.translator.translate([text], self.options)[0]))
            except ServingError as e:
                out.append(f"translation refused: {e}")
        return out


def _translated(t: Any) -> Translated:
    score = getattr(t, "score", None)
    return Translated(str(t.text), None if score is None else float(score), getattr(t, "input_tokens", None),
                      getattr(t, "output_tokens", None))


# ---------------------------------------------------------------------------------------------------------------
# Executors: submit(chunk_id, sources) -> Future[list[Outcome]]; progress events (chunk_id, n) on a queue.


class _Executor(Protocol):
    capacity: int

    def submit(self, chunk_id: int, sources: list[str]) -> cf.Future[list[Outcome]]: ...

    def drain_progress(self) -> int: ...

    def shutdown(self) -> None: ...


class ThreadExecutor:
    """Chunk workers on threads: one in-process Translator, or one server client per thread."""

    def __init__(self, make_worker: Callable[[], ChunkWorker], threads: int, first: ChunkWorker | None = None) -> None:
        self._make_worker = make_worker
        self._local = threading.local()
        self._first = first
        self._first_taken = threading.Lock()
        self._pool = cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="batch-worker")
        self._progress: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.capacity = 2 * threads

    def _worker(self) -> ChunkWorker:
        worker: ChunkWorker | None = getattr(self._local, "worker", None)
        if worker is None:
            with self._first_taken:
                worker, self._first = self._first, None
            if worker is None:
                worker = self._make_worker()
            self._local.worker = worker
        return worker

    def submit(self, chunk_id: int, sources: list[str]) -> cf.Future[list[Outcome]]:
        return self._pool.submit(lambda: self._worker().translate_chunk(sources, self._progress.put))

    def drain_progress(self) -> int:
        n = 0
        while True:
            try:
                n += self._progress.get_nowait()
            except queue.Empty:
                return n

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


_PROCESS_WORKER: LocalChunkWorker | None = None
_PROCESS_PROGRESS: Any = None


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this worker when the parent dies (a SIGKILLed parent cannot stop its workers)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - non-glibc systems
            logger.debug("prctl(PR_SET_PDEATHSIG) unavailable")
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _init_process(config: EngineConfig, progress: Any, parent_pid: int) -> None:
    global _PROCESS_WORKER, _PROCESS_PROGRESS
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _PROCESS_PROGRESS = progress
    _PROCESS_WORKER = LocalChunkWorker.load(config)


def _process_chunk(chunk_id: int, sources: list[str]) -> list[Outcome]:
    assert _PROCESS_WORKER is not None
    progress = _PROCESS_PROGRESS
    return _PROCESS_WORKER.translate_chunk(sources, lambda n: progress.put(n))


class ProcessExecutor:
    """Chunk workers in spawned processes, each loading its own Translator (no tensorflow in workers)."""

    def __init__(self, config: EngineConfig) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._progress = ctx.SimpleQueue()
        self._pool = cf.ProcessPoolExecutor(max_workers=config.workers, mp_context=ctx, initializer=_init_process,
                                            initargs=(config, self._progress, os.getpid()))
        self.capacity = 2 * config.workers

    def submit(self, chunk_id: int, sources: list[str]) -> cf.Future[list[Outcome]]:
        return self._pool.submit(_process_chunk, chunk_id, sources)

    def drain_progress(self) -> int:
        n = 0
        while not self._progress.empty():
            n += int(self._progress.get())
        return n

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------------------------------------------------------
# State directory


def write_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (``serving.files``: nothing half-written, no temporary file left).

    Raises:
        IOFailure: the file could not be written (full disk, read-only...).
    """
    try:
        atomic_write_bytes(path, data)
    except OSError as e:
        raise IOFailure(path, e, "write") from e


def chunk_digest(entries: Sequence[Entry]) -> str:
    """sha256 of what a chunk was made from: each entry's index, position, bytes, reference bytes and framing error.

    A resumed run reuses a committed chunk only if its records still hash the same (``verify_committed``). Hashing
    per chunk rather than the whole input up front costs nothing on a first run (the records are hashed as they are
    read for translation), and on resume reads only this shard's committed records, once.
    """
    h = hashlib.sha256()
    for e in entries:
        h.update(struct.pack("<qq", e.index, e.position))
        for part in (e.data, e.reference, None if e.error is None else e.error.encode("utf-8")):
            if part is None:
                h.update(struct.pack("<q", -1))
            else:
                h.update(struct.pack("<q", len(part)))
                h.update(part)
    return h.hexdigest()


@dataclass
class ChunkMeta:
    """The commit record of one chunk."""

    chunk: int
    records: int
    data_bytes: int
    rejects: list[dict[str, Any]]
    hypotheses: list[str]
    references: list[str | None]
    source_tokens: int
    target_tokens: int
    entries: int
    input_sha256: str = ""


class StateDir:
    """``<output>.partial``: committed chunks of an unfinished job, its fingerprint and a lock."""

    def __init__(self, path: Path, fingerprint: dict[str, Any]) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self._lock: IO[bytes] | None = None

    def open(self, restart: bool) -> dict[int, ChunkMeta]:
        """Create or reopen the directory; return the committed chunks.

        Raises:
            JobError: another run holds the lock, or the directory belongs to a different job (without restart).
        """
        try:
            self.path.mkdir(exist_ok=True)
            self._lock = (self.path / "lock").open("ab")
        except OSError as e:
            raise IOFailure(self.path, e, "write") from e
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise JobError(f"{self.path}: another batch-score run is writing this output") from e
        job_file = self.path / "job.json"
        wanted = {"version": STATE_VERSION, "job": self.fingerprint}
        if job_file.is_file():
            try:
                existing = json.loads(job_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                existing = None
            if existing != wanted:
                if not restart:
                    raise self._different(existing, wanted)
                logger.warning("discarding the unfinished run in %s (--restart)", self.path)
            elif restart:
                logger.warning("discarding the unfinished run in %s (--restart)", self.path)
            if existing != wanted or restart:
                for p in self.path.iterdir():
                    if p.name != "lock":
                        p.unlink()
        write_file(job_file, json.dumps(wanted, indent=1, sort_keys=True).encode("utf-8"))
        return self._committed()

    def _different(self, existing: Any, wanted: dict[str, Any]) -> JobError:
        def without_files(state: Any) -> Any:
            job = dict(state["job"]["job"])
            job.pop("files", None)
            return state["version"], job, state["job"]["engine"]

        try:
            same_command = without_files(existing) == without_files(wanted)
        except (KeyError, TypeError):
            same_command = False
        if same_command:
            return InputChanged(f"the input changed since the last run (a file's size differs from the one recorded "
                                f"in {self.path}); rerun with --restart")
        return JobError(f"{self.path} holds an unfinished run of a different command (inputs, model or options "
                        "changed, or an older batch-score); rerun that command to resume it, or add --restart")

    def _committed(self) -> dict[int, ChunkMeta]:
        done: dict[int, ChunkMeta] = {}
        for meta_path in sorted(self.path.glob("[0-9]*.json")):
            try:
                meta = ChunkMeta(**json.loads(meta_path.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError):
                logger.warning("ignoring unreadable chunk record %s", meta_path)
                continue
            data = self.data_path(meta.chunk)
            if not data.is_file() or data.stat().st_size != meta.data_bytes:
                logger.warning("chunk %d: data file missing or of the wrong size; it will be redone", meta.chunk)
                continue
            done[meta.chunk] = meta
        return done

    def data_path(self, chunk: int) -> Path:
        return self.path / f"{chunk:06d}.data"

    def commit(self, meta: ChunkMeta, data: bytes) -> None:
        """Write the chunk's data, then its record: the chunk counts as done only once the record exists."""
        write_file(self.data_path(meta.chunk), data)
        meta.data_bytes = len(data)
        write_file(self.path / f"{meta.chunk:06d}.json", json.dumps(asdict(meta), ensure_ascii=False).encode())

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# The run


@dataclass
class RunResult:
    """What a run did; ``summary`` is what summary.json holds."""

    summary: dict[str, Any]
    rejects: int
    translated: int


@dataclass
class _Pending:
    chunk: int
    entries: int
    records: list[Record]
    rejects: list[Reject]
    where: dict[int, tuple[str, int]]
    digest: str


@dataclass
class _Counters:
    translated: int = 0
    source_tokens: int = 0
    target_tokens: int = 0
    chunks: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _chunks(job: Job, done: dict[int, ChunkMeta], seen: list[int]) -> Iterator[tuple[int, list[Entry]]]:
    """Chunks still to translate, with their entries' bytes; ``seen[0]`` ends as the number of chunks."""
    def want(index: int) -> bool:
        return job.owns(index) and job.chunk_of(index) not in done

    current = -1
    entries: list[Entry] = []
    for entry in scan(job.inputs, want):
        if not job.owns(entry.index):
            continue
        chunk = job.chunk_of(entry.index)
        seen[0] = chunk + 1
        if chunk in done:
            continue
        if chunk != current and entries:
            yield current, entries
            entries = []
        current = chunk
        entries.append(entry)
    if entries:
        yield current, entries


def verify_committed(job: Job, done: dict[int, ChunkMeta]) -> None:
    """Refuse to resume unless every committed chunk's records hash as they did when it was committed.

    Raises:
        InputChanged: some committed chunk was made from other records.
    """
    if not done:
        return
    last = max(done)
    entries: dict[int, list[Entry]] = {}
    for entry in scan(job.inputs, want=lambda i: job.owns(i) and job.chunk_of(i) in done):
        if not job.owns(entry.index):
            continue
        chunk = job.chunk_of(entry.index)
        if chunk > last:
            break
        if chunk in done:
            entries.setdefault(chunk, []).append(entry)
    for chunk in sorted(done):
        got = entries.get(chunk, [])
        if chunk_digest(got) != done[chunk].input_sha256:
            where = f"records from {got[0].file}:{got[0].position}" if got else "records that are no longer there"
            raise InputChanged(f"the input changed since the last run (chunk {chunk}, {where}, differs from what "
                               f"{job.state_dir} holds); rerun with --restart")


def check_outputs(job: Job) -> None:
    """Refuse outputs that cannot be written, before any work (nothing is written here but a probe, removed).

    Raises:
        JobError: an output path is a directory, or its directory is missing, not a directory or not writable.
    """
    for path, what, flag in ((job.output, "the output", "-o"), (job.rejects, "the rejects file", "--rejects"),
                             (job.summary, "the summary", "--summary")):
        problem = _unwritable(path)
        if problem:
            raise JobError(f"cannot write {what} {path}: {problem}; give another {flag}")
    if job.state_dir.exists() and not job.state_dir.is_dir():
        raise JobError(f"{job.state_dir} is not a directory, but batch-score keeps its resume state there; remove it "
                       "or give another -o")


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written as a file, or None."""
    if path.is_dir():
        return "it is a directory"
    parent = path.parent
    if not parent.exists():
        return f"no directory {parent} (create it first)"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    try:  # the one test that holds for read-only mounts, ACLs and root alike: create a file there
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".probe")
    except OSError as e:
        return f"cannot create files in {parent} ({e.strerror})"
    os.close(fd)
    os.unlink(probe)
    return None


def count_owned(job: Job) -> int:
    """Records (and unreadable regions) this shard owns: framing and lines only, no parsing."""
    return sum(1 for e in scan(job.inputs, want=lambda _i: False) if job.owns(e.index))


def run_job(job: Job, engine: EngineConfig, *, make_executor: Callable[[], _Executor], progress: bool = True,
            restart: bool = False, engine_info: dict[str, Any] | None = None) -> RunResult:
    """Translate every owned record not yet committed, then assemble output, rejects and summary.

    Args:
        job: inputs and outputs.
        engine: translation settings (recorded in the fingerprint and the summary).
        make_executor: builds the chunk executor (called once; loading models happens there).
        progress: show a progress bar on stderr.
        restart: discard an unfinished run of a different command instead of refusing.
        engine_info: model name/version etc. for the summary.

    Raises:
        JobError: state of another job in the way, or the output is locked.
    """
    started = time.monotonic()
    state = StateDir(job.state_dir, {"job": job.fingerprint(), "engine": engine.fingerprint()})
    done = state.open(restart)
    try:
        verify_committed(job, done)
        return _run(job, state, done, started, make_executor, progress, engine_info or {})
    finally:
        state.close()


def _run(job: Job, state: StateDir, done: dict[int, ChunkMeta], started: float,
         make_executor: Callable[[], _Executor], progress: bool, engine_info: dict[str, Any]) -> RunResult:
    vocab = load_vocab(job.vocab) if job.vocab else None
    parser = RecordParser(job.schema, vocab)
    encoder = OutputEncoder(job.output_format)
    reused_entries = sum(m.entries for m in done.values())
    if done:
        logger.info("resuming: %d chunk(s) (%d records) already committed in %s", len(done), reused_entries,
                    state.path)
    total = count_owned(job) if progress else None
    bar = _progress_bar(total, reused_entries, enabled=progress)
    counters = _Counters()
    seen = [0]
    executor: _Executor | None = None
    startup = 0.0
    pending: dict[cf.Future[list[Outcome]], _Pending] = {}

    def collect(timeout: float) -> None:
        finished, _ = cf.wait(list(pending), timeout=timeout, return_when=cf.FIRST_COMPLETED)
        assert executor is not None
        bar.update(executor.drain_progress())
        # Every chunk that finished is committed, in chunk order, before a failed one's error is raised: work done
        # before a crash is never lost (``finished`` is a set, so a failure could otherwise come first).
        failures: list[BaseException] = []
        for future in sorted(finished, key=lambda f: pending[f].chunk):
            item = pending.pop(future)
            error = future.exception()
            if error is not None:
                failures.append(error)
                continue
            _commit(state, job, encoder, item, future.result(), counters)
        if failures:
            raise failures[0]

    try:
        for chunk, entries in _chunks(job, done, seen):
            records: list[Record] = []
            rejects: list[Reject] = []
            for entry in entries:
                parsed = parser.parse(entry)
                (records if isinstance(parsed, Record) else rejects).append(parsed)  # type: ignore[arg-type]
            bar.update(len(rejects))
            item = _Pending(chunk, len(entries), records, rejects, {e.index: (e.file, e.position) for e in entries},
                            chunk_digest(entries))
            if not records:
                _commit(state, job, encoder, item, [], counters)
                continue
            if executor is None:
                t0 = time.monotonic()
                executor = make_executor()
                startup = time.monotonic() - t0
            while len(pending) >= executor.capacity:
                collect(0.2)
            pending[executor.submit(chunk, [r.source for r in records])] = item
        while pending:
            collect(0.2)
    finally:
        if executor is not None:
            if pending:
                for future in pending:
                    future.cancel()
            executor.shutdown()
        bar.close()
    return _assemble(state, job, seen[0], counters, started, startup, len(done), reused_entries, engine_info)


def _commit(state: StateDir, job: Job, encoder: OutputEncoder, item: _Pending, outcomes: list[Outcome],
            counters: _Counters) -> None:
    # Plain-text output keeps line alignment with the input: a rejected record leaves an empty line.
    aligned = job.output_format == "text"
    keyed: list[tuple[int, bytes]] = []
    rejects = list(item.rejects)
    hyps: list[str] = []
    refs: list[str | None] = []
    source_tokens = target_tokens = 0
    for record, outcome in zip(item.records, outcomes, strict=True):
        if isinstance(outcome, str):
            file, position = item.where[record.index]
            rejects.append(Reject(record.index, file, position, outcome))
            continue
        keyed.append((record.index, encoder.encode(record, outcome)))
        hyps.append(outcome.text)
        refs.append(record.reference)
        source_tokens += outcome.input_tokens or 0
        target_tokens += outcome.output_tokens or 0
    translated = len(keyed)
    if aligned:
        keyed += [(r.index, b"\n") for r in rejects]
        keyed.sort(key=lambda kv: kv[0])
    items = [data for _, data in keyed]
    rejects.sort(key=lambda r: r.index)
    meta = ChunkMeta(chunk=item.chunk, records=translated, data_bytes=0, rejects=[r.to_dict() for r in rejects],
                     hypotheses=hyps, references=refs, source_tokens=source_tokens, target_tokens=target_tokens,
                     entries=item.entries, input_sha256=item.digest)
    state.commit(meta, encode_items(items, job.output_format))
    counters.translated += translated
    counters.source_tokens += source_tokens
    counters.target_tokens += target_tokens
    counters.chunks += 1
    for r in rejects:
        logger.info("rejected record %d (%s:%d): %s", r.index, r.file, r.position, r.reason)


def _assemble(state: StateDir, job: Job, n_chunks: int, counters: _Counters, started: float, startup: float,
              reused_chunks: int, reused_entries: int, engine_info: dict[str, Any]) -> RunResult:
    metas = state._committed()
    missing = [c for c in range(n_chunks) if c not in metas]
    if missing:  # pragma: no cover - every chunk was committed above or before
        raise JobError(f"chunks {missing[:5]} were not committed; rerun to finish them")
    _concatenate(job.output, [state.data_path(chunk) for chunk in range(n_chunks)])

    ordered = [metas[c] for c in range(n_chunks)]
    rejects = [r for m in ordered for r in m.rejects]
    write_file(job.rejects, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects).encode("utf-8"))
    hyps = [h for m in ordered for h in m.hypotheses]
    refs = [r for m in ordered for r in m.references]
    wall = time.monotonic() - started
    busy = max(wall - startup, 1e-9)
    summary: dict[str, Any] = {
        "inputs": [str(i.path) for i in job.inputs],
        "input_format": job.schema.format,
        "schema": job.schema.to_dict(),
        "output": str(job.output),
        "output_format": job.output_format,
        "rejects_file": str(job.rejects),
        "engine": engine_info,
        "shard": {"index": job.shard_index, "count": job.num_shards},
        "records": sum(m.entries for m in ordered),
        "translated": sum(m.records for m in ordered),
        "rejects": len(rejects),
        "tokens": {"source": sum(m.source_tokens for m in ordered), "target": sum(m.target_tokens for m in ordered)},
        "resumed": {"chunks": reused_chunks, "records": reused_entries},
        "this_run": {"translated": counters.translated, "source_tokens": counters.source_tokens,
                     "target_tokens": counters.target_tokens},
        "wall_seconds": round(wall, 3),
        "startup_seconds": round(startup, 3),
        "records_per_second": round(counters.translated / busy, 2) if counters.translated else 0.0,
        "tokens_per_second": round(counters.target_tokens / busy, 1) if counters.translated else 0.0,
        "source_tokens_per_second": round(counters.source_tokens / busy, 1) if counters.translated else 0.0,
        "scores": scoring.corpus_scores(hyps, refs),
    }
    write_file(job.summary, (json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    state.remove()
    return RunResult(summary, len(rejects), summary["translated"])


def _concatenate(target: Path, parts: Sequence[Path]) -> None:
    """Write the parts one after the other into ``target``, atomically."""
    try:
        with atomic_writer(target, "wb") as out:
            for part in parts:
                try:
                    f = part.open("rb")
                except OSError as e:
                    raise IOFailure(part, e, "read") from e
                with f:
                    while True:
                        try:
                            block = f.read(1 << 20)
                        except OSError as e:
                            raise IOFailure(part, e, "read") from e
                        if not block:
                            break
                        out.write(block)
    except OSError as e:
        raise IOFailure(target, e, "write") from e


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int | None, initial: int, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=total, initial=initial, unit="rec", desc="batch-score", file=sys.stderr, dynamic_ncols=tty,
                mininterval=0.5 if tty else 15.0, smoothing=0.1)


# ---------------------------------------------------------------------------------------------------------------
# Cores


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
