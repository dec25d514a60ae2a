"""OpenNMT-py checkpoints -> package (issue 16 item 5), with no OpenNMT-py installed.

Checkpoints are written by the test the way OpenNMT-py 3 writes them (tests/utils/onmt_factory.py: its parameter
names, ``opt`` a Namespace, ``vocab`` token lists, its SentencePiece models), in several shapes: unequal depths with
separate vocabularies and an untied generator; shared embeddings with the generator tied to them, no attention
biases (``add_qkvbias`` off, OpenNMT-py 3's default), the concatenated sinusoids and gelu; a wide feed-forward without
biases and fast_gelu. The reference is an independent numpy forward pass written from OpenNMT-py's parameter names
(tests/utils/onmt_reference.py), on sources without EOS as OpenNMT-py sees them. Encoder outputs (at the source
tokens) and teacher-forced decoder-step log-probs are within 1e-4 of it, and mtgate's search over the ONNX graphs
gives exactly its tokens and beam scores on 16 sentences.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.base import ConversionError
from converters.convert import convert, load_source
from serving.engine.backends import create_backend, empty_past
from serving.engine.tokenizers import load_tokenizer
from serving.package import open_package
from tests.utils.decoding_parity import CASES, search_tokens
from tests.utils.onmt_factory import make_onmt_dir, onmt_model
from tests.utils.onmt_reference import OnmtReference

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4
N_SENTENCES = 16
DECODER_STEPS = 8
MAX_STEPS = 23
PAD, BOS, EOS = 1, 2, 3

SHAPES: dict[str, dict[str, Any]] = {
    "unequal depths, separate vocabularies, untied generator": {"enc_layers": 3, "dec_layers": 1, "seed": 1},
    "shared embeddings, tied generator, no attention biases, concatenated sinusoids, gelu": {
        "share_embeddings": True, "share_decoder_embeddings": True, "add_qkvbias": False,
        "position_encoding_type": "SinusoidalConcat", "pos_ffn_activation_fn": "gelu", "heads": 8, "seed": 2},
    "wide feed-forward without biases, fast_gelu": {"transformer_ff": 160, "add_ffnbias": False,
                                                    "pos_ffn_activation_fn": "fast_gelu", "dec_layers": 3, "seed": 3},
}
OPENVINO_SHAPE = "shared embeddings, tied generator, no attention biases, concatenated sinusoids, gelu"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, OnmtReference]]:
    root = tmp_path_factory.mktemp("onmt")
    out = {}
    for i, (name, shape) in enumerate(SHAPES.items()):
        source = make_onmt_dir(root / f"src{i}", **shape)
        package = root / f"pkg{i}"
        runtimes = ["onnxruntime", "openvino"] if name == OPENVINO_SHAPE else ["onnxruntime"]
        convert(source, package, runtimes=runtimes, precisions=["fp32"], verify=i == 0)
        opts, model, generator, _, _ = onmt_model(**shape)
        out[name] = (source, package, OnmtReference(model, generator, opts, PAD, EOS))
    return out


def _inputs(package: Path) -> np.ndarray:
    tokenizer = load_tokenizer(package, open_package(package).manifest.tokenizer.to_dict())
    with gzip.open(ROOT / "models" / "data" / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        rows = [tokenizer.encode(line) + [EOS] for line in f.read().splitlines()[:N_SENTENCES]]
    ids = np.full((len(rows), max(map(len, rows))), PAD, dtype=np.int64)
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
    tokens = (ids != PAD) & (ids != EOS)  # what OpenNMT-py sees
    vocab = open_package(package).manifest.architecture.target_vocab_size
    targets = np.random.default_rng(5).integers(4, vocab, size=(N_SENTENCES, DECODER_STEPS))
    targets[:, 0] = BOS
    memory = ref.encode(np.where(tokens, ids, PAD), tokens)
    log_probs = ref.decode(memory, tokens, targets)
    for runtime in ["onnxruntime", "openvino"] if shape == OPENVINO_SHAPE else ["onnxruntime"]:
        backend = _backend(package, runtime)
        enc = backend.encode(ids)
        assert np.abs(enc.memory - memory)[tokens].max() <= TOL, runtime
        past = empty_past(enc.cross_kv)
        for step in range(DECODER_STEPS):
            got, past = backend.decode_step(targets[:, step : step + 1], step, past, enc.cross_kv, enc.src_bias)
            assert np.abs(got - log_probs[:, step]).max() <= TOL, (runtime, step)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_search_equals_reference(models: dict[str, Any], shape: str, case: str) -> None:
    _, package, ref = models[shape]
    ids = _inputs(package)
    expected, scores = search_tokens(ref.backend(), ids, BOS, EOS, PAD, CASES[case], MAX_STEPS)
    got, got_scores = search_tokens(_backend(package), ids, BOS, EOS, PAD, CASES[case], MAX_STEPS)
    assert got == expected
    np.testing.assert_allclose(got_scores, scores, rtol=0, atol=1e-4)


def test_manifest_records_the_model(models: dict[str, Any]) -> None:
    manifest = open_package(models[OPENVINO_SHAPE][1]).manifest
    arch = manifest.architecture
    assert manifest.source_framework == "opennmt-py" and manifest.source["checkpoint"] == "model_step_100.pt"
    assert arch.pre_norm and arch.encoder.final_norm and arch.decoder.final_norm and arch.mask_source_eos
    assert arch.shared_embeddings and arch.tied_output and arch.logits_bias and not arch.attention_bias
    assert arch.decoder.heads == 8 and arch.encoder.activation == "gelu" and arch.max_positions == 256
    assert (manifest.special_ids.pad, manifest.special_ids.eos, manifest.special_ids.decoder_start) == (PAD, EOS,
                                                                                                        BOS)
    assert (manifest.decoding.beam_size, manifest.decoding.max_length) == (5, 250)
    first = open_package(models["unequal depths, separate vocabularies, untied generator"][1]).manifest
    assert first.parity["onnxruntime/fp32"]["passed"] and "target_vocab" in first.tokenizer.files
    wide = open_package(models["wide feed-forward without biases, fast_gelu"][1]).manifest.architecture
    assert not wide.ffn_bias and wide.encoder.ffn_dim == 160 and wide.decoder.activation == "gelu_tanh"


def test_unsupported_options_are_listed_at_once(tmp_path: Path) -> None:
    source = make_onmt_dir(tmp_path / "src", max_relative_positions=20, layer_norm="rms",
                           pos_ffn_activation_fn="silu", transforms=["onmt_tokenize"])
    (source / "spm.de.model").unlink()
    with pytest.raises(ConversionError) as info:
        load_source(source)
    lines = str(info.value).splitlines()
    assert "cannot convert this OpenNMT-py checkpoint" in lines[0]
    for reason in ("max_relative_positions=20", 'layer_norm="rms"', "pos_ffn_activation_fn 'silu'",
                   "transforms ['onmt_tokenize']", "missing the SentencePiece models"):
        assert sum(reason in line for line in lines[1:]) == 1, reason
    assert len(lines) == 6


def test_not_an_opennmt_checkpoint(tmp_path: Path) -> None:
    import torch

    tmp_path.joinpath("src").mkdir()
    torch.save({"state_dict": {}}, tmp_path / "src" / "model.pt")
    with pytest.raises(ConversionError, match=r"model\.pt has no model, generator, vocab, opt"):
        load_source(tmp_path / "src")
