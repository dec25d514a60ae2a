"""The benchmark's workload: source sentences, turned into the token ids every engine gets.

A random-weight model gets random ids with the sentences' lengths (``TOKENS_PER_WORD`` per word); a real model the
package tokenizer's ids of the sentences.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from serving.package import Manifest

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SENTENCES = ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz"
DEFAULT_REFERENCES = ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.de.gz"
TOKENS_PER_WORD = 1.4


class WorkloadError(Exception):
    """The sentences cannot make a workload (reported as a usage error)."""


def read_sentences(path: Path, count: int) -> list[str]:
    """The first ``count`` non-empty lines of a text file (``.gz`` read as gzip)."""
    opener = gzip.open if path.suffix == ".gz" else open
    lines: list[str] = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                lines.append(line)
                if len(lines) == count:
                    break
    return lines


def random_ids_like(texts: Sequence[str], vocab_size: int, special: Sequence[int], seed: int,
                    tokens_per_word: float = TOKENS_PER_WORD) -> list[list[int]]:
    """Random source ids: ``round(words x tokens_per_word)`` (>= 1) ids per text, none of them special."""
    rng = np.random.default_rng(seed)
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(list(special), dtype=np.int64))
    sentences: list[list[int]] = []
    for text in texts:
        n = max(1, round(len(text.split()) * tokens_per_word))
        sentences.append(rng.choice(allowed, size=n).astype(int).tolist())
    return sentences


def special_ids(manifest: Manifest) -> list[int]:
    """The package's special token ids (pad, eos, unk, decoder start) that a random source must avoid."""
    special = manifest.special_ids
    return [i for i in (special.pad, special.eos, special.unk, special.decoder_start) if i is not None]


def build_workload(sentences_file: Path, count: int, package: Path, *, random: bool,
                   seed: int) -> tuple[list[list[int]], str]:
    """The source ids of the run and where they came from (for the report).

    Arguments:
        sentences_file: source sentences, one per line.
        count: how many of them.
        package: the mtgate package converted from the model (its tokenizer, vocabulary size, special ids).
        random: random ids of the sentences' lengths (a random-weight model) instead of the tokenizer's.
        seed: seed of the random ids.

    Raises:
        WorkloadError: the file has no sentences.
    """
    from serving.engine.tokenizers import load_tokenizer
    from serving.package import open_package

    texts = read_sentences(sentences_file, count)
    if not texts:
        raise WorkloadError(f"{sentences_file}: no sentences")
    manifest = open_package(package).manifest
    if random:
        vocab = manifest.architecture.source_vocab_size
        return (random_ids_like(texts, vocab, special_ids(manifest), seed),
                f"random ids, {TOKENS_PER_WORD} per word of {sentences_file.name}")
    tokenizer = load_tokenizer(package, manifest.tokenizer.to_dict())
    return [tokenizer.encode(t) for t in texts], f"{sentences_file.name} tokenized by the package tokenizer"


def workload_summary(sentences: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Sentence count and source lengths (EOS included) for the report."""
    lengths = np.array([len(s) + 1 for s in sentences])  # + EOS
    return {
        "sentences": len(sentences),
        "source_tokens_incl_eos": {"total": int(lengths.sum()), "mean": round(float(lengths.mean()), 2),
                                   "min": int(lengths.min()), "max": int(lengths.max())},
    }
