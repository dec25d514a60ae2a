"""TransformerSpec: one framework-neutral description of an encoder-decoder Transformer.

Readers (``converters/marian.py``, ``converters/t2t.py``) fill it; ``converters/onnx_emitter.py`` turns it into
ONNX graphs. Weights are float32 numpy arrays under the canonical names listed by :func:`expected_weights`.

Conventions (every reader converts to these):
- Dense kernels are stored ``[in, out]`` and applied as ``y = x @ W + b`` (TF layout; HF ``nn.Linear`` is transposed).
- Embedding and output-projection matrices are ``[vocab, d_model]``; logits are ``h @ E.T (+ bias)``.
- ``positions`` is a ``[max_positions, d_model]`` table added after the scaled token embedding; position p is row p,
  in the encoder (source position) and the decoder (step index, the start token is step 0). Without
  ``shared_positions`` each stack has its own table, ``encoder.positions`` and ``decoder.positions``.
- Norm names are the same for pre-norm and post-norm layers: ``self_attn_norm`` is the norm that belongs to the
  self-attention sub-layer, applied before it (pre-norm) or after its residual add (post-norm).
- Each stack has its own shape (``config.encoder`` / ``config.decoder``: layers, heads, FFN width, activation, norm
  placement, final norm, embedding norm); ``d_model``, the norm epsilon and the embedding scale are shared.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

# The package format owns these (serving reads them); readers and the emitter use them under their usual names.
from serving.package import MASK_VALUE, DecodingDefaults, SpecialIds, cross_names, past_names, present_names, stacked
from serving.package import Architecture as TransformerConfig
from serving.package.manifest import Activation, LengthPenaltyKind, Stack

__all__ = [
    "MASK_VALUE", "Activation", "DecodingDefaults", "LengthPenaltyKind", "SpecialIds", "Stack", "TransformerConfig",
    "TransformerSpec", "config_problems", "cross_names", "expected_weights", "past_names", "present_names", "stacked",
]

_SUPPORTED_ACTIVATIONS: tuple[str, ...] = typing.get_args(Activation)


def _attention(prefix: str, d: int, bias: bool) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for proj in ("q", "k", "v", "o"):
        shapes[f"{prefix}.{proj}.weight"] = (d, d)
        if bias:
            shapes[f"{prefix}.{proj}.bias"] = (d,)
    return shapes


def _norm(prefix: str, d: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.scale": (d,), f"{prefix}.bias": (d,)}


def _ffn(prefix: str, d: int, f: int, bias: bool) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {f"{prefix}.fc1.weight": (d, f), f"{prefix}.fc2.weight": (f, d)}
    if bias:
        shapes[f"{prefix}.fc1.bias"] = (f,)
        shapes[f"{prefix}.fc2.bias"] = (d,)
    return shapes


def expected_weights(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical weight name this config needs, with its shape."""
    d = config.d_model
    shapes: dict[str, tuple[int, ...]] = {"encoder.embed_tokens": (config.source_vocab_size, d)}
    if config.shared_positions:
        shapes["positions"] = (config.max_positions, d)
    else:
        shapes["encoder.positions"] = shapes["decoder.positions"] = (config.max_positions, d)
    if config.encoder_embed_bias:
        shapes["encoder.embed_bias"] = (d,)
    if not config.shared_embeddings:
        shapes["decoder.embed_tokens"] = (config.target_vocab_size, d)
    if not config.tied_output:
        shapes["decoder.output_proj"] = (config.target_vocab_size, d)
    if config.logits_bias:
        shapes["decoder.output_bias"] = (config.target_vocab_size,)
    for side, stack in (("encoder", config.encoder), ("decoder", config.decoder)):
        if stack.embed_norm:
            shapes |= _norm(f"{side}.embed_norm", d)
        for i in range(stack.layers):
            p = f"{side}.layers.{i}"
            shapes |= _attention(f"{p}.self_attn", d, config.attention_bias) | _norm(f"{p}.self_attn_norm", d)
            if side == "decoder":
                shapes |= _attention(f"{p}.cross_attn", d, config.attention_bias) | _norm(f"{p}.cross_attn_norm", d)
            shapes |= _ffn(f"{p}.ffn", d, stack.ffn_dim, config.ffn_bias) | _norm(f"{p}.ffn_norm", d)
        if stack.final_norm:
            shapes |= _norm(f"{side}.final_norm", d)
    return shapes


@dataclass
class TransformerSpec:
    """A complete model: hyperparameters, special ids, decoding defaults and weights."""

    config: TransformerConfig
    special_ids: SpecialIds
    decoding: DecodingDefaults
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    def validate(self) -> None:
        """Check every option and weight; raise one ValueError listing all problems.

        Raises:
            ValueError: unsupported options, missing, unexpected, mis-shaped or non-finite weights.
        """
        problems = config_problems(self.config)
        if problems:
            # Shapes cannot be derived from an invalid config; report what we know.
            raise ValueError("unsupported model:\n  " + "\n  ".join(problems))
        expected = expected_weights(self.config)
        for name, shape in expected.items():
            array = self.weights.get(name)
            if array is None:
                problems.append(f"missing weight {name} {list(shape)}")
            elif tuple(array.shape) != shape:
                problems.append(f"weight {name} has shape {list(array.shape)}, expected {list(shape)}")
            elif array.dtype != np.float32:
                problems.append(f"weight {name} has dtype {array.dtype}, expected float32")
            elif not np.isfinite(array).all():
                problems.append(f"weight {name} contains NaN or Inf")
        for name in sorted(set(self.weights) - set(expected)):
            problems.append(f"unexpected weight {name}")
        ids = self.special_ids
        for label, value in (("eos", ids.eos), ("decoder_start", ids.decoder_start)):
            if not 0 <= value < self.config.target_vocab_size:
                problems.append(f"special id {label}={value} is outside the target vocabulary")
        # pad only pads sources (the decoder is never fed it); EOS ends sources too.
        for label, value in (("pad", ids.pad), ("eos", ids.eos)):
            if not 0 <= value < self.config.source_vocab_size:
                problems.append(f"special id {label}={value} is outside the source vocabulary")
        if problems:
            raise ValueError("invalid model:\n  " + "\n  ".join(problems))

    def config_dict(self) -> dict[str, Any]:
        return asdict(self.config)


def config_problems(config: TransformerConfig) -> list[str]:
    """Reasons this config cannot be emitted (empty when it can)."""
    problems: list[str] = []
    for side, stack in (("encoder", config.encoder), ("decoder", config.decoder)):
        if stack.activation not in _SUPPORTED_ACTIVATIONS:
            problems.append(f"{side} activation {stack.activation!r} (supported activations are: "
                            f"{', '.join(_SUPPORTED_ACTIVATIONS)})")
        if stack.heads <= 0 or config.d_model % stack.heads:
            problems.append(f"d_model {config.d_model} is not divisible by the {side}'s {stack.heads} heads")
        for name in ("layers", "ffn_dim"):
            if getattr(stack, name) <= 0:
                problems.append(f"{side} {name} must be positive, got {getattr(stack, name)}")
    for name in ("max_positions", "source_vocab_size", "target_vocab_size"):
        if getattr(config, name) <= 0:
            problems.append(f"{name} must be positive, got {getattr(config, name)}")
    if config.shared_embeddings and config.source_vocab_size != config.target_vocab_size:
        problems.append("shared_embeddings needs equal source and target vocabulary sizes")
    return problems
