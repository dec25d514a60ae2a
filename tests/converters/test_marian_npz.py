"""Marian NMT ``.npz`` models -> package (issue 16 item 4), with numpy only.

Models are written by the test in Marian's own format (tests/utils/marian_npz_factory.py: Marian's parameter names,
the options as YAML inside the .npz, YAML or SentencePiece vocabularies, decoder.yml), in several shapes: OPUS-MT's
post-norm layout with all embeddings tied, unequal depths and FFN widths; pre-norm with top norms, an embedding
norm, learned positions, an untied output and separate vocabularies; Marian's sigmoid GELU with the decoder
embedding tied to the output, no output bias and SentencePiece vocabularies. The reference is an independent numpy
forward pass written from Marian's parameter names (tests/utils/marian_npz_reference.py; transformers'
``convert_marian_to_pytorch`` is not in the transformers wheel, and its Marian port differs from Marian NMT in the
position table's frequencies anyway). Encoder outputs and teacher-forced decoder-step log-probs are within 1e-4 of
it, and mtgate's search over the ONNX graphs gives exactly its tokens and beam scores on 16 sentences.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from converters.base import ConversionError
from converters.convert import convert, load_source
from serving.engine.backends import create_backend, empty_past
from serving.engine.tokenizers import load_tokenizer
from serving.package import open_package
from tests.utils.decoding_parity import CASES, search_tokens
from tests.utils.marian_npz_factory import TRICKY_PIECES, make_marian_npz_dir, marian_npz_model
from tests.utils.marian_npz_reference import MarianNpzReference

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4
N_SENTENCES = 16
DECODER_STEPS = 8
MAX_STEPS = 23

SHAPES: dict[str, dict[str, Any]] = {
    "OPUS-MT post-norm, all tied, unequal depths and FFN": {
        "enc-depth": 3, "dec-depth": 1, "transformer-decoder-dim-ffn": 24, "seed": 1},
    "pre-norm + top norms, embedding norm, learned positions, untied, separate vocabularies": {
        "transformer-preprocess": "n", "transformer-postprocess": "da", "transformer-postprocess-top": "n",
        "transformer-postprocess-emb": "n", "transformer-train-position-embeddings": True,
        "tied-embeddings-all": False, "separate_vocabs": True, "transformer-ffn-activation": "relu", "seed": 2},
    "gelu, decoder tied, no output bias, SentencePiece vocabularies": {
        "tied-embeddings-all": False, "tied-embeddings": True, "output_bias": False, "spm_vocab": True,
        "transformer-ffn-activation": "gelu", "transformer-heads": 8, "dec-depth": 3, "seed": 3},
}
OPENVINO_SHAPE = "pre-norm + top norms, embedding norm, learned positions, untied, separate vocabularies"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, MarianNpzReference]]:
    """shape -> (model dir, package dir, numpy reference): one conversion per shape."""
    root = tmp_path_factory.mktemp("marian-npz")
    out = {}
    for i, (name, shape) in enumerate(SHAPES.items()):
        source = make_marian_npz_dir(root / f"src{i}", **shape)
        package = root / f"pkg{i}"
        runtimes = ["onnxruntime", "openvino"] if name == OPENVINO_SHAPE else ["onnxruntime"]
        convert(source, package, runtimes=runtimes, precisions=["fp32"], verify=i == 0)
        opts, tensors, _, _ = marian_npz_model(**shape)
        pad = open_package(package).manifest.special_ids.pad
        out[name] = (source, package, MarianNpzReference(tensors, opts, pad))
    return out


def _inputs(package: Path) -> np.ndarray:
    manifest = open_package(package).manifest
    tokenizer = load_tokenizer(package, manifest.tokenizer.to_dict())
    with gzip.open(ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        rows = [tokenizer.encode(line) + [manifest.special_ids.eos] for line in f.read().splitlines()[:N_SENTENCES]]
    ids = np.full((len(rows), max(map(len, rows))), manifest.special_ids.pad, dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids


def _backend(package: Path, runtime: str = "onnxruntime") -> Any:
    pkg = open_package(package)
    artifact = pkg.artifact(runtime, "fp32")
    return create_backend(runtime, pkg.path(artifact.encoder), pkg.path(artifact.decoder), threads=1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_forward_matches_reference(models: dict[str, Any], shape: str) -> None:
    _, package, ref = models[shape]
    ids = _inputs(package)
    mask = ids != ref.pad
    manifest = open_package(package).manifest
    targets = np.random.default_rng(5).integers(2, manifest.architecture.target_vocab_size,
                                                size=(N_SENTENCES, DECODER_STEPS))
    targets[:, 0] = manifest.special_ids.decoder_start
    memory = ref.encode(ids, mask)
    log_probs = ref.decode(memory, mask, targets)
    for runtime in ["onnxruntime", "openvino"] if shape == OPENVINO_SHAPE else ["onnxruntime"]:
        backend = _backend(package, runtime)
        enc = backend.encode(ids)
        assert np.abs(enc.memory - memory)[mask].max() <= TOL, runtime
        past = empty_past(enc.cross_kv)
        for step in range(DECODER_STEPS):
            got, past = backend.decode_step(targets[:, step : step + 1], step, past, enc.cross_kv, enc.src_bias)
            assert np.abs(got - log_probs[:, step]).max() <= TOL, (runtime, step)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_search_equals_reference(models: dict[str, Any], shape: str, case: str) -> None:
    _, package, ref = models[shape]
    ids = _inputs(package)
    eos = open_package(package).manifest.special_ids.eos
    # Marian has no padding id to ban: the "bad word" of the shared cases is <unk>, which Marian never generates.
    expected, scores = search_tokens(ref.backend(), ids, eos, eos, 1, CASES[case], MAX_STEPS)
    got, got_scores = search_tokens(_backend(package), ids, eos, eos, 1, CASES[case], MAX_STEPS)
    assert got == expected
    np.testing.assert_allclose(got_scores, scores, rtol=0, atol=1e-4)


def test_manifest_records_the_model(models: dict[str, Any]) -> None:
    manifest = open_package(models[OPENVINO_SHAPE][1]).manifest
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
    tied = open_package(models["OPUS-MT post-norm, all tied, unequal depths and FFN"][1]).manifest.architecture
    assert (tied.encoder.layers, tied.decoder.layers, tied.encoder.ffn_dim, tied.decoder.ffn_dim) == (3, 1, 64, 24)
    assert tied.tied_output and tied.embedding_scale == pytest.approx(32**0.5) and not tied.pre_norm
    gelu = open_package(models["gelu, decoder tied, no output bias, SentencePiece vocabularies"][1]).manifest
    assert gelu.architecture.decoder.activation == "gelu_sigmoid" and not gelu.architecture.logits_bias


def test_tokenizer_is_sentencepiece_then_the_vocabulary(models: dict[str, Any]) -> None:
    """Source text -> source.spm's pieces -> the YAML vocabulary's ids (YAML-looking pieces kept as strings)."""
    import sentencepiece

    source, package, _ = models["OPUS-MT post-norm, all tied, unequal depths and FFN"]
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
    with pytest.raises(ConversionError) as info:
        load_source(source)
    lines = str(info.value).splitlines()
    assert "cannot convert this Marian NMT checkpoint" in lines[0]
    for reason in ("--transformer-decoder-autoreg \"average-attention\"", "--transformer-tied-layers [1, 1]",
                   "--transformer-ffn-activation 'tanh'", "--transformer-preprocess 'n' with "
                   "--transformer-postprocess 'dan'", "missing source.spm / target.spm"):
        assert sum(reason in line for line in lines[1:]) == 1, reason
    assert len(lines) == 6


def test_not_a_marian_model(tmp_path: Path) -> None:
    source = make_marian_npz_dir(tmp_path / "src")
    np.savez(source / "model.npz", weights=np.zeros(3))
    with pytest.raises(ConversionError, match=r"model\.npz: no 'special:model\.yml' entry"):
        load_source(source)
