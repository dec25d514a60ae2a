"""What a transport besides HTTP is to the server: something the data plane is served over, started once the event
loop runs and stopped after the HTTP drain (``serving.server.http.app.create_app``'s lifespan, the loop uvicorn
runs). The gRPC transport (``serving.server.grpc.servicer.GrpcTransport``) is one; ``mtgate serve`` hands it in."""

from __future__ import annotations

from typing import Protocol

from serving.server.repository import ModelControl
from serving.server.service import TranslationService


class Transport(Protocol):
    """A transport over the data plane."""

    async def start(self, service: TranslationService, control: ModelControl) -> None:
        """Start serving ``service`` (and the repository extension ``control``) in the running event loop."""
        ...

    async def stop(self) -> None:
        """Stop, after the HTTP drain (requests in flight were waited for with HTTP's)."""
        ...
