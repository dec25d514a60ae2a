"""fairseq ``checkpoint_best.pt`` (``transformer`` and its presets) -> TransformerSpec, without fairseq installed.

A local directory with the checkpoint (``checkpoint_best.pt``, else ``checkpoint_last.pt``, ``model.pt``, or the
only ``*.pt``), the dictionaries ``dict.{src}.txt`` / ``dict.{tgt}.txt`` (languages from the checkpoint's options)
and the BPE codes (``bpecodes``, ``bpe.codes``, ``codes``, ``code``, or the file the options name). The checkpoint
is read with torch (the ``torch`` extra) by :func:`converters.torch_checkpoint.load_checkpoint`: no fairseq class
is imported or run.

The options (``args``, or ``cfg.model`` for fairseq >= 0.10) over the architecture's defaults describe the model:
per-stack depth, heads, FFN width and norm placement (``{encoder,decoder}_normalize_before``, a final layer norm
after a pre-norm stack unless ``no_decoder_final_norm``), ``layernorm_embedding``, ``no_scale_embedding``,
sinusoidal or learned positions per stack (numbered from ``pad + 1``), ``share_all_embeddings``,
``share_decoder_input_output_embed``, the activation. Layer tensors carry fairseq's names
(``converters/fairseq_layers.py``). The tokenizer is FSMT's (Moses + BPE, ``serving.engine.tokenizers.fsmt_bpe``) over the
dictionaries and codes rewritten in FSMT's layout; decoding defaults are fairseq-generate's (beam 5, length
penalty 1, at most 200 tokens with EOS forced at the end, never padding, a sentence done at ``beam`` finished
hypotheses).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from converters.base import ConversionError, Converter, LoadedModel, cannot_convert
from converters.fairseq_layers import map_layers
from converters.fsmt import TOKENIZER_FILES, fsmt_tokenizer_entry
from converters.spec import Activation, DecodingDefaults, SpecialIds, TransformerConfig, TransformerSpec
from converters.torch_checkpoint import load_checkpoint, plain, tensors

CHECKPOINT_NAMES = ("checkpoint_best.pt", "checkpoint_last.pt", "model.pt")
CODES_NAMES = ("bpecodes", "bpe.codes", "codes", "code", "bpe_codes")
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's Dictionary: bos 0, pad 1, eos 2, unk 3

_BIG = {"encoder_embed_dim": 1024, "encoder_ffn_embed_dim": 4096, "encoder_attention_heads": 16,
        "decoder_attention_heads": 16}
# fairseq's transformer presets (register_model_architecture): what each changes from base_architecture.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "transformer": {}, "transformer_wmt_en_de": {}, "transformer_align": {},
    "transformer_tiny": {"encoder_embed_dim": 64, "encoder_ffn_embed_dim": 64, "encoder_layers": 2,
                         "encoder_attention_heads": 2, "decoder_layers": 2, "decoder_attention_heads": 2},
    "transformer_iwslt_de_en": {"encoder_ffn_embed_dim": 1024, "encoder_attention_heads": 4,
                                "decoder_attention_heads": 4},
    "transformer_vaswani_wmt_en_de_big": _BIG, "transformer_vaswani_wmt_en_fr_big": _BIG,
    "transformer_wmt_en_de_big": _BIG, "transformer_wmt_en_de_big_align": _BIG,
    "transformer_wmt_en_de_big_t2t": _BIG | {"encoder_normalize_before": True, "decoder_normalize_before": True},
}
_BASE: dict[str, Any] = {
    "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 2048, "encoder_layers": 6, "encoder_attention_heads": 8,
    "encoder_normalize_before": False, "encoder_learned_pos": False, "decoder_layers": 6,
    "decoder_attention_heads": 8, "decoder_normalize_before": False, "decoder_learned_pos": False,
    "activation_fn": "relu", "share_all_embeddings": False, "share_decoder_input_output_embed": False,
    "no_scale_embedding": False, "layernorm_embedding": False, "no_token_positional_embeddings": False,
    "max_source_positions": 1024, "max_target_positions": 1024, "no_decoder_final_norm": False,
}
# Options whose any set value means an architecture feature the spec does not describe.
_UNSUPPORTED_IF_SET = ("adaptive_softmax_cutoff", "adaptive_input", "cross_self_attention", "encoder_layers_to_keep",
                       "decoder_layers_to_keep", "character_embeddings", "no_token_positional_embeddings",
                       "tie_adaptive_weights")
ACTIVATIONS: dict[str, Activation] = {"relu": "relu", "gelu": "gelu", "gelu_fast": "gelu_tanh",
                                      "gelu_accurate": "gelu_tanh", "swish": "swish"}
_IGNORED_TENSORS = ("encoder.version", "decoder.version", "encoder.embed_positions._float_tensor",
                    "decoder.embed_positions._float_tensor")
# fairseq-generate's defaults: --beam 5 --lenpen 1 --max-len-b 200; pad never chosen; EOS forced at the cap.
DECODING = DecodingDefaults(beam_size=5, length_penalty=1.0, max_length=200, bad_word_ids=(1,), forced_eos=True,
                            early_stopping=True)


def find_checkpoint(source_dir: Path) -> Path | None:
    """The checkpoint file of a fairseq directory (None: none)."""
    for name in CHECKPOINT_NAMES:
        if (source_dir / name).is_file():
            return source_dir / name
    candidates = sorted(source_dir.glob("*.pt"))
    return candidates[0] if len(candidates) == 1 else None


class FairseqConverter(Converter):
    """Reads a fairseq Transformer checkpoint directory into a TransformerSpec."""

    framework = "fairseq"
    layout = "a fairseq directory: checkpoint_best.pt, dict.<src>.txt, dict.<tgt>.txt, bpecodes (torch extra)"

    @classmethod
    def detect(cls, source_dir: Path) -> bool:
        return find_checkpoint(source_dir) is not None and any(source_dir.glob("dict.*.txt"))

    def load(self) -> LoadedModel:
        """Read the checkpoint, dictionaries and codes.

        Raises:
            ConversionError: listing every unsupported option and missing file at once.
        """
        src = self.source_dir
        problems = [f"option {name!r} does not apply to fairseq checkpoints" for name in self.options]
        path = find_checkpoint(src)
        if path is None:
            raise cannot_convert(src, "fairseq", problems + [f"no checkpoint (expected one of "
                                                             f"{', '.join(CHECKPOINT_NAMES)}, or a single *.pt)"])
        checkpoint = load_checkpoint(path)
        if not isinstance(checkpoint, dict) or "model" not in checkpoint:
            raise cannot_convert(src, "fairseq", [f"{path.name} has no 'model' state dict (not a fairseq checkpoint)"])
        opts = _options(checkpoint)
        arch = opts.get("arch")
        if arch not in ARCHITECTURES:
            raise cannot_convert(src, "fairseq", problems + [
                f"architecture {arch!r} (supported: {', '.join(ARCHITECTURES)}: the Transformer)"])
        opts = _BASE | ARCHITECTURES[arch] | {k: v for k, v in opts.items() if v is not None}
        problems += _option_problems(opts)
        langs = [opts.get("source_lang"), opts.get("target_lang")]
        dicts = [src / f"dict.{lang}.txt" for lang in langs if isinstance(lang, str)]
        if len(dicts) < 2:
            problems.append("the checkpoint does not name its languages (source_lang / target_lang)")
        missing = [p.name for p in dicts if not p.is_file()]
        codes = _codes_file(src, opts.get("bpe_codes"))
        if codes is None:
            missing.append(f"BPE codes (one of {', '.join(CODES_NAMES)})")
        if missing:
            problems.append(f"missing vocab/tokenizer file(s): {', '.join(missing)}")
        if problems:
            raise cannot_convert(src, "fairseq", problems)
        assert codes is not None
        source_symbols, target_symbols = (read_dictionary(p) for p in dicts)
        config = _config(opts, len(source_symbols), len(target_symbols))
        weights, weight_problems = _map_weights(tensors(checkpoint["model"], f"{path}: model"), config, opts)
        if weight_problems:
            raise cannot_convert(src, "fairseq", weight_problems)
        if opts["share_all_embeddings"] and source_symbols != target_symbols:
            raise cannot_convert(src, "fairseq", ["share_all_embeddings, but the two dictionaries differ"])
        spec = TransformerSpec(config=config, special_ids=SpecialIds(pad=1, eos=2, decoder_start=2, unk=3),
                               decoding=DECODING, weights=weights)
        data = {f"tokenizer/{TOKENIZER_FILES['source_vocab']}": fsmt_vocab(source_symbols),
                f"tokenizer/{TOKENIZER_FILES['target_vocab']}": fsmt_vocab(target_symbols),
                f"tokenizer/{TOKENIZER_FILES['merges']}": fsmt_merges(codes)}
        source = {"framework": self.framework, "path": str(src.absolute()), "checkpoint": path.name, "arch": arch,
                  "bpe": opts.get("bpe"), "tokenizer": opts.get("tokenizer")}
        return LoadedModel(spec=spec, tokenizer=fsmt_tokenizer_entry([str(lang) for lang in langs], 3),
                           tokenizer_files={}, tokenizer_data=data, source=source, name=src.absolute().name)


def _options(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The model options: ``args`` (fairseq < 0.10) or ``cfg.model`` (+ ``cfg.task``'s languages), as a flat dict."""
    if checkpoint.get("args") is not None:
        opts = plain(checkpoint["args"])
    else:
        cfg = plain(checkpoint.get("cfg")) or {}
        opts = dict(cfg.get("model") or {})
        for key in ("source_lang", "target_lang"):
            opts.setdefault(key, (cfg.get("task") or {}).get(key))
        opts.setdefault("bpe", (cfg.get("bpe") or {}).get("_name"))
        opts.setdefault("tokenizer", (cfg.get("tokenizer") or {}).get("_name"))
        opts.setdefault("arch", opts.get("_name"))
    if not isinstance(opts, dict):
        raise ConversionError("the checkpoint's options (args / cfg.model) are not readable")
    # fairseq >= 0.10 dataclass configs nest the stacks: encoder.embed_dim -> encoder_embed_dim.
    for side in ("encoder", "decoder"):
        if isinstance(opts.get(side), dict):
            opts |= {f"{side}_{k}": v for k, v in opts.pop(side).items()}
    return opts


