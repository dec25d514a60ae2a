"""The ``/v1`` routes: translate, stream (Server-Sent Events), bulk (NDJSON) and the model list.

Each route is thin: request schema -> ``service.admit``/``translate`` (the batcher) -> response schema.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, is_dataclass
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from serving.api.deps import (
    ApiKeyDep,
    ServiceDep,
    request_id,
    request_started,
    unless_disconnected,
    wait_disconnect,
)
from serving.api.errors import LimitExceeded, ModelNotFound, status_of
from serving.api.schemas import (
    BulkLineIn,
    ErrorResponse,
    ModelOut,
    ModelsResponse,
    TranslateRequest,
    TranslateResponse,
    TranslationOut,
)
from serving.api.service import ModelRunner, Options, TranslationService
from serving.errors import InferenceFailed, InvalidInput, ServingError

logger = logging.getLogger(__name__)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in (
        (400, "invalid input (the message says what)"),
        (401, "missing or wrong API key"),
        (404, "unknown model"),
        (413, "a size limit was exceeded (the message names it)"),
        (422, "the body does not match the schema"),
        (503, "queue full (with Retry-After), model not ready, or server draining"),
        (504, "the request's deadline passed"),
    )
}

router = APIRouter(prefix="/v1", tags=["v1"])


class DuplexStreamingResponse(StreamingResponse):
    """A streaming response that never calls ``receive`` itself, so the route may still be reading the request body
    while results go out (bulk). Starlette's own one listens for a disconnect on ASGI servers older than spec 2.4
    and would swallow body chunks. A client that goes away shows up as a failed send; the iterator is then closed.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        iterator = self.body_iterator
        try:
            await self.stream_response(send)
        except OSError:
            logger.info("client disconnected during a streamed response")
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def _response(runner: ModelRunner, translations: list[Any]) -> TranslateResponse:
    info = runner.info
    return TranslateResponse(
        model=runner.name,
        version=str(info.version),
        translations=[TranslationOut.of(t) for t in translations],
    )


@router.post("/translate", response_model=TranslateResponse, responses=_ERRORS)
async def translate(body: TranslateRequest, request: Request, service: ServiceDep, _: ApiKeyDep) -> TranslateResponse:
    """Translate one sentence or a list of sentences."""
    options = service.options(body.beam_size, body.max_length)
    deadline = service.deadline(request_started(request), None if body.timeout_ms is None else body.timeout_ms / 1000)
    runner, translations = await unless_disconnected(
        request, service.translate(body.model, body.texts(), options, deadline, tag=request_id(request))
    )
    return _response(runner, translations)


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _error_data(error: ServingError) -> dict[str, Any]:
    return {"error": {"code": error.code, "message": str(error), "status": status_of(error)}}


@router.post(
    "/translate/stream",
    responses={
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "Server-Sent Events: `partial` events `{index, delta}` as tokens are decoded (the deltas "
            "of one sentence concatenate to its text), then one `final` event with the whole TranslateResponse, or "
            "an `error` event `{error: {code, message, status}}`.",
        },
        **_ERRORS,
    },
    response_class=StreamingResponse,
)
async def translate_stream(
    body: TranslateRequest, request: Request, service: ServiceDep, _: ApiKeyDep
) -> StreamingResponse:
    """Translate and stream partial text as Server-Sent Events."""
    options = service.options(body.beam_size, body.max_length)
    deadline = service.deadline(request_started(request), None if body.timeout_ms is None else body.timeout_ms / 1000)
    texts = body.texts()
    events: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()

    def on_step(index: int, partial: Any) -> None:
        events.put_nowait((index, str(partial)))

    # Admission happens before the 200 is sent: refusals (limits, 503, 404) keep their status codes.
    runner, pending = await service.admit(
        body.model, texts, options, deadline, on_step=on_step, tag=request_id(request)
    )
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
    emitted = [""] * n
    try:
        while not result.done():
            item = await events.get()
            if item is None:
                if watcher.done() and not result.done():
                    return  # the client is gone: the finally below drops its queued work
                continue
            index, partial = item
            # Only ever append: a partial that rewrites earlier text waits until the text is consistent again.
            if partial.startswith(emitted[index]) and len(partial) > len(emitted[index]):
                delta = partial[len(emitted[index]) :]
                emitted[index] = partial
                yield _sse("partial", {"index": index, "delta": delta})
        try:
            translations = result.result()
        except ServingError as error:
            yield _sse("error", _error_data(error))
            return
        for index, translation in enumerate(translations):
            text = translation.text
            if text.startswith(emitted[index]) and len(text) > len(emitted[index]):
                yield _sse("partial", {"index": index, "delta": text[len(emitted[index]) :]})
        yield _sse("final", _response(runner, translations).model_dump())
    finally:
        watcher.cancel()
        if not result.done():
            result.cancel()


