"""One lane of step-level batching (``serving.continuous``): a dense decode batch whose rows are at different steps.

Rows at different steps share one decoder call because the decoder-step graph takes a position per row
(``position_ids``) and a mask over the self-attention cache (``self_bias``): rows that join when the cache holds
``T`` steps get ``T`` masked (zero) slots; the cache is cut from the left as soon as no row needs its oldest slots.
Source lengths differ too: the encoder outputs are padded to the longest source and masked by ``src_bias``, as in a
request-level batch. The rows of one search (sentences with the same search options) are contiguous: a *block*.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from serving.backends import Backend
from serving.decoding import (
    OnTokens,
    Search,
    SearchOptions,
    is_identity,
    join_prefixes,
    join_seeds,
    start_search,
    take_rows,
)
from serving.package import MASK_VALUE


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
    """

    options: SearchOptions
    ids: np.ndarray
    caps: np.ndarray
    rows: np.ndarray
    seeds: np.ndarray | None = None
    prefixes: list[list[int]] | None = None


@dataclass(eq=False)
class Block:
    """The rows of one search (all sentences of a lane with the same search options), contiguous in the lane."""

    options: SearchOptions
    search: Search
    rows: int


class Lane:
    """One dense batch: blocks of rows (one search per option set) and the arrays of the decoder step."""

    _tokens: np.ndarray
    _positions: np.ndarray
    _past: np.ndarray | None
    _cross_kv: np.ndarray | None
    _src_bias: np.ndarray | None
    _self_bias: np.ndarray

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.blocks: list[Block] = []
        self._clear()

    @property
    def rows(self) -> int:
        return int(self._tokens.shape[0])

    @property
    def width(self) -> int:
        """Cache slots (the steps of its oldest row)."""
        return 0 if self._past is None else int(self._past.shape[4])

    def join(self, joining: list[Joining], cross_kv: np.ndarray, src_bias: np.ndarray, on_tokens: OnTokens) -> None:
        """Append the joining sentences' rows (position 0, an all-masked cache) after the block of their search
        options (a new option set gets a new block); ``joining[i].rows``: their rows of ``cross_kv``/``src_bias``."""
        by_options: dict[SearchOptions, list[Joining]] = {}
        for joiner in joining:
            by_options.setdefault(joiner.options, []).append(joiner)
        pieces: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # block index -> (new tokens, their encoder rows)
        for options, members in by_options.items():
            ids = np.concatenate([member.ids for member in members])
            caps = np.concatenate([member.caps for member in members])
            seeds = join_seeds([(m.ids.size, m.seeds) for m in members])
            prefixes = join_prefixes([(m.ids.size, m.prefixes) for m in members])
            search = start_search(caps, options, on_tokens, ids=ids, joinable=True, prefixes=prefixes, seeds=seeds)
            rows = np.repeat(np.concatenate([member.rows for member in members]), search.tokens.shape[0] // ids.size)
            index = next((i for i, block in enumerate(self.blocks) if block.options == options), None)
            if index is None:
                self.blocks.append(Block(options, search, 0))
                index = len(self.blocks) - 1
            else:
                self.blocks[index].search.join(search)
            pieces[index] = (search.tokens, rows)
        self._insert_rows(pieces, cross_kv, src_bias)

    def detach(self) -> None:
        """Copy the cache out of the backend's reused buffers (another lane's step would overwrite them)."""
        if self._past is not None:
            self._past = np.array(self._past)

    def step(self, deliver: Callable[[Search], None], *, private: bool = False) -> None:
        """One decoder call for the lane's rows; each search advances on its slice and ``deliver`` collects what it
        finished. ``private``: keep the next cache in an array of the lane's own, not in the backend's reused
        buffers (other lanes use the backend too). Raises what the runtime raises."""
        if not self.blocks:
            return
        assert self._past is not None and self._cross_kv is not None and self._src_bias is not None
        log_probs, present = self.backend.decode_step(
            self._tokens, self._positions, self._past, self._cross_kv, self._src_bias, self._self_bias
        )
        rows: list[np.ndarray] = []
        encoder_rows: list[np.ndarray] = []
        tokens: list[np.ndarray] = []
        kept: list[Block] = []
        offset = 0
        for block in self.blocks:
            size = block.rows
            plan = block.search.advance(log_probs[offset : offset + size])
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
        self._advance_rows(present, np.concatenate(rows), np.concatenate(encoder_rows), private)

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
            self._keep_rows(np.concatenate(index))
        else:
            self._clear()

    def _clear(self) -> None:
        self._tokens = np.zeros((0, 1), dtype=np.int64)
        self._positions = np.zeros(0, dtype=np.int64)
        self._past = self._cross_kv = self._src_bias = None
        self._self_bias = np.zeros((0, 1, 1, 0), dtype=np.float32)

    def _insert_rows(
        self, pieces: dict[int, tuple[np.ndarray, np.ndarray]], cross_kv: np.ndarray, src_bias: np.ndarray
    ) -> None:
        """Rebuild the batch with each block's new rows after its old ones (``pieces[block] = (tokens, rows of
        cross_kv/src_bias)``): new rows are at position 0 with an all-masked cache."""
        layers, _, _, heads, _, head_dim = cross_kv.shape
        width = cross_kv.shape[4] if self._cross_kv is None else max(self._cross_kv.shape[4], cross_kv.shape[4])
        new_cross, new_bias = _pad_source(cross_kv, src_bias, width)
        if self._cross_kv is None or self._src_bias is None or self._past is None:
            old_cross = np.zeros((layers, 2, 0, heads, width, head_dim), dtype=np.float32)
            old_bias = np.zeros((0, 1, 1, width), dtype=np.float32)
            old_past = np.zeros((layers, 2, 0, heads, 0, head_dim), dtype=np.float32)
        else:
            old_cross, old_bias = _pad_source(self._cross_kv, self._src_bias, width)
            old_past = self._past
        past_len = old_past.shape[4]
        # Block by block: its old rows, then its new ones. Each array is built with one concatenation of slices.
        old_slices: list[slice] = []
        new_slices: list[np.ndarray] = []
        offset = 0
        for index, block in enumerate(self.blocks):
            old_slices.append(slice(offset, offset + block.rows))
            offset += block.rows
            new_slices.append(pieces[index][1] if index in pieces else np.zeros(0, dtype=np.int64))
            block.rows += new_slices[-1].size
        added = sum(rows.size for rows in new_slices)
        fresh_past = np.zeros((layers, 2, added, heads, past_len, head_dim), dtype=np.float32)
        masked = np.full((added, 1, 1, past_len), MASK_VALUE, dtype=np.float32)
        fresh_tokens = [pieces[i][0] if i in pieces else np.zeros((0, 1), np.int64) for i in range(len(self.blocks))]
        cross, bias, past, self_bias, tokens, positions = [], [], [], [], [], []
        start = 0
        for old, new, new_tokens in zip(old_slices, new_slices, fresh_tokens, strict=True):
            cross += [old_cross[:, :, old], np.take(new_cross, new, axis=2)]
            bias += [old_bias[old], np.take(new_bias, new, axis=0)]
            fresh = slice(start, start + new.size)
            start += new.size
            past += [old_past[:, :, old], fresh_past[:, :, fresh]]
            self_bias += [self._self_bias[old], masked[fresh]]
            tokens += [self._tokens[old], new_tokens]
            positions += [self._positions[old], np.zeros(new.size, dtype=np.int64)]
        self._cross_kv = np.concatenate(cross, axis=2)
        self._src_bias = np.concatenate(bias)
        self._past = np.concatenate(past, axis=2)
        self._self_bias = np.concatenate(self_bias)
        self._tokens = np.concatenate(tokens)
        self._positions = np.concatenate(positions)

    def _advance_rows(self, present: np.ndarray, rows: np.ndarray, encoder_rows: np.ndarray, private: bool) -> None:
        """The next step's arrays: the cache rows ``rows`` of ``present`` (cut from the left where no row has
        anything), their positions and masks; the encoder rows ``encoder_rows``."""
        assert self._cross_kv is not None and self._src_bias is not None
        positions = self._positions[rows] + 1  # = the cache slots each row has filled (the last ones)
        cut = present.shape[4] - int(positions.max())
        self_bias = np.concatenate([self._self_bias, np.zeros(self._self_bias.shape[:3] + (1,), np.float32)], axis=3)
        if cut or not is_identity(rows, present.shape[2]):
            source = present[:, :, :, :, cut:] if cut else present
            self._past = np.take(source, rows, axis=2) if private else take_rows(self.backend, source, rows)
            self._self_bias = np.ascontiguousarray(self_bias[rows, :, :, cut:])
        else:
            self._past = np.array(present) if private else present
            self._self_bias = self_bias
        if not is_identity(encoder_rows, self._src_bias.shape[0]):
            self._cross_kv = np.take(self._cross_kv, encoder_rows, axis=2)
            self._src_bias = np.take(self._src_bias, encoder_rows, axis=0)
        self._positions = positions

    def _keep_rows(self, index: np.ndarray) -> None:
        """Keep only the rows ``index`` (in that order) of every array."""
        assert self._past is not None and self._cross_kv is not None and self._src_bias is not None
        self._past = np.take(self._past, index, axis=2)
        self._cross_kv = np.take(self._cross_kv, index, axis=2)
        self._src_bias = np.take(self._src_bias, index, axis=0)
        self._self_bias = self._self_bias[index]
        self._positions = self._positions[index]
        self._tokens = self._tokens[index]


def _pad_source(cross_kv: np.ndarray, src_bias: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Encoder outputs padded to ``width`` source positions (zeros, masked)."""
    pad = width - cross_kv.shape[4]
    if pad == 0:
        return cross_kv, src_bias
    cross = np.pad(cross_kv, [(0, 0)] * 4 + [(0, pad), (0, 0)])
    bias = np.pad(src_bias, [(0, 0)] * 3 + [(0, pad)], constant_values=MASK_VALUE)
    return cross, bias
