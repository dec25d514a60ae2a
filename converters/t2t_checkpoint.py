"""A tensor2tensor TF checkpoint: finding it, reading its variables, and mapping them to canonical weights.

``converters/t2t.py`` (the reader) decides the hparams and calls :func:`map_weights`; the math is described in
``converters/t2t.py``'s docstring.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from converters.base import ConversionError
from converters.spec import TransformerConfig

# (layer_preprocess_sequence, layer_postprocess_sequence) -> pre_norm. "none" and "" both mean no preprocessing.
NORM_PLACEMENTS: dict[tuple[str, str], bool] = {("n", "da"): True, ("none", "dan"): False, ("", "dan"): False}
_MODALITY = re.compile(r"^symbol_modality_(\d+)_(\d+)/(shared|input_emb|target_emb|softmax)/weights_(\d+)$")
# Optimizer slots that could sit beside a variable (T2T puts its own under training/, which we skip anyway).
_SLOT = re.compile(r"/(Adam(_\d+)?|Momentum|Adafactor\w*|RMSProp\w*|ExponentialMovingAverage)$")


def timing_signal(num_positions: int, channels: int) -> np.ndarray:
    """T2T's ``get_timing_signal_1d`` table ``[num_positions, channels]``, computed in float32 as TF does.

    Channel k < n = channels // 2 is ``sin(p * inv[k])``, channel n + k is ``cos(p * inv[k])`` (concatenated, not
    interleaved), ``inv[k] = exp(-k * ln(1e4) / max(n - 1, 1))``; an odd channel count gets one zero channel.
    """
    n = channels // 2
    increment = np.float32(math.log(1.0e4)) / np.float32(max(n - 1, 1))
    inv_timescales = np.exp(np.arange(n, dtype=np.float32) * -increment).astype(np.float32)
    scaled_time = np.arange(num_positions, dtype=np.float32)[:, None] * inv_timescales[None, :]
    table = np.zeros((num_positions, channels), dtype=np.float32)
    table[:, :n] = np.sin(scaled_time)
    table[:, n:2 * n] = np.cos(scaled_time)
    return table


def checkpoint_prefix(source_dir: Path) -> tuple[Path | None, str | None]:
    """(prefix of the latest checkpoint, None) or (None, why there is none).

    The ``checkpoint`` file may hold an absolute path from the training machine, so only its basename is used.
    Without that file, a single ``*.index`` in the directory is taken.
    """
    state = source_dir / "checkpoint"
    if state.is_file():
        text = state.read_text(encoding="utf-8", errors="replace")
        match = re.search(r'^model_checkpoint_path:\s*"(.*)"\s*$', text, re.MULTILINE)
        if match is None:
            return None, f"{state} names no model_checkpoint_path"
        prefix = source_dir / Path(match.group(1)).name
        if not Path(f"{prefix}.index").is_file():
            return None, f"{state} names {match.group(1)!r} but {prefix.name}.index is not in the directory"
        return prefix, None
    indexes = sorted(source_dir.glob("*.index"))
    if len(indexes) == 1:
        return indexes[0].with_suffix(""), None
    if indexes:
        return None, (f"no 'checkpoint' file and several checkpoints ({', '.join(p.name for p in indexes)}); "
                      "keep the one to convert")
    return None, "no TensorFlow checkpoint (expected a 'checkpoint' file and model.ckpt-N.index/.data-* files)"


def _checkpoint_reader(prefix: Path) -> Any:
    # Before the import (a user's explicit setting wins): TF's C++ side logs several lines through absl at import
    # (the instruction-set notice, "All log messages before absl::InitializeLog() ..."), and where oneDNN is on by
    # default (AVX512_VNNI, AMX CPUs) "oneDNN custom operations are on" whatever TF_CPP_MIN_LOG_LEVEL says. Reading
    # a checkpoint runs no TensorFlow math; its errors come back as exceptions, reported as one line.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ConversionError(f"reading tensor2tensor checkpoints needs tensorflow (pip install tensorflow-cpu): {e}") \
            from e
    try:
        return tf.train.load_checkpoint(str(prefix))
    except Exception as e:  # TF raises its own error types (DataLossError, NotFoundError, ...)
        raise ConversionError(f"{prefix}: unreadable checkpoint ({type(e).__name__}: {e})") from e


def read_checkpoint(prefix: Path, select: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
    """Variables of a TF checkpoint as numpy arrays; only the names ``select`` accepts (e.g. no optimizer state).

    Raises:
        ConversionError: tensorflow is missing or the checkpoint is unreadable.
    """
    reader = _checkpoint_reader(prefix)
    try:
        names = [n for n in sorted(reader.get_variable_to_shape_map()) if select is None or select(n)]
        return {name: np.asarray(reader.get_tensor(name)) for name in names}
    except Exception as e:
        raise ConversionError(f"{prefix}: unreadable checkpoint ({type(e).__name__}: {e})") from e


def list_checkpoint(prefix: Path) -> dict[str, list[int]]:
    """Name -> shape of every variable in the checkpoint (no tensor data read)."""
    reader = _checkpoint_reader(prefix)
    try:
        return {k: list(v) for k, v in reader.get_variable_to_shape_map().items()}
    except Exception as e:
        raise ConversionError(f"{prefix}: unreadable checkpoint ({type(e).__name__}: {e})") from e


def _embedding_matrices(variables: dict[str, np.ndarray], problems: list[str]) -> dict[str, np.ndarray]:
    """Sub-scope (shared / input_emb / target_emb / softmax) -> full [V, H] matrix, shards joined in numeric order."""
    shards: dict[str, dict[int, np.ndarray]] = {}
    scopes: set[str] = set()
    for name, value in variables.items():
        match = _MODALITY.match(name)
        if match:
            scopes.add(f"symbol_modality_{match.group(1)}_{match.group(2)}")
            shards.setdefault(match.group(3), {})[int(match.group(4))] = value
    if len(scopes) > 1:
        problems.append(f"separate input and target vocabularies ({', '.join(sorted(scopes))}) are not supported")
    matrices: dict[str, np.ndarray] = {}
    for sub, parts in shards.items():
        numbers = sorted(parts)
        if numbers != list(range(len(numbers))):
            problems.append(f"embedding {sub}: shards {numbers} are not 0..{len(numbers) - 1}")
            continue
        if len({parts[i].shape[1:] for i in numbers}) != 1 or parts[0].ndim != 2:
            problems.append(f"embedding {sub}: shards of different widths")
            continue
        # Lexicographic order would put weights_10 after weights_1: rows must follow the shard NUMBER.
        matrices[sub] = np.concatenate([parts[i] for i in numbers], axis=0)
    return matrices


def map_weights(
    variables: dict[str, np.ndarray], hp: dict[str, Any], target_space_id: int, max_positions: int,
    problems: list[str],
) -> tuple[TransformerConfig | None, dict[str, np.ndarray]]:
    """T2T variable names (without the model scope) -> canonical names and the config that goes with them."""
    remaining = {name: value for name, value in variables.items() if name != "global_step" and not _SLOT.search(name)}
    weights: dict[str, np.ndarray] = {}

    def take(name: str, canonical: str) -> None:
        value = remaining.pop(name, None)
        if value is None:
            problems.append(f"missing variable {name}")
            return
        if not np.issubdtype(value.dtype, np.floating):
            problems.append(f"variable {name} has dtype {value.dtype}, expected a float type")
            return
        weights[canonical] = np.ascontiguousarray(value, dtype=np.float32)

    matrices = _embedding_matrices(remaining, problems)
    for name in [n for n in remaining if _MODALITY.match(n)]:
        del remaining[name]
    shared, input_emb = matrices.get("shared"), matrices.get("input_emb")
    target_emb, softmax = matrices.get("target_emb"), matrices.get("softmax")
    # T2T layouts: "shared" alone (shared_embedding_and_softmax_weights); "shared" + "softmax" (shared_embedding);
    # input_emb + target_emb + softmax (nothing shared).
    encoder_embed = shared if shared is not None else input_emb
    decoder_embed = shared if shared is not None else target_emb
    output = softmax if softmax is not None else shared
    if encoder_embed is None or decoder_embed is None or output is None:
        problems.append(f"embedding variables incomplete: found sub-scopes {sorted(matrices) or 'none'} under "
                        "symbol_modality_<V>_<H>/ (expected shared, or input_emb + target_emb + softmax)")
        return None, {}
    shared_embeddings = decoder_embed is encoder_embed
    tied_output = output is decoder_embed
    vocab_size, hidden = (int(d) for d in encoder_embed.shape)

    hidden_hp = int(hp["hidden_size"])
    if hidden != hidden_hp:
        problems.append(f"embedding width {hidden} differs from hparam hidden_size {hidden_hp}")
    for label, matrix in (("target_emb", decoder_embed), ("softmax", output)):
        if matrix.shape != encoder_embed.shape:
            problems.append(f"embedding {label} has shape {list(matrix.shape)}, expected {list(encoder_embed.shape)}")
    weights["encoder.embed_tokens"] = np.ascontiguousarray(encoder_embed, dtype=np.float32)
    if not shared_embeddings:
        weights["decoder.embed_tokens"] = np.ascontiguousarray(decoder_embed, dtype=np.float32)
    if not tied_output:
        weights["decoder.output_proj"] = np.ascontiguousarray(output, dtype=np.float32)

    use_target_space = bool(hp.get("use_target_space_embedding", True))
    target_space = remaining.pop("body/target_space_embedding/kernel", None)
    if use_target_space:
        if target_space is None:
            problems.append("missing variable body/target_space_embedding/kernel")
        elif target_space.ndim != 2 or target_space.shape[0] <= target_space_id:
            problems.append(f"body/target_space_embedding/kernel has shape {list(target_space.shape)}; no row "
                            f"{target_space_id}")
        else:
            weights["encoder.embed_bias"] = np.ascontiguousarray(target_space[target_space_id], dtype=np.float32)

    pre_norm = NORM_PLACEMENTS[(hp.get("layer_preprocess_sequence", "n"), hp.get("layer_postprocess_sequence", "da"))]
    # Pre-norm: each sub-layer's norm is its "layer_prepostprocess" (before it); post-norm: "layer_postprocess".
    norm_scope = "layer_prepostprocess" if pre_norm else "layer_postprocess"

    def set_norm(scope: str, canonical: str) -> None:
        take(f"{scope}/layer_norm/layer_norm_scale", f"{canonical}.scale")
        take(f"{scope}/layer_norm/layer_norm_bias", f"{canonical}.bias")

    def set_attention(scope: str, canonical: str) -> None:
        set_norm(f"{scope}/{norm_scope}", f"{canonical}_norm")
        # q/k/v/output_transform are bias-free dense layers stored [in, out], as the spec wants them.
        for proj, name in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output_transform")):
            take(f"{scope}/multihead_attention/{name}/kernel", f"{canonical}.{proj}.weight")

    def set_ffn(scope: str, canonical: str) -> None:
        set_norm(f"{scope}/{norm_scope}", f"{canonical}_norm")
        # "conv1"/"conv2" are dense layers (the names are historical).
        for conv, fc in (("conv1", "fc1"), ("conv2", "fc2")):
            take(f"{scope}/{conv}/kernel", f"{canonical}.{fc}.weight")
            take(f"{scope}/{conv}/bias", f"{canonical}.{fc}.bias")

    layers = int(hp["num_hidden_layers"])
    encoder_layers = int(hp.get("num_encoder_layers") or layers)
    decoder_layers = int(hp.get("num_decoder_layers") or layers)
    for stack, count in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        found = {int(m.group(1)) for n in remaining if (m := re.match(rf"body/{stack}/layer_(\d+)/", n))}
        if found and found != set(range(count)):
            problems.append(f"the checkpoint has {stack} layers {sorted(found)}, the hparams say {count}")
    for i in range(encoder_layers):
        set_attention(f"body/encoder/layer_{i}/self_attention", f"encoder.layers.{i}.self_attn")
        set_ffn(f"body/encoder/layer_{i}/ffn", f"encoder.layers.{i}.ffn")
    for i in range(decoder_layers):
        set_attention(f"body/decoder/layer_{i}/self_attention", f"decoder.layers.{i}.self_attn")
        set_attention(f"body/decoder/layer_{i}/encdec_attention", f"decoder.layers.{i}.cross_attn")
        set_ffn(f"body/decoder/layer_{i}/ffn", f"decoder.layers.{i}.ffn")
    if pre_norm:
        # The stacks end with one more "n" preprocess (no sub-layer): the final norms.
        set_norm("body/encoder/layer_prepostprocess", "encoder.final_norm")
        set_norm("body/decoder/layer_prepostprocess", "decoder.final_norm")

    fc1 = weights.get("encoder.layers.0.ffn.fc1.weight")
    filter_size = int(hp["filter_size"])
    if fc1 is not None and fc1.ndim == 2 and fc1.shape[1] != filter_size:
        problems.append(f"ffn width {fc1.shape[1]} in the checkpoint differs from hparam filter_size {filter_size}")
    for name in sorted(remaining):
        problems.append(f"unexpected variable {name} (an architecture feature this converter does not support)")

    mode = hp.get("multiply_embedding_mode", "sqrt_depth")
    config = TransformerConfig(
        source_vocab_size=vocab_size,
        target_vocab_size=vocab_size,
        d_model=hidden,
        num_heads=int(hp["num_heads"]),
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        ffn_dim=filter_size,
        activation="relu",
        pre_norm=pre_norm,
        encoder_final_norm=pre_norm,
        decoder_final_norm=pre_norm,
        norm_epsilon=float(hp.get("norm_epsilon", 1e-6)),
        embedding_scale=math.sqrt(hidden) if mode == "sqrt_depth" else 1.0,
        max_positions=max_positions,
        shared_embeddings=shared_embeddings,
        tied_output=tied_output,
        attention_bias=False,
        ffn_bias=True,
        logits_bias=False,
        encoder_embed_bias=use_target_space,
    )
    weights["positions"] = timing_signal(max_positions, hidden)
    return config, weights
