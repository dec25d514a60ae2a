"""Where the shadow candidate runs: in a child process of its own (:class:`ChildCandidate`, what ``--shadow PKG``
uses) or, for an engine handed in (tests, embedding), on the shadow worker thread (:class:`LocalCandidate`).

The child process keeps the candidate off production's interpreter: its Python work never takes the server's GIL
(production's event loop and batcher thread), it runs at nice +19 (0 when it answers canary requests) with its own
runtime threads, and if it dies (a crash in the runtime, the OOM killer) the server only counts, logs and restarts it
(``serving.server.shadow.worker``). The worker thread sends it one job at a
time over a pipe and waits, without the GIL, for the answer.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from serving.engine.request import DecodeOptions, Engine, Translation

NICE = 19  # the candidate's niceness above the server's (0 with a canary: its answers are on the critical path)


@dataclass(frozen=True)
class CandidateJob:
    texts: list[str]
    options: DecodeOptions
    target_prefix: list[str] | None
    production: list[str]  # production's translations, for the cross-likelihood
    canary: bool = False  # a canary request (``serving.server.shadow.canary``): the whole translations, no scores


CROSS_SCORES = ("candidate_own", "candidate_on_production", "production_own", "production_on_candidate")
"""The cross-likelihood scores of a pair: who scores (the candidate, production) which translation (the mean
log-probability per token, EOS included, teacher-forced: ``Engine.score``)."""


@dataclass(frozen=True)
class CandidateResult:
    texts: list[str]
    seconds: float  # the candidate's translation (not its scoring)
    scores: dict[str, list[float]]  # of CROSS_SCORES, those computed: one per sentence
    translations: list[Translation] | None = None  # a canary job's: what the client gets


class Candidate(Protocol):
    def start(self) -> None:
        """Load the candidate (raises what loading raised)."""

    def run(self, job: CandidateJob) -> CandidateResult:
        """Translate (and score) one job (raises what the candidate raised)."""

    def close(self) -> None: ...


def run_job(engine: Engine, job: CandidateJob, cross: bool, production: Engine | None = None) -> CandidateResult:
    """What the candidate does with a job, wherever it runs; ``production``: a copy of the production model to score
    both translations with as well."""
    started = time.monotonic()
    translations = engine.run(engine.prepare(job.texts, job.options, job.target_prefix))
    seconds = time.monotonic() - started
    if job.canary:
        return CandidateResult([t.text for t in translations], seconds, {}, list(translations))
    texts = [t.text for t in translations]
    scores: dict[str, list[float]] = {}
    n = len(job.texts)
    for scorer, model, first, second in (("candidate", engine, "own", "on_production"),
                                         ("production", production, "on_candidate", "own")):
        if not cross or model is None:
            continue
        try:  # the candidate's translations first, then production's
            found = [s.mean_log_prob for s in model.score(job.texts * 2, texts + job.production, truncate=True)]
        except Exception:  # noqa: S112 - a text this model cannot score (too long for it): compared without
            continue
        scores[f"{scorer}_{first}"], scores[f"{scorer}_{second}"] = found[:n], found[n:]
    return CandidateResult(texts, seconds, scores)


class LocalCandidate:
    """An engine built by ``load``, run on the calling (shadow worker) thread."""

    def __init__(self, load: Callable[[], Engine], cross: bool) -> None:
        self._load = load
        self._cross = cross
        self._engine: Engine | None = None

    def start(self) -> None:
        self._engine = self._load()

    def run(self, job: CandidateJob) -> CandidateResult:
        assert self._engine is not None
        return run_job(self._engine, job, self._cross)

    def close(self) -> None:
        self._engine = None


class CandidateCrashed(RuntimeError):
    """The candidate's process died."""


class CandidateUnavailable(RuntimeError):
    """The candidate cannot take a job now (restarting after a crash, failed to load, stopping)."""


class CandidateLoading(CandidateUnavailable):
    """The candidate is still loading (at the server's start): not a failure of the candidate."""


class ChildCandidate:
    """The package at ``path`` loaded in a child process (spawned: no state of the server is inherited); with
    ``production`` (a package and precision), a copy of the production model beside it, to score with."""

    def __init__(self, path: Path, runtime: str, precision: str, threads: int, cross: bool,
                 production: tuple[Path, str] | None = None, nice: int = NICE) -> None:
        self._args = (str(path), runtime, precision, threads, cross,
                      None if production is None else (str(production[0]), production[1]), nice)
        self._process: Any = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        pid = None if self._process is None else self._process.pid  # None until the (re)started process runs
        return None if pid is None else int(pid)

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self._process = context.Process(target=_child_main, args=(child, *self._args), name="mtgate-shadow",
                                        daemon=True)
        self._process.start()
        child.close()
        self._conn = parent
        self._answer()  # "ready", or the load's error

    def run(self, job: CandidateJob) -> CandidateResult:
        assert self._conn is not None
        try:
            self._conn.send(job)
        except (OSError, EOFError):
            raise CandidateCrashed(self._died()) from None
        result = self._answer()
        assert isinstance(result, CandidateResult)
        return result

    def _answer(self) -> Any:
        assert self._conn is not None
        try:
            kind, value = self._conn.recv()
        except (OSError, EOFError):
            raise CandidateCrashed(self._died()) from None
        if kind == "error":
            raise RuntimeError(value)
        return value

    def _died(self) -> str:
        self._process.join(5)
        return f"the candidate's process (pid {self._process.pid}) died (exit code {self._process.exitcode})"

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)


def _child_main(conn: Connection, path: str, runtime: str, precision: str, threads: int, cross: bool,
                production_package: tuple[str, str] | None, nice: int) -> None:
    with contextlib.suppress(OSError):
        os.nice(nice)
    try:
        from serving.engine.translator import Translator

        engine = Translator.load(path, runtime=runtime, precision=precision, threads=threads)
        production = None if production_package is None else Translator.load(
            production_package[0], runtime=runtime, precision=production_package[1], threads=threads)
    except BaseException as e:  # noqa: BLE001 - said to the server, which logs it
        conn.send(("error", str(e) or type(e).__name__))
        return
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if job is None:
            return
        try:
            conn.send(("result", run_job(engine, job, cross, production)))
        except Exception as e:
            conn.send(("error", str(e) or type(e).__name__))
