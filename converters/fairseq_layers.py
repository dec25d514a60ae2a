"""fairseq's Transformer layer names -> canonical names, for every reader of that family.

fairseq's ``TransformerEncoderLayer`` / ``TransformerDecoderLayer`` name their parts ``self_attn.{q,k,v,out}_proj``,
``self_attn_layer_norm``, ``encoder_attn`` (+ ``_layer_norm``), ``fc1``, ``fc2`` and ``final_layer_norm``, and
transformers kept these names in the models it ported from fairseq (Marian, FSMT, BART). Every tensor is a torch
``nn.Linear`` / ``nn.LayerNorm`` parameter: kernels are stored ``[out, in]`` and transposed here into the spec's
``[in, out]``. Whether a layer norm comes before or after its sub-layer is the spec's ``pre_norm``, not a name.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from converters.spec import TransformerConfig

Take = Callable[[str], "np.ndarray | None"]
"""``take(name)``: the checkpoint tensor under ``name`` (removed from what is left to map), or None."""


def linear_kernel(w: np.ndarray) -> np.ndarray:
    """``nn.Linear``'s ``[out, in]`` as the spec's ``[in, out]`` (a mis-shaped tensor is kept so validate() names it)."""
    return np.ascontiguousarray(w.T) if w.ndim == 2 else w


def map_layers(take: Take, config: TransformerConfig, prefix: str = "") -> dict[str, np.ndarray]:
    """Every encoder and decoder layer's tensors (``{prefix}encoder.layers.{i}.…``) under canonical names.

    Missing tensors are simply absent from the result (``TransformerSpec.validate`` lists them).
    """
    weights: dict[str, np.ndarray] = {}

    def linear(dst: str, src: str) -> None:
        for suffix in ("weight", "bias"):
            array = take(f"{src}.{suffix}")
            if array is not None:
                weights[f"{dst}.{suffix}"] = linear_kernel(array) if suffix == "weight" else array

    def layer_norm(dst: str, src: str) -> None:
        for ours, theirs in (("scale", "weight"), ("bias", "bias")):
            array = take(f"{src}.{theirs}")
            if array is not None:
                weights[f"{dst}.{ours}"] = array

    def attention(dst: str, src: str) -> None:
        for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
            linear(f"{dst}.{ours}", f"{src}.{theirs}")

    for side, stack in (("encoder", config.encoder), ("decoder", config.decoder)):
        for i in range(stack.layers):
            ours, theirs = f"{side}.layers.{i}", f"{prefix}{side}.layers.{i}"
            attention(f"{ours}.self_attn", f"{theirs}.self_attn")
            layer_norm(f"{ours}.self_attn_norm", f"{theirs}.self_attn_layer_norm")
            if side == "decoder":
                attention(f"{ours}.cross_attn", f"{theirs}.encoder_attn")
                layer_norm(f"{ours}.cross_attn_norm", f"{theirs}.encoder_attn_layer_norm")
            linear(f"{ours}.ffn.fc1", f"{theirs}.fc1")
            linear(f"{ours}.ffn.fc2", f"{theirs}.fc2")
            layer_norm(f"{ours}.ffn_norm", f"{theirs}.final_layer_norm")
    return weights


def sinusoidal_positions(max_positions: int, dim: int, padding_idx: int) -> np.ndarray:
    """fairseq's ``SinusoidalPositionalEmbedding`` table as the spec wants it: row p is source/step position p.

    fairseq numbers the positions of a sentence from ``padding_idx + 1`` (``make_positions``) and builds the table
    over those numbers (sines in the first half, cosines in the second, frequencies ``10000 ** (-i / (half - 1))``),
    computed in float32 as fairseq does; the rows before ``padding_idx + 1`` are never used and are cut off here.
    """
    half = dim // 2
    scale = np.float32(-math.log(10000) / (half - 1))
    # float32 arguments, each function correctly rounded to float32 (what torch's kernels give, within 1 ulp).
    freqs = np.exp((np.arange(half, dtype=np.float32) * scale).astype(np.float64)).astype(np.float32)
    angles = np.arange(padding_idx + 1, padding_idx + 1 + max_positions, dtype=np.float32)[:, None] * freqs[None, :]
    wide = angles.astype(np.float64)
    table = np.concatenate([np.sin(wide), np.cos(wide)], axis=1).astype(np.float32)
    if dim % 2:
        table = np.concatenate([table, np.zeros((max_positions, 1), dtype=np.float32)], axis=1)
    return np.ascontiguousarray(table, dtype=np.float32)
