"""Hugging Face Marian (opus-mt layout) -> TransformerSpec.

A local directory with ``config.json`` (``model_type: marian``), ``model.safetensors`` (or a sharded
``model.safetensors.index.json``, or ``pytorch_model.bin``), ``source.spm``, ``target.spm``, ``vocab.json`` and
optionally ``generation_config.json``. No hub access.

The math is transformers' ``MarianMTModel``: post-norm layers, no final norms, token embedding times
``sqrt(d_model)`` when ``scale_embedding``, a sinusoidal position table (sines in the first half, cosines in the
second, not interleaved), ``lm_head`` tied to the embedding and ``final_logits_bias`` added to the logits. Encoder and
decoder each have their own depth, heads and FFN width; the vocabularies and embeddings are shared or separate
(``share_encoder_decoder_embeddings``), the output projection tied or not (``tie_word_embeddings``).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from converters.base import Converter, LoadedModel, cannot_convert, read_json
from converters.fairseq_layers import map_layers
from converters.hf_generation import generation_defaults
from converters.hf_weights import WEIGHT_FILES, load_hf_weights
from converters.spec import Activation, SpecialIds, TransformerConfig, TransformerSpec

logger = logging.getLogger(__name__)

# HF activation names (transformers' ACT2FN) -> ours. "gelu" is the exact erf form, "gelu_new" and its twins the
# tanh approximation, "quick_gelu" x * sigmoid(1.702 x).
HF_ACTIVATIONS: dict[str, Activation] = {
    "relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu", "gelu_python": "gelu",
    "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_accurate": "gelu_tanh",
    "quick_gelu": "gelu_sigmoid",
}

# MarianConfig defaults (transformers 4.x), used when config.json omits a key.
_CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 58101,
    "decoder_vocab_size": None,
    "max_position_embeddings": 1024,
    "encoder_layers": 12,
    "encoder_ffn_dim": 4096,
    "encoder_attention_heads": 16,
    "decoder_layers": 12,
    "decoder_ffn_dim": 4096,
    "decoder_attention_heads": 16,
    "activation_function": "gelu",
    "d_model": 1024,
    "decoder_start_token_id": 58100,
    "scale_embedding": False,
    "pad_token_id": 58100,
    "eos_token_id": 0,
    "forced_eos_token_id": 0,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
}

# Options older converted configs carry that transformers' Marian code ignores: a value other than the one below
# means the checkpoint was trained with an architecture MarianMTModel (and we) do not implement.
_FIXED_OPTIONS: dict[str, Any] = {
    "normalize_before": False,
    "normalize_embedding": False,
    "add_final_layer_norm": False,
    "static_position_embeddings": True,
    "add_bias_logits": False,
    "is_encoder_decoder": True,
}

_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")


def sinusoidal_positions(num_positions: int, dim: int) -> np.ndarray:
    """transformers' ``MarianSinusoidalPositionalEmbedding`` table, computed the same way (float64, then float32)."""
    pos = np.arange(num_positions, dtype=np.float64)[:, None]
    j = np.arange(dim, dtype=np.float64)[None, :]
    position_enc = pos / np.power(10000, 2 * np.floor(j / 2) / dim)
    out = np.empty((num_positions, dim), dtype=np.float32)
    sentinel = dim // 2 if dim % 2 == 0 else dim // 2 + 1
    out[:, :sentinel] = np.sin(position_enc[:, 0::2]).astype(np.float32)
    out[:, sentinel:] = np.cos(position_enc[:, 1::2]).astype(np.float32)
    return out


