"""Input discovery: which files to read, in which format, with which reference files; and the record positions of
all of them, numbered in order (:func:`scan`, over :mod:`batch.framing`'s per-file scanners).

Arguments are paths or globs (``data-*.tfrecord``), expanded in sorted order and de-duplicated. The format comes
from the suffix, else from the first bytes (T2T datagen shards have no suffix); all inputs have one format.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from batch.errors import InputError, io_failure
from batch.framing import (
    FORMATS,
    Entry,
    Format,
    looks_like_tfrecord,
    scan_jsonl,
    scan_text,
    scan_tfrecord,
)

_SUFFIX_FORMATS: dict[str, Format] = {
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tfr": "tfrecord",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".txt": "text",
}
_GLOB_CHARS = frozenset("*?[")
_READ_BLOCK = 1 << 20


def _all(_: int) -> bool:
    return True


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
    if looks_like_tfrecord(head):
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
            n_src, n_ref = _lines_or_error(src), _lines_or_error(ref)
            if n_src != n_ref:
                raise InputError(f"{ref}: {n_ref} lines but {src} has {n_src}; references must align line by line")
        ref_paths = list(refs)
    return [InputFile(p, fmt, r) for p, r in zip(paths, ref_paths, strict=True)]


def _lines_or_error(path: Path) -> int:
    try:
        return count_lines(path)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from e


def count_lines(path: Path) -> int:
    """Lines of a text file (a last line without a newline counts)."""
    n = 0
    last = b"\n"
    with path.open("rb") as f:
        for block in iter(lambda: f.read(_READ_BLOCK), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (0 if last == b"\n" else 1)



def scan(inputs: Sequence[InputFile], want: Callable[[int], bool] = _all) -> Iterator[Entry]:
    """Yield every record position of the inputs in order, numbered over all files; entries for which
    ``want(index)`` is true carry their bytes.

    Raises:
        IOFailure: an input could not be read (the disk, not the data: a rerun resumes).
    """
    index = 0
    for item in inputs:
        if item.format == "tfrecord":
            entries = scan_tfrecord(item.path, index, want)
        elif item.format == "jsonl":
            entries = scan_jsonl(item.path, index, want)
        else:
            entries = scan_text(item.path, item.references, index, want)
        with io_failure(item.path, "read"):
            for entry in entries:
                yield entry
                index = entry.index + 1


def count_entries(inputs: Sequence[InputFile]) -> int:
    """Number of record positions (cheap: framing and line counting only)."""
    return sum(1 for _ in scan(inputs, want=lambda _i: False))
