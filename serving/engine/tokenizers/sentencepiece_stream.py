"""Incremental detokenization for the SentencePiece tokenizer (``serving.engine.tokenizers.stream``).

``SentencePieceTokenizer.decode`` is ``decode_pieces(pieces).replace("▁", " ").strip()``. SentencePiece decodes each
piece on its own (a control piece to nothing, a piece it does not know to the piece itself, any other piece to its
string with ``▁`` as a space; the first piece's leading ``▁`` is dropped, which the strip would drop anyway), except
that a run of byte-fallback pieces (``<0xE2>``...) is decoded as one UTF-8 byte string, each invalid byte becoming
U+FFFD. So a stream emits each piece's text as it comes, holding back trailing whitespace (the strip) and the bytes
of a character that is not complete yet (a valid character is final once its last byte is there; an invalid byte
waits for the end of its run). A model with a denormalizer (rules applied to the whole decoded text) streams its
text at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sentencepiece

from serving.engine.tokenizers.stream import StrippedText

_SPIECE_UNDERLINE = "\u2581"
_SKIP, _BYTE, _TEXT = 0, 1, 2  # what an id is to decode: nothing at all (not even between byte pieces), a byte, text


class PieceSurfaces:
    """What each target id decodes to on its own: ``(_BYTE, piece)`` for a byte piece, ``(_TEXT, text)`` for another
    piece, ``(_SKIP, "")`` for the ids ``decode`` drops before SentencePiece sees them; computed once per id.

    Arguments:
        processor: the target SentencePiece model.
        piece_of: the piece string of an id, or None for the ids ``decode`` skips (special, unknown).
    """

    def __init__(self, processor: sentencepiece.SentencePieceProcessor, piece_of: Callable[[int], str | None]) -> None:
        self._processor = processor
        self._piece_of = piece_of
        self._cache: dict[int, tuple[int, str]] = {}
        self.whole_text_only = has_denormalizer(processor.serialized_model_proto())

    def __call__(self, token: int) -> tuple[int, str]:
        found = self._cache.get(token)
        if found is None:
            found = self._cache[token] = self._surface(token)
        return found

    def _surface(self, token: int) -> tuple[int, str]:
        piece = self._piece_of(token)
        if piece is None:
            return _SKIP, ""
        sp = self._processor
        sp_id = sp.piece_to_id(piece)
        if sp.id_to_piece(sp_id) == piece:
            if sp.is_byte(sp_id):
                return _BYTE, piece
            if sp.is_control(sp_id) or sp.is_unknown(sp_id):
                # "" for a control piece, the model's surface for its unknown piece
                return _TEXT, str(sp.decode_pieces([piece])).replace(_SPIECE_UNDERLINE, " ")
        # A piece the model knows, or one it does not (decoded as itself, then "▁" -> " " by decode).
        return _TEXT, piece.replace(_SPIECE_UNDERLINE, " ")

    def decode_bytes(self, pieces: list[str]) -> str:
        """SentencePiece's text of a run of byte pieces."""
        return str(self._processor.decode_pieces(pieces)).replace(_SPIECE_UNDERLINE, " ")


class SentencePieceStream:
    """One sentence's text (module docstring); built by ``SentencePieceTokenizer.stream``."""

    def __init__(self, surfaces: PieceSurfaces, decode: Callable[[Sequence[int]], str]) -> None:
        self._surfaces = surfaces
        self._text = StrippedText()
        self._bytes: list[str] = []  # byte pieces not decoded yet
        self._stuck = False  # the held bytes start with an invalid sequence: they wait for the end of their run
        # A denormalizer rewrites the decoded text as a whole: such a model's text comes at the end.
        self._ids: list[int] | None = [] if surfaces.whole_text_only else None
        self._decode = decode

    def add(self, ids: Sequence[int]) -> str:
        if self._ids is not None:
            self._ids.extend(int(i) for i in ids)
            return ""
        parts: list[str] = []
        surfaces = self._surfaces
        for token in ids:
            kind, text = surfaces(int(token))
            if kind == _BYTE:
                self._bytes.append(text)
                if not self._stuck:
                    parts.append(self._complete_bytes())
            elif kind == _TEXT:  # a piece other than a byte ends a run of bytes
                if self._bytes:
                    parts.append(self._flush_bytes())
                parts.append(text)
        return self._text.add("".join(parts))

    def finish(self) -> str:
        if self._ids is not None:
            return self._decode(self._ids)
        return self._text.add(self._flush_bytes()) if self._bytes else ""

    def _complete_bytes(self) -> str:
        """The text of the held bytes' complete characters (they are final: SentencePiece decodes a valid character
        whatever follows it); the rest stays held."""
        data = bytes(int(piece[3:-1], 16) for piece in self._bytes)
        try:
            data.decode("utf-8")
            complete = len(data)
        except UnicodeDecodeError as e:
            complete = e.start
            # An invalid sequence (not one cut short) is invalid whatever follows: it waits for its run's end.
            self._stuck = e.reason != "unexpected end of data"
        if complete == 0:
            return ""
        text = self._surfaces.decode_bytes(self._bytes[:complete])
        del self._bytes[:complete]
        return text

    def _flush_bytes(self) -> str:
        text = self._surfaces.decode_bytes(self._bytes)
        self._bytes.clear()
        self._stuck = False
        return text


def has_denormalizer(model_proto: bytes) -> bool:
    """Whether a serialized SentencePiece ``ModelProto`` has a denormalizer (``denormalizer_spec``, field 5, with a
    non-empty ``precompiled_charsmap``, field 2): the one case where SentencePiece rewrites the decoded text as a
    whole. Read from the protobuf wire format (the generated module needs a matching protobuf runtime)."""
    spec = _field(model_proto, 5)
    return spec is not None and bool(_field(spec, 2))


def _field(message: bytes, number: int) -> bytes | None:
    """The last length-delimited field ``number`` of a protobuf message, or None."""
    found: bytes | None = None
    at, end = 0, len(message)
    while at < end:
        key, at = _varint(message, at)
        kind = key & 7
        if kind == 0:
            _, at = _varint(message, at)
        elif kind == 1:
            at += 8
        elif kind == 5:
            at += 4
        elif kind == 2:
            size, at = _varint(message, at)
            if key >> 3 == number:
                found = message[at : at + size]
            at += size
        else:  # groups (3, 4) are not used by sentencepiece_model.proto
            return found
    return found


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
