"""``mtgate serve``'s graceful drain: a uvicorn server whose first SIGTERM (or Ctrl-C) drains instead of closing.

On the first signal the server keeps its socket open but refuses new inference requests with 503 and reports
not-ready, waits until the requests in flight are done (at most ``--grace-period`` seconds, and at least
``--drain-delay`` so that load balancers see the failing readiness probe), then closes and exits 0. A second signal
exits at once. The app can also stop it (:meth:`DrainingServer.fail`: a model failed to load).
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import uvicorn

    from serving.server.service import TranslationService

logger = logging.getLogger("serving.commands.serve")  # the serve command's lines, under its logger as before


class DrainingServer:
    """A uvicorn server whose first SIGTERM/SIGINT drains instead of closing the socket at once.

    Arguments:
        config: the uvicorn configuration.
        service: the app's TranslationService (its ``draining`` flag and ``inflight`` count).
    """

    def __init__(self, config: uvicorn.Config, service: TranslationService) -> None:
        import uvicorn

        outer = self

        class _Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                if not outer.on_signal(sig):
                    super().handle_exit(sig, frame)

            async def on_tick(self, counter: int) -> bool:
                outer.tick(self)
                return await super().on_tick(counter)

            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets)
                for server in self.servers:
                    for sock in server.sockets:
                        host, port = sock.getsockname()[:2]
                        logger.info("mtgate serving on http://%s:%d", host, port)

        self._server = _Server(config)
        self.service = service
        self.settings = service.settings
        self.drain_started: float | None = None
        self.failure: str | None = None
        self.failure_cause: Exception | None = None

    @property
    def started(self) -> bool:
        return bool(self._server.started)

    def run(self, sock: socket.socket | None = None) -> None:
        """Serve (on ``sock`` if given, else on the configuration's host and port) until shut down."""
        self._server.run(sockets=None if sock is None else [sock])

    def fail(self, reason: str, cause: Exception) -> None:
        """Stop the server because the app cannot serve (e.g. the model failed to load)."""
        self.failure = reason
        self.failure_cause = cause
        self.service.closing.set()
        self._server.should_exit = True

    def on_signal(self, sig: int) -> bool:
        """True when the signal starts a drain; False to let uvicorn handle it (a second signal: exit now)."""
        if self.drain_started is not None or sig not in (signal.SIGTERM, signal.SIGINT):
            return False
        self.drain_started = time.monotonic()
        self.service.begin_drain()
        logger.info(
            "received %s: draining (%d requests in flight, grace period %.0fs)",
            signal.Signals(sig).name,
            self.service.inflight,
            self.settings.grace_period_s,
        )
        return True

    def tick(self, server: uvicorn.Server) -> None:
        if self.drain_started is None or server.should_exit:
            return
        elapsed = time.monotonic() - self.drain_started
        idle = self.service.inflight == 0
        if idle and elapsed >= self.settings.drain_delay_s:
            logger.info("drained in %.1fs; shutting down", elapsed)
        elif elapsed >= self.settings.grace_period_s:
            logger.warning("grace period over with %d requests in flight; shutting down", self.service.inflight)
        else:
            return
        self.service.closing.set()  # requests still sending their body get 408 now
        server.should_exit = True
