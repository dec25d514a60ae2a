"""T2TConverter on the real tensor2tensor test checkpoint and on synthetic T2T checkpoints.

Parity: the emitted ONNX graphs against tests/utils/t2t_reference.py, an independent numpy implementation of T2T's
forward pass that reads the checkpoint with its own tensor-bundle reader.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.base import ConversionError, LoadedModel
from converters.t2t import T2TConverter
from converters.t2t_checkpoint import timing_signal
from serving.engine.tokenizers.subword import SubwordTextEncoder
from tests.utils import t2t_reference as ref_lib
from tests.utils.t2t_reference import T2TReference

DATA = Path(__file__).resolve().parents[1] / "data" / "t2t"
CKPT = DATA / "transformer_test_ckpt"
VOCAB_8K = DATA / "vocab.translate_ende_wmt8k.8192.subwords"
VOCAB_32K = DATA / "vocab.translate_ende_wmt32k.32768.subwords"
TOLERANCE = 1e-4

SENTENCES = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog, again and again.",
    "I \u2764 Tensor2Tensor!",
    "Snow\u2603man",
    "Die Bundesregierung hat am 3. Oktober 2019 1.234,56 Euro ausgegeben.",
    "a",
]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return T2TConverter(CKPT, vocab=VOCAB_8K).load()


@pytest.fixture(scope="module")
def reference() -> T2TReference:
    return T2TReference.from_checkpoint(CKPT)


def _batch(texts: list[str]) -> np.ndarray:
    enc = SubwordTextEncoder(VOCAB_8K)
    rows = [enc.encode(t) + [1] for t in texts]
    out = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


# -- conversion of the real checkpoint -------------------------------------------------------------------------------


def test_real_checkpoint_converts(loaded: LoadedModel, reference: T2TReference) -> None:
    spec = loaded.spec
    spec.validate()
    c = spec.config
    assert (c.source_vocab_size, c.d_model, c.num_heads, c.encoder_layers, c.decoder_layers, c.ffn_dim) == (
        8190, 16, 2, 2, 2, 8)
    assert c.pre_norm and c.encoder_final_norm and c.decoder_final_norm and c.encoder_embed_bias
    assert c.shared_embeddings and c.tied_output and not c.attention_bias and c.ffn_bias and not c.logits_bias
    assert c.norm_epsilon == 1e-6 and c.embedding_scale == 4.0 and c.activation == "relu"
    ids = spec.special_ids
    assert (ids.pad, ids.eos, ids.decoder_start, ids.zero_embedding_id) == (0, 1, 0, 0)
    d = spec.decoding
    assert (d.beam_size, d.length_penalty, d.length_penalty_kind, d.extra_length) == (4, 0.6, "gnmt", 100)
    assert d.bad_word_ids == () and not d.forced_eos
    assert loaded.tokenizer == {"kind": "t2t_subword", "files": {"vocab": "tokenizer/vocab.subwords"}}
    assert loaded.tokenizer_files == {"tokenizer/vocab.subwords": VOCAB_8K}
    assert loaded.source["framework"] == "t2t" and loaded.source["global_step"] == 1
    assert loaded.source["target_space_id"] == 0 and loaded.source["problem"] == "translate_ende_wmt8k"
    # Shards joined in numeric order (the reference joins them on its own); lexicographic order would differ.
    embed = spec.weights["encoder.embed_tokens"]
    np.testing.assert_array_equal(embed, reference.input_emb)
    assert embed.shape == (8190, 16) and abs(float(embed.std()) - 0.25) < 0.01
    np.testing.assert_array_equal(spec.weights["encoder.embed_bias"], reference.target_space)


def test_target_space_id_selects_row() -> None:
    spec = T2TConverter(CKPT, vocab=VOCAB_8K, target_space_id=8).load().spec
    ref = T2TReference.from_checkpoint(CKPT, target_space_id=8)
    np.testing.assert_array_equal(spec.weights["encoder.embed_bias"], ref.target_space)


def test_timing_signal_matches_reference_values() -> None:
    table = timing_signal(1024, 512)
    assert table.dtype == np.float32
    np.testing.assert_array_equal(table[0], np.r_[np.zeros(256), np.ones(256)].astype(np.float32))
    assert table[1, 0] == pytest.approx(0.841471, abs=1e-6) and table[1, 256] == pytest.approx(0.540302, abs=1e-6)
    np.testing.assert_allclose(timing_signal(50, 16), ref_lib.timing_signal(50, 16), atol=1e-6)
    assert timing_signal(3, 5)[:, 4].tolist() == [0.0, 0.0, 0.0]  # odd width: one zero channel


# -- ONNX parity against the independent numpy reference ------------------------------------------------------------


class _OrtGraphs:
    """The emitted ONNX graphs (the decoder with the ``cache`` contract) on ONNX Runtime, through its backend."""

    def __init__(self, loaded: LoadedModel, out_dir: Path, cache: str = "stationary") -> None:
        emitter = pytest.importorskip("converters.onnx_emitter")
        pytest.importorskip("onnxruntime")
        from serving.engine.backends import create_backend

        self.paths = emitter.emit_onnx(loaded.spec, out_dir, cache=cache)
        self.backend = create_backend("onnxruntime", *self.paths, threads=1)

    def encode(self, input_ids: np.ndarray) -> Any:
        return self.backend.encode(input_ids)

    def decode_step(self, input_ids: np.ndarray, step: int, past_kv: np.ndarray, cross_kv: np.ndarray,
                    src_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.backend.decode_step(input_ids, step, past_kv, cross_kv, src_bias)


def _check_parity(loaded: LoadedModel, ref: T2TReference, src: np.ndarray, targets: np.ndarray,
                  out_dir: Path, backend: Any = None) -> dict[str, float]:
    """Max abs differences of memory, cross K/V and per-step log-probs (teacher forcing through the step graph)."""
    graphs = backend if backend is not None else _OrtGraphs(loaded, out_dir)
    out = graphs.encode(src)
    enc_out, enc_bias = ref.encode(src)
    real = src != 0  # padding rows of memory are never attended to; T2T leaves them unnormalised garbage too
    diffs = {"memory": float(np.abs(out.memory - enc_out)[real].max())}
    assert np.array_equal(out.src_bias < -1e8, enc_bias < -1e8)
    ref_kv = ref.cross_kv(enc_out)
    diffs["cross_kv"] = max(
        float(np.abs(out.cross_kv[i, j] - ref_kv[i][j]).transpose(0, 2, 1, 3)[real].max())
        for i in range(len(ref_kv)) for j in (0, 1)
    )
    expected = ref.decode_teacher(enc_out, enc_bias, targets)
    batch, heads, depth = src.shape[0], ref.heads, ref.hidden // ref.heads
    past = np.zeros((ref.dec_layers, 2, batch, heads, 0, depth), dtype=np.float32)
    ids = np.zeros((batch, 1), dtype=np.int64)
    worst = 0.0
    for step in range(targets.shape[1]):
        log_probs, past = graphs.decode_step(ids, step, past, out.cross_kv, out.src_bias)
        worst = max(worst, float(np.abs(log_probs - expected[:, step]).max()))
        ids = np.ascontiguousarray(targets[:, step:step + 1])
    diffs["log_probs"] = worst
    return diffs


def _onnx_greedy(loaded: LoadedModel, src: np.ndarray, steps: int, out_dir: Path) -> list[list[int]]:
    graphs = _OrtGraphs(loaded, out_dir)
    enc = graphs.encode(src)
    c = loaded.spec.config
    past = np.zeros((c.decoder.layers, 2, src.shape[0], c.decoder.heads, 0, c.decoder.head_dim), dtype=np.float32)
    ids = np.zeros((src.shape[0], 1), dtype=np.int64)
    out: list[list[int]] = [[] for _ in range(src.shape[0])]
    done = np.zeros(src.shape[0], dtype=bool)
    for step in range(steps):
        log_probs, past = graphs.decode_step(ids, step, past, enc.cross_kv, enc.src_bias)
        ids = log_probs.argmax(axis=-1)[:, None]
        for b in np.flatnonzero(~done):
            out[b].append(int(ids[b, 0]))
        done |= ids[:, 0] == 1
        if done.all():
            break
    return out


def _parity_inputs() -> tuple[np.ndarray, np.ndarray]:
    src = _batch(SENTENCES)
    targets = np.random.default_rng(0).integers(2, 8190, size=(len(SENTENCES), 12))
    targets[:, 5] = 0  # a PAD id fed back mid-sentence embeds to zeros
    targets[1, 3] = 1
    return src, targets


def test_onnx_matches_numpy_reference(loaded: LoadedModel, reference: T2TReference, tmp_path: Path) -> None:
    src, targets = _parity_inputs()
    diffs = _check_parity(loaded, reference, src, targets, tmp_path / "onnx")
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_openvino_ir_matches_numpy_reference(loaded: LoadedModel, reference: T2TReference, tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    from converters.openvino import onnx_to_openvino
    from serving.engine.backends.openvino import OpenVinoBackend

    encoder_onnx, decoder_onnx = _OrtGraphs(loaded, tmp_path / "onnx", cache="growing").paths
    backend = OpenVinoBackend(onnx_to_openvino(encoder_onnx, tmp_path / "ov" / "encoder.xml"),
                              onnx_to_openvino(decoder_onnx, tmp_path / "ov" / "decoder.xml"), threads=1)
    src, targets = _parity_inputs()
    diffs = _check_parity(loaded, reference, src, targets, tmp_path, backend=backend)
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_onnx_greedy_tokens_match_reference(loaded: LoadedModel, reference: T2TReference, tmp_path: Path) -> None:
    src = _batch(SENTENCES[:4])
    expected = reference.greedy(src, extra_length=12)
    assert _onnx_greedy(loaded, src, src.shape[1] + 12, tmp_path / "onnx") == expected
    # Batching must not change a sentence's tokens (only padding differs).
    alone = reference.greedy(_batch(SENTENCES[2:3]), extra_length=12)[0]
    assert alone[:10] == expected[2][:10]


# -- synthetic checkpoints: layouts the test checkpoint does not have -------------------------------------------------


@pytest.mark.parametrize(
    ("pre_norm", "sharing"),
    [(True, "none"), (False, "all"), (False, "embeddings")],
    ids=["pre-norm-three-matrices", "post-norm-shared", "post-norm-shared-embeddings-separate-softmax"],
)
def test_synthetic_layouts_match_reference(tmp_path: Path, pre_norm: bool, sharing: str) -> None:
    hparams = ref_lib.synthetic_hparams(pre_norm=pre_norm)
    variables = ref_lib.synthetic_variables(pre_norm=pre_norm, sharing=sharing, seed=1)
    ckpt = tmp_path / "ckpt"
    ref_lib.write_checkpoint(ckpt, variables, hparams)
    ref_lib.write_vocab(ckpt / "vocab.synthetic.subwords", 301)
    loaded = T2TConverter(ckpt).load()
    loaded.spec.validate()
    c = loaded.spec.config
    assert c.pre_norm == pre_norm and c.encoder_final_norm == pre_norm
    assert c.shared_embeddings == (sharing != "none") and c.tied_output == (sharing == "all")
    assert loaded.source["global_step"] == 7
    ref = T2TReference(variables, hparams)
    rng = np.random.default_rng(2)
    src = rng.integers(2, 301, size=(3, 7))
    src[0, 4:] = 0
    src[1, 6:] = 0
    diffs = _check_parity(loaded, ref, src, rng.integers(0, 301, size=(3, 6)), tmp_path / "onnx")
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_hparams_set_when_no_hparams_json(tmp_path: Path, loaded: LoadedModel) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(CKPT, ckpt)
    (ckpt / "hparams.json").unlink()
    (ckpt / "flags.txt").unlink()
    with pytest.raises(ConversionError, match="--hparams-set"):
        T2TConverter(ckpt, vocab=VOCAB_8K).load()
    spec = T2TConverter(ckpt, vocab=VOCAB_8K, hparams_set="transformer_test").load().spec
    assert spec.config == loaded.spec.config
    for name, array in loaded.spec.weights.items():
        np.testing.assert_array_equal(spec.weights[name], array)
    # flags.txt names the set the model was trained with (and no overrides): used when nothing else is given.
    shutil.copy(CKPT / "flags.txt", ckpt / "flags.txt")
    again = T2TConverter(ckpt, vocab=VOCAB_8K).load()
    assert again.spec.config == loaded.spec.config
    assert again.source["hparams_source"] == "hparams_set transformer_test (from flags.txt)"


def test_hparams_set_on_a_post_norm_checkpoint(tmp_path: Path) -> None:
    """transformer_base was post-norm before T2T 1.2.5: the variable names decide, not today's set definition."""
    hparams = ref_lib.synthetic_hparams(filter_size=8, heads=2, pre_norm=False)
    variables = ref_lib.synthetic_variables(filter_size=8, pre_norm=False, seed=4)
    ckpt = tmp_path / "ckpt"
    ref_lib.write_checkpoint(ckpt, variables, hparams=None)
    vocab = ref_lib.write_vocab(tmp_path / "vocab.subwords", 301)
    loaded = T2TConverter(ckpt, vocab=vocab, hparams_set="transformer_test").load()
    assert not loaded.spec.config.pre_norm and not loaded.spec.config.decoder_final_norm
    src = np.array([[5, 9, 40, 1], [7, 1, 0, 0]])
    diffs = _check_parity(loaded, T2TReference(variables, hparams), src, np.array([[3, 4, 1], [6, 0, 1]]),
                          tmp_path / "onnx")
    assert max(diffs.values()) <= TOLERANCE, diffs