def _option_problems(opts: dict[str, Any]) -> list[str]:
    problems = [f"option {name}={json.dumps(opts[name])} (not supported)" for name in _UNSUPPORTED_IF_SET
                if opts.get(name) not in (None, False, 0, "", [])]
    if opts["activation_fn"] not in ACTIVATIONS:
        problems.append(f"activation_fn {opts['activation_fn']!r} (supported: {', '.join(ACTIVATIONS)})")
    d = opts["encoder_embed_dim"]
    for name in ("decoder_embed_dim", "decoder_input_dim", "decoder_output_dim"):
        if opts.get(name) not in (None, d):
            problems.append(f"{name}={opts[name]} differs from encoder_embed_dim={d} (not supported)")
    if opts.get("bpe") not in (None, "fastbpe", "subword_nmt"):
        problems.append(f"bpe {opts['bpe']!r} (supported: fastbpe, subword_nmt)")
    if opts.get("tokenizer") not in (None, "moses"):
        problems.append(f"tokenizer {opts['tokenizer']!r} (supported: moses)")
    return problems


def _config(opts: dict[str, Any], source_vocab: int, target_vocab: int) -> TransformerConfig:
    d = int(opts["encoder_embed_dim"])
    activation = ACTIVATIONS[opts["activation_fn"]]
    encoder_pre, decoder_pre = bool(opts["encoder_normalize_before"]), bool(opts["decoder_normalize_before"])
    return TransformerConfig(
        source_vocab_size=source_vocab, target_vocab_size=target_vocab, d_model=d,
        num_heads=int(opts["encoder_attention_heads"]), encoder_layers=int(opts["encoder_layers"]),
        decoder_layers=int(opts["decoder_layers"]), ffn_dim=int(opts["encoder_ffn_embed_dim"]), activation=activation,
        pre_norm=encoder_pre, encoder_final_norm=encoder_pre,
        decoder_final_norm=decoder_pre and not opts["no_decoder_final_norm"], norm_epsilon=1e-5,
        embedding_scale=1.0 if opts["no_scale_embedding"] else math.sqrt(d),
        max_positions=int(min(opts["max_source_positions"], opts["max_target_positions"])),
        shared_embeddings=bool(opts["share_all_embeddings"]),
        tied_output=bool(opts["share_all_embeddings"] or opts["share_decoder_input_output_embed"]),
        attention_bias=True, ffn_bias=True, logits_bias=False,
        decoder_num_heads=int(opts["decoder_attention_heads"]),
        decoder_ffn_dim=int(opts.get("decoder_ffn_embed_dim") or opts["encoder_ffn_embed_dim"]),
        decoder_activation=activation, decoder_pre_norm=decoder_pre,
        encoder_embed_norm=bool(opts["layernorm_embedding"]), decoder_embed_norm=bool(opts["layernorm_embedding"]),
        shared_positions=not (opts["encoder_learned_pos"] or opts["decoder_learned_pos"]),
    )


