"""An independent numpy forward pass of a Marian NMT transformer, from Marian's parameter names and options.

Written from Marian's ``src/models/transformer.h``: the embedding times ``sqrt(dim-emb)`` plus
``addPositionalEmbeddings`` (``num_timescales = dim / 2``, increment ``log(10000) / (num_timescales - 1)``, sines
then cosines), or the learned ``Wpos`` unscaled; ``preProcess`` / ``postProcess`` applying the option strings
letter by letter (``n`` a layer norm ``<prefix>_ln_scale[_pre]``, ``a`` the residual, ``d`` dropout: nothing at
inference) around ``<prefix>_self`` / ``_context`` attention (``_Wq``... ``_Wo`` as ``x @ W + b``) and the
``_ffn`` block; ``_top`` after the stack; epsilon 1e-6. The decoder's first input is an all-zero embedding; logits
are ``decoder_ff_logit_out`` (or the transposed embedding when tied) plus its bias. Whole sequences, no cache.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tests.utils.numpy_nmt import activation, attention, causal, layer_norm, log_softmax
from tests.utils.prefix_backend import PrefixBackend


def marian_sinusoids(length: int, dim: int) -> np.ndarray:
    timescales = dim / 2
    increment = math.log(10000.0) / (timescales - 1)
    table = np.zeros((length, dim))
    for i in range(int(timescales)):
        v = np.arange(length) * math.exp(i * -increment)
        table[:, i] = np.sin(v)
        table[:, int(timescales) + i] = np.cos(v)
    return table


class MarianNpzReference:
    """Marian's forward pass over ``tensors`` (Marian names) with the model options ``opts``."""

    def __init__(self, tensors: dict[str, np.ndarray], opts: dict[str, Any], pad: int) -> None:
        self.w = {k: v.astype(np.float64) for k, v in tensors.items()}
        self.o, self.pad = opts, pad
        self.d = int(opts["dim-emb"])

    def _ln(self, x: np.ndarray, prefix: str, suffix: str) -> np.ndarray:
        return layer_norm(x, self.w[f"{prefix}_ln_scale{suffix}"][0], self.w[f"{prefix}_ln_bias{suffix}"][0], 1e-6)

    def _pre(self, prefix: str, ops: str, x: np.ndarray) -> np.ndarray:
        for op in ops:
            if op == "n":
                x = self._ln(x, prefix, "_pre")
        return x

    def _post(self, prefix: str, ops: str, x: np.ndarray, previous: np.ndarray) -> np.ndarray:
        for op in ops:
            if op == "a":
                x = x + previous
            elif op == "n":
                x = self._ln(x, prefix, "")
        return x

    def _dense(self, x: np.ndarray, w: str, b: str) -> np.ndarray:
        return np.asarray(x @ self.w[w] + self.w[b][0])

    def _attention(self, prefix: str, x: np.ndarray, memory: np.ndarray | None, allowed: np.ndarray) -> np.ndarray:
        y = self._pre(f"{prefix}_Wo", self.o["transformer-preprocess"], x)
        kv = y if memory is None else memory
        q, k, v = (self._dense(src, f"{prefix}_W{p}", f"{prefix}_b{p}") for p, src in (("q", y), ("k", kv), ("v", kv)))
        out = self._dense(attention(q, k, v, int(self.o["transformer-heads"]), allowed), f"{prefix}_Wo", f"{prefix}_bo")
        return self._post(f"{prefix}_Wo", self.o["transformer-postprocess"], out, x)

    def _ffn(self, prefix: str, x: np.ndarray) -> np.ndarray:
        y = self._pre(f"{prefix}_ffn", self.o["transformer-preprocess"], x)
        name = {"gelu": "gelu_sigmoid"}.get(self.o["transformer-ffn-activation"], self.o["transformer-ffn-activation"])
        y = self._dense(activation(name, self._dense(y, f"{prefix}_W1", f"{prefix}_b1")), f"{prefix}_W2",
                        f"{prefix}_b2")
        return self._post(f"{prefix}_ffn", self.o["transformer-postprocess"], y, x)

    def _table(self, side: str) -> np.ndarray:
        o = self.o
        if o["tied-embeddings-all"] or o["tied-embeddings-src"]:
            return self.w["Wemb"]
        return self.w[f"{side}_Wemb"]

    def _embed(self, side: str, vectors: np.ndarray) -> np.ndarray:
        length = vectors.shape[1]
        if self.o["transformer-train-position-embeddings"]:
            x = vectors + self.w["Wpos"][:length]
        else:
            x = vectors * math.sqrt(self.d) + marian_sinusoids(length, self.d)
        return self._pre(f"{side}_emb", self.o["transformer-postprocess-emb"], x)

    def _top(self, side: str, x: np.ndarray) -> np.ndarray:
        return self._post(f"{side}_top", self.o["transformer-postprocess-top"], x, x)

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        x = self._embed("encoder", self._table("encoder")[np.where(mask, ids, 0)])
        allowed = np.broadcast_to(mask[:, None, :], (ids.shape[0], ids.shape[1], ids.shape[1]))
        for i in range(1, int(self.o["enc-depth"]) + 1):
            x = self._attention(f"encoder_l{i}_self", x, None, allowed)
            x = self._ffn(f"encoder_l{i}_ffn", x)
        return self._top("encoder", x)

    def decode(self, memory: np.ndarray, mask: np.ndarray, prefix: np.ndarray) -> np.ndarray:
        """log-probs ``[B, T, V]`` after each prefix position (position 0, the start, embeds to zeros)."""
        vectors = self._table("decoder")[prefix]
        vectors[:, 0] = 0.0
        x = self._embed("decoder", vectors)
        self_allowed, cross_allowed = causal(prefix.shape[1]), mask[:, None, :]
        for i in range(1, int(self.o["dec-depth"]) + 1):
            x = self._attention(f"decoder_l{i}_self", x, None, self_allowed)
            x = self._attention(f"decoder_l{i}_context", x, memory, cross_allowed)
            x = self._ffn(f"decoder_l{i}_ffn", x)
        x = self._top("decoder", x)
        if self.o["tied-embeddings"] or self.o["tied-embeddings-all"]:
            logits = x @ self._table("decoder").T
        else:
            logits = x @ self.w["decoder_ff_logit_out_W"]
        if "decoder_ff_logit_out_b" in self.w:
            logits = logits + self.w["decoder_ff_logit_out_b"][0]
        return log_softmax(logits)

    def backend(self) -> PrefixBackend:
        return PrefixBackend(self.encode, lambda memory, mask, prefix: self.decode(memory, mask, prefix)[:, -1],
                             self.pad)
