"""Rows in the slots of a stationary cache (``serving.engine.rows``' docstring)."""

from __future__ import annotations

import numpy as np

from serving.engine.backends import Backend
from serving.engine.native import native_core
from serving.package import MASK_VALUE

_MIN_SOURCE_WIDTH = 16  # the encoder outputs are never narrowed below this many positions


def _grown(size: int, needed: int) -> int:
    """A capacity of at least ``needed``, doubling from ``size``."""
    while size < needed:
        size *= 2
    return size


class SlotRows:
    """Rows in the slots of a stationary cache (module docstring).

    Which slot each next row takes, and the slot copies that go with it, are the native core's
    (``serving.engine.native``: ``assign_slots``, the GIL released) where it is built; :meth:`_assign_numpy` is
    its reference.

    Arguments:
        backend: a backend with ``decode_in_place`` (``stationary``).
        slots: initial slot capacity ``R`` (grows by doubling).
        positions: initial positions per slot ``M`` (grows by doubling).
        native: assign slots with the native core where it is built (False: with numpy).
    """

    def __init__(self, backend: Backend, *, slots: int = 8, positions: int = 32, native: bool = True) -> None:
        self._core = native_core() if native else None
        self.backend = backend
        self._decode = getattr(backend, "decode_in_place")  # noqa: B009 - the stationary backends' own method
        self._initial_slots = slots
        self._initial_capacity = positions
        self.cache: np.ndarray | None = None  # [L, 2, R, H, M, Dh]
        self.cross: np.ndarray | None = None  # [L, 2, R, H, S, Dh]
        self.src_bias: np.ndarray | None = None  # [R, 1, 1, S]
        self.positions = np.zeros(0, dtype=np.int64)  # [R] slots each slot's row has filled
        self.owner = np.zeros(0, dtype=np.int64)  # [R] which encoder row each slot's cross_kv is (-1: none)
        self.source_len = np.zeros(0, dtype=np.int64)  # [R] source positions each slot's encoder row needs
        # With a vocabulary shortlist: the live encoder rows (``owner``) -> ``[V]`` bool, the target ids the
        # sentence may produce (the encoder output's ``candidates``); empty without one.
        self.candidates: dict[int, np.ndarray] = {}
        self.columns: np.ndarray | None = None  # the ids of the last step's log-prob columns (None: every id)
        # The last union of candidates, the live sentences' masks over it ([u, K]) and their encoder rows (sorted).
        self._union = np.zeros(0, dtype=np.int64)
        self._sentence_bias = np.zeros((0, 0), dtype=np.float32)
        self._bias_owners = np.full(1, -1, dtype=np.int64)
        self._owners = 0  # encoder rows seen
        self.slot = np.zeros(0, dtype=np.int64)  # [n] logical row -> slot; the live slots are 0..n-1
        self._tokens = np.zeros((0, 1), dtype=np.int64)  # the step's tokens in slot order (the first n rows)
        self._range = b""  # the bytes of ``0..k-1`` as int64, for the identity plan's test

    @property
    def count(self) -> int:
        return int(self.slot.size)

    @property
    def width(self) -> int:
        return 0

    @property
    def native(self) -> bool:
        """Whether the native core assigns the slots."""
        return self._core is not None

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        n = self.count
        assert self.cache is not None and self.cross is not None and self.src_bias is not None
        needed = int(self.positions[:n].max()) + 1
        if needed > self.cache.shape[4]:
            self._reserve(n, needed)
        assert self.cache is not None
        if self._tokens.shape[0] < n:
            self._tokens = np.zeros((max(n, 2 * self._tokens.shape[0]), 1), dtype=np.int64)
        slot_tokens = self._tokens[:n]
        slot_tokens[self.slot] = tokens
        shortlist: list[np.ndarray] = []
        if self.candidates:  # the union of the rows' candidates, each row masked to its own
            shortlist = self._shortlist(n)
        # The decoder returns the log-probs in logical order (it gathers the final states by ``self.slot``).
        return np.asarray(self._decode(slot_tokens, self.positions[:n], self.cache, self.cross, self.src_bias,
                                       self.slot, *shortlist))

    def _shortlist(self, n: int) -> list[np.ndarray]:
        """The step's ``vocab_ids`` (the union of the live rows' candidates, also kept as :attr:`columns`) and
        ``vocab_bias`` (each output row masked to its own candidates). Rows of one encoder row (a sentence's beams)
        share their candidates: the union and the masks are made once per sentence, and again only when the live
        sentences change."""
        owners, inverse = np.unique(self.owner[:n], return_inverse=True)
        if not np.array_equal(owners, self._bias_owners):
            self.candidates = {owner: self.candidates[owner] for owner in owners.tolist()}  # forget those that left
            distinct = np.stack(list(self.candidates.values()))
            self._union = np.flatnonzero(distinct.any(axis=0))
            allowed = np.take(distinct, self._union, axis=1)
            self._sentence_bias = np.where(allowed, np.float32(0.0), np.float32(-np.inf))
            self._bias_owners = owners
        self.columns = self._union
        return [self._union, self._sentence_bias[inverse.reshape(-1)[self.slot]]]

    def advance(self, parents: np.ndarray, encoder_rows: np.ndarray | None) -> None:
        n = self.count
        self.positions[:n] += 1  # every live row wrote its slot at its position
        parents = np.asarray(parents, dtype=np.int64)
        if parents.size == n and parents.tobytes() == self._identity(n):
            return  # every row continues itself in its slot (greedy search): nothing moves, nobody left
        self._reserve(parents.size)
        self._assign(self.slot[parents])
        self._fit()

    def _identity(self, n: int) -> bytes:
        """The bytes of ``0..n-1`` as int64 (from a range kept for the purpose: comparing bytes is a tenth of
        comparing arrays, and this runs every step)."""
        size = n * 8
        if len(self._range) < size:
            self._range = np.arange(max(n, len(self._range) // 4), dtype=np.int64).tobytes()
        return self._range[:size]

    def arrange(self, sources: np.ndarray, cross_kv: np.ndarray | None = None,
                src_bias: np.ndarray | None = None, candidates: np.ndarray | None = None) -> None:
        sources = np.asarray(sources, dtype=np.int64)
        new = sources < 0
        if new.any():
            assert cross_kv is not None and src_bias is not None
            self._reserve(sources.size, 0, cross_kv.shape[4], cross_kv, src_bias)
        origin = np.where(new, -1, self.slot[np.where(new, 0, sources)] if self.slot.size else -1)
        fresh = self._assign(origin)
        if fresh.size:
            assert self.cross is not None and self.src_bias is not None and cross_kv is not None
            assert src_bias is not None
            encoder_rows = -1 - sources[new]
            width = cross_kv.shape[4]
            self.cross[:, :, fresh, :, :width] = np.take(cross_kv, encoder_rows, axis=2)
            self.src_bias[fresh] = MASK_VALUE
            self.src_bias[fresh, :, :, :width] = np.take(src_bias, encoder_rows, axis=0)
            self.positions[fresh] = 0
            if candidates is not None or self.candidates:
                assert candidates is not None, "a shortlist decode batch needs every new row's candidates"
                self.candidates.update((self._owners + row, candidates[row]) for row in np.unique(encoder_rows).tolist())
            self.owner[fresh] = self._owners + encoder_rows
            self._owners += int(encoder_rows.max()) + 1
            unmasked = src_bias[encoder_rows, 0, 0, :] > MASK_VALUE / 2
            self.source_len[fresh] = np.where(unmasked.any(axis=1), width - np.argmax(unmasked[:, ::-1], axis=1), 0)
        self._fit()

    def detach(self) -> None:
        """Nothing to do: the cache is this object's own, not the backend's."""

    def _assign(self, origin: np.ndarray) -> np.ndarray:
        """Give the next rows slots: row ``i`` continues the row in slot ``origin[i]`` (``-1``: a new row). The first
        row to name a slot keeps it (no copy); the other rows, and rows whose slot lies at or above the new live
        count, take the free slots below it (a copy of the filled part of the slot they continue), a free slot of
        the same encoder row where there is one (beams of one sentence: its encoder outputs are already there).
        Returns the slots of the new rows, in their order."""
        if self._core is None or self.cache is None:
            return self._assign_numpy(origin)
        self.slot, fresh = self._core.assign_slots(np.ascontiguousarray(origin, dtype=np.int64), self.owner,
                                                   self.positions, self.source_len, self.cache, self.cross,
                                                   self.src_bias)
        return np.asarray(fresh)

    def _assign_numpy(self, origin: np.ndarray) -> np.ndarray:
        """:meth:`_assign` in numpy: the native core's reference."""
        m = origin.size
        first = np.zeros(m, dtype=bool)
        continuing = np.flatnonzero(origin >= 0)
        if continuing.size:
            _, first_index = np.unique(origin[continuing], return_index=True)
            first[continuing[first_index]] = True
        slot = np.where(first, origin, -1)
        taken = np.zeros(m, dtype=bool)
        taken[slot[first & (slot < m)]] = True
        holes = np.flatnonzero(~taken)
        moving = np.flatnonzero(~first | (slot >= m))  # new rows, second children, rows above the live range
        if moving.size:
            wanted = np.where(origin[moving] >= 0, self.owner[np.maximum(origin[moving], 0)], -1)
            slot[moving] = _pair_by_owner(wanted, holes, self.owner[holes])
            for row in moving[origin[moving] >= 0].tolist():
                self._copy(int(origin[row]), int(slot[row]))
        self.slot = slot
        return np.asarray(slot[origin < 0])

    def _copy(self, source: int, target: int) -> None:
        """Slot ``target`` continues the row in slot ``source``: its filled cache, its encoder row (unless the slot
        holds that one already) and its position."""
        assert self.cache is not None and self.cross is not None and self.src_bias is not None
        filled = int(self.positions[source])
        self.cache[:, :, target, :, :filled] = self.cache[:, :, source, :, :filled]
        if self.owner[target] != self.owner[source]:
            self.cross[:, :, target] = self.cross[:, :, source]
            self.src_bias[target] = self.src_bias[source]
            self.owner[target] = self.owner[source]
            self.source_len[target] = self.source_len[source]
        self.positions[target] = filled

    def _fit(self) -> None:
        """Give memory back once the live rows need at most a quarter of the cache's positions (a sentence that ran
        long doubled them for every slot), and narrow the encoder outputs once they need at most half of their
        width (every row attends over the whole width, masked past its own source: a long source that left must not
        cost the others)."""
        assert self.cache is not None and self.cross is not None
        n = self.count
        capacity = self.cache.shape[4]
        if capacity > self._initial_capacity:  # (the maxima only where they can matter: this runs every beam step)
            filled = int(self.positions[:n].max()) if n else 0
            if 4 * (filled + 1) <= capacity:
                self._resize_cache(self.cache.shape[2], max(self._initial_capacity, capacity // 2))
        width = self.cross.shape[4]
        if width > _MIN_SOURCE_WIDTH:
            needed = int(self.source_len[:n].max()) if n else 0
            if 2 * needed <= width:
                self._resize_source(self.cross.shape[2], max(_MIN_SOURCE_WIDTH, -(-needed // 8) * 8))

    def _reserve(self, slots: int, positions: int = 0, source_width: int = 0, cross_kv: np.ndarray | None = None,
                 src_bias: np.ndarray | None = None) -> None:
        """Grow the arrays to at least ``slots`` slots, ``positions`` cache positions and ``source_width`` source
        positions, keeping the live slots; the first call shapes them after ``cross_kv``."""
        if (self.cache is not None and self.cross is not None and slots <= self.cache.shape[2]
                and positions <= self.cache.shape[4] and source_width <= self.cross.shape[4]):
            return  # room enough (the arrays' slots and the bookkeeping's always agree)
        if self.cache is None:
            assert cross_kv is not None and src_bias is not None
            layers, _, _, heads, _, head_dim = cross_kv.shape
            slots = _grown(self._initial_slots, slots)
            capacity = _grown(self._initial_capacity, positions)
            self.cache = np.zeros((layers, 2, slots, heads, capacity, head_dim), dtype=np.float32)
            self.cross = np.zeros((layers, 2, slots, heads, source_width, head_dim), dtype=np.float32)
            self.src_bias = np.full((slots, 1, 1, source_width), MASK_VALUE, dtype=np.float32)
            self.positions = np.zeros(slots, dtype=np.int64)
            self.owner = np.full(slots, -1, dtype=np.int64)
            self.source_len = np.zeros(slots, dtype=np.int64)
            return
        assert self.cross is not None
        new_slots = _grown(self.cache.shape[2], slots)
        new_capacity = _grown(self.cache.shape[4], positions)
        if (new_slots, new_capacity) != (self.cache.shape[2], self.cache.shape[4]):
            self._resize_cache(new_slots, new_capacity)
        if new_slots != self.cross.shape[2] or source_width > self.cross.shape[4]:
            self._resize_source(new_slots, max(self.cross.shape[4], source_width))
        if new_slots != self.positions.size:
            self.positions = np.concatenate([self.positions, np.zeros(new_slots - self.positions.size, np.int64)])
            self.owner = np.concatenate([self.owner, np.full(new_slots - self.owner.size, -1, np.int64)])
            self.source_len = np.concatenate([self.source_len, np.zeros(new_slots - self.source_len.size, np.int64)])

    def _resize_cache(self, slots: int, capacity: int) -> None:
        """A cache of ``slots`` slots and ``capacity`` positions (grown or shrunk) holding the live slots' filled
        positions."""
        assert self.cache is not None
        live = self.count
        filled = int(self.positions[:live].max()) if live else 0
        shape = self.cache.shape
        cache = np.zeros(shape[:2] + (slots, shape[3], capacity, shape[5]), dtype=np.float32)
        cache[:, :, :live, :, :filled] = self.cache[:, :, :live, :, :filled]
        self.cache = cache

    def _resize_source(self, slots: int, width: int) -> None:
        """Encoder outputs of ``slots`` slots and ``width`` source positions (widened or narrowed) holding the live
        slots' rows; the free slots lose theirs."""
        assert self.cross is not None and self.src_bias is not None
        live, kept = self.count, min(width, self.cross.shape[4])
        shape = self.cross.shape
        cross = np.zeros(shape[:2] + (slots, shape[3], width, shape[5]), dtype=np.float32)
        cross[:, :, :live, :, :kept] = self.cross[:, :, :live, :, :kept]
        bias = np.full((slots, 1, 1, width), MASK_VALUE, dtype=np.float32)
        bias[:live, :, :, :kept] = self.src_bias[:live, :, :, :kept]
        self.cross, self.src_bias = cross, bias
        self.owner[live:] = -1  # free slots lost their encoder rows


def _pair_by_owner(wanted: np.ndarray, holes: np.ndarray, holders: np.ndarray) -> np.ndarray:
    """A hole for each moving row (``wanted[i]``: the encoder row it needs, -1: a new row), from ``holes`` (whose
    current encoder rows are ``holders``): one holding the same encoder row where there is one."""
    free: dict[int, list[int]] = {}
    for hole, holder in zip(holes.tolist(), holders.tolist(), strict=True):
        free.setdefault(holder, []).append(hole)
    chosen = np.empty(wanted.size, dtype=np.int64)
    unmatched: list[int] = []
    for i, owner in enumerate(wanted.tolist()):
        same = free.get(owner) if owner >= 0 else None
        if same:
            chosen[i] = same.pop()
        else:
            unmatched.append(i)
    chosen[unmatched] = [hole for left in free.values() for hole in left][: len(unmatched)]
    return chosen
