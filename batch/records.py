"""Record IO for batch-score: TFRecord files of ``tf.train.Example`` (through tensorflow), JSONL and plain text.

Reading is split in two steps so that sharding and resuming stay cheap and every malformed record is reported:

1. :func:`scan` walks the framing of every input file in order and yields one :class:`Entry` per record position,
   numbered over all files (``index``). Only the entries the caller wants carry their bytes; the others are skipped
   with a seek. A TFRecord whose framing is broken (bad length checksum, a truncated tail, a data checksum mismatch)
   still yields an entry, with ``error`` set, so it can be counted and reported instead of stopping the run.
2. :class:`RecordParser` turns an entry into a :class:`Record` (source text, optional reference, the original
   Example or JSON object to copy into the output) or a :class:`Reject` (index and reason).

TFRecord framing (``tensorflow/core/lib/io/record_writer.cc``): ``uint64 length``, ``uint32 masked_crc32c(length)``,
``data``, ``uint32 masked_crc32c(data)``, all little-endian. Length checksums are verified here (8 bytes each);
data checksums by tensorflow's record reader, which also returns the record bytes.

T2T datagen records (``../shared/reference/t2t-transformer.md`` section 5) hold ``inputs``/``targets`` as int64 subword
ids ending in EOS 1; they are decoded to text with a ``SubwordTextEncoder`` vocabulary.
"""

from __future__ import annotations

import errno
import glob
import itertools
import json
import logging
import math
import os
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

logger = logging.getLogger(__name__)

Format = Literal["tfrecord", "jsonl", "text"]
FORMATS: tuple[str, ...] = ("tfrecord", "jsonl", "text")
Kind = Literal["text", "ids"]

# Feature / field names tried in order when --input-key / --reference-key are not given.
INPUT_KEYS: tuple[str, ...] = ("inputs", "source", "text", "src")
REFERENCE_KEYS: tuple[str, ...] = ("targets", "target", "reference", "ref", "tgt")
OUTPUT_KEY = "outputs"
SCORE_KEY = "score"
EOS_ID = 1
PAD_ID = 0
SCHEMA_SAMPLE = 64

_SUFFIX_FORMATS: dict[str, Format] = {
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tfr": "tfrecord",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".txt": "text",
}
_HEADER = struct.Struct("<QI")
_FOOTER_BYTES = 4
_GLOB_CHARS = frozenset("*?[")
_READ_BLOCK = 1 << 20


class InputError(Exception):
    """The inputs cannot be read as asked (missing file, unknown schema...); reported as a usage error."""


class IOFailure(Exception):
    """A file could not be read or written: one line with the path, the system's reason and what to do."""

    def __init__(self, path: Path, error: OSError, action: str) -> None:
        self.path = path
        self.error = error
        reason = error.strerror or str(error)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            advice = "free some space"
        elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            advice = f"make it {'readable' if action == 'read' else 'writable'}"
        else:
            advice = "check the disk"
        super().__init__(f"cannot {action} {path} ({reason}); {advice}")


