"""The graph contract of a package: the input and output names of the two graphs, and the padding mask value.

Both runtimes run the same two graphs (docs/architecture.md, "ONNX graph contract"). ``converters`` emits them with
these names; ``serving.engine.backends`` feeds and reads them by these names.
"""

from __future__ import annotations

# Additive attention bias at source padding (the graphs' ``src_bias``) and at cache slots a row has not filled
# (``self_bias``). T2T uses -1e9; transformers uses finfo(float32).min. Both make the softmax weight exactly 0 in
# float32; -1e9 stays finite in reduced-precision (bf16/fp16) runtimes.
MASK_VALUE = -1e9

ENCODER_OUTPUTS = ("memory", "cross_kv", "src_bias")
"""``memory [B, S, D]``, ``cross_kv [L, 2, B, H, S, Dh]``, ``src_bias [B, 1, 1, S]``."""


# The decoder-step graph's cache tensors, one per layer and kind (keys, values), each [B, H, T, Dh]; callers hold
# them stacked as [L, 2, B, H, T, Dh] and pass views (``cache[i, 0]`` is ``past_k.{i}``).
def past_names(layers: int) -> list[str]:
    """Self-attention cache inputs, in ``[L, 2]`` order."""
    return [f"past_{kind}.{i}" for i in range(layers) for kind in "kv"]


def cross_names(layers: int) -> list[str]:
    """Cross-attention key/value inputs (the encoder's ``cross_kv``), in ``[L, 2]`` order."""
    return [f"cross_{kind}.{i}" for i in range(layers) for kind in "kv"]


def present_names(layers: int) -> list[str]:
    """Self-attention cache outputs (past + this step), in ``[L, 2]`` order."""
    return [f"present_{kind}.{i}" for i in range(layers) for kind in "kv"]


def stacked(names: list[str]) -> list[tuple[str, tuple[int, int]]]:
    """Each name of ``past_names``/``cross_names``/``present_names`` with its ``(layer, kind)`` index into the
    stacked ``[L, 2, ...]`` cache."""
    return [(name, divmod(position, 2)) for position, name in enumerate(names)]
