"""Request and response schemas of the routes and their error bodies (they make the OpenAPI document at
``/openapi.json``; ``serving.api.docs`` adds the limits of the running server)."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# A character Python's str.strip() keeps (the service refuses a text with none: "is empty"). JSON Schema's \S is
# ECMA-262's, which differs (it counts U+FEFF as space and U+001C..U+001F, U+0085 as text), so the class is
# spelled out; tests/serving/api/test_api_fuzz.py checks it against str.isspace over every code point.
NOT_SPACE = "[^\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"


def _json_integer(value: Any) -> Any:
    """What JSON Schema calls an integer: 4 and 4.0, not true or "4" (which lax pydantic would take as 1 and 4)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be an integer")
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_json_integer)]



def finite_score(score: float | None) -> float | None:
    """A score JSON can carry (NaN and infinities become None)."""
    return score if score is not None and math.isfinite(score) else None


class TranslateRequest(BaseModel):
    """A sentence or a list of sentences to translate."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"text": "A man is riding a bicycle."}, {"text": ["Hello.", "Thank you."]}]},
    )

    # Ranges are checked by the service (400 naming the option and its range); the document states them
    # (serving.api.docs fills in the maxima from the server's settings).
    text: str | list[str] = Field(description="one sentence, or a list of sentences translated independently")
    model: str | None = Field(default=None, description="model name (default: the server's first model)")
    beam_size: JsonInt | None = Field(
        default=None, description="beam width (default: the model's)", json_schema_extra={"minimum": 1}
    )
    max_length: JsonInt | None = Field(
        default=None, description="most target tokens per sentence", json_schema_extra={"minimum": 1}
    )
    timeout_ms: JsonInt | None = Field(
        default=None,
        description="deadline in milliseconds; may only shorten the server's request timeout",
        json_schema_extra={"minimum": 1},
    )

    def texts(self) -> list[str]:
        return [self.text] if isinstance(self.text, str) else list(self.text)


class TranslationOut(BaseModel):
    """One translated sentence."""

    text: str
    input_tokens: int = Field(description="source tokens, EOS included")
    output_tokens: int = Field(description="target tokens generated, EOS excluded")
    score: float | None = Field(default=None, description="the decoder's (length-normalized) log-probability")

    @classmethod
    def of(cls, translation: Any) -> TranslationOut:
        return cls(
            text=translation.text,
            input_tokens=int(translation.input_tokens),
            output_tokens=int(translation.output_tokens),
            score=finite_score(translation.score),
        )


class TranslateResponse(BaseModel):
    """Translations in the order of the request's sentences."""

    model: str
    version: str
    translations: list[TranslationOut]


class ScoreRequest(BaseModel):
    """Source/target pairs whose targets the model scores (its log-likelihood of each, teacher-forced)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"source": "A man is riding a bicycle.", "target": "Ein Mann fährt Fahrrad."},
                                        {"source": ["Hello.", "Thank you."], "target": ["Hallo.", "Danke."]}]},
    )

    source: str | list[str] = Field(description="one source sentence, or a list")
    target: str | list[str] = Field(description="the translation to score of each source (as many as sources)")
    model: str | None = Field(default=None, description="model name (default: the server's first model)")
    timeout_ms: JsonInt | None = Field(
        default=None,
        description="deadline in milliseconds; may only shorten the server's request timeout",
        json_schema_extra={"minimum": 1},
    )

    def sources(self) -> list[str]:
        return [self.source] if isinstance(self.source, str) else list(self.source)

    def targets(self) -> list[str]:
        return [self.target] if isinstance(self.target, str) else list(self.target)


class ScoreOut(BaseModel):
    """The model's log-likelihood of one target (natural logarithms)."""

    log_prob: float = Field(description="the log-probability of the whole target, EOS included")
    tokens: int = Field(description="target tokens scored, EOS included")
    mean_log_prob: float = Field(description="log_prob / tokens (transformers' loss is its negative)")
    perplexity: float | None = Field(description="exp(-mean_log_prob); null where it overflows")
    token_log_probs: list[float] = Field(description="the log-probability of each target token, EOS last")

    @classmethod
    def of(cls, score: Any) -> ScoreOut:
        return cls(log_prob=score.log_prob, tokens=int(score.tokens), mean_log_prob=score.mean_log_prob,
                   perplexity=finite_score(score.perplexity), token_log_probs=list(score.token_log_probs))


class ScoreResponse(BaseModel):
    """Scores in the order of the request's pairs."""

    model: str
    version: str
    scores: list[ScoreOut]


class ModelOut(BaseModel):
    """A served model."""

    name: str
    version: str | None = None
    runtime: str | None = None
    precision: str | None = None
    max_input_tokens: int | None = None
    ready: bool
    default: bool
    details: dict[str, Any] = Field(default_factory=dict, description="everything else the engine reports")


class Limits(BaseModel):
    """What a client may ask of this server (its settings of the same names)."""

    max_beam_size: int
    max_output_tokens: int
    max_sentences_per_request: int
    max_chars_per_sentence: int


