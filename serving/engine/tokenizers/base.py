"""The ``Tokenizer`` protocol every tokenizer of a model package satisfies, and the one check of what text it takes."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from serving.engine.errors import InvalidInput
from serving.engine.tokenizers.stream import TextStream, open_stream

# A lone surrogate: what a JSON "\ud800" escape, or an undecodable byte read with errors="surrogateescape" (Python's
# stdin and argv), turns into. It is not a character: it has no UTF-8 form, so no tokenizer can take it.
_SURROGATE = re.compile("[\ud800-\udfff]")


class InvalidText(InvalidInput):
    """A text that is not valid Unicode (HTTP 400); the message says what and where, not which text of a request
    (the caller that knows the index adds it).

    Attributes:
        text: the offending text (callers find its index with it).
        reason: the message without a subject, e.g. ``holds a lone surrogate U+D800 at character 2 ...``.
    """

    code = "invalid_text"

    def __init__(self, reason: str, *, text: str, subject: str = "text") -> None:
        super().__init__(f"{subject} {reason}")
        self.text = text
        self.reason = reason

    def about(self, subject: str) -> InvalidText:
        """The same error, naming its text as ``subject`` (e.g. ``text[3]``, ``line 12``)."""
        return InvalidText(self.reason, text=self.text, subject=subject)


def check_text(text: str) -> None:
    """Refuse a text no tokenizer can encode (every tokenizer calls this first).

    Raises:
        InvalidText: the text holds a lone surrogate.
    """
    match = _SURROGATE.search(text)
    if match is None:
        return
    code = ord(match.group())
    # surrogateescape (stdin, argv) turns an undecodable byte into U+DC80..U+DCFF
    byte = f", what an undecodable byte 0x{code - 0xDC00:02x} becomes" if 0xDC80 <= code <= 0xDCFF else ""
    raise InvalidText(
        f"holds a lone surrogate U+{code:04X} at character {match.start()}{byte}; text must be valid Unicode",
        text=text,
    )


class UnicodeChecked:
    """A tokenizer that refuses text that is not valid Unicode (:func:`check_text`) before encoding it.

    ``load_tokenizer`` wraps the T2T subword encoder in it: ``SubwordTextEncoder`` itself stays T2T-exact (it
    escapes a lone surrogate as ``\\55296;``, which tests use to make such T2T records), while the engine's
    tokenizer refuses the text like every other one. SentencePiece, which cannot take such text at all, checks it
    itself.
    """

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner

    def encode(self, text: str) -> list[int]:
        check_text(text)
        return self.inner.encode(text)

    def encode_target(self, text: str) -> list[int]:
        check_text(text)
        return self.inner.encode_target(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)

    def stream(self) -> TextStream:
        return open_stream(self.inner)


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids for one model.

    ``encode`` returns the source ids *without* EOS (the engine appends the package's EOS id); ``encode_target``
    the same for target text (reference scoring: the target side's model and vocabulary); ``decode`` turns
    target ids back into text, skipping special tokens. The engine cuts a hypothesis at its first EOS before decoding.
    A tokenizer may also have ``stream()``, a ``TextStream`` that decodes one sentence incrementally (streaming:
    ``serving.engine.tokenizers.stream``).
    The tokenizers ``load_tokenizer`` returns raise :class:`InvalidText` (:func:`check_text`) from both encodes for text
    that is not valid Unicode.
    """

    def encode(self, text: str) -> list[int]:
        """Source text to ids, without EOS."""
        ...

    def encode_target(self, text: str) -> list[int]:
        """Target text to ids, without EOS (as the model was trained to produce them)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids to text."""
        ...
