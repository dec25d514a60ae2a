"""The stationary decoder's ONNX Runtime I/O binding, kept from one step to the next (:class:`StepBinding`).

A step of a stationary decoder reads the same memory every time: the cache, where each row writes its new slot in
place, the encoder outputs and the source mask, all views of arrays that only move when they grow (``SlotRows``).
Binding them again at every step cost 16 crossings into ONNX Runtime and 7 output bindings for a 3-layer model
(with the Python around them about 0.25 ms, half the runtime's own 0.5 ms on the demo model at batch 1). A
:class:`StepBinding` binds each of them once and again only when what it was bound to changed: another row count,
another array (or shape), a log-probs buffer that grew. The step's few integers (tokens, positions, row order) go
into buffers of its own, bound once, so a steady step is their copy and one ``run_with_iobinding``.

Arrays are bound by address, so the binding keeps no batch's arrays alive after the batch (ONNX Runtime's
``bind_cpu_input`` would hold them until the next batch bound its own); it keeps weak references to the cache, the
encoder outputs and the source mask it bound, so an array freed since can never match: it is bound again from the
array given before anything reads it.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from serving.package import cross_names, past_names, present_names, stacked


class StepBinding:
    """One session's I/O binding for :meth:`OnnxRuntimeBackend.decode_in_place
    <serving.engine.backends.onnxruntime.OnnxRuntimeBackend.decode_in_place>`, kept across steps (module docstring).

    Arguments:
        session: the decoder's ``InferenceSession`` (or anything with ``io_binding`` and ``run_with_iobinding``).
        layers: the decoder's layers.

    Attributes:
        binds: inputs and outputs bound so far (tests and profiles count them: a steady step binds none).
    """

    def __init__(self, session: Any, layers: int) -> None:
        self.session = session
        self.binding = session.io_binding()
        self.binds = 0
        self._past = stacked(past_names(layers))
        self._present = [name for name, _ in stacked(present_names(layers))]
        self._cross = stacked(cross_names(layers))
        self._ids = np.zeros((0, 1), dtype=np.int64)
        self._positions = np.zeros((0, 1), dtype=np.int64)
        self._order = np.zeros(0, dtype=np.int64)
        self._step_ids, self._step_positions, self._step_order = self._ids[:0, 0], self._positions[:0, 0], self._order
        self._rows = -1  # the row count the step inputs are bound for (-1: none)
        # Weak references to the cache, cross_kv and src_bias bound last, and their shapes then (empty: none).
        self._arrays: tuple[Any, ...] = ()
        self._copies: list[np.ndarray] = []  # float32 C-contiguous copies of inputs that were neither, while bound
        self._log_probs: np.ndarray | None = None
        self._extra: dict[str, np.ndarray] | None = None

    def run(self, input_ids: np.ndarray, positions: np.ndarray, cache: np.ndarray, cross_kv: np.ndarray,
            src_bias: np.ndarray, order: np.ndarray, log_probs: np.ndarray,
            extra: dict[str, np.ndarray] | None = None) -> None:
        """One step (``decode_in_place``'s arguments; ``log_probs`` the ``[n, V]`` array the step writes, ``extra``
        inputs bound for this step only, the shortlist's): binds what changed, copies the step's integers, runs."""
        rows = input_ids.shape[0]
        if rows != self._rows:
            self._bind_rows(rows)
            self._arrays = ()
        bound = self._arrays
        if not (bound and bound[0]() is cache and bound[1]() is cross_kv and bound[2]() is src_bias
                and bound[3] == (cache.shape, cross_kv.shape, src_bias.shape)):
            self._bind_arrays(rows, cache, cross_kv, src_bias)
        if log_probs is not self._log_probs:
            self._bind_output("log_probs", log_probs)
            self._log_probs = log_probs
        if extra:
            self._extra = extra  # alive until the next step binds its own
            for name, value in extra.items():
                self._bind_input(name, value)
        np.copyto(self._step_ids, input_ids.reshape(rows), casting="same_kind")
        np.copyto(self._step_positions, positions.reshape(rows), casting="same_kind")
        np.copyto(self._step_order, order.reshape(rows), casting="same_kind")
        self.session.run_with_iobinding(self.binding)

    def _bind_rows(self, rows: int) -> None:
        """The step's integers for ``rows`` rows: views of buffers of this object's own, bound once."""
        if rows > self._order.size:
            size = max(rows, 2 * self._order.size)
            self._ids = np.zeros((size, 1), dtype=np.int64)
            self._positions = np.zeros((size, 1), dtype=np.int64)
            self._order = np.zeros(size, dtype=np.int64)
        self._bind_input("input_ids", self._ids[:rows])
        self._bind_input("position_ids", self._positions[:rows])
        self._bind_input("row_order", self._order[:rows])
        self._step_ids, self._step_positions, self._step_order = self._ids[:rows, 0], self._positions[:rows, 0], \
            self._order[:rows]
        self._rows = rows

    def _bind_arrays(self, rows: int, cache: np.ndarray, cross_kv: np.ndarray, src_bias: np.ndarray) -> None:
        """The cache (each present output bound to its past input: GroupQueryAttention writes the new slot in place),
        the encoder outputs and the source mask of rows ``0..rows-1``."""
        # A view's address is its array's plus its offset (``ndarray.ctypes`` costs microseconds a call: once per
        # array, not per view).
        base = cache.ctypes.data
        for (name, (layer, kind)), out_name in zip(self._past, self._present, strict=True):
            view = cache[layer, kind, :rows]
            address = base + layer * cache.strides[0] + kind * cache.strides[1]
            self._bind_input(name, view, address)
            self._bind_output(out_name, view, address)
        base = cross_kv.ctypes.data
        inputs = [(name, cross_kv[layer, kind, :rows], base + layer * cross_kv.strides[0] + kind * cross_kv.strides[1])
                  for name, (layer, kind) in self._cross]
        inputs.append(("src_bias", src_bias[:rows], src_bias.ctypes.data))
        self._copies = []
        for name, value, address in inputs:
            if not (value.flags.c_contiguous and value.dtype == np.float32):
                value = np.ascontiguousarray(value, dtype=np.float32)
                self._copies.append(value)  # the binding borrows its memory
                address = value.ctypes.data
            self._bind_input(name, value, address)
        # Copies are bound again at the next step (the arrays they copy may have changed since).
        self._arrays = () if self._copies else (weakref.ref(cache), weakref.ref(cross_kv), weakref.ref(src_bias),
                                                (cache.shape, cross_kv.shape, src_bias.shape))

    def _bind_input(self, name: str, value: np.ndarray, address: int | None = None) -> None:
        # By address (``bind_cpu_input`` would keep the array alive as long as the binding): ``run`` binds again
        # whatever is no longer the array bound, so a freed array's memory is never read. ``address``: the value's
        # when the caller computed it.
        address = value.ctypes.data if address is None else address
        self.binding.bind_input(name, "cpu", 0, value.dtype.type, list(value.shape), address)
        self.binds += 1

    def _bind_output(self, name: str, value: np.ndarray, address: int | None = None) -> None:
        address = value.ctypes.data if address is None else address
        self.binding.bind_output(name, "cpu", 0, np.float32, list(value.shape), address)
        self.binds += 1
