"""serving.engine.rows against a fake stationary backend: random joins, beam reorders, removals and growth, with each
logical row's cache and encoder outputs checked against the history it should have."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from serving.engine.native import native_core
from serving.engine.rows import SlotRows
from serving.engine.rows import slots as slots_module
from serving.package import MASK_VALUE
from tests.utils.stationary import FakeStationary, encoded


@pytest.mark.parametrize("identity_share", [0.0, 0.5])
@pytest.mark.parametrize("seed", range(6))
def test_random_histories_keep_their_caches_and_encoder_rows(seed: int, identity_share: float) -> None:
    """``identity_share``: the share of plans in which every row continues itself (greedy search's)."""
    rng = np.random.default_rng(seed)
    rows = SlotRows(FakeStationary(), slots=2, positions=2)  # small: grown many times
    history: list[list[int]] = []  # per logical row: the tokens it fed, in order
    source: list[tuple[np.ndarray, int]] = []  # per logical row: its encoder row (cross [L,2,H,S,Dh]) and length
    token = 1
    for _ in range(60):
        action = rng.random()
        if action < 0.3 or not history:  # rows join at position 0
            count = int(rng.integers(1, 5))
            cross, bias, lengths = encoded(rng, count, int(rng.integers(1, 12)))
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
            if identity_share and rng.random() < identity_share:
                parents = np.arange(len(history))
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


class CountingCore:
    """The native core, counting its slot assignments."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.assignments = 0

    def assign_slots(self, *args: Any) -> Any:
        self.assignments += 1
        return self.inner.assign_slots(*args)


def test_a_plan_where_every_row_continues_itself_moves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy search's plan (every row continues itself): the step's only call into the native core is the
    search's own; the slots stay, each position moves on."""
    core = native_core()
    if core is None:
        pytest.skip("the native core is not built")
    counting = CountingCore(core)
    monkeypatch.setattr(slots_module, "native_core", lambda: counting)
    rows = SlotRows(FakeStationary(), slots=2, positions=2)
    cross, bias, _ = encoded(np.random.default_rng(0), 3, 5)
    rows.arrange(-1 - np.arange(3), cross, bias)
    rows.decode(np.array([[1], [2], [3]]))
    rows.advance(np.array([2, 0, 1]), None)  # a reorder: the core assigns the slots
    assert counting.assignments == 2
    slot = rows.slot.copy()
    for step in range(5):  # past the cache's first capacity: it grows in decode, not in advance
        rows.decode(np.array([[4], [5], [6]]) + step)
        rows.advance(np.arange(3), None)
    assert counting.assignments == 2
    np.testing.assert_array_equal(rows.slot, slot)
    np.testing.assert_array_equal(rows.positions[:3], 6)
