"""A translation request through the engine: what a caller asks for (:class:`DecodeOptions`), what admission makes of
it (:class:`Prepared`: token ids, caps and the resolved search options, no strings), what comes back
(:class:`Translation`; :class:`ReferenceScore` for reference scoring), and :class:`Engine`, the protocol every caller of the engine uses (the server's data plane,
``batch-score``'s local worker, the Triton model, ``mtgate validate``). ``serving.engine.translator.Translator`` implements it;
so does the test fake ``tests.fakes.EchoTranslator``.

A sentence's way through the engine: ``Engine.prepare`` tokenizes it once and checks its length once (the server
does that at admission); the batchers carry its sentences by reference (:class:`Sentence`) and gather a batch of
them once (:meth:`Prepared.gather`); ``Engine.run`` decodes and detokenizes them. ``Engine.translate`` is the two in one call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from serving.engine.decoding import Alive, SearchOptions
from serving.engine.errors import InputTooLong
from serving.engine.options import (
    DecodeOptions as DecodeOptions,  # the request type of the Engine protocol, re-exported
)
from serving.package import DecodingDefaults

OnPartial = Callable[[int, str], None]
"""``on_partial(index, delta)``: the translation of sentence ``index`` of a request continues with ``delta``, text
that can no longer change (streaming): a sentence's deltas, in order, concatenate to its final text. The engine calls
it from the thread that decodes; the batchers hand it over to the event loop."""


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
        source_language: the sources' language code when the manifest names one (``tokenizer.source_lang``), else
            None (``serving.engine.documents`` splits in it).
        shortlist: decoding is restricted to the package's vocabulary shortlist (``serving.engine.shortlist``).
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
    source_language: str | None = None
    shortlist: bool = False


@dataclass(frozen=True)
class Translation:
    """One translated text.

    Attributes:
        text: the translation.
        input_tokens: source tokens, EOS included.
        output_tokens: generated tokens, EOS excluded (``len(token_ids)``).
        score: length-normalized log-probability of the hypothesis (see ``serving.engine.decoding.Hypothesis``).
        token_ids: generated ids, EOS excluded.
        alternatives: the next best translations, best first (``num_hypotheses - 1``; their own
            ``alternatives`` empty).
        token_scores: with ``return_scores``, the model's log-probability of each of ``token_ids`` and, last, of EOS
            after them (``output_tokens + 1`` entries, teacher-forced as ``Engine.score`` scores a reference: their
            sum is its log-likelihood when ``text`` tokenizes back to ``token_ids``).
        truncated: the source was cut to the model's positions (``DecodeOptions.truncate``); ``input_tokens`` is then
            what the model read.
    """

    text: str
    input_tokens: int
    output_tokens: int
    score: float | None
    token_ids: list[int]
    alternatives: tuple[Translation, ...] = ()
    truncated: bool = False
    token_scores: tuple[float, ...] | None = None


# What an empty or blank text is translated to, untranslated (the server, as mtgate translate for a blank line).
EMPTY_TRANSLATION = Translation(text="", input_tokens=0, output_tokens=0, score=None, token_ids=[])


@dataclass(frozen=True)
class ReferenceScore:
    """The model's log-likelihood of a given translation (teacher-forced: ``serving.engine.reference_scoring``).

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
        caps: ``[N]`` int64, each sentence's cap on generated tokens, EOS included (a target prefix included).
        search: the search options the request's :class:`DecodeOptions` resolve to.
        truncated: each sentence's flag, whether its source was cut (:func:`fit_sources`); empty when none was.
        seeds: ``[N]`` uint64, each sentence's sampling seed (``search.sampling``), else None.
        prefixes: each sentence's forced target prefix (target ids, no EOS), or None.
    """

    sources: list[list[int]]
    caps: np.ndarray
    search: SearchOptions
    truncated: tuple[bool, ...] = ()
    seeds: np.ndarray | None = None
    prefixes: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.sources)

    @property
    def lengths(self) -> list[int]:
        """Source tokens of each sentence, EOS included (a batcher's cost)."""
        return [len(source) for source in self.sources]

    def sentences(self) -> list[Sentence]:
        """Each sentence, by reference (a batcher's items: nothing is copied)."""
        return [Sentence(self, i) for i in range(len(self.sources))]

    def take(self, rows: Sequence[int]) -> Prepared:
        """The sentences ``rows``, in that order."""
        return Prepared.gather([Sentence(self, int(i)) for i in rows])

    def split(self) -> list[Prepared]:
        """One :class:`Prepared` per sentence."""
        return [Prepared.gather([sentence]) for sentence in self.sentences()]

    def mark(self, translations: Sequence[Translation]) -> list[Translation]:
        """``translations`` of these sentences, in order, each marked ``truncated`` when its source was cut (what
        every ``Engine.run`` returns)."""
        if not any(self.truncated):
            return list(translations)
        return [replace(t, truncated=True) if cut else t for t, cut in zip(translations, self.truncated, strict=True)]

    @staticmethod
    def join(parts: Sequence[Prepared]) -> Prepared:
        """The sentences of ``parts``, in order, as one; they must share their search options (a batch key).

        Raises:
            ValueError: nothing to join, or parts with different search options.
        """
        if len(parts) == 1:
            return parts[0]
        return Prepared.gather([sentence for part in parts for sentence in part.sentences()])

    @staticmethod
    def gather(sentences: Sequence[Sentence]) -> Prepared:
        """The given sentences (of one or more requests sharing their search options), in that order, as one: the one
        place sentences are copied into a batch (every other reshaping goes through it).

        Raises:
            ValueError: no sentences, or sentences with different search options.
        """
        if not sentences:
            raise ValueError("nothing to join")
        first = sentences[0].request
        if len(sentences) == len(first) and all(s.request is first and s.index == i for i, s in enumerate(sentences)):
            return first  # a whole request, in its order
        requests = {id(s.request): s.request for s in sentences}.values()
        if any(request.search != first.search for request in requests):
            raise ValueError("prepared sentences with different search options cannot share a batch")
        truncated: tuple[bool, ...] = ()
        if any(request.truncated for request in requests):
            truncated = tuple(bool(s.request.truncated) and s.request.truncated[s.index] for s in sentences)
        seeds = None
        if any(request.seeds is not None for request in requests):  # a request without seeds: 0s
            seeds = np.array([0 if s.request.seeds is None else s.request.seeds[s.index] for s in sentences],
                             dtype=np.uint64)
        prefixes = None
        if any(request.prefixes is not None for request in requests):  # a request without prefixes: empty ones
            prefixes = [[] if s.request.prefixes is None else s.request.prefixes[s.index] for s in sentences]
        return Prepared([s.request.sources[s.index] for s in sentences],
                        np.array([s.request.caps[s.index] for s in sentences], dtype=np.int64), first.search,
                        truncated=truncated, seeds=seeds, prefixes=prefixes)


@dataclass(frozen=True, slots=True)
class Sentence:
    """One sentence of a prepared request, by reference: what a batcher's item carries (:meth:`Prepared.sentences`);
    :meth:`Prepared.gather` copies a batch of them into one :class:`Prepared` once, when it runs."""

    request: Prepared
    index: int

    @property
    def length(self) -> int:
        """Its source tokens, EOS included (a batcher's cost)."""
        return len(self.request.sources[self.index])


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


def fit_sources(sources: list[list[int]], limit: int, truncate: bool) -> tuple[list[list[int]], tuple[bool, ...]]:
    """The over-long policy, in one place: sources (EOS last) within the model's ``limit`` of positions.

    Arguments:
        sources: each sentence's source ids, EOS appended.
        limit: the model's positions (``ModelInfo.max_input_tokens``).
        truncate: False refuses an over-long source (:func:`check_lengths`); True keeps its first ``limit - 1`` ids
            and its EOS.

    Returns:
        The sources and each one's flag, whether it was cut (empty when none was).

    Raises:
        InputTooLong: without ``truncate``, for the first source that is too long.
    """
    lengths = [len(source) for source in sources]
    if not truncate:
        check_lengths(lengths, limit)
        return sources, ()
    cut = tuple(length > limit for length in lengths)
    if not any(cut):
        return sources, ()
    return [[*s[: limit - 1], s[-1]] if c else s for s, c in zip(sources, cut, strict=True)], cut


class Engine(Protocol):
    """What every caller needs from a translation engine (``serving.engine.translator.Translator``, ``tests.fakes``)."""

    info: ModelInfo

    def prepare(self, texts: Sequence[str], options: DecodeOptions | None = None,
                target_prefix: Sequence[str] | None = None) -> Prepared:
        """Tokenize ``texts`` (EOS appended), check their lengths and resolve ``options``; ``target_prefix``: the
        start each translation is forced to (one per text; "" for none), or None.

        Raises:
            InputTooLong: a text has more tokens than the model has positions.
            InvalidInput: not one target prefix per text, or one as long as the translation may be.
        """
        ...

    def prepare_ids(self, ids: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                    target_prefix: Sequence[str] | None = None) -> Prepared:
        """:meth:`prepare` for sentences already tokenized with the package's source vocabulary (without EOS);
        ``target_prefix`` as :meth:`prepare` takes it.

        Raises:
            InvalidInput: an id outside the source vocabulary, or a target prefix :meth:`prepare` refuses.
            InputTooLong: a sentence has more tokens than the model has positions.
        """
        ...

    def run(self, prepared: Prepared, on_partial: OnPartial | None = None, alive: Alive | None = None
            ) -> list[Translation]:
        """Decode and detokenize prepared sentences: one translation each, in order. ``alive(indexes)``, when given,
        is polled between decoder steps with the sentences still decoding (``serving.engine.decoding.Alive``): those
        no longer wanted stop decoding and get an empty translation.

        Raises:
            InferenceFailed: the runtime failed.
        """
        ...

    def translate(
        self, texts: Sequence[str], options: DecodeOptions | None = None, on_partial: OnPartial | None = None
    ) -> list[Translation]:
        """``run(prepare(texts, options), on_partial)``."""
        ...

    def score(self, sources: Sequence[str], targets: Sequence[str], *, truncate: bool = False
              ) -> list[ReferenceScore]:
        """The model's log-likelihood of each target given its source (reference scoring), in order. ``truncate``:
        an over-long source is cut as :func:`fit_sources` cuts it for translation (a target never is).

        Raises:
            InvalidInput: not as many targets as sources, or a text that is not valid Unicode (named).
            InputTooLong: a target, or without ``truncate`` a source, with more tokens than the model has positions.
            InferenceFailed: the runtime failed.
        """
        ...

    def score_ids(self, ids: Sequence[Sequence[int]], targets: Sequence[str], *, truncate: bool = False
                  ) -> list[ReferenceScore]:
        """:meth:`score` for sources already tokenized with the package's source vocabulary (without EOS).

        Raises:
            InvalidInput: not as many targets as sources, an id outside the source vocabulary, a bad target text.
            InputTooLong: a source or target with more tokens than the model has positions.
            InferenceFailed: the runtime failed.
        """
        ...
