"""Sentence files for the load tests and the validation test set: plain text or gzip, one sentence per line.

Stdlib only, so the locustfile can import it without pulling in the server.
"""

from __future__ import annotations

import gzip
from pathlib import Path

# The bundled Multi30k test set (models/data/multi30k/README.md), present in a source checkout.
_REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = _REPO_ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz"
DEFAULT_REFERENCE = _REPO_ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.de.gz"


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


def default_corpus() -> Path:
    """The bundled test set's source side, or raise CorpusError when this install has none."""
    if not DEFAULT_SOURCE.is_file():
        raise CorpusError(f"no bundled test set at {DEFAULT_SOURCE}; pass --corpus FILE")
    return DEFAULT_SOURCE
