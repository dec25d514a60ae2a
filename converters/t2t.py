"""tensor2tensor ``transformer`` checkpoints -> TransformerSpec.

Input: a T2T output directory with a ``checkpoint`` file (naming ``model.ckpt-N``, whose ``.index`` and ``.data-*``
files sit beside it), ``hparams.json`` when t2t-trainer wrote one (else ``hparams_set``), and the ``.subwords``
vocabulary (in the directory, in ``flags.txt``'s ``--data_dir``, or given as ``vocab``). Variables are read with
``tf.train.load_checkpoint``; the math (T2T's ``transformer`` model):

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
import os
from pathlib import Path
from typing import Any

import numpy as np

from converters.base import ConversionError, Converter, LoadedModel, cannot_convert, read_json
from converters.spec import DecodingDefaults, SpecialIds, TransformerSpec
from converters.t2t_checkpoint import NORM_PLACEMENTS, checkpoint_prefix, list_checkpoint, map_weights, read_checkpoint

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
_EMBEDDING_MODES = ("sqrt_depth", "none", "")

# Decoding as t2t-decoder does by default (utils/decoding.py decode_hparams, T2T >= 1.5.5).
T2T_BEAM_SIZE = 4
T2T_ALPHA = 0.6
T2T_EXTRA_LENGTH = 100


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
    if placement not in NORM_PLACEMENTS:
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
    layout = "a tensor2tensor output directory: checkpoint, model.ckpt-N.*, a .subwords vocabulary"

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
        config, weights = map_weights(variables, hp, self.target_space_id, self.max_positions, problems)
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
    from serving.engine.tokenizers.subword import SubwordTextEncoder

    try:
        return SubwordTextEncoder(path).vocab_size
    except (OSError, ValueError) as e:
        problems.append(f"unreadable vocabulary {path}: {e}")
        return None
