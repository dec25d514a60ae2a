"""The run loop of batch-score: read the chunks still to do, parse them, have workers translate them, commit each
as it finishes, and assemble the outputs at the end.

The pipeline, one way: inputs and framing (``batch.inputs``, ``batch.framing``) -> parsing (``batch.records``, by
the schema of ``batch.schema``) -> a worker (``batch.workers``, ``batch.remote``) -> a commit (``batch.state``, items
encoded by ``batch.outputs``) -> assembly (``batch.assembly``, scores from ``batch.scoring``).

Records are sorted once, by the worker (by length, for batching); outcomes come back in record order and a commit
walks the chunk's entries in index order, so output items and rejects come out in input order without sorting.
Chunks finish in any order (several workers), each is committed on its own, and the output is assembled in chunk
order. Killed at any moment and rerun with the same command, the run writes the same bytes as an uninterrupted one.

What translates the chunks is a :class:`ChunkRunner`: :class:`LocalChunks` (an executor of ``batch.workers``, in
this process or its worker processes) or ``batch.ray_runner.RayChunks`` (Ray Data); both read chunks with
:func:`read_chunks`, parse them with :func:`parse_chunk` and hand the outcomes to one :class:`Committer`.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from batch.assembly import RunStats, assemble
from batch.framing import Entry, encode_items
from batch.inputs import scan
from batch.job import EngineConfig, Job
from batch.outputs import OutputEncoder
from batch.records import Record, RecordParser, Reject, load_vocab
from batch.state import ChunkMeta, StateDir, chunk_digest, verify_committed
from batch.workers import Executor, Outcome, Source
from serving.package import PackageError

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a run did; ``summary`` is what summary.json holds."""

    summary: dict[str, Any]
    rejects: int
    translated: int


@dataclass
class ParsedChunk:
    """A chunk read and parsed: its entries and, in the same order, each one's record or reject."""

    chunk: int
    entries: list[Entry]
    parsed: list[Record | Reject]
    digest: str

    @property
    def records(self) -> list[Record]:
        return [p for p in self.parsed if isinstance(p, Record)]

    def references(self) -> list[str | None]:
        """Each record's reference (None: it has none)."""
        return [r.reference for r in self.records]

    def sources(self, job: Job) -> list[Source]:
        """What the engine gets for each record: its ids when the job sends ids (``Job.source_ids``), else text."""
        return [r.source_ids if job.source_ids and r.source_ids is not None else r.source for r in self.records]


def parser_for(job: Job) -> RecordParser:
    return RecordParser(job.schema, load_vocab(job.vocab) if job.vocab else None)


def parse_chunk(parser: RecordParser, chunk: int, entries: list[Entry]) -> ParsedChunk:
    return ParsedChunk(chunk, entries, [parser.parse(e) for e in entries], chunk_digest(entries))


def read_chunks(job: Job, todo: Callable[[int], bool], seen: list[int] | None = None,
                last: int | None = None) -> Iterator[tuple[int, list[Entry]]]:
    """The chunks ``todo(chunk)`` selects, in order, with their entries' bytes.

    ``seen[0]`` ends as the number of chunks of the job (when the scan is not cut short by ``last``: the scan stops
    after chunk ``last``).
    """
    def want(index: int) -> bool:
        return job.owns(index) and todo(job.chunk_of(index))

    current = -1
    entries: list[Entry] = []
    for entry in scan(job.inputs, want):
        if not job.owns(entry.index):
            continue
        chunk = job.chunk_of(entry.index)
        if last is not None and chunk > last:
            break
        if seen is not None:
            seen[0] = chunk + 1
        if not todo(chunk):
            continue
        if chunk != current and entries:
            yield current, entries
            entries = []
        current = chunk
        entries.append(entry)
    if entries:
        yield current, entries


def count_owned(job: Job) -> int:
    """Records (and unreadable regions) this shard owns: framing and lines only, no parsing."""
    return sum(1 for e in scan(job.inputs, want=lambda _i: False) if job.owns(e.index))


class Bar(Protocol):
    """The progress bar: its count is committed records (what a rerun keeps); the records translated since, not
    committed yet, show beside it (``set_postfix_str``)."""

    def update(self, n: int) -> None: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...

    def close(self) -> None: ...


