"""The canary (``mtgate serve --shadow CANDIDATE --canary-fraction F``): a share of the default model's requests is
answered by the shadow candidate instead of production, with an automatic rollback to 0 when the candidate breaks its
targets.

Which requests: a request is sampled from its request id (``X-Request-ID``, or the id the server gave it), so the
same id always goes the same way; requests without one (a gRPC request without an id) from a seeded stream. The
routes that go through ``TranslationService.translate``/``translate_documents`` are canaried: ``/v1/translate``
(``split_sentences`` too), ``/v2`` infer, gRPC ModelInfer and ModelStreamInfer. ``/v1/translate/stream``, gRPC's
``stream: true`` requests and bulk are answered by production: a stream's partial text comes from the batcher, which
the candidate's process has no part in (and its headers are sent before a fallback could happen), and bulk is
throughput work paced by production's queue.

The candidate's answer comes from its process (``serving.server.shadow.candidate``), ahead of any queued shadow
work, within ``canary_timeout_ms`` (and the request's own deadline). When it fails (an error, its process died, no
answer in time) production answers that request: the client gets production's answer, never the candidate's error;
the failure counts against the candidate (once production has answered: an input both refuse is the client's).

Rollback: over the candidate's last ``canary_window`` canary requests (once ``canary_min_requests`` are in), an error
rate above ``canary_max_error_rate`` or a p95 latency above ``canary_max_p95_ms`` sets the fraction to 0: one ERROR
log line says why, ``mtgate_canary_rollbacks_total`` counts it, ``mtgate_canary_fraction`` drops to 0 and ``GET
/v1/shadow`` shows the state, the reason and when. It stays there until the server restarts or an operator sets a
fraction (``POST /v1/shadow/canary``, :meth:`Canary.set_fraction`): above 0 re-arms the canary with an empty window.

Which model answered: the HTTP middleware puts :data:`ANSWERED_BY`'s value into the response headers
``X-Mtgate-Answered-By`` (``production`` or ``candidate``) and ``X-Mtgate-Answered-Model`` (``name@version/precision``;
the body's ``model``/``version`` keep naming the model the client asked for); gRPC ModelInfer sends the same two
keys as trailing metadata (``serving.server.grpc.servicer``; not ModelStreamInfer, whose responses share a stream).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import hashlib
import logging
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from serving.engine.errors import InvalidInput
from serving.engine.request import Translation
from serving.server.limits import Admission
from serving.server.settings import ServingSettings
from serving.server.shadow.candidate import CandidateJob, CandidateLoading, CandidateResult
from serving.server.shadow.metrics import CanaryMetrics

logger = logging.getLogger(__name__)

ANSWERED_BY: ContextVar[list[tuple[str, str]] | None] = ContextVar("mtgate_answered_by", default=None)
"""Set by a transport to an empty list per request; the service appends ``(who, model)`` when a canary is configured:
``who`` is ``production`` or ``candidate``, ``model`` its ``name@version/precision``."""

ANSWERED_BY_HEADER = "x-mtgate-answered-by"
ANSWERED_MODEL_HEADER = "x-mtgate-answered-model"


def answered(who: str, model: str) -> None:
    """Record who answers the current request (a no-op where no transport asked)."""
    marks = ANSWERED_BY.get()
    if marks is not None:
        marks.append((who, model))


@dataclass(frozen=True)
class CanaryAnswer:
    """The candidate's translations, or why production answers instead (``error``; None: not sampled)."""

    translations: list[Translation] | None
    error: str | None = None
    seconds: float = 0.0


Submit = Callable[[CandidateJob], "concurrent.futures.Future[CandidateResult]"]


