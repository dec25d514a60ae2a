"""Fixtures for the HTTP layer: the real app (real batcher, middleware, error handlers) in front of a fake engine."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # `tests.fakes` when pytest runs without the repository root on sys.path
    sys.path.insert(0, str(ROOT))

from serving.api import create_app  # noqa: E402
from serving.settings import ServingSettings  # noqa: E402
from tests.fakes import EchoTranslator  # noqa: E402


def wait_ready(client: TestClient, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while client.get("/v2/health/ready").status_code != 200:
        if time.monotonic() > deadline:
            raise AssertionError(f"server not ready: {client.get('/health').json()}")
        time.sleep(0.01)


@contextmanager
def serve_app(translator: Any = None, **settings: Any) -> Iterator[TestClient]:
    """The real app around ``translator`` (default: an EchoTranslator), started and ready."""
    settings.setdefault("model_dirs", [ROOT / "unused"])
    settings.setdefault("max_batch_delay_ms", 2.0)
    app = create_app(ServingSettings(**settings), translator if translator is not None else EchoTranslator())
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_ready(client)
        yield client


@pytest.fixture
def serve() -> Callable[..., Any]:
    """``with serve(translator=None, **settings) as client``: the app, started and ready."""
    return serve_app


@pytest.fixture
def client() -> Iterator[TestClient]:
    with serve_app() as c:
        yield c


@pytest.fixture
def echo_translator() -> EchoTranslator:
    return EchoTranslator()
