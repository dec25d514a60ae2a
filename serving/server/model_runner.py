"""One served model (:class:`ModelRunner`): its engine, loaded and warmed up on its batcher's worker thread, and the
batcher that runs its requests. ``serving.server.service`` routes requests to runners; a model repository
(``serving.server.repository``) starts and retires them as versions come and go.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Hashable
from pathlib import Path

from serving.engine.decoding import Alive
from serving.engine.errors import DeadlineExceeded, ModelNotReady, Overloaded
from serving.engine.planner import decode_together
from serving.engine.request import DecodeOptions, Engine, ModelInfo, OnPartial, ReferenceScore, Sentence, Translation
from serving.package import read_manifest
from serving.server.batching import Batcher, BatchLimits, DecoderRunner, DynamicBatcher, StepBatcher, StepRunner
from serving.server.batching.queue import as_serving_error
from serving.server.metrics import Served, ServingMetrics
from serving.server.settings import ServingSettings
from serving.server.statistics import ModelStatistics

logger = logging.getLogger(__name__)

WARMUP_TEXTS = ["Hello world.", "This is a warm-up sentence for the translation server."]


class ModelRunner:
    """One served model: its translator (loaded on the worker thread) and its batcher.

    ``name`` and ``version``, when given (a model repository's directory names), are what the model is served as;
    otherwise the package's manifest says.
    """

    def __init__(
        self,
        settings: ServingSettings,
        metrics: ServingMetrics,
        *,
        package_dir: Path | None = None,
        translator: Engine | None = None,
        name: str | None = None,
        version: str | None = None,
    ) -> None:
        self.package_dir = package_dir
        self.translator: Engine | None = translator
        if translator is not None:
            self.name = name or str(translator.info.name)
            version = version or str(translator.info.version)
        else:
            assert package_dir is not None
            # The manifest names the model; reading it is cheap (checksums are verified when the engine loads).
            manifest = read_manifest(package_dir)
            self.name = name or str(manifest.get("name") or package_dir.name)
            version = version or str(manifest.get("version") or "")
        self._version = version
        self.active = 0  # requests admitted and not yet done: a retiring version stops once it is 0
        self.ready = False
        self.load_error: str | None = None
        self._settings = settings
        self._metrics = metrics
        self.batcher: Batcher[Sentence, Translation] | None = None
        self.scoring = 0  # pairs admitted to score() and not yet done (bounded by max_queue_size)
        self.statistics = ModelStatistics()  # Triton's statistics of this version (cumulative, from its start)
        self._served: Served | None = None  # what /metrics shows of it while it serves

    @property
    def info(self) -> ModelInfo:
        if self.translator is None:
            raise ModelNotReady(f"model {self.name!r} is still loading")
        info = self.translator.info
        if (info.name, info.version) != (self.name, self._version):
            info = dataclasses.replace(info, name=self.name, version=self._version)
        return info

    @property
    def version_name(self) -> str:
        """The version served: the repository's, else the package's ("" for a package without one)."""
        return self._version

    def release(self) -> None:
        """Drop the engine of a stopped runner (its memory goes with the last reference)."""
        self.ready = False
        self.translator = None

    def start(self) -> None:
        s = self._settings
        # The batcher cuts under the budget the engine is loaded with (load): the engine never cuts its batches again.
        limits = BatchLimits(
            max_items=s.max_batch_size,
            max_cost=s.max_batch_tokens,
            max_delay_s=s.max_queue_delay_us / 1e6,
            queue_capacity=s.max_queue_size,
            retry_after_s=s.retry_after_s,
        )
        observer = self._metrics.observer(self.name, self.statistics)
        if s.batching == "step":
            self.batcher = StepBatcher(self._step_runner, limits, observer, name=self.name)
        else:
            self.batcher = DynamicBatcher(self._run_batch, limits, observer, name=self.name)
        self.batcher.start()

    async def load(self) -> None:
        """Load (unless a translator was given) and warm up, on the worker thread; then mark ready."""
        assert self.batcher is not None
        started = time.monotonic()
        if self.translator is None:
            package_dir = self.package_dir
            assert package_dir is not None
            from serving.engine.translator import Translator

            s = self._settings
            self.translator = await self.batcher.call_in_worker(
                lambda: Translator.load(package_dir, runtime=s.runtime, precision=s.precision, threads=s.threads,
                                        max_batch_size=s.max_batch_size, max_batch_tokens=s.max_batch_tokens,
                                        shortlist=s.shortlist, spin=s.spin)
            )
        if self._settings.warmup:
            await self.batcher.call_in_worker(self._warm_up)
        info = self.info
        self._served = Served(self.name, self._version, info.runtime, info.precision, self.statistics,
                              self.pending_requests)
        self._metrics.publish(self._served)
        elapsed = time.monotonic() - started
        self._metrics.model_load_seconds.labels(info.name).set(elapsed)
        self.ready = True
        where = f" from {self.package_dir}" if self.package_dir is not None else ""
        logger.info("model %s version %s ready (%s/%s)%s in %.2fs", info.name, info.version or "-", info.runtime,
                    info.precision, where, elapsed)

    def withdraw(self) -> None:
        """No longer served (retired, unloaded, or its load failed): its series leave ``/metrics``."""
        if self._served is not None:
            self._metrics.withdraw(self._served)
            self._served = None

    def pending_requests(self) -> int:
        """Requests admitted with sentences still waiting for a batch (Triton's pending request count)."""
        if self.batcher is None:
            return 0
        return len({id(item.request) for group in self.batcher.groups.values() for item in group})

    async def score(self, sources: list[str], targets: list[str],
                    deadline: float | None = None) -> list[ReferenceScore]:
        """``Engine.score`` on the worker thread, which owns the runtime: between batches of translations, never
        beside one (with step-level batching, between two decoder steps).

        Pairs waiting for the worker or being scored are bounded as queued sentences are (``max_queue_size``):
        beyond it a request is refused at once, so a flood of scoring requests cannot queue without bound.

        Raises:
            Overloaded: the pairs already admitted and these would exceed ``max_queue_size`` (503 + Retry-After).
            DeadlineExceeded: ``deadline`` (``time.monotonic()``) passed first; the scoring already started runs on.
            ServingError: what the engine raises (InvalidInput, InputTooLong, InferenceFailed; any other error
                becomes InferenceFailed).
        """
        assert self.translator is not None and self.batcher is not None
        capacity = self._settings.max_queue_size
        if self.scoring + len(sources) > capacity:
            raise Overloaded(f"scoring queue full ({self.scoring} of {capacity} pairs waiting); retry later",
                             retry_after=self._settings.retry_after_s)
        self.scoring += len(sources)
        work = asyncio.ensure_future(self.batcher.call_in_worker(self.translator.score, sources, targets))
        # The pairs stay counted until the worker is done with them, even when the client stopped waiting.
        work.add_done_callback(lambda done: self._scored(len(sources), done))
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(asyncio.shield(work), timeout)
        except TimeoutError:
            raise DeadlineExceeded(f"request deadline passed while scoring {len(sources)} pairs") from None
        except Exception as e:  # an engine's unexpected error is the runtime's failure (500), logged once
            raise as_serving_error(e) from e

    def _scored(self, pairs: int, done: asyncio.Future[list[ReferenceScore]]) -> None:
        self.scoring -= pairs
        if not done.cancelled():
            done.exception()  # retrieved: a client that stopped waiting has been answered already

    def _warm_up(self) -> None:
        assert self.translator is not None
        for on_partial in (None, lambda i, t: None):  # streamed batches detokenize partial results: warm that too
            self.translator.translate(WARMUP_TEXTS, DecodeOptions(), on_partial)

    def _run_batch(self, key: Hashable, payloads: list[Sentence], on_partial: OnPartial | None, alive: Alive
                   ) -> list[Translation]:
        assert self.translator is not None
        return decode_together(self.translator, payloads, on_partial, alive)

    def _step_runner(self) -> StepRunner:
        from serving.engine.continuous import ContinuousDecoder
        from serving.engine.translator import Translator

        if not isinstance(self.translator, Translator):
            raise ModelNotReady(f"model {self.name!r}: step-level batching needs a loaded engine")
        return DecoderRunner(ContinuousDecoder(self.translator))

    async def stop(self) -> None:
        if self.batcher is not None:
            await self.batcher.stop()
