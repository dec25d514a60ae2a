"""SentencePiece tokenizer for Marian / opus-mt packages, token-for-token what transformers' ``MarianTokenizer`` does.

``MarianTokenizer`` (transformers 4.57, ``models/marian/tokenization_marian.py`` on top of the slow
``PreTrainedTokenizer``) encodes in three stages, reproduced here:

1. Split the text at occurrences of the special tokens ``</s>``, ``<unk>``, ``<pad>`` (they are "added tokens" whose
   ``lstrip``/``rstrip`` are off, so the neighbouring text keeps its spaces); a special token becomes its own id.
2. In each remaining chunk, a leading language code ``>>xx<<`` becomes one piece, the rest goes through the *source*
   SentencePiece model as piece strings.
3. Pieces map to ids through ``vocab.json`` (shared by both sides), unknown pieces to the ``<unk>`` id. Note that a
   character the SentencePiece model does not know comes out as its surface string, not as ``<unk>``, and only maps
   to ``<unk>`` if vocab.json lacks it too -- which is why we look pieces up by string and never by SentencePiece id.

Target text (``encode_target``, what ``MarianTokenizer(text_target=...)`` does in its target mode) goes through the
same stages with the *target* SentencePiece model and, for separate vocabularies, ``target_vocab.json`` (its own
``<unk>`` for unknown pieces); the special tokens keep their ``vocab.json`` ids, as transformers' added tokens do.

Decoding (``decode(ids, skip_special_tokens=True)``) drops the ids of ``</s>``, ``<unk>``, ``<pad>``, turns the others
into piece strings (unknown ids become ``<unk>``, which is then dropped as well), decodes them with the *target*
SentencePiece model, replaces any leftover ``▁`` with a space and strips the result. ``stream()`` does the same one
piece at a time, for streaming (``serving.engine.tokenizers.sentencepiece_stream``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import sentencepiece

from serving.engine.tokenizers.base import check_text
from serving.engine.tokenizers.sentencepiece_stream import PieceSurfaces, SentencePieceStream

logger = logging.getLogger(__name__)

EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
PAD_TOKEN = "<pad>"
_SPIECE_UNDERLINE = "\u2581"


class SentencePieceTokenizer:
    """Marian's tokenizer: source.spm + target.spm + vocab.json.

    Args:
        source_spm: SentencePiece model for the source language.
        target_spm: SentencePiece model for the target language (used to decode).
        vocab: vocab.json, a JSON object piece -> id shared by source and target.
        unk_id: id of unknown pieces; defaults to the id of ``<unk>`` in the vocabulary.
        target_vocab: for models with separate vocabularies (``separate_vocabs``), target_vocab.json: decoding maps ids
            to pieces through it (the special ids to skip still come from vocab.json, as in transformers).

    Raises:
        ValueError: a file is unreadable, the vocabulary is not a piece -> id object, or it lacks ``<unk>``.
    """

    def __init__(
        self, source_spm: Path, target_spm: Path, vocab: Path, unk_id: int | None = None, target_vocab: Path | None = None
    ) -> None:
        self._source = _load_spm(source_spm)
        self._target = _load_spm(target_spm)
        self._vocab = _load_vocab(vocab)
        if UNK_TOKEN not in self._vocab:
            raise ValueError(f"{vocab}: the vocabulary has no {UNK_TOKEN!r} entry")
        self._unk_id = self._vocab[UNK_TOKEN] if unk_id is None else int(unk_id)
        self._target_vocab = self._vocab if target_vocab is None else _load_vocab(target_vocab)
        self._target_unk_id = self._unk_id if target_vocab is None else self._target_vocab.get(UNK_TOKEN, self._unk_id)
        self._pieces = {i: piece for piece, i in self._target_vocab.items()}
        specials = [t for t in (EOS_TOKEN, UNK_TOKEN, PAD_TOKEN) if t in self._vocab]
        self._special_ids = frozenset(self._vocab[t] for t in specials)
        self._special_split = re.compile("(" + "|".join(re.escape(t) for t in specials) + ")")
        self._surfaces: PieceSurfaces | None = None

    @property
    def vocab_size(self) -> int:
        """Entries in vocab.json."""
        return len(self._vocab)

    def encode(self, text: str) -> list[int]:
        """Source text to ids, without EOS (``MarianTokenizer(text).input_ids[:-1]``).

        Raises:
            InvalidText: the text is not valid Unicode (SentencePiece would fail converting it to UTF-8).
        """
        return self._encode(text, self._source, self._vocab, self._unk_id)

    def encode_target(self, text: str) -> list[int]:
        """Target text to ids, without EOS (``MarianTokenizer(text_target=text).labels[:-1]``).

        Raises:
            InvalidText: the text is not valid Unicode.
        """
        return self._encode(text, self._target, self._target_vocab, self._target_unk_id)

    def _encode(self, text: str, model: sentencepiece.SentencePieceProcessor, vocab: dict[str, int],
                unk: int) -> list[int]:
        check_text(text)
        ids: list[int] = []
        for i, chunk in enumerate(self._special_split.split(text)):
            if i % 2:  # re.split puts the separators (the special tokens) at odd positions
                ids.append(self._vocab[chunk])
                continue
            if not chunk:
                continue
            if chunk.startswith(">>") and (end := chunk.find("<<")) != -1:
                ids.append(vocab.get(chunk[: end + 2], unk))
                chunk = chunk[end + 2 :]
            ids.extend(vocab.get(piece, unk) for piece in model.encode(chunk, out_type=str))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids to text, special tokens skipped (``MarianTokenizer.decode(ids, skip_special_tokens=True)``)."""
        special, pieces = self._special_ids, self._pieces
        tokens = [pieces.get(i, UNK_TOKEN) for i in map(int, ids) if i not in special]
        tokens = [t for t in tokens if t not in (EOS_TOKEN, UNK_TOKEN, PAD_TOKEN)]
        if not tokens:
            return ""
        text: str = self._target.decode_pieces(tokens)
        return text.replace(_SPIECE_UNDERLINE, " ").strip()

    def stream(self) -> SentencePieceStream:
        """One sentence's :meth:`decode`, incrementally (``serving.engine.tokenizers.stream.TextStream``)."""
        if self._surfaces is None:
            self._surfaces = PieceSurfaces(self._target, self._piece_of)
        return SentencePieceStream(self._surfaces, self.decode)

    def _piece_of(self, token: int) -> str | None:
        """The piece :meth:`decode` decodes for ``token``, or None where it skips it."""
        if token in self._special_ids:
            return None
        piece = self._pieces.get(token)
        return None if piece is None or piece in (EOS_TOKEN, UNK_TOKEN, PAD_TOKEN) else piece


def _load_spm(path: Path) -> sentencepiece.SentencePieceProcessor:
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.Load(str(path))
    except (OSError, RuntimeError) as e:
        raise ValueError(f"{path}: not a SentencePiece model ({e})") from e
    return processor


def _load_vocab(path: Path) -> dict[str, int]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable vocabulary ({e})") from e
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        raise ValueError(f"{path}: the vocabulary must be a JSON object mapping pieces to integer ids")
    return {str(k): int(v) for k, v in data.items()}
