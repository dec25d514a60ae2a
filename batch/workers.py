"""Chunk workers: what translates the records of one chunk, and the executors that run them in parallel.

A worker gets a chunk's sources and returns an outcome per source, in order: a :class:`~batch.records.Translated`
or the reason it was refused. :class:`LocalChunkWorker` prepares the chunk once, as the server prepares a request
(tokenized once, each sentence's sampling seed the stream of its position), and cuts it with the engine's planner
(``serving.engine.planner``) under the budget the engine was loaded with (``--max-batch-size``,
``--max-batch-tokens``), so that the engine runs each batch as it is, and batch composition depends only on the
chunk's content: a resumed run batches a chunk as the first run did. The remote worker (``batch.remote``) sends a
chunk to a server in requests of ``max_batch_size`` sentences.

Executors: :class:`ThreadExecutor` (one in-process Translator next to the reader, or one server client per thread)
and :class:`ProcessExecutor` (N spawned processes, each with its own Translator; they die with the parent).
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import dataclasses
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from batch.job import EngineConfig
from batch.records import Translated
from serving.engine.errors import InputTooLong, ServingError
from serving.engine.planner import BatchBudget, plan
from serving.engine.request import DecodeOptions, Engine, Prepared, ReferenceScore, Sentence, Translation

logger = logging.getLogger(__name__)

Outcome = Translated | str  # a translation, or why the record was rejected
Source = str | tuple[int, ...]
"""A record's source as a chunk carries it: its text, or its token ids when the engine shares the vocabulary the
records were written with (``Job.source_ids``; the local worker only)."""


def make_batches(lengths: Sequence[int], max_tokens: int, max_batch_size: int, beams: int = 1) -> list[list[int]]:
    """The batches the local worker cuts a chunk of sentences of ``lengths`` into (``serving.engine.planner.plan``
    under ``max_tokens`` padded source tokens times ``beams`` and ``max_batch_size`` sentences), each listed from
    its shortest sentence up.

    Deterministic for a given input (ties keep input order), so a resumed run batches a chunk as the first run did.
    """
    return [sorted(batch.tolist(), key=lambda i: (lengths[i], i))
            for batch in plan(lengths, BatchBudget(max_batch_size, max_tokens), beams)]


Progress = Callable[[int], None]


References = list[str | None]
"""Each record's reference, in the order of a chunk's sources (None: the record has none), when the job scores them
(``Job.score_references``; the local worker only)."""


class ChunkWorker(Protocol):
    """Translates the sources of one chunk; an outcome per source, in order (with ``references``, each translated
    record that has one also gets its reference's score)."""

    def translate_chunk(self, sources: list[Source], progress: Progress,
                        references: References | None = None) -> list[Outcome]: ...


class LocalChunkWorker:
    """Runs a chunk through an in-process engine (``serving.engine.request.Engine``: a Translator) in batches cut by
    the engine's planner. The chunk is prepared once (tokenized, length-checked, seeded); the batches run its ids.

    A source given as ids (:data:`Source`) goes to the engine as they are (``prepare_ids``). A source the engine
    refuses (``serving.engine.errors.ServingError``: too long, invalid) becomes a reject; any other exception aborts the run
    (the chunk is not committed, so a rerun retries it). With ``references``, the references of the translated
    records are scored against the ids the chunk was prepared with (``Engine.score_ids``: no source is tokenized
    again); a reference the engine refuses (too long) makes its record a reject too.

    Arguments:
        translator: the engine, loaded with the same budget (``load`` does), so that it runs each batch as it is.
        options: the decoding options (checked once, where the command line was read).
        max_tokens, max_batch_size: the budget (``serving.engine.planner.BatchBudget``).
        target_prefix: the start every translation is forced to.
    """

    def __init__(self, translator: Engine, options: DecodeOptions | None, max_tokens: int,
                 max_batch_size: int, target_prefix: str | None = None) -> None:
        self.translator = translator
        self.options = options
        self.budget = BatchBudget(max_batch_size, max_tokens)
        self.target_prefix = target_prefix or None

    @classmethod
    def load(cls, config: EngineConfig) -> LocalChunkWorker:
        """Load the package's Translator with ``config.threads`` runtime threads and the job's budget."""
        from serving.engine.translator import Translator

        assert config.model_dir is not None
        translator = Translator.load(config.model_dir, runtime=config.runtime, precision=config.precision,
                                     threads=config.threads, max_batch_size=config.max_batch_size,
                                     max_batch_tokens=config.max_tokens)
        return cls(translator, config.options(), config.max_tokens, config.max_batch_size, config.target_prefix)

    def translate_chunk(self, sources: list[Source], progress: Progress,
                        references: References | None = None) -> list[Outcome]:
        prepared, outcomes = self._prepare(sources)
        if any(o is not None for o in outcomes):
            progress(sum(o is not None for o in outcomes))
        if prepared is not None:
            fits = [i for i, outcome in enumerate(outcomes) if outcome is None]
            lengths = [len(prepared.sources[i]) for i in fits]
            for batch in plan(lengths, self.budget, prepared.search.beam_size):
                positions = [fits[j] for j in batch.tolist()]
                for i, outcome in zip(positions, self._run(prepared.take(positions)), strict=True):
                    outcomes[i] = outcome
                progress(len(positions))
        assert all(o is not None for o in outcomes)
        done: list[Outcome] = outcomes  # type: ignore[assignment]
        if references is not None and prepared is not None:
            self._score_references(prepared, references, done)
        return done

    def _prepare(self, sources: list[Source]) -> tuple[Prepared | None, list[Outcome | None]]:
        """The chunk prepared in place (:meth:`_prepare_in_place`), and each refused record's reason (None for the
        others). A refusal is found by preparing the records one by one (only when the chunk was refused)."""
        outcomes: list[Outcome | None] = [None] * len(sources)
        try:
            return self._prepare_in_place(sources, outcomes), outcomes
        except ServingError:
            pass
        for i, source in enumerate(sources):
            try:
                self._engine_prepare([source])
            except InputTooLong as e:
                outcomes[i] = (f"source has {e.tokens} tokens; the model accepts at most {e.limit} (--truncate cuts "
                               "it to them)")
            except ServingError as e:
                outcomes[i] = f"translation refused: {e}"
        if all(o is not None for o in outcomes):
            return None, outcomes
        return self._prepare_in_place(sources, outcomes), outcomes

    def _prepare_in_place(self, sources: list[Source], refused: Sequence[Outcome | None]) -> Prepared:
        """Every record of the chunk at its position, in one engine call per kind of source (text, ids), as the
        server prepares a request: sentence i samples with the i-th stream of the seed (``--seed``), whatever the
        batches, so a rerun or a resumed run writes the same bytes. A refused record's place holds an accepted
        source of its kind (never run)."""
        kept = [i for i, outcome in enumerate(refused) if outcome is None]
        parts: dict[bool, Prepared] = {}
        for text in (True, False):
            members = {i for i in kept if isinstance(sources[i], str) == text}
            if members:
                stand_in = sources[min(members)]
                parts[text] = self._engine_prepare([s if i in members else stand_in for i, s in enumerate(sources)])
        if len(parts) == 1:
            return next(iter(parts.values()))
        return Prepared.gather([Sentence(parts.get(isinstance(s, str), parts[True]), i) for i, s in enumerate(sources)])

    def _engine_prepare(self, sources: Sequence[Source]) -> Prepared:
        """``Engine.prepare`` (text) or ``prepare_ids`` (ids) of sources of one kind, with the job's options."""
        prefix = {} if self.target_prefix is None else {"target_prefix": [self.target_prefix] * len(sources)}
        texts = [s for s in sources if isinstance(s, str)]
        if len(texts) == len(sources):
            return self.translator.prepare(texts, self.options, **prefix)
        return self.translator.prepare_ids([s for s in sources if not isinstance(s, str)], self.options, **prefix)

    def _score_references(self, prepared: Prepared, references: References, outcomes: list[Outcome]) -> None:
        """Add its reference's score to each translated record that has a reference (or make it a reject); the
        sources are the ids the chunk was prepared with (EOS off: ``Engine.score_ids`` appends it)."""
        scored = [i for i, o in enumerate(outcomes) if isinstance(o, Translated) and references[i] is not None]
        if not scored:
            return
        ids = [prepared.sources[i][:-1] for i in scored]
        targets = [references[i] or "" for i in scored]
        try:
            scores: list[ReferenceScore | str] = list(self._score(ids, targets))
        except ServingError:  # some pair is refused: score them one by one so that only that one is rejected
            scores = []
            for source, target in zip(ids, targets, strict=True):
                try:
                    scores.append(self._score([source], [target])[0])
                except ServingError as e:
                    scores.append(f"reference not scored: {e}")
        for i, score in zip(scored, scores, strict=True):
            translated = outcomes[i]
            assert isinstance(translated, Translated)
            outcomes[i] = score if isinstance(score, str) else dataclasses.replace(
                translated, ref_log_prob=score.log_prob, ref_tokens=score.tokens)

    def _score(self, ids: list[list[int]], references: list[str]) -> list[ReferenceScore]:
        # --truncate: the sources were cut as they were translated; the reference is scored against them.
        truncate = self.options is not None and self.options.truncate
        return self.translator.score_ids(ids, references, truncate=truncate)

    def _run(self, batch: Prepared) -> list[Outcome]:
        try:
            return [_translated(t) for t in self.translator.run(batch)]
        except ServingError as e:
            if len(batch) == 1:
                return [f"translation refused: {e}"]
        # Some source of the batch is refused: run them one by one so that only that one is rejected.
        out: list[Outcome] = []
        for sentence in batch.sentences():
            try:
                out.append(_translated(self.translator.run(Prepared.gather([sentence]))[0]))
            except ServingError as e:
                out.append(f"translation refused: {e}")
        return out


def _translated(t: Translation) -> Translated:
    return Translated(t.text, None if t.score is None else float(t.score), t.input_tokens, t.output_tokens)


# ---------------------------------------------------------------------------------------------------------------
# Executors: submit(chunk_id, sources) -> Future[list[Outcome]]; progress events (chunk_id, n) on a queue.


class Executor(Protocol):
    """Runs chunks: ``submit(chunk_id, sources)`` -> a future of their outcomes; progress counted on the side."""

    capacity: int

    def submit(self, chunk_id: int, sources: list[Source],
               references: References | None = None) -> cf.Future[list[Outcome]]: ...

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

    def submit(self, chunk_id: int, sources: list[Source],
               references: References | None = None) -> cf.Future[list[Outcome]]:
        return self._pool.submit(lambda: self._worker().translate_chunk(sources, self._progress.put, references))

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
_PROCESS_ERROR: str | None = None  # why the package could not be loaded (raised again by every chunk)


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
    global _PROCESS_WORKER, _PROCESS_PROGRESS, _PROCESS_ERROR
    from serving.package import PackageError

    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _PROCESS_PROGRESS = progress
    try:
        _PROCESS_WORKER = LocalChunkWorker.load(config)
    except PackageError as e:  # a graph the runtime cannot load: the parent reports it (raising here breaks the pool)
        _PROCESS_ERROR = str(e)


def _process_chunk(chunk_id: int, sources: list[Source], references: References | None) -> list[Outcome]:
    if _PROCESS_ERROR is not None:
        from serving.package import PackageError

        raise PackageError(_PROCESS_ERROR)
    assert _PROCESS_WORKER is not None
    progress = _PROCESS_PROGRESS
    return _PROCESS_WORKER.translate_chunk(sources, lambda n: progress.put(n), references)


class ProcessExecutor:
    """Chunk workers in spawned processes, each loading its own Translator (no tensorflow in workers)."""

    def __init__(self, config: EngineConfig) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._progress = ctx.SimpleQueue()
        self._pool = cf.ProcessPoolExecutor(max_workers=config.workers, mp_context=ctx, initializer=_init_process,
                                            initargs=(config, self._progress, os.getpid()))
        self.capacity = 2 * config.workers

    def submit(self, chunk_id: int, sources: list[Source],
               references: References | None = None) -> cf.Future[list[Outcome]]:
        return self._pool.submit(_process_chunk, chunk_id, sources, references)

    def drain_progress(self) -> int:
        n = 0
        while not self._progress.empty():
            n += int(self._progress.get())
        return n

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

