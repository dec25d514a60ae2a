"""serving.engine.rows against a fake stationary backend: random joins, beam reorders, removals and growth, with each
logical row's cache and encoder outputs checked against the history it should have."""

from __future__ import annotations

import numpy as np
import pytest

from serving.engine.rows import SlotRows
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


def _encoded(rng: np.random.Generator, count: int, width: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    lengths = [int(x) for x in rng.integers(1, width + 1, count)]
    cross = rng.standard_normal((LAYERS, 2, count, HEADS, width, HEAD_DIM)).astype(np.float32)
    bias = np.full((count, 1, 1, width), MASK_VALUE, dtype=np.float32)
    for row, length in enumerate(lengths):
        bias[row, :, :, :length] = 0.0
    return cross, bias, lengths


@pytest.mark.parametrize("seed", range(6))
def test_random_histories_keep_their_caches_and_encoder_rows(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = SlotRows(FakeStationary(), slots=2, positions=2)  # small: grown many times
    history: list[list[int]] = []  # per logical row: the tokens it fed, in order
    source: list[tuple[np.ndarray, int]] = []  # per logical row: its encoder row (cross [L,2,H,S,Dh]) and length
    token = 1
    for _ in range(60):
        action = rng.random()
        if action < 0.3 or not history:  # rows join at position 0
            count = int(rng.integers(1, 5))
            cross, bias, lengths = _encoded(rng, count, int(rng.integers(1, 12)))
            picks = rng.integers(0, count, int(rng.integers(1, 5)))
            at = int(rng.integers(0, len(history) + 1))
            sources = np.concatenate([np.arange(at), -1 - picks, np.arange(at, len(history))])
            rows.arrange(sources, cross, bias)
            for offset, pick in enumerate(picks.tolist()):
                history.insert(at + offset, [])
                source.insert(at + offset, (cross[:, :, pick], lengths[pick]))
        elif action < 0.4:  # some rows leave
            keep = np.sort(rng.choice(len(history), int(rng.integers(0, len(history) + 1)), replace=False))
            rows.arrange(keep)
            history = [history[i] for i in keep.tolist()]
            source = [source[i] for i in keep.tolist()]
        else:  # a step, then a plan: every next row continues a parent (beam reorders: repeats and drops)
            tokens = np.arange(token, token + len(history)).reshape(-1, 1)
            token += len(history)
            log_probs = rows.decode(tokens)
            np.testing.assert_array_equal(log_probs[:, 0], rows.slot)  # row i came from its own slot
            history = [h + [int(t)] for h, t in zip(history, tokens[:, 0], strict=True)]
            parents = rng.integers(0, len(history), int(rng.integers(1, len(history) + 3)))
            rows.advance(parents, None)
            history = [list(history[p]) for p in parents.tolist()]
            source = [source[p] for p in parents.tolist()]
        if not history:
            continue
        assert rows.count == len(history)
        assert sorted(rows.slot.tolist()) == list(range(len(history)))  # one live row per slot, slots 0..n-1
        assert rows.cache is not None and rows.cross is not None and rows.src_bias is not None
        for logical, slot in enumerate(rows.slot.tolist()):
            filled = len(history[logical])
            assert rows.positions[slot] == filled
            np.testing.assert_array_equal(rows.cache[0, 0, slot, 0, :filled, 0], history[logical])
            cross, length = source[logical]
            assert rows.cross.shape[4] >= length
            np.testing.assert_array_equal(rows.cross[:, :, slot, :, :length], cross[:, :, :, :length])
            np.testing.assert_array_equal(rows.src_bias[slot, 0, 0, :length], 0.0)
            assert (rows.src_bias[slot, 0, 0, length:] == MASK_VALUE).all()
