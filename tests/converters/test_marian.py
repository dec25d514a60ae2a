"""Hugging Face Marian -> package: parity with transformers' MarianMTModel, reader details, rejected inputs.

Models are built in the test from MarianConfig with random weights (tests/utils/marian_factory.py): a tiny one
(d_model 32) and one with opus-mt-en-de's shape (d_model 512, 8 heads, ffn 2048, swish, scaled embeddings) but 2
layers and a 2000-token vocabulary. The ONNX and OpenVINO fp32 artifacts must give encoder outputs and decoder-step
log-probs within 1e-4 (max abs) of transformers.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.base import ConversionError
from converters.convert import convert, load_source
from converters.marian import MarianConverter, sinusoidal_positions
from serving.engine.backends import create_backend, empty_past
from serving.package import find_artifact, load_manifest
from tests.utils.marian_factory import corpus, make_marian_dir
from tests.utils.refusals import assert_refused_at_once

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
N_SENTENCES = 16
DECODER_STEPS = 8


def _hf_reference(source_dir: Path) -> dict[str, np.ndarray]:
    """transformers' outputs on 16 corpus sentences (padded batch) with 8 teacher-forced decoder steps."""
    model = transformers.MarianMTModel.from_pretrained(source_dir).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(source_dir)
    batch = tokenizer(corpus("en")[:N_SENTENCES], return_tensors="pt", padding=True)
    config = model.config
    rng = np.random.default_rng(3)
    targets = rng.integers(2, config.pad_token_id, size=(N_SENTENCES, DECODER_STEPS))
    targets[:, 0] = config.decoder_start_token_id
    decoder_ids = torch.tensor(targets)
    with torch.no_grad():
        memory = model.get_encoder()(**batch).last_hidden_state
        logits = model(**batch, decoder_input_ids=decoder_ids).logits
    return {
        "input_ids": batch["input_ids"].numpy().astype(np.int64),
        "mask": batch["attention_mask"].numpy().astype(bool),
        "targets": targets.astype(np.int64),
        "memory": memory.numpy(),
        "log_probs": torch.log_softmax(logits, dim=-1).numpy(),
    }


@pytest.fixture(scope="module")
def models(tiny_marian_dir: Path, tiny_package: Path, en_de_shaped_package: tuple[Path, Path]
           ) -> dict[str, tuple[Path, Path, dict[str, np.ndarray]]]:
    """name -> (source dir, package dir, transformers reference outputs).

    Both are the session's shared ones (tests/conftest.py): the tiny Marian checkpoint converted for onnxruntime and
    openvino with the built-in parity check, and the en-de-shaped one (its EOS made likelier for the decoding tests,
    one logit's bias: the same graph), converted without the parity check: it is compared with transformers only.
    """
    source, package = en_de_shaped_package
    return {"tiny": (tiny_marian_dir, tiny_package, _hf_reference(tiny_marian_dir)),
            "en-de-shaped": (source, package, _hf_reference(source))}


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("model", ["tiny", "en-de-shaped"])
def test_fp32_artifacts_match_transformers(models: dict[str, Any], model: str, runtime: str) -> None:
    if runtime == "openvino":
        pytest.importorskip("openvino")
    _, package, ref = models[model]
    manifest = load_manifest(package)
    artifact = find_artifact(manifest, runtime, "fp32")
    backend = create_backend(runtime, package / artifact.encoder, package / artifact.decoder, threads=1)
    enc = backend.encode(ref["input_ids"])
    assert np.abs(enc.memory - ref["memory"])[ref["mask"]].max() <= TOL
    assert np.abs(enc.memory - ref["memory"]).max() <= TOL  # padding rows are computed the same way too
    past = empty_past(enc.cross_kv)
    for step in range(DECODER_STEPS):
        log_probs, past = backend.decode_step(ref["targets"][:, step : step + 1], step, past, enc.cross_kv,
                                              enc.src_bias)
        assert np.abs(log_probs - ref["log_probs"][:, step]).max() <= TOL, f"step {step}"
    assert past.shape[4] == DECODER_STEPS


