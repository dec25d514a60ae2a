"""Rows of a growing cache, in logical order (``serving.engine.rows``' docstring)."""

from __future__ import annotations

import numpy as np

from serving.engine.backends import Backend
from serving.engine.rows.base import is_identity, take_rows
from serving.package import MASK_VALUE


class DenseRows:
    """Rows of a growing cache, in logical order (module docstring).

    Arguments:
        backend: any backend (``decode_step``).
    """

    _past: np.ndarray | None
    _present: np.ndarray | None
    _cross_kv: np.ndarray | None
    _src_bias: np.ndarray | None
    _self_bias: np.ndarray | None

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.private = False  # keep the cache in arrays of its own, not the backend's reused buffers
        self.columns: np.ndarray | None = None  # no vocabulary shortlist here: a column per id
        self._positions = np.zeros(0, dtype=np.int64)
        self._past = self._present = self._cross_kv = self._src_bias = self._self_bias = None

    @property
    def count(self) -> int:
        return int(self._positions.size)

    @property
    def width(self) -> int:
        return 0 if self._past is None else int(self._past.shape[4])

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        assert self._past is not None and self._cross_kv is not None and self._src_bias is not None
        if self._self_bias is None:  # every row at the same position: one scalar step, nothing masked
            step = int(self._positions[0]) if self._positions.size else 0
            log_probs, self._present = self.backend.decode_step(tokens, step, self._past, self._cross_kv,
                                                                self._src_bias)
        else:
            log_probs, self._present = self.backend.decode_step(tokens, self._positions, self._past, self._cross_kv,
                                                                self._src_bias, self._self_bias)
        return log_probs

    def advance(self, parents: np.ndarray, encoder_rows: np.ndarray | None) -> None:
        present = self._present
        assert present is not None and self._cross_kv is not None and self._src_bias is not None
        self._present = None
        rows = np.asarray(parents, dtype=np.int64)
        positions = self._positions[rows] + 1  # = the cache slots each row has filled (the last ones)
        cut = present.shape[4] - int(positions.max()) if positions.size else 0
        self_bias = self._self_bias
        if self_bias is not None:
            self_bias = np.concatenate([self_bias, np.zeros(self_bias.shape[:3] + (1,), np.float32)], axis=3)
        if cut or not is_identity(rows, present.shape[2]):
            source = present[:, :, :, :, cut:] if cut else present
            self._past = (np.take(source, rows, axis=2) if self.private
                          else take_rows(self.backend, source, rows))
            if self_bias is not None:
                self_bias = np.ascontiguousarray(self_bias[rows, :, :, cut:])
        else:
            self._past = np.array(present) if self.private else present
        self._self_bias = None if self_bias is None or not self_bias.any() else self_bias
        if encoder_rows is not None and not is_identity(encoder_rows, self._src_bias.shape[0]):
            self._cross_kv = np.take(self._cross_kv, encoder_rows, axis=2)
            self._src_bias = np.take(self._src_bias, encoder_rows, axis=0)
        self._positions = positions

    def arrange(self, sources: np.ndarray, cross_kv: np.ndarray | None = None,
                src_bias: np.ndarray | None = None, candidates: np.ndarray | None = None) -> None:
        if candidates is not None:
            raise ValueError("a vocabulary shortlist needs a stationary decoder (SlotRows)")
        sources = np.asarray(sources, dtype=np.int64)
        new = sources < 0
        if not new.any():
            self._keep(sources)
            return
        assert cross_kv is not None and src_bias is not None
        layers, _, _, heads, _, head_dim = cross_kv.shape
        old = self.count
        width = cross_kv.shape[4] if self._cross_kv is None else max(self._cross_kv.shape[4], cross_kv.shape[4])
        past_len = self.width
        # The current rows, then the encoder rows; each array built with one take over the two.
        if self._past is None or self._cross_kv is None or self._src_bias is None:
            old_cross = np.zeros(cross_kv.shape[:2] + (0, heads, width) + cross_kv.shape[5:], dtype=np.float32)
            old_bias = np.zeros((0, 1, 1, width), dtype=np.float32)
            old_past = np.zeros((layers, 2, 0, heads, 0, head_dim), dtype=np.float32)
        else:
            old_cross, old_bias = _pad_source(self._cross_kv, self._src_bias, width)
            old_past = self._past
        new_cross, new_bias = _pad_source(cross_kv, src_bias, width)
        index = np.where(new, old - 1 - sources, sources)  # into [current rows, encoder rows]
        self._cross_kv = np.take(np.concatenate([old_cross, new_cross], axis=2), index, axis=2)
        self._src_bias = np.take(np.concatenate([old_bias, new_bias]), index, axis=0)
        fresh_past = np.zeros((layers, 2, int(new.sum()), heads, past_len, head_dim), dtype=np.float32)
        past_index = np.where(new, old + np.cumsum(new) - 1, sources)
        self._past = np.take(np.concatenate([old_past, fresh_past], axis=2), past_index, axis=2)
        old_self_bias = (np.zeros((old, 1, 1, past_len), np.float32) if self._self_bias is None
                         else self._self_bias)
        masked = np.full((int(new.sum()), 1, 1, past_len), MASK_VALUE, dtype=np.float32)
        self_bias = np.take(np.concatenate([old_self_bias, masked]), past_index, axis=0)
        self._self_bias = self_bias if self_bias.any() else None
        self._positions = np.where(new, 0, self._positions[np.where(new, 0, sources)] if old else 0)

    def detach(self) -> None:
        if self._past is not None:
            self._past = np.array(self._past)

    def _keep(self, index: np.ndarray) -> None:
        """Keep only the rows ``index`` (in that order) of every array."""
        if index.size == 0:
            self._positions = np.zeros(0, dtype=np.int64)
            self._past = self._present = self._cross_kv = self._src_bias = self._self_bias = None
            return
        assert self._past is not None and self._cross_kv is not None and self._src_bias is not None
        self._past = np.take(self._past, index, axis=2)
        self._cross_kv = np.take(self._cross_kv, index, axis=2)
        self._src_bias = np.take(self._src_bias, index, axis=0)
        if self._self_bias is not None:
            self._self_bias = self._self_bias[index]
        self._positions = self._positions[index]


def _pad_source(cross_kv: np.ndarray, src_bias: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Encoder outputs padded to ``width`` source positions (zeros, masked)."""
    pad = width - cross_kv.shape[4]
    if pad == 0:
        return cross_kv, src_bias
    cross = np.pad(cross_kv, [(0, 0)] * 4 + [(0, pad), (0, 0)])
    bias = np.pad(src_bias, [(0, 0)] * 3 + [(0, pad)], constant_values=MASK_VALUE)
    return cross, bias
