"""Marian NMT's native ``.npz`` models (what OPUS-MT publishes before the Hugging Face conversion) -> TransformerSpec,
with numpy only.

A local directory with the model (``decoder.yml``'s ``models``, else the only ``*.npz`` that is not an optimizer
state), its vocabularies (``decoder.yml``'s ``vocabs``, else ``*.vocab.yml`` or ``vocab.*.yml``; YAML ``piece: id``
maps, or SentencePiece ``.spm`` vocabularies), and, for YAML vocabularies, the SentencePiece models ``source.spm`` /
``target.spm`` that turn text into their pieces.

The model's options are the YAML in its ``special:model.yml`` entry; the math is Marian's ``transformer.h``: token
embedding times ``sqrt(dim-emb)`` plus the sinusoidal table (tensor2tensor's formula), or the learned ``Wpos``
unscaled; ``--transformer-postprocess-emb n`` a layer norm after it; post-norm layers (``--transformer-preprocess ''
--transformer-postprocess dan``) or pre-norm ones (``n`` / ``da``) with ``--transformer-postprocess-top n`` final norms;
layer norms with epsilon 1e-6; the decoder starts from an all-zero embedding; logits through ``decoder_ff_logit_out``
(tied to the embedding with ``--tied-embeddings[-all]``) plus its bias. Marian pads sources with EOS and masks them;
here the source vocabulary gets one more id, a zero row, used only to pad (the real EOS must stay visible).
Decoding defaults come from ``decoder.yml`` (``beam-size``, ``normalize`` as the length penalty exponent,
``max-length``) and ``<unk>`` is never generated unless ``allow-unk``.
"""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from converters.base import ConversionError, Converter, LoadedModel, cannot_convert, sentencepiece_tokenizer
from converters.spec import Activation, DecodingDefaults, SpecialIds, TransformerConfig, TransformerSpec
from converters.t2t_checkpoint import timing_signal

MODEL_CONFIG = "special:model.yml"
# Marian's names -> ours (its "gelu" is x * sigmoid(1.702 x)).
ACTIVATIONS: dict[str, Activation] = {"relu": "relu", "swish": "swish", "gelu": "gelu_sigmoid"}
# (--transformer-preprocess, --transformer-postprocess) without the dropouts -> pre_norm.
NORM_PLACEMENTS: dict[tuple[str, str], bool] = {("", "an"): False, ("n", "a"): True}
DEFAULT_MAX_POSITIONS = 1024
_SUPPORTED_VALUES: dict[str, tuple[Any, ...]] = {  # option -> the values the spec describes
    "transformer-decoder-autoreg": ("self-attention",), "transformer-no-projection": (False,), "right-left": (False,),
    "transformer-tied-layers": ([],), "transformer-pool": (False,), "ulr": (False,), "lemma-dim-emb": (0,),
    "transformer-ffn-depth": (2,), "transformer-decoder-ffn-depth": (0, 2),
}


def _model_files(src: Path) -> list[Path]:
    return sorted(p for p in src.glob("*.npz") if not p.name.endswith(".optimizer.npz"))