def test_manifest_records_what_transformers_would_do(models: dict[str, Any]) -> None:
    source, package, _ = models["tiny"]
    manifest = load_manifest(package)
    hf = transformers.MarianMTModel.from_pretrained(source)
    gen = hf.generation_config
    assert manifest["source"]["framework"] == "marian"
    assert manifest["special_ids"] == {"pad": hf.config.pad_token_id, "eos": 0, "decoder_start": hf.config.pad_token_id,
                                       "unk": 1, "zero_embedding_id": None}
    decoding = manifest["decoding"]
    assert decoding["beam_size"] == gen.num_beams == 4
    assert decoding["max_length"] == gen.max_length - 1 == 63  # HF counts the start token
    assert decoding["bad_word_ids"] == [hf.config.pad_token_id]
    assert decoding["forced_eos"] is True and decoding["length_penalty_kind"] == "hf"
    arch = manifest["architecture"]
    assert (arch["d_model"], arch["num_heads"], arch["activation"], arch["pre_norm"]) == (32, 4, "swish", False)
    assert arch["embedding_scale"] == pytest.approx(32**0.5) and arch["logits_bias"] is True
    assert manifest["tokenizer"] == {"kind": "sentencepiece", "unk_id": 1, "files": {
        "source_spm": "tokenizer/source.spm", "target_spm": "tokenizer/target.spm", "vocab": "tokenizer/vocab.json"}}
    for rel in manifest["tokenizer"]["files"].values():
        assert rel in manifest["files"]
    assert {(a["runtime"], a["precision"]) for a in manifest["artifacts"]} == {("onnxruntime", "fp32"),
                                                                               ("openvino", "fp32")}
    for key in ("onnxruntime/fp32", "openvino/fp32"):
        row = manifest["parity"][key]
        assert row["passed"] and row["log_probs_max_abs"] < TOL and row["memory_max_abs"] < TOL
    assert manifest["parity"]["openvino/fp32"]["greedy_token_agreement"] == 1.0  # same tokens as onnxruntime
    assert manifest["parity"]["inputs"]["from_tokenizer"] is True


def test_positions_are_transformers_sinusoids() -> None:
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    for dim in (32, 33):
        module = MarianSinusoidalPositionalEmbedding(50, dim)
        module._init_weight()
        np.testing.assert_array_equal(sinusoidal_positions(50, dim), module.weight.detach().numpy())


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_marian_dir(tmp_path_factory.mktemp("tiny") / "src", seed=5)


def _one_step_parity(source: Path, tmp_path: Path) -> float:
    """Convert (ONNX only) and return the max abs log-prob difference with transformers over 3 steps."""
    package = tmp_path / "pkg"
    convert(source, package, runtimes=["onnxruntime"], precisions=["fp32"], verify=False)
    ref = _hf_reference(source)
    artifact = find_artifact(load_manifest(package), "onnxruntime", "fp32")
    backend = create_backend("onnxruntime", package / artifact.encoder, package / artifact.decoder, threads=1)
    enc = backend.encode(ref["input_ids"])
    past, worst = empty_past(enc.cross_kv), 0.0
    for step in range(3):
        log_probs, past = backend.decode_step(ref["targets"][:, step : step + 1], step, past, enc.cross_kv,
                                              enc.src_bias)
        worst = max(worst, float(np.abs(log_probs - ref["log_probs"][:, step]).max()))
    return worst


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_weights_are_cast_to_float32(tmp_path: Path, dtype: str) -> None:
    source = make_marian_dir(tmp_path / "src", dtype=dtype, seed=3)
    assert _one_step_parity(source, tmp_path) <= TOL


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_untied_output_and_other_activations(tmp_path: Path, activation: str) -> None:
    source = make_marian_dir(tmp_path / "src", tie_word_embeddings=False, activation=activation, seed=4)
    assert _one_step_parity(source, tmp_path) <= TOL


def test_pytorch_bin_reads_the_same_weights(tiny_source: Path, tmp_path: Path) -> None:
    model = transformers.MarianMTModel.from_pretrained(tiny_source)
    legacy = shutil.copytree(tiny_source, tmp_path / "legacy")
    (legacy / "model.safetensors").unlink()
    torch.save(model.state_dict(), legacy / "pytorch_model.bin")  # includes the tied copies and positions
    a, b = MarianConverter(tiny_source).load().spec, MarianConverter(legacy).load().spec
    assert sorted(a.weights) == sorted(b.weights)
    for name in a.weights:
        np.testing.assert_array_equal(a.weights[name], b.weights[name], err_msg=name)
    assert a.config == b.config and a.decoding == b.decoding


