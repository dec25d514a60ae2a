"""One pure-ASGI middleware in front of every route (no BaseHTTPMiddleware: it would buffer streaming responses).

For each HTTP request it: assigns a request id (``X-Request-ID``, echoed), counts the request by route template,
method and status and times it; and for inference routes it refuses new work while draining (503), enforces the body
size limit before the route reads anything (413), and tracks requests in flight (what the SIGTERM drain waits for).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.errors import error_response
from serving.api.service import TranslationService

INFERENCE_PATH = re.compile(r"^/v1/translate(/stream|/bulk)?/?$|^/v2/models/[^/]+(/versions/[^/]+)?/infer/?$")
BULK_PATH = "/v1/translate/bulk"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


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

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        inference = scope["method"] == "POST" and INFERENCE_PATH.match(path) is not None
        try:
            if not inference:
                await self.app(scope, receive, send_wrapper)
                return
            self.service.inflight += 1
            self.metrics.inflight.inc()
            try:
                await self._inference(scope, receive, send_wrapper, headers, path)
            finally:
                self.service.inflight -= 1
                self.metrics.inflight.dec()
        finally:
            template = _template(scope, inference)
            self.metrics.requests.labels(template, scope["method"], str(status[0])).inc()
            self.metrics.request_seconds.labels(template).observe(time.monotonic() - started)

    async def _inference(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], path: str) -> None:
        if self.service.draining:
            retry = {"Retry-After": str(self.settings.retry_after_s)}
            await error_response(path, 503, "unavailable", "server is shutting down", retry)(scope, receive, send)
            return
        bulk = path.rstrip("/") == BULK_PATH
        limit = self.settings.max_bulk_body_bytes if bulk else self.settings.max_body_bytes
        setting = "max_bulk_body_bytes" if bulk else "max_body_bytes"
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await _too_large(path, limit, setting)(scope, receive, send)
            return
        if bulk:  # streamed: the bulk route counts bytes itself
            await self.app(scope, receive, send)
            return
        # Without Content-Length (chunked) read the body here, up to the limit, and replay it to the route.
        if length is None:
            chunks: list[bytes] = []
            size = 0
            more = True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    await _too_large(path, limit, setting)(scope, receive, send)
                    return
                chunks.append(chunk)
                more = message.get("more_body", False)
            receive = _replay(b"".join(chunks), receive)
        await self.app(scope, receive, send)


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


def _too_large(path: str, limit: int, setting: str) -> Any:
    return error_response(
        path, 413, "payload_too_large", f"request body larger than {limit} bytes ({setting})", {"Connection": "close"}
    )


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
