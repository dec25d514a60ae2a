"""OpenNMT-py checkpoints (``.pt`` with ``model``, ``generator``, ``vocab``, ``opt``) of the standard Transformer ->
TransformerSpec, with the torch extra and no OpenNMT-py installed.

A local directory with the checkpoint (the only ``*.pt``, or the newest ``*_step_N.pt``) and the SentencePiece
models of its ``sentencepiece`` transform (the files ``opt.src_subword_model`` / ``tgt_subword_model`` name, found in
the directory, or ``source.spm`` / ``target.spm``). The checkpoint is read by
:func:`converters.torch_checkpoint.load_checkpoint` (no OpenNMT-py class is imported or run); ``vocab`` is
OpenNMT-py 3's dict of token lists.

The math is OpenNMT-py's ``TransformerEncoder`` / ``TransformerDecoder``: pre-norm layers (``layer_norm`` before
self-attention; ``layer_norm_1`` / ``layer_norm_2`` in the decoder; the feed-forward block's own ``layer_norm``) and
final ``layer_norm``s, epsilon ``norm_eps`` (1e-6); token embedding times ``sqrt(word_vec_size)`` plus the
sinusoidal table (interleaved sines and cosines, or ``SinusoidalConcat``); attention biases with ``add_qkvbias``
(OpenNMT-py 2 always had them), feed-forward biases with ``add_ffnbias``; the generator (a linear layer with bias,
tied to the decoder embedding with ``share_decoder_embeddings``). Sources carry no EOS: the package masks the EOS
the engine appends. The decoder starts with ``vocab["decoder_start_token"]`` (``<s>``). Decoding defaults are
``onmt_translate``'s (beam 5, length normalization, at most 250 tokens).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from converters.base import Converter, LoadedModel, cannot_convert, sentencepiece_tokenizer
from converters.spec import Activation, DecodingDefaults, SpecialIds, TransformerConfig, TransformerSpec
from converters.torch_checkpoint import load_checkpoint, plain, tensors

ACTIVATIONS: dict[str, Activation] = {"relu": "relu", "gelu": "gelu", "fast_gelu": "gelu_tanh"}
POSITION_TYPES = ("SinusoidalInterleaved", "SinusoidalConcat")
DEFAULT_MAX_POSITIONS = 1024
# onmt_translate's defaults: -beam_size 5 -length_penalty avg -max_length 250.
DECODING = DecodingDefaults(beam_size=5, length_penalty=1.0, max_length=250)
_SUPPORTED_VALUES: dict[str, tuple[Any, ...]] = {
    "encoder_type": ("transformer",), "decoder_type": ("transformer",), "self_attn_type": ("scaled-dot",
                                                                                           "scaled-dot-flash"),
    "max_relative_positions": (0,), "parallel_residual": (False,), "layer_norm": ("standard",),
    "num_kv": (0, None), "feat_merge": ("concat", None), "model_task": ("seq2seq", None),
    "aan_useffn": (False,),
}
_STEP = re.compile(r"_step_(\d+)\.pt$")


def find_checkpoint(source_dir: Path) -> Path | None:
    """The only ``*.pt``, or the one with the highest ``_step_N`` (None: none, or several unnumbered)."""
    candidates = sorted(source_dir.glob("*.pt"))
    if len(candidates) == 1:
        return candidates[0]
    stepped = [(int(m.group(1)), p) for p in candidates if (m := _STEP.search(p.name))]
    return max(stepped)[1] if stepped and len(stepped) == len(candidates) else None


class OpenNmtPyConverter(Converter):
    """Reads an OpenNMT-py Transformer checkpoint directory into a TransformerSpec."""

    framework = "opennmt-py"
    layout = "an OpenNMT-py directory: model_step_N.pt (model, generator, vocab, opt) and its .model SentencePiece"

    @classmethod
    def detect(cls, source_dir: Path) -> bool:
        return find_checkpoint(source_dir) is not None and not any(source_dir.glob("dict.*.txt"))

    def load(self) -> LoadedModel:
        """Read the checkpoint and the SentencePiece models.

        Raises:
            ConversionError: listing every unsupported option and missing file at once.
        """
        src = self.source_dir
        problems = [f"option {name!r} does not apply to OpenNMT-py checkpoints" for name in self.options]
        path = find_checkpoint(src)
        if path is None:
            raise cannot_convert(src, "OpenNMT-py", [*problems, "no checkpoint (expected one .pt, or *_step_N.pt)"])
        checkpoint = load_checkpoint(path)
        missing_keys = [k for k in ("model", "generator", "vocab", "opt")
                        if not isinstance(checkpoint, dict) or k not in checkpoint]
        if missing_keys:
            raise cannot_convert(src, "OpenNMT-py", [f"{path.name} has no {', '.join(missing_keys)} (not an "
                                                     "OpenNMT-py checkpoint)"])
        opts = plain(checkpoint["opt"]) or {}
        problems += _option_problems(opts)
        vocab = checkpoint["vocab"]
        if not (isinstance(vocab, dict) and all(isinstance(vocab.get(k), list) for k in ("src", "tgt"))):
            problems.append("vocab is not OpenNMT-py 3's {'src': [...], 'tgt': [...]} (OpenNMT-py 2's torchtext "
                            "vocabularies are not supported)")
        spm = _spm_files(src, opts)
        if spm is None:
            problems.append("missing the SentencePiece models (the files src_subword_model / tgt_subword_model "
                            "name, or source.spm / target.spm, in the directory)")
        if problems:
            raise cannot_convert(src, "OpenNMT-py", problems)
        assert spm is not None
        source_tokens, target_tokens = [str(t) for t in vocab["src"]], [str(t) for t in vocab["tgt"]]
        ids, id_problems = _special_ids(source_tokens, target_tokens, str(vocab.get("decoder_start_token") or "<s>"))
        if id_problems:
            raise cannot_convert(src, "OpenNMT-py", id_problems)
        state = tensors(checkpoint["model"], f"{path}: model")
        generator = tensors(checkpoint["generator"], f"{path}: generator")
        weights, config, weight_problems = _map_weights(state, generator, opts, len(source_tokens),
                                                        len(target_tokens))
        if weight_problems:
            raise cannot_convert(src, "OpenNMT-py", weight_problems)
        spec = TransformerSpec(config=config, special_ids=ids, decoding=DECODING, weights=weights)
        source = {"framework": self.framework, "path": str(src.absolute()), "checkpoint": path.name}
        tokenizer = sentencepiece_tokenizer(spm, _json(source_tokens),
                                            _json(target_tokens) if target_tokens != source_tokens else None, ids.unk)
        return LoadedModel(spec=spec, source=source, name=src.absolute().name, **tokenizer)


def _option_problems(opts: dict[str, Any]) -> list[str]:
    problems = [f"{name}={json.dumps(opts[name])} (supported: {', '.join(json.dumps(v) for v in supported)})"
                for name, supported in _SUPPORTED_VALUES.items()
                if name in opts and opts[name] not in supported]
    if opts.get("position_encoding") is not True:
        problems.append(f"position_encoding={json.dumps(opts.get('position_encoding'))} (only the sinusoidal "
                        "position encoding is supported)")
    if opts.get("position_encoding_type", POSITION_TYPES[0]) not in POSITION_TYPES:
        problems.append(f"position_encoding_type {opts['position_encoding_type']!r} (supported: "
                        f"{', '.join(POSITION_TYPES)})")
    if opts.get("pos_ffn_activation_fn", "relu") not in ACTIVATIONS:
        problems.append(f"pos_ffn_activation_fn {opts['pos_ffn_activation_fn']!r} (supported: "
                        f"{', '.join(ACTIVATIONS)})")
    d = _hidden(opts)
    for name in ("word_vec_size", "src_word_vec_size", "tgt_word_vec_size"):
        if opts.get(name) not in (None, -1, d):
            problems.append(f"{name}={opts[name]} differs from hidden_size={d} (not supported)")
    transforms = opts.get("transforms") or []
    tokenizers = [t for t in transforms if t in ("sentencepiece", "bpe", "onmt_tokenize")]
    if tokenizers and tokenizers != ["sentencepiece"]:
        problems.append(f"transforms {tokenizers} (only the sentencepiece tokenization is supported)")
    return problems


def _hidden(opts: dict[str, Any]) -> int:
    return int(opts.get("hidden_size") or opts.get("enc_hid_size") or opts.get("rnn_size") or 512)


def _spm_files(src: Path, opts: dict[str, Any]) -> tuple[Path, Path] | None:
    named = [opts.get("src_subword_model"), opts.get("tgt_subword_model")]
    if all(named):
        pair = (src / Path(str(named[0])).name, src / Path(str(named[1])).name)
        if all(p.is_file() for p in pair):
            return pair
    pair = (src / "source.spm", src / "target.spm")
    return pair if all(p.is_file() for p in pair) else None


def _special_ids(source: list[str], target: list[str], start: str) -> tuple[SpecialIds, list[str]]:
    problems = []
    for token in ("<unk>", "<blank>", "</s>"):
        for side, tokens in (("source", source), ("target", target)):
            if token not in tokens:
                problems.append(f"the {side} vocabulary has no {token}")
    if start not in target:
        problems.append(f"the target vocabulary has no decoder start token {start!r}")
    if not problems:
        for token in ("<blank>", "</s>"):
            if source.index(token) != target.index(token):
                problems.append(f"{token} has different ids in the source and target vocabularies")
    if problems:
        return SpecialIds(pad=0, eos=0, decoder_start=0), problems
    return SpecialIds(pad=source.index("<blank>"), eos=source.index("</s>"), decoder_start=target.index(start),
                      unk=source.index("<unk>")), []


def _json(tokens: list[str]) -> bytes:
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    return json.dumps(vocab, ensure_ascii=False, indent=1).encode("utf-8")


def positions(max_positions: int, dim: int, kind: str) -> np.ndarray:
    """OpenNMT-py's ``PositionalEncoding`` table: ``sin(p * f_i)`` / ``cos(p * f_i)``, ``f_i = 10000 ** (-2i / dim)``,
    interleaved (channels 2i, 2i+1) or concatenated (all sines, then all cosines)."""
    position = np.arange(max_positions, dtype=np.float64)[:, None]
    freqs = np.exp(np.arange(0, dim, 2, dtype=np.float64) * -(math.log(10000.0) / dim))
    table = np.zeros((max_positions, dim))
    if kind == "SinusoidalConcat":
        half = dim // 2
        table[:, :half] = np.sin(position * freqs[:half])
        table[:, half : 2 * half] = np.cos(position * freqs[:half])
    else:
        table[:, 0::2] = np.sin(position * freqs)
        table[:, 1::2] = np.cos(position * freqs[: dim // 2])
    return table.astype(np.float32)


def _map_weights(state: dict[str, np.ndarray], generator: dict[str, np.ndarray], opts: dict[str, Any],
                 source_vocab: int, target_vocab: int) -> tuple[dict[str, np.ndarray], TransformerConfig, list[str]]:
    """OpenNMT-py names -> canonical names, and the config they and the options describe."""
    remaining = dict(state) | {f"generator.{k.removeprefix('0.')}": v for k, v in generator.items()}
    problems: list[str] = []
    weights: dict[str, np.ndarray] = {}

    def put(ours: str, theirs: str, transpose: bool = False) -> None:
        array = remaining.pop(theirs, None)
        if array is None:
            problems.append(f"missing tensor {theirs}")
        else:
            weights[ours] = np.ascontiguousarray(array.T) if transpose and array.ndim == 2 else array

    def linear(ours: str, theirs: str, bias: bool) -> None:
        put(f"{ours}.weight", f"{theirs}.weight", transpose=True)
        if bias:
            put(f"{ours}.bias", f"{theirs}.bias")

    def norm(ours: str, theirs: str) -> None:
        put(f"{ours}.scale", f"{theirs}.weight")
        put(f"{ours}.bias", f"{theirs}.bias")

    qkv_bias = bool(opts.get("add_qkvbias", True))
    ffn_bias = bool(opts.get("add_ffnbias", True))

    def attention(ours: str, theirs: str) -> None:
        for proj, name in (("q", "linear_query"), ("k", "linear_keys"), ("v", "linear_values"), ("o", "final_linear")):
            linear(f"{ours}.{proj}", f"{theirs}.{name}", qkv_bias)

    def ffn(ours: str, theirs: str) -> None:
        linear(f"{ours}.fc1", f"{theirs}.w_1", ffn_bias)
        linear(f"{ours}.fc2", f"{theirs}.w_2", ffn_bias)
        norm(f"{ours}_norm", f"{theirs}.layer_norm")

    d = _hidden(opts)
    layers = {"encoder": int(opts.get("enc_layers") or opts.get("layers") or 6),
              "decoder": int(opts.get("dec_layers") or opts.get("layers") or 6)}
    shared = bool(opts.get("share_embeddings"))
    put("encoder.embed_tokens", "encoder.embeddings.make_embedding.emb_luts.0.weight")
    decoder_embed = "decoder.embeddings.make_embedding.emb_luts.0.weight"
    if shared:
        remaining.pop(decoder_embed, None)
    else:
        put("decoder.embed_tokens", decoder_embed)
    kind = str(opts.get("position_encoding_type") or POSITION_TYPES[0])
    tables = [remaining.pop(f"{side}.embeddings.make_embedding.pe.pe", None) for side in layers]
    stored = next((t for t in tables if t is not None), None)
    max_positions = int(stored.size // d) if stored is not None else DEFAULT_MAX_POSITIONS
    weights["positions"] = stored.reshape(max_positions, d) if stored is not None else positions(max_positions, d,
                                                                                                 kind)
    for i in range(layers["encoder"]):
        p, q = f"encoder.layers.{i}", f"encoder.transformer.{i}"
        attention(f"{p}.self_attn", f"{q}.self_attn")
        norm(f"{p}.self_attn_norm", f"{q}.layer_norm")
        ffn(f"{p}.ffn", f"{q}.feed_forward")
    for i in range(layers["decoder"]):
        p, q = f"decoder.layers.{i}", f"decoder.transformer_layers.{i}"
        attention(f"{p}.self_attn", f"{q}.self_attn")
        norm(f"{p}.self_attn_norm", f"{q}.layer_norm_1")
        attention(f"{p}.cross_attn", f"{q}.context_attn")
        norm(f"{p}.cross_attn_norm", f"{q}.layer_norm_2")
        ffn(f"{p}.ffn", f"{q}.feed_forward")
    norm("encoder.final_norm", "encoder.layer_norm")
    norm("decoder.final_norm", "decoder.layer_norm")
    tied = bool(opts.get("share_decoder_embeddings"))
    if tied:
        remaining.pop("generator.weight", None)
    else:
        put("decoder.output_proj", "generator.weight")
    has_bias = "generator.bias" in remaining
    if has_bias:
        put("decoder.output_bias", "generator.bias")
    for name in sorted(remaining):
        problems.append(f"unexpected tensor {name} {list(remaining[name].shape)} (not part of an OpenNMT-py "
                        "Transformer with these options)")
    heads = int(opts.get("heads", 8))
    ffn_dim = int(opts.get("transformer_ff", 2048))
    activation = ACTIVATIONS.get(str(opts.get("pos_ffn_activation_fn", "relu")), "relu")
    config = TransformerConfig(
        source_vocab_size=source_vocab, target_vocab_size=target_vocab, d_model=d, num_heads=heads,
        encoder_layers=layers["encoder"], decoder_layers=layers["decoder"], ffn_dim=ffn_dim, activation=activation,
        pre_norm=True, encoder_final_norm=True, decoder_final_norm=True,
        norm_epsilon=float(opts.get("norm_eps", 1e-6)), embedding_scale=math.sqrt(d), max_positions=max_positions,
        shared_embeddings=shared, tied_output=tied, attention_bias=qkv_bias, ffn_bias=ffn_bias, logits_bias=has_bias,
        decoder_num_heads=heads, decoder_ffn_dim=ffn_dim, decoder_activation=activation, decoder_pre_norm=True,
        mask_source_eos=True,
    )
    return weights, config, problems
