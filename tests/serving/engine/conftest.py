"""Fixtures shared by the engine's tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from serving.engine.native import native_core

SEARCH_CORES = ["numpy"] if os.environ.get("MTGATE_NATIVE", "1").strip() == "0" else ["native", "numpy"]


@pytest.fixture(params=SEARCH_CORES)
def search_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The decoding core of the test's searches, each in turn (``MTGATE_NATIVE=0`` in the environment: numpy only)."""
    monkeypatch.setenv("MTGATE_NATIVE", "1" if request.param == "native" else "0")
    if request.param == "native":
        assert native_core() is not None, "the native core is not built (HELPERS.md: build it in place)"
    yield request.param
