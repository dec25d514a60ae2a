"""Domain errors of the serving engine, free of HTTP.

The server maps each type to a status in one table (``serving/server/errors.py``, for HTTP and gRPC alike); the CLIs turn them into one line
on stderr. Every error carries a human-readable message (``str(error)``) and a stable machine ``code``.
"""

from __future__ import annotations


class ServingError(Exception):
    """Base of every error the engine raises on purpose. ``code`` is a stable machine-readable name."""

    code = "serving_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ServingError):
    """The request cannot be served as given (HTTP 400/422)."""

    code = "invalid_input"


class InputTooLong(InvalidInput):
    """A source text has more tokens than the model has positions (HTTP 413).

    Attributes:
        index: position of the offending text in the request.
        tokens: its length in source tokens, EOS included.
        limit: the model's maximum (``ModelInfo.max_input_tokens``).
    """

    code = "input_too_long"

    def __init__(self, message: str, *, index: int = 0, tokens: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.index = index
        self.tokens = tokens
        self.limit = limit


class ModelNotFound(ServingError):
    """The request names a model this server does not serve (HTTP 404)."""

    code = "model_not_found"


class LimitExceeded(InvalidInput):
    """A request exceeds one of the server's size limits (HTTP 413); the message names the limit.

    Attributes:
        limit: the setting's name (e.g. ``max_sentences_per_request``).
    """

    code = "limit_exceeded"

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class ModelNotReady(ServingError):
    """The model is not loaded or warmed up yet, or the server is draining (HTTP 503)."""

    code = "model_not_ready"


class Overloaded(ServingError):
    """The batch queue is full (HTTP 503 with ``Retry-After``).

    Attributes:
        retry_after: seconds a client should wait before retrying.
    """

    code = "overloaded"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class InferenceFailed(ServingError):
    """The runtime failed while translating (HTTP 500); the message names the stage and the runtime's reason."""

    code = "inference_failed"


class NotSupported(ServingError):
    """A protocol operation this server does not offer (HTTP 501, gRPC UNIMPLEMENTED); the message says why."""

    code = "not_supported"


class DeadlineExceeded(ServingError):
    """The request's deadline passed before its translation was done (HTTP 504)."""

    code = "deadline_exceeded"


class ModelLoadFailed(InvalidInput):
    """An explicit load of a repository model failed (HTTP 400, gRPC INVALID_ARGUMENT, as Triton answers): the package
    was refused or its engine did not load; the message is the loader's reason."""

    code = "model_load_failed"


class ModelControlDisabled(ServingError):
    """An explicit load or unload while the repository is polled (HTTP 503, gRPC UNAVAILABLE, as Triton answers):
    then the repository's directories decide what is served."""

    code = "model_control_disabled"
