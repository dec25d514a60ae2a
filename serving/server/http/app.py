"""``create_app(settings, translator=None, transports=())``: the FastAPI application of ``mtgate serve``.

The model is loaded and warmed up in the background from the lifespan, so that ``/v2/health/live`` answers at once and
``/v2/health/ready`` turns 200 only when the model can serve. Tests pass a ``translator`` (a fake or an already loaded
engine) instead of loading ``settings.model_dirs``. Other transports over the same data plane (gRPC: ``mtgate serve``
hands it in) are started and stopped by the same lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from serving import __version__
from serving.engine.request import Engine
from serving.server.http import bulk, shadow, v1, v2
from serving.server.http.deps import ServiceDep
from serving.server.http.docs import install_docs
from serving.server.http.errors import install_error_handlers
from serving.server.http.middleware import ServerMiddleware
from serving.server.metrics import CONTENT_TYPE, ServingMetrics
from serving.server.repository import ModelControl, ModelRepository
from serving.server.service import TranslationService
from serving.server.settings import ServingSettings
from serving.server.shadow import Shadow
from serving.server.transport import Transport

logger = logging.getLogger(__name__)


def create_app(
    settings: ServingSettings, translator: Engine | Sequence[Engine] | None = None,
    transports: Sequence[Transport] = (),
) -> FastAPI:
    """Build the app.

    Arguments:
        settings: every server setting (limits, batching, models to load, API key).
        translator: serve this translator (or these) instead of loading ``settings.model_dirs``.
        transports: other transports to serve the same data plane over, started once the loop runs.

    Returns:
        The FastAPI app; its ``state.service`` is the :class:`TranslationService`.
    """
    translators: Sequence[Engine] = (
        () if translator is None else [translator] if not isinstance(translator, Sequence) else translator
    )
    metrics = ServingMetrics()
    repository = None
    if settings.model_repository is not None and not translators:
        repository = ModelRepository(settings, metrics)
    newest, older = repository.runners() if repository is not None else ([], {})
    service = TranslationService(settings, metrics, translators, newest)
    service.older = older
    control = repository or ModelControl()  # the repository extension, for /v2 and gRPC alike
    control.service = service
    if settings.shadow is not None:  # the default model's requests are shadowed
        service.shadow = Shadow(settings, metrics.registry, service.default_model,
                                production=service.models[service.default_model].package_dir)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start()
        if service.shadow is not None:
            service.shadow.start()
        started: list[Transport] = []
        for transport in transports:
            await transport.start(service, control)
            started.append(transport)
        loading = asyncio.create_task(service.load(), name="load-models")
        polling = None
        if repository is not None and settings.repository_poll_secs is not None:
            every = settings.repository_poll_secs

            async def poll_after_loading() -> None:
                await loading
                await repository.poll(every)

            polling = asyncio.create_task(poll_after_loading(), name="repository-poll")
        try:
            yield
        finally:
            if polling is not None:
                polling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await polling
            if repository is not None:
                await repository.close()
            for transport in started:  # after the HTTP drain: in-flight requests were waited for with HTTP's
                await transport.stop()
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            await service.stop()
            if service.shadow is not None:
                await service.shadow.stop()

    app = FastAPI(
        title="mtgate",
        version=__version__,
        description="Machine translation on CPU: `/v1` REST (JSON, SSE streaming, NDJSON bulk), `/v2` Open Inference "
        "Protocol (tritonclient), `/metrics` (Prometheus).",
        lifespan=lifespan,
        # tritonclient sends JSON without a Content-Type; the /v2 infer route parses its raw body anyway.
        strict_content_type=False,
        docs_url=None,  # serving.server.http.docs serves /docs without a CDN
        redoc_url=None,
    )
    app.state.service = service
    app.state.control = control
    app.state.settings = settings
    app.add_middleware(ServerMiddleware, service=service)
    install_error_handlers(app)
    app.include_router(v1.router)
    app.include_router(bulk.router)
    app.include_router(shadow.router)
    app.include_router(v2.router)
    install_docs(app, service)

    page = resources.files("serving.server.http").joinpath("static/index.html").read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        """A page to try the server."""
        return HTMLResponse(page)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics(service: ServiceDep) -> Response:
        """Prometheus metrics."""
        service.metrics.ready.set(1 if service.ready else 0)
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/health", include_in_schema=False)
    async def health(request: Request, service: ServiceDep) -> dict[str, object]:
        """Readiness details for humans (probes use /v2/health/*)."""
        return {
            "ready": service.ready,
            "draining": service.draining,
            "failed": service.failed,
            "models": {
                name: {"ready": runner.ready, "error": runner.load_error} for name, runner in service.models.items()
            },
            "inflight": service.inflight,
        }

    return app
