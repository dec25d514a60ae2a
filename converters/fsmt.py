"""transformers' FSMT (``FSMTForConditionalGeneration``: fairseq's WMT19 transformer_big family) -> TransformerSpec.

A local directory with ``config.json`` (``model_type: fsmt``), ``model.safetensors`` (or sharded, or
``pytorch_model.bin``), ``vocab-src.json``, ``vocab-tgt.json``, ``merges.txt``, optionally ``tokenizer_config.json``
(``do_lower_case``) and ``generation_config.json``.

The math is fairseq's post-norm Transformer as transformers ported it: each stack with its own depth, heads and FFN
width; separate source and target vocabularies and embeddings (one shared matrix with ``tie_word_embeddings``); the
output projection is the decoder's input embedding; token embedding times ``sqrt(d_model)`` when
``scale_embedding``; fairseq's sinusoidal positions, numbered from ``pad + 1``; layer norms with epsilon 1e-5; no
final norms. Decoding defaults come from the generation config, as ``generate`` reads it. The tokenizer is
``serving.engine.tokenizers.fsmt_bpe`` (Moses + BPE, as ``FSMTTokenizer``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from converters.base import ConversionError, Converter, LoadedModel, cannot_convert, read_json
from converters.fairseq_layers import map_layers, sinusoidal_positions
from converters.hf_generation import generation_defaults
from converters.hf_weights import WEIGHT_FILES, load_hf_weights
from converters.marian import HF_ACTIVATIONS
from converters.spec import SpecialIds, TransformerConfig, TransformerSpec

# FSMTConfig defaults (transformers 4.x), used when config.json omits a key.
_CONFIG_DEFAULTS: dict[str, Any] = {
    "langs": ["en", "de"], "src_vocab_size": 42024, "tgt_vocab_size": 42024, "activation_function": "relu",
    "d_model": 1024, "max_position_embeddings": 1024, "encoder_ffn_dim": 4096, "encoder_layers": 12,
    "encoder_attention_heads": 16, "decoder_ffn_dim": 4096, "decoder_layers": 12, "decoder_attention_heads": 16,
    "decoder_start_token_id": 2, "scale_embedding": True, "tie_word_embeddings": False, "pad_token_id": 1,
    "eos_token_id": 2, "forced_eos_token_id": 2,
}
_INTEGERS = ("src_vocab_size", "tgt_vocab_size", "d_model", "max_position_embeddings", "encoder_ffn_dim",
             "encoder_layers", "encoder_attention_heads", "decoder_ffn_dim", "decoder_layers",
             "decoder_attention_heads", "decoder_start_token_id", "pad_token_id", "eos_token_id")
TOKENIZER_FILES = {"source_vocab": "vocab-src.json", "target_vocab": "vocab-tgt.json", "merges": "merges.txt"}


class FsmtConverter(Converter):
    """Reads a transformers FSMT directory into a TransformerSpec."""

    framework = "fsmt"
    layout = ("a Hugging Face FSMT directory (fairseq WMT19): config.json of model_type fsmt, model.safetensors, "
              "vocab-src.json, vocab-tgt.json, merges.txt")

    @classmethod
    def detect(cls, source_dir: Path) -> bool:
        try:
            return read_json(source_dir / "config.json").get("model_type") == "fsmt"
        except ConversionError:  # no readable config.json: not this reader's
            return False

    def load(self) -> LoadedModel:
        """Read config, generation config, tokenizer files and weights.

        Raises:
            ConversionError: listing every unsupported option and missing file at once.
        """
        src = self.source_dir
        problems: list[str] = [f"option {name!r} does not apply to FSMT checkpoints" for name in self.options]
        if not (src / "config.json").is_file():
            raise cannot_convert(src, "FSMT", [*problems, "missing config.json"])
        hf = _CONFIG_DEFAULTS | read_json(src / "config.json")
        problems += _config_problems(hf)
        missing = [name for name in TOKENIZER_FILES.values() if not (src / name).is_file()]
        if missing:
            problems.append(f"missing vocab/tokenizer file(s): {', '.join(missing)}")
        if not any((src / name).is_file() for name in WEIGHT_FILES):
            problems.append(f"no weights (expected one of: {', '.join(WEIGHT_FILES)})")
        decoding, ignored, gen_problems = generation_defaults(src, hf)
        problems += gen_problems
        if problems:
            raise cannot_convert(src, "FSMT", problems)

        d_model, pad = int(hf["d_model"]), int(hf["pad_token_id"])
        activation = HF_ACTIVATIONS[hf["activation_function"]]
        config = TransformerConfig(
            source_vocab_size=int(hf["src_vocab_size"]), target_vocab_size=int(hf["tgt_vocab_size"]),
            d_model=d_model, num_heads=int(hf["encoder_attention_heads"]), encoder_layers=int(hf["encoder_layers"]),
            decoder_layers=int(hf["decoder_layers"]), ffn_dim=int(hf["encoder_ffn_dim"]), activation=activation,
            pre_norm=False, encoder_final_norm=False, decoder_final_norm=False, norm_epsilon=1e-5,
            embedding_scale=math.sqrt(d_model) if hf["scale_embedding"] else 1.0,
            max_positions=int(hf["max_position_embeddings"]), shared_embeddings=bool(hf["tie_word_embeddings"]),
            tied_output=True, attention_bias=True, ffn_bias=True, logits_bias=False,
            decoder_num_heads=int(hf["decoder_attention_heads"]), decoder_ffn_dim=int(hf["decoder_ffn_dim"]),
            decoder_activation=activation, decoder_pre_norm=False,
        )
        weights, weight_problems = _map_weights(load_hf_weights(src), config, pad)
        if weight_problems:
            raise cannot_convert(src, "FSMT", weight_problems)
        if "encoder.positions" in weights:
            config = TransformerConfig(**(config.__dict__ | {"shared_positions": False}))
        vocab = read_json(src / "vocab-src.json")
        unk = vocab.get("<unk>")
        special = SpecialIds(pad=pad, eos=int(hf["eos_token_id"]), decoder_start=int(hf["decoder_start_token_id"]),
                             unk=unk if isinstance(unk, int) else None)
        spec = TransformerSpec(config=config, special_ids=special, decoding=decoding, weights=weights)
        source: dict[str, Any] = {"framework": self.framework, "path": str(src.absolute())}
        if ignored:
            source["ignored_generation_options"] = ignored
        settings = read_json(src / "tokenizer_config.json") if (src / "tokenizer_config.json").is_file() else {}
        return LoadedModel(spec=spec, tokenizer=fsmt_tokenizer_entry(hf["langs"], special.unk, settings),
                           tokenizer_files={f"tokenizer/{name}": src / name for name in TOKENIZER_FILES.values()},
                           source=source, name=src.absolute().name)


def fsmt_tokenizer_entry(langs: list[str], unk: int | None, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest's ``fsmt_bpe`` tokenizer entry for the files of :data:`TOKENIZER_FILES` under ``tokenizer/``;
    ``do_lower_case`` and ``clean_up_tokenization_spaces`` from ``settings`` (tokenizer_config.json) if given."""
    settings = settings or {}
    return {"kind": "fsmt_bpe", "files": {role: f"tokenizer/{name}" for role, name in TOKENIZER_FILES.items()},
            "source_lang": str(langs[0]), "target_lang": str(langs[1]),
            "do_lower_case": bool(settings.get("do_lower_case", False)),
            "clean_up_tokenization_spaces": bool(settings.get("clean_up_tokenization_spaces", False)), "unk_id": unk}


