"""What every rows kind shares: the ``DecodeRows`` protocol and two array helpers."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from serving.engine.backends import Backend


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

    columns: np.ndarray | None
    """The sorted ids of the last :meth:`decode`'s log-prob columns when a vocabulary shortlist narrowed it (None: a
    column per id)."""

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """One decoder step: row ``i`` feeds ``tokens[i]`` (``[n, 1]``); returns ``log_probs [n, V]`` in logical
        order (valid until the next call; ``[n, K]``, the ids of :attr:`columns`, with a shortlist). Raises what the
        runtime raises."""
        ...

    def advance(self, parents: np.ndarray, encoder_rows: np.ndarray | None) -> None:
        """After :meth:`decode`: row ``i`` of the next step continues row ``parents[i]`` of this one: its cache,
        this step's slot included, and its encoder outputs. ``encoder_rows``: the plan's (``StepPlan``), for the rows
        kinds that keep encoder rows apart (None: they stay as they are; beams of one sentence share theirs)."""
        ...

    def arrange(self, sources: np.ndarray, cross_kv: np.ndarray | None = None,
                src_bias: np.ndarray | None = None, candidates: np.ndarray | None = None) -> None:
        """Rebuild the rows between steps: row ``i`` is the current row ``sources[i]`` as it is (``>= 0``), or, for
        ``sources[i] = -1 - j``, a new row at position 0 over encoder row ``j`` of ``cross_kv`` ``[L, 2, B, H, S,
        Dh]`` / ``src_bias`` ``[B, 1, 1, S]`` (and ``candidates [B, V]``, the encoder output's, with a vocabulary
        shortlist). Rows not named are dropped."""
        ...

    def detach(self) -> None:
        """Copy anything kept in the backend's reused buffers into arrays of these rows' own (another batch is about
        to use the backend)."""
        ...
