"""tensor2tensor ``transformer`` checkpoints -> TransformerSpec.

Input: a T2T output directory with a ``checkpoint`` file (naming ``model.ckpt-N``, whose ``.index`` and ``.data-*``
files sit beside it), ``hparams.json`` when t2t-trainer wrote one (else ``hparams_set``), and the ``.subwords``
vocabulary (in the directory, in ``flags.txt``'s ``--data_dir``, or given as ``vocab``). Variables are read with
``tf.train.load_checkpoint``; the math is ``../shared/reference/t2t-transformer.md``:

- One embedding matrix ``symbol_modality_<V>_<H>/shared/weights_<i>`` (16 row shards, concatenated in NUMERIC order)
  serves as input embedding, target embedding and softmax; without sharing there are ``input_emb``, ``target_emb``
  and ``softmax`` sub-scopes. Embeddings are scaled by sqrt(H) and id 0 embeds to an all-zero vector.
- ``target_space_embedding[target_space_id]`` is added to every encoder input position (the spec's
  ``encoder.embed_bias``); positions are T2T's timing signal (all sines, then all cosines).
- Pre-norm layers ("n" before, "da" after each sub-layer) with a final norm on both stacks, or post-norm ("dan")
  without final norms; no attention biases, dense_relu_dense FFN with biases, logits without bias.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from converters.base import ConversionError, Converter, LoadedModel, cannot_convert, read_json
from converters.spec import DecodingDefaults, SpecialIds, TransformerConfig, TransformerSpec

logger = logging.getLogger(__name__)

PAD_ID = 0
EOS_ID = 1
DEFAULT_MAX_POSITIONS = 1024
TARGET_SPACES = 32  # rows of body/target_space_embedding/kernel (problem.SpaceID)

# Hyperparameters that matter for inference, as T2T HEAD defines the sets (models/transformer.py, basic_params1).
# Used when the directory has no hparams.json; hparams.json keys override nothing here, it is read as is.
_COMMON_HPARAMS: dict[str, Any] = {
    "attention_key_channels": 0,
    "attention_value_channels": 0,
    "norm_type": "layer",
    "norm_epsilon": 1e-6,
    "layer_preprocess_sequence": "n",
    "layer_postprocess_sequence": "da",
    "multiply_embedding_mode": "sqrt_depth",
    "shared_embedding_and_softmax_weights": True,
    "symbol_modality_num_shards": 16,
    "pos": "timing",
    "ffn_layer": "dense_relu_dense",
    "self_attention_type": "dot_product",
    "max_relative_position": 0,
    "proximity_bias": False,
    "use_target_space_embedding": True,
    "num_encoder_layers": 0,
    "num_decoder_layers": 0,
}
HPARAMS_SETS: dict[str, dict[str, Any]] = {
    "transformer_test": _COMMON_HPARAMS | {"hidden_size": 16, "filter_size": 8, "num_heads": 2, "num_hidden_layers": 2},
    "transformer_base": _COMMON_HPARAMS | {"hidden_size": 512, "filter_size": 2048, "num_heads": 8,
                                           "num_hidden_layers": 6},
    "transformer_big": _COMMON_HPARAMS | {"hidden_size": 1024, "filter_size": 4096, "num_heads": 16,
                                          "num_hidden_layers": 6},
}

# hparam -> the only value we can convert (absent keys are fine: older T2T versions did not have them).
_FIXED_HPARAMS: dict[str, Any] = {
    "ffn_layer": "dense_relu_dense",
    "self_attention_type": "dot_product",
    "max_relative_position": 0,
    "norm_type": "layer",
    "pos": "timing",
    "proximity_bias": False,
    "prepend_mode": "none",
    "attention_variables_3d": False,
    "unidirectional_encoder": False,
}
# (layer_preprocess_sequence, layer_postprocess_sequence) -> pre_norm. "none" and "" both mean no preprocessing.
_NORM_PLACEMENTS: dict[tuple[str, str], bool] = {("n", "da"): True, ("none", "dan"): False, ("", "dan"): False}
_EMBEDDING_MODES = ("sqrt_depth", "none", "")

# Decoding as t2t-decoder does by default (utils/decoding.py decode_hparams, T2T >= 1.5.5).
T2T_BEAM_SIZE = 4
T2T_ALPHA = 0.6
T2T_EXTRA_LENGTH = 100

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


def _read_flags(path: Path) -> dict[str, str]:
    """t2t-trainer's flags.txt (``--name=value`` per line), or {} when absent."""
    if not path.is_file():
        return {}
    flags: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("--") and "=" in line:
            name, value = line[2:].split("=", 1)
            flags[name] = value
    return flags


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
    # TF's C++ logging prints several lines at import; keep a user's explicit setting.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
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


