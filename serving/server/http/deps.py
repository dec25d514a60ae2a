"""FastAPI dependencies shared by the routes: the service, the API key check, request context, disconnects.

Dependencies are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in its thread pool, and a thread
hand-off per dependency per request is measurable overhead next to the batcher's worker thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Annotated, TypeVar

from fastapi import Depends, Request

from serving.server.errors import ClientDisconnected, Unauthorized, api_key_problem
from serving.server.service import TranslationService

T = TypeVar("T")


async def get_service(request: Request) -> TranslationService:
    service: TranslationService = request.app.state.service
    return service


ServiceDep = Annotated[TranslationService, Depends(get_service)]


async def require_api_key(request: Request, service: ServiceDep) -> None:
    """When an API key is configured, demand ``Authorization: Bearer <key>``."""
    problem = api_key_problem(request.headers.get("authorization"), service.settings.api_key)
    if problem is not None:
        raise Unauthorized(problem)


ApiKeyDep = Annotated[None, Depends(require_api_key)]


def request_id(request: Request) -> str:
    return str(getattr(request.state, "request_id", ""))


def request_started(request: Request) -> float:
    started = getattr(request.state, "started", None)
    return float(started) if started is not None else time.monotonic()


async def wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (or once the response is complete). Only call after the body is read."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it (dropping its queued sentences).

    Raises:
        ClientDisconnected: the client went away first.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        watcher.cancel()
    if task.cancelled() or not task.done():
        raise ClientDisconnected("client disconnected before the translation was ready")
    return task.result()
