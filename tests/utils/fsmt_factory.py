"""Tiny random transformers FSMT checkpoints (the fairseq WMT19 layout) and their BPE tokenizer files, for tests.

``write_fsmt_tokenizer(path)`` learns BPE merges (subword-nmt's algorithm, 300 merges) on the Moses-tokenized
300-line Multi30k corpus of tests/data/marian and writes vocab-src.json (EN pieces), vocab-tgt.json (DE pieces),
merges.txt and tokenizer_config.json, as transformers' FSMT conversion lays them out: ``<s>`` 0, ``<pad>`` 1, ``</s>``
2, ``<unk>`` 3, then every single character and every piece the merges make, word-final ones with ``</w>``.
``make_fsmt_dir(path)`` adds a random ``FSMTForConditionalGeneration`` (config.json, model.safetensors,
generation_config.json) that ``from_pretrained`` and ``mtgate convert`` both read. Needs torch and transformers.
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.utils.marian_factory import corpus

os.environ.setdefault("USE_TF", "0")

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
PAD_ID, EOS_ID = 1, 2


def moses_words(lines: list[str], lang: str) -> list[str]:
    """The corpus as FSMT pre-tokenizes it (punctuation normalized, Moses-tokenized, escaped)."""
    import sacremoses

    normalizer, tokenizer = sacremoses.MosesPunctNormalizer(lang=lang), sacremoses.MosesTokenizer(lang=lang)
    words: list[str] = []
    for line in lines:
        words += tokenizer.tokenize(normalizer.normalize(line), aggressive_dash_splits=True, escape=True)
    return words


def merge_pair(symbols: Sequence[str], pair: tuple[str, str]) -> list[str]:
    """``symbols`` with every occurrence of ``pair`` (left to right, not overlapping) merged into one symbol."""
    out: list[str] = []
    i = 0
    while i < len(symbols):
        if i < len(symbols) - 1 and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def learn_bpe(words: Counter[str], num_merges: int) -> list[tuple[str, str]]:
    """subword-nmt's learning loop: merge the most frequent adjacent pair (ties: the larger pair), ``</w>`` ends words."""
    vocab = {(*w[:-1], w[-1] + "</w>"): n for w, n in words.items()}
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for symbols, n in vocab.items():
            for pair in zip(symbols, symbols[1:], strict=False):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs, key=lambda pair: (pairs[pair], pair))
        merges.append(best)
        merged: dict[tuple[str, ...], int] = {}
        for symbols, n in vocab.items():
            out = tuple(merge_pair(symbols, best))
            merged[out] = merged.get(out, 0) + n
        vocab = merged
    return merges


@functools.cache
def _bpe(num_merges: int) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...], tuple[str, ...]]:
    """(merges learned on both languages, EN pieces, DE pieces)."""
    words = {lang: moses_words(corpus(lang), lang) for lang in ("en", "de")}
    merges = learn_bpe(Counter(words["en"] + words["de"]), num_merges)
    made = [a + b for a, b in merges]
    pieces = []
    for lang in ("en", "de"):
        chars = sorted({c for w in words[lang] for c in w})
        out = dict.fromkeys([*chars, *(c + "</w>" for c in chars), *made])
        pieces.append(tuple(out))
    return tuple(merges), pieces[0], pieces[1]


def write_fsmt_tokenizer(path: Path, *, num_merges: int = 300, joint: bool = False) -> tuple[int, int]:
    """Write vocab-src.json, vocab-tgt.json, merges.txt, tokenizer_config.json; return the two vocabulary sizes.
    ``joint``: one vocabulary (both languages' pieces) for both sides."""
    path.mkdir(parents=True, exist_ok=True)
    merges, en, de = _bpe(num_merges)
    if joint:
        en = de = tuple(dict.fromkeys(en + de))
    sizes = []
    for name, pieces in (("vocab-src.json", en), ("vocab-tgt.json", de)):
        vocab = {token: i for i, token in enumerate(dict.fromkeys(SPECIALS + pieces))}
        (path / name).write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
        sizes.append(len(vocab))
    # transformers drops the line after the last newline; fairseq's codes carry a count, which it ignores too.
    (path / "merges.txt").write_text("".join(f"{a} {b} {100 - i % 100}\n" for i, (a, b) in enumerate(merges)),
                                     encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"langs": ["en", "de"], "model_max_length": 1024, "do_lower_case": False}), encoding="utf-8")
    return sizes[0], sizes[1]


def make_fsmt_dir(
    path: Path,
    *,
    d_model: int = 32,
    layers: int = 2,
    heads: int = 4,
    ffn: int = 64,
    decoder_layers: int | None = None,
    decoder_heads: int | None = None,
    decoder_ffn: int | None = None,
    activation: str = "relu",
    max_positions: int = 128,
    scale_embedding: bool = True,
    tie_word_embeddings: bool = False,
    init_std: float = 0.2,
    seed: int = 0,
    generation: dict[str, Any] | None = None,
) -> Path:
    """A random FSMTForConditionalGeneration saved at ``path`` with its tokenizer files.

    Weights are drawn with ``init_std`` (a peaked next-token distribution, so greedy/beam results are not decided
    by float noise), layer norms randomized; the pad rows of the embeddings stay zero, as fairseq trains them.

    Arguments:
        layers, heads, ffn: the encoder's shape, and the decoder's unless ``decoder_*`` says otherwise.
        tie_word_embeddings: one vocabulary and one embedding matrix for both sides.
        generation: generation_config.json keys over the defaults (num_beams 4, max_length 24, forced EOS).
    """
    import torch
    from transformers import FSMTConfig, FSMTForConditionalGeneration, GenerationConfig

    n_src, n_tgt = write_fsmt_tokenizer(path, joint=tie_word_embeddings)
    config = FSMTConfig(
        langs=["en", "de"], src_vocab_size=n_src, tgt_vocab_size=n_tgt, d_model=d_model, encoder_layers=layers,
        decoder_layers=layers if decoder_layers is None else decoder_layers, encoder_attention_heads=heads,
        decoder_attention_heads=heads if decoder_heads is None else decoder_heads, encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn if decoder_ffn is None else decoder_ffn, activation_function=activation,
        max_position_embeddings=max_positions, scale_embedding=scale_embedding,
        tie_word_embeddings=tie_word_embeddings, init_std=init_std, pad_token_id=PAD_ID, bos_token_id=0,
        eos_token_id=EOS_ID, decoder_start_token_id=EOS_ID, forced_eos_token_id=EOS_ID,
    )
    torch.manual_seed(seed)
    model = FSMTForConditionalGeneration(config).eval()
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed + 1)
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                base = 1.0 if name.endswith("weight") else 0.0
                param.copy_(base + 0.1 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(path, safe_serialization=True)
    gen = {"num_beams": 4, "max_length": 24, "decoder_start_token_id": EOS_ID, "pad_token_id": PAD_ID,
           "bos_token_id": 0, "eos_token_id": EOS_ID, "forced_eos_token_id": EOS_ID} | (generation or {})
    (path / "generation_config.json").unlink(missing_ok=True)
    GenerationConfig(**gen).save_pretrained(path)
    return path
