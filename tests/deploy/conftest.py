"""Fixtures for the deploy tests: the model package they serve (the bundled demo model, else a tiny converted one)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `tests.utils` when pytest runs without the repository root on sys.path
    sys.path.insert(0, str(ROOT))

DEMO = ROOT / "models" / "demo-en-de"


@pytest.fixture(scope="session")
def model_package(request: pytest.FixtureRequest) -> Path:
    """models/demo-en-de when it is there, else the shared tiny random Marian package (onnxruntime fp32)."""
    if (DEMO / "manifest.json").is_file():
        return DEMO
    return Path(request.getfixturevalue("tiny_onnx_package"))  # tests/conftest.py; built only when needed
