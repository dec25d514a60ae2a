"""The ``/v1`` routes: translate, stream (Server-Sent Events), score (reference scoring) and the model list (bulk
NDJSON: ``serving.server.http.bulk``).

Each route is thin: request schema -> ``service.admit``/``translate`` (the batcher) -> response schema.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from serving.engine.errors import InvalidInput, ModelNotFound, ServingError
from serving.server.http.deps import (
    ApiKeyDep,
    ServiceDep,
    request_id,
    request_started,
    unless_disconnected,
    wait_disconnect,
)
from serving.server.http.schemas import (
    STREAM_ERROR_SCHEMA,
    Limits,
    ModelOut,
    ModelsResponse,
    ScoreOut,
    ScoreRequest,
    ScoreResponse,
    StreamPartial,
    TranslateRequest,
    TranslateResponse,
    TranslateStreamRequest,
    TranslationOut,
    error_responses,
)
from serving.server.http.streams import DuplexStreamingResponse, error_data
from serving.server.limits import Admission
from serving.server.model_runner import ModelRunner
from serving.server.service import TranslationService

logger = logging.getLogger(__name__)

_TRANSLATE_ERRORS = error_responses(400, 401, 404, 408, 413, 422, 500, 503, 504)

router = APIRouter(prefix="/v1", tags=["v1"])


def _response(runner: ModelRunner, translations: list[Any], documents: list[Any] | None = None) -> TranslateResponse:
    info = runner.info
    return TranslateResponse(
        model=runner.name,
        version=str(info.version),
        translations=[TranslationOut.of(t) for t in translations] if documents is None
        else [TranslationOut.of_document(d) for d in documents],
    )


# Unset fields (truncated, sentences) are left out, so that answers without them are as they always were.
@router.post("/translate", response_model=TranslateResponse, response_model_exclude_unset=True,
             responses=_TRANSLATE_ERRORS)
async def translate(body: TranslateRequest, request: Request, service: ServiceDep, _: ApiKeyDep) -> TranslateResponse:
    """Translate one sentence or a list of sentences (with split_sentences: texts of several sentences)."""
    admission = _admission(service, request, body)
    if body.split_sentences:
        if body.target_prefix is not None or (body.num_hypotheses or 1) > 1:
            raise InvalidInput("split_sentences gives each sentence one translation: not with target_prefix or "
                               "num_hypotheses above 1")
        runner, documents = await unless_disconnected(
            request, service.translate_documents(body.model, body.texts(), admission)
        )
        return _response(runner, [], documents)
    runner, translations = await unless_disconnected(request, service.translate(body.model, body.texts(), admission))
    return _response(runner, translations)


def _admission(service: TranslationService, request: Request, body: TranslateRequest | ScoreRequest) -> Admission:
    """The request's terms (``RequestLimits.admission``): options, deadline (``timeout_ms``), request id, prefix."""
    timeout_s = None if body.timeout_ms is None else body.timeout_ms / 1000
    if isinstance(body, ScoreRequest):
        return service.limits.admission({}, request_started(request), timeout_s, tag=request_id(request))
    return service.limits.admission(body.decoding(), request_started(request), timeout_s, tag=request_id(request),
                                    target_prefix=body.target_prefixes())


@router.post("/score", response_model=ScoreResponse, responses=_TRANSLATE_ERRORS)
async def score(body: ScoreRequest, request: Request, service: ServiceDep, _: ApiKeyDep) -> ScoreResponse:
    """Score given translations: the model's log-likelihood of each target given its source."""
    runner, scores = await unless_disconnected(
        request, service.score(body.model, body.sources(), body.targets(), _admission(service, request, body))
    )
    return ScoreResponse(model=runner.name, version=str(runner.info.version), scores=[ScoreOut.of(s) for s in scores])


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


_STREAM_EVENT = {
    "description": "one Server-Sent Event; `data` is JSON",
    "type": "object",
    "required": ["event", "data"],
    "oneOf": [
        {"properties": {"event": {"const": event}, "data": {"type": "string", "contentMediaType": "application/json",
                                                              "contentSchema": schema}}}
        for event, schema in (
            ("partial", StreamPartial.model_json_schema()),
            ("final", {"$ref": "#/components/schemas/TranslateResponse"}),
            ("error", STREAM_ERROR_SCHEMA),
        )
    ],
}


