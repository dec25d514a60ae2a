"""Request and response schemas of the routes and their error bodies (they make the OpenAPI document at
``/openapi.json``; ``serving.server.http.docs`` adds the limits of the running server)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from serving.engine.documents import DocumentTranslation
from serving.engine.options import OPTION_NAMES
from serving.engine.request import ReferenceScore, Translation
from serving.server.http.json_types import JsonBool, JsonInt, JsonNumber, finite_score, json_boolean

_NOT_GIVEN = {"type": "null"}
OPTION_EXCLUSIONS: dict[str, Any] = {
    "allOf": [
        # Sampling draws one token at a time: with any sampling option (or do_sample), beam_size and num_hypotheses
        # are 1 (serving.engine.request.check_options); JSON Schema states it as two shapes of the body.
        {"anyOf": [
            {"properties": {"do_sample": {"enum": [False, None]}, "temperature": _NOT_GIVEN, "top_k": _NOT_GIVEN,
                            "top_p": _NOT_GIVEN, "seed": _NOT_GIVEN}},
            {"properties": {"do_sample": {"enum": [True, None]}, "beam_size": {"enum": [1, None]},
                            "num_hypotheses": {"enum": [1, None]}}},
        ]},
        # A target prefix starts a whole translation, and a split text's sentences have one translation each: neither
        # with split_sentences.
        {"anyOf": [{"properties": {"split_sentences": {"const": False}}},
                   {"properties": {"target_prefix": _NOT_GIVEN, "num_hypotheses": {"enum": [1, None]}}}]},
    ]
}


class TranslateRequest(BaseModel):
    """A sentence or a list of sentences to translate."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"text": "A man is riding a bicycle."}, {"text": ["Hello.", "Thank you."]},
                                        {"text": "Good morning.", "num_hypotheses": 3},
                                        {"text": "Good morning.", "temperature": 0.8, "top_p": 0.9, "seed": 1}],
                           **OPTION_EXCLUSIONS},
    )

    # Ranges are checked by the service (400 naming the option and its range); the document states them
    # (serving.server.http.docs fills in the maxima from the server's settings).
    text: str | list[str] = Field(description="one sentence, or a list of sentences translated independently")
    model: str | None = Field(default=None, description="model name (default: the server's first model)")
    beam_size: JsonInt | None = Field(
        default=None, description="beam width (default: the model's)", json_schema_extra={"minimum": 1}
    )
    max_length: JsonInt | None = Field(
        default=None, description="most target tokens per sentence", json_schema_extra={"minimum": 1}
    )
    num_hypotheses: JsonInt | None = Field(
        default=None, json_schema_extra={"minimum": 1},
        description="translations per sentence, best first, each with its score (beam search; widens the beam to "
        "at least this many)",
    )
    min_length: JsonInt | None = Field(
        default=None, json_schema_extra={"minimum": 1},
        description="fewest target tokens per sentence (after target_prefix; max_length wins)",
    )
    repetition_penalty: JsonNumber | None = Field(
        default=None, json_schema_extra={"exclusiveMinimum": 0},
        description="above 1 discourages repeating a token (transformers' repetition_penalty, on log-probabilities)",
    )
    no_repeat_ngram_size: JsonInt | None = Field(
        default=None, json_schema_extra={"minimum": 1}, description="no n-gram of this size occurs twice"
    )
    disable_unk: JsonBool = Field(default=False, description="never generate the unknown token")
    do_sample: JsonBool | None = Field(
        default=None,
        description="sample each token instead of searching (beam 1); default: sample when temperature, top_k, "
        "top_p or seed is given",
    )
    temperature: JsonNumber | None = Field(
        default=None, json_schema_extra={"exclusiveMinimum": 0}, description="sampling temperature (1: the model's)"
    )
    top_k: JsonInt | None = Field(
        default=None, json_schema_extra={"minimum": 1}, description="sample among the k most likely tokens"
    )
    top_p: JsonNumber | None = Field(
        default=None, json_schema_extra={"exclusiveMinimum": 0, "maximum": 1},
        description="sample among the most likely tokens whose probability reaches top_p",
    )
    seed: JsonInt | None = Field(
        default=None, json_schema_extra={"minimum": 0, "maximum": 2**64 - 1},
        description="makes sampling reproducible: the same seed, the same translations, however requests are batched",
    )
    target_prefix: str | None = Field(
        default=None,
        description="the start every translation is forced to (\"\": none; not with split_sentences)",
    )
    timeout_ms: JsonInt | None = Field(
        default=None,
        description="deadline in milliseconds; may only shorten the server's request timeout",
        json_schema_extra={"minimum": 1},
    )

    return_scores: JsonBool = Field(
        default=False,
        description="also each output token's log-probability, and EOS's last (`token_scores`, teacher-forced as "
        "/v1/score scores a reference)",
    )
    split_sentences: JsonBool = Field(
        default=False,
        description="split each text into sentences, translate all of them in one batch and join the translations "
        "with the text's own whitespace; each translation then lists its `sentences` (not on /v1/translate/stream)",
    )
    truncate: JsonBool = Field(
        default=False,
        description="a sentence longer than the model's positions (max_input_tokens): false refuses the request "
        "(413), true cuts the sentence to them and marks its translation `truncated`",
    )

    def texts(self) -> list[str]:
        return [self.text] if isinstance(self.text, str) else list(self.text)

    def decoding(self) -> dict[str, Any]:
        """The decoding options of the body, by name (``TranslationService.options`` checks them)."""
        return self.model_dump(include=set(OPTION_NAMES))

    def target_prefixes(self) -> list[str] | None:
        """The target prefix once per text, or None."""
        return None if self.target_prefix is None else [self.target_prefix] * len(self.texts())


