"""Chunk workers: what translates the records of one chunk, and the executors that run them in parallel.

A worker gets a chunk's sources and returns an outcome per source, in order: a :class:`~batch.records.Translated`
or the reason it was refused. :class:`LocalChunkWorker` sorts the chunk by token length once and cuts it into
batches of at most ``max_tokens`` padded source tokens (:func:`make_batches`), so that batch composition depends
only on the chunk's content and a resumed run batches a chunk as the first run did. The remote worker
(``batch.remote``) does the same through a server.

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
from serving.engine.decoding.rules import sentence_seeds
from serving.engine.errors import InputTooLong, ServingError
from serving.engine.request import DecodeOptions, Engine, Prepared, ReferenceScore, Translation

logger = logging.getLogger(__name__)

Outcome = Translated | str  # a translation, or why the record was rejected
Source = str | tuple[int, ...]
"""A record's source as a chunk carries it: its text, or its token ids when the engine shares the vocabulary the
records were written with (``Job.source_ids``; the local worker only)."""


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


References = list[str | None]
"""Each record's reference, in the order of a chunk's sources (None: the record has none), when the job scores them
(``Job.score_references``; the local worker only)."""


class ChunkWorker(Protocol):
    """Translates the sources of one chunk; an outcome per source, in order (with ``references``, each translated
    record that has one also gets its reference's score)."""

    def translate_chunk(self, sources: list[Source], progress: Progress,
                        references: References | None = None) -> list[Outcome]: ...


class LocalChunkWorker:
    """Runs a chunk through an in-process engine (``serving.engine.request.Engine``: a Translator) in length-bucketed
    batches. Each source is prepared once (tokenized, length-checked); the batches run the prepared ids.

    A source given as ids (:data:`Source`) goes to the engine as they are (``prepare_ids``). A source the engine
    refuses (``serving.engine.errors.ServingError``: too long, invalid) becomes a reject; any other exception aborts the run
    (the chunk is not committed, so a rerun retries it). With ``references``, the references of the translated
    records are scored (``Engine.score``; ``score_ids`` for id sources); a reference the engine refuses (too long)
    makes its record a reject too.
    """

    def __init__(self, translator: Engine, options: DecodeOptions | None, max_tokens: int,
                 max_batch_size: int, target_prefix: str | None = None) -> None:
        self.translator = translator
        self.options = options
        self.max_tokens = max_tokens
        self.max_batch_size = max_batch_size
        self.target_prefix = target_prefix or None

    @classmethod
    def load(cls, config: EngineConfig) -> LocalChunkWorker:
        """Load the package's Translator with ``config.threads`` runtime threads."""
        from serving.engine.translator import Translator

        assert config.model_dir is not None
        translator = Translator.load(config.model_dir, runtime=config.runtime, precision=config.precision,
                                     threads=config.threads)
        return cls(translator, config.options(), config.max_tokens, config.max_batch_size, config.target_prefix)

    def translate_chunk(self, sources: list[Source], progress: Progress,
                        references: References | None = None) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(sources)
        prepared: dict[int, Prepared] = {}
        prefix = {} if self.target_prefix is None else {"target_prefix": [self.target_prefix]}
        # Sampling with a seed: the chunk is one engine call, so sentence i gets the i-th stream of the seed
        # (serving.engine.decoding.rules.sentence_seeds), as in Engine.prepare(chunk): a rerun or a resumed run, which cut the
        # same chunks (--chunk-size), samples the same translations, whatever the batches.
        seed = self.options.seed if self.options is not None and self.options.sampling else None
        seeds = None if seed is None else sentence_seeds(seed, len(sources))
        for i, source in enumerate(sources):
            try:
                one = (self.translator.prepare([source], self.options, **prefix) if isinstance(source, str)
                       else self.translator.prepare_ids([source], self.options, **prefix))
                prepared[i] = one if seeds is None else dataclasses.replace(one, seeds=seeds[i:i + 1])
            except InputTooLong as e:
                outcomes[i] = (f"source has {e.tokens} tokens; the model accepts at most {e.limit} (--truncate cuts "
                               "it to them)")
            except ServingError as e:
                outcomes[i] = f"translation refused: {e}"
        if len(prepared) < len(sources):
            progress(len(sources) - len(prepared))
        fits = list(prepared)
        for batch in make_batches([prepared[i].lengths[0] for i in fits], self.max_tokens, self.max_batch_size):
            positions = [fits[j] for j in batch]
            for i, outcome in zip(positions, self._run([prepared[i] for i in positions]), strict=True):
                outcomes[i] = outcome
            progress(len(positions))
        assert all(o is not None for o in outcomes)
        done: list[Outcome] = outcomes  # type: ignore[assignment]
        if references is not None:
            self._score_references(sources, references, done)
        return done

    def _score_references(self, sources: list[Source], references: References, outcomes: list[Outcome]) -> None:
        """Add its reference's score to each translated record that has a reference (or make it a reject)."""
        scored = [i for i, o in enumerate(outcomes) if isinstance(o, Translated) and references[i] is not None]
        for group in ([i for i in scored if isinstance(sources[i], str)],
                      [i for i in scored if not isinstance(sources[i], str)]):
            if not group:
                continue
            try:
                scores: list[ReferenceScore | str] = list(self._score([sources[i] for i in group],
                                                                      [references[i] or "" for i in group]))
            except ServingError:  # some pair is refused: score them one by one so that only that one is rejected
                scores = []
                for i in group:
                    try:
                        scores.append(self._score([sources[i]], [references[i] or ""])[0])
                    except ServingError as e:
                        scores.append(f"reference not scored: {e}")
            for i, score in zip(group, scores, strict=True):
                translated = outcomes[i]
                assert isinstance(translated, Translated)
                outcomes[i] = score if isinstance(score, str) else dataclasses.replace(
                    translated, ref_log_prob=score.log_prob, ref_tokens=score.tokens)

    def _score(self, sources: list[Source], references: list[str]) -> list[ReferenceScore]:
        # --truncate: the reference is scored against the source as it was translated (cut), not refused.
        truncate = self.options is not None and self.options.truncate
        texts = [s for s in sources if isinstance(s, str)]
        if len(texts) == len(sources):
            return self.translator.score(texts, references, truncate=truncate)
        return self.translator.score_ids([s for s in sources if not isinstance(s, str)], references,
                                         truncate=truncate)

    def _run(self, sentences: list[Prepared]) -> list[Outcome]:
        try:
            return [_translated(t) for t in self.translator.run(Prepared.join(sentences))]
        except ServingError as e:
            if len(sentences) == 1:
                return [f"translation refused: {e}"]
        # Some source of the batch is refused: run them one by one so that only that one is rejected.
        out: list[Outcome] = []
        for sentence in sentences:
            try:
                out.append(_translated(self.translator.run(sentence)[0]))
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