class MarianConverter(Converter):
    """Reads a Hugging Face Marian directory (opus-mt layout) into a TransformerSpec."""

    framework = "marian"
    layout = ("a Hugging Face Marian directory (opus-mt): config.json of model_type marian, model.safetensors, "
              "source.spm, target.spm, vocab.json")

    @classmethod
    def detect(cls, source_dir: Path) -> bool:
        config = source_dir / "config.json"
        if not config.is_file():
            return False
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return False
        return isinstance(data, dict) and data.get("model_type") == "marian"

    def load(self) -> LoadedModel:
        """Read config, generation config, tokenizer files and weights.

        Returns:
            The spec (float32 weights under canonical names), the tokenizer manifest entry and its files.

        Raises:
            ConversionError: listing every unsupported option and missing file at once.
        """
        src = self.source_dir
        problems: list[str] = [f"option {name!r} does not apply to Marian checkpoints" for name in self.options]
        if not (src / "config.json").is_file():
            raise cannot_convert(src, "Marian", [*problems, "missing config.json"])
        hf = _CONFIG_DEFAULTS | read_json(src / "config.json")
        problems += _config_problems(hf)
        missing = [name for name in _TOKENIZER_FILES if not (src / name).is_file()]
        shared = bool(hf["share_encoder_decoder_embeddings"])
        if not shared and not (src / "target_vocab.json").is_file():
            missing.append("target_vocab.json (separate source and target vocabularies)")
        if missing:
            problems.append(f"missing vocab/tokenizer file(s): {', '.join(missing)}")
        if not any((src / name).is_file() for name in WEIGHT_FILES):
            problems.append(f"no weights (expected one of: {', '.join(WEIGHT_FILES)})")
        gen, ignored, gen_problems = generation_defaults(src, hf)
        problems += gen_problems
        if problems:
            raise cannot_convert(src, "Marian", problems)

        vocab_size = int(hf["vocab_size"])
        target_vocab_size = vocab_size if shared else int(hf["decoder_vocab_size"] or vocab_size)
        d_model = int(hf["d_model"])
        activation = HF_ACTIVATIONS[hf["activation_function"]]
        config = TransformerConfig(
            source_vocab_size=vocab_size,
            target_vocab_size=target_vocab_size,
            d_model=d_model,
            num_heads=int(hf["encoder_attention_heads"]),
            encoder_layers=int(hf["encoder_layers"]),
            decoder_layers=int(hf["decoder_layers"]),
            ffn_dim=int(hf["encoder_ffn_dim"]),
            activation=activation,
            pre_norm=False,
            encoder_final_norm=False,
            decoder_final_norm=False,
            norm_epsilon=1e-5,  # torch.nn.LayerNorm default; Marian layers use it
            embedding_scale=math.sqrt(d_model) if hf["scale_embedding"] else 1.0,
            max_positions=int(hf["max_position_embeddings"]),
            shared_embeddings=shared,
            tied_output=bool(hf["tie_word_embeddings"]),
            attention_bias=True,
            ffn_bias=True,
            logits_bias=False,  # set below when final_logits_bias is present and non-zero
            decoder_num_heads=int(hf["decoder_attention_heads"]),
            decoder_ffn_dim=int(hf["decoder_ffn_dim"]),
            decoder_activation=activation,
            decoder_pre_norm=False,
        )
        vocab = read_json(src / "vocab.json")
        unk = vocab.get("<unk>")
        special = SpecialIds(
            pad=int(hf["pad_token_id"]),
            eos=int(hf["eos_token_id"]),
            decoder_start=int(hf["decoder_start_token_id"] if hf["decoder_start_token_id"] is not None
                              else hf["pad_token_id"]),
            unk=int(unk) if isinstance(unk, int) else None,
        )
        weights, logits_bias, weight_problems = _map_weights(load_hf_weights(src), config)
        if weight_problems:
            raise cannot_convert(src, "Marian", weight_problems)
        if logits_bias:
            config = TransformerConfig(**(config.__dict__ | {"logits_bias": True}))
        spec = TransformerSpec(config=config, special_ids=special, decoding=gen, weights=weights)

        files = {"source_spm": "tokenizer/source.spm", "target_spm": "tokenizer/target.spm",
                 "vocab": "tokenizer/vocab.json"}
        tokenizer_files = {files[role]: src / name for role, name in
                           (("source_spm", "source.spm"), ("target_spm", "target.spm"), ("vocab", "vocab.json"))}
        if not shared:
            files["target_vocab"] = "tokenizer/target_vocab.json"
            tokenizer_files[files["target_vocab"]] = src / "target_vocab.json"
        tokenizer: dict[str, Any] = {"kind": "sentencepiece", "files": files, "unk_id": special.unk}
        source: dict[str, Any] = {"framework": self.framework, "path": str(src.absolute())}
        if ignored:
            source["ignored_generation_options"] = ignored
        return LoadedModel(spec=spec, tokenizer=tokenizer, tokenizer_files=tokenizer_files, source=source,
                           name=src.absolute().name)


