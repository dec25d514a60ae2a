"""A translation request through the engine: what a caller asks for (:class:`DecodeOptions`), what admission makes of
it (:class:`Prepared`: token ids, caps and the resolved search options, no strings), what comes back
(:class:`Translation`; :class:`ReferenceScore` for reference scoring), and :class:`Engine`, the protocol every caller of the engine uses (the server's data plane,
``batch-score``'s local worker, the Triton model, ``mtgate validate``). ``serving.engine.Translator`` implements it;
so does the test fake ``tests.fakes.EchoTranslator``.

A sentence's way through the engine: ``Engine.prepare`` tokenizes it once and checks its length once (the server
does that at admission); the batchers carry prepared sentences (:meth:`Prepared.split`, :meth:`Prepared.join`);
``Engine.run`` decodes and detokenizes them. ``Engine.translate`` is the two in one call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any, Protocol

import numpy as np

from serving.decoding import SearchOptions
from serving.errors import InputTooLong, InvalidInput
from serving.package import DecodingDefaults

OnPartial = Callable[[int, str], None]
"""``on_partial(index, text)``: sentence ``index`` of a request now reads ``text`` (a partial translation, for
streaming). The engine calls it from the thread that decodes; the batchers hand it over to the event loop."""


def positive_int(name: str, value: object) -> int | None:
    """``value`` when it is None or an integer of at least 1: the one check of a request's integer options.

    Raises:
        InvalidInput: ``"<name> must be a positive integer, got <value>"``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise InvalidInput(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class DecodeOptions:
    """A request's decoding overrides (None: the package's default); hashable, so it is the batchers' batch key.
    ``serving.engine.Translator.search_options`` resolves it into the search's options, in one place.

    Attributes:
        beam_size: beams (1: greedy search).
        max_length: at most this many generated tokens, EOS excluded.

    Raises:
        InvalidInput: a value that is not a positive integer.
    """

    beam_size: int | None = None
    max_length: int | None = None

    def __post_init__(self) -> None:
        positive_int("beam_size", self.beam_size)
        positive_int("max_length", self.max_length)

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any]) -> DecodeOptions:
        """The options of Open Inference Protocol / Triton request parameters (``beam_size``, ``max_length``; other
        parameters are not decoding options).

        Raises:
            InvalidInput: ``"parameter 'beam_size' must be a positive integer, got ..."``.
        """
        return cls(*(positive_int(f"parameter {name!r}", parameters.get(name)) for name in ("beam_size", "max_length")))


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded model is.

    Attributes:
        name: package name.
        version: package version.
        runtime: ``onnxruntime`` or ``openvino``.
        precision: ``fp32`` or ``int8``.
        source_framework: where the checkpoint came from (``marian``, ``t2t``).
        max_input_tokens: the longest accepted source, in tokens including EOS (the model's positions).
        decoding: the package's decoding defaults.
        source_vocab_size: source vocabulary size.
        target_vocab_size: target vocabulary size.
    """

    name: str
    version: str
    runtime: str
    precision: str
    source_framework: str
    max_input_tokens: int
    decoding: DecodingDefaults
    source_vocab_size: int
    target_vocab_size: int


@dataclass(frozen=True)
class Translation:
    """One translated text.

    Attributes:
        text: the translation.
        input_tokens: source tokens, EOS included.
        output_tokens: generated tokens, EOS excluded (``len(token_ids)``).
        score: length-normalized log-probability of the hypothesis (see ``serving.decoding.Hypothesis``).
        token_ids: generated ids, EOS excluded.
    """

    text: str
    input_tokens: int
    output_tokens: int
    score: float | None
    token_ids: list[int]


@dataclass(frozen=True)
class ReferenceScore:
    """The model's log-likelihood of a given translation (teacher-forced: ``serving.scoring``).

    Attributes:
        token_ids: the target's ids, EOS included (what the model was asked to predict).
        token_log_probs: the natural-log probability of each of them given the source and the ones before it.
        log_prob: their sum, the log-likelihood of the whole target.
        tokens: how many (``len(token_ids)``, EOS included).
        mean_log_prob: ``log_prob / tokens`` (what transformers' loss is the negative of).
        perplexity: ``exp(-mean_log_prob)``.
    """

    token_ids: list[int]
    token_log_probs: list[float]
    log_prob: float
    tokens: int
    mean_log_prob: float
    perplexity: float

    @classmethod
    def of(cls, token_ids: Sequence[int], token_log_probs: Sequence[float]) -> ReferenceScore:
        """The score of a target from its ids and their log-probabilities (at least one: EOS)."""
        values = [float(v) for v in token_log_probs]
        total = math.fsum(values)
        mean = total / max(1, len(values))
        return cls([int(i) for i in token_ids], values, total, len(values), mean, perplexity(mean))


def perplexity(mean_log_prob: float) -> float:
    """``exp(-mean_log_prob)``; infinite where that overflows a float."""
    return math.exp(-mean_log_prob) if -mean_log_prob < 709.0 else math.inf


@dataclass(frozen=True, eq=False)
class Prepared:
    """Sentences ready to decode, in request order: what ``Engine.prepare`` returns and the batchers carry.

    Attributes:
        sources: each sentence's source ids, EOS appended.
        caps: ``[N]`` int64, each sentence's cap on generated tokens, EOS included.
        search: the search options the request's :class:`DecodeOptions` resolve to.
    """

    sources: list[list[int]]
    caps: np.ndarray
    search: SearchOptions

    def __len__(self) -> int:
        return len(self.sources)

    @property
    def lengths(self) -> list[int]:
        """Source tokens of each sentence, EOS included (a batcher's cost)."""
        return [len(source) for source in self.sources]

    def take(self, rows: Sequence[int]) -> Prepared:
        """The sentences ``rows``, in that order."""
        return Prepared([self.sources[i] for i in rows], self.caps[np.asarray(rows, dtype=np.int64)], self.search)

    def split(self) -> list[Prepared]:
        """One :class:`Prepared` per sentence (a batcher's items)."""
        return [Prepared([source], self.caps[i : i + 1], self.search) for i, source in enumerate(self.sources)]

    @staticmethod
    def join(parts: Sequence[Prepared]) -> Prepared:
        """The sentences of ``parts``, in order, as one; they must share their search options (a batch key).

        Raises:
            ValueError: nothing to join, or parts with different search options.
        """
        if not parts:
            raise ValueError("nothing to join")
        if len(parts) == 1:
            return parts[0]
        first = parts[0].search
        if any(part.search != first for part in parts):
            raise ValueError("prepared sentences with different search options cannot share a batch")
        return Prepared([s for part in parts for s in part.sources], np.concatenate([p.caps for p in parts]), first)


def check_lengths(lengths: Sequence[int] | np.ndarray, limit: int, subject: str = "text {index}") -> None:
    """Refuse sources (or targets to score) longer than the model's positions: the one length check of a request.

    Arguments:
        lengths: tokens of each text, EOS included.
        limit: the model's positions.
        subject: how the message names the text (``{index}`` is its index).

    Raises:
        InputTooLong: for the first text that is too long (``index``, ``tokens``, ``limit`` set).
    """
    array = np.asarray(lengths, dtype=np.int64)
    if array.size and array.max() > limit:
        index = int(np.argmax(array > limit))
        tokens = int(array[index])
        raise InputTooLong(f"{subject.format(index=index)} has {tokens} tokens; the model accepts at most {limit}",
                           index=index, tokens=tokens, limit=limit)


class Engine(Protocol):
    """What every caller needs from a translation engine (``serving.engine.Translator``, ``tests.fakes``)."""

    info: ModelInfo

    def prepare(self, texts: Sequence[str], options: DecodeOptions | None = None) -> Prepared:
        """Tokenize ``texts`` (EOS appended), check their lengths and resolve ``options``.

        Raises:
            InputTooLong: a text has more tokens than the model has positions.
        """
        ...

    def prepare_ids(self, ids: Sequence[Sequence[int]], options: DecodeOptions | None = None) -> Prepared:
        """:meth:`prepare` for sentences already tokenized with the package's source vocabulary (without EOS).

        Raises:
            InvalidInput: an id outside the source vocabulary.
            InputTooLong: a sentence has more tokens than the model has positions.
        """
        ...

    def run(self, prepared: Prepared, on_partial: OnPartial | None = None) -> list[Translation]:
        """Decode and detokenize prepared sentences: one translation each, in order.

        Raises:
            InferenceFailed: the runtime failed.
        """
        ...

    def translate(
        self, texts: Sequence[str], options: DecodeOptions | None = None, on_partial: OnPartial | None = None
    ) -> list[Translation]:
        """``run(prepare(texts, options), on_partial)``."""
        ...

    def score(self, sources: Sequence[str], targets: Sequence[str]) -> list[ReferenceScore]:
        """The model's log-likelihood of each target given its source (reference scoring), in order.

        Raises:
            InvalidInput: not as many targets as sources, or a text that is not valid Unicode (named).
            InputTooLong: a source or target with more tokens than the model has positions.
            InferenceFailed: the runtime failed.
        """
        ...

    def score_ids(self, ids: Sequence[Sequence[int]], targets: Sequence[str]) -> list[ReferenceScore]:
        """:meth:`score` for sources already tokenized with the package's source vocabulary (without EOS).

        Raises:
            InvalidInput: not as many targets as sources, an id outside the source vocabulary, a bad target text.
            InputTooLong: a source or target with more tokens than the model has positions.
            InferenceFailed: the runtime failed.
        """
        ...
