"""fairseq's BPE as transformers' ``FSMTTokenizer`` applies it: Moses pre-tokenization + BPE, without torch.

For FSMT packages (transformers' ``FSMTForConditionalGeneration``, the fairseq WMT19 family) and fairseq checkpoints
(their dictionaries and BPE codes rewritten in FSMT's form by ``converters/fairseq.py``). Files:

- ``vocab-src.json`` / ``vocab-tgt.json``: token -> id. A token that ends a word carries ``</w>`` (``"the</w>"``),
  one inside a word does not (``"th"``): fairseq's ``the`` / ``th@@`` with the ``@@`` marker turned around.
- ``merges.txt``: one merge per line, ``first second`` (a count after them is ignored), best first.

Encoding (``FSMTTokenizer.tokenize`` + ``convert_tokens_to_ids``):

1. The text is split at the special tokens (``<s>``, ``<pad>``, ``</s>``, ``<unk>``), each becoming its own id.
2. Each other chunk: lowercased when the model says so; Moses preprocessing (replace-unicode-punctuation and
   the punctuation normalizer: sacremoses' ``MosesPunctNormalizer(pre_replace_unicode_punct=True)``;
   remove-non-printing-char); ``MosesTokenizer(lang).tokenize(aggressive_dash_splits=True, escape=True)``.
3. Each Moses token: BPE (split into characters, ``</w>`` glued to the last one, then repeatedly merge the adjacent
   pair with the best rank); each piece -> its id, unknown pieces -> ``<unk>``.

Target text (``encode_target``, reference scoring): the same stages with the target language's Moses and
``vocab-tgt.json``, as fairseq prepares its targets. (transformers' ``FSMTTokenizer`` has no target mode: it
tokenizes ``text_target=`` like a source; ``FSMTTokenizer`` built with the target vocabulary and languages swapped is
what this equals.)

Decoding (``decode(ids, skip_special_tokens=True)``): special ids dropped, ids -> target tokens, glued
(``</w>`` -> space), split into words and ``MosesDetokenizer(target lang)``-ed. ``stream()`` does the same one id at a
time, for streaming (``serving.engine.tokenizers.moses_stream``).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.engine.tokenizers.base import check_text
from serving.engine.tokenizers.moses_stream import FsmtStream

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")
UNK_TOKEN = "<unk>"
END_OF_WORD = "</w>"
_CACHE_LIMIT = 1 << 18

# transformers' clean_up_tokenization, in its order.
_CLEAN_UP: tuple[tuple[str, str], ...] = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"),
    (" 've", "'ve"), (" 're", "'re"),
)


def remove_non_printing_char(text: str) -> str:
    """Moses' remove-non-printing-char.perl: drop every character of a Unicode category C*.

    As transformers' ``FSMTTokenizer`` does, by Python's own Unicode tables; sacremoses' ``remove_control_chars``
    (``MosesPunctNormalizer(post_remove_control_chars=True)``) asks the ``regex`` module's, whose newer Unicode
    version keeps the thousands of characters Python's older tables count as unassigned (Cn): FSMT's parity
    would break on them.
    """
    return "".join(c for c in text if not unicodedata.category(c).startswith("C"))


class FsmtBpeTokenizer:
    """FSMT's tokenizer: Moses pre-tokenization + BPE over ``vocab-src.json`` / ``vocab-tgt.json`` / ``merges.txt``.

    Args:
        source_vocab: vocab-src.json (token -> id), for encoding.
        target_vocab: vocab-tgt.json, for decoding.
        merges: merges.txt.
        source_lang, target_lang: Moses language codes (``en``, ``de``...).
        do_lower_case: lowercase the source first.
        clean_up_tokenization_spaces: after detokenizing, remove the spaces transformers' ``clean_up_tokenization``
            removes (before ``.``, ``,``, ``!``, ``?`` and English contractions); off unless tokenizer_config.json
            turns it on.

    Raises:
        ValueError: a file is unreadable or malformed, the source vocabulary has no ``<unk>``, or sacremoses is
            missing.
    """

    def __init__(self, source_vocab: Path, target_vocab: Path, merges: Path, source_lang: str, target_lang: str,
                 do_lower_case: bool = False, clean_up_tokenization_spaces: bool = False) -> None:
        try:
            import sacremoses
        except ImportError:
            raise ValueError("the fsmt_bpe tokenizer needs sacremoses: pip install sacremoses") from None
        self._encoder = _load_vocab(source_vocab)
        if UNK_TOKEN not in self._encoder:
            raise ValueError(f"{source_vocab}: the vocabulary has no {UNK_TOKEN!r} entry")
        self._unk = self._encoder[UNK_TOKEN]
        self._target_encoder = _load_vocab(target_vocab)
        self._target_unk = self._target_encoder.get(UNK_TOKEN, self._unk)
        self._decoder = {i: token for token, i in self._target_encoder.items()}
        self._ranks = _load_merges(merges)
        self._lower = do_lower_case
        self._clean_up = clean_up_tokenization_spaces
        self._target_lang = target_lang
        # Moses' replace-unicode-punctuation.perl first, as FSMTTokenizer applies it before the punctuation normalizer
        self._moses = _Moses(sacremoses.MosesPunctNormalizer(lang=source_lang, pre_replace_unicode_punct=True),
                             sacremoses.MosesTokenizer(lang=source_lang))
        self._target_moses = _Moses(sacremoses.MosesPunctNormalizer(lang=target_lang, pre_replace_unicode_punct=True),
                                    sacremoses.MosesTokenizer(lang=target_lang))
        self._detokenizer = sacremoses.MosesDetokenizer(lang=target_lang)
        specials = [t for t in SPECIAL_TOKENS if t in self._encoder]
        # transformers looks the special ids up in the source vocabulary, for decoding too.
        self._special_ids = frozenset(self._encoder[t] for t in specials)
        self._special_split = re.compile("(" + "|".join(map(re.escape, specials)) + ")")
        self._cache: dict[str, list[str]] = {}

    @property
    def vocab_size(self) -> int:
        """Entries in the source vocabulary."""
        return len(self._encoder)

    def encode(self, text: str) -> list[int]:
        """Source text to ids, without EOS (``FSMTTokenizer(text).input_ids[:-1]``).

        Raises:
            InvalidText: the text is not valid Unicode (a lone surrogate).
        """
        return self._encode(text, self._moses, self._encoder, self._unk)

    def encode_target(self, text: str) -> list[int]:
        """Target text to ids, without EOS: target-language Moses, BPE, ``vocab-tgt.json`` (module docstring).

        Raises:
            InvalidText: the text is not valid Unicode (a lone surrogate).
        """
        return self._encode(text, self._target_moses, self._target_encoder, self._target_unk)

    def _encode(self, text: str, moses: _Moses, vocab: dict[str, int], unk: int) -> list[int]:
        check_text(text)
        ids: list[int] = []
        for i, chunk in enumerate(self._special_split.split(text)):
            if i % 2:  # re.split puts the separators (the special tokens) at odd positions
                ids.append(vocab.get(chunk, unk))
            elif chunk.strip():
                ids.extend(vocab.get(piece, unk) for piece in self.pieces(chunk, moses))
        return ids

    def pieces(self, text: str, moses: _Moses | None = None) -> list[str]:
        """The BPE pieces of a chunk of text without special tokens (``FSMTTokenizer._tokenize``), through the
        source language's Moses unless ``moses`` is given."""
        moses = moses or self._moses
        if self._lower:
            text = text.lower()
        text = remove_non_printing_char(moses.normalizer.normalize(text))
        words: list[str] = moses.tokenizer.tokenize(text, aggressive_dash_splits=True, return_str=False, escape=True)
        out: list[str] = []
        for word in words:
            if word:
                out.extend(self.bpe(word))
        return out

    def bpe(self, word: str) -> list[str]:
        """One Moses token as BPE pieces, the last one ending in ``</w>``."""
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = [*word[:-1], word[-1] + END_OF_WORD]
        ranks = self._ranks
        while len(symbols) > 1:
            best, best_rank = None, None
            for pair in zip(symbols, symbols[1:], strict=False):
                rank = ranks.get(pair)
                if rank is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = pair, rank
            if best is None:
                break
            merged: list[str] = []
            i = 0
            while i < len(symbols):
                if i < len(symbols) - 1 and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[word] = symbols
        return symbols

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids to text, special tokens skipped (``FSMTTokenizer.decode(ids, skip_special_tokens=True)``)."""
        special = self._special_ids
        tokens = [self._decoder.get(i, UNK_TOKEN) for i in map(int, ids) if i not in special]
        tokens = [t for t in tokens if t not in SPECIAL_TOKENS]
        words = "".join(t.replace(" ", "").replace(END_OF_WORD, " ") for t in tokens).split()
        if not words:
            return ""
        text: str = self._detokenizer.detokenize(words)
        if self._clean_up:
            for old, new in _CLEAN_UP:
                text = text.replace(old, new)
        return text

    def stream(self) -> FsmtStream:
        """One sentence's :meth:`decode`, incrementally (``serving.engine.tokenizers.stream.TextStream``)."""
        return FsmtStream(self._text_of, self._detokenizer, _CLEAN_UP if self._clean_up else None, self.decode)

    def _text_of(self, token: int) -> str | None:
        """What ``token`` adds to :meth:`decode`'s joined pieces (``</w>`` as a space), or None where it skips it."""
        if token in self._special_ids:
            return None
        piece = self._decoder.get(token, UNK_TOKEN)
        return None if piece in SPECIAL_TOKENS else piece.replace(" ", "").replace(END_OF_WORD, " ")


@dataclass(frozen=True)
class _Moses:
    """One language's Moses preprocessing: the punctuation normalizer and the tokenizer."""

    normalizer: Any
    tokenizer: Any


def _load_vocab(path: Path) -> dict[str, int]:
    data = _load_json(path)
    if not isinstance(data, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in data.values()):
        raise ValueError(f"{path}: the vocabulary must be a JSON object mapping tokens to integer ids")
    return {str(k): int(v) for k, v in data.items()}


def _load_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable vocabulary ({e})") from e


def _load_merges(path: Path) -> dict[tuple[str, str], int]:
    """merges.txt as (first, second) -> rank; as transformers reads it, the last line (after the final newline)
    is dropped and a pair seen twice keeps its later rank."""
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")[:-1]
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: unreadable merges ({e})") from e
    ranks: dict[tuple[str, str], int] = {}
    for rank, line in enumerate(lines):
        parts = line.split()
        if len(parts) >= 2:
            ranks[(parts[0], parts[1])] = rank
    return ranks
