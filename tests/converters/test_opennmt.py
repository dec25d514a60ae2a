"""OpenNMT-py checkpoints -> package (issue 16 item 5), with no OpenNMT-py installed: what is OpenNMT-py's own.

Checkpoints are written by the test the way OpenNMT-py 3 writes them (tests/utils/onmt_factory.py: its parameter
names, ``opt`` a Namespace, ``vocab`` token lists, its SentencePiece models), in the shapes of
tests/utils/checkpoint_parity.py (``OPENNMT``): unequal depths with separate vocabularies and an untied generator;
shared embeddings with the generator tied to them, no attention biases (``add_qkvbias`` off, OpenNMT-py 3's
default), the concatenated sinusoids and gelu; a wide feed-forward without biases and fast_gelu. Their parity with an
independent numpy forward pass written from OpenNMT-py's parameter names (tests/utils/onmt_reference.py) is
tests/converters/test_checkpoint_parity.py's; here the manifest and the refusals are checked.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from converters.base import ConversionError
from converters.convert import load_source
from serving.package import open_package
from tests.utils.checkpoint_parity import ONMT_BOS, ONMT_EOS, ONMT_PAD, OPENNMT, Converted, ConvertedCheckpoints
from tests.utils.onmt_factory import make_onmt_dir
from tests.utils.refusals import assert_refused_at_once

pytest.importorskip("torch")

PAD, BOS, EOS = ONMT_PAD, ONMT_BOS, ONMT_EOS


@pytest.fixture(scope="module")
def models(converted_checkpoints: ConvertedCheckpoints) -> dict[str, Converted]:
    """shape -> (checkpoint dir, package dir, numpy reference): the session's conversions."""
    return converted_checkpoints(OPENNMT)


def test_manifest_records_the_model(models: dict[str, Converted]) -> None:
    manifest = open_package(models[OPENNMT.openvino_shape].package).manifest
    arch = manifest.architecture
    assert manifest.source_framework == "opennmt-py" and manifest.source["checkpoint"] == "model_step_100.pt"
    assert arch.pre_norm and arch.encoder.final_norm and arch.decoder.final_norm and arch.mask_source_eos
    assert arch.shared_embeddings and arch.tied_output and arch.logits_bias and not arch.attention_bias
    assert arch.decoder.heads == 8 and arch.encoder.activation == "gelu" and arch.max_positions == 256
    assert (manifest.special_ids.pad, manifest.special_ids.eos, manifest.special_ids.decoder_start) == (PAD, EOS,
                                                                                                        BOS)
    assert (manifest.decoding.beam_size, manifest.decoding.max_length) == (5, 250)
    first = open_package(models["unequal depths, separate vocabularies, untied generator"].package).manifest
    assert first.parity["onnxruntime/fp32"]["passed"] and "target_vocab" in first.tokenizer.files
    wide = open_package(models["wide feed-forward without biases, fast_gelu"].package).manifest.architecture
    assert not wide.ffn_bias and wide.encoder.ffn_dim == 160 and wide.decoder.activation == "gelu_tanh"


def test_unsupported_options_are_listed_at_once(tmp_path: Path) -> None:
    source = make_onmt_dir(tmp_path / "src", max_relative_positions=20, layer_norm="rms",
                           pos_ffn_activation_fn="silu", transforms=["onmt_tokenize"])
    (source / "spm.de.model").unlink()
    assert_refused_at_once(source, "OpenNMT-py", [
        "max_relative_positions=20", 'layer_norm="rms"', "pos_ffn_activation_fn 'silu'", "transforms ['onmt_tokenize']",
        "missing the SentencePiece models"])


def test_not_an_opennmt_checkpoint(tmp_path: Path) -> None:
    import torch

    tmp_path.joinpath("src").mkdir()
    torch.save({"state_dict": {}}, tmp_path / "src" / "model.pt")
    with pytest.raises(ConversionError, match=r"model\.pt has no model, generator, vocab, opt"):
        load_source(tmp_path / "src")
