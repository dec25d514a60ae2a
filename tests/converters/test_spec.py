"""TransformerSpec per stack: the architecture fields, their defaults for packages written before them, and the
problems ``validate`` lists."""

from __future__ import annotations

from dataclasses import asdict, fields

import pytest

from converters.spec import TransformerConfig, expected_weights
from serving.package import FORMAT, parse_manifest
from tests.utils.random_spec import random_spec

# Fields added with per-stack shapes: a manifest written before them has none of them.
NEW_FIELDS = ("decoder_num_heads", "decoder_ffn_dim", "decoder_activation", "decoder_pre_norm", "encoder_embed_norm",
              "decoder_embed_norm", "shared_positions", "decoder_start_zero", "mask_source_eos")


def _manifest(architecture: dict[str, object]) -> dict[str, object]:
    files = {"tokenizer/vocab.subwords": "0" * 64, "onnx/encoder.onnx": "0" * 64, "onnx/decoder.onnx": "0" * 64}
    return {"format": FORMAT, "architecture": architecture,
            "special_ids": {"pad": 0, "eos": 1, "decoder_start": 0},
            "tokenizer": {"kind": "t2t_subword", "files": {"vocab": "tokenizer/vocab.subwords"}}, "files": files}


def test_old_manifests_describe_equal_stacks() -> None:
    old = {k: v for k, v in asdict(random_spec(pre_norm=True, activation="gelu").config).items()
           if k not in NEW_FIELDS}
    arch = parse_manifest(_manifest(old)).architecture
    assert asdict(arch.decoder) == asdict(arch.encoder)  # 2 + 2 layers, no final norms: the same shape
    assert (arch.encoder.heads, arch.encoder.ffn_dim, arch.encoder.activation, arch.encoder.pre_norm) == (
        2, 24, "gelu", True)
    assert arch.shared_positions and not arch.decoder_start_zero and not arch.mask_source_eos
    assert not arch.encoder.embed_norm and not arch.decoder.embed_norm
    assert {f.name for f in fields(TransformerConfig)} >= set(NEW_FIELDS)


def test_new_fields_round_trip() -> None:
    config = random_spec(decoder_num_heads=4, decoder_ffn_dim=8, decoder_activation="gelu_tanh",
                         decoder_pre_norm=True, decoder_final_norm=True, shared_positions=False).config
    arch = parse_manifest(_manifest(asdict(config))).architecture
    assert arch == config
    assert (arch.decoder.heads, arch.decoder.head_dim, arch.decoder.ffn_dim, arch.decoder.activation) == (
        4, 4, 8, "gelu_tanh")
    assert arch.decoder.pre_norm and not arch.encoder.pre_norm
    names = expected_weights(config)
    assert names["decoder.layers.0.ffn.fc1.weight"] == (16, 8) and names["encoder.layers.0.ffn.fc1.weight"] == (16, 24)
    assert "positions" not in names and names["encoder.positions"] == names["decoder.positions"] == (64, 16)


def test_every_problem_of_both_stacks_is_listed() -> None:
    spec = random_spec()
    spec.config = TransformerConfig(**(asdict(spec.config) | {"num_heads": 3, "decoder_num_heads": 5,
                                                               "decoder_activation": "tanh", "decoder_ffn_dim": 0}))
    with pytest.raises(ValueError) as info:
        spec.validate()
    message = str(info.value)
    for problem in ("d_model 16 is not divisible by the encoder's 3 heads",
                    "d_model 16 is not divisible by the decoder's 5 heads", "decoder activation 'tanh'",
                    "decoder ffn_dim must be positive"):
        assert problem in message
