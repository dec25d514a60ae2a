"""What the streaming routes share: a response that streams while the request body is still being read, and the
error object a stream carries once its 200 has been sent (SSE ``error`` events, bulk NDJSON error lines)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from serving.engine.errors import ServingError
from serving.server.errors import status_of

logger = logging.getLogger(__name__)


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


def error_data(error: ServingError) -> dict[str, Any]:
    """``{"error": {code, message, status}}``: a domain error inside a stream, with the status it would have had."""
    return {"error": {"code": error.code, "message": str(error), "status": status_of(error)}}