class MarianNpzConverter(Converter):
    """Reads a Marian NMT model directory (``.npz`` + vocabularies) into a TransformerSpec."""

    framework = "marian-npz"
    layout = ("a Marian NMT directory (OPUS-MT): model.npz, decoder.yml, vocab.yml (+ source.spm, target.spm) "
              "or .spm vocabularies")

    @classmethod
    def detect(cls, source_dir: Path) -> bool:
        return bool(_model_files(source_dir)) and (
            (source_dir / "decoder.yml").is_file() or any(source_dir.glob("*.yml")) or any(source_dir.glob("*.spm")))

    def load(self) -> LoadedModel:
        """Read the model, its options and vocabularies.

        Raises:
            ConversionError: listing every unsupported option and missing file at once.
        """
        src = self.source_dir
        problems = [f"option {name!r} does not apply to Marian NMT models" for name in self.options]
        decoder = _read_yaml(src / "decoder.yml") if (src / "decoder.yml").is_file() else {}
        model_path, vocab_paths, file_problems = _find_files(src, decoder)
        problems += file_problems
        if problems or model_path is None:
            raise cannot_convert(src, "Marian NMT", problems)
        npz = _open_npz(model_path)
        opts = _model_options(npz, model_path)
        problems += _option_problems(opts)
        vocabs = [_read_vocab(p) for p in vocab_paths]
        spm = _spm_files(src, vocab_paths)
        if spm is None:
            problems.append("missing source.spm / target.spm (the SentencePiece models of the YAML vocabularies)")
        if problems:
            raise cannot_convert(src, "Marian NMT", problems)
        assert spm is not None
        source_vocab, target_vocab = vocabs[0], vocabs[-1]
        missing = [t for t in ("</s>", "<unk>") if t not in source_vocab or t not in target_vocab]
        if missing:
            raise cannot_convert(src, "Marian NMT", [f"the vocabularies lack {', '.join(missing)}"])
        weights, config, weight_problems = _map_weights(npz, opts, len(source_vocab), len(target_vocab))
        if weight_problems:
            raise cannot_convert(src, "Marian NMT", weight_problems)
        eos, unk = source_vocab["</s>"], source_vocab["<unk>"]
        special = SpecialIds(pad=len(source_vocab), eos=eos, decoder_start=eos, unk=unk)
        spec = TransformerSpec(config=config, special_ids=special, decoding=_decoding(decoder, unk), weights=weights)
        source: dict[str, Any] = {"framework": self.framework, "path": str(src.absolute()), "model": model_path.name,
                                  "vocabs": [p.name for p in vocab_paths]}
        ignored = {k: decoder[k] for k in ("word-penalty", "max-length-factor") if decoder.get(k) not in (None, 0)}
        if ignored:
            source["ignored_decoding_options"] = ignored
        tokenizer = sentencepiece_tokenizer(spm, _json(source_vocab),
                                            _json(target_vocab) if target_vocab != source_vocab else None, unk)
        return LoadedModel(spec=spec, source=source, name=src.absolute().name, **tokenizer)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConversionError(f"{path}: unreadable YAML ({e})") from e
    if not isinstance(data, dict):
        raise ConversionError(f"{path}: expected a YAML mapping")
    return data


def _find_files(src: Path, decoder: dict[str, Any]) -> tuple[Path | None, list[Path], list[str]]:
    """(model, [source vocab, target vocab], problems): decoder.yml's, else found by name."""
    problems: list[str] = []
    models = [src / Path(str(m)).name for m in decoder.get("models") or []]
    if not models:
        models = _model_files(src)
        if len(models) > 1:
            problems.append(f"several models ({', '.join(p.name for p in models)}) and no decoder.yml naming one")
    model = models[0] if models else None
    if model is None or not model.is_file():
        problems.append(f"missing model {model.name if model else '(*.npz)'}")
    vocabs = [src / Path(str(v)).name for v in decoder.get("vocabs") or []]
    if not vocabs:
        vocabs = sorted([*src.glob("*.vocab.yml"), *src.glob("vocab.*.yml")])
        vocabs = vocabs or sorted(src.glob("vocab*.spm"))
        if len(vocabs) > 2:
            problems.append(f"several vocabularies ({', '.join(p.name for p in vocabs)}) and no decoder.yml")
    if not vocabs:
        problems.append("missing vocabulary (*.vocab.yml, or decoder.yml's vocabs)")
    problems += [f"missing vocabulary {p.name}" for p in vocabs if not p.is_file()]
    if len(vocabs) == 1:
        vocabs = vocabs * 2
    return model, vocabs[:1] + vocabs[-1:], problems


def _open_npz(path: Path) -> Any:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise ConversionError(f"{path}: not a readable .npz model ({e})") from e


def _model_options(npz: Any, path: Path) -> dict[str, Any]:
    if MODEL_CONFIG not in npz.files:
        raise ConversionError(f"{path}: no {MODEL_CONFIG!r} entry (not a Marian model)")
    raw = np.asarray(npz[MODEL_CONFIG]).tobytes().rstrip(b"\0")
    try:
        opts = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConversionError(f"{path}: unreadable {MODEL_CONFIG} ({e})") from e
    if not isinstance(opts, dict):
        raise ConversionError(f"{path}: {MODEL_CONFIG} is not a mapping")
    return opts


def _ops(value: Any) -> str:
    return str(value or "").replace("d", "")


