"""Connection limits uvicorn does not have: a deadline for each request's head and a cap on its size.

uvicorn closes a kept-alive connection that stays idle (``timeout_keep_alive``) and refuses requests beyond
``limit_concurrency``, but a client that connects and never sends a request, or sends its headers a byte at a time,
holds the connection for ever. :func:`protocol_class` returns uvicorn's httptools protocol with a head deadline: from
the moment a connection opens, and from the first byte of each further request on it, the request line and headers
must be complete within ``header_timeout_s`` or the connection is closed; a head larger than ``max_header_bytes`` gets
431 and the connection is closed, whether it arrives in one read or byte by byte. The deadline for the body is the
app's (``serving.server.http.middleware``: 408).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger(__name__)

_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 35\r\nconnection: close\r\n\r\nrequest line and headers too large\n"
)


def protocol_class(header_timeout_s: float, max_header_bytes: int) -> type[asyncio.Protocol] | str:
    """uvicorn's HTTP protocol (``Config(http=...)``) with the head deadline and size cap of the module docstring.

    Returns ``"auto"`` (uvicorn's choice, without the deadline) when httptools is not installed.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn without its [standard] extra: h11 only
        logger.warning("httptools is not installed: connections get no header deadline (install uvicorn[standard])")
        return "auto"

    class GuardedHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[misc]
        """See :func:`protocol_class`. The head's size is counted twice, and either count past the cap refuses it:
        the bytes of every read that leaves the head incomplete (a head trickling in, whose parts the parser holds
        until they are whole), and the parts the parser hands over (the URL and each header), which also counts a
        head that arrives whole in one or two reads."""

        _head_timer: asyncio.TimerHandle | None = None
        _in_head = False
        _head_bytes = 0
        _parsed_bytes = 0
        _refused = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._begin_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._end_head()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            counted = self._in_head
            super().data_received(data)
            # After the parser ran: bytes of a head that is still incomplete are all head (never body).
            if counted and self._in_head and not self._refused:
                self._head_bytes += len(data)
                if self._head_bytes > max_header_bytes:
                    self._refuse()

        # The parser's callbacks: once the head is refused, the rest of what it parses is ignored (no request
        # starts: the connection is closing).

        def on_message_begin(self) -> None:
            if not self._refused:
                super().on_message_begin()
                self._parsed_bytes = 0
                self._begin_head()

        def on_url(self, url: bytes) -> None:
            if self._count_parsed(len(url)):
                super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            if self._count_parsed(len(name) + len(value) + 4):  # ": " and CRLF
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if not self._refused:
                self._end_head()
                super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._refused:
                super().on_message_complete()

        def _should_upgrade(self) -> bool:
            return not self._refused and bool(super()._should_upgrade())

        def _count_parsed(self, size: int) -> bool:
            """Count ``size`` bytes of the head the parser handed over; False once the head is refused."""
            if self._refused:
                return False
            self._parsed_bytes += size
            if self._parsed_bytes > max_header_bytes:
                self._refuse()
                return False
            return True

        def _refuse(self) -> None:
            """431 and close: the head is larger than ``max_header_bytes``."""
            self._refused = True
            self._end_head()
            if not self.transport.is_closing():
                logger.info("closing a connection whose request head is larger than %d bytes (431)", max_header_bytes)
                self.transport.write(_TOO_LARGE)
                self.transport.close()

        def _begin_head(self) -> None:
            if not self._in_head:
                self._in_head = True
                self._head_bytes = 0
                self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _end_head(self) -> None:
            self._in_head = False
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self._in_head and not self.transport.is_closing():
                logger.info("closing a connection that sent no complete request head in %.1fs", header_timeout_s)
                self._in_head = False
                self.transport.close()

    return GuardedHttpToolsProtocol
