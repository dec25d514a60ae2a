"""An independent numpy forward pass of an OpenNMT-py Transformer, from OpenNMT-py's parameter names and options.

Written from OpenNMT-py's ``TransformerEncoderLayer`` / ``TransformerDecoderLayer``: ``x + attn(layer_norm(x))``
then ``feed_forward`` (``x + w_2(act(w_1(layer_norm(x))))``) in the encoder; ``layer_norm_1`` before the decoder's
self-attention, ``layer_norm_2`` before ``context_attn``; the stacks' final ``layer_norm``; the embedding times
``sqrt(dim)`` plus the stored ``pe`` rows; ``generator`` (weight and bias) then log-softmax. Sources have no EOS:
callers pass the tokens only. Whole sequences, no cache.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tests.utils.numpy_nmt import activation, attention, causal, layer_norm, log_softmax
from tests.utils.prefix_backend import PrefixBackend


class OnmtReference:
    """OpenNMT-py's forward pass over ``model`` and ``generator`` tensors with options ``opts``."""

    def __init__(self, model: dict[str, np.ndarray], generator: dict[str, np.ndarray], opts: dict[str, Any],
                 pad: int, eos: int) -> None:
        self.w = {k: v.astype(np.float64) for k, v in model.items()}
        self.g = {k: v.astype(np.float64) for k, v in generator.items()}
        self.o, self.pad, self.eos = opts, pad, eos

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        y = x @ self.w[f"{name}.weight"].T
        return y + self.w[f"{name}.bias"] if f"{name}.bias" in self.w else y

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        return layer_norm(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.o["norm_eps"])

    def _mha(self, name: str, query: np.ndarray, memory: np.ndarray, allowed: np.ndarray) -> np.ndarray:
        q = self._linear(query, f"{name}.linear_query")
        k, v = self._linear(memory, f"{name}.linear_keys"), self._linear(memory, f"{name}.linear_values")
        return self._linear(attention(q, k, v, self.o["heads"], allowed), f"{name}.final_linear")

    def _feed_forward(self, x: np.ndarray, name: str) -> np.ndarray:
        act = {"fast_gelu": "gelu_tanh"}.get(self.o["pos_ffn_activation_fn"], self.o["pos_ffn_activation_fn"])
        inner = activation(act, self._linear(self._ln(x, f"{name}.layer_norm"), f"{name}.w_1"))
        return np.asarray(x + self._linear(inner, f"{name}.w_2"))

    def _embed(self, side: str, ids: np.ndarray) -> np.ndarray:
        table = self.w[f"{side}.embeddings.make_embedding.emb_luts.0.weight"]
        pe = self.w[f"{side}.embeddings.make_embedding.pe.pe"][:, 0]
        return np.asarray(table[ids] * math.sqrt(self.o["hidden_size"]) + pe[: ids.shape[1]])

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """``ids`` as OpenNMT-py sees them (no EOS); ``mask`` False at padding."""
        x = self._embed("encoder", ids)
        allowed = np.broadcast_to(mask[:, None, :], (ids.shape[0], ids.shape[1], ids.shape[1]))
        for i in range(self.o["enc_layers"]):
            p = f"encoder.transformer.{i}"
            normed = self._ln(x, f"{p}.layer_norm")
            x = self._feed_forward(x + self._mha(f"{p}.self_attn", normed, normed, allowed), f"{p}.feed_forward")
        return self._ln(x, "encoder.layer_norm")

    def decode(self, memory: np.ndarray, mask: np.ndarray, prefix: np.ndarray) -> np.ndarray:
        x = self._embed("decoder", prefix)
        self_allowed, cross_allowed = causal(prefix.shape[1]), mask[:, None, :]
        for i in range(self.o["dec_layers"]):
            p = f"decoder.transformer_layers.{i}"
            normed = self._ln(x, f"{p}.layer_norm_1")
            query = x + self._mha(f"{p}.self_attn", normed, normed, self_allowed)
            mid = self._mha(f"{p}.context_attn", self._ln(query, f"{p}.layer_norm_2"), memory, cross_allowed)
            x = self._feed_forward(mid + query, f"{p}.feed_forward")
        x = self._ln(x, "decoder.layer_norm")
        return log_softmax(x @ self.g["weight"].T + self.g["bias"])

    def backend(self) -> PrefixBackend:
        """Over sources as the package gets them (EOS-terminated): OpenNMT-py never sees that EOS."""
        return PrefixBackend(self.encode, lambda memory, mask, prefix: self.decode(memory, mask, prefix)[:, -1],
                             self.pad, unseen=(self.eos,))
