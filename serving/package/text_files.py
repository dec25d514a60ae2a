"""Sentence files: plain text or gzip (detected from the magic bytes), UTF-8, one sentence per line; the reader of
every corpus mtgate takes (the validation test set, the load tests' corpus, the shortlist's parallel corpus).

Standard library only.
"""

from __future__ import annotations

import gzip
from pathlib import Path


class CorpusError(Exception):
    """A sentence file is missing, unreadable, not UTF-8 or empty (the message names the file)."""


def read_lines(path: Path, keep_empty: bool = False) -> list[str]:
    """Read one sentence per line from a text or ``.gz`` file.

    Arguments:
        path: the file; gzip is detected from its magic bytes, not its name.
        keep_empty: keep blank lines (a test set must stay aligned with its references); otherwise drop them.

    Returns:
        The lines without their line endings and surrounding whitespace.

    Raises:
        CorpusError: the file is missing, unreadable, not UTF-8, or has no sentence.
    """
    try:
        with path.open("rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        raw = gzip.decompress(path.read_bytes()) if gzipped else path.read_bytes()
        text = raw.decode("utf-8")
    except FileNotFoundError as e:
        raise CorpusError(f"{path}: no such file") from e
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise CorpusError(f"{path}: unreadable ({e})") from e
    except UnicodeDecodeError as e:
        raise CorpusError(f"{path}: not UTF-8 text ({e})") from e
    lines = [line.strip() for line in text.splitlines()]
    if not keep_empty:
        lines = [line for line in lines if line]
    if not any(lines):
        raise CorpusError(f"{path}: no sentences")
    return lines