def _config_problems(hf: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    if hf["activation_function"] not in HF_ACTIVATIONS:
        problems.append(f"activation_function {hf['activation_function']!r} (supported: {', '.join(HF_ACTIVATIONS)})")
    for name in _INTEGERS:
        if not isinstance(hf[name], int) or isinstance(hf[name], bool):
            problems.append(f"{name}={hf[name]!r} is not an integer")
    langs = hf["langs"]
    if not (isinstance(langs, list) and len(langs) == 2 and all(isinstance(x, str) for x in langs)):
        problems.append(f"langs={langs!r} (expected [source, target] language codes)")
    if hf["tie_word_embeddings"] and hf["src_vocab_size"] != hf["tgt_vocab_size"]:
        problems.append("tie_word_embeddings needs src_vocab_size == tgt_vocab_size")
    architectures = hf.get("architectures")
    if isinstance(architectures, list) and architectures and "FSMTForConditionalGeneration" not in architectures:
        problems.append(f"architectures {architectures} (only FSMTForConditionalGeneration is supported)")
    return problems


def _map_weights(hf_weights: dict[str, np.ndarray], config: TransformerConfig,
                 pad: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """HF names -> canonical names; returns (weights, problems)."""
    problems: list[str] = []
    prefix = "model." if any(k.startswith("model.") for k in hf_weights) else ""
    remaining = dict(hf_weights)

    def take(name: str) -> np.ndarray | None:
        return remaining.pop(prefix + name, None)

    weights: dict[str, np.ndarray] = {}
    encoder_embed = take("encoder.embed_tokens.weight")
    # The decoder's input embedding and output projection are one matrix; safetensors keeps one of the copies.
    copies = [a for a in (take("decoder.embed_tokens.weight"), take("decoder.output_projection.weight"))
              if a is not None]
    if config.shared_embeddings and encoder_embed is None and copies:
        encoder_embed = copies[0]
    if encoder_embed is None:
        problems.append(f"missing tensor {prefix}encoder.embed_tokens.weight")
    else:
        weights["encoder.embed_tokens"] = encoder_embed
    if not config.shared_embeddings:
        if not copies:
            problems.append(f"missing tensor {prefix}decoder.embed_tokens.weight")
        else:
            weights["decoder.embed_tokens"] = copies[0]
    decoder_embed = weights.get("encoder.embed_tokens" if config.shared_embeddings else "decoder.embed_tokens")
    if decoder_embed is not None and any(c.shape != decoder_embed.shape or not np.array_equal(c, decoder_embed)
                                         for c in copies):
        problems.append("decoder.output_projection.weight differs from the decoder embedding (FSMT ties them)")

    # Stored tables (transformers saves them) are what the model runs; rows from pad + 1 on are positions 0, 1, ...
    computed = sinusoidal_positions(config.max_positions, config.d_model, pad)
    tables = {}
    for side in ("encoder", "decoder"):
        stored = take(f"{side}.embed_positions.weight")
        if stored is not None and stored.ndim == 2 and stored.shape[0] >= pad + 1 + config.max_positions:
            tables[side] = np.ascontiguousarray(stored[pad + 1 : pad + 1 + config.max_positions])
        elif stored is not None:
            problems.append(f"{side}.embed_positions.weight has shape {list(stored.shape)}, expected "
                            f"[{config.max_positions + pad + 1}, {config.d_model}]")
        else:
            tables[side] = computed
    if len(tables) == 2 and tables["encoder"].shape == tables["decoder"].shape \
            and np.array_equal(tables["encoder"], tables["decoder"]):
        weights["positions"] = tables["encoder"]
    else:
        weights |= {f"{side}.positions": table for side, table in tables.items()}
    weights |= map_layers(take, config)
    for name in sorted(remaining):
        problems.append(f"unexpected tensor {name} {list(remaining[name].shape)} (not part of "
                        "FSMTForConditionalGeneration with this config)")
    return weights, problems
