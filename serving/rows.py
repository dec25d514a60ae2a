"""The rows of a decode batch and their caches: what one decoder call per step runs on.

A search (``serving.decoding``) sees *logical* rows: sentence-major, beam-minor, in its own order; each step it
returns a plan saying which row of this step every row of the next step continues (beam reorders, finished sentences
dropped). :class:`DecodeRows` keeps the arrays the decoder needs for those rows (the self-attention cache, the
encoder's ``cross_kv`` and ``src_bias``, each row's position) and applies the plans. Two kinds:

- :class:`SlotRows`, for a *stationary* decoder (ONNX Runtime, package format 4): each row owns a slot of a
  preallocated cache ``[L, 2, R, H, M, Dh]`` that the decoder writes in place at the row's own position
  (``OnnxRuntimeBackend.decode_in_place``). A plan moves nothing: a row that continues its parent keeps the parent's
  slot; only a second child of one parent copies the parent's filled slots (``positions[parent] + 1`` of them) into
  a free slot, and a row left above the live range moves down into a hole, so that the live slots stay
  ``0..n-1``. A slot freed by a finished row is reused at once. Logical rows map to slots through ``slot``; the
  decoder gathers its final states by it, so the log-probs come back in logical order. Rows at different positions
  share one call and attend only to their own filled slots, so rows join and leave at any step without masked
  slots.
- :class:`DenseRows`, for a decoder whose cache grows by one slot per call (OpenVINO; the numpy reference and test
  fakes): the cache ``[L, 2, n, H, T, Dh]`` is in logical order; the decoder returns it one slot wider, a plan
  takes its rows, and a row that joins a running batch gets ``T`` masked slots (``self_bias``). The cache is cut from
  the left once no row needs its oldest slots.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from serving.backends import Backend
from serving.package import MASK_VALUE


def is_identity(rows: np.ndarray, size: int) -> bool:
    """``rows`` is ``0..size-1`` in order: taking them would copy the array unchanged."""
    return rows.size == size and bool((rows == np.arange(size)).all())


def take_rows(decoder: Backend, cache: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The cache rows ``rows`` (axis 2), in that order: the backend's ``take_rows`` when it has one (it may write
    into a buffer it reuses), else ``np.take``."""
    backend_take = getattr(decoder, "take_rows", None)
    return np.asarray(backend_take(cache, rows)) if backend_take is not None else np.take(cache, rows, axis=2)


class DecodeRows(Protocol):
    """The arrays of a decode batch's rows (module docstring); used from one thread."""

    @property
    def count(self) -> int:
        """Logical rows."""
        ...

    @property
    def width(self) -> int:
        """Masked cache slots a row joining now would carry (0: none)."""
        ...

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """One decoder step: row ``i`` feeds ``tokens[i]`` (``[n, 1]``); returns ``log_probs [n, V]`` in logical
        order (valid until the next call). Raises what the runtime raises."""
        ...

    def advance(self, parents: np.ndarray, encoder_rows: np.ndarray | None) -> None:
        """After :meth:`decode`: row ``i`` of the next step continues row ``parents[i]`` of this one: its cache,
        this step's slot included, and its encoder outputs. ``encoder_rows``: the plan's (``StepPlan``), for the rows
        kinds that keep encoder rows apart (None: they stay as they are; beams of one sentence share theirs)."""
        ...

    def arrange(self, sources: np.ndarray, cross_kv: np.ndarray | None = None,
                src_bias: np.ndarray | None = None) -> None:
        """Rebuild the rows between steps: row ``i`` is the current row ``sources[i]`` as it is (``>= 0``), or, for
        ``sources[i] = -1 - j``, a new row at position 0 over encoder row ``j`` of ``cross_kv`` ``[L, 2, B, H, S,
        Dh]`` / ``src_bias`` ``[B, 1, 1, S]``. Rows not named are dropped."""
        ...

    def detach(self) -> None:
        """Copy anything kept in the backend's reused buffers into arrays of these rows' own (another batch is about
        to use the backend)."""
        ...


