"""Errors -> HTTP responses: the status of each error is ``serving.server.errors``' one table; here, one way to
render a body, and one handler.

Bodies differ by API family only: ``/v2/...`` (Open Inference Protocol) answers ``{"error": "<message>"}``, which
``tritonclient`` parses; every other route answers ``{"error": {"code": ..., "message": ...}}``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from serving.engine.errors import (
    DeadlineExceeded,
    ModelControlDisabled,
    ModelNotReady,
    NotSupported,
    Overloaded,
    ServingError,
)
from serving.server.errors import headers_of, status_of

logger = logging.getLogger(__name__)


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    500: "internal_error",
    501: "not_implemented",
    503: "unavailable",
}


def is_v2(path: str) -> bool:
    return path == "/v2" or path.startswith("/v2/")


def error_response(
    path: str, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The error body of the API family ``path`` belongs to."""
    body: object = {"error": message} if is_v2(path) else {"error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def serving_error_response(path: str, error: ServingError) -> Response:
    """Render a domain error; the one place that decides its status, body and headers."""
    status = status_of(error)
    if status >= 500 and not isinstance(error, ModelNotReady | Overloaded | DeadlineExceeded | NotSupported
                                                  | ModelControlDisabled):
        logger.error("%s %s: %s", status, path, error)
    else:
        logger.info("%s %s: %s", status, path, error)
    return error_response(path, status, error.code, str(error), headers_of(error))


def _validation_message(error: RequestValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        loc = ".".join(str(p) for p in item.get("loc", ()) if p != "body") or "body"
        msg = item.get("msg", "invalid")
        if item.get("type") == "model_attributes_type" and isinstance(item.get("input"), bytes | str):
            msg = "the request body must be a JSON object (send Content-Type: application/json)"
        parts.append(f"{loc}: {msg}")
    more = len(error.errors()) - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def invalid_json_message(error: RequestValidationError) -> str | None:
    """The plain message for a body that is not JSON at all (HTTP 400, as on ``/v2``), else None."""
    for item in error.errors():
        if item.get("type") == "json_invalid":
            reason = item.get("ctx", {}).get("error", "decode error")
            loc = item.get("loc", ())
            at = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
            return f"the request body is not valid JSON ({reason}{at})"
    return None


def install_error_handlers(app: FastAPI) -> None:
    """Route every error through :func:`error_response`: domain errors, validation errors, 404/405, crashes."""

    async def on_serving_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServingError)
        return serving_error_response(request.url.path, exc)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        invalid_json = invalid_json_message(exc)
        if invalid_json is not None:
            logger.info("400 %s: %s", request.url.path, invalid_json)
            return error_response(request.url.path, 400, "invalid_json", invalid_json)
        message = _validation_message(exc)
        logger.info("422 %s: %s", request.url.path, message)
        return error_response(request.url.path, 422, "validation_error", message)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        if exc.status_code == 400 and message == "There was an error parsing the body":
            message = "the request body could not be read as JSON text (it must be UTF-8 JSON)"
        elif exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
        return error_response(request.url.path, exc.status_code, code, message, exc.headers)

    async def on_crash(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(request.url.path, 500, "internal_error", f"internal error: {type(exc).__name__}")

    app.add_exception_handler(ServingError, on_serving_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_crash)