class ModelsResponse(BaseModel):
    """The models this server serves, and its limits."""

    models: list[ModelOut]
    limits: Limits


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every error outside ``/v2``."""

    error: ErrorBody


class OipError(BaseModel):
    """Every error under ``/v2`` (what tritonclient parses)."""

    error: str


_ERROR_TEXT = {
    400: "invalid input: the message says what (malformed JSON, a bad option value, text that is not valid Unicode)",
    401: "missing or wrong API key (only when the server has one: MTGATE_API_KEY)",
    404: "unknown model",
    408: "the request body did not arrive within body_timeout_s, or the server shut down first",
    413: "a size limit was exceeded; the message names the setting",
    422: "the body or a parameter does not match the schema",
    500: "the runtime failed while translating (or scoring)",
    501: "an operation this server does not offer (the message says why)",
    503: "queue full (with Retry-After), model not ready, or server draining (with Retry-After)",
    504: "the request's deadline passed before its translation (or scores) was done",
}


def error_responses(*codes: int, oip: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error statuses a route can answer, with the error body of its API family."""
    model = OipError if oip else ErrorResponse
    responses: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        responses[code] = {"model": model, "description": _ERROR_TEXT[code]}
        if code == 503:
            responses[code]["headers"] = {"Retry-After": {"description": "seconds to wait (queue full, draining)",
                                                          "schema": {"type": "integer", "minimum": 0}}}
        elif code == 401:
            responses[code]["headers"] = {"WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"}}}
    return responses


class LiveResponse(BaseModel):
    """``GET /v2/health/live``."""

    live: bool


class ReadyResponse(BaseModel):
    """``GET /v2/health/ready``: 200 with ``true`` once every model is loaded and warm, else 503 with ``false``."""

    ready: bool


class ModelReadyResponse(BaseModel):
    """``GET /v2/models/{name}/ready``: 200 with ``true`` when the model can take requests, else 503 with ``false``
    and, as Triton answers, an ``error`` message."""

    name: str
    ready: bool
    error: str | None = None


class ServerMetadata(BaseModel):
    """``GET /v2``."""

    name: str
    version: str
    extensions: list[str]


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    """``GET /v2/models/{name}``."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ConfigTensor(BaseModel):
    name: str
    data_type: str
    dims: list[int]


class ModelConfig(BaseModel):
    """``GET /v2/models/{name}/config``: Triton's ModelConfig in JSON (``serving.oip.model_config``)."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    input: list[ConfigTensor]
    output: list[ConfigTensor]
    dynamic_batching: dict[str, Any]
    instance_group: list[dict[str, Any]]


class StatDuration(BaseModel):
    count: int
    ns: int


class InferenceStatistics(BaseModel):
    success: StatDuration
    fail: StatDuration
    queue: StatDuration
    compute_input: StatDuration
    compute_infer: StatDuration
    compute_output: StatDuration
    cache_hit: StatDuration
    cache_miss: StatDuration


class BatchSizeStatistics(BaseModel):
    batch_size: int
    compute_input: StatDuration
    compute_infer: StatDuration
    compute_output: StatDuration


class ModelStatisticsEntry(BaseModel):
    name: str
    version: str
    last_inference: int = Field(description="milliseconds since the epoch of the last batch, 0 before any")
    inference_count: int = Field(description="sentences translated")
    execution_count: int = Field(description="engine batches run")
    inference_stats: InferenceStatistics
    batch_stats: list[BatchSizeStatistics]
    memory_usage: list[dict[str, Any]]


class ModelStatisticsResponse(BaseModel):
    """``GET /v2/models[/{name}[/versions/{v}]]/stats``: Triton's statistics extension (``serving.statistics``)."""

    model_stats: list[ModelStatisticsEntry]


class RepositoryModel(BaseModel):
    """One entry of ``POST /v2/repository/index`` (Triton's model repository extension)."""

    name: str
    version: str
    state: str = Field(description="READY, LOADING, or UNAVAILABLE (then `reason` says why)")
    reason: str | None = None


class OutputTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any] | None = Field(default=None, description="absent when the tensor is sent as binary data")
    parameters: dict[str, Any] | None = Field(default=None, description="binary_data_size for binary outputs")


class InferResponse(BaseModel):
    """The JSON of an infer response (with binary outputs: its header, followed by the tensors' bytes)."""

    id: str | None = None
    model_name: str
    model_version: str
    outputs: list[OutputTensor]


class StreamPartial(BaseModel):
    """SSE ``event: partial``: text appended to sentence ``index`` since its previous partial event."""

    index: int
    delta: str


STREAM_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "status"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "status": {"type": "integer"}},
        }
    },
}
"""SSE ``event: error`` and a bulk line's error: the error with the HTTP status it would have had."""


class BulkLineIn(BaseModel):
    """One NDJSON line of a bulk request (a bare JSON string is accepted too)."""

    model_config = ConfigDict(extra="forbid")

    text: str
    id: str | int | None = None
