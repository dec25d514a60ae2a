"""Streaming in the engine: the stable tokens a search reports (``serving.engine.decoding.OnTokens``) become text
deltas (``serving.engine.request.OnPartial``) through one incremental detokenizer per sentence
(``serving.engine.tokenizers.stream``), so that each step detokenizes only the new tokens and a sentence's deltas
concatenate to its final text. The ``Translator`` (one per request-level batch) and the ``ContinuousDecoder`` (one
per group of sentences) keep one :class:`PartialTexts` each.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from serving.engine.request import OnPartial
from serving.engine.tokenizers import TextStream, Tokenizer, open_stream


class _Sentence:
    """One sentence's detokenizer and the number of its tokens it has been given (None once it is done)."""

    __slots__ = ("stream", "fed")

    def __init__(self, stream: TextStream) -> None:
        self.stream = stream
        self.fed: int | None = 0


class PartialTexts:
    """The streamed text of some sentences, each under its index: :meth:`tokens` with what a search reports,
    :meth:`finish` with the sentence's result; each calls ``on_partial(index, delta)`` with the text that became
    final, if any.

    Arguments:
        tokenizer: the model's tokenizer (its ``stream()``).
        eos: the end-of-sentence id (a sentence's text ends before it).
        on_partial: the request's streaming callback.
    """

    def __init__(self, tokenizer: Tokenizer, eos: int, on_partial: OnPartial) -> None:
        self._tokenizer = tokenizer
        self._eos = eos
        self._on_partial = on_partial
        self._sentences: dict[int, _Sentence] = {}

    def tokens(self, index: int, tokens: np.ndarray, length: int) -> None:
        """Sentence ``index``'s output starts with ``tokens[:length]`` (a row of an ``OnTokens`` call)."""
        sentence = self._sentence(index)
        if sentence.fed is None or length <= sentence.fed:
            return
        new = tokens[sentence.fed : length].tolist()
        if self._eos in new:
            self._send(index, sentence, new[: new.index(self._eos)], done=True)
        else:
            self._send(index, sentence, new, done=False)
            sentence.fed = length

    def finish(self, index: int, token_ids: Sequence[int]) -> None:
        """Sentence ``index`` is done with the output ``token_ids`` (its translation's: no EOS): the rest of its text."""
        sentence = self._sentence(index)
        if sentence.fed is None:
            return
        self._send(index, sentence, list(token_ids[sentence.fed :]), done=True)

    def _sentence(self, index: int) -> _Sentence:
        sentence = self._sentences.get(index)
        if sentence is None:
            sentence = self._sentences[index] = _Sentence(open_stream(self._tokenizer))
        return sentence

    def _send(self, index: int, sentence: _Sentence, ids: list[int], *, done: bool) -> None:
        delta = sentence.stream.add(ids) if ids else ""
        if done:
            delta += sentence.stream.finish()
            sentence.fed = None
        if delta:
            self._on_partial(index, delta)