class Canary:
    """The sampling, the sliding window of the candidate's outcomes, and the rollback.

    Arguments:
        settings: the server's settings (``canary_*`` fields).
        registry: the Prometheus registry for the ``mtgate_canary_*`` series.
        model, candidate: the production model's name and the candidate's label (metrics, log, headers).
        submit: hands a job to the candidate ahead of queued shadow work (``Shadow.submit``); raises when the
            candidate cannot take it (``CandidateLoading`` at the server's start: production answers, not counted;
            otherwise, restarting or failed: counted against it).
    """

    def __init__(self, settings: ServingSettings, registry: CollectorRegistry, model: str, candidate: str,
                 submit: Submit) -> None:
        self.settings = settings
        self.model = model
        self.candidate = candidate
        self.fraction = settings.canary_fraction
        self.state = "active"  # -> rolled_back (automatic), off (an operator's 0); an operator's F > 0: active again
        self.reason: str | None = None
        self.rolled_back_at: str | None = None
        self.counts = {"sampled": 0, "candidate": 0, "fallback": 0}
        self.metrics = CanaryMetrics(registry, model, candidate)
        # Read at every scrape: the gauges cannot disagree with the state they show.
        self.metrics.fraction.set_function(lambda: self.fraction)
        self.metrics.rolled_back.set_function(lambda: float(self.state == "rolled_back"))
        self._submit = submit
        self._window: collections.deque[tuple[bool, float]] = collections.deque(maxlen=settings.canary_window)
        self._lock = threading.Lock()
        self._stream = random.Random(0)  # requests without an id

    def sampled(self, request_id: str) -> bool:
        """Whether the candidate answers the request with this id (the same id always gets the same answer)."""
        fraction = self.fraction
        if fraction <= 0:
            return False
        if fraction >= 1:
            return True
        if not request_id:
            return self._stream.random() < fraction
        digest = hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < fraction

    async def answer(self, texts: Sequence[str], admission: Admission) -> CanaryAnswer:
        """The candidate's translations of ``texts``, or (``translations`` None) why it has none in time. Never
        raises a candidate's failure (a cancelled request's CancelledError goes through)."""
        started = time.monotonic()
        timeout = self.settings.canary_timeout_ms / 1000
        if admission.deadline is not None:
            timeout = max(0.0, min(timeout, admission.deadline - started))
        prefix = admission.target_prefix
        job = CandidateJob(list(texts), admission.options, None if prefix is None else list(prefix), [], canary=True)
        try:
            future = self._submit(job)
        except CandidateLoading:  # the server's start: production answers, nobody's failure
            return CanaryAnswer(None)
        except Exception as e:  # restarting after a crash, failed to load
            self.counts["sampled"] += 1
            return CanaryAnswer(None, str(e) or type(e).__name__, time.monotonic() - started)
        self.counts["sampled"] += 1
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            error = f"no answer within {timeout * 1000:.0f} ms"
        except Exception as e:  # the candidate's error, its process' death, or it is not there
            error = str(e) or type(e).__name__
        else:
            if result.translations is not None and len(result.translations) == len(texts):
                seconds = time.monotonic() - started
                self.counts["candidate"] += 1
                self.metrics.outcome["candidate"].inc()
                self._record(True, seconds)
                return CanaryAnswer(result.translations, None, seconds)
            error = "the candidate answered a different number of translations"
        finally:
            if not future.done():
                future.cancel()  # not started yet: the worker skips it
        return CanaryAnswer(None, error, time.monotonic() - started)

    async def route(self, texts: Sequence[str], admission: Admission, check: Callable[[], object],
                    production: Callable[[], Awaitable[list[Translation]]]) -> list[Translation]:
        """The candidate's translations of a sampled request (``check``: the server's limits, first), else
        ``production()``'s; production's too when the candidate fails, counted against it once production answered
        (an input both refuse is the client's)."""
        if not self.sampled(admission.tag):
            return await production()
        check()
        answer = await self.answer(texts, admission)
        if answer.translations is not None:
            answered("candidate", self.candidate)
            return answer.translations
        translations = await production()
        if answer.error is not None:
            self.failed(answer)
        return translations

    def failed(self, answer: CanaryAnswer) -> None:
        """Production answered a request the candidate failed: count it against the candidate."""
        self.counts["fallback"] += 1
        self.metrics.outcome["fallback"].inc()
        logger.warning("canary candidate %s failed a request (production answered it): %s", self.candidate,
                       answer.error)
        self._record(False, answer.seconds)

    def _record(self, ok: bool, seconds: float) -> None:
        self.metrics.seconds.observe(seconds)
        with self._lock:
            self._window.append((ok, seconds))
            window = list(self._window)
        errors = sum(not ok for ok, _ in window)
        error_rate, p95 = errors / len(window), _p95([s for _, s in window])
        self.metrics.error_rate.set(error_rate)
        self.metrics.p95.set(p95)
        if self.state != "active" or len(window) < self.settings.canary_min_requests:
            return
        s = self.settings
        if error_rate > s.canary_max_error_rate:
            self.rollback(f"error rate {error_rate:.3f} ({errors} of {len(window)}) above canary_max_error_rate "
                          f"{s.canary_max_error_rate}")
        elif s.canary_max_p95_ms is not None and p95 * 1000 > s.canary_max_p95_ms:
            self.rollback(f"p95 latency {p95 * 1000:.0f} ms over {len(window)} requests above canary_max_p95_ms "
                          f"{s.canary_max_p95_ms:g}")

    def rollback(self, reason: str) -> None:
        """Answer every request from production from now on."""
        with self._lock:
            if self.state != "active":
                return
            self.state, self.fraction, self.reason = "rolled_back", 0.0, reason
            self.rolled_back_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        self.metrics.rollbacks.inc()
        logger.error("canary rolled back to 0: candidate %s: %s; production answers every request of model %s",
                     self.candidate, reason, self.model)

    def set_fraction(self, fraction: float) -> None:
        """An operator's fraction (``POST /v1/shadow/canary``): above 0 re-arms the canary (a rollback's state and
        the sliding window cleared), 0 turns it off until set again. One INFO line, ``mtgate_canary_fraction_sets_total``.

        Raises:
            InvalidInput: ``fraction`` is not within [0, 1].
        """
        if not 0.0 <= fraction <= 1.0:  # NaN too
            raise InvalidInput(f"the canary fraction must be within [0, 1], got {fraction!r}")
        with self._lock:
            previous, self.fraction = self.state, fraction
            self.reason = self.rolled_back_at = None
            if fraction > 0:
                self.state = "active"
                self._window.clear()
            else:
                self.state, self.reason = "off", "set to 0 by an operator (POST /v1/shadow/canary)"
        self.metrics.error_rate.set(0)
        self.metrics.p95.set(0)
        self.metrics.sets.inc()
        logger.info("canary fraction set to %g by an operator: candidate %s of model %s (was %s, now %s)", fraction,
                    self.candidate, self.model, previous, self.state)

    def to_json(self) -> dict[str, Any]:
        """The ``canary`` part of ``GET /v1/shadow``."""
        with self._lock:
            window = list(self._window)
        s = self.settings
        return {
            "fraction": self.fraction,
            "configured_fraction": s.canary_fraction,
            "state": self.state,
            "reason": self.reason,
            "rolled_back_at": self.rolled_back_at,
            "requests": dict(self.counts),
            "window": {
                "requests": len(window),
                "errors": sum(not ok for ok, _ in window),
                "error_rate": round(sum(not ok for ok, _ in window) / len(window), 4) if window else None,
                "p95_ms": round(_p95([sec for _, sec in window]) * 1000, 1) if window else None,
            },
            "targets": {"max_error_rate": s.canary_max_error_rate, "max_p95_ms": s.canary_max_p95_ms,
                        "window": s.canary_window, "min_requests": s.canary_min_requests,
                        "timeout_ms": s.canary_timeout_ms},
        }


def _p95(values: Sequence[float]) -> float:
    """The nearest-rank 95th percentile (0 of nothing)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
