"""The data plane behind the routes: models (found by name and version through ``serving.server.catalog``), their
batchers, limits, readiness and drain. Knows nothing of HTTP.

A route turns its request into texts and an :class:`~serving.server.limits.Admission` (options and deadline, parsed
and checked once: ``TranslationService.limits.admission``) and calls :meth:`TranslationService.translate` (or
:meth:`TranslationService.admit` for streaming); the service checks the texts against the server's limits, has the engine prepare the
texts (``serving.engine.request.Engine.prepare``: tokenized once, length-checked once), admits the prepared sentences into
the model's batcher (``serving.server.batching``) and returns the engine's translations. :meth:`TranslationService.score`
(reference scoring) checks the same limits and runs ``Engine.score`` on the model's worker thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from serving.engine.decoding import SearchOptions
from serving.engine.documents import (
    Document,
    DocumentTranslation,
    assemble,
    sentences_of,
    source_language,
    split_documents,
)
from serving.engine.errors import InvalidInput, ModelNotFound, ServingError
from serving.engine.request import (
    EMPTY_TRANSLATION,
    Engine,
    OnPartial,
    ReferenceScore,
    Translation,
)
from serving.engine.tokenizers.base import InvalidText
from serving.package import PackageError
from serving.server.batching import Pending
from serving.server.catalog import ModelCatalog
from serving.server.limits import Admission, RequestLimits
from serving.server.metrics import ServingMetrics
from serving.server.model_runner import ModelRunner
from serving.server.preparation import prepare
from serving.server.settings import ServingSettings
from serving.server.shadow import Shadow
from serving.server.shadow.canary import answered

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Key:
    search: SearchOptions  # what the engine decodes with: requests whose options resolve alike share batches
    streaming: bool  # streamed batches pay for partial detokenization; keep them apart from the others


class TranslationService(ModelCatalog):
    """Every served model (:class:`~serving.server.catalog.ModelCatalog`: by name and version) plus the server's state
    (loading -> ready -> draining)."""

    def __init__(
        self,
        settings: ServingSettings,
        metrics: ServingMetrics,
        translators: Sequence[Engine] = (),
        runners: Sequence[ModelRunner] = (),
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.limits = RequestLimits(settings)
        if translators:
            runners = [ModelRunner(settings, metrics, translator=t) for t in translators]
        elif not runners:
            runners = [ModelRunner(settings, metrics, package_dir=p) for p in settings.model_dirs]
        super().__init__(runners)
        self.draining = False
        self.failed: str | None = None
        self.inflight = 0
        # Set when the server is about to close its connections: requests still sending their body get 408 then.
        self.closing = asyncio.Event()
        self.on_fatal: Callable[[str, Exception], None] | None = None
        self.shadow: Shadow | None = None  # serve --shadow: sampled requests are also translated by a candidate

    # -- lifecycle -----------------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return not self.draining and self.failed is None and all(r.ready for r in self.runners())

    def start(self) -> None:
        for runner in self.runners():
            runner.start()

    async def load(self) -> None:
        """Load and warm every model (one after the other: they share the CPU); ready once all are done."""
        for runner in self.runners():
            try:
                await runner.load()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                where = f" from {runner.package_dir}" if runner.package_dir is not None else ""
                self.failed = f"loading model {runner.name!r}{where} failed: {e}"
                runner.load_error = str(e)
                logger.error("%s", self.failed, exc_info=not isinstance(e, ServingError | PackageError))
                if self.on_fatal is not None:
                    self.on_fatal(self.failed, e)
                return
        self.metrics.ready.set(1 if self.ready else 0)

    def begin_drain(self) -> None:
        """Stop taking new work (new requests get 503); requests already admitted run to completion."""
        if not self.draining:
            self.draining = True
            self.metrics.ready.set(0)
            logger.info("draining: refusing new requests, %d in flight", self.inflight)

    async def stop(self) -> None:
        for runner in self.runners():
            await runner.stop()

    # -- requests ------------------------------------------------------------------------------------------------

    async def score(
        self, model: str | ModelRunner | None, sources: Sequence[str], targets: Sequence[str], admission: Admission
    ) -> tuple[ModelRunner, list[ReferenceScore]]:
        """The model's log-likelihood of each target given its source (``Engine.score``), computed on the model's
        worker thread (never beside a batch of translations on the same runtime).

        Raises:
            ModelNotFound, ModelNotReady: no such model, or not ready.
            InvalidInput, LimitExceeded: not one target per source, or texts beyond the server's limits.
            InputTooLong: a source or target with more tokens than the model has positions.
            DeadlineExceeded: the deadline passed first.
            InferenceFailed: the runtime failed.
        """
        runner = self.ready_model(model)
        for subject, texts in (("source", sources), ("target", targets)):
            self.limits.check_texts(texts, subject, "score", "")
        if len(sources) != len(targets):
            raise InvalidInput(f"{len(sources)} sources and {len(targets)} targets; scoring needs one target per "
                               "source")
        runner.active += 1  # until the request is done: a version switch waits for it
        try:
            return runner, await runner.score(list(sources), list(targets), admission.deadline)
        finally:
            runner.active -= 1

    def refuse_unread(self, model: str | None, version: str | None, started: float) -> None:
        """Refuse a translation request whose body is not parsed yet, for ``model`` at ``version`` (None: the default
        model, only when it is the only one: a ``/v1`` body may name another), when that model's queue cannot take
        it whatever it holds (``Batcher.check_unread``, against the server's timeout from ``started``: the latest
        deadline a client may ask for). An unknown or loading model is left to the route.

        Raises:
            Overloaded: no room in the queue for one more sentence, or its work alone ends past the server's timeout.
        """
        if model is None and len(self.models) != 1:
            return
        try:
            runner = self.get(None) if model is None else self.version(model, version)
        except ModelNotFound:
            return
        if runner.ready and runner.batcher is not None:
            runner.batcher.check_unread(started + self.settings.request_timeout_s)

    async def admit(
        self,
        model: str | ModelRunner | None,
        texts: Sequence[str],
        admission: Admission,
        *,
        on_partial: OnPartial | None = None,
        wait_for_room: bool = False,
        documents: Sequence[Document] | None = None,
        indexes: Sequence[int] | None = None,
    ) -> tuple[ModelRunner, Pending[Translation]]:
        """Check and admit ``texts`` (with ``documents``: their sentences, :func:`serving.server.preparation.prepare`; ``indexes``: their
        indexes in the request, for the messages) under ``admission`` (its options, deadline, tag and target
        prefix); await ``pending.wait()`` for the translations.

        Raises:
            ModelNotFound, ModelNotReady, InvalidInput, LimitExceeded, InputTooLong: the request is refused.
            Overloaded: the model's queue is full, or the work queued ahead would make the request miss its deadline
                (not with ``wait_for_room``).
        """
        runner = self.ready_model(model)
        assert runner.batcher is not None
        deadline, tag = admission.deadline, admission.tag
        if not wait_for_room:  # before tokenizing: a server past its capacity refuses cheaply
            runner.batcher.check_admission(deadline, items=len(texts))
        admitted = time.monotonic()
        runner.active += 1  # until the request is done: a version switch waits for it
        try:
            prepared = await prepare(runner, self.limits, texts, admission.options, documents,
                                     admission.target_prefix, indexes)
        except BaseException:
            runner.active -= 1
            raise
        input_s = time.monotonic() - admitted
        key = _Key(prepared.search, on_partial is not None)
        sentences, costs, width = prepared.sentences(), prepared.lengths, prepared.search.beam_size
        try:
            if wait_for_room:
                pending = await runner.batcher.enqueue_when_room(
                    sentences, costs, key=key, deadline=deadline, on_partial=on_partial, tag=tag, width=width
                )
            else:
                pending = runner.batcher.enqueue(sentences, costs, key=key, deadline=deadline, on_partial=on_partial,
                                                 tag=tag, width=width)
        except BaseException:
            runner.active -= 1
            raise
        pending.future.add_done_callback(lambda f: self._record(runner, f, admitted, input_s))
        if self.shadow is not None:
            self.shadow.observe(runner.name, texts, admission.options, admission.target_prefix, pending.future, admitted,
                                tag)
            if self.shadow.canary is not None and runner.name == self.shadow.model:
                answered("production", f"{runner.name}@{runner.info.version}/{runner.info.precision}")
        return runner, pending

    async def _answer(self, runner: ModelRunner, texts: Sequence[str], admission: Admission, check: bool,
                      documents: Sequence[Document] | None = None, indexes: Sequence[int] | None = None,
                      on_partial: OnPartial | None = None) -> list[Translation]:
        """Production's translations of ``texts`` (as ``admit``), or the canary candidate's for a request it samples,
        never a streamed one (``serving.server.shadow.canary``; ``check``: the texts' limits are not checked yet)."""
        async def production() -> list[Translation]:
            _, pending = await self.admit(runner, texts, admission, documents=documents, indexes=indexes,
                                          on_partial=on_partial)
            return await pending.wait()

        canary = None if self.shadow is None or runner is not self.models.get(self.shadow.model) else self.shadow.canary
        if canary is None or on_partial is not None:
            return await production()
        return await canary.route(texts, admission, lambda: self.limits.check_texts(texts) if check else 0, production)

    async def translate(
        self, model: str | ModelRunner | None, texts: Sequence[str], admission: Admission,
        on_partial: OnPartial | None = None,
    ) -> tuple[ModelRunner, list[Translation]]:
        """Translate ``texts`` with ``model`` under ``admission``: one translation per text, in order. An empty (or
        blank) text gets an empty translation without being sent to the engine, as ``mtgate translate`` answers a blank
        line with an empty one. ``on_partial``: the streaming hook, with indexes into ``texts``."""
        kept = [i for i, text in enumerate(texts) if text.strip()]
        runner = self.ready_model(model)
        if len(kept) == len(texts):
            return runner, await self._answer(runner, texts, admission, check=True, on_partial=on_partial)
        self.limits.check_texts(texts, blank=True)
        translations = [EMPTY_TRANSLATION] * len(texts)
        if kept:
            prefix = admission.target_prefix
            answer = await self._answer(
                runner, [texts[i] for i in kept],
                dataclasses.replace(admission, target_prefix=None if prefix is None else [prefix[i] for i in kept]),
                check=False, indexes=kept,
                on_partial=None if on_partial is None else (lambda i, delta: on_partial(kept[i], delta)))
            for i, translation in zip(kept, answer, strict=True):
                translations[i] = translation
        return runner, translations

    async def translate_documents(
        self, model: str | ModelRunner | None, texts: Sequence[str], admission: Admission
    ) -> tuple[ModelRunner, list[DocumentTranslation]]:
        """Split each text into sentences (``serving.engine.documents``, in the model's source language) and translate them
        all in one admission, so that they batch together; one :class:`DocumentTranslation` per text, in order.

        Limits: ``max_sentences_per_request`` counts the texts, ``max_document_sentences`` (or ``max_queue_size``,
        when lower) their sentences together, ``max_chars_per_sentence`` applies to each sentence.

        Raises:
            LimitExceeded, InvalidInput, InputTooLong, ...: as :meth:`admit`; a sentence is named as
                ``text[i] sentence j``.
        """
        runner = self.ready_model(model)
        self.limits.check_texts(texts, sentences=False)  # a text is a document: its sentences' limits are checked below
        s = self.settings
        most = min((s.max_document_sentences, "max_document_sentences"), (s.max_queue_size, "max_queue_size"))
        try:
            documents = split_documents(texts, source_language(runner.info), max_sentences=most,
                                        max_chars=s.max_chars_per_sentence)
        except InvalidText as e:
            raise e.about(f"text[{list(texts).index(e.text)}]") from None
        sentences = sentences_of(documents)
        if not sentences:  # every text blank: each one's translation is its whitespace
            return runner, assemble(documents, [])
        return runner, assemble(documents, await self._answer(runner, sentences, admission, check=False,
                                                              documents=documents))

    def _record(self, runner: ModelRunner, future: asyncio.Future[list[Translation]], admitted: float,
                input_s: float) -> None:
        runner.active -= 1
        model = runner.name
        if future.cancelled():  # the client went away: neither a success nor the model's failure
            return
        runner.statistics.on_request(future.exception() is None, time.monotonic() - admitted, input_s)
        if future.exception() is not None:
            return
        results = future.result()
        self.metrics.record_translations(
            model,
            len(results),
            sum(int(r.input_tokens) for r in results),
            sum(int(r.output_tokens) for r in results),
        )
