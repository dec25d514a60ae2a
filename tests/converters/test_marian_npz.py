"""Marian NMT ``.npz`` models -> package (issue 16 item 4), with numpy only: what is Marian NMT's own.

Models are written by the test in Marian's own format (tests/utils/marian_npz_factory.py: Marian's parameter names,
the options as YAML inside the .npz, YAML or SentencePiece vocabularies, decoder.yml), in the shapes of
tests/utils/checkpoint_parity.py (``MARIAN_NPZ``): OPUS-MT's post-norm layout with all embeddings tied, unequal
depths and FFN widths; pre-norm with top norms, an embedding norm, learned positions, an untied output and separate
vocabularies; Marian's sigmoid GELU with the decoder embedding tied to the output, no output bias and SentencePiece
vocabularies. Their parity with an independent numpy forward pass written from Marian's parameter names
(tests/utils/marian_npz_reference.py; transformers' ``convert_marian_to_pytorch`` is not in the transformers wheel,
and its Marian port differs from Marian NMT in the position table's frequencies anyway) is
tests/converters/test_checkpoint_parity.py's; here the manifest, the tokenizer and the refusals are checked.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import yaml

from converters.base import ConversionError
from converters.convert import load_source
from serving.engine.tokenizers import load_tokenizer
from serving.package import open_package
from tests.utils.checkpoint_parity import MARIAN_NPZ, Converted, ConvertedCheckpoints
from tests.utils.marian_npz_factory import TRICKY_PIECES, make_marian_npz_dir
from tests.utils.refusals import assert_refused_at_once

ROOT = Path(__file__).resolve().parents[2]
OPUS_MT = "OPUS-MT post-norm, all tied, unequal depths and FFN"


@pytest.fixture(scope="module")
def models(converted_checkpoints: ConvertedCheckpoints) -> dict[str, Converted]:
    """shape -> (model dir, package dir, numpy reference): the session's conversions."""
    return converted_checkpoints(MARIAN_NPZ)


def test_manifest_records_the_model(models: dict[str, Converted]) -> None:
    manifest = open_package(models[MARIAN_NPZ.openvino_shape].package).manifest
    arch, ids = manifest.architecture, manifest.special_ids
    assert manifest.source_framework == "marian-npz"
    assert arch.encoder.pre_norm and arch.encoder.final_norm and arch.decoder.final_norm and arch.encoder.embed_norm
    assert arch.embedding_scale == 1.0 and not arch.tied_output and arch.logits_bias and arch.decoder_start_zero
    assert arch.max_positions == 128 and arch.norm_epsilon == 1e-6
    assert ids.pad == arch.source_vocab_size - 1  # one more source id, only to pad
    assert (ids.eos, ids.decoder_start, ids.unk) == (0, 0, 1)
    decoding = manifest.decoding
    assert (decoding.beam_size, decoding.length_penalty, decoding.bad_word_ids) == (4, 0.6, (1,))
    assert manifest.tokenizer.files["target_vocab"] == "tokenizer/target_vocab.json"
    tied = open_package(models[OPUS_MT].package).manifest.architecture
    assert (tied.encoder.layers, tied.decoder.layers, tied.encoder.ffn_dim, tied.decoder.ffn_dim) == (3, 1, 64, 24)
    assert tied.tied_output and tied.embedding_scale == pytest.approx(32**0.5) and not tied.pre_norm
    gelu = open_package(models["gelu, decoder tied, no output bias, SentencePiece vocabularies"].package).manifest
    assert gelu.architecture.decoder.activation == "gelu_sigmoid" and not gelu.architecture.logits_bias


def test_tokenizer_is_sentencepiece_then_the_vocabulary(models: dict[str, Converted]) -> None:
    """Source text -> source.spm's pieces -> the YAML vocabulary's ids (YAML-looking pieces kept as strings)."""
    import sentencepiece

    source, package, _ = models[OPUS_MT]
    tokenizer = load_tokenizer(package, open_package(package).manifest.tokenizer.to_dict())
    vocab = yaml.load((source / "vocab.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    assert all(piece in vocab for piece in TRICKY_PIECES)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(source / "source.spm"))
    with gzip.open(ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()[:200]
    for line in lines:
        assert tokenizer.encode(line) == [int(vocab.get(p, 1)) for p in sp.encode(line, out_type=str)], line


def test_unsupported_options_are_listed_at_once(tmp_path: Path) -> None:
    source = make_marian_npz_dir(tmp_path / "src", **{
        "transformer-decoder-autoreg": "average-attention", "transformer-tied-layers": [1, 1],
        "transformer-preprocess": "n", "transformer-ffn-activation": "tanh"})
    (source / "target.spm").unlink()
    assert_refused_at_once(source, "Marian NMT", [
        "--transformer-decoder-autoreg \"average-attention\"", "--transformer-tied-layers [1, 1]",
        "--transformer-ffn-activation 'tanh'", "--transformer-preprocess 'n' with --transformer-postprocess 'dan'",
        "missing source.spm / target.spm"])


def test_not_a_marian_model(tmp_path: Path) -> None:
    source = make_marian_npz_dir(tmp_path / "src")
    np.savez(source / "model.npz", weights=np.zeros(3))
    with pytest.raises(ConversionError, match=r"model\.npz: no 'special:model\.yml' entry"):
        load_source(source)
