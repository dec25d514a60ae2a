"""OnnxRuntimeBackend(reuse_buffers=True): the search gets the same results with no per-step output arrays.

The decoder step writes into buffers the backend keeps; ``take_rows`` reorders the cache into the other of its two
cache buffers. Checked against the same backend without reuse on a converted tiny Marian package: greedy and beam
search (rows reordered and dropped) give identical tokens and scores, and the buffers are really reused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from serving.engine.backends.onnxruntime import CacheBuffers, OnnxRuntimeBackend
from serving.engine.translator import DecodeOptions, Translator

TEXTS = ["A man is riding a bike.", "Two dogs play in the snow near a red house.", "Hi", "", "A woman sings."]


def test_cache_buffers_alternate_and_never_overwrite_the_source() -> None:
    buffers = CacheBuffers()
    first = buffers.next((2, 5), np.zeros((2, 3), dtype=np.float32))
    second = buffers.next((2, 4), first)
    assert not np.may_share_memory(first, second)
    third = buffers.next((2, 3), second)  # from the second: back into the first buffer (big enough)
    assert np.may_share_memory(first, third) and not np.may_share_memory(second, third)
    fresh = buffers.next((1, 2), np.ones(3, dtype=np.float32))  # elsewhere: not the one handed out last
    assert not np.may_share_memory(fresh, third)
    grown = buffers.next((4, 10), fresh)  # too big for the free buffer: it grows
    assert grown.shape == (4, 10) and not np.may_share_memory(grown, fresh)


def test_reused_buffers_give_identical_translations(tiny_onnx_package: Path) -> None:
    translator = Translator.load(tiny_onnx_package, runtime="onnxruntime", precision="fp32", threads=1)
    backend = translator.backend
    assert isinstance(backend, OnnxRuntimeBackend) and backend.reuse_buffers
    results = {}
    for reuse in (True, False):
        backend.reuse_buffers = reuse
        for beam in (1, 4):
            results[reuse, beam] = [(t.token_ids, t.score) for t in
                                    translator.translate(TEXTS, DecodeOptions(beam_size=beam))]
    assert results[True, 1] == results[False, 1]
    assert results[True, 4] == results[False, 4]

    backend.reuse_buffers = True
    enc = backend.encode(np.array([[5, 6, 0], [7, 0, 1]], dtype=np.int64))
    past = np.zeros(enc.cross_kv.shape[:4] + (0, enc.cross_kv.shape[5]), dtype=np.float32)
    tokens = np.zeros((2, 1), dtype=np.int64)
    log_probs, present = backend.decode_step(tokens, 0, past, enc.cross_kv, enc.src_bias)
    again, present_again = backend.decode_step(tokens, 1, present, enc.cross_kv, enc.src_bias)
    assert np.shares_memory(log_probs, again)  # one log_probs buffer
    assert not np.may_share_memory(present, present_again)  # the cache it was made from is intact
    swapped = backend.take_rows(present_again, np.array([1, 0]))
    assert not np.may_share_memory(swapped, present_again)
    np.testing.assert_array_equal(swapped[:, :, 0], present_again[:, :, 1])
