"""A fake stationary decoder for serving.engine.rows' SlotRows (tests/serving/test_rows.py, test_native_core.py): what the
stationary graph does to the cache, without a model."""

from __future__ import annotations

import numpy as np

from serving.package import MASK_VALUE

LAYERS, HEADS, HEAD_DIM, VOCAB = 2, 2, 8, 5


class FakeStationary:
    """``decode_in_place`` as the stationary graph does it to the cache: row ``i`` writes its token at its position
    (in every layer, kind, head and channel); log-probs say which row came out where (row ``order[i]``)."""

    stationary = True

    def __init__(self) -> None:
        self.calls = 0

    def decode_in_place(self, input_ids: np.ndarray, positions: np.ndarray, cache: np.ndarray, cross_kv: np.ndarray,
                        src_bias: np.ndarray, order: np.ndarray) -> np.ndarray:
        self.calls += 1
        n = input_ids.shape[0]
        assert cache.shape[2] >= n and cross_kv.shape[2] >= n and src_bias.shape[0] >= n
        for row in range(n):
            cache[:, :, row, :, int(positions[row]), :] = float(input_ids[row, 0])
        log_probs = np.zeros((n, VOCAB), dtype=np.float32)
        log_probs[:, 0] = order  # which input row each output row is
        return log_probs


def encoded(rng: np.random.Generator, count: int, width: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Random encoder outputs of ``count`` sentences, ``width`` positions wide: ``cross_kv``, ``src_bias`` (masked
    past each sentence's length) and the lengths."""
    lengths = [int(x) for x in rng.integers(1, width + 1, count)]
    cross = rng.standard_normal((LAYERS, 2, count, HEADS, width, HEAD_DIM)).astype(np.float32)
    bias = np.full((count, 1, 1, width), MASK_VALUE, dtype=np.float32)
    for row, length in enumerate(lengths):
        bias[row, :, :, :length] = 0.0
    return cross, bias, lengths