def hparams_problems(hp: dict[str, Any]) -> list[str]:
    """Every hparam value this converter cannot map (empty when all are supported)."""
    problems: list[str] = []
    for name in ("hidden_size", "filter_size", "num_heads", "num_hidden_layers"):
        value = hp.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            problems.append(f"hparam {name}={json.dumps(value)} must be a positive integer")
    for name in ("num_encoder_layers", "num_decoder_layers"):
        value = hp.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            problems.append(f"hparam {name}={json.dumps(value)} must be a non-negative integer")
    hidden, heads = hp.get("hidden_size"), hp.get("num_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads:
        problems.append(f"hidden_size {hidden} is not divisible by num_heads {heads}")
    for name, supported in _FIXED_HPARAMS.items():
        if name in hp and hp[name] != supported:
            problems.append(f"hparam {name}={json.dumps(hp[name])} (only {json.dumps(supported)} is supported)")
    for name in ("attention_key_channels", "attention_value_channels"):
        value = hp.get(name, 0)
        if value not in (0, hidden):
            problems.append(f"hparam {name}={json.dumps(value)} (only 0 or hidden_size {hidden} is supported)")
    placement = (hp.get("layer_preprocess_sequence", "n"), hp.get("layer_postprocess_sequence", "da"))
    if placement not in _NORM_PLACEMENTS:
        problems.append(f"layer_preprocess_sequence={json.dumps(placement[0])} with layer_postprocess_sequence="
                        f"{json.dumps(placement[1])} (supported: \"n\"/\"da\" pre-norm, \"none\"/\"dan\" post-norm)")
    mode = hp.get("multiply_embedding_mode", "sqrt_depth")
    if mode not in _EMBEDDING_MODES:
        problems.append(f"hparam multiply_embedding_mode={json.dumps(mode)} (supported: sqrt_depth, none)")
    epsilon = hp.get("norm_epsilon", 1e-6)
    if not isinstance(epsilon, int | float) or isinstance(epsilon, bool) or epsilon < 0:
        problems.append(f"hparam norm_epsilon={json.dumps(epsilon)} must be a non-negative number")
    return problems


class T2TConverter(Converter):
    """Reads a tensor2tensor ``transformer`` checkpoint directory into a TransformerSpec.

    Args:
        source_dir: the T2T output directory (``checkpoint``, ``model.ckpt-N.*``, optionally ``hparams.json``).
        hparams_set: ``transformer_test``, ``transformer_base`` or ``transformer_big``; used when the directory has
            no ``hparams.json`` (hparams.json, which records the values actually trained with, wins otherwise).
        vocab: the ``.subwords`` vocabulary; by default the one ``.subwords`` file of the directory, else
            ``vocab.<problem>.*.subwords`` in ``flags.txt``'s ``--data_dir``.
        target_space_id: row of the target-space embedding added to encoder inputs; 0 (GENERIC) for
            translate_ende_* problems decoded with T2T >= 1.5.2, 8 (DE_TOK) for models trained with T2T <= 1.5.1.
        max_positions: rows of the position table; decoding needs source tokens + extra_length (100) + 1.
        **options: anything else is reported as unsupported by :meth:`load`.
    """

    framework = "t2t"

    def __init__(self, source_dir: Path, *, hparams_set: str | None = None, vocab: str | os.PathLike[str] | None = None,
                 target_space_id: int = 0, max_positions: int = DEFAULT_MAX_POSITIONS, **options: Any) -> None:
        super().__init__(source_dir)
        self.options = options
        self.hparams_set = hparams_set
        self.vocab = Path(vocab) if vocab is not None else None
        self.target_space_id = target_space_id
        self.max_positions = max_positions

    @classmethod
    def detect(cls, source_dir: Path) -> bool:
        return source_dir.is_dir() and ((source_dir / "checkpoint").is_file() or any(source_dir.glob("*.ckpt*.index")))

    def load(self) -> LoadedModel:
        """Read hparams, vocabulary and checkpoint variables.

        Returns:
            The spec (float32 weights under canonical names), the ``t2t_subword`` tokenizer entry and its vocab file.

        Raises:
            ConversionError: listing every reason the checkpoint cannot be converted (missing checkpoint, hparams or
                vocabulary, unsupported hparams, variables missing, mis-shaped or unknown).
        """
        src = self.source_dir
        problems = [f"option {name!r} does not apply to tensor2tensor checkpoints" for name in sorted(self.options)]
        if not src.is_dir():
            raise ConversionError(f"{src}: not a directory")
        prefix, why = checkpoint_prefix(src)
        if why:
            problems.append(why)
        flags = _read_flags(src / "flags.txt")
        hp, hparams_source = self._hparams(flags, problems)
        if hp is not None:
            problems += hparams_problems(hp)
        if not isinstance(self.target_space_id, int) or not 0 <= self.target_space_id < TARGET_SPACES:
            problems.append(f"target_space_id {self.target_space_id!r} must be in 0..{TARGET_SPACES - 1}")
        if self.max_positions < 2:
            problems.append(f"max_positions {self.max_positions} is too small")
        vocab_path = self._find_vocab(flags, problems)
        if problems or prefix is None or hp is None or vocab_path is None:
            raise cannot_convert(src, "tensor2tensor", problems)

        variables = self._read_variables(prefix, problems)
        if hparams_source != "hparams.json" and any("/layer_postprocess/layer_norm/" in n for n in variables):
            # A hparams set names today's values, but transformer_base was post-norm before T2T 1.2.5; the variable
            # names tell which one this checkpoint was trained with.
            logger.warning("%s: the checkpoint has post-norm layers; converting it as post-norm (\"none\"/\"dan\")",
                           src)
            hp = hp | {"layer_preprocess_sequence": "none", "layer_postprocess_sequence": "dan"}
        config, weights = _map_weights(variables, hp, self.target_space_id, self.max_positions, problems)
        vocab_size = _vocab_size(vocab_path, problems)
        if config is not None and vocab_size is not None and vocab_size != config.target_vocab_size:
            divisor = hp.get("vocab_divisor", 1)
            # vocab_divisor > 1 (TPU sets) pads the embedding to a multiple; the padding ids are never in the text.
            padded = isinstance(divisor, int) and divisor > 1 and config.target_vocab_size == -(-vocab_size // divisor) \
                * divisor
            if not padded:
                problems.append(f"vocabulary {vocab_path} has {vocab_size} subtokens but the checkpoint embeds "
                                f"{config.target_vocab_size} ids (wrong vocabulary for this model?)")
        if problems or config is None:
            raise cannot_convert(src, "tensor2tensor", problems)

        spec = TransformerSpec(
            config=config,
            special_ids=SpecialIds(pad=PAD_ID, eos=EOS_ID, decoder_start=PAD_ID, unk=None, zero_embedding_id=PAD_ID),
            decoding=DecodingDefaults(
                beam_size=T2T_BEAM_SIZE,
                length_penalty=T2T_ALPHA,
                length_penalty_kind="gnmt",
                # extra_length decides (source tokens + 100); the position table is the hard upper bound.
                max_length=self.max_positions,
                extra_length=T2T_EXTRA_LENGTH,
            ),
            weights=weights,
        )
        problem_name = flags.get("problem") or None
        source: dict[str, Any] = {
            "framework": self.framework,
            "path": str(src.absolute()),
            "checkpoint": prefix.name,
            "hparams_source": hparams_source,
            "hparams_set": self.hparams_set or flags.get("hparams_set") or None,
            "problem": problem_name,
            "target_space_id": self.target_space_id,
            "vocab": str(vocab_path.absolute()),
        }
        step = variables.get("global_step")
        if step is not None and step.size == 1:
            source["global_step"] = int(step)
        name_parts = ["t2t", source["hparams_set"] or "transformer", problem_name or src.absolute().name]
        return LoadedModel(
            spec=spec,
            tokenizer={"kind": "t2t_subword", "files": {"vocab": "tokenizer/vocab.subwords"}},
            tokenizer_files={"tokenizer/vocab.subwords": vocab_path},
            source=source,
            name="-".join(p for p in name_parts if p),
            extra={"hparams": hp},
        )

    def _hparams(self, flags: dict[str, str], problems: list[str]) -> tuple[dict[str, Any] | None, str]:
        path = self.source_dir / "hparams.json"
        if self.hparams_set is not None and self.hparams_set not in HPARAMS_SETS:
            problems.append(f"unknown hparams set {self.hparams_set!r} (supported: {', '.join(HPARAMS_SETS)})")
            return None, ""
        if path.is_file():
            try:
                hp = read_json(path)
            except ConversionError as e:
                problems.append(str(e))
                return None, ""
            if self.hparams_set is not None:
                logger.warning("%s: using hparams.json; --hparams-set %s is ignored", path, self.hparams_set)
            return hp, "hparams.json"
        if self.hparams_set is not None:
            return dict(HPARAMS_SETS[self.hparams_set]), f"hparams_set {self.hparams_set}"
        trained_with = flags.get("hparams_set")
        if trained_with in HPARAMS_SETS and not flags.get("hparams"):
            # flags.txt records the set the model was trained with and no overrides: the set's values are exact.
            return dict(HPARAMS_SETS[trained_with]), f"hparams_set {trained_with} (from flags.txt)"
        problems.append(f"no hparams.json in the directory; pass the hparams set the model was trained with "
                        f"(--hparams-set {'|'.join(HPARAMS_SETS)})")
        return None, ""

    def _find_vocab(self, flags: dict[str, str], problems: list[str]) -> Path | None:
        if self.vocab is not None:
            if not self.vocab.is_file():
                problems.append(f"vocabulary {self.vocab} does not exist")
                return None
            return self.vocab
        problem_name = flags.get("problem", "")
        found = sorted(self.source_dir.glob("*.subwords"))
        if len(found) > 1:
            matching = [p for p in found if problem_name and p.name.startswith(f"vocab.{problem_name}.")]
            if len(matching) == 1:
                return matching[0]
            problems.append(f"several vocabularies ({', '.join(p.name for p in found)}); choose one with --vocab")
            return None
        if found:
            return found[0]
        data_dir = flags.get("data_dir")
        if data_dir and problem_name:
            candidates = sorted(Path(data_dir).expanduser().glob(f"vocab.{problem_name}.*.subwords"))
            if len(candidates) == 1:
                logger.info("using the vocabulary of flags.txt's data_dir: %s", candidates[0])
                return candidates[0]
        problems.append("missing vocab: no .subwords vocabulary in the directory"
                        + (f" or in data_dir {data_dir}" if data_dir and problem_name else "")
                        + "; pass it with --vocab")
        return None

    def _read_variables(self, prefix: Path, problems: list[str]) -> dict[str, np.ndarray]:
        shapes = list_checkpoint(prefix)
        scopes = {name.split("/body/", 1)[0] for name in shapes
                  if "/body/" in name and not name.startswith("training/")}
        if len(scopes) != 1:
            problems.append(f"{prefix.name}: expected the variables of one T2T model (<model>/body/...), found "
                            f"{sorted(scopes) or 'none'}")
            raise cannot_convert(self.source_dir, "tensor2tensor", problems)
        (scope,) = scopes
        if scope != "transformer":
            logger.warning("%s: model scope %r (expected 'transformer'); converting it as a transformer", prefix,
                           scope)
        # Only the model's variables: optimizer slots (training/...) can be twice the model's size.
        raw = read_checkpoint(prefix, lambda n: n.startswith(scope + "/") or n == "global_step")
        return {name.removeprefix(scope + "/"): value for name, value in raw.items()}


def _vocab_size(path: Path, problems: list[str]) -> int | None:
    from serving.tokenizers.subword import SubwordTextEncoder

    try:
        return SubwordTextEncoder(path).vocab_size
    except (OSError, ValueError) as e:
        problems.append(f"unreadable vocabulary {path}: {e}")
        return None


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


def _map_weights(
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

    pre_norm = _NORM_PLACEMENTS[(hp.get("layer_preprocess_sequence", "n"), hp.get("layer_postprocess_sequence", "da"))]
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
