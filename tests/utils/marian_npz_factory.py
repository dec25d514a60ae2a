"""Tiny random Marian NMT models in Marian's own format (``model.npz`` + YAML vocabulary + decoder.yml), for tests.

``make_marian_npz_dir(path, **options)`` writes what an OPUS-MT release holds before the Hugging Face conversion:
``model.npz`` with Marian's parameter names (``encoder_l1_self_Wq``, ``decoder_ff_logit_out_b``...) and its options
as YAML in ``special:model.yml``, ``vocab.yml`` (or ``vocab.src.yml`` / ``vocab.trg.yml``; or SentencePiece
``vocab.spm`` files used as vocabularies), ``source.spm`` / ``target.spm`` and ``decoder.yml``. The SentencePiece
models are tests/utils/marian_factory.py's. ``marian_npz_model`` returns the same options and tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from tests.utils.marian_factory import _spm_bytes

# Pieces YAML 1.1 would read as booleans, numbers or null unless kept as strings (Marian keeps them).
TRICKY_PIECES = ("yes", "no", "1", "~", "true", "null")
OPTIONS: dict[str, Any] = {
    "type": "transformer", "dim-emb": 32, "enc-depth": 2, "dec-depth": 2, "transformer-heads": 4,
    "transformer-dim-ffn": 64, "transformer-decoder-dim-ffn": 0, "transformer-ffn-depth": 2,
    "transformer-ffn-activation": "swish", "transformer-preprocess": "", "transformer-postprocess": "dan",
    "transformer-postprocess-top": "", "transformer-postprocess-emb": "d", "transformer-decoder-autoreg":
    "self-attention", "transformer-tied-layers": [], "transformer-no-projection": False,
    "transformer-train-position-embeddings": False, "tied-embeddings": False, "tied-embeddings-src": False,
    "tied-embeddings-all": True, "max-length": 100, "dropout-src": 0.0, "version": "v1.11.0",
}


def vocabularies(separate: bool, spm_vocab: bool = False) -> tuple[dict[str, int], dict[str, int]]:
    """(source, target) piece -> id: ``</s>`` 0, ``<unk>`` 1, the SentencePiece pieces, the tricky fillers."""
    import sentencepiece as spm

    pieces = []
    for lang in ("en", "de"):
        sp = spm.SentencePieceProcessor(model_proto=_spm_bytes(lang, 200))
        pieces.append([sp.id_to_piece(i) for i in range(sp.get_piece_size())])
    if spm_vocab:  # the SentencePiece model is the vocabulary: its own ids
        return ({p: i for i, p in enumerate(pieces[0])}, {p: i for i, p in enumerate(pieces[1])})

    def vocab(*lists: list[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for piece in ["</s>", "<unk>", *[p for lst in lists for p in lst], *TRICKY_PIECES]:
            out.setdefault(piece, len(out))
        return out

    if separate:
        return vocab(pieces[0]), vocab(pieces[1])
    joint = vocab(pieces[0], pieces[1])
    return joint, joint


def marian_npz_model(*, seed: int = 0, std: float = 0.2, separate_vocabs: bool = False, spm_vocab: bool = False,
                     output_bias: bool = True, max_positions: int = 128,
                     **options: Any) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, int], dict[str, int]]:
    """(options, tensors under Marian's names, source vocab, target vocab); ``options`` override :data:`OPTIONS`."""
    opts = OPTIONS | options
    src_vocab, tgt_vocab = vocabularies(separate_vocabs, spm_vocab)
    rng = np.random.default_rng(seed)
    d, ffn = opts["dim-emb"], opts["transformer-dim-ffn"]
    out: dict[str, np.ndarray] = {}

    def put(name: str, *shape: int, base: float = 0.0, scale: float = std) -> None:
        out[name] = (base + scale * rng.standard_normal(shape)).astype(np.float32)

    def norm(prefix: str, suffix: str) -> None:
        put(f"{prefix}_ln_scale{suffix}", 1, d, base=1.0, scale=0.1)
        put(f"{prefix}_ln_bias{suffix}", 1, d, scale=0.1)

    pre = "n" in opts["transformer-preprocess"]
    suffix = "_pre" if pre else ""
    if opts["tied-embeddings-all"] or opts["tied-embeddings-src"]:
        put("Wemb", len(src_vocab), d)
    else:
        put("encoder_Wemb", len(src_vocab), d)
        put("decoder_Wemb", len(tgt_vocab), d)
    if opts["transformer-train-position-embeddings"]:
        put("Wpos", max_positions, d, scale=0.5)
    for side, depth in (("encoder", opts["enc-depth"]), ("decoder", opts["dec-depth"])):
        width = opts["transformer-decoder-dim-ffn"] or ffn if side == "decoder" else ffn
        if "n" in opts["transformer-postprocess-emb"]:
            norm(f"{side}_emb", "_pre")
        for i in range(1, depth + 1):
            for attn in ("self", "context") if side == "decoder" else ("self",):
                prefix = f"{side}_l{i}_{attn}"
                for proj in "qkvo":
                    put(f"{prefix}_W{proj}", d, d)
                    put(f"{prefix}_b{proj}", 1, d, scale=0.1)
                norm(f"{prefix}_Wo", suffix)
            prefix = f"{side}_l{i}_ffn"
            put(f"{prefix}_W1", d, width)
            put(f"{prefix}_b1", 1, width, scale=0.1)
            put(f"{prefix}_W2", width, d)
            put(f"{prefix}_b2", 1, d, scale=0.1)
            norm(f"{prefix}_ffn", suffix)
        if "n" in opts["transformer-postprocess-top"]:
            norm(f"{side}_top", "")
    if not (opts["tied-embeddings"] or opts["tied-embeddings-all"]):
        put("decoder_ff_logit_out_W", d, len(tgt_vocab))
    if output_bias:
        put("decoder_ff_logit_out_b", 1, len(tgt_vocab), scale=0.5)
    opts["dim-vocabs"] = [len(src_vocab), len(tgt_vocab)]
    return opts, out, src_vocab, tgt_vocab


def make_marian_npz_dir(path: Path, *, decoder: dict[str, Any] | None = None, separate_vocabs: bool = False,
                        spm_vocab: bool = False, **options: Any) -> Path:
    """Write the model directory (see the module docstring); ``decoder``: decoder.yml keys over beam-size 4,
    normalize 0.6; None values drop a key."""
    path.mkdir(parents=True, exist_ok=True)
    opts, tensors, src_vocab, tgt_vocab = marian_npz_model(separate_vocabs=separate_vocabs, spm_vocab=spm_vocab,
                                                           **options)
    config = yaml.safe_dump(opts, sort_keys=True).encode("utf-8") + b"\0"
    np.savez(path / "model.npz", **tensors, **{"special:model.yml": np.frombuffer(config, dtype=np.int8)})
    (path / "source.spm").write_bytes(_spm_bytes("en", 200))
    (path / "target.spm").write_bytes(_spm_bytes("de", 200))
    if spm_vocab:
        vocabs = ["source.spm", "target.spm"]
    elif separate_vocabs:
        vocabs = ["vocab.src.yml", "vocab.trg.yml"]
        for name, vocab in zip(vocabs, (src_vocab, tgt_vocab), strict=True):
            (path / name).write_text(yaml.safe_dump(vocab, allow_unicode=True, sort_keys=False), encoding="utf-8")
    else:
        vocabs = ["vocab.yml", "vocab.yml"]
        (path / "vocab.yml").write_text(yaml.safe_dump(src_vocab, allow_unicode=True, sort_keys=False),
                                        encoding="utf-8")
    settings = {"models": ["model.npz"], "vocabs": vocabs, "beam-size": 4, "normalize": 0.6, "word-penalty": 0,
                "mini-batch": 16, "maxi-batch": 100, "relative-paths": True} | (decoder or {})
    (path / "decoder.yml").write_text(yaml.safe_dump({k: v for k, v in settings.items() if v is not None}),
                                      encoding="utf-8")
    return path
