"""The rows of a decode batch and their caches: what one decoder call per step runs on.

A search (``serving.engine.decoding``) sees *logical* rows: sentence-major, beam-minor, in its own order; each step it
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

from serving.engine.backends import Backend
from serving.engine.rows.base import DecodeRows, is_identity, take_rows
from serving.engine.rows.dense import DenseRows
from serving.engine.rows.slots import SlotRows

__all__ = ["DecodeRows", "DenseRows", "SlotRows", "is_identity", "open_rows", "take_rows"]


def open_rows(backend: Backend) -> DecodeRows:
    """The rows kind the backend's decoder needs: :class:`SlotRows` for a stationary one."""
    if getattr(backend, "stationary", False):
        return SlotRows(backend)
    return DenseRows(backend)
