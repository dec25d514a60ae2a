"""The shadow (``mtgate serve --shadow CANDIDATE``): a candidate model that also translates a sampled share of the
production model's requests, off the critical path, so that it can be compared with production on live traffic.

The service (``serving.server.service``) hands every admitted request to :meth:`Shadow.observe`; a sampled one is
queued once production has answered it (its translations are what the candidate is compared with). The queue is
bounded (``shadow_queue_size``) and drained by one worker thread of its own, which hands each job to the candidate:
a child process with its own thread budget (``shadow_threads``) at a lower CPU priority (nice +19;
``serving.server.shadow.candidate``). When the queue is full a request is shed and counted, never waited for.
Nothing the shadow does (load, translate, compare, log) raises into a request, and a candidate whose process dies
takes nothing down with it: a failure is logged and counted, and a dead process is restarted after a backoff (1 s,
doubling up to 60 s while it keeps dying; counted in ``mtgate_shadow_restarts_total``). Production answers exactly as
without a shadow.

With a canary (``canary_fraction``, ``serving.server.shadow.canary``) the same worker also takes the canary's jobs
(:meth:`Shadow.submit`), ahead of the queued shadow work: their answers are on the critical path.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from serving.engine.request import DecodeOptions, Engine, Translation
from serving.package import read_manifest
from serving.package.precision import choose_precision
from serving.server.settings import ServingSettings
from serving.server.shadow.canary import Canary
from serving.server.shadow.candidate import (
    NICE,
    Candidate,
    CandidateCrashed,
    CandidateJob,
    CandidateLoading,
    CandidateResult,
    CandidateUnavailable,
    ChildCandidate,
    LocalCandidate,
)
from serving.server.shadow.compare import SCORER, compare
from serving.server.shadow.log import PairLog, text_hash
from serving.server.shadow.metrics import ShadowMetrics
from serving.server.shadow.summary import ShadowSummary

logger = logging.getLogger(__name__)

RESTART_FIRST_S = 1.0  # the first restart of a dead candidate waits this long; each one more in a row twice as long
RESTART_MAX_S = 60.0


@dataclass(frozen=True)
class ShadowJob:
    """A request production has answered, for the candidate to translate too."""

    request_id: str
    texts: list[str]
    options: DecodeOptions
    target_prefix: list[str] | None
    production: list[Translation]
    production_s: float  # admission to answer


def candidate_label(path: Path, runtime: str, precision: str) -> str:
    """How the metrics and the summary name the candidate: ``name@version/precision`` from its manifest (``auto``
    resolved as the engine will resolve it)."""
    try:
        manifest = read_manifest(path)
        name, version = str(manifest.get("name") or path.name), str(manifest.get("version") or "")
        precision = choose_precision(manifest, runtime, precision).precision
    except Exception:  # an unreadable package fails to load later, where it is logged and counted
        name, version = path.name, ""
    return f"{name}@{version}/{precision}" if version else f"{name}/{precision}"


class Shadow:
    """The candidate, its queue and worker thread, and what the comparisons add up to.

    Arguments:
        settings: the server's settings (``shadow*`` fields).
        registry: the Prometheus registry to add the shadow's series to.
        model: the production model's name (requests to other models are not shadowed).
        load: builds the candidate's engine, run on the worker thread (tests); default: the package
            ``settings.shadow`` in a child process.
        production: the production model's package: with ``shadow_production_score``, the child loads a copy to
            score both translations with it too.
    """

    def __init__(self, settings: ServingSettings, registry: CollectorRegistry, model: str,
                 load: Callable[[], Engine] | None = None, production: Path | None = None) -> None:
        assert settings.shadow is not None or load is not None
        self.settings = settings
        self.model = model
        path = settings.shadow or Path("candidate")
        self.candidate = candidate_label(path, settings.runtime, settings.shadow_precision)
        self._candidate: Candidate = (
            LocalCandidate(load, settings.shadow_cross_score) if load is not None
            else ChildCandidate(path, settings.runtime, settings.shadow_precision, settings.shadow_threads,
                                settings.shadow_cross_score,
                                (production, settings.precision)
                                if production is not None and settings.shadow_production_score else None,
                                nice=0 if settings.canary_fraction > 0 else NICE)
        )
        self.metrics = ShadowMetrics(registry, model, self.candidate)
        self.summary = ShadowSummary()
        self.state = "loading"  # -> ready | failed; ready -> restarting -> ready
        self.error: str | None = None
        self.counts = dict.fromkeys(("sampled", "compared", "shed", "failed", "unavailable"), 0)
        self.restarts = 0
        salt = settings.shadow_redact_salt
        self._salt = secrets.token_bytes(16) if salt is None else salt.get_secret_value().encode()
        self.canary = (Canary(settings, registry, model, self.candidate, self.submit)
                       if settings.canary_fraction > 0 else None)
        self._queue: queue.Queue[ShadowJob] = queue.Queue(settings.shadow_queue_size)
        self._urgent: collections.deque[tuple[CandidateJob, concurrent.futures.Future[CandidateResult]]] = \
            collections.deque()
        self._work = threading.Semaphore(0)  # released once per job put in either queue
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shadow", daemon=True)
        self._log: PairLog | None = None
        self._random = random.Random()

    # -- the event loop's side -----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    async def stop(self) -> None:
        """Stop the worker (the job it is on finishes; queued ones are dropped) and close the log."""
        self._stopping.set()
        await asyncio.to_thread(self._thread.join, 30)

    def observe(self, model: str, texts: Sequence[str], options: DecodeOptions, target_prefix: Sequence[str] | None,
                done: asyncio.Future[list[Translation]], admitted: float, request_id: str) -> None:
        """A request admitted to ``model``: if it is production's and sampled, queue it for the candidate once
        production has answered it (a request that failed or was cancelled is not)."""
        if model != self.model:
            return
        fraction = self.settings.shadow_fraction
        if fraction < 1.0 and self._random.random() >= fraction:
            return
        texts, prefix = list(texts), None if target_prefix is None else list(target_prefix)

        def answered(future: asyncio.Future[list[Translation]]) -> None:
            if future.cancelled() or future.exception() is not None:
                return
            self.offer(ShadowJob(request_id, texts, options, prefix, future.result(), time.monotonic() - admitted))

        done.add_done_callback(answered)

    def offer(self, job: ShadowJob) -> None:
        """Queue ``job`` unless the queue is full (shed) or the candidate cannot translate (unavailable)."""
        self._count("sampled")
        if self.state in ("failed", "restarting") or not self._thread.is_alive() or self._stopping.is_set():
            self._count("unavailable")
            return
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self._count("shed")
            return
        self._work.release()
        self.metrics.queue_depth.set(self._queue.qsize())

    def submit(self, job: CandidateJob) -> concurrent.futures.Future[CandidateResult]:
        """Have the candidate run ``job`` next (before queued shadow work): the canary's way to it.

        Raises:
            CandidateLoading: it is still loading.
            CandidateUnavailable: it is restarting or failed to load, ``shadow_queue_size`` canary jobs are already
                waiting, or the shadow is stopping.
        """
        if self.state == "loading" and not self._stopping.is_set():
            raise CandidateLoading("the candidate is loading")
        if self.state != "ready" or self._stopping.is_set():
            raise CandidateUnavailable(f"the candidate is {self.state if not self._stopping.is_set() else 'stopping'}")
        if len(self._urgent) >= self.settings.shadow_queue_size:  # a candidate that cannot keep up
            raise CandidateUnavailable(f"the candidate is busy ({len(self._urgent)} canary requests waiting)")
        future: concurrent.futures.Future[CandidateResult] = concurrent.futures.Future()
        self._urgent.append((job, future))
        self._work.release()
        return future

    def to_json(self) -> dict[str, Any]:
        """``GET /v1/shadow``."""
        return {
            "model": self.model,
            "candidate": self.candidate,
            "state": self.state,
            "load_error": self.error,
            "fraction": self.settings.shadow_fraction,
            "pid": getattr(self._candidate, "pid", None),
            "scorer": SCORER,
            "redacted": self.settings.shadow_redact,
            "queue": {"depth": self._queue.qsize(), "capacity": self.settings.shadow_queue_size},
            "requests": dict(self.counts),
            "restarts": self.restarts,
            **self.summary.to_json(),
            **({} if self.canary is None else {"canary": self.canary.to_json()}),
        }

    def _count(self, outcome: str) -> None:
        self.counts[outcome] += 1  # one event loop and one worker thread; a lost increment is no harm here
        if outcome in self.metrics.outcome:
            self.metrics.outcome[outcome].inc()

    # -- the worker thread ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._candidate.start()
            if self.settings.shadow_log is not None:
                self._log = PairLog(self.settings.shadow_log, self.settings.shadow_log_max_bytes,
                                    self.settings.shadow_log_max_files)
        except Exception as e:
            self._fail(f"loading the shadow candidate {self.candidate} failed: {e}")
            return
        self.state = "ready"
        self.metrics.up.set(1)
        logger.info("shadow candidate %s ready (shadowing %s of model %s's requests)", self.candidate,
                    f"{self.settings.shadow_fraction:.0%}", self.model)
        crashes = 0  # in a row: the restart's backoff
        try:
            while not self._stopping.is_set():
                if not self._work.acquire(timeout=0.1):
                    continue
                try:
                    if self._urgent:
                        self._answer(*self._urgent.popleft())
                    else:
                        self._shadow_next()
                    crashes = 0
                except CandidateCrashed as e:
                    crashes += 1
                    if not self._restart(f"shadow candidate {self.candidate}: {e}", crashes):
                        return
        finally:
            self.metrics.up.set(0)
            self._candidate.close()
            if self._log is not None:
                self._log.close()
            self._drop_urgent("stopping")

    def _answer(self, job: CandidateJob, future: concurrent.futures.Future[CandidateResult]) -> None:
        """A canary job: its result, or its error, to ``future`` (skipped when the canary stopped waiting)."""
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(self._candidate.run(job))
        except CandidateCrashed as e:
            future.set_exception(e)
            raise
        except Exception as e:
            future.set_exception(e)

    def _shadow_next(self) -> None:
        try:
            job = self._queue.get_nowait()
        except queue.Empty:  # dropped while the candidate restarted
            return
        self.metrics.queue_depth.set(self._queue.qsize())
        try:
            self._compare(job)
            self._count("compared")
        except CandidateCrashed:
            self._count("failed")
            raise
        except Exception as e:
            self._count("failed")
            logger.warning("shadow candidate %s failed on request %s: %s", self.candidate, job.request_id or "-", e,
                           exc_info=not str(e))

    def _restart(self, error: str, crashes: int) -> bool:
        """Start the candidate's process again after its death, waiting longer each time it dies again in a row
        (or fails to load again). False: the shadow is stopping."""
        self.state, self.error = "restarting", error
        self.metrics.up.set(0)
        self._drop_queued()
        self._drop_urgent("restarting after a crash")
        while True:
            delay = min(RESTART_MAX_S, RESTART_FIRST_S * 2 ** (crashes - 1))
            self.restarts += 1
            self.metrics.restarts.inc()
            logger.error("%s; restarting it in %.0f s (restart %d; production is not affected)", error, delay,
                         self.restarts)
            if self._stopping.wait(delay):
                return False
            self._candidate.close()
            try:
                self._candidate.start()
            except Exception as e:
                error, crashes = f"restarting the shadow candidate {self.candidate} failed: {e}", crashes + 1
                self.error = error
                continue
            self.state = "ready"
            self.metrics.up.set(1)
            logger.info("shadow candidate %s restarted (pid %s)", self.candidate, getattr(self._candidate, "pid", None))
            return True

    def _drop_urgent(self, why: str) -> None:
        while self._urgent:
            _, future = self._urgent.popleft()
            if future.set_running_or_notify_cancel():
                future.set_exception(CandidateUnavailable(f"the candidate is {why}"))

    def _fail(self, error: str) -> None:
        self.state, self.error = "failed", error
        self.metrics.up.set(0)
        logger.error("%s (production is not affected)", error)
        self._drop_queued()

    def _drop_queued(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            self._count("unavailable")
        self.metrics.queue_depth.set(0)

    def _compare(self, job: ShadowJob) -> None:
        result = self._candidate.run(CandidateJob(job.texts, job.options, job.target_prefix,
                                                  [t.text for t in job.production]))
        candidate_s = result.seconds
        self.summary.add_request(job.production_s, candidate_s)
        self.metrics.production_seconds.observe(job.production_s)
        self.metrics.candidate_seconds.observe(candidate_s)
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        salt = self._salt
        redact = (lambda text: text_hash(text, salt)) if self.settings.shadow_redact else str
        for i, (source, production, candidate) in enumerate(zip(job.texts, job.production, result.texts, strict=True)):
            pair = compare(production.text, candidate)
            record: dict[str, Any] = {
                "time": now, "request_id": job.request_id, "index": i, "model": self.model,
                "candidate": self.candidate, "source": redact(source), "production_text": redact(production.text),
                "candidate_text": redact(candidate), "identical": pair.identical,
                "chrf": round(pair.chrf, 3), "bleu": round(pair.bleu, 3),
                "length_ratio": round(pair.length_ratio, 4),
                "production_seconds": round(job.production_s, 6), "candidate_seconds": round(candidate_s, 6),
                **{f"{name}_log_prob": round(values[i], 5) for name, values in result.scores.items()},
            }
            self.summary.add_pair(record)
            self._observe(record)
            if self._log is not None:
                self._log.write(record)

    def _observe(self, record: dict[str, Any]) -> None:
        m = self.metrics
        m.pairs.inc()
        if record["identical"]:
            m.identical.inc()
        m.chrf.observe(record["chrf"])
        m.bleu.observe(record["bleu"])
        m.length_ratio.observe(record["length_ratio"])
        for name, histogram in m.log_prob.items():
            if f"{name}_log_prob" in record:
                histogram.observe(record[f"{name}_log_prob"])

