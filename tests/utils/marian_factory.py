"""Tiny random Hugging Face Marian checkpoints (opus-mt layout) for tests.

``make_marian_dir(path)`` writes config.json, generation_config.json, model.safetensors, source.spm, target.spm,
vocab.json and tokenizer_config.json: a directory ``MarianMTModel.from_pretrained`` and ``MarianTokenizer``
load, and ``mtgate convert`` converts. The SentencePiece models are trained on the fly (well under a second) on
300 Multi30k validation lines per language (tests/data/marian/corpus.{en,de}); one joint vocab.json maps the pieces
of both to ids (``</s>`` 0, ``<unk>`` 1, pieces, fillers, ``<pad>`` last), as opus-mt does. With
``separate_vocabs=True``, vocab.json holds the source pieces and target_vocab.json the target pieces (``<pad>`` at
the same id in both), and the model has separate embeddings (``share_encoder_decoder_embeddings: false``).

``convert_tiny_package(tmp_path)`` converts such a directory into a model package (for engine, server and batch
tests). Needs the ``test`` extra (torch, transformers, sentencepiece).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent / "data" / "marian"
EOS_ID = 0
UNK_ID = 1
# transformers would otherwise import TensorFlow (installed for batch-score) on top of torch: seconds per process.
os.environ.setdefault("USE_TF", "0")


@functools.cache
def _spm_bytes(lang: str, pieces: int) -> bytes:
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        spm.SentencePieceTrainer.train(
            input=str(DATA / f"corpus.{lang}"),
            model_prefix=f"{tmp}/spm",
            vocab_size=pieces,
            model_type="unigram",
            character_coverage=1.0,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            bos_id=-1,
            pad_id=-1,
            num_threads=1,
            minloglevel=2,
        )
        return Path(f"{tmp}/spm.model").read_bytes()


def corpus(lang: str = "en") -> list[str]:
    """The 300 corpus lines (Multi30k val) the SentencePiece models were trained on."""
    return (DATA / f"corpus.{lang}").read_text(encoding="utf-8").splitlines()


def write_tokenizer_files(path: Path, *, spm_pieces: int = 200, vocab_size: int | None = None) -> dict[str, int]:
    """Write source.spm, target.spm, vocab.json; return the vocab (``<pad>`` is the last id)."""
    import sentencepiece as spm

    path.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {}
    for name, lang in (("source.spm", "en"), ("target.spm", "de")):
        model = _spm_bytes(lang, spm_pieces)
        (path / name).write_bytes(model)
        sp = spm.SentencePieceProcessor(model_proto=model)
        for i in range(sp.get_piece_size()):
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
    if vocab_size is not None:
        if vocab_size < len(vocab) + 1:
            raise ValueError(f"vocab_size {vocab_size} < {len(vocab) + 1} pieces (+ pad)")
        for i in range(vocab_size - 1 - len(vocab)):
            vocab[f"<extra_{i}>"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
    (path / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "en", "target_lang": "de", "model_max_length": 512}), encoding="utf-8"
    )
    return vocab


def write_separate_tokenizer_files(path: Path, *, spm_pieces: int = 200, source_extra: int = 0) -> tuple[int, int]:
    """Write source.spm, target.spm, vocab.json (source pieces) and target_vocab.json (target pieces), ``<pad>`` at
    the same id ``P`` in both; the source vocabulary has ``source_extra`` more fillers after it. Returns
    (source vocabulary size, target vocabulary size)."""
    import sentencepiece as spm

    path.mkdir(parents=True, exist_ok=True)
    vocabs: list[dict[str, int]] = []
    for name, lang in (("source.spm", "en"), ("target.spm", "de")):
        model = _spm_bytes(lang, spm_pieces)
        (path / name).write_bytes(model)
        sp = spm.SentencePieceProcessor(model_proto=model)
        vocabs.append({sp.id_to_piece(i): i for i in range(sp.get_piece_size())})
    pad = max(len(v) for v in vocabs)
    for vocab in vocabs:
        for i in range(pad - len(vocab)):
            vocab[f"<extra_{i}>"] = len(vocab)
        vocab["<pad>"] = pad
    for i in range(source_extra):
        vocabs[0][f"<more_{i}>"] = len(vocabs[0])
    for name, vocab in zip(("vocab.json", "target_vocab.json"), vocabs, strict=True):
        (path / name).write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"source_lang": "en", "target_lang": "de", "model_max_length": 512, "separate_vocabs": True}), encoding="utf-8")
    return len(vocabs[0]), len(vocabs[1])


def make_marian_dir(
    path: Path,
    *,
    d_model: int = 32,
    layers: int = 2,
    heads: int = 4,
    ffn: int = 64,
    decoder_layers: int | None = None,
    decoder_heads: int | None = None,
    decoder_ffn: int | None = None,
    separate_vocabs: bool = False,
    source_extra: int = 0,
    activation: str = "swish",
    vocab_size: int | None = None,
    spm_pieces: int = 200,
    max_positions: int = 128,
    scale_embedding: bool = True,
    tie_word_embeddings: bool = True,
    init_std: float = 0.2,
    seed: int = 0,
    dtype: str = "float32",
    generation: dict[str, Any] | None = None,
    config_overrides: dict[str, Any] | None = None,
) -> Path:
    """Build a random MarianMTModel and save it in the opus-mt layout at ``path``.

    Weights are drawn with ``init_std`` (larger than transformers' 0.02, so the next-token distribution is peaked
    and greedy/beam results are not decided by float noise); layer norms, final_logits_bias and the pad row are
    randomized too so every mapped tensor matters.

    Arguments:
        path: output directory (created).
        layers, heads, ffn: the encoder's shape, and the decoder's unless ``decoder_*`` says otherwise.
        separate_vocabs: separate source/target vocabularies and embeddings (``source_extra``: that many more
            source ids than target ids; needs an untied output, as transformers ties lm_head to the decoder input
            embedding, which has the source vocabulary's size).
        vocab_size: model vocabulary; default the number of pieces + 1 (pad); larger pads vocab.json with fillers.
        dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"`` for the saved safetensors.
        generation: generation_config.json keys overriding the opus-mt-like defaults (num_beams 4, max_length 64,
            bad_words_ids [[pad]], forced_eos_token_id 0).
        config_overrides: extra or replaced config.json keys, written after saving (for unsupported-option tests).

    Returns:
        ``path``.
    """
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    path.mkdir(parents=True, exist_ok=True)
    if separate_vocabs:
        n_vocab, n_target = write_separate_tokenizer_files(path, spm_pieces=spm_pieces, source_extra=source_extra)
        pad_id = n_target - 1
    else:
        vocab = write_tokenizer_files(path, spm_pieces=spm_pieces, vocab_size=vocab_size)
        n_vocab = n_target = len(vocab)
        pad_id = vocab["<pad>"]
    config = MarianConfig(
        vocab_size=n_vocab,
        decoder_vocab_size=n_target,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers if decoder_layers is None else decoder_layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads if decoder_heads is None else decoder_heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn if decoder_ffn is None else decoder_ffn,
        activation_function=activation,
        max_position_embeddings=max_positions,
        scale_embedding=scale_embedding,
        share_encoder_decoder_embeddings=not separate_vocabs,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=pad_id,
        eos_token_id=EOS_ID,
        decoder_start_token_id=pad_id,
        forced_eos_token_id=EOS_ID,
        init_std=init_std,
        dropout=0.1,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed + 1)
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                base = 1.0 if name.endswith("weight") else 0.0
                param.copy_(base + 0.1 * torch.randn(param.shape, generator=generator))
        model.final_logits_bias.copy_(0.5 * torch.randn(model.final_logits_bias.shape, generator=generator))
        if not tie_word_embeddings:
            model.lm_head.weight.copy_(init_std * torch.randn(model.lm_head.weight.shape, generator=generator))
    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    model.to(torch_dtype).save_pretrained(path, safe_serialization=True)
    gen: dict[str, Any] = {
        "num_beams": 4,
        "max_length": 64,
        "bad_words_ids": [[pad_id]],
        "decoder_start_token_id": pad_id,
        "pad_token_id": pad_id,
        "eos_token_id": EOS_ID,
        "forced_eos_token_id": EOS_ID,
    } | (generation or {})
    (path / "generation_config.json").unlink(missing_ok=True)
    GenerationConfig(**gen).save_pretrained(path)
    if config_overrides:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
        cfg.update(config_overrides)
        (path / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    return path


def make_en_de_shaped_dir(path: Path, *, layers: int = 2, vocab_size: int = 2000, seed: int = 0) -> Path:
    """opus-mt-en-de's shape (d_model 512, 8 heads, ffn 2048, swish, scaled embeddings) with fewer layers."""
    return make_marian_dir(
        path, d_model=512, layers=layers, heads=8, ffn=2048, activation="swish", vocab_size=vocab_size,
        max_positions=512, init_std=0.05, seed=seed,
    )


def convert_tiny_package(
    tmp_path: Path,
    *,
    runtimes: tuple[str, ...] = ("onnxruntime", "openvino"),
    precisions: tuple[str, ...] = ("fp32",),
    verify: bool = True,
    **marian_kwargs: Any,
) -> Path:
    """Make a tiny Marian dir under ``tmp_path`` and convert it into ``tmp_path / "package"``."""
    from converters.convert import convert

    source = make_marian_dir(tmp_path / "marian-src", **marian_kwargs)
    out = tmp_path / "package"
    convert(source, out, runtimes=list(runtimes), precisions=list(precisions), verify=verify, name="tiny-marian",
            version="test")
    return out


def copy_marian_dir(src: Path, dst: Path) -> Path:
    """A writable copy (to damage in bad-input tests)."""
    shutil.copytree(src, dst)
    return dst
