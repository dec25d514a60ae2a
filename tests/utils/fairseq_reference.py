"""An independent numpy forward pass of a fairseq Transformer, from fairseq's parameter names and options.

Written from fairseq's ``TransformerEncoder`` / ``TransformerDecoder`` (models/transformer): token embedding times
``sqrt(d)`` (unless ``no_scale_embedding``), plus positions numbered as ``make_positions`` numbers them (from
``pad + 1``, padding at ``pad``) in the sinusoidal table of ``get_embedding`` (float64 here) or the learned one,
``layernorm_embedding``; each layer with its norms before (``*_normalize_before``) or after the residual;
``layer_norm`` after a pre-norm stack; the output projection tied to the decoder embedding or its own. Whole
sequences with explicit masks, no cache. ``FairseqReference.backend()`` drives it with mtgate's search.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tests.utils.numpy_nmt import activation, attention, causal, layer_norm, log_softmax
from tests.utils.prefix_backend import PrefixBackend


def fairseq_sinusoids(num_embeddings: int, dim: int, padding_idx: int) -> np.ndarray:
    """fairseq's ``SinusoidalPositionalEmbedding.get_embedding`` in float64 (row ``padding_idx`` zero)."""
    half = dim // 2
    freqs = np.exp(np.arange(half) * -(math.log(10000) / (half - 1)))
    angles = np.arange(num_embeddings)[:, None] * freqs[None]
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    if dim % 2:
        table = np.concatenate([table, np.zeros((num_embeddings, 1))], axis=1)
    table[padding_idx] = 0
    return table


class FairseqReference:
    """fairseq's forward pass over ``state`` (its state dict as numpy) with options ``opts`` (flat fairseq names)."""

    def __init__(self, state: dict[str, np.ndarray], opts: dict[str, Any], pad: int = 1) -> None:
        self.w = {k: v.astype(np.float64) for k, v in state.items()}
        self.o, self.pad = opts, pad

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        y = x @ self.w[f"{name}.weight"].T
        return y + self.w[f"{name}.bias"] if f"{name}.bias" in self.w else y

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        return layer_norm(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"], 1e-5)

    def _mha(self, name: str, query: np.ndarray, memory: np.ndarray, heads: int, allowed: np.ndarray) -> np.ndarray:
        q = self._linear(query, f"{name}.q_proj")
        k, v = self._linear(memory, f"{name}.k_proj"), self._linear(memory, f"{name}.v_proj")
        return self._linear(attention(q, k, v, heads, allowed), f"{name}.out_proj")

    def _embed(self, side: str, ids: np.ndarray) -> np.ndarray:
        d = self.o["encoder_embed_dim"]
        table = self.w["encoder.embed_tokens.weight" if side == "encoder" or self.o["share_all_embeddings"]
                       else "decoder.embed_tokens.weight"]
        x = table[ids] * (1.0 if self.o["no_scale_embedding"] else math.sqrt(d))
        mask = ids != self.pad
        positions = np.cumsum(mask, axis=1) * mask + self.pad  # fairseq's make_positions
        if self.o[f"{side}_learned_pos"]:
            x = x + self.w[f"{side}.embed_positions.weight"][positions]
        else:
            x = x + fairseq_sinusoids(int(positions.max()) + 1, d, self.pad)[positions]
        if self.o["layernorm_embedding"]:
            x = self._ln(x, f"{side}.layernorm_embedding")
        return np.asarray(x)

    def _sublayer(self, x: np.ndarray, norm: str, pre: bool, fn: Any) -> np.ndarray:
        if pre:
            return np.asarray(x + fn(self._ln(x, norm)))
        return self._ln(x + fn(x), norm)

    def _ffn(self, x: np.ndarray, name: str) -> np.ndarray:
        act = {"gelu_accurate": "gelu_tanh", "gelu_fast": "gelu_tanh"}.get(self.o["activation_fn"],
                                                                            self.o["activation_fn"])
        return self._linear(activation(act, self._linear(x, f"{name}.fc1")), f"{name}.fc2")

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        x = self._embed("encoder", ids)
        pre, heads = self.o["encoder_normalize_before"], self.o["encoder_attention_heads"]
        allowed = np.broadcast_to(mask[:, None, :], (ids.shape[0], ids.shape[1], ids.shape[1]))
        for i in range(self.o["encoder_layers"]):
            p = f"encoder.layers.{i}"
            x = self._sublayer(x, f"{p}.self_attn_layer_norm", pre,
                               lambda y, p=p: self._mha(f"{p}.self_attn", y, y, heads, allowed))
            x = self._sublayer(x, f"{p}.final_layer_norm", pre, lambda y, p=p: self._ffn(y, p))
        if pre:
            x = self._ln(x, "encoder.layer_norm")
        return x

    def decode(self, memory: np.ndarray, mask: np.ndarray, prefix: np.ndarray) -> np.ndarray:
        """log-probs ``[B, T, V]`` of the token after each prefix position."""
        x = self._embed("decoder", prefix)
        pre, heads = self.o["decoder_normalize_before"], self.o["decoder_attention_heads"]
        self_allowed = causal(prefix.shape[1])
        cross_allowed = mask[:, None, :]
        for i in range(self.o["decoder_layers"]):
            p = f"decoder.layers.{i}"
            x = self._sublayer(x, f"{p}.self_attn_layer_norm", pre,
                               lambda y, p=p: self._mha(f"{p}.self_attn", y, y, heads, self_allowed))
            x = self._sublayer(x, f"{p}.encoder_attn_layer_norm", pre,
                               lambda y, p=p: self._mha(f"{p}.encoder_attn", y, memory, heads, cross_allowed))
            x = self._sublayer(x, f"{p}.final_layer_norm", pre, lambda y, p=p: self._ffn(y, p))
        if pre and not self.o["no_decoder_final_norm"]:
            x = self._ln(x, "decoder.layer_norm")
        if self.o["share_all_embeddings"]:
            out = self.w["encoder.embed_tokens.weight"]
        elif self.o["share_decoder_input_output_embed"]:
            out = self.w["decoder.embed_tokens.weight"]
        else:
            out = self.w["decoder.output_projection.weight"]
        return log_softmax(x @ out.T)

    def backend(self) -> PrefixBackend:
        return PrefixBackend(self.encode, lambda memory, mask, prefix: self.decode(memory, mask, prefix)[:, -1],
                             self.pad)