def _config_problems(hf: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    activation = hf["activation_function"]
    if activation not in HF_ACTIVATIONS:
        problems.append(f"activation_function {activation!r} (supported: {', '.join(HF_ACTIVATIONS)})")
    for name, supported in _FIXED_OPTIONS.items():
        if name in hf and hf[name] != supported:
            problems.append(f"{name}={json.dumps(hf[name])} (only {json.dumps(supported)} is supported)")
    architectures = hf.get("architectures")
    if isinstance(architectures, list) and architectures and "MarianMTModel" not in architectures:
        problems.append(f"architectures {architectures} (only MarianMTModel is supported)")
    # With shared embeddings transformers ignores decoder_vocab_size (the output has vocab_size ids); so do we.
    for name in ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                 "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings",
                 "pad_token_id", "eos_token_id"):
        if not isinstance(hf[name], int) or isinstance(hf[name], bool):
            problems.append(f"{name}={json.dumps(hf[name])} is not an integer")
    return problems


def _map_weights(
    hf_weights: dict[str, np.ndarray], config: TransformerConfig
) -> tuple[dict[str, np.ndarray], bool, list[str]]:
    """HF names -> canonical names. Returns (weights, has a non-zero logits bias, problems)."""
    problems: list[str] = []
    # Checkpoints saved from MarianModel (not MarianMTModel) have no "model." prefix.
    prefix = "model." if any(k.startswith("model.") for k in hf_weights) else ""
    remaining = dict(hf_weights)
    weights: dict[str, np.ndarray] = {}

    def take(name: str) -> np.ndarray | None:
        return remaining.pop(prefix + name, None) if prefix + name in remaining else remaining.pop(name, None)

    shared = take("shared.weight")
    enc_embed = take("encoder.embed_tokens.weight")
    dec_embed = take("decoder.embed_tokens.weight")
    lm_head = remaining.pop("lm_head.weight", None)
    if config.shared_embeddings:
        # Tied copies may all be saved (older checkpoints); any of them is the shared matrix.
        embed = next((a for a in (shared, enc_embed, dec_embed) if a is not None), None)
        if embed is None:
            problems.append("missing tensor model.shared.weight (the shared embedding)")
        else:
            weights["encoder.embed_tokens"] = embed
        decoder_embed = embed
    else:
        if enc_embed is None:
            enc_embed = shared
        if enc_embed is None:
            problems.append("missing tensor model.encoder.embed_tokens.weight")
        else:
            weights["encoder.embed_tokens"] = enc_embed
        if dec_embed is None:
            problems.append("missing tensor model.decoder.embed_tokens.weight")
        elif dec_embed.ndim == 2 and dec_embed.shape[0] > config.target_vocab_size:
            # transformers gives the decoder input embedding vocab_size rows, also when decoder_vocab_size (the
            # output) is smaller; the rows past the output vocabulary are never fed back.
            dec_embed = np.ascontiguousarray(dec_embed[: config.target_vocab_size])
        if dec_embed is not None:
            weights["decoder.embed_tokens"] = dec_embed
        decoder_embed = dec_embed
    if not config.tied_output:
        if lm_head is None:
            problems.append("missing tensor lm_head.weight (tie_word_embeddings is false)")
        else:
            weights["decoder.output_proj"] = lm_head
    elif lm_head is not None and decoder_embed is not None and lm_head.shape == decoder_embed.shape \
            and not np.array_equal(lm_head, decoder_embed):
        problems.append("lm_head.weight differs from the embedding although tie_word_embeddings is true")

    bias = remaining.pop("final_logits_bias", None)
    has_bias = False
    if bias is not None:
        if bias.size == config.target_vocab_size:
            bias = bias.reshape(config.target_vocab_size)
            has_bias = bool(np.any(bias != 0))
            if has_bias:
                weights["decoder.output_bias"] = bias
        else:
            problems.append(f"final_logits_bias has shape {list(bias.shape)}, expected [1, {config.target_vocab_size}]")

    positions = sinusoidal_positions(config.max_positions, config.d_model)
    for side in ("encoder", "decoder"):
        stored = take(f"{side}.embed_positions.weight")
        # Older checkpoints saved the table; transformers then uses the stored values, and so do we.
        if stored is not None and stored.shape == positions.shape and not np.allclose(stored, positions, atol=1e-4):
            problems.append(f"{side}.embed_positions.weight is not the sinusoidal table (learned positions are "
                            "not supported)")
        elif stored is not None and side == "encoder" and stored.shape == positions.shape:
            positions = stored
    weights["positions"] = positions

    weights |= map_layers(take, config)
    for name in sorted(remaining):
        problems.append(f"unexpected tensor {name} {list(remaining[name].shape)} (not part of MarianMTModel with "
                        "this config)")
    return weights, has_bias, problems
