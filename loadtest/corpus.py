"""The load tests' and the validation's sentence files: the bundled test set, and the one reader of sentence files
(``serving.package.text_files``: plain text or gzip, one sentence per line).
"""

from __future__ import annotations

from pathlib import Path

from serving.package.text_files import CorpusError, read_lines

__all__ = ["DEFAULT_REFERENCE", "DEFAULT_SOURCE", "CorpusError", "default_corpus", "read_lines"]

# The bundled Multi30k test set (models/data/multi30k/README.md), present in a source checkout.
_REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = _REPO_ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz"
DEFAULT_REFERENCE = _REPO_ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.de.gz"


def default_corpus() -> Path:
    """The bundled test set's source side, or raise CorpusError when this install has none."""
    if not DEFAULT_SOURCE.is_file():
        raise CorpusError(f"no bundled test set at {DEFAULT_SOURCE}; pass --corpus FILE")
    return DEFAULT_SOURCE
