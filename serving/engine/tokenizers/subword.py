"""tensor2tensor's ``SubwordTextEncoder``, reimplemented in pure Python for serving.

Reproduces ``tensor2tensor/data_generators/text_encoder.py`` (``SubwordTextEncoder``, ``_escape_token``,
``_unescape_token``) and ``tokenizer.py`` (``encode``, ``decode``) exactly, without TensorFlow:

1. Word tokenizer: split the text at every boundary between alphanumeric characters (Unicode category L* or N*)
   and the rest; drop a token that is exactly one space unless it is the first or the last token.
2. Escape each token: ``\\`` -> ``\\\\``, ``_`` -> ``\\u``, characters outside the vocabulary's alphabet (and ``\\n``)
   -> ``\\<decimal code point>;``, then append ``_`` (the end-of-word marker).
3. Segment greedily left to right, longest subtoken in the vocabulary first.

Decoding concatenates the subtoken strings, splits at ``_``, unescapes each piece and joins the words, with one space
between two words that both start with an alphanumeric character. ``stream()`` does the same as the ids come
(:class:`SubwordStream`, for streaming).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

PAD_ID = 0
EOS_ID = 1

# Always in the alphabet, whatever the vocabulary holds: the characters escaping produces.
_ESCAPE_CHARS = frozenset("\\_u;0123456789")
# Runs of alphanumeric / non-alphanumeric characters. Python's str.isalnum() (which ``[^\W_]`` matches) is true
# exactly for the Unicode categories L* and N* that T2T tests with unicodedata; tests/serving/engine/test_subword.py checks
# this equivalence over every code point of the running interpreter.
_WORD_RUNS = re.compile(r"[^\W_]+|[\W_]+")
_UNESCAPE = re.compile(r"\\u|\\\\|\\([0-9]+);")
# Undefined-character marker T2T substitutes for an invalid ``\\123;`` escape.
_INVALID_CHAR = "\u3013"
_CACHE_LIMIT = 1 << 18


def _is_alnum(char: str) -> bool:
    return char.isalnum()


def split_words(text: str) -> list[str]:
    """T2T's word tokenizer (``tokenizer.encode``): alternating alphanumeric / other runs, single spaces dropped."""
    runs = _WORD_RUNS.findall(text)
    last = len(runs) - 1
    return [run for i, run in enumerate(runs) if run != " " or i == 0 or i == last]


def join_words(words: Sequence[str]) -> str:
    """T2T's ``tokenizer.decode``: one space between two consecutive words that both start alphanumeric."""
    parts: list[str] = []
    previous_alnum = False
    for i, word in enumerate(words):
        alnum = _is_alnum(word[0])
        if i > 0 and previous_alnum and alnum:
            parts.append(" ")
        parts.append(word)
        previous_alnum = alnum
    return "".join(parts)


def _unescape_match(match: re.Match[str]) -> str:
    code = match.group(1)
    if code is None:
        return "_" if match.group(0) == "\\u" else "\\"
    try:
        return chr(int(code))
    except (ValueError, OverflowError):
        return _INVALID_CHAR


def unescape_token(escaped: str) -> str:
    """Inverse of the escaping (``_unescape_token``): drop the final ``_`` and undo ``\\u``, ``\\\\``, ``\\123;``."""
    trimmed = escaped[:-1] if escaped.endswith("_") else escaped
    return _UNESCAPE.sub(_unescape_match, trimmed)