class HypothesisOut(BaseModel):
    """One of a sentence's n best translations."""

    text: str
    output_tokens: int = Field(description="target tokens generated, EOS excluded")
    score: float | None = Field(default=None, description="the decoder's (length-normalized) log-probability")
    token_scores: list[float | None] | None = Field(
        default=None, exclude_if=lambda value: value is None,
        description="with return_scores: each output token's log-probability, EOS's last",
    )

    @classmethod
    def of(cls, translation: Translation) -> HypothesisOut:
        return cls(text=translation.text, output_tokens=int(translation.output_tokens),
                   score=finite_score(translation.score), token_scores=token_scores(translation))


def token_scores(translation: Translation) -> list[float | None] | None:
    """A translation's token scores as JSON carries them (None: not asked for)."""
    scores = translation.token_scores
    return None if scores is None else [finite_score(float(v)) for v in scores]


class TranslateStreamRequest(TranslateRequest):
    """A sentence or a list of sentences to translate and stream (sentence splitting is not streamed)."""

    split_sentences: Annotated[Literal[False], BeforeValidator(json_boolean)] = Field(
        default=False, description="not on the stream: split_sentences is a /v1/translate option"
    )


class SentenceOut(BaseModel):
    """One sentence of a text translated with ``split_sentences``."""

    source: str = Field(description="the sentence, text[start:end]")
    text: str = Field(description="its translation")
    start: int = Field(description="offset of its first character in the text (Unicode code points)")
    end: int = Field(description="offset after its last character")
    input_tokens: int = Field(description="source tokens, EOS included")
    output_tokens: int = Field(description="target tokens generated, EOS excluded")
    score: float | None = Field(default=None, description="the decoder's (length-normalized) log-probability")
    truncated: bool = Field(default=False, description="the sentence was cut to the model's positions")


class TranslationOut(BaseModel):
    """One translated sentence."""

    text: str
    input_tokens: int = Field(description="source tokens, EOS included")
    output_tokens: int = Field(description="target tokens generated, EOS excluded")
    score: float | None = Field(default=None, description="the decoder's (length-normalized) log-probability")
    hypotheses: list[HypothesisOut] | None = Field(
        default=None, exclude_if=lambda value: value is None,
        description="with num_hypotheses above 1: every hypothesis, best first (the first is this one)",
    )
    token_scores: list[float | None] | None = Field(
        default=None, exclude_if=lambda value: value is None,
        description="with return_scores: each output token's log-probability, EOS's last",
    )

    truncated: bool | None = Field(
        default=None, description="present (true) when the source was cut to the model's positions (`truncate`)"
    )
    sentences: list[SentenceOut] | None = Field(
        default=None, description="with `split_sentences`: each sentence of the text and its translation; `text` "
        "is their translations joined with the text's whitespace, the token counts are their sums, `score` is null"
    )

    @classmethod
    def of(cls, translation: Translation) -> TranslationOut:
        hypotheses = None
        if translation.alternatives:
            hypotheses = [HypothesisOut.of(t) for t in (translation, *translation.alternatives)]
        out = cls(
            text=translation.text,
            input_tokens=int(translation.input_tokens),
            output_tokens=int(translation.output_tokens),
            score=finite_score(translation.score),
            hypotheses=hypotheses,
            token_scores=token_scores(translation),
        )
        if translation.truncated:  # set only then: other responses stay as they were
            out.truncated = True
        return out

    @classmethod
    def of_document(cls, document: DocumentTranslation) -> TranslationOut:
        """A document's translation: the joined text, token counts summed over its sentences."""
        sentences = [
            SentenceOut(source=s.source, text=s.translation.text, start=s.start, end=s.end,
                        input_tokens=int(s.translation.input_tokens), output_tokens=int(s.translation.output_tokens),
                        score=finite_score(s.translation.score), truncated=bool(s.translation.truncated))
            for s in document.sentences
        ]
        out = cls(text=document.text, input_tokens=sum(s.input_tokens for s in sentences),
                  output_tokens=sum(s.output_tokens for s in sentences), score=None, sentences=sentences)
        if document.truncated:
            out.truncated = True
        return out


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
    def of(cls, score: ReferenceScore) -> ScoreOut:
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
    max_document_sentences: int = Field(description="most sentences of a request with split_sentences, all its texts "
                                        "together (the lower of the settings max_document_sentences, max_queue_size)")


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