# ---------------------------------------------------------------------------------------------------------------
# crc32c (Castagnoli), only for the 8-byte length header and for resynchronising after a corrupt header.


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C of ``data`` (pure Python; meant for short inputs such as record headers)."""
    table = _CRC_TABLE
    c = 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked checksum: rotate right by 15 and add a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One TFRecord frame around ``data`` (tests and tools; batch-score writes through tensorflow)."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


# ---------------------------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class InputFile:
    """One input file and, for plain text, the file holding its references line by line."""

    path: Path
    format: Format
    references: Path | None = None


def expand_inputs(patterns: Sequence[str]) -> list[Path]:
    """Expand each argument (a path or a glob such as ``data-*.tfrecord``) into sorted, de-duplicated files.

    Raises:
        InputError: a pattern matches nothing, or a path is missing or a directory.
    """
    out: list[Path] = []
    for pattern in patterns:
        if _GLOB_CHARS.intersection(pattern):
            matches = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
            if not matches:
                raise InputError(f"{pattern}: no file matches")
            out.extend(Path(p) for p in matches)
        else:
            path = Path(pattern)
            if path.is_dir():
                raise InputError(f"{path}: is a directory (give files or a glob such as {path}/*.tfrecord)")
            if not path.is_file():
                raise InputError(f"{path}: no such file")
            out.append(path)
    seen: set[Path] = set()
    unique = []
    for p in out:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def _looks_like_tfrecord(head: bytes) -> bool:
    if len(head) < _HEADER.size:
        return False
    _, crc = _HEADER.unpack_from(head)
    return bool(masked_crc32c(head[:8]) == crc)


def detect_format(path: Path) -> Format:
    """Format of one file: from its suffix, else from its first bytes (T2T shards have no suffix).

    Raises:
        InputError: the file cannot be read.
    """
    by_suffix = _SUFFIX_FORMATS.get(path.suffix.lower())
    if by_suffix is not None:
        return by_suffix
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from e
    if _looks_like_tfrecord(head):
        return "tfrecord"
    first = next((line for line in head.splitlines() if line.strip()), b"")
    if first.lstrip().startswith(b"{"):
        return "jsonl"
    return "text"


def resolve_inputs(
    patterns: Sequence[str], input_format: str = "auto", references: Sequence[str] | None = None
) -> list[InputFile]:
    """Expand patterns, detect (or apply) the format, and pair plain-text inputs with their reference files.

    Raises:
        InputError: no file, mixed formats, references for a non-text input, or line counts that differ.
    """
    paths = expand_inputs(patterns)
    if input_format == "auto":
        formats = {p: detect_format(p) for p in paths}
        kinds = sorted(set(formats.values()))
        if len(kinds) > 1:
            listing = ", ".join(f"{p.name}: {formats[p]}" for p in paths)
            raise InputError(f"inputs mix formats ({listing}); give files of one format or --input-format")
        fmt: Format = formats[paths[0]]
    elif input_format in FORMATS:
        fmt = input_format  # type: ignore[assignment]
    else:
        raise InputError(f"unknown input format {input_format!r} (supported: auto, {', '.join(FORMATS)})")
    ref_paths: list[Path | None] = [None] * len(paths)
    if references:
        if fmt != "text":
            raise InputError(f"--references is for plain-text inputs; {fmt} inputs carry references in a field "
                             "(--reference-key)")
        refs = expand_inputs(references)
        if len(refs) != len(paths):
            raise InputError(f"{len(paths)} input file(s) but {len(refs)} reference file(s); give one per input")
        for src, ref in zip(paths, refs, strict=True):
            n_src, n_ref = count_lines(src), count_lines(ref)
            if n_src != n_ref:
                raise InputError(f"{ref}: {n_ref} lines but {src} has {n_src}; references must align line by line")
        ref_paths = list(refs)
    return [InputFile(p, fmt, r) for p, r in zip(paths, ref_paths, strict=True)]


def count_lines(path: Path) -> int:
    """Lines of a text file (a last line without a newline counts)."""
    n = 0
    last = b"\n"
    with path.open("rb") as f:
        for block in iter(lambda: f.read(_READ_BLOCK), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (0 if last == b"\n" else 1)


# ---------------------------------------------------------------------------------------------------------------
# Scanning


@dataclass(frozen=True, slots=True)
class Entry:
    """One record position in the inputs.

    Attributes:
        index: position over all input files (records and unreadable regions alike), from 0.
        file: the input file.
        position: byte offset of the record (TFRecord) or 1-based line number (JSONL, text).
        data: the record bytes; None when the caller did not want this entry or it is unreadable.
        reference: for plain text with a reference file, the reference line's bytes.
        error: why the bytes could not be read (framing), else None.
    """

    index: int
    file: str
    position: int
    data: bytes | None = None
    reference: bytes | None = None
    error: str | None = None


def _all(_: int) -> bool:
    return True


def scan(inputs: Sequence[InputFile], want: Callable[[int], bool] = _all) -> Iterator[Entry]:
    """Yield every record position of the inputs in order; entries for which ``want(index)`` is true carry bytes."""
    index = 0
    for item in inputs:
        if item.format == "tfrecord":
            entries = _scan_tfrecord(item.path, index, want)
        elif item.format == "jsonl":
            entries = _scan_jsonl(item.path, index, want)
        else:
            entries = _scan_text(item.path, item.references, index, want)
        try:
            for entry in entries:
                yield entry
                index = entry.index + 1
        except OSError as e:  # the disk, not the data: the run stops (a rerun resumes)
            raise IOFailure(Path(e.filename) if e.filename else item.path, e, "read") from e


def count_entries(inputs: Sequence[InputFile]) -> int:
    """Number of record positions (cheap: framing and line counting only)."""
    n = 0
    for _ in scan(inputs, want=lambda _i: False):
        n += 1
    return n


class _RecordReader(Protocol):
    def read(self, offset: int) -> tuple[bytes, int]: ...


def _tf_reader(path: Path) -> _RecordReader:
    from tensorflow.python.lib.io import tf_record

    reader: _RecordReader = tf_record.tf_record_random_reader(str(path))
    return reader


def _scan_tfrecord(path: Path, start: int, want: Callable[[int], bool]) -> Iterator[Entry]:
    name = str(path)
    size = path.stat().st_size
    reader: _RecordReader | None = None
    index = start
    offset = 0
    with path.open("rb") as f:
        while offset < size:
            f.seek(offset)
            header = f.read(_HEADER.size)
            if len(header) < _HEADER.size:
                yield Entry(index, name, offset, error=f"truncated record header at byte {offset} "
                                                        f"({len(header)} of {_HEADER.size} bytes)")
                return
            length, length_crc = _HEADER.unpack(header)
            if masked_crc32c(header[:8]) != length_crc:
                resume = _resync(f, path, offset + 1, size)
                skipped = (resume if resume is not None else size) - offset
                yield Entry(index, name, offset, error=f"corrupt record length at byte {offset} "
                                                        f"(checksum mismatch); skipped {skipped} bytes")
                index += 1
                if resume is None:
                    return
                offset = resume
                continue
            end = offset + _HEADER.size + length + _FOOTER_BYTES
            if end > size:
                yield Entry(index, name, offset, error=f"truncated record at byte {offset}: needs "
                                                        f"{end - offset} bytes, the file has {size - offset}")
                return
            if want(index):
                if reader is None:
                    reader = _tf_reader(path)
                try:
                    data, _ = reader.read(offset)
                except Exception as e:  # tf.errors.DataLossError; tensorflow's error types are not importable cheaply
                    yield Entry(index, name, offset, error=f"corrupt record data at byte {offset} "
                                                            f"({_first_line(e)})")
                else:
                    yield Entry(index, name, offset, data=data)
            else:
                yield Entry(index, name, offset)
            index += 1
            offset = end


def _resync(f: Any, path: Path, start: int, size: int) -> int | None:
    """First offset >= start where a valid record begins (header and data checksums), or None."""
    reader: _RecordReader | None = None
    pos = start
    while pos + _HEADER.size <= size:
        f.seek(pos)
        block = f.read(_READ_BLOCK + _HEADER.size)
        limit = len(block) - _HEADER.size
        for i in range(limit + 1):
            length, crc = _HEADER.unpack_from(block, i)
            candidate = pos + i
            if candidate + _HEADER.size + length + _FOOTER_BYTES > size:
                continue
            if masked_crc32c(block[i:i + 8]) != crc:
                continue
            if reader is None:
                reader = _tf_reader(path)
            try:
                reader.read(candidate)
            except Exception:  # noqa: BLE001 - a false candidate; keep looking
                continue
            return candidate
        pos += limit + 1
    return None


def _split_line(raw: bytes) -> bytes:
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    return raw


def _scan_jsonl(path: Path, start: int, want: Callable[[int], bool]) -> Iterator[Entry]:
    name = str(path)
    index = start
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, 1):
            if not raw.strip():
                continue  # blank lines are not records
            yield Entry(index, name, line_no, data=_split_line(raw) if want(index) else None)
            index += 1


def _scan_text(path: Path, references: Path | None, start: int, want: Callable[[int], bool]) -> Iterator[Entry]:
    name = str(path)
    with path.open("rb") as f, (references.open("rb") if references else open(os.devnull, "rb")) as r:
        for i, raw in enumerate(f):
            ref = r.readline() if references else b""
            index = start + i
            if want(index):
                yield Entry(index, name, i + 1, data=_split_line(raw),
                            reference=_split_line(ref) if references else None)
            else:
                yield Entry(index, name, i + 1)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


# ---------------------------------------------------------------------------------------------------------------
# Schema


@dataclass(frozen=True)
class Schema:
    """Where the source text and the reference live in each record.

    Attributes:
        format: input format.
        input_key: feature / field holding the source (None for plain text).
        input_kind: ``text`` (bytes / string) or ``ids`` (int64 subword ids ending in EOS).
        reference_key: feature / field holding the reference, or None.
        reference_kind: ``text`` or ``ids`` (None without references).
    """

    format: Format
    input_key: str | None
    input_kind: Kind
    reference_key: str | None = None
    reference_kind: Kind | None = None

    @property
    def needs_vocab(self) -> bool:
        return self.input_kind == "ids" or self.reference_kind == "ids"

    def describe(self) -> str:
        """One line for humans, e.g. ``inputs (int64 ids) -> references targets (int64 ids)``."""
        names = {"text": "text", "ids": "int64 ids"} if self.format == "tfrecord" else {"text": "string", "ids": "ids"}
        if self.format == "text":
            src = "one sentence per line"
            ref = "references from a file" if self.reference_key else "no references"
        else:
            src = f"source {self.input_key!r} ({names[self.input_kind]})"
            ref = (f"reference {self.reference_key!r} ({names[self.reference_kind or 'text']})"
                   if self.reference_key else "no references")
        return f"{self.format}: {src}, {ref}"

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "input_key": self.input_key, "input_kind": self.input_kind,
                "reference_key": self.reference_key, "reference_kind": self.reference_kind}


def example_class() -> Any:
    """``tf.train.Example`` (imports tensorflow on first use)."""
    import tensorflow as tf

    return tf.train.Example


def _feature_kind(feature: Any) -> str:
    kind: str | None = feature.WhichOneof("kind")
    return kind or "empty"


def _tf_kind(kind: str) -> Kind | None:
    return {"bytes_list": "text", "int64_list": "ids"}.get(kind)  # type: ignore[return-value]


def _named_kind(kind: str) -> Kind | None:
    return "text" if kind == "text" else "ids" if kind == "ids" else None


def _json_kind(value: Any) -> Kind | None:
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return "ids"
    return None


def _sample_fields(inputs: Sequence[InputFile], limit: int) -> list[dict[str, str | None]]:
    """Field name -> kind name (bytes_list / int64_list / float_list or a JSON type) of the first readable records."""
    samples: list[dict[str, str | None]] = []
    example_cls = example_class() if inputs[0].format == "tfrecord" else None
    for entry in scan(inputs, want=lambda i: True):
        if len(samples) >= limit:
            break
        if entry.data is None:
            continue
        if example_cls is not None:
            try:
                example = example_cls.FromString(entry.data)
            except Exception:  # noqa: BLE001 - google.protobuf.message.DecodeError; skipped while sampling
                continue
            samples.append({k: _feature_kind(v) for k, v in example.features.feature.items()})
        else:
            try:
                obj = json.loads(entry.data)
            except ValueError:
                continue
            if isinstance(obj, dict):
                samples.append({k: _json_kind(v) or type(v).__name__ for k, v in obj.items()})
    return samples


def _pick(samples: list[dict[str, str | None]], key: str | None, candidates: Sequence[str],
          to_kind: Callable[[str], Kind | None], role: str, required: bool) -> tuple[str | None, Kind | None]:
    keys = [key] if key else list(candidates)
    for name in keys:
        kinds = [s[name] for s in samples if name in s and s[name] != "empty"]
        if not kinds:
            continue
        kind = to_kind(str(kinds[0]))
        if kind is None:
            raise InputError(f"{role} field {name!r} holds {kinds[0]}; it must be text (bytes / string) "
                             "or int64 token ids")
        return name, kind
    if key or required:
        seen = sorted({k for s in samples for k in s})
        wanted = repr(key) if key else "any of " + ", ".join(candidates)
        flag = "--input-key" if role == "source" else "--reference-key"
        raise InputError(f"no {role} field {wanted} in the first {len(samples)} records "
                         f"(fields: {', '.join(seen) or 'none'}); pass {flag}")
    return None, None


def detect_schema(inputs: Sequence[InputFile], input_key: str | None = None,
                  reference_key: str | None = None) -> Schema:
    """Find the source and reference fields from the first readable records.

    Raises:
        InputError: no readable record, or no usable source field (the message lists the fields found).
    """
    fmt = inputs[0].format
    if fmt == "text":
        has_refs = any(i.references for i in inputs)
        return Schema("text", None, "text", "references" if has_refs else None, "text" if has_refs else None)
    samples = _sample_fields(inputs, SCHEMA_SAMPLE)
    if not samples:
        what = "tf.train.Example" if fmt == "tfrecord" else "JSON object"
        if count_entries(inputs) == 0:
            # An empty input is valid: nothing to translate. Assume the usual field names.
            return Schema(fmt, input_key or INPUT_KEYS[0], "text")
        raise InputError(f"no readable {what} in {inputs[0].path}" + (" (and the other inputs)" if len(inputs) > 1
                                                                       else ""))
    to_kind = _tf_kind if fmt == "tfrecord" else _named_kind
    src_key, src_kind = _pick(samples, input_key, INPUT_KEYS, to_kind, "source", required=True)
    candidates = [k for k in REFERENCE_KEYS if k != src_key]
    ref_key, ref_kind = _pick(samples, reference_key, candidates, to_kind, "reference", required=False)
    assert src_key is not None and src_kind is not None
    return Schema(fmt, src_key, src_kind, ref_key, ref_kind)


# ---------------------------------------------------------------------------------------------------------------
# Parsing


class IdDecoder(Protocol):
    """What decoding int64 ids needs from a vocabulary (``serving.tokenizers.subword.SubwordTextEncoder``)."""

    @property
    def vocab_size(self) -> int: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def load_vocab(path: Path) -> IdDecoder:
    """A T2T ``.subwords`` vocabulary.

    Raises:
        InputError: missing or unreadable file.
    """
    from serving.tokenizers.subword import SubwordTextEncoder

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
            raise _Bad(f"not a tf.train.Example ({_first_line(e)})") from e
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
        have = _feature_kind(feature)
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
        kind = _json_kind(value)
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


# ---------------------------------------------------------------------------------------------------------------
# Output


@dataclass(frozen=True, slots=True)
class Translated:
    """What the engine produced for one record."""

    text: str
    score: float | None
    input_tokens: int | None
    output_tokens: int | None


def _float_or_nan(score: float | None) -> float:
    return float("nan") if score is None else float(score)


class OutputEncoder:
    """Encodes a record and its translation as one output item (serialized Example, JSON line or text line).

    TFRecord output copies the input Example and adds ``outputs`` (bytes) and ``score`` (float); inputs that are not
    Examples get ``inputs`` (and ``targets`` when there is a reference). JSONL output copies the input object (or
    builds ``{"index", "source", "reference"}``) and adds ``outputs`` and ``score``.
    """

    def __init__(self, output_format: Format) -> None:
        self.format = output_format
        self._example_cls: Any = example_class() if output_format == "tfrecord" else None

    def encode(self, record: Record, result: Translated) -> bytes:
        if self.format == "tfrecord":
            return self._example(record, result)
        if self.format == "jsonl":
            if isinstance(record.original, dict):
                obj = dict(record.original)
            else:
                obj = {"index": record.index, "source": record.source}
                if record.reference is not None:
                    obj["reference"] = record.reference
            obj[OUTPUT_KEY] = result.text
            score = _float_or_nan(result.score)
            obj[SCORE_KEY] = score if math.isfinite(score) else None
            return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")
        return (result.text.replace("\r", " ").replace("\n", " ") + "\n").encode("utf-8")

    def _example(self, record: Record, result: Translated) -> bytes:
        example = record.original
        if example is None or not hasattr(example, "features"):
            example = self._example_cls()
            example.features.feature["inputs"].bytes_list.value.append(record.source.encode("utf-8"))
            if record.reference is not None:
                example.features.feature["targets"].bytes_list.value.append(record.reference.encode("utf-8"))
        features = example.features.feature
        features[OUTPUT_KEY].Clear()
        features[OUTPUT_KEY].bytes_list.value.append(result.text.encode("utf-8"))
        features[SCORE_KEY].Clear()
        features[SCORE_KEY].float_list.value.append(_float_or_nan(result.score))
        # deterministic: map entries in key order, so reruns and resumed runs write identical bytes.
        data: bytes = example.SerializeToString(deterministic=True)
        return data


def encode_items(items: Sequence[bytes], output_format: Format) -> bytes:
    """The bytes of a file holding ``items``: TFRecord frames (framed by tensorflow's writer), else the items as
    they are.

    tensorflow's writer runs on its in-memory filesystem (``ram://``), so that the caller writes the file itself,
    atomically and with one kind of error (a full disk is an OSError, not a tensorflow exception).
    """
    if output_format != "tfrecord":
        return b"".join(items)
    import tensorflow as tf

    path = f"ram://batch-score/{os.getpid()}-{next(_RAM_NAMES)}.tfrecord"
    try:
        with tf.io.TFRecordWriter(path) as writer:
            for item in items:
                writer.write(item)
        with tf.io.gfile.GFile(path, "rb") as f:
            data: bytes = f.read()
    finally:
        if tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)
    return data


_RAM_NAMES = itertools.count()