def _option_problems(opts: dict[str, Any]) -> list[str]:
    problems = []
    if opts.get("type") not in ("transformer",):
        problems.append(f"type {opts.get('type')!r} (only the transformer is supported)")
    for name, supported in _SUPPORTED_VALUES.items():
        if opts.get(name) is not None and opts[name] not in supported:
            problems.append(f"--{name} {json.dumps(opts[name])} (supported: "
                            f"{', '.join(json.dumps(v) for v in supported)})")
    if opts.get("transformer-ffn-activation", "swish") not in ACTIVATIONS:
        problems.append(f"--transformer-ffn-activation {opts['transformer-ffn-activation']!r} (supported: "
                        f"{', '.join(ACTIVATIONS)})")
    placement = (_ops(opts.get("transformer-preprocess")), _ops(opts.get("transformer-postprocess", "dan")))
    if placement not in NORM_PLACEMENTS:
        problems.append(f"--transformer-preprocess {opts.get('transformer-preprocess')!r} with "
                        f"--transformer-postprocess {opts.get('transformer-postprocess')!r} (supported: '' with "
                        "'dan', 'n' with 'da')")
    if _ops(opts.get("transformer-postprocess-top")) not in ("", "n"):
        problems.append(f"--transformer-postprocess-top {opts['transformer-postprocess-top']!r} (supported: '', n)")
    if _ops(opts.get("transformer-postprocess-emb", "d")) not in ("", "n"):
        problems.append(f"--transformer-postprocess-emb {opts['transformer-postprocess-emb']!r} (supported: d, n)")
    return problems


def _read_vocab(path: Path) -> dict[str, int]:
    """A Marian vocabulary: YAML ``piece: id`` (read with every key a string, as Marian reads it) or a
    SentencePiece model (ids are its pieces' ids)."""
    if path.suffix == ".spm":
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor()
        try:
            sp.Load(str(path))
        except (OSError, RuntimeError) as e:
            raise ConversionError(f"{path}: not a SentencePiece model ({e})") from e
        return {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)  # BaseLoader: "yes", "1", "~" stay strings
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - BaseLoader builds no objects
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConversionError(f"{path}: unreadable vocabulary ({e})") from e
    if not isinstance(data, dict) or not all(str(v).isdigit() for v in data.values()):
        raise ConversionError(f"{path}: expected a YAML mapping of pieces to ids")
    return {str(k): int(v) for k, v in data.items()}


def _spm_files(src: Path, vocabs: list[Path]) -> tuple[Path, Path] | None:
    if all(p.suffix == ".spm" for p in vocabs):
        return vocabs[0], vocabs[-1]
    pair = (src / "source.spm", src / "target.spm")
    return pair if all(p.is_file() for p in pair) else None


def _json(vocab: dict[str, int]) -> bytes:
    return json.dumps(vocab, ensure_ascii=False, indent=1).encode("utf-8")


def _decoding(decoder: dict[str, Any], unk: int) -> DecodingDefaults:
    return DecodingDefaults(
        beam_size=int(decoder.get("beam-size", 12)), length_penalty=float(decoder.get("normalize", 0.0)),
        length_penalty_kind="hf", max_length=int(decoder.get("max-length", 1000)),
        bad_word_ids=() if decoder.get("allow-unk") else (unk,), forced_eos=False, early_stopping=False)


