"""Record parsing: an entry's bytes become a :class:`Record` (what to translate, the reference, the original to copy
into the output) or a :class:`Reject` (where, and why); :class:`Translated` is what the engine made of a record.

A record is refused here, with its reason, whenever its text could not go further: bytes that are not UTF-8
(encoded surrogates included), a str that is not Unicode text (a lone surrogate from a JSON ``\\ud800`` escape or
a T2T ``\\55296;`` escape), ids outside the vocabulary, a field of the wrong type. So the engine, a server and the
output writers only ever see text that encodes as UTF-8.

T2T datagen records hold int64 subword ids ending in EOS 1; they are decoded to text with a ``SubwordTextEncoder``
vocabulary, and kept as ids too (:attr:`Record.source_ids`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from batch.errors import InputError
from batch.example import example_class
from batch.framing import Entry, first_line
from batch.schema import Kind, Schema, feature_kind, json_kind

EOS_ID = 1
PAD_ID = 0


class IdDecoder(Protocol):
    """What decoding int64 ids needs from a vocabulary (``serving.engine.tokenizers.subword.SubwordTextEncoder``)."""

    @property
    def vocab_size(self) -> int: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def load_vocab(path: Path) -> IdDecoder:
    """A T2T ``.subwords`` vocabulary.

    Raises:
        InputError: missing or unreadable file.
    """
    from serving.engine.tokenizers.subword import SubwordTextEncoder

    try:
        return SubwordTextEncoder(path)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot load the subword vocabulary ({e})") from e


@dataclass(slots=True)
class Record:
    """A readable record: what to translate and what to copy into the output.

    Attributes:
        index: position over all inputs.
        source: text to translate.
        reference: reference translation, if the input has one.
        original: the parsed ``tf.train.Example`` (TFRecord) or JSON object (JSONL); None for plain text.
        source_ids: when the input holds subword ids (T2T datagen), those ids (EOS and padding removed), so that an
            engine sharing the vocabulary can take them as they are; None for text.
    """

    index: int
    source: str
    reference: str | None = None
    original: Any = None
    source_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """A record that could not be used, with why."""

    index: int
    file: str
    position: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "file": self.file, "position": self.position, "reason": self.reason}


@dataclass
class RecordParser:
    """Turns scanned entries into records or rejects, following a schema.

    Args:
        schema: where source and reference live.
        vocab: decodes int64 ids (required when the schema has ``ids`` fields).
    """

    schema: Schema
    vocab: IdDecoder | None = None
    _example_cls: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.schema.needs_vocab and self.vocab is None:
            raise InputError("the inputs hold int64 token ids; a subword vocabulary is needed to decode them")
        if self.schema.format == "tfrecord":
            self._example_cls = example_class()

    def parse(self, entry: Entry) -> Record | Reject:
        """Record or reject for one entry that carries bytes (or a framing error)."""
        if entry.error is not None:
            return Reject(entry.index, entry.file, entry.position, entry.error)
        if entry.data is None:
            raise ValueError(f"entry {entry.index} was scanned without its bytes")
        try:
            if self.schema.format == "tfrecord":
                record = self._parse_example(entry)
            elif self.schema.format == "jsonl":
                record = self._parse_json(entry)
            else:
                record = self._parse_text(entry)
            _check_text(record.source, "source")
            if record.reference is not None:
                _check_text(record.reference, "reference")
            if isinstance(record.original, dict) and _SURROGATE_ESCAPE.search(entry.data):
                _check_json(record.original)  # another field may hold one: its output line could not be written
            return record
        except _Bad as e:
            return Reject(entry.index, entry.file, entry.position, str(e))

    def _parse_text(self, entry: Entry) -> Record:
        assert entry.data is not None
        source = _utf8(entry.data, "line")
        reference = _utf8(entry.reference, "reference line") if entry.reference is not None else None
        return Record(entry.index, source, reference)

    def _parse_example(self, entry: Entry) -> Record:
        try:
            example = self._example_cls.FromString(entry.data)
        except Exception as e:  # google.protobuf.message.DecodeError
            raise _Bad(f"not a tf.train.Example ({first_line(e)})") from e
        features = example.features.feature
        schema = self.schema
        assert schema.input_key is not None
        source = self._feature_text(features, schema.input_key, schema.input_kind, "source", required=True)
        reference = None
        if schema.reference_key is not None and schema.reference_kind is not None:
            reference = self._feature_text(features, schema.reference_key, schema.reference_kind, "reference",
                                           required=False)
        assert source is not None
        return Record(entry.index, source[0], reference[0] if reference else None, example, source[1])

    def _feature_text(self, features: Any, key: str, kind: Kind, role: str,
                      required: bool) -> tuple[str, tuple[int, ...] | None] | None:
        """(text, ids or None) of one feature; None when an optional feature is absent."""
        if key not in features:
            if required:
                raise _Bad(f"no {role} feature {key!r}")
            return None
        feature = features[key]
        have = feature_kind(feature)
        want = "bytes_list" if kind == "text" else "int64_list"
        if have != want:
            if have == "empty" and not required:
                return None
            raise _Bad(f"{role} feature {key!r} is {have}, expected {want}")
        if kind == "text":
            values = feature.bytes_list.value
            if len(values) != 1:
                raise _Bad(f"{role} feature {key!r} holds {len(values)} byte strings, expected 1")
            return _utf8(values[0], f"{role} feature {key!r}"), None
        return self._decode_ids(list(feature.int64_list.value), f"{role} feature {key!r}")

    def _parse_json(self, entry: Entry) -> Record:
        assert entry.data is not None
        try:
            text = entry.data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Bad(f"line is not valid UTF-8 ({e.reason} at byte {e.start})") from e
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise _Bad(f"invalid JSON ({e})") from e
        if not isinstance(obj, dict):
            raise _Bad(f"expected a JSON object, got {type(obj).__name__}")
        schema = self.schema
        assert schema.input_key is not None
        source = self._json_text(obj, schema.input_key, "source", required=True)
        reference = None
        if schema.reference_key is not None:
            reference = self._json_text(obj, schema.reference_key, "reference", required=False)
        assert source is not None
        return Record(entry.index, source[0], reference[0] if reference else None, obj, source[1])

    def _json_text(self, obj: dict[str, Any], key: str, role: str,
                   required: bool) -> tuple[str, tuple[int, ...] | None] | None:
        if key not in obj or obj[key] is None:
            if required:
                raise _Bad(f"no {role} field {key!r}")
            return None
        value = obj[key]
        kind = json_kind(value)
        if kind == "text":
            return str(value), None
        if kind == "ids":
            if self.vocab is None:
                raise _Bad(f"{role} field {key!r} holds token ids; pass --vocab to decode them")
            return self._decode_ids(value, f"{role} field {key!r}")
        raise _Bad(f"{role} field {key!r} is {type(value).__name__}, expected a string")

    def _decode_ids(self, ids: list[int], what: str) -> tuple[str, tuple[int, ...]]:
        """(decoded text, the ids without EOS and padding)."""
        vocab = self.vocab
        if vocab is None:
            raise _Bad(f"{what} holds token ids and no vocabulary was given")
        # T2T datagen appends EOS; anything after the first EOS (padding) is not text.
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        size = vocab.vocab_size
        bad = next((i for i in ids if i < 0 or i >= size or i == PAD_ID), None)
        if bad is not None:
            raise _Bad(f"{what} holds id {bad}, outside the vocabulary (2..{size - 1})")
        return vocab.decode(ids), tuple(ids)


class _Bad(Exception):
    pass


def _utf8(data: bytes, what: str) -> str:
    # Python's strict UTF-8 refuses encoded surrogates (b"\xed\xa0\x80") as it refuses any invalid byte.
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        lead = data[e.start:e.start + 2]
        reason = ("an encoded UTF-16 surrogate" if len(lead) == 2 and lead[0] == 0xED and lead[1] >= 0xA0
                  else e.reason)
        raise _Bad(f"{what} is not valid UTF-8 ({reason} at byte {e.start})") from e


# A JSON \u escape of a UTF-16 surrogate (an escaped backslash before "ud800" matches too: then the check is spent
# for nothing). json.loads joins a valid pair into one character and leaves a lone one in the str.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _check_text(text: str, what: str) -> None:
    """Refuse a str that is not Unicode text: a lone surrogate (from a JSON escape or a T2T ``\\55296;`` escape)
    cannot be encoded, so no tokenizer, server or output file could take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _Bad(f"{what} holds a lone surrogate (U+{ord(text[e.start]):04X} at character {e.start}), which is "
                   "not text; fix the record") from e


def _check_json(obj: dict[str, Any]) -> None:
    """Refuse an object with a lone surrogate in any field: its output line could not be written."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise _Bad("a field holds a lone surrogate (\\u escape of U+D800..U+DFFF without its pair), which is not "
                   "text; fix the record") from e


@dataclass(frozen=True, slots=True)
class Translated:
    """What the engine produced for one record; with ``--score-references``, also the model's log-likelihood of the
    record's reference (``ref_log_prob``, natural log, over ``ref_tokens`` tokens, EOS included)."""

    text: str
    score: float | None
    input_tokens: int | None
    output_tokens: int | None
    ref_log_prob: float | None = None
    ref_tokens: int | None = None


