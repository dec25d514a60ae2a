"""Random TransformerSpecs for emitter and backend tests (no torch, no transformers: fast).

``random_spec(**options)`` fills every weight ``expected_weights`` asks for with seeded random values; options are
TransformerConfig fields (``pre_norm=True``, ``activation="gelu"``...) plus ``zero_embedding_id``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from converters.marian import sinusoidal_positions
from converters.spec import DecodingDefaults, SpecialIds, TransformerConfig, TransformerSpec, expected_weights

PAD, EOS, START = 0, 1, 0


def random_spec(seed: int = 0, zero_embedding_id: int | None = None, **options: Any) -> TransformerSpec:
    """A small random model (d_model 16, 2 heads, 2+2 layers, vocab 40 unless overridden)."""
    fields: dict[str, Any] = {
        "source_vocab_size": 40,
        "target_vocab_size": 40,
        "d_model": 16,
        "num_heads": 2,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "ffn_dim": 24,
        "activation": "relu",
        "pre_norm": False,
        "encoder_final_norm": False,
        "decoder_final_norm": False,
        "norm_epsilon": 1e-6,
        "embedding_scale": math.sqrt(16),
        "max_positions": 64,
        "shared_embeddings": True,
        "tied_output": True,
        "attention_bias": True,
        "ffn_bias": True,
        "logits_bias": True,
        "encoder_embed_bias": False,
    } | options
    if "embedding_scale" not in options:
        fields["embedding_scale"] = math.sqrt(fields["d_model"])
    config = TransformerConfig(**fields)
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in expected_weights(config).items():
        if name == "positions":
            weights[name] = sinusoidal_positions(shape[0], shape[1])
        elif name.endswith(".positions"):  # a stack's own table: learned-like values
            weights[name] = (0.3 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith(".scale"):
            weights[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            std = 0.5 if "embed" in name or "output" in name else 0.3
            weights[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    special = SpecialIds(pad=PAD, eos=EOS, decoder_start=START, unk=2, zero_embedding_id=zero_embedding_id)
    spec = TransformerSpec(config=config, special_ids=special, decoding=DecodingDefaults(max_length=20),
                           weights=weights)
    spec.validate()
    return spec


def padded_batch(rows: list[list[int]], pad: int = PAD) -> np.ndarray:
    """Right-pad id rows into an int64 ``[B, S]`` array."""
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out
