"""``POST /v1/translate/bulk``: NDJSON in, NDJSON out, results streamed back as each line completes.

The body is read as it arrives and cut into lines in linear time (:class:`LineSplitter`): a line longer than any
valid one can be is refused as soon as it is, without buffering the rest of it. At most ``bulk_window`` lines are
in flight at once; each waits for room in the model's queue instead of being refused with 503.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from serving.engine.errors import InferenceFailed, InvalidInput, LimitExceeded, ServingError
from serving.engine.request import EMPTY_TRANSLATION
from serving.server.http.deps import ApiKeyDep, ServiceDep, request_id
from serving.server.http.schemas import BulkLineIn, TranslationOut, error_responses
from serving.server.http.streams import DuplexStreamingResponse, error_data
from serving.server.limits import Admission
from serving.server.service import TranslationService

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["v1"])

# Bytes a JSON line may need beyond its sentence: the id, the keys, whitespace.
_LINE_OVERHEAD = 64 << 10
# A character takes at most 12 bytes of JSON: an astral one written as two \u escapes.
_BYTES_PER_CHAR = 12


class Overlong:
    """A line longer than the splitter's limit (its bytes are dropped as they arrive)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit


class LineSplitter:
    """Cuts a byte stream into lines at ``\\n``; each byte is looked at once (linear in the body, whatever the line
    lengths), and a line longer than ``max_line_bytes`` comes out as :class:`Overlong` without being kept."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._overlong = False

    def feed(self, chunk: bytes) -> list[bytes | Overlong]:
        """The lines ``chunk`` completes (without their ``\\n``)."""
        lines: list[bytes | Overlong] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._add(chunk[start:end])
            lines.append(self._take())
            start = end + 1
        self._add(chunk[start:])
        return lines

    def end(self) -> bytes | Overlong:
        """What is left after the last ``\\n`` (b"" if nothing)."""
        return self._take()

    def _add(self, piece: bytes) -> None:
        if self._overlong or not piece:
            return
        self._size += len(piece)
        if self._size > self.max_line_bytes:
            self._overlong = True
            self._parts = []
        else:
            self._parts.append(piece)

    def _take(self) -> bytes | Overlong:
        line: bytes | Overlong = Overlong(self.max_line_bytes) if self._overlong else b"".join(self._parts)
        self._parts, self._size, self._overlong = [], 0, False
        return line


@router.post(
    "/translate/bulk",
    openapi_extra={
        "requestBody": {
            "required": False,  # an empty body is an empty batch: 200 with no lines
            "content": {
                "application/x-ndjson": {
                    "schema": {"type": "string"},
                    "example": '{"text": "Hello.", "id": "a"}\n"Good morning."\n',
                },
                "text/plain": {"schema": {"type": "string"}},
            },
            "description": 'one sentence per line: a JSON object `{"text": ..., "id"?: ...}` or a JSON string '
            "(any Content-Type is accepted)",
        }
    },
    responses={
        200: {
            "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
            "description": "one line per input line, as each completes (not in input order): `{index, id?, text, "
            "input_tokens, output_tokens, score}` or `{index, id?, error: {code, message, status}}`",
        },
        **error_responses(400, 401, 404, 408, 413, 422, 503),
    },
    response_class=StreamingResponse,
)
async def translate_bulk(
    request: Request,
    service: ServiceDep,
    _: ApiKeyDep,
    model: str | None = Query(default=None, description="model name (default: the server's first model)"),
    beam_size: int | None = Query(default=None, description="beam width (default: the model's)"),
    max_length: int | None = Query(default=None, description="most target tokens per sentence"),
    truncate: bool = Query(default=False, description="cut a line longer than the model's positions instead of "
                           "refusing it; its result then says `truncated: true`"),
) -> StreamingResponse:
    """Translate NDJSON lines; results stream back as NDJSON as they complete."""
    # Each line's deadline counts from when it is read (its own request_timeout).
    admission = service.limits.admission({"beam_size": beam_size, "max_length": max_length, "truncate": truncate},
                                         time.monotonic(), tag=request_id(request))
    service.ready_model(model)  # refuse before streaming: unknown model, not ready
    return DuplexStreamingResponse(
        _bulk(request, service, model, admission),
        media_type="application/x-ndjson",
        headers={"Cache-Control": "no-cache"},
    )


async def _bulk(
    request: Request, service: TranslationService, model: str | None, admission: Admission
) -> AsyncIterator[bytes]:
    out: asyncio.Queue[bytes | None] = asyncio.Queue()
    window = asyncio.Semaphore(service.settings.bulk_window)
    tasks: set[asyncio.Task[None]] = set()
    limit = service.settings.max_bulk_body_bytes
    splitter = LineSplitter(service.settings.max_chars_per_sentence * _BYTES_PER_CHAR + _LINE_OVERHEAD)

    def line_error(index: int, line_id: Any, error: ServingError) -> bytes:
        body: dict[str, Any] = {"index": index}
        if line_id is not None:
            body["id"] = line_id
        body.update(error_data(error))
        return (json.dumps(body, ensure_ascii=False) + "\n").encode()

    async def one(index: int, raw: bytes) -> None:
        line_id: Any = None
        try:
            try:
                text, line_id = _parse_bulk_line(raw)
                if not text.strip():  # an empty text: an empty translation, as /v1/translate answers it
                    translation = EMPTY_TRANSLATION
                else:
                    line = dataclasses.replace(admission, started=time.monotonic())
                    runner, pending = await service.admit(model, [text], line, wait_for_room=True)
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
            body.update(TranslationOut.of(translation).model_dump(exclude_unset=True))
            out.put_nowait((json.dumps(body, ensure_ascii=False) + "\n").encode())
        finally:
            window.release()

    index = 0

    async def submit(line: bytes | Overlong) -> None:
        nonlocal index
        if isinstance(line, Overlong):
            error = LimitExceeded(
                f"line longer than {line.limit} bytes: its sentence would exceed max_chars_per_sentence "
                f"({service.settings.max_chars_per_sentence})",
                limit="max_chars_per_sentence",
            )
            out.put_nowait(line_error(index, None, error))
        elif line.strip():
            await window.acquire()
            task = asyncio.ensure_future(one(index, line))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        else:
            return  # blank lines are skipped and get no index
        index += 1

    async def produce() -> None:
        size = 0
        try:
            try:
                async for chunk in _stream_or_stop(request):
                    size += len(chunk)
                    if size > limit:
                        raise LimitExceeded(
                            f"bulk body larger than {limit} bytes (max_bulk_body_bytes)", limit="max_bulk_body_bytes"
                        )
                    for line in splitter.feed(chunk):
                        await submit(line)
                await submit(splitter.end())
            except ServingError as error:  # the body stalled (408) or grew too large (413): no more lines
                out.put_nowait(line_error(index, None, error))
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