@pytest.mark.parametrize(
    ("generation", "expected"),
    [
        ({"max_new_tokens": 10, "num_beams": 6, "length_penalty": 0.6, "early_stopping": True,
          "renormalize_logits": True}, {"max_length": 10, "beam_size": 6, "length_penalty": 0.6,
                                        "early_stopping": True, "renormalize_logits": True}),
        ({"bad_words_ids": [[5], [7]], "forced_eos_token_id": None}, {"bad_word_ids": (5, 7), "forced_eos": False}),
    ],
)
def test_generation_config_becomes_decoding_defaults(tmp_path: Path, tiny_source: Path,
                                                     generation: dict[str, Any], expected: dict[str, Any]) -> None:
    source = shutil.copytree(tiny_source, tmp_path / "src")
    gen = json.loads((source / "generation_config.json").read_text()) | generation
    (source / "generation_config.json").write_text(json.dumps(gen))
    decoding = asdict(MarianConverter(source).load().spec.decoding)
    assert {k: decoding[k] for k in expected} == expected


def test_without_generation_config_uses_transformers_defaults(tmp_path: Path, tiny_source: Path) -> None:
    source = shutil.copytree(tiny_source, tmp_path / "src")
    (source / "generation_config.json").unlink()
    gen = transformers.MarianMTModel.from_pretrained(source).generation_config
    decoding = MarianConverter(source).load().spec.decoding
    assert decoding.beam_size == gen.num_beams
    # max_length 20 is transformers' default, which generate() takes as 20 *new* tokens (not 20 - 1 as for any other
    # max_length, which counts the start token): test_marian_shapes.py decodes such a package as generate() does.
    assert gen.max_length == 20 and decoding.max_length == 20
    assert decoding.forced_eos == (gen.forced_eos_token_id is not None)


def test_unsupported_options_are_listed_at_once(tmp_path: Path, tiny_source: Path) -> None:
    source = shutil.copytree(tiny_source, tmp_path / "src")
    config = json.loads((source / "config.json").read_text())
    # (Unequal encoder/decoder heads and FFN widths, once refused here, convert now: test_marian_shapes.py.)
    config |= {"normalize_before": True, "activation_function": "relu6", "add_bias_logits": True,
               "architectures": ["MarianForCausalLM"]}
    (source / "config.json").write_text(json.dumps(config))
    assert_refused_at_once(source, "Marian", [
        "normalize_before=true", "activation_function 'relu6'", "add_bias_logits=true",
        "architectures ['MarianForCausalLM'] (only MarianMTModel is supported)"])


def test_wrong_weight_shape_is_named(tmp_path: Path, tiny_source: Path) -> None:
    from safetensors.numpy import load_file, save_file

    source = shutil.copytree(tiny_source, tmp_path / "src")
    tensors = load_file(source / "model.safetensors")
    tensors["model.decoder.layers.1.fc1.weight"] = np.zeros((63, 32), dtype=np.float32)
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConversionError, match=r"decoder\.layers\.1\.ffn\.fc1\.weight has shape \[32, 63\], "
                                              r"expected \[32, 64\]"):
        load_source(source)


def test_missing_vocab_and_weights(tmp_path: Path, tiny_source: Path) -> None:
    source = shutil.copytree(tiny_source, tmp_path / "src")
    (source / "target.spm").unlink()
    (source / "model.safetensors").unlink()
    with pytest.raises(ConversionError) as info:
        load_source(source)
    assert "missing vocab/tokenizer file(s): target.spm" in str(info.value)
    assert "no weights" in str(info.value)


def test_unknown_tensor_is_rejected(tmp_path: Path, tiny_source: Path) -> None:
    from safetensors.numpy import load_file, save_file

    source = shutil.copytree(tiny_source, tmp_path / "src")
    tensors = load_file(source / "model.safetensors")
    tensors["model.encoder.layernorm_embedding.weight"] = np.ones(32, dtype=np.float32)
    save_file(tensors, source / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConversionError, match="unexpected tensor model.encoder.layernorm_embedding.weight"):
        load_source(source)
