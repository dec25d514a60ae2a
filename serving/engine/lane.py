"""One lane of step-level batching (``serving.engine.continuous``): a decode batch whose rows are at different steps.

The rows of one search (sentences with the same search options) are contiguous in the lane's logical order: a
*block*. How rows at different steps share one decoder call is the rows kind's (``serving.engine.rows``): in the slots of a
stationary cache, each row at its own position with nothing masked (so one lane holds any mix of steps), or in a
growing cache where a row that joins late gets masked slots (so ``serving.engine.continuous`` opens a new lane once a lane's
cache is wide). Source lengths differ too: the encoder outputs are padded to the longest source and masked by
``src_bias``, as in a request-level batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from serving.engine.backends import Backend
from serving.engine.decoding import (
    OnTokens,
    Search,
    SearchOptions,
    join_prefixes,
    join_seeds,
    start_search,
)
from serving.engine.rows import DenseRows, is_identity, open_rows


@dataclass(frozen=True, eq=False)
class Joining:
    """Sentences that join a lane together with the same search options.

    Attributes:
        options: their search options.
        ids: ``[n]`` their sentence ids (in the search's ``results`` and ``on_tokens``).
        caps: ``[n]`` their caps on generated tokens, EOS included.
        rows: ``[n]`` their rows of the encoder outputs handed to :meth:`Lane.join`.
        seeds: ``[n]`` their sampling seeds, or None.
        prefixes: their target prefixes, or None.
        stream: their partial results are wanted (``on_tokens``); streamed and other sentences have searches of
            their own, so that only the streamed ones pay for it.
    """

    options: SearchOptions
    ids: np.ndarray
    caps: np.ndarray
    rows: np.ndarray
    seeds: np.ndarray | None = None
    prefixes: list[list[int]] | None = None
    stream: bool = False


@dataclass(eq=False)
class Block:
    """The rows of one search (all sentences of a lane with the same search options and streaming), contiguous in
    the lane."""

    options: SearchOptions
    search: Search
    rows: int
    stream: bool = False

    @property
    def key(self) -> tuple[SearchOptions, bool]:
        """What the sentences of one search share."""
        return self.options, self.stream


class Lane:
    """One decode batch: blocks of rows (one search per option set) over one set of rows (``serving.engine.rows``).

    Arguments:
        backend: the backend its decoder calls run on.
        long: it holds long sentences (``serving.engine.continuous``: stepped less often while short ones run).
    """

    def __init__(self, backend: Backend, *, long: bool = False) -> None:
        self.backend = backend
        self.long = long
        self.blocks: list[Block] = []
        self.decode_rows = open_rows(backend)
        self._tokens = np.zeros((0, 1), dtype=np.int64)

    @property
    def rows(self) -> int:
        return int(self._tokens.shape[0])

    @property
    def width(self) -> int:
        """Masked cache slots a row joining now would carry (0 for a stationary cache)."""
        return self.decode_rows.width

    def join(self, joining: list[Joining], cross_kv: np.ndarray, src_bias: np.ndarray, on_tokens: OnTokens,
             candidates: np.ndarray | None = None) -> None:
        """Add the joining sentences' rows (position 0) as new blocks at the end, one per search options (and
        streaming: ``on_tokens`` is the streamed searches' hook); after their first step they merge into the block of
        their options (:meth:`step`). ``joining[i].rows``: their rows of ``cross_kv``/``src_bias``."""
        by_key: dict[tuple[SearchOptions, bool], list[Joining]] = {}
        for joiner in joining:
            by_key.setdefault((joiner.options, joiner.stream), []).append(joiner)
        sources = [np.arange(self.rows)]
        tokens = [self._tokens]
        for (options, stream), members in by_key.items():
            ids = np.concatenate([member.ids for member in members])
            caps = np.concatenate([member.caps for member in members])
            seeds = join_seeds([(m.ids.size, m.seeds) for m in members])
            prefixes = join_prefixes([(m.ids.size, m.prefixes) for m in members])
            # A beam sentence's first step decodes one row, not K identical ones (the K rows appear with the first
            # plan); the new block merges into its options' block after that step.
            search = start_search(caps, options, on_tokens if stream else None, ids=ids, prefixes=prefixes,
                                  seeds=seeds)
            rows = np.repeat(np.concatenate([member.rows for member in members]), search.tokens.shape[0] // ids.size)
            self.blocks.append(Block(options, search, rows.size, stream))
            sources.append(-1 - rows)  # encoder row j is source -1 - j
            tokens.append(search.tokens)
        self.decode_rows.arrange(np.concatenate(sources), cross_kv, src_bias, candidates)
        self._tokens = np.concatenate(tokens)

    def detach(self) -> None:
        """Copy the cache out of the backend's reused buffers (another lane's step would overwrite them)."""
        self.decode_rows.detach()

    def step(self, deliver: Callable[[Search], None], *, private: bool = False) -> None:
        """One decoder call for the lane's rows; each search advances on its slice and ``deliver`` collects what it
        finished. ``private``: keep the next cache in an array of the lane's own, not in the backend's reused
        buffers (other lanes use the backend too). Raises what the runtime raises."""
        if not self.blocks:
            return
        if isinstance(self.decode_rows, DenseRows):
            self.decode_rows.private = private
        log_probs = self.decode_rows.decode(self._tokens)
        rows: list[np.ndarray] = []
        encoder_rows: list[np.ndarray] = []
        tokens: list[np.ndarray] = []
        kept: list[Block] = []
        offset = 0
        for block in self.blocks:
            size = block.rows
            plan = block.search.advance(log_probs[offset : offset + size], self.decode_rows.columns)
            deliver(block.search)
            if plan is not None:
                rows.append(offset + plan.rows)
                encoder_rows.append(offset + (np.arange(size) if plan.encoder_rows is None else plan.encoder_rows))
                tokens.append(plan.tokens)
                block.rows = plan.rows.size
                kept.append(block)
            offset += size
        self.blocks = kept
        if not kept:
            self._clear()
            return
        self._tokens = np.concatenate(tokens)
        self.decode_rows.advance(np.concatenate(rows), np.concatenate(encoder_rows))
        self._merge_blocks()

    def remove(self, ids: np.ndarray) -> None:
        """Drop the sentences ``ids`` (requests nobody waits for)."""
        index: list[np.ndarray] = []
        kept: list[Block] = []
        offset = 0
        for block in self.blocks:
            size = block.rows
            rows = block.search.remove(ids)
            if rows is not None:
                index.append(offset + rows)
                block.rows = rows.size
                kept.append(block)
            offset += size
        self.blocks = kept
        if kept:
            keep = np.concatenate(index)
            self.decode_rows.arrange(keep)
            self._tokens = self._tokens[keep]
        else:
            self._clear()

    def _merge_blocks(self) -> None:
        """One block per search options and streaming: blocks that joined merge into the first block of their key (their rows
        move next to its rows; with a stationary cache that moves no data, and blocks usually are next to each other
        already)."""
        by_key: dict[tuple[SearchOptions, bool], list[int]] = {}
        for index, block in enumerate(self.blocks):
            by_key.setdefault(block.key, []).append(index)
        if len(by_key) == len(self.blocks):
            return
        starts = np.cumsum([0] + [block.rows for block in self.blocks])
        blocks: list[Block] = []
        order: list[np.ndarray] = []
        for indices in by_key.values():
            main = self.blocks[indices[0]]
            for index in indices:
                order.append(np.arange(starts[index], starts[index + 1]))
                if index != indices[0]:
                    main.search.join(self.blocks[index].search)
                    main.rows += self.blocks[index].rows
            blocks.append(main)
        self.blocks = blocks
        sources = np.concatenate(order)
        if not is_identity(sources, self.rows):
            self.decode_rows.arrange(sources)
            self._tokens = self._tokens[sources]

    def _clear(self) -> None:
        self.decode_rows = open_rows(self.backend)
        self._tokens = np.zeros((0, 1), dtype=np.int64)
