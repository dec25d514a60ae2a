"""Tiny random OpenNMT-py 3 Transformer checkpoints, written the way OpenNMT-py writes them, without OpenNMT-py.

``make_onmt_dir(path, **options)`` writes ``model_step_100.pt`` (``{"model", "generator", "vocab", "opt", "optim"}``:
OpenNMT-py's parameter names, ``opt`` an ``argparse.Namespace``, ``vocab`` OpenNMT-py 3's token lists with its
specials ``<unk> <blank> <s> </s>`` first) and the SentencePiece models its ``sentencepiece`` transform names
(``spm.en.model`` / ``spm.de.model``, those of tests/utils/marian_factory.py). ``onmt_model`` returns the same
options and tensors.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from tests.utils.marian_factory import _spm_bytes

SPECIALS = ["<unk>", "<blank>", "<s>", "</s>"]
OPTIONS: dict[str, Any] = {
    "model_task": "seq2seq", "encoder_type": "transformer", "decoder_type": "transformer", "enc_layers": 2,
    "dec_layers": 2, "heads": 4, "hidden_size": 32, "word_vec_size": 32, "transformer_ff": 64,
    "pos_ffn_activation_fn": "relu", "position_encoding": True, "position_encoding_type": "SinusoidalInterleaved",
    "max_relative_positions": 0, "add_qkvbias": True, "add_ffnbias": True, "layer_norm": "standard",
    "norm_eps": 1e-6, "share_decoder_embeddings": False, "share_embeddings": False, "self_attn_type": "scaled-dot",
    "parallel_residual": False, "num_kv": 0, "transforms": ["sentencepiece", "filtertoolong"],
    "src_subword_model": "data/spm.en.model", "tgt_subword_model": "data/spm.de.model", "train_steps": 100,
    "learning_rate": 2.0, "save_model": "run/model",
}


def vocabularies(joint: bool) -> tuple[list[str], list[str]]:
    import sentencepiece as spm

    lists = []
    for lang in ("en", "de"):
        sp = spm.SentencePieceProcessor(model_proto=_spm_bytes(lang, 200))
        lists.append([sp.id_to_piece(i) for i in range(sp.get_piece_size())])
    if joint:
        lists = [lists[0] + lists[1]] * 2
    return tuple(list(dict.fromkeys(SPECIALS + pieces)) for pieces in lists)  # type: ignore[return-value]


def onmt_model(*, seed: int = 0, std: float = 0.2, max_positions: int = 256,
               **options: Any) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray], list[str],
                                        list[str]]:
    """(options, model tensors, generator tensors, source vocab, target vocab) under OpenNMT-py's names."""
    opts = OPTIONS | options
    src, tgt = vocabularies(joint=bool(opts["share_embeddings"]))
    rng = np.random.default_rng(seed)
    d, ffn = opts["hidden_size"], opts["transformer_ff"]
    model: OrderedDict[str, np.ndarray] = OrderedDict()

    def put(name: str, *shape: int, base: float = 0.0, scale: float = std) -> None:
        model[name] = (base + scale * rng.standard_normal(shape)).astype(np.float32)

    def linear(name: str, n_in: int, n_out: int, bias: bool) -> None:
        put(f"{name}.weight", n_out, n_in)
        if bias:
            put(f"{name}.bias", n_out, scale=0.1)

    def norm(name: str) -> None:
        put(f"{name}.weight", d, base=1.0, scale=0.1)
        put(f"{name}.bias", d, scale=0.1)

    def attention(name: str) -> None:
        for proj in ("linear_keys", "linear_values", "linear_query", "final_linear"):
            linear(f"{name}.{proj}", d, d, opts["add_qkvbias"])

    def ffn_block(name: str) -> None:
        linear(f"{name}.w_1", d, ffn, opts["add_ffnbias"])
        linear(f"{name}.w_2", ffn, d, opts["add_ffnbias"])
        norm(f"{name}.layer_norm")

    pe = _positions(max_positions, d, opts["position_encoding_type"])[:, None, :]  # OpenNMT-py keeps [len, 1, d]
    for side, vocab in (("encoder", src), ("decoder", tgt)):
        if side == "decoder" and opts["share_embeddings"]:
            model["decoder.embeddings.make_embedding.emb_luts.0.weight"] = model[
                "encoder.embeddings.make_embedding.emb_luts.0.weight"]
        else:
            put(f"{side}.embeddings.make_embedding.emb_luts.0.weight", len(vocab), d)
        model[f"{side}.embeddings.make_embedding.pe.pe"] = pe
    for i in range(opts["enc_layers"]):
        attention(f"encoder.transformer.{i}.self_attn")
        norm(f"encoder.transformer.{i}.layer_norm")
        ffn_block(f"encoder.transformer.{i}.feed_forward")
    norm("encoder.layer_norm")
    for i in range(opts["dec_layers"]):
        p = f"decoder.transformer_layers.{i}"
        attention(f"{p}.self_attn")
        norm(f"{p}.layer_norm_1")
        attention(f"{p}.context_attn")
        norm(f"{p}.layer_norm_2")
        ffn_block(f"{p}.feed_forward")
    norm("decoder.layer_norm")
    generator = {"weight": (model["decoder.embeddings.make_embedding.emb_luts.0.weight"]
                            if opts["share_decoder_embeddings"]
                            else (std * rng.standard_normal((len(tgt), d))).astype(np.float32)),
                 "bias": (0.5 * rng.standard_normal(len(tgt))).astype(np.float32)}
    return opts, dict(model), generator, src, tgt


def _positions(length: int, dim: int, kind: str) -> np.ndarray:
    """OpenNMT-py's PositionalEncoding (float32 as torch builds it)."""
    import math

    position = np.arange(length, dtype=np.float32)[:, None]
    div_term = np.exp(np.arange(0, dim, 2, dtype=np.float32) * -(math.log(10000.0) / dim))
    pe = np.zeros((length, dim), dtype=np.float32)
    if kind == "SinusoidalConcat":
        pe = np.concatenate([np.sin(position * div_term), np.cos(position * div_term)], axis=1)
    else:
        pe[:, 0::2] = np.sin(position * div_term)
        pe[:, 1::2] = np.cos(position * div_term)
    return pe.astype(np.float32)


def make_onmt_dir(path: Path, *, seed: int = 0, std: float = 0.2, **options: Any) -> Path:
    """Write the checkpoint directory; ``options`` override :data:`OPTIONS` (OpenNMT-py's names)."""
    import torch

    path.mkdir(parents=True, exist_ok=True)
    opts, model, generator, src, tgt = onmt_model(seed=seed, std=std, **options)
    (path / "spm.en.model").write_bytes(_spm_bytes("en", 200))
    (path / "spm.de.model").write_bytes(_spm_bytes("de", 200))

    def as_torch(tensors: dict[str, np.ndarray]) -> OrderedDict[str, Any]:
        return OrderedDict((k, torch.from_numpy(np.ascontiguousarray(v))) for k, v in tensors.items())

    checkpoint = {"model": as_torch(model), "generator": as_torch(generator),
                  "vocab": {"src": src, "tgt": tgt, "decoder_start_token": "<s>", "data_task": "seq2seq"},
                  "opt": argparse.Namespace(**opts), "optim": {"training_step": 100, "optimizer": {"state": {}}}}
    torch.save(checkpoint, path / "model_step_100.pt")
    return path
