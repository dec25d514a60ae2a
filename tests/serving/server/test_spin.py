"""``MTGATE_SPIN``: whether the decoder's runtime threads spin between calls reaches the session a server loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.engine.backends.onnxruntime import OnnxRuntimeBackend
from serving.server.settings import ServingSettings
from tests.serving.server.conftest import loaded_runner

SPINNING = "session.intra_op.allow_spinning"


def _decoder_spins(backend: OnnxRuntimeBackend) -> bool:
    options = backend.decoder.get_session_options()
    try:
        return options.get_session_config_entry(SPINNING) != "0"
    except RuntimeError:  # not set: ONNX Runtime's default, spinning
        return True


@pytest.mark.parametrize("spin", [True, False])
def test_the_server_loads_its_decoder_with_the_spin_setting(tiny_package: Path, spin: bool) -> None:
    settings = ServingSettings(model_dirs=[tiny_package], threads=1, warmup=False, spin=spin, runtime="onnxruntime")
    runner = loaded_runner(settings, tiny_package)
    assert runner.translator is not None
    backend = runner.translator.backend
    assert isinstance(backend, OnnxRuntimeBackend)
    assert _decoder_spins(backend) is spin
    encoder = backend.encoder.get_session_options()
    assert encoder.get_session_config_entry(SPINNING) == "0"  # the encoder never spins (session_options)


def test_spinning_is_the_default() -> None:
    assert ServingSettings().spin is True
