"""A ``Backend`` over any full-sequence forward pass: every step recomputes the decoder over the whole prefix.

The source framework's own (or an independent numpy) forward pass is only written for whole sequences; wrapped
here, mtgate's search drives it exactly as it drives the ONNX graphs, with no cache layout in common: the "cache"
holds the prefix ids (``[1, 2, B, 1, T, D]``, the ids in ``[0, 0, :, 0, :, 0]``) and ``cross_kv`` carries the
encoder output (``[1, 1, B, 1, S, D]``), so beam reordering and batch shrinking reorder them as they reorder real
caches, and any mistake there changes the result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from serving.engine.backends import EncoderOutput
from serving.package import MASK_VALUE

Encode = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``encode(input_ids [B,S], mask [B,S] bool) -> memory [B,S,D]``."""
Step = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""``step(memory [B,S,D], mask [B,S] bool, prefix [B,T] int64) -> log_probs [B,V]`` of the token after the prefix."""


class PrefixBackend:
    """``encode`` / ``decode_step`` of the backend contract over ``encode_fn`` and ``step_fn``.

    Arguments:
        encode_fn: the encoder.
        step_fn: the decoder over a whole prefix, returning the next token's log-probs.
        pad: the source padding id (what ``mask`` is False at).
        unseen: other source ids the model never sees (OpenNMT-py: the EOS the engine appends), masked too.
    """

    def __init__(self, encode_fn: Encode, step_fn: Step, pad: int, unseen: tuple[int, ...] = ()) -> None:
        self.encode_fn, self.step_fn, self.pad, self.unseen = encode_fn, step_fn, pad, unseen

    def encode(self, input_ids: np.ndarray) -> EncoderOutput:
        mask = (input_ids != self.pad) & ~np.isin(input_ids, self.unseen)
        memory = np.asarray(self.encode_fn(input_ids, mask), dtype=np.float32)
        src_bias = np.where(mask, 0.0, MASK_VALUE).astype(np.float32)[:, None, None, :]
        return EncoderOutput(memory=memory, cross_kv=np.ascontiguousarray(memory[None, None, :, None]),
                                   src_bias=src_bias)

    def decode_step(self, input_ids: np.ndarray, step: int, past_kv: np.ndarray, cross_kv: np.ndarray,
                    src_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert past_kv.shape[4] == step, (past_kv.shape, step)
        prefix = np.concatenate([past_kv[0, 0, :, 0, :, 0].astype(np.int64), input_ids.astype(np.int64)], axis=1)
        log_probs = np.asarray(self.step_fn(cross_kv[0, 0, :, 0], src_bias[:, 0, 0, :] == 0, prefix),
                               dtype=np.float32)
        rows, length, width = prefix.shape[0], prefix.shape[1], cross_kv.shape[-1]
        present = np.broadcast_to(prefix.astype(np.float32)[None, None, :, None, :, None], (1, 2, rows, 1, length,
                                                                                            width))
        return log_probs, np.ascontiguousarray(present)