def _map_weights(npz: Any, opts: dict[str, Any], source_vocab: int,
                 target_vocab: int) -> tuple[dict[str, np.ndarray], TransformerConfig, list[str]]:
    """Marian's parameter names -> canonical names, and the config they and the options describe."""
    remaining = {name: np.asarray(npz[name]) for name in npz.files if name != MODEL_CONFIG}
    problems: list[str] = []
    weights: dict[str, np.ndarray] = {}

    def take(name: str, squeeze: bool = False) -> np.ndarray | None:
        array = remaining.pop(name, None)
        if array is None:
            problems.append(f"missing tensor {name}")
            return None
        array = np.ascontiguousarray(array, dtype=np.float32)
        return array.reshape(-1) if squeeze else array

    def put(ours: str, theirs: str, squeeze: bool = False) -> None:
        array = take(theirs, squeeze)
        if array is not None:
            weights[ours] = array

    tied_all, tied_src = bool(opts.get("tied-embeddings-all")), bool(opts.get("tied-embeddings-src"))
    encoder_embed = take("Wemb" if tied_all or tied_src else "encoder_Wemb")
    decoder_name = "Wemb" if tied_all or tied_src else "decoder_Wemb"
    decoder_embed = encoder_embed if decoder_name == "Wemb" else take("decoder_Wemb")
    if encoder_embed is not None:  # one more row: the padding id, never attended to
        weights["encoder.embed_tokens"] = np.concatenate([encoder_embed, np.zeros_like(encoder_embed[:1])])
    if decoder_embed is not None:
        weights["decoder.embed_tokens"] = decoder_embed
    tied = tied_all or bool(opts.get("tied-embeddings"))
    if not tied:
        output = take("decoder_ff_logit_out_W")
        if output is not None:
            weights["decoder.output_proj"] = np.ascontiguousarray(output.T)
    has_bias = "decoder_ff_logit_out_b" in remaining
    if has_bias:
        put("decoder.output_bias", "decoder_ff_logit_out_b", squeeze=True)

    d = int(opts.get("dim-emb", 512))
    learned = "Wpos" in remaining
    max_positions = DEFAULT_MAX_POSITIONS
    if learned:
        table = take("Wpos")
        if table is not None:
            max_positions = table.shape[0]
            weights["positions"] = table
    else:
        weights["positions"] = timing_signal(max_positions, d)
    pre = NORM_PLACEMENTS[(_ops(opts.get("transformer-preprocess")), _ops(opts.get("transformer-postprocess", "dan")))]
    suffix = "_pre" if pre else ""

    def norm(ours: str, theirs: str, suffix: str = "") -> None:  # Marian: <prefix>_ln_scale[_pre]
        put(f"{ours}.scale", f"{theirs}_ln_scale{suffix}", squeeze=True)
        put(f"{ours}.bias", f"{theirs}_ln_bias{suffix}", squeeze=True)

    def attention(ours: str, theirs: str) -> None:
        for proj in "qkvo":
            put(f"{ours}.{proj}.weight", f"{theirs}_W{proj}")
            put(f"{ours}.{proj}.bias", f"{theirs}_b{proj}", squeeze=True)
        norm(f"{ours}_norm", f"{theirs}_Wo", suffix)

    def ffn(ours: str, theirs: str) -> None:
        for i in (1, 2):
            put(f"{ours}.fc{i}.weight", f"{theirs}_W{i}")
            put(f"{ours}.fc{i}.bias", f"{theirs}_b{i}", squeeze=True)
        norm(f"{ours}_norm", f"{theirs}_ffn", suffix)

    layers = {"encoder": int(opts.get("enc-depth", 6)), "decoder": int(opts.get("dec-depth", 6))}
    embed_norm = _ops(opts.get("transformer-postprocess-emb", "d")) == "n"
    top_norm = _ops(opts.get("transformer-postprocess-top")) == "n"
    for side, count in layers.items():
        if embed_norm:
            norm(f"{side}.embed_norm", f"{side}_emb", "_pre")
        for i in range(count):
            attention(f"{side}.layers.{i}.self_attn", f"{side}_l{i + 1}_self")
            if side == "decoder":
                attention(f"{side}.layers.{i}.cross_attn", f"{side}_l{i + 1}_context")
            ffn(f"{side}.layers.{i}.ffn", f"{side}_l{i + 1}_ffn")
        if top_norm:
            norm(f"{side}.final_norm", f"{side}_top")
    for name in sorted(remaining):
        problems.append(f"unexpected tensor {name} {list(remaining[name].shape)} (not part of a Marian transformer "
                        "with these options)")
    ffn_dim = int(opts.get("transformer-dim-ffn", 2048))
    activation = ACTIVATIONS[opts.get("transformer-ffn-activation", "swish")]
    heads = int(opts.get("transformer-heads", 8))
    config = TransformerConfig(
        source_vocab_size=source_vocab + 1, target_vocab_size=target_vocab, d_model=d, num_heads=heads,
        encoder_layers=layers["encoder"], decoder_layers=layers["decoder"], ffn_dim=ffn_dim, activation=activation,
        pre_norm=pre, encoder_final_norm=top_norm, decoder_final_norm=top_norm, norm_epsilon=1e-6,
        embedding_scale=1.0 if learned else math.sqrt(d), max_positions=max_positions, shared_embeddings=False,
        tied_output=tied, attention_bias=True, ffn_bias=True, logits_bias=has_bias, decoder_num_heads=heads,
        decoder_ffn_dim=int(opts.get("transformer-decoder-dim-ffn") or ffn_dim), decoder_activation=activation,
        decoder_pre_norm=pre, encoder_embed_norm=embed_norm, decoder_embed_norm=embed_norm, decoder_start_zero=True,
    )
    return weights, config, problems
