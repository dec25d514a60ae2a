"""One pure-ASGI middleware in front of every route (no BaseHTTPMiddleware: it would buffer streaming responses).

For each HTTP request it assigns a request id (``X-Request-ID``, echoed), counts the request by route template,
method and status and times it; with a canary, a successful answer says who answered it (``X-Mtgate-Answered-By``,
``X-Mtgate-Answered-Model``: ``serving.server.shadow.canary``). For inference routes, in this order, before the route reads anything: it refuses new
work while draining (503), checks the API key (401), enforces the body size limit (413), and reads the body within
``body_timeout_s`` (408; the server closing first also gives 408). Only then does the request count as in flight
(what the SIGTERM drain waits for): a client that never finishes its body cannot hold the drain. A translation
request for a model whose queue cannot take it whatever its body holds (``TranslationService.refuse_unread``: no room
for one more sentence, or the queued work alone past the server's timeout) gets its 503 before the body is parsed or
tokenized: the cheapest refusal, on a connection kept open. The bulk route
streams its body itself; each part of it must arrive within ``body_timeout_s`` of the previous one.

Request bodies in a ``Content-Encoding``: the routes whose body is read here whole (every inference route but bulk)
decode ``gzip`` and ``deflate`` (what ``tritonclient``'s ``request_compression_algorithm`` sends, and Triton
decodes), bounded: the decoded body must fit the same size limit (413), and the route sees it as if sent plain. Any
other coding, and any coding on the other routes (bulk streams its body; the rest read theirs as it is), is 415
naming the coding, with the ``Accept-Encoding`` the route does take.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
import zlib
from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.engine.errors import InvalidInput, LimitExceeded, Overloaded, ServingError
from serving.server.errors import (
    RequestTimeout,
    Unauthorized,
    UnsupportedEncoding,
    api_key_problem,
    headers_of,
    status_of,
)
from serving.server.http.errors import error_response
from serving.server.service import TranslationService
from serving.server.shadow.canary import ANSWERED_BY, ANSWERED_BY_HEADER, ANSWERED_MODEL_HEADER

INFERENCE_PATH = re.compile(
    r"^/v1/translate(/stream|/bulk)?/?$|^/v1/score/?$|^/v2/models/[^/]+(/versions/[^/]+)?/infer/?$"
)
BULK_PATH = "/v1/translate/bulk"
# The routes whose requests queue for a model's batcher: refused before parsing when it has no room (bulk waits).
_TRANSLATION_PATH = re.compile(
    r"^/v1/translate(?:/stream)?/?$|^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer/?$"
)
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# The content codings a whole-body inference route decodes, and zlib's window bits for each (HTTP's "deflate" is the
# zlib format, RFC 9110 8.4.1.2).
_DECODED = {"gzip": 31, "deflate": 15}


class _Disconnected(Exception):
    """The client went away while sending its body (nothing to answer)."""


class ServerMiddleware:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, service: TranslationService) -> None:
        self.app = app
        self.service = service
        self.metrics = service.metrics
        self.settings = service.settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        request_id = headers.get("x-request-id", "")
        if not _REQUEST_ID.match(request_id):
            request_id = uuid.uuid4().hex[:16]
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["started"] = started
        path: str = scope["path"]
        status = [500]

        marks: list[tuple[str, str]] = []  # who answered, with a canary (serving.server.shadow.canary)
        answered_by = ANSWERED_BY.set(marks)

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                if marks and status[0] < 400:
                    who, model = marks[-1]
                    message["headers"] += [(ANSWERED_BY_HEADER.encode(), who.encode()),
                                           (ANSWERED_MODEL_HEADER.encode(), model.encode("latin-1", "replace"))]
            await send(message)

        inference = scope["method"] == "POST" and INFERENCE_PATH.match(path) is not None
        coding = _content_coding(headers)
        try:
            if inference:
                await self._inference(scope, receive, send_wrapper, headers, path, coding)
            elif coding is not None and _has_body(headers):
                error = UnsupportedEncoding(f"request body in Content-Encoding {coding!r}: {path} reads its body as "
                                            "it is (send it uncompressed)")
                await _refuse(error, path, scope, receive, send_wrapper)
            else:
                await self.app(scope, receive, send_wrapper)
        finally:
            ANSWERED_BY.reset(answered_by)
            template = _template(scope, inference)
            self.metrics.requests.labels(template, scope["method"], str(status[0])).inc()
            self.metrics.request_seconds.labels(template).observe(time.monotonic() - started)

    async def _inference(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], path: str,
                         coding: str | None) -> None:
        read = False  # the whole body
        try:
            if self.service.draining:
                retry = {"Retry-After": str(self.settings.retry_after_s)}
                await error_response(path, 503, "unavailable", "server is shutting down", retry)(scope, receive, send)
                return
            problem = api_key_problem(headers.get("authorization"), self.settings.api_key)
            if problem is not None:
                raise Unauthorized(problem)
            bulk = path.rstrip("/") == BULK_PATH
            limit = self.settings.max_bulk_body_bytes if bulk else self.settings.max_body_bytes
            setting = "max_bulk_body_bytes" if bulk else "max_body_bytes"
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > limit):
                raise LimitExceeded(f"request body larger than {limit} bytes ({setting})", limit=setting)
            if coding is not None and (bulk or coding not in _DECODED):
                raise UnsupportedEncoding(
                    f"request body in Content-Encoding {coding!r}: {BULK_PATH} streams its body as it is (send it "
                    "uncompressed)" if bulk else
                    f"request body in Content-Encoding {coding!r}, which this server does not decode (gzip, deflate "
                    "or none)", accepted="identity" if bulk else "gzip, deflate")
            if bulk:  # streamed: the bulk route counts bytes itself
                await self._in_flight(self.app(scope, self._paced(receive), send))
                return
            body = await self._read_body(receive, limit, setting)
            read = True
            translation = _TRANSLATION_PATH.match(path)
            if translation is not None:  # an overloaded model refuses before parsing or tokenizing anything
                self.service.refuse_unread(translation["model"], translation["version"], scope["state"]["started"])
            if coding is not None:
                body = _decode(body, coding, limit, setting)
                scope = _plain(scope, len(body))
        except _Disconnected:
            return
        except Overloaded as error:  # the body was read (refused after it) or not: only then is the connection closed
            await _refuse(error, path, scope, receive, send, close=not read)
            return
        except ServingError as error:
            await _refuse(error, path, scope, receive, send)
            return
        await self._in_flight(self.app(scope, _replay(body, receive), send))

    async def _in_flight(self, work: Awaitable[None]) -> None:
        self.service.inflight += 1
        self.metrics.inflight.inc()
        try:
            await work
        finally:
            self.service.inflight -= 1
            self.metrics.inflight.dec()

    async def _read_body(self, receive: Receive, limit: int, setting: str) -> bytes:
        """The whole body, within ``body_timeout_s`` and ``limit`` bytes.

        Raises:
            RequestTimeout: the body did not arrive in time, or the server is closing.
            LimitExceeded: the body is larger than ``limit`` (chunked requests have no Content-Length to check).
            _Disconnected: the client went away.
        """
        deadline = asyncio.get_running_loop().time() + self.settings.body_timeout_s
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await self._receive_before(receive, deadline)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise LimitExceeded(f"request body larger than {limit} bytes ({setting})", limit=setting)
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    def _paced(self, receive: Receive) -> Receive:
        """``receive`` for a streamed body: each part within ``body_timeout_s`` of the previous one (RequestTimeout
        otherwise); once the body is complete, messages (a disconnect) pass through unpaced."""
        complete = False

        async def paced() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            try:
                message = await self._receive_before(
                    receive, asyncio.get_running_loop().time() + self.settings.body_timeout_s
                )
            except _Disconnected:
                return {"type": "http.disconnect"}
            complete = not message.get("more_body", False)
            return message

        return paced

    async def _receive_before(self, receive: Receive, deadline: float) -> Message:
        """The next ``http.request`` message, if it comes before ``deadline`` and before the server closes."""
        loop = asyncio.get_running_loop()
        next_message = asyncio.ensure_future(receive())
        closing = asyncio.ensure_future(self.service.closing.wait())
        try:
            await asyncio.wait({next_message, closing}, timeout=max(0.0, deadline - loop.time()),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            if not next_message.done():
                next_message.cancel()
        if not next_message.done() or next_message.cancelled():
            if self.service.closing.is_set():
                raise RequestTimeout("the server is shutting down and the request body has not fully arrived")
            raise RequestTimeout(
                f"the request body did not arrive within {self.settings.body_timeout_s:g}s (body_timeout_s)"
            )
        message = next_message.result()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        return message


async def _refuse(error: ServingError, path: str, scope: Scope, receive: Receive, send: Send, *,
                  close: bool = True) -> None:
    """Answer a request refused before its route ran. The body may be unread: close the connection rather than
    read what is left of it (``close`` False: it was read, the connection stays open for the client's next one)."""
    extra = {**headers_of(error), **({"Connection": "close"} if close else {})}
    await error_response(path, status_of(error), error.code, str(error), extra)(scope, receive, send)


def _content_coding(headers: dict[str, str]) -> str | None:
    """The request body's ``Content-Encoding`` (lower case; several are one string, refused), None for none."""
    coding = headers.get("content-encoding", "").strip().lower()
    return None if coding in ("", "identity") else coding


def _has_body(headers: dict[str, str]) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "").strip() not in ("", "0")