def _map_weights(state: dict[str, np.ndarray], config: TransformerConfig,
                 opts: dict[str, Any]) -> tuple[dict[str, np.ndarray], list[str]]:
    """fairseq names -> canonical names; returns (weights, problems)."""
    remaining = {k: v for k, v in state.items() if k not in _IGNORED_TENSORS}
    take = remaining.pop
    weights: dict[str, np.ndarray] = {}
    problems: list[str] = []

    def put(ours: str, theirs: str) -> None:
        array = take(theirs, None)
        if array is None:
            problems.append(f"missing tensor {theirs}")
        else:
            weights[ours] = array

    put("encoder.embed_tokens", "encoder.embed_tokens.weight")
    decoder_embed = take("decoder.embed_tokens.weight", None)
    if not config.shared_embeddings:
        if decoder_embed is None:
            problems.append("missing tensor decoder.embed_tokens.weight")
        else:
            weights["decoder.embed_tokens"] = decoder_embed
    output = take("decoder.output_projection.weight", None)
    embed_out = take("decoder.embed_out", None)
    if not config.tied_output:
        if output is None and embed_out is None:
            problems.append("missing tensor decoder.output_projection.weight")
        else:
            weights["decoder.output_proj"] = output if output is not None else embed_out  # type: ignore[assignment]
    pad = 1
    for side in ("encoder", "decoder"):
        if opts[f"{side}_learned_pos"]:
            table = take(f"{side}.embed_positions.weight", None)
            if table is None or table.ndim != 2 or table.shape[0] < pad + 1 + config.max_positions:
                problems.append(f"{side}.embed_positions.weight: missing or shorter than {config.max_positions} "
                                "positions")
            else:
                weights[f"{side}.positions"] = np.ascontiguousarray(table[pad + 1 : pad + 1 + config.max_positions])
        if getattr(config, side).embed_norm:
            for ours, theirs in (("scale", "weight"), ("bias", "bias")):
                put(f"{side}.embed_norm.{ours}", f"{side}.layernorm_embedding.{theirs}")
        if getattr(config, side).final_norm:
            for ours, theirs in (("scale", "weight"), ("bias", "bias")):
                put(f"{side}.final_norm.{ours}", f"{side}.layer_norm.{theirs}")
    if config.shared_positions:
        weights["positions"] = sinusoidal_positions(config.max_positions, config.d_model, pad)
    else:
        for side in ("encoder", "decoder"):
            if not opts[f"{side}_learned_pos"]:
                weights[f"{side}.positions"] = sinusoidal_positions(config.max_positions, config.d_model, pad)
    weights |= map_layers(lambda name: take(name, None), config)
    for name in sorted(remaining):
        problems.append(f"unexpected tensor {name} {list(remaining[name].shape)} (not part of a fairseq Transformer "
                        "with these options)")
    return weights, problems


