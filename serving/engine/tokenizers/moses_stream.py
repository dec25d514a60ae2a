"""Incremental detokenization for the FSMT tokenizer (``serving.engine.tokenizers.stream``).

``FsmtBpeTokenizer.decode`` glues BPE pieces into words (``</w>`` ends one), detokenizes the words with sacremoses'
``MosesDetokenizer`` and, when the model says so, removes the spaces transformers' clean-up removes. A stream does the
same one piece at a time, holding back only what could still change:

1. Words: the word being spelled is held until a piece ends it.
2. Moses tokens: the detokenizer first joins ``X @-@ Y`` into ``X-Y`` (an ``@-@`` joins only if the word before it
   was not a joining ``@-@``), then unescapes ``&amp;``-style entities in each token; a token is held until the next
   word is known not to be a joining ``@-@`` (as soon as its first letters differ from ``@-@``).
3. Moses' left-to-right pass: each token adds itself, after a space unless the rules attach it to what precedes
   (punctuation, closing quotes by counting them, contractions, currency signs and opening brackets attach the
   next token, CJK runs). :class:`MosesPass` follows sacremoses 0.2's pass with its own state (the quote counts, the
   pending space, the previous token) and its patterns (the ``MosesDetokenizer`` attributes); the French contraction
   rule, which looks at the next token, decides the space before that token when it comes. Czech rules look at the
   sentence's last tokens (sacremoses reads ``tokens[-1]``): a Czech model's text comes at the end.
4. Clean-up (``clean_up_tokenization_spaces``): each replacement removes a space before a few characters, so text is
   emitted up to a space that none of them can remove.

``tests/serving/engine/test_text_streams.py`` checks the stream against ``decode`` on the fixtures, the demo's test
set and random piece sequences, in several languages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from sacremoses.util import is_cjk

from serving.engine.tokenizers.stream import StrippedText

HYPHEN = "@-@"
_FRENCH_PUNCT = re.compile(r"^[\?\!\:\;\\\%]$")
_ENDS_WITH_S = re.compile(r"[s]$")
_DOUBLE_QUOTES = re.compile(r"^[„“”]+$")
# Languages whose rules sacremoses applies with the sentence's last tokens (not streamable).
_WHOLE_TEXT_LANGUAGES = frozenset({"cs"})


class MosesPass:
    """sacremoses' ``MosesDetokenizer`` left-to-right pass, one (merged, unescaped) token at a time: :meth:`add`
    returns what the token adds to the text (the text's leading space is the caller's to strip)."""

    def __init__(self, detokenizer: Any) -> None:
        self._d = detokenizer
        self._lang = str(detokenizer.lang)
        self._count = 0
        self._previous = ""
        self._prepend = " "
        self._french = False  # the previous token was a French contraction: the next one decides the space
        self._quotes: dict[str, int] = {}

    def add(self, token: str) -> str:
        d, lang, i = self._d, self._lang, self._count
        prepend = self._prepend
        if self._french:
            prepend = "" if d.STARTS_WITH_ALPHA.search(token) else " "
            self._french = False
        if is_cjk(token[0]) and lang != "ko":
            out = token if i > 0 and is_cjk(self._previous[-1]) else prepend + token
            prepend = " "
        elif d.IS_CURRENCY_SYMBOL.search(token):
            out, prepend = prepend + token, ""
        elif d.IS_PUNCT.search(token):
            out = (" " if lang == "fr" and _FRENCH_PUNCT.search(token) else "") + token
            prepend = " "
        elif lang == "en" and i > 0 and d.IS_ENGLISH_CONTRACTION.search(token):
            out, prepend = token, " "
        elif lang in ("fr", "it", "ga") and d.IS_FRENCH_CONRTACTION.search(token):
            # Attached to the next token if that one starts with a letter; the text of this one is the same.
            out, prepend = prepend + token, " "
            self._french = True
        elif d.IS_OPEN_QUOTE.search(token):
            quote = '"' if _DOUBLE_QUOTES.search(token) else token
            count = self._quotes.get(quote, 0)
            if count % 2:  # a closing quote
                out, prepend = token, " "
                self._quotes[quote] = count + 1
            elif lang == "en" and token == "'" and i > 0 and _ENDS_WITH_S.search(self._previous):
                out, prepend = token, " "  # a possessive: "The Jones' house"
            else:  # an opening quote
                out, prepend = prepend + token, ""
                self._quotes[quote] = count + 1
        else:  # (sacremoses' Finnish case-suffix rule adds the same text)
            out, prepend = prepend + token, " "
        self._prepend = prepend
        self._previous = token
        self._count += 1
        return out


class CleanUp:
    """transformers' ``clean_up_tokenization`` replacements over text that arrives in pieces: applied to the text up
    to a space none of them can remove (each replacement removes a space before ``. ? ! , ' n``, and ``" ' "`` the
    one after its quote), the rest held."""

    def __init__(self, replacements: Sequence[tuple[str, str]]) -> None:
        self._replacements = replacements
        self._held = ""
        self._tail = ""  # the last two characters before the held text

    def add(self, text: str) -> str:
        held = self._held + text
        cut = held.rfind(" ")
        while cut > 0:
            if held[cut + 1 : cut + 2] not in ("", ".", "?", "!", ",", "'", "n") and (self._tail + held[:cut])[-2:] != " '":
                break
            cut = held.rfind(" ", 0, cut)
        if cut <= 0:
            self._held = held
            return ""
        self._held = held[cut:]
        self._tail = (self._tail + held[:cut])[-2:]
        return self.clean(held[:cut])

    def finish(self) -> str:
        held, self._held = self._held, ""
        return self.clean(held)

    def clean(self, text: str) -> str:
        for old, new in self._replacements:
            text = text.replace(old, new)
        return text


class FsmtStream:
    """One sentence's text (module docstring); built by ``FsmtBpeTokenizer.stream``.

    Arguments:
        text_of: an id's text in ``decode``'s joined pieces (``</w>`` as a space), or None where ``decode`` skips it.
        detokenizer: the target language's ``MosesDetokenizer``.
        clean_up: transformers' clean-up replacements, or None (off).
        decode: the one-shot decode (a language whose text comes at the end).
    """

    def __init__(self, text_of: Callable[[int], str | None], detokenizer: Any,
                 clean_up: Sequence[tuple[str, str]] | None, decode: Callable[[Sequence[int]], str]) -> None:
        self._text_of = text_of
        self._detokenizer = detokenizer
        self._moses = MosesPass(detokenizer)
        self._stripped = StrippedText()
        self._clean_up = None if clean_up is None else CleanUp(clean_up)
        self._word = ""  # the word being spelled
        self._token: str | None = None  # the Moses token being built (an @-@ may still join the next word to it)
        self._glue = False  # the last word was a joining @-@: the next word joins the token
        self._ids: list[int] | None = [] if str(detokenizer.lang) in _WHOLE_TEXT_LANGUAGES else None
        self._decode = decode

    def add(self, ids: Sequence[int]) -> str:
        if self._ids is not None:
            self._ids.extend(int(i) for i in ids)
            return ""
        text = "".join([t for t in map(self._text_of, map(int, ids)) if t is not None])
        joined = self._word + text
        words = joined.split()
        self._word = words.pop() if words and not joined[-1].isspace() else ""
        tokens: list[str] = []
        for word in words:
            self._add_word(word, tokens)
        if self._token is not None and not self._glue and self._word and not HYPHEN.startswith(self._word):
            tokens.append(self._token)  # the next word cannot be an @-@: the token is whole
            self._token = None
        return self._emit(tokens, final=False)

    def finish(self) -> str:
        if self._ids is not None:
            return self._decode(self._ids)
        tokens: list[str] = []
        if self._word:
            self._add_word(self._word, tokens)
            self._word = ""
        if self._token is not None:
            tokens.append(self._token)
            self._token = None
        return self._emit(tokens, final=True)

    def _add_word(self, word: str, tokens: list[str]) -> None:
        """One more word: it joins the token (after a joining @-@), joins it to the next one (a joining @-@), or
        completes the token and starts the next one."""
        if self._glue:
            self._token = (self._token or "") + word
            self._glue = False
        elif word == HYPHEN:  # the word before it was not a joining @-@ (else it would have been glued above)
            self._token = (self._token or "") + "-"
            self._glue = True
        else:
            if self._token is not None:
                tokens.append(self._token)
            self._token = word

    def _emit(self, tokens: list[str], *, final: bool) -> str:
        unescape, moses = self._detokenizer.unescape_xml, self._moses
        text = self._stripped.add("".join(moses.add(unescape(token)) for token in tokens))
        if self._clean_up is None:
            return text
        return self._clean_up.add(text) + (self._clean_up.finish() if final else "")
