"""Fakes shared by unit tests of one layer.

``EchoTranslator`` implements the engine protocol (``serving.engine.request.Engine``: ``info``, ``prepare``,
``prepare_ids``, ``run``, ``translate``, ``score``, ``score_ids``) without a model: a sentence's translation is its words reversed and upper-cased, one "token" per word,
so tests can predict every answer. Like the real engine, ``prepare`` turns words into ids (a vocabulary that grows as
it meets new words) and checks (or, with ``truncate``, cuts) the lengths with the engine's own check, and ``run`` sees
ids only. It can be slowed
down (``step_delay``) to make batching, overload, deadlines and streaming observable, and it records every batch it
ran (as the texts its ids stand for).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from serving.engine.decoding import Alive, SearchOptions
from serving.engine.errors import InvalidInput
from serving.engine.request import (
    DecodeOptions,
    Engine,
    ModelInfo,
    OnPartial,
    Prepared,
    ReferenceScore,
    Translation,
    check_lengths,
    fit_sources,
)
from serving.engine.tokenizers import Tokenizer
from serving.package import DecodingDefaults

EOS = 0
VOCAB_SIZE = 1 << 20  # the echo's vocabulary grows as it meets new words: no fixed size


def echo_info(name: str = "echo", max_input_tokens: int = 64) -> ModelInfo:
    """The ``ModelInfo`` EchoTranslator reports: a greedy model of ``max_input_tokens`` positions."""
    return ModelInfo(name=name, version="1", runtime="fake", precision="fp32", source_framework="echo",
                     max_input_tokens=max_input_tokens, decoding=DecodingDefaults(beam_size=1,
                                                                                  max_length=max_input_tokens),
                     source_vocab_size=VOCAB_SIZE, target_vocab_size=VOCAB_SIZE, source_language="en")


def echo(text: str) -> str:
    """What EchoTranslator answers for ``text``."""
    return " ".join(reversed(text.split())).upper()


class EchoTranslator:
    """An engine fake; see the module docstring.

    Arguments:
        name: the model name reported in ``info``.
        step_delay: seconds slept per decoding step (one step per output word).
        max_input_tokens: the fake model's position limit (tokens = words + 1 for EOS).
        fail_on: a word that makes ``run`` raise RuntimeError (tests engine failures).
    """

    def __init__(
        self,
        name: str = "echo",
        *,
        step_delay: float = 0.0,
        max_input_tokens: int = 64,
        fail_on: str | None = None,
    ) -> None:
        self.info = echo_info(name, max_input_tokens)
        self.step_delay = step_delay
        self.fail_on = fail_on
        self.batches: list[list[str]] = []
        self.options: list[SearchOptions] = []  # each batch's search options
        self.threads: set[str] = set()
        self._lock = threading.Lock()
        self._words = ["</s>"]  # id -> word; id 0 is EOS
        self._ids: dict[str, int] = {}

    def prepare(self, texts: Sequence[str], options: DecodeOptions | None = None,
                target_prefix: Sequence[str] | None = None) -> Prepared:
        options = options or DecodeOptions()  # target_prefix: the echo ignores it
        with self._lock:
            sources = [[*(self._id(word) for word in text.split()), EOS] for text in texts]
        sources, truncated = fit_sources(sources, self.info.max_input_tokens, options.truncate)
        cap = self.info.max_input_tokens if options.max_length is None else options.max_length + 1
        search = SearchOptions(eos_id=EOS, decoder_start_id=EOS, beam_size=options.beam_size or 1,
                               forced_eos=options.max_length is not None)
        return Prepared(sources, np.full(len(sources), cap, dtype=np.int64), search, truncated)

    def prepare_ids(self, ids: Sequence[Sequence[int]], options: DecodeOptions | None = None,
                    target_prefix: Sequence[str] | None = None) -> Prepared:
        with self._lock:
            texts = [" ".join(self._words[i] for i in sentence) for sentence in ids]
        return self.prepare(texts, options, target_prefix)

    def run(self, prepared: Prepared, on_partial: OnPartial | None = None, alive: Alive | None = None
            ) -> list[Translation]:
        with self._lock:
            texts = [" ".join(self._words[i] for i in source[:-1]) for source in prepared.sources]
            self.batches.append(texts)
            self.options.append(prepared.search)
            self.threads.add(threading.current_thread().name)
        if self.fail_on is not None and any(self.fail_on in t.split() for t in texts):
            raise RuntimeError(f"fake runtime failure on {self.fail_on!r}")
        targets = [echo(t).split()[: int(cap) - 1] for t, cap in zip(texts, prepared.caps, strict=True)]
        for step in range(max((len(w) for w in targets), default=0)):
            decoding = np.array([i for i, words in enumerate(targets) if step < len(words)], dtype=np.int64)
            if alive is not None and decoding.size:  # the ones no longer wanted stop here
                for i in decoding[~np.asarray(alive(decoding), dtype=bool)].tolist():
                    targets[i] = targets[i][:step]
            if self.step_delay:
                time.sleep(self.step_delay)
            if on_partial is not None:
                for i, words in enumerate(targets):
                    if step < len(words):  # a delta (OnPartial): the next word
                        on_partial(i, (" " if step else "") + words[step])
        return prepared.mark([
            Translation(
                text=" ".join(words),
                input_tokens=len(source),
                output_tokens=len(words),
                score=-0.5 * len(words),
                token_ids=list(range(len(words))),
            )
            for words, source in zip(targets, prepared.sources, strict=True)
        ])

    def translate(
        self, texts: Sequence[str], options: DecodeOptions | None = None, on_partial: OnPartial | None = None
    ) -> list[Translation]:
        return self.run(self.prepare(texts, options), on_partial)

    def score(self, sources: Sequence[str], targets: Sequence[str], *, truncate: bool = False
              ) -> list[ReferenceScore]:
        """Each target word scores -1 where it is the echo's word at that place, else -2; EOS scores -0.5
        (``truncate``: an over-long source is not refused; the echo is of the whole source)."""
        if len(sources) != len(targets):
            raise InvalidInput(f"{len(sources)} sources and {len(targets)} targets")
        if self.fail_on is not None and any(self.fail_on in t.split() for t in [*sources, *targets]):
            raise RuntimeError(f"fake runtime failure on {self.fail_on!r}")
        if self.step_delay:
            time.sleep(self.step_delay * max(len(t.split()) + 1 for t in targets))
        for side, texts in (("source", [] if truncate else sources), ("target", targets)):
            check_lengths([len(t.split()) + 1 for t in texts], self.info.max_input_tokens, f"{side}[{{index}}]")
        with self._lock:
            self.threads.add(threading.current_thread().name)
            scored = [(echo(s).split(), [self._id(w) for w in t.split()], t.split()) for s, t in zip(sources, targets,
                                                                                                    strict=True)]
        return [ReferenceScore.of([*ids, EOS], [-1.0 if i < len(expected) and w == expected[i] else -2.0
                                                for i, w in enumerate(words)] + [-0.5])
                for expected, ids, words in scored]

    def score_ids(self, ids: Sequence[Sequence[int]], targets: Sequence[str], *, truncate: bool = False
                  ) -> list[ReferenceScore]:
        with self._lock:
            sources = [" ".join(self._words[i] for i in sentence) for sentence in ids]
        return self.score(sources, targets, truncate=truncate)

    @property
    def batch_sizes(self) -> list[int]:
        return [len(b) for b in self.batches]

    def _id(self, word: str) -> int:
        if word not in self._ids:
            self._ids[word] = len(self._words)
            self._words.append(word)
        return self._ids[word]


def as_engine(fake: EchoTranslator) -> Engine:
    """``fake`` as the engine protocol: mypy (tests/fakes.py is in its ``files``) checks here that the fake meets it."""
    return fake


class CountingTokenizer:
    """A package's tokenizer, counting ``encode`` calls (one per source sentence tokenized)."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.calls = 0
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        with self._lock:
            self.calls += 1
        return self.inner.encode(text)

    def encode_target(self, text: str) -> list[int]:
        return self.inner.encode_target(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)