def sinusoidal_positions(max_positions: int, dim: int, padding_idx: int) -> np.ndarray:
    """fairseq's sinusoidal table computed by torch exactly as fairseq computes it (rows from ``padding_idx + 1``:
    positions 0, 1, ...); ``converters.fairseq_layers.sinusoidal_positions`` is the numpy twin within 1 ulp."""
    import torch

    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
    angles = torch.arange(padding_idx + 1, padding_idx + 1 + max_positions, dtype=torch.float).unsqueeze(1) * freqs
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(max_positions, 1)], dim=1)
    return np.ascontiguousarray(table.numpy(), dtype=np.float32)


def _codes_file(src: Path, named: Any) -> Path | None:
    candidates = ([src / Path(str(named)).name] if named else []) + [src / name for name in CODES_NAMES]
    return next((p for p in candidates if p.is_file()), None)


def read_dictionary(path: Path) -> list[str]:
    """A fairseq ``dict.txt`` as fairseq's Dictionary loads it: the four specials, then one symbol per line
    (``symbol count [#fairseq:overwrite]``).

    Raises:
        ConversionError: unreadable, a malformed line, or a duplicate without ``#fairseq:overwrite``.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConversionError(f"{path}: unreadable dictionary ({e})") from e
    symbols = list(SPECIALS)
    seen = set(symbols)
    for number, line in enumerate(lines, 1):
        overwrite = line.endswith(" #fairseq:overwrite")
        entry = line.removesuffix(" #fairseq:overwrite")
        symbol, sep, count = entry.rpartition(" ")
        if not sep or not count.lstrip("-").isdigit():
            raise ConversionError(f"{path}:{number}: expected '<symbol> <count>', got {line!r}")
        if symbol in seen and not overwrite:
            raise ConversionError(f"{path}:{number}: duplicate symbol {symbol!r}")
        seen.add(symbol)
        symbols.append(symbol)
    return symbols


def fsmt_vocab(symbols: list[str]) -> bytes:
    """A fairseq dictionary in FSMT's vocab JSON form: ``th@@`` (inside a word) -> ``th``, ``the`` -> ``the</w>``,
    the specials unchanged; ids are the dictionary's."""
    vocab: dict[str, int] = {}
    for i, symbol in enumerate(symbols):
        if symbol in SPECIALS:
            token = symbol
        elif symbol.endswith("@@"):
            token = symbol[:-2]
        else:
            token = symbol + "</w>"
        vocab.setdefault(token, i)
    return json.dumps(vocab, ensure_ascii=False, indent=1).encode("utf-8")


def fsmt_merges(codes: Path) -> bytes:
    """BPE codes (fastBPE ``a b count`` or subword-nmt ``a b`` after a ``#version`` line) as FSMT's merges.txt."""
    try:
        lines = codes.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConversionError(f"{codes}: unreadable BPE codes ({e})") from e
    merges = [" ".join(line.split()[:2]) for line in lines
              if not line.startswith("#version") and len(line.split()) >= 2]
    return ("\n".join(merges) + "\n").encode("utf-8")
