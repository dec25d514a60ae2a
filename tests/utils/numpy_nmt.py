"""The arithmetic the framework references in tests share (float64 numpy): layer norm, activations, multi-head
attention over explicit masks, log-softmax. Each framework reference (fairseq_reference.py, marian_npz_reference.py,
onmt_reference.py) builds its own model from its own parameter names on top of these; none uses converters/."""

from __future__ import annotations

import math

import numpy as np

NEG = -1e30  # a masked score: exp() underflows to exactly 0


def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return np.asarray((x - mean) / np.sqrt(var + eps) * scale + bias)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return np.asarray(e / e.sum(axis=-1, keepdims=True))


def log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return np.asarray(shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True)))


def activation(name: str, x: np.ndarray) -> np.ndarray:
    """relu, gelu (erf), gelu_tanh, gelu_sigmoid (x * sigmoid(1.702 x)), swish."""
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "swish":
        return np.asarray(x / (1.0 + np.exp(-x)))
    if name == "gelu_sigmoid":
        return np.asarray(x / (1.0 + np.exp(-1.702 * x)))
    if name == "gelu_tanh":
        return np.asarray(0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))))
    if name == "gelu":
        from scipy.special import erf  # scipy comes with the convert extra (nncf)

        return np.asarray(0.5 * x * (1.0 + erf(x / math.sqrt(2.0))))
    raise ValueError(name)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int, allowed: np.ndarray) -> np.ndarray:
    """Scaled dot-product attention of already projected ``q [B,Tq,D]``, ``k``/``v [B,Tk,D]`` split into ``heads``;
    ``allowed [B,Tq,Tk]`` (or broadcastable) says which keys each query sees."""
    b, tq, d = q.shape
    dh = d // heads

    def split(x: np.ndarray) -> np.ndarray:
        return x.reshape(x.shape[0], x.shape[1], heads, dh).transpose(0, 2, 1, 3)

    scores = split(q) @ split(k).transpose(0, 1, 3, 2) / math.sqrt(dh)
    scores = np.where(np.broadcast_to(allowed[:, None], scores.shape), scores, NEG)
    ctx = softmax(scores) @ split(v)
    return np.asarray(ctx.transpose(0, 2, 1, 3).reshape(b, tq, d))


def causal(length: int) -> np.ndarray:
    """``[1, T, T]``: query t sees keys 0..t."""
    return np.tril(np.ones((length, length), dtype=bool))[None]