class SubwordTextEncoder:
    """T2T subword tokenizer over a ``.subwords`` vocabulary (id = 0-based line number).

    Satisfies the serving ``Tokenizer`` protocol: :meth:`encode` returns ids without EOS, :meth:`decode` turns ids
    back into text. Segmentations are cached per word, so repeated words cost one dict lookup.

    Args:
        vocab_file: a ``.subwords`` file: UTF-8, one subtoken per line, optionally wrapped in single or double quotes.

    Raises:
        OSError: the file cannot be read.
        ValueError: the file is not UTF-8 or holds no subtoken.
    """

    def __init__(self, vocab_file: str | os.PathLike[str]) -> None:
        path = Path(vocab_file)
        try:
            # newline="\n": split on LF only, as tf.gfile does; a quoted subtoken may contain a CR.
            with path.open(encoding="utf-8", newline="\n") as f:
                lines = list(f)
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not a UTF-8 subword vocabulary ({e})") from e
        self._init_subtokens([_parse_line(line) for line in lines], source=str(path))

    def _init_subtokens(self, subtokens: list[str], source: str) -> None:
        if not any(subtokens):
            raise ValueError(f"{source}: empty subword vocabulary")
        self._subtokens = subtokens
        # Later duplicates win, as in T2T's dict comprehension; empty strings get no entry.
        self._ids = {s: i for i, s in enumerate(subtokens) if s}
        self._max_len = max(len(s) for s in subtokens)
        self._alphabet = frozenset(c for s in subtokens for c in s) | _ESCAPE_CHARS
        self._cache: dict[str, list[int]] = {}
        logger.debug("loaded %d subtokens from %s", len(subtokens), source)

    @property
    def vocab_size(self) -> int:
        """Number of ids (lines of the vocabulary file)."""
        return len(self._subtokens)

    @property
    def subtokens(self) -> tuple[str, ...]:
        """The subtoken string of every id."""
        return tuple(self._subtokens)

    def encode(self, text: str) -> list[int]:
        """Text to subtoken ids, without EOS (T2T appends EOS itself). Like T2T, a lone surrogate is escaped
        (``\\55296;``); the tokenizer a package loads refuses such text first (``base.UnicodeChecked``)."""
        ids: list[int] = []
        cache = self._cache
        for word in split_words(text):
            word_ids = cache.get(word)
            if word_ids is None:
                word_ids = self._segment(self.escape(word))
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[word] = word_ids
            ids.extend(word_ids)
        return ids

    def encode_target(self, text: str) -> list[int]:
        """Target text to ids, without EOS: T2T models share one vocabulary between both sides."""
        return self.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Subtoken ids to text. Ids outside the vocabulary decode to nothing; callers cut at EOS beforehand."""
        subtokens = self._subtokens
        size = len(subtokens)
        concatenated = "".join([subtokens[i] if 0 <= i < size else "" for i in map(int, ids)])
        # Each piece is a whole escaped word without its "_" marker; only pieces with a backslash need unescaping.
        words = [_UNESCAPE.sub(_unescape_match, p) if "\\" in p else p for p in concatenated.split("_") if p]
        return join_words([w for w in words if w])

    def stream(self) -> SubwordStream:
        """One sentence's :meth:`decode`, incrementally (``serving.engine.tokenizers.stream.TextStream``)."""
        return SubwordStream(self._subtokens)

    def escape(self, word: str) -> str:
        """``_escape_token``: escape backslash, underscore and characters outside the alphabet; append ``_``."""
        word = word.replace("\\", "\\\\").replace("_", "\\u")
        alphabet = self._alphabet
        if "\n" not in word and alphabet.issuperset(word):
            return word + "_"
        return "".join(c if c in alphabet and c != "\n" else f"\\{ord(c)};" for c in word) + "_"

    def _segment(self, escaped: str) -> list[int]:
        ids = self._ids
        out: list[int] = []
        start, length = 0, len(escaped)
        while start < length:
            for end in range(min(length, start + self._max_len), start, -1):
                subtoken_id = ids.get(escaped[start:end])
                if subtoken_id is not None:
                    out.append(subtoken_id)
                    start = end
                    break
            else:
                # Only possible when a character of the alphabet has no single-character subtoken (a vocabulary
                # not built by T2T). T2T asserts here; skipping the character keeps serving alive.
                logger.warning("subword vocabulary cannot encode %r; skipped", escaped[start])
                start += 1
        return out


class SubwordStream:
    """One sentence's text as its subtoken ids come (``SubwordTextEncoder.decode``, incrementally): a word is final
    up to its first backslash (an escape such as ``\\123;`` may still be cut short) as soon as it is spelled, and
    whole once its ``_`` comes; the space before a word depends only on its first character and the previous word's.
    """

    def __init__(self, subtokens: list[str]) -> None:
        self._subtokens = subtokens
        self._word = ""  # the escaped word being spelled (no "_" yet)
        self._emitted = 0  # characters of it already emitted (all before its first backslash)
        self._previous_alnum: bool | None = None  # whether the last word started alphanumeric (None: no word yet)

    def add(self, ids: Sequence[int]) -> str:
        subtokens, size = self._subtokens, len(self._subtokens)
        text = "".join([subtokens[i] if 0 <= i < size else "" for i in map(int, ids)])
        *done, self._word = (self._word + text).split("_")
        parts = [self._whole(word) for word in done]
        word = self._word
        stable = len(word) if "\\" not in word else word.index("\\")
        if stable > self._emitted:
            parts.append((self._start(word[0]) if not self._emitted else "") + word[self._emitted : stable])
            self._emitted = stable
        return "".join(parts)

    def finish(self) -> str:
        word, self._word = self._word, ""
        return self._whole(word)

    def _whole(self, word: str) -> str:
        """The rest of a complete escaped word (nothing for an empty one, as ``decode`` skips it)."""
        if not word:
            return ""
        text = _UNESCAPE.sub(_unescape_match, word) if "\\" in word else word
        emitted, self._emitted = self._emitted, 0
        out = (self._start(text[0]) if not emitted else "") + text[emitted:]
        self._previous_alnum = _is_alnum(text[0])
        return out

    def _start(self, first: str) -> str:
        """The separator before a word starting with ``first`` (``join_words``), when its first text is emitted."""
        return " " if self._previous_alnum and _is_alnum(first) else ""


def _parse_line(line: str) -> str:
    s = line.rstrip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    if s in ("'", '"'):
        # T2T: startswith("'") and endswith("'") is also true for a lone quote, which becomes "".
        return ""
    return s
