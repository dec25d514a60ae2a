"""TFRecord framing, and the record positions of one input file: what a record's bytes are, before any parsing.

TFRecord framing (``tensorflow/core/lib/io/record_writer.cc``): ``uint64 length``, ``uint32 masked_crc32c(length)``,
``data``, ``uint32 masked_crc32c(data)``, all little-endian. Both checksums are verified here, without tensorflow
(tests/batch/test_batch_records.py reads files tensorflow wrote and compares). A TFRecord whose framing is
broken (bad length checksum, a truncated tail, a data checksum mismatch) still yields an :class:`Entry`, with
``error`` set, so that it is counted and reported instead of stopping the run; after a corrupt length the scan
resynchronises at the next offset where a valid record begins.

JSONL: one entry per non-blank line. Plain text: one entry per line (blank lines too, so that the output stays
line-aligned), with the reference file's line beside it.

Entries are numbered from ``start`` (the caller numbers them over all files). Only the entries the caller wants
(``want(index)``) carry their bytes; the others are skipped with a seek.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Format = Literal["tfrecord", "jsonl", "text"]
FORMATS: tuple[str, ...] = ("tfrecord", "jsonl", "text")

HEADER = struct.Struct("<QI")
_FOOTER_BYTES = 4
_READ_BLOCK = 1 << 20


# ---------------------------------------------------------------------------------------------------------------
# crc32c (Castagnoli): google-crc32c's C implementation (SSE4.2), or its own pure-Python one where the wheel has none.


def crc32c(data: bytes) -> int:
    """CRC-32C of ``data``."""
    import google_crc32c

    return int(google_crc32c.value(data))


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked checksum: rotate right by 15 and add a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One TFRecord frame around ``data``, as tensorflow's ``TFRecordWriter`` writes it (no compression)."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def looks_like_tfrecord(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) starts with a valid TFRecord length header."""
    if len(head) < HEADER.size:
        return False
    _, crc = HEADER.unpack_from(head)
    return bool(masked_crc32c(head[:8]) == crc)


def encode_items(items: Sequence[bytes], output_format: Format) -> bytes:
    """The bytes of a file holding ``items``: TFRecord frames, else the items as they are (the caller writes the
    file itself, atomically)."""
    if output_format != "tfrecord":
        return b"".join(items)
    return b"".join(frame_record(item) for item in items)


# ---------------------------------------------------------------------------------------------------------------
# Record positions


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


def _read_data(f: Any, offset: int, length: int) -> bytes | None:
    """The data of the record whose header is at ``offset``, or None when its data checksum does not match."""
    f.seek(offset + HEADER.size)
    block = f.read(length + _FOOTER_BYTES)
    data, footer = block[:length], block[length:]
    if len(footer) != _FOOTER_BYTES or masked_crc32c(data) != int.from_bytes(footer, "little"):
        return None
    return bytes(data)


def scan_tfrecord(path: Path, start: int, want: Callable[[int], bool]) -> Iterator[Entry]:
    name = str(path)
    size = path.stat().st_size
    index = start
    offset = 0
    with path.open("rb") as f:
        while offset < size:
            f.seek(offset)
            header = f.read(HEADER.size)
            if len(header) < HEADER.size:
                yield Entry(index, name, offset, error=f"truncated record header at byte {offset} "
                                                        f"({len(header)} of {HEADER.size} bytes)")
                return
            length, length_crc = HEADER.unpack(header)
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
            end = offset + HEADER.size + length + _FOOTER_BYTES
            if end > size:
                yield Entry(index, name, offset, error=f"truncated record at byte {offset}: needs "
                                                        f"{end - offset} bytes, the file has {size - offset}")
                return
            if want(index):
                data = _read_data(f, offset, length)
                if data is None:
                    yield Entry(index, name, offset, error=f"corrupt record data at byte {offset} "
                                                            f"(data checksum mismatch)")
                else:
                    yield Entry(index, name, offset, data=data)
            else:
                yield Entry(index, name, offset)
            index += 1
            offset = end


def _resync(f: Any, path: Path, start: int, size: int) -> int | None:
    """First offset >= start where a valid record begins (header and data checksums), or None."""
    pos = start
    while pos + HEADER.size <= size:
        f.seek(pos)
        block = f.read(_READ_BLOCK + HEADER.size)
        limit = len(block) - HEADER.size
        for i in range(limit + 1):
            length, crc = HEADER.unpack_from(block, i)
            candidate = pos + i
            if candidate + HEADER.size + length + _FOOTER_BYTES > size:
                continue
            if masked_crc32c(block[i:i + 8]) != crc:
                continue
            if _read_data(f, candidate, length) is None:
                continue  # a false candidate; keep looking
            return candidate
        pos += limit + 1
    return None


def _split_line(raw: bytes) -> bytes:
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    return raw


def scan_jsonl(path: Path, start: int, want: Callable[[int], bool]) -> Iterator[Entry]:
    name = str(path)
    index = start
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, 1):
            if not raw.strip():
                continue  # blank lines are not records
            yield Entry(index, name, line_no, data=_split_line(raw) if want(index) else None)
            index += 1


def scan_text(path: Path, references: Path | None, start: int, want: Callable[[int], bool]) -> Iterator[Entry]:
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


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__