def open_rows(backend: Backend) -> DecodeRows:
    """The rows kind the backend's decoder needs: :class:`SlotRows` for a stationary one."""
    if getattr(backend, "stationary", False):
        return SlotRows(backend)
    return DenseRows(backend)


_MIN_SOURCE_WIDTH = 16  # the encoder outputs are never narrowed below this many positions


def _grown(size: int, needed: int) -> int:
    """A capacity of at least ``needed``, doubling from ``size``."""
    while size < needed:
        size *= 2
    return size


class SlotRows:
    """Rows in the slots of a stationary cache (module docstring).

    Arguments:
        backend: a backend with ``decode_in_place`` (``stationary``).
        slots: initial slot capacity ``R`` (grows by doubling).
        positions: initial positions per slot ``M`` (grows by doubling).
    """

    def __init__(self, backend: Backend, *, slots: int = 8, positions: int = 32) -> None:
        self.backend = backend
        self._decode = getattr(backend, "decode_in_place")  # noqa: B009 - the stationary backends' own method
        self._slots = slots
        self._capacity = self._initial_capacity = positions
        self.cache: np.ndarray | None = None  # [L, 2, R, H, M, Dh]
        self.cross: np.ndarray | None = None  # [L, 2, R, H, S, Dh]
        self.src_bias: np.ndarray | None = None  # [R, 1, 1, S]
        self.positions = np.zeros(0, dtype=np.int64)  # [R] slots each slot's row has filled
        self.owner = np.zeros(0, dtype=np.int64)  # [R] which encoder row each slot's cross_kv is (-1: none)
        self.source_len = np.zeros(0, dtype=np.int64)  # [R] source positions each slot's encoder row needs
        self._owners = 0  # encoder rows seen
        self.slot = np.zeros(0, dtype=np.int64)  # [n] logical row -> slot; the live slots are 0..n-1
        self._tokens = np.zeros((0, 1), dtype=np.int64)

    @property
    def count(self) -> int:
        return int(self.slot.size)

    @property
    def width(self) -> int:
        return 0

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        n = self.count
        assert self.cache is not None and self.cross is not None and self.src_bias is not None
        needed = int(self.positions[:n].max()) + 1
        if needed > self.cache.shape[4]:
            self._reserve(self.cache.shape[2], needed)
        assert self.cache is not None
        slot_tokens = self._tokens = np.resize(self._tokens, (n, 1))
        slot_tokens[self.slot] = tokens
        # The decoder returns the log-probs in logical order (it gathers the final states by ``self.slot``).
        return np.asarray(self._decode(slot_tokens, self.positions[:n], self.cache, self.cross, self.src_bias,
                                       self.slot))

    def advance(self, parents: np.ndarray, encoder_rows: np.ndarray | None) -> None:
        n = self.count
        self.positions[:n] += 1  # every live row wrote its slot at its position
        parents = np.asarray(parents, dtype=np.int64)
        self._reserve(parents.size, self._capacity)
        self._assign(self.slot[parents])
        self._fit()

    def arrange(self, sources: np.ndarray, cross_kv: np.ndarray | None = None,
                src_bias: np.ndarray | None = None) -> None:
        sources = np.asarray(sources, dtype=np.int64)
        new = sources < 0
        if new.any():
            assert cross_kv is not None and src_bias is not None
            self._reserve(max(self._slots, sources.size), self._capacity, cross_kv.shape[4], cross_kv, src_bias)
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
        assert self.cache is not None and self.cross is not None and self.src_bias is not None
        n = self.count
        capacity = self.cache.shape[4]
        filled = int(self.positions[:n].max()) if n else 0
        if capacity > self._initial_capacity and 4 * (filled + 1) <= capacity:
            smaller = max(self._initial_capacity, capacity // 2)
            cache = np.zeros(self.cache.shape[:4] + (smaller,) + self.cache.shape[5:], dtype=np.float32)
            cache[:, :, :n, :, :filled] = self.cache[:, :, :n, :, :filled]
            self.cache = cache
            self._capacity = smaller
        width = self.cross.shape[4]
        needed = int(self.source_len[:n].max()) if n else 0
        if width <= _MIN_SOURCE_WIDTH or 2 * needed > width:
            return
        narrow = max(_MIN_SOURCE_WIDTH, -(-needed // 8) * 8)
        cross = np.zeros(self.cross.shape[:4] + (narrow,) + self.cross.shape[5:], dtype=np.float32)
        cross[:, :, :n] = self.cross[:, :, :n, :, :narrow]
        bias = np.full(self.src_bias.shape[:3] + (narrow,), MASK_VALUE, dtype=np.float32)
        bias[:n] = self.src_bias[:n, :, :, :narrow]
        self.cross, self.src_bias = cross, bias
        self.owner[n:] = -1  # free slots lost their encoder rows

    def _reserve(self, slots: int, positions: int, source_width: int = 0, cross_kv: np.ndarray | None = None,
                 src_bias: np.ndarray | None = None) -> None:
        """Grow the arrays to at least ``slots`` slots, ``positions`` cache positions and ``source_width`` source
        positions, keeping the live slots; the first call shapes them after ``cross_kv``."""
        if self.cache is None:
            assert cross_kv is not None and src_bias is not None
            layers, _, _, heads, _, head_dim = cross_kv.shape
            self._slots, self._capacity = _grown(self._slots, slots), _grown(self._capacity, positions)
            self.cache = np.zeros((layers, 2, self._slots, heads, self._capacity, head_dim), dtype=np.float32)
            self.cross = np.zeros((layers, 2, self._slots, heads, source_width, head_dim), dtype=np.float32)
            self.src_bias = np.full((self._slots, 1, 1, source_width), MASK_VALUE, dtype=np.float32)
            self.positions = np.zeros(self._slots, dtype=np.int64)
            self.owner = np.full(self._slots, -1, dtype=np.int64)
            self.source_len = np.zeros(self._slots, dtype=np.int64)
            return
        assert self.cross is not None and self.src_bias is not None
        live = self.count
        cache_shape, cross_shape = self.cache.shape, self.cross.shape
        new_slots = _grown(cache_shape[2], slots)
        new_capacity = _grown(cache_shape[4], positions)
        new_width = max(cross_shape[4], source_width)
        if (new_slots, new_capacity) != (cache_shape[2], cache_shape[4]):
            cache = np.zeros(cache_shape[:2] + (new_slots, cache_shape[3], new_capacity, cache_shape[5]),
                             dtype=np.float32)
            filled = int(self.positions[:live].max()) if live else 0
            cache[:, :, :live, :, :filled] = self.cache[:, :, :live, :, :filled]
            self.cache = cache
        if (new_slots, new_width) != (cross_shape[2], cross_shape[4]):
            cross = np.zeros(cross_shape[:2] + (new_slots, cross_shape[3], new_width, cross_shape[5]),
                             dtype=np.float32)
            cross[:, :, :live, :, : cross_shape[4]] = self.cross[:, :, :live]
            bias = np.full((new_slots, 1, 1, new_width), MASK_VALUE, dtype=np.float32)
            bias[:live, :, :, : cross_shape[4]] = self.src_bias[:live]
            self.cross, self.src_bias = cross, bias
            self.owner[live:] = -1  # free slots lost their encoder rows
        if new_slots != self.positions.size:
            self.positions = np.concatenate([self.positions, np.zeros(new_slots - self.positions.size, np.int64)])
            self.owner = np.concatenate([self.owner, np.full(new_slots - self.owner.size, -1, np.int64)])
            self.source_len = np.concatenate([self.source_len, np.zeros(new_slots - self.source_len.size, np.int64)])
        self._slots, self._capacity = new_slots, new_capacity


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
                src_bias: np.ndarray | None = None) -> None:
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
