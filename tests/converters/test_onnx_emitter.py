"""The ONNX emitter against the numpy reference, for every option TransformerConfig describes.

The reference (converters/reference.py) is written the textbook way (float64, per-layer cache concat, unfused
projections); the emitter fuses QKV, folds scales and never concatenates a layer's cache. Marian's options are also
anchored to transformers in test_marian.py and T2T's to an independent implementation in test_t2t.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from converters.onnx_emitter import emit_onnx
from converters.reference import ReferenceModel
from converters.spec import MASK_VALUE
from serving.engine.backends import create_backend, empty_past
from tests.utils.random_spec import EOS, PAD, START, padded_batch, random_spec

TOL = 1e-4

CONFIGS: dict[str, dict[str, object]] = {
    "post-norm relu (Marian-like)": {},
    "pre-norm, final norms, gelu": {"pre_norm": True, "encoder_final_norm": True, "decoder_final_norm": True,
                                    "activation": "gelu"},
    "swish, no biases, no scale": {"activation": "swish", "attention_bias": False, "ffn_bias": False,
                                   "logits_bias": False, "embedding_scale": 1.0},
    "separate vocabularies, untied output": {"shared_embeddings": False, "tied_output": False,
                                             "target_vocab_size": 30},
    "separate vocabularies, tied decoder embedding": {"shared_embeddings": False, "target_vocab_size": 30},
    "T2T-like: zero PAD embedding, target-space bias": {
        "pre_norm": True, "encoder_final_norm": True, "decoder_final_norm": True, "attention_bias": False,
        "logits_bias": False, "encoder_embed_bias": True, "zero_embedding_id": 0},
    "zero embedding with an untied output": {"tied_output": False, "zero_embedding_id": 0},
    "unequal stacks: depth, heads, FFN, activation, norm placement": {
        "encoder_layers": 3, "decoder_layers": 1, "num_heads": 4, "decoder_num_heads": 2, "ffn_dim": 40,
        "decoder_ffn_dim": 12, "activation": "gelu_tanh", "decoder_activation": "gelu_sigmoid",
        "decoder_pre_norm": True, "decoder_final_norm": True},
    "embedding norms, separate learned positions, gelu_sigmoid": {
        "encoder_embed_norm": True, "decoder_embed_norm": True, "shared_positions": False, "activation": "gelu_sigmoid",
        "shared_embeddings": False, "target_vocab_size": 30, "pre_norm": True, "encoder_final_norm": True},
    "Marian NMT-like: zero start embedding, output bias": {"decoder_start_zero": True, "tied_output": False},
    "OpenNMT-py-like: masked source EOS, pre-norm, final norms": {
        "mask_source_eos": True, "pre_norm": True, "encoder_final_norm": True, "decoder_final_norm": True},
}


def _source(lone_eos: bool = True) -> np.ndarray:
    # Varied lengths, EOS-terminated, right-padded; one sentence of length 1 (just EOS) unless the model masks the
    # source EOS (then that sentence has nothing to attend to: undefined, and never translated).
    rows = [[5, 6, 7, 8, 9, 10, EOS], [11, 12, EOS], [13, 14, 15, 16, EOS]]
    return padded_batch(rows[:2] + [[EOS]] + rows[2:] if lone_eos else rows)


def _targets(batch: int, steps: int, vocab: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    out = rng.integers(3, vocab, size=(batch, steps))
    out[:, 0] = START
    out[0, 2] = PAD  # a mid-sentence id 0 is a legal token (T2T embeds it to zeros too)
    return out.astype(np.int64)


def _compare(backend: object, ref: ReferenceModel, source: np.ndarray) -> None:
    assert hasattr(backend, "encode") and hasattr(backend, "decode_step")
    got = backend.encode(source)
    want = ref.encode(source)
    np.testing.assert_allclose(got.memory, want.memory, atol=TOL, rtol=0)
    np.testing.assert_allclose(got.cross_kv, want.cross_kv, atol=TOL, rtol=0)
    np.testing.assert_array_equal(got.src_bias, want.src_bias)
    targets = _targets(source.shape[0], 5, ref.c.target_vocab_size)
    past, ref_past = empty_past(got.cross_kv), empty_past(want.cross_kv)
    for step in range(targets.shape[1]):
        ids = targets[:, step : step + 1]
        log_probs, past = backend.decode_step(ids, step, past, got.cross_kv, got.src_bias)
        ref_log_probs, ref_past = ref.decode_step(ids, step, ref_past, want.cross_kv, want.src_bias)
        assert log_probs.shape == (source.shape[0], ref.c.target_vocab_size)
        assert past.shape == ref_past.shape
        np.testing.assert_allclose(log_probs, ref_log_probs, atol=TOL, rtol=0)
        np.testing.assert_allclose(past, ref_past, atol=TOL, rtol=0)


@pytest.mark.parametrize("options", list(CONFIGS.values()), ids=list(CONFIGS))
def test_onnxruntime_matches_reference(tmp_path: Path, options: dict[str, object]) -> None:
    spec = random_spec(**options)  # type: ignore[arg-type]
    encoder, decoder = emit_onnx(spec, tmp_path)
    _compare(create_backend("onnxruntime", encoder, decoder, threads=1), ReferenceModel(spec),
             _source(lone_eos=not spec.config.mask_source_eos))


@pytest.mark.parametrize("config", ["T2T-like: zero PAD embedding, target-space bias",
                                    "unequal stacks: depth, heads, FFN, activation, norm placement"])
def test_openvino_matches_reference(tmp_path: Path, config: str) -> None:
    """Two configs for OpenVINO (conversion is slow): pre-norm, final norms, zero embedding (Not/Equal/Cast), bias;
    stacks of different shapes with the tanh and sigmoid GELUs."""
    pytest.importorskip("openvino")
    from converters.openvino import onnx_to_openvino

    spec = random_spec(**CONFIGS[config])  # type: ignore[arg-type]
    encoder, decoder = emit_onnx(spec, tmp_path / "onnx", cache="growing")
    backend = create_backend("openvino", onnx_to_openvino(encoder, tmp_path / "ov" / "encoder.xml"),
                             onnx_to_openvino(decoder, tmp_path / "ov" / "decoder.xml"), threads=1)
    _compare(backend, ReferenceModel(spec), _source())


def test_src_bias_marks_padding_only(tmp_path: Path) -> None:
    spec = random_spec()
    encoder, decoder = emit_onnx(spec, tmp_path)
    out = create_backend("onnxruntime", encoder, decoder, threads=1).encode(padded_batch([[5, EOS], [EOS]]))
    assert out.src_bias.shape == (2, 1, 1, 2)
    np.testing.assert_array_equal(out.src_bias[:, 0, 0], [[0.0, 0.0], [0.0, MASK_VALUE]])


def test_graph_io_contract(tmp_path: Path) -> None:
    spec = random_spec(decoder_layers=3)
    encoder, decoder = emit_onnx(spec, tmp_path)
    _, growing_decoder = emit_onnx(spec, tmp_path / "growing", cache="growing")
    enc, dec, growing = onnx.load(str(encoder)), onnx.load(str(decoder)), onnx.load(str(growing_decoder))

    def io(values: object) -> dict[str, list[object]]:
        return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # type: ignore[attr-defined]
                for v in values}  # type: ignore[attr-defined]

    assert io(enc.graph.input) == {"input_ids": ["batch", "src_len"]}
    assert io(enc.graph.output) == {"memory": ["batch", "src_len", 16], "cross_kv": [3, 2, "batch", 2, "src_len", 8],
                                    "src_bias": ["batch", 1, 1, "src_len"]}
    cross = {f"cross_{kind}.{i}": ["batch", 2, "src_len", 8] for i in range(3) for kind in "kv"}
    # Stationary (ONNX Runtime): the caches keep their capacity; present is past with each row's slot written.
    past = {f"past_{kind}.{i}": ["batch", 2, "capacity", 8] for i in range(3) for kind in "kv"}
    present = {f"present_{kind}.{i}": ["batch", 2, "capacity", 8] for i in range(3) for kind in "kv"}
    assert io(dec.graph.input) == {"input_ids": ["batch", 1], "position_ids": ["batch", 1], **past, **cross,
                                   "src_bias": ["batch", 1, 1, "src_len"], "row_order": ["batch"]}
    assert io(dec.graph.output) == {"log_probs": ["batch", 40], **present}
    attention = [n for n in dec.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == 3 and all(n.domain == "com.microsoft" for n in attention)
    assert [(n.input[3], n.output[1]) for n in attention] == [(f"past_k.{i}", f"present_k.{i}") for i in range(3)]
    # Growing (OpenVINO's source): standard ops, a mask over the cache, one slot more out than in.
    past = {f"past_{kind}.{i}": ["batch", 2, "past_len", 8] for i in range(3) for kind in "kv"}
    present = {f"present_{kind}.{i}": ["batch", 2, "present_len", 8] for i in range(3) for kind in "kv"}
    assert io(growing.graph.input) == {"input_ids": ["batch", 1], "position_ids": ["batch", 1], **past, **cross,
                                       "src_bias": ["batch", 1, 1, "src_len"],
                                       "self_bias": ["batch", 1, 1, "past_len"]}
    assert io(growing.graph.output) == {"log_probs": ["batch", 40], **present}
    assert all(op.domain in ("", "ai.onnx") for op in growing.opset_import)
    for graph in (dec, growing):
        assert [v.name for v in graph.graph.input][2:4] == ["past_k.0", "past_v.0"]  # [L, 2] order
        # Speed: no op copies a layer out of a stacked cache.
        assert not any(n.op_type == "Gather" and any(i.startswith(("past_", "cross_")) for i in n.input)
                       for n in graph.graph.node)
    assert all(op.domain in ("", "ai.onnx") and op.version >= 17 for op in enc.opset_import)
    # Speed: the encoder projects all layers' cross K/V in one matmul; the tied matrix is stored once.
    assert sum(1 for n in enc.graph.node if n.op_type == "MatMul" and "cross_kv" in n.name) == 1
    vocab_tables = [i for i in dec.graph.initializer if list(i.dims) == [40, 16]]
    assert len(vocab_tables) == 1
    assert any(n.op_type == "LayerNormalization" for n in dec.graph.node)


def test_batch_of_one_and_long_cache(tmp_path: Path) -> None:
    spec = random_spec(max_positions=40)
    encoder, decoder = emit_onnx(spec, tmp_path)
    backend = create_backend("onnxruntime", encoder, decoder, threads=1)
    ref = ReferenceModel(spec)
    source = padded_batch([[7, 8, 9, EOS]])
    got, want = backend.encode(source), ref.encode(source)
    past, ref_past = empty_past(got.cross_kv), empty_past(want.cross_kv)
    token = np.array([[START]], dtype=np.int64)
    for step in range(39):  # up to the last row of the position table
        log_probs, past = backend.decode_step(token, step, past, got.cross_kv, got.src_bias)
        ref_log_probs, ref_past = ref.decode_step(token, step, ref_past, want.cross_kv, want.src_bias)
        np.testing.assert_allclose(log_probs, ref_log_probs, atol=TOL, rtol=0)
        token = ref_log_probs.argmax(axis=-1)[:, None].astype(np.int64)
    assert past.shape[4] == 39


def test_masked_source_eos_and_zero_start(tmp_path: Path) -> None:
    """``mask_source_eos``: src_bias masks the EOS too; ``decoder_start_zero``: step 0 ignores the start id."""
    spec = random_spec(mask_source_eos=True, decoder_start_zero=True)
    encoder, decoder = emit_onnx(spec, tmp_path)
    backend = create_backend("onnxruntime", encoder, decoder, threads=1)
    out = backend.encode(padded_batch([[5, 6, EOS], [7, EOS]]))
    np.testing.assert_array_equal(out.src_bias[:, 0, 0], [[0.0, 0.0, MASK_VALUE], [0.0, MASK_VALUE, MASK_VALUE]])
    past = empty_past(out.cross_kv)
    first, _ = backend.decode_step(np.array([[START], [START]]), 0, past, out.cross_kv, out.src_bias)
    other, _ = backend.decode_step(np.array([[9], [17]]), 0, past, out.cross_kv, out.src_bias)
    np.testing.assert_array_equal(first, other)
