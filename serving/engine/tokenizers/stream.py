"""Incremental detokenization for streaming: a :class:`TextStream` takes one sentence's target ids as they become
final and returns only the text that can no longer change, so that the concatenation of what it returns, once
:meth:`TextStream.finish` is called, is exactly the tokenizer's one-shot ``decode`` of all the ids.

Each step costs the new ids plus what is held back, never the whole prefix: each tokenizer holds back only the text
its ``decode`` could still change (``open_stream`` asks the tokenizer for its ``stream()``):

- SentencePiece (``sentencepiece_tokenizer``): trailing whitespace (``decode`` strips the text) and the bytes of a
  character not yet complete (byte-fallback pieces);
- FSMT (``moses_stream``): the word being spelled by BPE pieces, the Moses token that an ``@-@`` could still join,
  and the characters transformers' clean-up could still remove;
- T2T (``subword``): a word's escapes (``\\123;``) until the word is complete.

A tokenizer without ``stream()`` (a test's) gets :class:`WholeText`: the whole text at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from serving.engine.tokenizers.base import Tokenizer


@runtime_checkable
class TextStream(Protocol):
    """One sentence's text, as its ids become final."""

    def add(self, ids: Sequence[int]) -> str:
        """The next ids of the sentence (target ids, EOS cut off); returns the text that became final ("" if none)."""
        ...

    def finish(self) -> str:
        """No more ids: the rest of the text (what :meth:`add` returned and this concatenate to ``decode(ids)``)."""
        ...


class WholeText:
    """The stream of a tokenizer that cannot stream: all of the text at the end (``decode`` once)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []

    def add(self, ids: Sequence[int]) -> str:
        self._ids.extend(int(i) for i in ids)
        return ""

    def finish(self) -> str:
        return self._tokenizer.decode(self._ids)


class StrippedText:
    """Text whose final form is ``.strip()``-ed: leading whitespace is dropped, trailing whitespace held back until
    something other than whitespace follows it (or dropped at the end)."""

    def __init__(self) -> None:
        self._started = False
        self._held = ""

    def add(self, text: str) -> str:
        """Append raw text; returns what became final."""
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body) :]
        return body


def open_stream(tokenizer: Tokenizer) -> TextStream:
    """A :class:`TextStream` for one sentence decoded by ``tokenizer`` (its ``stream()``, else :class:`WholeText`)."""
    make = getattr(tokenizer, "stream", None)
    if callable(make):
        stream: TextStream = make()
        return stream
    return WholeText(tokenizer)