def _decode(body: bytes, coding: str, limit: int, setting: str) -> bytes:
    """``body`` decoded from ``coding`` (one of :data:`_DECODED`), at most ``limit`` bytes of it.

    Raises:
        InvalidInput: the body is not (complete) data of that coding.
        LimitExceeded: the decoded body is larger than ``limit``.
    """
    decoder = zlib.decompressobj(wbits=_DECODED[coding])
    try:
        out = decoder.decompress(body, limit + 1)
    except zlib.error as e:
        raise InvalidInput(f"the request body is not valid {coding} data ({e})") from None
    if len(out) > limit or decoder.unconsumed_tail:
        raise LimitExceeded(f"decompressed request body larger than {limit} bytes ({setting})", limit=setting)
    if not decoder.eof or decoder.unused_data:
        where = "ends before" if not decoder.eof else "goes on after"
        raise InvalidInput(f"the request body {where} the end of its {coding} data")
    return out


def _plain(scope: Scope, length: int) -> Scope:
    """``scope`` for the decoded body: no ``Content-Encoding``, its ``Content-Length``."""
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"content-encoding", b"content-length")]
    return {**scope, "headers": [*headers, (b"content-length", str(length).encode())]}


def _template(scope: Scope, inference: bool) -> str:
    """The route's path template (a bounded label set), also for requests refused before routing."""
    route = scope.get("route")
    template = getattr(route, "path", None)
    if isinstance(template, str):
        return template
    path: str = scope["path"].rstrip("/")
    if inference:
        if path.startswith("/v2/"):
            return "/v2/models/{name}/versions/{version}/infer" if "/versions/" in path else "/v2/models/{name}/infer"
        return path
    return "unmatched"


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
