"""The API's documentation: ``/docs`` (Swagger UI served from an installed package, so it works offline) and the
OpenAPI document at ``/openapi.json``, completed with the limits of this server's settings.

Swagger UI's files come from the ``fastapi-offline`` package (a dependency of the plain install), served under
``/docs/assets`` with FastAPI's self-hosting recipe (``get_swagger_ui_html``); nothing is loaded from a CDN.
"""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from serving.server.http.json_types import NOT_SPACE
from serving.server.service import TranslationService

ASSETS = "/docs/assets"



def install_docs(app: FastAPI, service: TranslationService) -> None:
    """Serve ``/docs`` offline and make ``app.openapi()`` state this server's limits and models.

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
        if app.openapi_schema is not None:
            return app.openapi_schema
        # A copy: FastAPI's document shares dicts with the routes' openapi_extra (module constants).
        document = with_limits(copy.deepcopy(generate()), service)
        app.openapi_schema = None  # FastAPI's generate() caches the unpatched document
        if service.ready:  # the models' versions are known once they are loaded
            app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def with_limits(document: dict[str, Any], service: TranslationService) -> dict[str, Any]:
    """The OpenAPI document with what the service enforces (``serving.server.service``) written into it: the ranges
    of the decoding options and of the texts, and the names (and, once loaded, versions) of the served models."""
    settings = service.settings
    maxima = {"beam_size": settings.max_beam_size, "max_length": settings.max_output_tokens,
              "num_hypotheses": settings.max_beam_size, "min_length": settings.max_output_tokens}
    schemas = document.get("components", {}).get("schemas", {})
    names = list(service.models)
    for schema_name in ("TranslateRequest", "TranslateStreamRequest"):
        _request_limits(schemas.get(schema_name, {}), service, maxima, names)
    sentence = {"type": "string", "maxLength": settings.max_chars_per_sentence, "pattern": NOT_SPACE}
    sentences = {"anyOf": [
        sentence, {"type": "array", "items": sentence, "minItems": 1, "maxItems": settings.max_sentences_per_request},
    ]}
    score_request = schemas.get("ScoreRequest", {}).get("properties", {})
    for name in ("source", "target"):
        if name in score_request:
            score_request[name].update(copy.deepcopy(sentences))
    if "model" in score_request:
        score_request["model"]["enum"] = [*names, None]
    versions = sorted({str(r.info.version) for r in service.models.values() if r.translator is not None})
    for path in document.get("paths", {}).values():
        for operation in path.values():
            for parameter in operation.get("parameters", []):
                where, name = parameter.get("in"), parameter.get("name")
                if where == "query" and name in maxima:
                    parameter["schema"].update(minimum=1, maximum=maxima[name])
                elif where == "query" and name == "model" or where == "path" and name == "name":
                    parameter["schema"]["enum"] = names
                elif where == "path" and name == "version" and versions:
                    parameter["schema"]["enum"] = versions
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            infer_parameters = body.get("properties", {}).get("parameters", {}).get("properties", {})
            for name, maximum in maxima.items():
                if name in infer_parameters:  # never above the route's own maximum (num_hypotheses: 1)
                    infer_parameters[name]["maximum"] = min(maximum, infer_parameters[name].get("maximum", maximum))
            tensor = body.get("properties", {}).get("inputs", {}).get("items", {}).get("properties", {})
            if "data" in tensor:
                # an empty or blank sentence gets an empty translation (no pattern), as on /v1/translate
                tensor["data"]["items"].update(maxLength=settings.max_chars_per_sentence)
            responses = operation.get("responses", {})
            if "requestBody" in operation and "400" in responses:  # serving.server.http.middleware's Content-Encoding check
                responses.setdefault("415", {**responses["400"], "description": _UNSUPPORTED_ENCODING})
    return document


_UNSUPPORTED_ENCODING = ("the body is in a Content-Encoding this route does not decode (named; Accept-Encoding says "
                         "what it takes)")


def _request_limits(schema: dict[str, Any], service: TranslationService, maxima: dict[str, int],
                    names: list[str]) -> None:
    """A /v1 request body's limits: the options' maxima, the model names, and the texts' limits, which
    ``split_sentences`` changes (a text is then a document: each of its sentences is limited, not the text)."""
    settings = service.settings
    request = schema.get("properties", {})
    for name, maximum in maxima.items():
        if name in request:
            request[name]["maximum"] = maximum
    if "model" in request:
        request["model"]["enum"] = [*names, None]
    if "text" not in request:
        return

    def texts(item: dict[str, Any]) -> list[dict[str, Any]]:
        return [item, {"type": "array", "items": item, "minItems": 1, "maxItems": settings.max_sentences_per_request}]

    sentence = {"type": "string", "maxLength": settings.max_chars_per_sentence}
    if request.get("split_sentences", {}).get("const") is False:  # the stream: texts are sentences, not blank
        request["text"]["anyOf"] = texts({**sentence, "pattern": NOT_SPACE})
        return
    # /v1/translate answers an empty or blank text with an empty translation. Documents are limited by the body's
    # size (max_body_bytes) and, once split, by max_document_sentences and max_chars_per_sentence per sentence (413
    # naming the setting).
    request["text"]["anyOf"] = texts({"type": "string"})
    schema["if"] = {"properties": {"split_sentences": {"const": True}}, "required": ["split_sentences"]}
    schema["else"] = {"properties": {"text": {"anyOf": texts(sentence)}}}
