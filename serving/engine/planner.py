"""The one batch planner: in which order sentences are decoded and how they are cut into batches, under one budget.

The budget (:class:`BatchBudget`, named as the settings name it) bounds one engine batch by

- ``max_batch_size``: sentences (None: no bound of its own), and
- ``max_batch_tokens``: padded source tokens times beams, ``sentences x beams x longest source`` (EOS included): the
  decoder's rows (a sentence decodes ``beams`` rows) times the source length every row attends to.

A sentence over the budget on its own still runs, alone. :func:`plan` sorts sentences by decreasing length (ties in
their given order: the order the encoder wants, ``serving.engine.encoding``) and cuts them from the longest down, each
batch as full as the budget lets it be. Everything that batches uses it, so that a batch is cut once:

- the engine (``Translator.run`` and reference scoring): its sub-batches;
- ``batch-score``'s local worker: a chunk's batches, under the budget the engine was loaded with (its flags), so the
  engine decodes each as one sub-batch;
- the server's dynamic batcher (``serving.server.batching.dynamic``): its choice of which queued sentences run together
  stays its own (whole requests, oldest first), but it cuts under the budget the engine was loaded with
  (``MTGATE_MAX_BATCH_SIZE``, ``MTGATE_MAX_BATCH_TOKENS``, through :meth:`BatchBudget.fits`), and hands the engine a
  batch the engine never cuts again (:func:`decode_together`).

Callers that name no budget (``mtgate translate``, ``mtgate score``, ``mtgate validate``, the Triton model) get
:data:`DEFAULT_BUDGET`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from serving.engine.decoding import Alive
from serving.engine.errors import InferenceFailed
from serving.engine.request import Engine, OnPartial, Prepared, Sentence, Translation


@dataclass(frozen=True)
class BatchBudget:
    """What one engine batch may hold (module docstring).

    Attributes:
        max_batch_size: most sentences in one batch; None: only ``max_batch_tokens`` bounds it.
        max_batch_tokens: most padded source tokens times beams: ``sentences x beams x longest source`` (EOS
            included).
    """

    max_batch_size: int | None
    max_batch_tokens: int

    @staticmethod
    def cost(sentences: int, longest: int, beams: int = 1) -> int:
        """What a batch of ``sentences`` (the longest ``longest`` tokens, each decoding ``beams`` rows) counts
        against ``max_batch_tokens``."""
        return sentences * beams * longest

    def fits(self, sentences: int, longest: int, beams: int = 1) -> bool:
        """Whether a batch of ``sentences`` whose longest source has ``longest`` tokens stays within the budget."""
        if self.max_batch_size is not None and sentences > self.max_batch_size:
            return False
        return self.cost(sentences, longest, beams) <= self.max_batch_tokens

    def room(self, longest: int, beams: int = 1) -> int:
        """Most sentences of at most ``longest`` tokens one batch holds (at least 1: an over-long one runs alone)."""
        size = max(1, self.max_batch_tokens // max(1, longest * beams))
        return size if self.max_batch_size is None else max(1, min(size, self.max_batch_size))


DEFAULT_BUDGET = BatchBudget(max_batch_size=None, max_batch_tokens=4096)
"""The budget of an engine loaded without one (``serving.engine.translator.Translator.load``): ``mtgate translate``,
``score``, ``validate``, the Triton model, library callers. ``mtgate serve`` and ``batch-score`` pass their own
settings."""


def order(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """Indices of ``lengths`` by decreasing length, ties in their given order: the order sentences are decoded in."""
    return np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")


def plan(lengths: Sequence[int] | np.ndarray, budget: BatchBudget, beams: int = 1) -> list[np.ndarray]:
    """Cut sentences into batches: indices in :func:`order`, cut from the longest down so that each batch is as full
    as ``budget`` lets it be (each batch's indices in decreasing length).

    Arguments:
        lengths: each sentence's source tokens, EOS included.
        budget: what one batch may hold.
        beams: rows each sentence decodes (the search's beam width; 1 for greedy search, sampling and scoring).

    Returns:
        The batches, together holding every index once; a batch that needs no reordering is ``arange`` of them all.
    """
    array = np.asarray(lengths, dtype=np.int64)
    rows = order(array)
    batches: list[np.ndarray] = []
    start = 0
    while start < rows.size:
        size = budget.room(int(array[rows[start]]), beams)
        batches.append(rows[start : start + size])
        start += size
    return batches


def in_order(rows: np.ndarray) -> bool:
    """Whether ``rows`` are ``0, 1, 2, ...``: a batch to decode as it is (no gather)."""
    return bool(rows.size == 0 or (rows[0] == 0 and (rows.size == 1 or bool((np.diff(rows) == 1).all()))))


def decode_together(engine: Engine, sentences: Sequence[Sentence], on_partial: OnPartial | None = None,
                    alive: Alive | None = None) -> list[Translation]:
    """Decode sentences of one or more prepared requests (sharing their search options) as one batch: gathered once,
    in :func:`order`, so that an engine whose budget they fit decodes them without gathering them again.

    Arguments:
        engine: runs the batch.
        sentences: the batch (e.g. a dynamic batcher's, chosen under the engine's budget).
        on_partial: ``on_partial(i, text)`` for ``sentences[i]``.
        alive: ``alive(indexes)`` of ``sentences`` still decoding -> which are still wanted (``Engine.run``).

    Returns:
        One translation per sentence, in the order given.
    """
    rows = order([sentence.length for sentence in sentences])
    ordered = [sentences[int(i)] for i in rows]
    relay = None if on_partial is None else (lambda i, text: on_partial(int(rows[i]), text))
    wanted = None if alive is None else (lambda indexes: alive(rows[indexes]))
    translations = engine.run(Prepared.gather(ordered), relay, wanted)
    if len(translations) != len(sentences):
        raise InferenceFailed(f"engine returned {len(translations)} results for {len(sentences)} inputs")
    results: list[Translation | None] = [None] * len(sentences)
    for row, translation in zip(rows.tolist(), translations, strict=True):
        results[row] = translation
    return [t for t in results if t is not None]