# -- bad input ---------------------------------------------------------------------------------------------------------


def _error(make: Callable[[], Any]) -> str:
    with pytest.raises(ConversionError) as info:
        make()
    return str(info.value)


def test_not_a_checkpoint_lists_everything(tmp_path: Path) -> None:
    message = _error(lambda: T2TConverter(tmp_path).load())
    assert "no TensorFlow checkpoint" in message
    assert "no hparams.json" in message
    assert "missing vocab" in message
    assert not T2TConverter.detect(tmp_path)
    assert T2TConverter.detect(CKPT)


def test_missing_vocab(tmp_path: Path) -> None:
    assert "missing vocab" in _error(lambda: T2TConverter(CKPT).load())
    assert "does not exist" in _error(lambda: T2TConverter(CKPT, vocab=tmp_path / "nope.subwords").load())


def test_wrong_vocab_for_the_model() -> None:
    message = _error(lambda: T2TConverter(CKPT, vocab=VOCAB_32K).load())
    assert "33708 subtokens but the checkpoint embeds 8190" in message


def test_unmappable_hparams_all_listed(tmp_path: Path) -> None:
    import json

    ckpt = tmp_path / "ckpt"
    shutil.copytree(CKPT, ckpt)
    hp = json.loads((ckpt / "hparams.json").read_text())
    hp |= {"ffn_layer": "conv_relu_conv", "self_attention_type": "dot_product_relative", "max_relative_position": 20,
           "layer_postprocess_sequence": "dna", "attention_key_channels": 8}
    (ckpt / "hparams.json").write_text(json.dumps(hp))
    message = _error(lambda: T2TConverter(ckpt, vocab=VOCAB_8K, target_space_id=40, bogus=1).load())
    for reason in ("ffn_layer=\"conv_relu_conv\"", "self_attention_type=\"dot_product_relative\"",
                   "max_relative_position=20", "layer_postprocess_sequence=\"dna\"", "attention_key_channels=8",
                   "target_space_id 40", "option 'bogus'"):
        assert reason in message, reason


def test_unknown_variable_and_missing_variable(tmp_path: Path) -> None:
    hparams = ref_lib.synthetic_hparams()
    variables = ref_lib.synthetic_variables(seed=3)
    del variables["transformer/body/decoder/layer_1/ffn/conv2/bias"]
    variables["transformer/body/encoder/layer_0/self_attention/dot_product_attention_relative/"
              "relative_positions_keys/embeddings"] = np.zeros((41, 4), np.float32)
    ckpt = tmp_path / "ckpt"
    ref_lib.write_checkpoint(ckpt, variables, hparams)
    ref_lib.write_vocab(ckpt / "vocab.synthetic.subwords", 301)
    message = _error(lambda: T2TConverter(ckpt).load())
    assert "missing variable body/decoder/layer_1/ffn/conv2/bias" in message
    assert "unexpected variable body/encoder/layer_0/self_attention/dot_product_attention_relative" in message