class ChunkRunner(Protocol):
    """Translates every chunk not in ``done`` and commits each through ``committer``; returns the number of chunks
    of the job. ``owned`` is the number of entries the job owns when it was counted (for the progress bar)."""

    def __call__(self, job: Job, done: dict[int, ChunkMeta], committer: Committer, bar: Bar,
                 owned: int | None) -> int: ...


def run_job(job: Job, engine: EngineConfig, *, make_executor: Callable[[], Executor] | None = None,
            chunk_runner: ChunkRunner | None = None, progress: bool = True, restart: bool = False,
            engine_info: dict[str, Any] | None = None) -> RunResult:
    """Translate every owned record not yet committed, then assemble output, rejects and summary.

    Args:
        job: inputs and outputs.
        engine: translation settings (recorded in the fingerprint and the summary).
        make_executor: builds the chunk executor (called once; loading models happens there), for
            :class:`LocalChunks`.
        chunk_runner: what translates the chunks instead (``batch.ray_runner.RayChunks``); it needs the count of
            owned records, so that is counted even without ``progress``.
        progress: show a progress bar on stderr (records/s and the time left).
        restart: discard an unfinished run of a different command (or of a changed input) instead of refusing.
        engine_info: model name/version etc. for the summary.

    Raises:
        JobError: state of another job in the way, the output is locked, or the input changed (InputChanged).
        IOFailure: an input could not be read or an output written.
        PackageError: the workers could not load the package (nothing is left behind then).
    """
    if chunk_runner is None:
        if make_executor is None:
            raise TypeError("run_job needs make_executor or chunk_runner")
        chunk_runner = LocalChunks(make_executor)
    started = time.monotonic()
    state = StateDir(job.state_dir, {"job": job.fingerprint(), "engine": engine.fingerprint()})
    done = state.open(restart)
    try:
        verify_committed(job, done)
        stats = RunStats(started, len(done), sum(m.entries for m in done.values()))
        if done:
            logger.info("resuming: %d chunk(s) (%d records) already committed in %s", len(done),
                        stats.reused_entries, state.path)
        owned = count_owned(job) if progress or not isinstance(chunk_runner, LocalChunks) else None
        bar = _progress_bar(owned if progress else None, stats.reused_entries, enabled=progress)
        try:
            n_chunks = chunk_runner(job, done, Committer(state, job, stats), bar, owned)
        finally:
            bar.close()
        summary = assemble(job, state, n_chunks, stats, engine_info or {})
        state.remove()
        return RunResult(summary, summary["rejects"], summary["translated"])
    except PackageError:  # the workers cannot load the package (a corrupt graph): a usage error, nothing to keep
        _remove_if_empty(state)
        raise
    finally:
        state.close()


def _remove_if_empty(state: StateDir) -> None:
    """A state directory without any committed chunk has nothing to resume: remove it (we hold its lock)."""
    try:
        empty = not state.committed()
    except OSError:
        return
    if empty:
        state.remove()