@router.post(
    "/translate/stream",
    responses={
        200: {
            "content": {"text/event-stream": {"itemSchema": _STREAM_EVENT}},
            "description": "Server-Sent Events: `partial` events `{index, delta}` as text becomes final (every "
            "greedy token; with a beam, the prefix all live beams share; never rewritten: the deltas of one sentence "
            "concatenate to its text), then one `final` event with the whole TranslateResponse, or an `error` event "
            "`{error: {code, message, status}}`.",
        },
        **_TRANSLATE_ERRORS,
    },
    response_class=StreamingResponse,
)
async def translate_stream(
    body: TranslateStreamRequest, request: Request, service: ServiceDep, _: ApiKeyDep
) -> StreamingResponse:
    """Translate and stream partial text as Server-Sent Events."""
    admission = _admission(service, request, body)
    texts = body.texts()
    events: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()

    def on_partial(index: int, delta: str) -> None:
        events.put_nowait((index, delta))

    # Admission happens before the 200 is sent: refusals (limits, 503, 404) keep their status codes.
    runner, pending = await service.admit(body.model, texts, admission, on_partial=on_partial)
    return DuplexStreamingResponse(
        _stream_events(request, runner, pending, events, len(texts)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream_events(
    request: Request, runner: ModelRunner, pending: Any, events: asyncio.Queue[tuple[int, str] | None], n: int
) -> AsyncIterator[bytes]:
    result = asyncio.ensure_future(pending.wait())
    result.add_done_callback(lambda _: events.put_nowait(None))
    watcher = asyncio.ensure_future(wait_disconnect(request))
    watcher.add_done_callback(lambda _: events.put_nowait(None))
    # The engine's partial results are deltas that can no longer change (OnPartial): each goes out as it comes.
    streamed: list[list[str]] = [[] for _ in range(n)]
    try:
        while not result.done():
            item = await events.get()
            if item is None:
                if watcher.done() and not result.done():
                    return  # the client is gone: the finally below drops its queued work
                continue
            index, delta = item
            streamed[index].append(delta)
            yield _sse("partial", {"index": index, "delta": delta})
        try:
            translations = result.result()
        except ServingError as error:
            yield _sse("error", error_data(error))
            return
        while not events.empty():  # deltas handed over before the result
            item = events.get_nowait()
            if item is not None:
                index, delta = item
                streamed[index].append(delta)
                yield _sse("partial", {"index": index, "delta": delta})
        for index, translation in enumerate(translations):
            sent = "".join(streamed[index])
            if sent != translation.text:
                if translation.text.startswith(sent):  # an engine that streams less (or nothing) of a sentence
                    yield _sse("partial", {"index": index, "delta": translation.text[len(sent) :]})
                else:
                    logger.error("the streamed text of sentence %d is not the start of its translation", index)
        yield _sse("final", _response(runner, translations).model_dump(exclude_unset=True))
    finally:
        watcher.cancel()
        if not result.done():
            result.cancel()


@router.get("/models", response_model=ModelsResponse)
async def list_models(service: ServiceDep) -> ModelsResponse:
    """The models this server serves."""
    s = service.settings
    limits = Limits(
        max_beam_size=s.max_beam_size,
        max_output_tokens=s.max_output_tokens,
        max_sentences_per_request=s.max_sentences_per_request,
        max_chars_per_sentence=s.max_chars_per_sentence,
        max_document_sentences=min(s.max_document_sentences, s.max_queue_size),
    )
    return ModelsResponse(models=[_model_out(service, runner) for runner in service.models.values()], limits=limits)


@router.get("/models/{name}", response_model=ModelOut, responses=error_responses(404))
async def get_model(name: str, service: ServiceDep) -> ModelOut:
    """One served model."""
    if name not in service.models:
        raise ModelNotFound(f"unknown model {name!r} (this server serves: {', '.join(sorted(service.models))})")
    return _model_out(service, service.models[name])


def _model_out(service: TranslationService, runner: ModelRunner) -> ModelOut:
    out = ModelOut(
        name=runner.name, ready=runner.ready and not service.draining, default=runner.name == service.default_model
    )
    if runner.translator is None:
        return out
    info = runner.info
    details = asdict(info)
    for key in ("name", "version", "runtime", "precision", "max_input_tokens"):
        details.pop(key, None)
    out.version = str(info.version)
    out.runtime = info.runtime
    out.precision = info.precision
    out.max_input_tokens = int(info.max_input_tokens)
    out.details = json.loads(json.dumps(details, default=str))
    return out