@router.post(
    "/translate/bulk",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/x-ndjson": {
                    "schema": {"type": "string"},
                    "example": '{"text": "Hello.", "id": "a"}\n"Good morning."\n',
                }
            },
            "description": 'one sentence per line: a JSON object `{"text": ..., "id"?: ...}` or a JSON string',
        }
    },
    responses={
        200: {
            "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
            "description": "one line per input line, as each completes (not in input order): `{index, id?, text, "
            "input_tokens, output_tokens, score}` or `{index, id?, error: {code, message, status}}`",
        },
        **_ERRORS,
    },
    response_class=StreamingResponse,
)
async def translate_bulk(
    request: Request,
    service: ServiceDep,
    _: ApiKeyDep,
    model: str | None = Query(default=None, description="model name (default: the server's first model)"),
    beam_size: int | None = Query(default=None, ge=1),
    max_length: int | None = Query(default=None, ge=1),
) -> StreamingResponse:
    """Translate NDJSON lines; results stream back as NDJSON as they complete."""
    options = service.options(beam_size, max_length)
    service.ready_model(model)  # refuse before streaming: unknown model, not ready
    return DuplexStreamingResponse(
        _bulk(request, service, model, options),
        media_type="application/x-ndjson",
        headers={"Cache-Control": "no-cache"},
    )


async def _bulk(
    request: Request, service: TranslationService, model: str | None, options: Options
) -> AsyncIterator[bytes]:
    out: asyncio.Queue[bytes | None] = asyncio.Queue()
    window = asyncio.Semaphore(service.settings.bulk_window)
    tasks: set[asyncio.Task[None]] = set()
    limit = service.settings.max_bulk_body_bytes
    tag = request_id(request)

    def line_error(index: int, line_id: Any, error: ServingError) -> bytes:
        body: dict[str, Any] = {"index": index}
        if line_id is not None:
            body["id"] = line_id
        body.update(_error_data(error))
        return (json.dumps(body, ensure_ascii=False) + "\n").encode()

    async def one(index: int, raw: bytes) -> None:
        line_id: Any = None
        try:
            try:
                text, line_id = _parse_bulk_line(raw)
                deadline = service.deadline(time.monotonic(), None)
                runner, pending = await service.admit(model, [text], options, deadline, tag=tag, wait_for_room=True)
                (translation,) = await pending.wait()
            except ServingError as error:
                out.put_nowait(line_error(index, line_id, error))
                return
            except Exception as error:  # never lose a line silently
                logger.exception("bulk line %d failed", index)
                failure = InferenceFailed(f"internal error: {type(error).__name__}")
                out.put_nowait(line_error(index, line_id, failure))
                return
            body: dict[str, Any] = {"index": index}
            if line_id is not None:
                body["id"] = line_id
            body.update(TranslationOut.of(translation).model_dump())
            out.put_nowait((json.dumps(body, ensure_ascii=False) + "\n").encode())
        finally:
            window.release()

    async def produce() -> None:
        index = 0
        size = 0
        buffer = b""
        try:
            async for chunk in _stream_or_stop(request):
                size += len(chunk)
                if size > limit:
                    error = LimitExceeded(
                        f"bulk body larger than {limit} bytes (max_bulk_body_bytes)", limit="max_bulk_body_bytes"
                    )
                    out.put_nowait(line_error(index, None, error))
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        await window.acquire()
                        task = asyncio.ensure_future(one(index, line))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                        index += 1
            if buffer.strip() and size <= limit:
                await window.acquire()
                task = asyncio.ensure_future(one(index, buffer))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(set(tasks))
        finally:
            out.put_nowait(None)

    producer = asyncio.ensure_future(produce())
    try:
        while True:
            line = await out.get()
            if line is None:
                break
            yield line
        await producer
    finally:
        producer.cancel()
        for task in list(tasks):
            task.cancel()


async def _stream_or_stop(request: Request) -> AsyncIterator[bytes]:
    """The request body's chunks; ends quietly if the client disconnects (its lines are then cancelled)."""
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        return


def _parse_bulk_line(raw: bytes) -> tuple[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidInput(f"line is not JSON ({e})") from None
    except RecursionError:
        raise InvalidInput("line is JSON nested too deeply") from None
    if isinstance(value, str):
        return value, None
    if not isinstance(value, dict):
        raise InvalidInput('line must be a JSON string or an object {"text": ..., "id"?: ...}')
    try:
        line = BulkLineIn.model_validate(value)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:3])
        raise InvalidInput(f"invalid line ({problems})") from None
    return line.text, line.id


@router.get("/models", response_model=ModelsResponse)
async def list_models(service: ServiceDep) -> ModelsResponse:
    """The models this server serves."""
    return ModelsResponse(models=[_model_out(service, runner) for runner in service.models.values()])


@router.get("/models/{name}", response_model=ModelOut, responses={404: _ERRORS[404]})
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
    details: dict[str, Any] = asdict(info) if is_dataclass(info) and not isinstance(info, type) else {}
    for key in ("name", "version", "runtime", "precision", "max_input_tokens"):
        details.pop(key, None)
    out.version = str(info.version)
    out.runtime = info.runtime
    out.precision = info.precision
    out.max_input_tokens = int(info.max_input_tokens)
    out.details = json.loads(json.dumps(details, default=str))
    return out
