"""The API's documentation: ``/docs`` (Swagger UI served from an installed package, so it works offline) and the
OpenAPI document at ``/openapi.json``, completed with the limits of this server's settings.

Swagger UI's files come from the ``fastapi-offline`` package (a dependency of the plain install), served under
``/docs/assets`` with FastAPI's self-hosting recipe (``get_swagger_ui_html``); nothing is loaded from a CDN.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from serving.settings import ServingSettings

ASSETS = "/docs/assets"


def install_docs(app: FastAPI, settings: ServingSettings) -> None:
    """Serve ``/docs`` offline and make ``app.openapi()`` state this server's limits.

    The app must be built with ``docs_url=None`` and ``redoc_url=None`` (FastAPI's own pages load from a CDN).
    """
    assets = resources.files("fastapi_offline").joinpath("static")
    app.mount(ASSETS, StaticFiles(directory=str(assets)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
        )

    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_limits(generate(), settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def with_limits(document: dict[str, Any], settings: ServingSettings) -> dict[str, Any]:
    """The OpenAPI document with the ranges the service enforces (``serving.api.service``) written into it."""
    maxima = {"beam_size": settings.max_beam_size, "max_length": settings.max_output_tokens}
    schemas = document.get("components", {}).get("schemas", {})
    request = schemas.get("TranslateRequest", {}).get("properties", {})
    for name, maximum in maxima.items():
        if name in request:
            request[name]["maximum"] = maximum
    if "text" in request:
        sentence = {"type": "string", "maxLength": settings.max_chars_per_sentence, "pattern": r"\S"}
        request["text"]["anyOf"] = [
            sentence,
            {"type": "array", "items": sentence, "minItems": 1, "maxItems": settings.max_sentences_per_request},
        ]
    for path in document.get("paths", {}).values():
        for operation in path.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "query" and parameter.get("name") in maxima:
                    parameter["schema"].update(minimum=1, maximum=maxima[parameter["name"]])
    return document
