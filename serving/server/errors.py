"""The errors a request meets in the server beyond the engine's (``serving.engine.errors``), and every error mapped to
its status in one place: :data:`STATUS` (the HTTP status), :data:`GRPC_CODES` (each status's gRPC code), the headers
an error calls for, and the API key check. Both transports (``serving.server.http``, ``serving.server.grpc``) answer
through these; neither framework is imported here.
"""

from __future__ import annotations

import hmac

from pydantic import SecretStr

from serving.engine.errors import (
    DeadlineExceeded,
    InferenceFailed,
    InputTooLong,
    InvalidInput,
    LimitExceeded,
    ModelControlDisabled,
    ModelNotFound,
    ModelNotReady,
    NotSupported,
    Overloaded,
    ServingError,
)


class Unauthorized(ServingError):
    """Missing or wrong API key (HTTP 401)."""

    code = "unauthorized"


class RequestTimeout(ServingError):
    """The request body did not arrive in time (``body_timeout_s``), or the server closed before it did (HTTP 408)."""

    code = "request_timeout"


class UnsupportedEncoding(ServingError):
    """A request body in a Content-Encoding the route does not decode (HTTP 415, with the ``Accept-Encoding`` it
    does)."""

    code = "unsupported_media_type"

    def __init__(self, message: str, accepted: str = "identity") -> None:
        super().__init__(message)
        self.accepted = accepted


class ClientDisconnected(ServingError):
    """The client went away before its answer was ready; its pending work was cancelled (logged as 499)."""

    code = "client_disconnected"


class ShadowNotConfigured(ServingError):
    """``GET /v1/shadow`` on a server started without ``--shadow`` (HTTP 404)."""

    code = "shadow_not_configured"


class CanaryNotConfigured(ServingError):
    """``POST /v1/shadow/canary`` on a server started without a canary (``--canary-fraction``; HTTP 404)."""

    code = "canary_not_configured"


# The one table. Lookup walks the exception's MRO, so subclasses inherit their parent's status.
STATUS: dict[type[ServingError], int] = {
    InputTooLong: 413,
    LimitExceeded: 413,
    InvalidInput: 400,
    Unauthorized: 401,
    ModelNotFound: 404,
    ShadowNotConfigured: 404,
    CanaryNotConfigured: 404,
    RequestTimeout: 408,
    UnsupportedEncoding: 415,
    ClientDisconnected: 499,
    InferenceFailed: 500,
    NotSupported: 501,
    ModelNotReady: 503,
    ModelControlDisabled: 503,
    Overloaded: 503,
    DeadlineExceeded: 504,
    ServingError: 500,
}

# The same errors on gRPC (serving.server.grpc.servicer): each HTTP status's gRPC code, as Triton and KServe map them (a
# full queue and a model that is not ready are UNAVAILABLE, to retry; a size limit is RESOURCE_EXHAUSTED, as gRPC's
# own message size limit).
GRPC_CODES: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    413: "RESOURCE_EXHAUSTED",
    415: "INVALID_ARGUMENT",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def status_of(error: ServingError) -> int:
    """The HTTP status of a domain error."""
    for cls in type(error).__mro__:
        if cls in STATUS:
            return STATUS[cls]  # type: ignore[index]
    return 500


def headers_of(error: ServingError) -> dict[str, str]:
    """Extra response headers a domain error calls for."""
    if isinstance(error, Overloaded):
        return {"Retry-After": str(max(0, round(error.retry_after)))}
    if isinstance(error, Unauthorized):
        return {"WWW-Authenticate": "Bearer"}
    if isinstance(error, UnsupportedEncoding):
        return {"Accept-Encoding": error.accepted}  # RFC 7694: the codings the route does decode
    return {}


def api_key_problem(authorization: str | None, key: SecretStr | None) -> str | None:
    """Why ``Authorization: <authorization>`` does not carry the API key ``key`` (None: it does, or no key is set).

    The middleware checks this before an inference request's body is read; the route dependency checks it again.
    The comparison takes constant time.
    """
    if key is None:
        return None
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return "this server requires an API key: send 'Authorization: Bearer <key>'"
    if not hmac.compare_digest(token.strip().encode(), key.get_secret_value().encode()):
        return "invalid API key"
    return None
