"""Request and response schemas of the ``/v1`` routes (they make the OpenAPI document at ``/openapi.json``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from serving.api.service import finite_score


class TranslateRequest(BaseModel):
    """A sentence or a list of sentences to translate."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"text": "A man is riding a bicycle."}, {"text": ["Hello.", "Thank you."]}]},
    )

    text: str | list[str] = Field(description="one sentence, or a list of sentences translated independently")
    model: str | None = Field(default=None, description="model name (default: the server's first model)")
    beam_size: int | None = Field(default=None, ge=1, description="beam width (default: the model's)")
    max_length: int | None = Field(default=None, ge=1, description="most target tokens per sentence")
    timeout_ms: int | None = Field(
        default=None, ge=1, description="deadline in milliseconds; may only shorten the server's request timeout"
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


class ModelsResponse(BaseModel):
    """The models this server serves."""

    models: list[ModelOut]


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every error on ``/v1``."""

    error: ErrorBody


class StreamPartial(BaseModel):
    """SSE ``event: partial``: text appended to sentence ``index`` since its previous partial event."""

    index: int
    delta: str


class BulkLineIn(BaseModel):
    """One NDJSON line of a bulk request (a bare JSON string is accepted too)."""

    model_config = ConfigDict(extra="forbid")

    text: str
    id: str | int | None = None
