"""A vocabulary shortlist (CTranslate2's ``vmap``, Marian's lexical shortlist): each source token names the target
tokens a translation of it is likely to use, and a decoder step scores only the union of a batch's candidates
instead of the whole target vocabulary.

The table is built from parallel data when a package is converted (``converters.shortlist``); it is stored in the
package as ``shortlist/table.npz`` with a decoder graph per ONNX Runtime artifact that takes the candidate ids
(``vocab_ids``) and returns the log-softmax over them (``converters.onnx_emitter.emit_decoder(shortlist=True)``).

Each sentence is restricted to *its own* candidates: the always-allowed tokens (the most frequent target tokens and
the special ids) and the candidates of its source tokens. A step runs the union of its rows' candidates through the
decoder, which masks each row's others (``vocab_bias``) before its log-softmax, so a sentence gets the same
distribution whatever it is batched with (CTranslate2 restricts a whole batch to the union). What that costs in BLEU was measured at conversion, on data the
converter named, and is recorded in the manifest's ``shortlist`` section.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serving.package import Artifact, Package, PackageError


@dataclass(frozen=True)
class Shortlist:
    """Candidate target ids per source id.

    Attributes:
        offsets: ``[Vs + 1]`` source id ``s``'s candidates are ``targets[offsets[s]:offsets[s + 1]]``.
        targets: the candidates of every source id, one after the other (int32).
        always: target ids every sentence may use (int32).
        target_vocab: the target vocabulary's size.
    """

    offsets: np.ndarray
    targets: np.ndarray
    always: np.ndarray
    target_vocab: int

    @property
    def source_vocab(self) -> int:
        return int(self.offsets.size - 1)

    def candidates(self, input_ids: np.ndarray) -> np.ndarray:
        """``[B, V]`` bool: the target ids each sentence of ``input_ids [B, S]`` may produce (ids outside the source
        vocabulary, such as padding beyond it, name none)."""
        rows, _ = input_ids.shape
        allowed = np.zeros((rows, self.target_vocab), dtype=bool)
        allowed[:, self.always] = True
        ids = np.asarray(input_ids, dtype=np.int64)
        valid = (ids >= 0) & (ids < self.source_vocab)
        row_of, source = np.nonzero(valid)
        source = ids[row_of, source]
        starts, ends = self.offsets[source], self.offsets[source + 1]
        counts = ends - starts
        if counts.sum():
            # every (row, candidate) pair: the candidates of each token, repeated for the row it is in
            position = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            allowed[np.repeat(row_of, counts), self.targets[np.repeat(starts, counts) + position]] = True
        return allowed

    def save(self, path: Path) -> None:
        """Write the table (``np.savez``, no pickles)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            np.savez(out, offsets=self.offsets.astype(np.int64), targets=self.targets.astype(np.int32),
                     always=self.always.astype(np.int32), target_vocab=np.int64(self.target_vocab))

    @classmethod
    def load(cls, path: Path, source_vocab: int, target_vocab: int) -> Shortlist:
        """Read a table written by :meth:`save` for a model of these vocabulary sizes.

        Raises:
            PackageError: not such a table, or one for other vocabulary sizes or with ids outside them.
        """
        try:
            with np.load(path, allow_pickle=False) as data:
                offsets, targets, always = (np.asarray(data[k]) for k in ("offsets", "targets", "always"))
                vocab = int(data["target_vocab"])
        except (OSError, KeyError, ValueError) as e:
            raise PackageError(f"{path}: not a vocabulary shortlist table ({e})") from e
        problems = []
        if vocab != target_vocab:
            problems.append(f"it is for a target vocabulary of {vocab}, the model's has {target_vocab}")
        if offsets.size != source_vocab + 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 0) \
                or offsets[-1] != targets.size:
            problems.append(f"its offsets do not index {source_vocab} source ids into {targets.size} candidates")
        for name, ids in (("targets", targets), ("always", always)):
            if ids.size and (ids.min() < 0 or ids.max() >= target_vocab):
                problems.append(f"{name} has ids outside the target vocabulary")
        if problems:
            raise PackageError(f"{path}: " + "; ".join(problems))
        return cls(offsets.astype(np.int64), targets.astype(np.int64), always.astype(np.int64), vocab)



def open_shortlist(package: Package, artifact: Artifact) -> tuple[Path, Shortlist]:
    """The artifact's shortlist decoder and the package's table, checked against the model.

    Raises:
        PackageError: no shortlist for the artifact, a table that is not one for this model, or one that does not
            always allow EOS.
    """
    manifest = package.manifest
    decoder = manifest.shortlist_decoder(artifact)
    assert manifest.shortlist is not None
    table = Shortlist.load(package.path(manifest.shortlist["table"]), manifest.architecture.source_vocab_size,
                           manifest.architecture.target_vocab_size)
    if manifest.special_ids.eos not in table.always:
        raise PackageError(f"{package.root}: the vocabulary shortlist does not always allow EOS")
    return package.path(decoder), table


def allow_prefixes(candidates: np.ndarray | None, rows: np.ndarray, prefixes: list[list[int]] | None) -> None:
    """Let sentence ``rows[i]`` of ``candidates [B, V]`` produce the ids of its forced target prefix ``prefixes[i]``
    (in place; nothing to do without a shortlist or prefixes)."""
    if candidates is None or not prefixes:
        return
    for row, prefix in zip(np.asarray(rows).tolist(), prefixes, strict=True):
        candidates[row, prefix] = True
