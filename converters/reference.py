"""A plain numpy forward pass of a TransformerSpec: the framework-neutral parity reference.

Same I/O as the ONNX graphs (docs/architecture.md), written the textbook way (per-layer cache concat, explicit
head split, unfused projections) and computed in float64, so it shares no shortcut with ``onnx_emitter`` and its
own rounding error is far below what it checks. Slow; used by ``convert`` and ``verify`` on a few short inputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from converters.spec import MASK_VALUE, Stack, TransformerSpec
from serving.engine.backends.base import EncoderOutput


def _layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    out: np.ndarray = (x - mean) / np.sqrt(var + eps) * scale + bias
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; math.erf per element is exact enough and only used on small reference inputs.
    import math

    return np.asarray(np.vectorize(math.erf, otypes=[np.float64])(x))


class ReferenceModel:
    """encode / decode_step in numpy with the ONNX graphs' I/O (outputs float32); satisfies the Backend protocol."""

    def __init__(self, spec: TransformerSpec) -> None:
        from threadpoolctl import ThreadpoolController

        # numpy's OpenBLAS pool and torch's OpenMP pool both spin-wait; in one process (tests, verify --source) on a
        # small machine they livelock for minutes. The reference runs BLAS single-threaded: it is small work.
        self._blas = ThreadpoolController()
        self.spec = spec
        self.c = spec.config
        self.w = {name: array.astype(np.float64) for name, array in spec.weights.items()}

    # --- pieces -----------------------------------------------------------------------------------------------
    def _linear(self, x: np.ndarray, prefix: str) -> np.ndarray:
        kernel = self.w[f"{prefix}.weight"]
        # One 2-D GEMM: numpy runs [B,T,D] @ [D,F] as B separate small products.
        y = (x.reshape(-1, x.shape[-1]) @ kernel).reshape(*x.shape[:-1], kernel.shape[1])
        bias = self.w.get(f"{prefix}.bias")
        return y if bias is None else y + bias

    def _norm(self, x: np.ndarray, prefix: str) -> np.ndarray:
        return _layer_norm(x, self.w[f"{prefix}.scale"], self.w[f"{prefix}.bias"], self.c.norm_epsilon)

    @staticmethod
    def _act(x: np.ndarray, kind: str) -> np.ndarray:
        if kind == "relu":
            return np.asarray(np.maximum(x, 0.0))
        if kind == "swish":
            return np.asarray(x / (1.0 + np.exp(-x)))
        if kind == "gelu_sigmoid":
            return np.asarray(x / (1.0 + np.exp(-1.702 * x)))
        if kind == "gelu_tanh":
            return np.asarray(0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3))))
        return np.asarray(0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))))

    def _ffn(self, x: np.ndarray, prefix: str, stack: Stack) -> np.ndarray:
        return self._linear(self._act(self._linear(x, f"{prefix}.fc1"), stack.activation), f"{prefix}.fc2")

    @staticmethod
    def _split(x: np.ndarray, stack: Stack) -> np.ndarray:
        b, t, _ = x.shape
        return x.reshape(b, t, stack.heads, stack.head_dim).transpose(0, 2, 1, 3)

    def _attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
        if bias is not None:
            scores = scores + bias
        ctx = _softmax(scores) @ v  # [B,H,Tq,Dh]
        b, _, t, _ = ctx.shape
        return np.asarray(ctx.transpose(0, 2, 1, 3).reshape(b, t, self.c.d_model))

    def _sublayer(self, x: np.ndarray, prefix: str, stack: Stack,
                  fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        if stack.pre_norm:
            return np.asarray(x + fn(self._norm(x, f"{prefix}_norm")))
        return self._norm(x + fn(x), f"{prefix}_norm")

    def _embed(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        x = table[ids] * self.c.embedding_scale
        zero_id = self.spec.special_ids.zero_embedding_id
        if zero_id is not None:
            x = x * (ids != zero_id)[..., None]
        return np.asarray(x)

    def _positions(self, side: str) -> np.ndarray:
        return self.w["positions" if self.c.shared_positions else f"{side}.positions"]

    def _embed_norm(self, x: np.ndarray, side: str, stack: Stack) -> np.ndarray:
        return self._norm(x, f"{side}.embed_norm") if stack.embed_norm else x

    # --- the contract -----------------------------------------------------------------------------------------
    def encode(self, input_ids: np.ndarray) -> EncoderOutput:
        """input_ids [B,S] -> memory [B,S,D], cross_kv [L,2,B,H,S,Dh], src_bias [B,1,1,S]."""
        with self._blas.limit(limits=1, user_api="blas"):
            return self._encode(input_ids)

    def decode_step(self, input_ids: np.ndarray, step: int | np.ndarray, past_kv: np.ndarray, cross_kv: np.ndarray,
                    src_bias: np.ndarray, self_bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One token per row at position ``step`` (one for all rows, or ``[B]``) -> (log_probs [B,V], present_kv
        [L,2,B,H,T+1,Dh]); ``self_bias [B,1,1,T]`` is added to the scores of the cached slots (None: nothing)."""
        with self._blas.limit(limits=1, user_api="blas"):
            return self._decode_step(input_ids, step, past_kv, cross_kv, src_bias, self_bias)

    def _encode(self, input_ids: np.ndarray) -> EncoderOutput:
        c, enc, dec = self.c, self.c.encoder, self.c.decoder
        s = input_ids.shape[1]
        x = self._embed(self.w["encoder.embed_tokens"], input_ids)
        if c.encoder_embed_bias:
            x = x + self.w["encoder.embed_bias"]
        x = self._embed_norm(x + self._positions("encoder")[:s], "encoder", enc)
        masked = input_ids == self.spec.special_ids.pad
        if c.mask_source_eos:
            masked |= input_ids == self.spec.special_ids.eos
        bias = np.where(masked, MASK_VALUE, 0.0)[:, None, None, :]
        for i in range(enc.layers):
            p = f"encoder.layers.{i}"

            def attn(y: np.ndarray, p: str = p) -> np.ndarray:
                q, k, v = (self._split(self._linear(y, f"{p}.self_attn.{n}"), enc) for n in "qkv")
                return self._linear(self._attend(q, k, v, bias), f"{p}.self_attn.o")

            x = self._sublayer(x, f"{p}.self_attn", enc, attn)
            x = self._sublayer(x, f"{p}.ffn", enc, functools.partial(self._ffn, prefix=f"{p}.ffn", stack=enc))
        if enc.final_norm:
            x = self._norm(x, "encoder.final_norm")
        cross = np.stack([
            np.stack([self._split(self._linear(x, f"decoder.layers.{i}.cross_attn.{n}"), dec) for n in "kv"])
            for i in range(dec.layers)
        ])
        return EncoderOutput(memory=x.astype(np.float32), cross_kv=cross.astype(np.float32),
                             src_bias=bias.astype(np.float32))

    def _decode_step(self, input_ids: np.ndarray, step: int | np.ndarray, past_kv: np.ndarray, cross_kv: np.ndarray,
                     src_bias: np.ndarray, self_bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        c, dec = self.c, self.c.decoder
        table = self.w["encoder.embed_tokens" if c.shared_embeddings else "decoder.embed_tokens"]
        positions = np.asarray(step, dtype=np.int64)
        rows = positions if positions.ndim == 0 else positions.reshape(-1, 1)
        x = self._embed(table, input_ids)
        if c.decoder_start_zero:  # a row's first step embeds to zeros (Marian NMT)
            x = x * (np.broadcast_to(rows, input_ids.shape) != 0)[..., None]
        x = self._embed_norm(x + self._positions("decoder")[rows], "decoder", dec)
        mask = None
        if self_bias is not None:  # the new token's own slot is never masked
            mask = np.concatenate([self_bias, np.zeros(self_bias.shape[:3] + (1,))], axis=3).astype(np.float64)
        past = past_kv.astype(np.float64)
        cross = cross_kv.astype(np.float64)
        bias = src_bias.astype(np.float64)
        present = []
        for i in range(dec.layers):
            p = f"decoder.layers.{i}"

            def self_attn(y: np.ndarray, p: str = p, i: int = i) -> np.ndarray:
                q, k, v = (self._split(self._linear(y, f"{p}.self_attn.{n}"), dec) for n in "qkv")
                k = np.concatenate([past[i, 0], k], axis=2)
                v = np.concatenate([past[i, 1], v], axis=2)
                present.append(np.stack([k, v]))
                return self._linear(self._attend(q, k, v, mask), f"{p}.self_attn.o")

            def cross_attn(y: np.ndarray, p: str = p, i: int = i) -> np.ndarray:
                q = self._split(self._linear(y, f"{p}.cross_attn.q"), dec)
                return self._linear(self._attend(q, cross[i, 0], cross[i, 1], bias), f"{p}.cross_attn.o")

            x = self._sublayer(x, f"{p}.self_attn", dec, self_attn)
            x = self._sublayer(x, f"{p}.cross_attn", dec, cross_attn)
            x = self._sublayer(x, f"{p}.ffn", dec, functools.partial(self._ffn, prefix=f"{p}.ffn", stack=dec))
        if dec.final_norm:
            x = self._norm(x, "decoder.final_norm")
        out = self.w["decoder.output_proj"] if not c.tied_output else table
        logits = x[:, 0] @ out.T
        if c.logits_bias:
            logits = logits + self.w["decoder.output_bias"]
        log_probs = logits - logits.max(axis=-1, keepdims=True)
        log_probs = log_probs - np.log(np.exp(log_probs).sum(axis=-1, keepdims=True))
        return log_probs.astype(np.float32), np.stack(present).astype(np.float32)
