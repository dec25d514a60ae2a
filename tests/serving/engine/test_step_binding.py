"""The stationary decoder's I/O binding kept across steps (serving.engine.backends.binding.StepBinding).

A steady step binds nothing (it copied its 16 inputs and 7 outputs into a fresh binding at every step before); what
a kept binding computes is what a fresh one computes, step by step, through a random history of joins, departures,
beam reorders and cache growth on a converted tiny Marian package; and the binding keeps no batch's arrays alive.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from serving.engine.backends.binding import StepBinding
from serving.engine.backends.onnxruntime import OnnxRuntimeBackend
from serving.engine.rows import SlotRows
from serving.engine.translator import DecodeOptions, Translator
from serving.package import MASK_VALUE, open_package


class CountingBinding:
    """An ONNX Runtime I/O binding that counts what is bound on it."""

    def __init__(self, inner: Any, counts: dict[str, int]) -> None:
        self.inner = inner
        self.counts = counts

    def bind_cpu_input(self, *args: Any) -> None:
        self.counts["binds"] += 1
        self.inner.bind_cpu_input(*args)

    def bind_input(self, *args: Any) -> None:
        self.counts["binds"] += 1
        self.inner.bind_input(*args)

    def bind_output(self, *args: Any, **kwargs: Any) -> None:
        self.counts["binds"] += 1
        self.inner.bind_output(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CountingSession:
    """An ONNX Runtime session whose bindings count their binds and whose runs are counted."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.counts = {"binds": 0, "runs": 0}

    def io_binding(self) -> CountingBinding:
        return CountingBinding(self.inner.io_binding(), self.counts)

    def run_with_iobinding(self, binding: CountingBinding, *args: Any) -> None:
        self.counts["runs"] += 1
        self.inner.run_with_iobinding(binding.inner, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _backend(package: Path) -> OnnxRuntimeBackend:
    artifact = open_package(package).artifact("onnxruntime", "fp32")
    return OnnxRuntimeBackend(package / artifact.encoder, package / artifact.decoder, 1, reuse_buffers=True)


def test_a_steady_step_binds_nothing(tiny_onnx_package: Path) -> None:
    translator = Translator.load(tiny_onnx_package, runtime="onnxruntime", precision="fp32", threads=1)
    backend = translator.backend
    assert isinstance(backend, OnnxRuntimeBackend) and backend.stationary
    session = CountingSession(backend.decoder)
    backend.decoder = session
    translator.translate(["A man is riding a bike near a red house."], DecodeOptions(beam_size=1, max_length=24))
    steps, binds = session.counts["runs"], session.counts["binds"]
    layers = sum(1 for i in backend.decoder.get_inputs() if i.name.startswith("past_k."))
    per_bind = 3 + 2 * layers + 2 * layers + 1 + 2 * layers + 1  # step integers, past, cross, src_bias, present, log_probs
    assert steps >= 8
    assert binds == per_bind, (binds, steps)  # the first step's, and none after (the cache did not grow)


def test_a_kept_binding_computes_what_a_fresh_one_does(tiny_onnx_package: Path) -> None:
    backend = _backend(tiny_onnx_package)
    inputs = {i.name: i.shape for i in backend.decoder.get_inputs()}
    layers = sum(1 for name in inputs if name.startswith("past_k."))
    heads, head_dim = inputs["past_k.0"][1], inputs["past_k.0"][3]
    vocab = backend.decoder.get_outputs()[0].shape[1]
    checked = {"steps": 0}

    class Compared:
        """The backend's step, checked against the same step through a new binding (the step writes the same
        keys and values into the cache again: idempotent)."""

        stationary = True

        def decode_in_place(self, *args: np.ndarray) -> np.ndarray:
            kept = np.array(backend.decode_in_place(*args))
            fresh = np.empty_like(kept)
            StepBinding(backend.decoder, layers).run(*args, fresh)
            np.testing.assert_array_equal(kept, fresh)
            checked["steps"] += 1
            return kept

    rng = np.random.default_rng(0)
    rows = SlotRows(Compared(), slots=2, positions=2)  # small: grown many times
    count, position = 0, 0
    for _ in range(50):
        action = rng.random()
        if action < 0.25 or count == 0:  # rows join at position 0
            joining, width = int(rng.integers(1, 4)), int(rng.integers(1, 10))
            cross = rng.standard_normal((layers, 2, joining, heads, width, head_dim)).astype(np.float32)
            bias = np.where(rng.random((joining, 1, 1, width)) < 0.2, MASK_VALUE, 0.0).astype(np.float32)
            rows.arrange(np.concatenate([np.arange(count), -1 - np.arange(joining)]), cross, bias)
            count += joining
        elif action < 0.35:  # some rows leave
            keep = np.sort(rng.choice(count, int(rng.integers(1, count + 1)), replace=False))
            rows.arrange(keep)
            count = keep.size
        elif position < 40:  # a step, then a plan (beam reorders: repeats and drops)
            rows.decode(rng.integers(0, vocab, (count, 1)))
            parents = rng.integers(0, count, int(rng.integers(1, count + 3)))
            rows.advance(parents if rng.random() < 0.6 else np.arange(count), None)
            count = rows.count
            position += 1
    assert checked["steps"] >= 20


def test_the_binding_keeps_no_batch_alive(tiny_onnx_package: Path) -> None:
    backend = _backend(tiny_onnx_package)
    encoded = backend.encode(np.array([[5, 6, 7, 0]], dtype=np.int64))
    rows = SlotRows(backend)
    rows.arrange(np.array([-1]), encoded.cross_kv, encoded.src_bias)
    for token in (3, 4, 5):
        rows.decode(np.array([[token]]))
        rows.advance(np.array([0]), None)
    arrays = [weakref.ref(a) for a in (rows.cache, rows.cross, rows.src_bias) if a is not None]
    assert len(arrays) == 3
    del rows
    gc.collect()
    assert all(ref() is None for ref in arrays)


def test_each_view_is_bound_at_its_own_address() -> None:
    """The binding computes a view's address from its array's (``ndarray.ctypes`` once per array): every past and
    present cache view, cross-attention view and the source mask is bound where numpy says the view starts."""
    from serving.package import cross_names, past_names, present_names, stacked

    bound: dict[str, tuple[int, list[int]]] = {}

    class Recording:
        def bind_input(self, name: str, _device: str, _id: int, _dtype: Any, shape: list[int], address: int) -> None:
            bound[name] = (address, shape)

        def bind_output(self, name: str, _device: str, _id: int, _dtype: Any, shape: list[int], address: int) -> None:
            bound[name] = (address, shape)

    class Session:
        def io_binding(self) -> Recording:
            return Recording()

        def run_with_iobinding(self, _binding: Recording) -> None:
            pass

    layers, rows = 3, 2
    cache = np.zeros((layers, 2, 5, 4, 8, 6), dtype=np.float32)
    cross = np.zeros((layers, 2, 4, 4, 7, 6), dtype=np.float32)
    bias = np.zeros((4, 1, 1, 7), dtype=np.float32)
    StepBinding(Session(), layers).run(np.zeros((rows, 1), np.int64), np.zeros(rows, np.int64), cache, cross, bias,
                                       np.arange(rows), np.zeros((rows, 10), np.float32))
    for names, array in ((past_names(layers), cache), (present_names(layers), cache), (cross_names(layers), cross)):
        for name, (layer, kind) in stacked(names):
            view = array[layer, kind, :rows]
            assert bound[name] == (view.ctypes.data, list(view.shape)), name
    assert bound["src_bias"] == (bias.ctypes.data, [rows, 1, 1, 7])