class LocalChunks:
    """Chunks read here and translated by an executor of ``batch.workers`` (threads or worker processes)."""

    def __init__(self, make_executor: Callable[[], Executor]) -> None:
        self.make_executor = make_executor

    def __call__(self, job: Job, done: dict[int, ChunkMeta], committer: Committer, bar: Bar,
                 owned: int | None) -> int:
        parser = parser_for(job)
        seen = [0]
        executor: Executor | None = None
        pending: dict[cf.Future[list[Outcome]], ParsedChunk] = {}
        in_flight = [0]  # records translated whose chunk is not committed yet: a rerun translates them again

        def commit(item: ParsedChunk, outcomes: list[Outcome]) -> None:
            committer.commit(item, outcomes)
            in_flight[0] = max(0, in_flight[0] - len(item.records))
            bar.set_postfix_str(f"{in_flight[0]} more translated, not committed" if in_flight[0] else "",
                                refresh=False)
            bar.update(len(item.entries))

        def collect(timeout: float) -> None:
            finished, _ = cf.wait(list(pending), timeout=timeout, return_when=cf.FIRST_COMPLETED)
            assert executor is not None
            if translated := executor.drain_progress():
                in_flight[0] += translated
                bar.set_postfix_str(f"{in_flight[0]} more translated, not committed")
            # Every chunk that finished is committed, in chunk order, before a failed one's error is raised: work
            # done before a crash is never lost (``finished`` is a set, so a failure could otherwise come first).
            failures: list[BaseException] = []
            for future in sorted(finished, key=lambda f: pending[f].chunk):
                item = pending.pop(future)
                error = future.exception()
                if error is not None:
                    failures.append(error)
                    continue
                commit(item, future.result())
            if failures:
                raise failures[0]

        try:
            for chunk, entries in read_chunks(job, lambda c: c not in done, seen):
                item = parse_chunk(parser, chunk, entries)
                records = item.records
                if not records:
                    commit(item, [])
                    continue
                if executor is None:
                    t0 = time.monotonic()
                    executor = self.make_executor()
                    committer.stats.startup = time.monotonic() - t0
                while len(pending) >= executor.capacity:
                    collect(0.2)
                references = item.references() if job.score_references else None
                pending[executor.submit(chunk, item.sources(job), references)] = item
            while pending:
                collect(0.2)
        finally:
            if executor is not None:
                for future in pending:
                    future.cancel()
                executor.shutdown()
        return seen[0]


class Committer:
    """Commits translated chunks: a chunk's entries in index order, each a translation or a reject."""

    def __init__(self, state: StateDir, job: Job, stats: RunStats) -> None:
        self.state = state
        self.job = job
        self.stats = stats
        self.encoder = OutputEncoder(job.output_format)

    def commit(self, item: ParsedChunk, outcomes: list[Outcome]) -> None:
        """Encode and commit one chunk; ``outcomes``: one per record of the chunk, in order."""
        job, stats = self.job, self.stats
        aligned = job.output_format == "text"  # plain-text output keeps line alignment: a reject leaves an empty line
        results = iter(outcomes)
        items: list[bytes] = []
        rejects: list[Reject] = []
        hyps: list[str] = []
        refs: list[str | None] = []
        source_tokens = target_tokens = reference_tokens = references_scored = 0
        reference_log_prob = 0.0
        for entry, parsed in zip(item.entries, item.parsed, strict=True):
            if isinstance(parsed, Record):
                outcome = next(results)
                if not isinstance(outcome, str):
                    items.append(self.encoder.encode(parsed, outcome))
                    hyps.append(outcome.text)
                    refs.append(parsed.reference)
                    source_tokens += outcome.input_tokens or 0
                    target_tokens += outcome.output_tokens or 0
                    if outcome.ref_log_prob is not None:
                        references_scored += 1
                        reference_log_prob += outcome.ref_log_prob
                        reference_tokens += outcome.ref_tokens or 0
                    continue
                parsed = Reject(entry.index, entry.file, entry.position, outcome)
            rejects.append(parsed)
            if aligned:
                items.append(b"\n")
        if next(results, None) is not None:
            raise RuntimeError(f"chunk {item.chunk}: the worker returned more outcomes than records")
        meta = ChunkMeta(chunk=item.chunk, records=len(hyps), data_bytes=0, rejects=[r.to_dict() for r in rejects],
                         hypotheses=hyps, references=refs, source_tokens=source_tokens, target_tokens=target_tokens,
                         entries=len(item.entries), input_sha256=item.digest, references_scored=references_scored,
                         reference_log_prob=reference_log_prob, reference_tokens=reference_tokens)
        self.state.commit(meta, encode_items(items, job.output_format))
        stats.translated += len(hyps)
        stats.source_tokens += source_tokens
        stats.target_tokens += target_tokens
        for r in rejects:
            logger.info("rejected record %d (%s:%d): %s", r.index, r.file, r.position, r.reason)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int | None, initial: int, enabled: bool) -> Bar:
    """tqdm on stderr: records committed of the total (what a rerun keeps), records/s and the time left, and the
    records translated but not committed yet (every 15 s when not a terminal)."""
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    bar: Bar = tqdm(total=total, initial=initial, unit="rec", desc="batch-score", file=sys.stderr, dynamic_ncols=tty,
                    mininterval=0.5 if tty else 15.0, smoothing=0.1)
    return bar
