"""One contract suite for both runtimes: the Backend protocol over the same emitted graphs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from converters.onnx_emitter import emit_onnx
from converters.reference import ReferenceModel
from serving.engine.backends import Backend, EncoderOutput, create_backend, empty_past
from serving.package import MASK_VALUE
from tests.utils.random_spec import EOS, START, padded_batch, random_spec

SPEC = random_spec(seed=3, decoder_layers=3)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("backends")
    encoder, decoder = emit_onnx(SPEC, root / "onnx")
    paths = {"onnxruntime": (encoder, decoder)}
    try:
        from converters.openvino import onnx_to_openvino
    except ImportError:  # pragma: no cover
        return paths
    if _has_openvino():
        _, growing = emit_onnx(SPEC, root / "growing", cache="growing")
        paths["openvino"] = (onnx_to_openvino(encoder, root / "ov" / "encoder.xml"),
                             onnx_to_openvino(growing, root / "ov" / "decoder.xml"))
    return paths


def _has_openvino() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module", params=["onnxruntime", "openvino"])
def backend(request: pytest.FixtureRequest, graphs: dict[str, tuple[Path, Path]]) -> Backend:
    """One session per runtime for the module: every test below also runs on a backend that has served others."""
    if request.param not in graphs:
        pytest.skip(f"{request.param} is not installed")
    encoder, decoder = graphs[request.param]
    return create_backend(request.param, encoder, decoder, threads=1)


def test_satisfies_the_protocol(backend: Backend) -> None:
    assert isinstance(backend, Backend)


def test_encode_shapes_and_mask(backend: Backend) -> None:
    ids = padded_batch([[5, 6, 7, EOS], [8, EOS]])
    out = backend.encode(ids)
    assert isinstance(out, EncoderOutput)
    assert out.memory.shape == (2, 4, 16) and out.memory.dtype == np.float32
    assert out.cross_kv.shape == (3, 2, 2, 2, 4, 8) and out.cross_kv.dtype == np.float32
    np.testing.assert_array_equal(out.src_bias[:, 0, 0], [[0, 0, 0, 0], [0, 0, MASK_VALUE, MASK_VALUE]])


def test_decode_steps_grow_the_cache_and_match_the_reference(backend: Backend) -> None:
    ids = padded_batch([[5, 6, 7, EOS], [8, EOS], [9, 10, 11, 12, 13, EOS]])
    ref = ReferenceModel(SPEC)
    got, want = backend.encode(ids), ref.encode(ids)
    past, ref_past = empty_past(got.cross_kv), empty_past(want.cross_kv)
    assert past.shape == (3, 2, 3, 2, 0, 8)
    tokens = np.full((3, 1), START, dtype=np.int64)
    for step in range(4):
        log_probs, past = backend.decode_step(tokens, step, past, got.cross_kv, got.src_bias)
        ref_log_probs, ref_past = ref.decode_step(tokens, step, ref_past, want.cross_kv, want.src_bias)
        assert log_probs.shape == (3, 40) and past.shape == (3, 2, 3, 2, step + 1, 8)
        np.testing.assert_allclose(np.exp(log_probs).sum(axis=-1), 1.0, atol=1e-5)
        np.testing.assert_allclose(log_probs, ref_log_probs, atol=1e-4)
        tokens = ref_log_probs.argmax(axis=-1)[:, None]


def test_rows_can_be_reordered_and_dropped(backend: Backend) -> None:
    """Beam search and batch shrinking take rows of the caches; results must follow the rows."""
    ids = padded_batch([[5, 6, 7, EOS], [8, EOS], [9, 10, EOS]])
    enc = backend.encode(ids)
    tokens = np.array([[START]] * 3, dtype=np.int64)
    full, past = backend.decode_step(tokens, 0, empty_past(enc.cross_kv), enc.cross_kv, enc.src_bias)
    keep = np.array([2, 0])
    sub, _ = backend.decode_step(tokens[keep], 1, np.take(past, keep, axis=2), np.take(enc.cross_kv, keep, axis=2),
                                 np.take(enc.src_bias, keep, axis=0))
    again, _ = backend.decode_step(tokens, 1, past, enc.cross_kv, enc.src_bias)
    np.testing.assert_allclose(sub, again[keep], atol=1e-5)
    assert full.flags.writeable  # decoding may mask scores in place


def test_accepts_int32_ids_and_non_contiguous_caches(backend: Backend) -> None:
    ids = padded_batch([[5, 6, EOS], [7, EOS]])
    enc = backend.encode(ids.astype(np.int32))
    cross = np.asfortranarray(enc.cross_kv)
    log_probs, _ = backend.decode_step(np.array([[START], [START]], dtype=np.int32), 0, empty_past(cross), cross,
                                       enc.src_bias)
    assert log_probs.shape == (2, 40)


def test_create_backend_errors(graphs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="supported runtimes are: onnxruntime, openvino"):
        create_backend("tensorrt", *graphs["onnxruntime"])
    with pytest.raises(Exception, match="missing.onnx"):
        create_backend("onnxruntime", tmp_path / "missing.onnx", graphs["onnxruntime"][1])


def test_backends_import_neither_torch_nor_transformers() -> None:
    code = ("import sys, serving.engine.backends.onnxruntime, serving.engine.backends.openvino, serving.engine.backends; "
            "bad = [m for m in ('torch', 'transformers', 'tensorflow') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[3])
