"""Fixtures for the HTTP layer: the real app (real batcher, middleware, error handlers) in front of a fake engine.

Tests of the real engine behind the server use tests/conftest.py's shared ``tiny_package``.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # `tests.fakes` when pytest runs without the repository root on sys.path
    sys.path.insert(0, str(ROOT))

from serving.server.http import create_app  # noqa: E402
from serving.server.metrics import ServingMetrics  # noqa: E402
from serving.server.model_runner import ModelRunner  # noqa: E402
from serving.server.settings import ServingSettings  # noqa: E402
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
    settings.setdefault("max_queue_delay_us", 2000)
    app = create_app(ServingSettings(**settings), translator if translator is not None else EchoTranslator())
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_ready(client)
        yield client


def loaded_runner(settings: ServingSettings, package_dir: Path) -> ModelRunner:
    """A ModelRunner of ``package_dir`` as the server makes it, started, loaded and stopped (its engine stays)."""
    runner = ModelRunner(settings, ServingMetrics(), package_dir=package_dir)

    async def main() -> None:
        runner.start()
        try:
            await runner.load()
        finally:
            await runner.stop()

    asyncio.run(main())
    return runner


@contextmanager
def live_server(translator: Any, **settings: Any) -> Iterator[str]:
    settings.setdefault("model_dirs", [ROOT / "unused"])
    with run_app(create_app(ServingSettings(**settings), translator)) as url:
        yield url


@contextmanager
def run_app(app: Any) -> Iterator[str]:
    """``app`` on a real uvicorn in a thread on a free loopback port, once ready: its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while True:
        try:
            if httpx.get(url + "/v2/health/ready").status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not become ready"
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def live() -> Callable[..., Any]:
    """``with live(translator, **settings) as url``: the app on a real uvicorn in a thread, ready."""
    return live_server


@pytest.fixture
def serve() -> Callable[..., Any]:
    """``with serve(translator=None, **settings) as client``: the app, started and ready."""
    return serve_app


@pytest.fixture
def client() -> Iterator[TestClient]:
    with serve_app() as c:
        yield c


@pytest.fixture(scope="module")
def shared_client() -> Iterator[TestClient]:
    """One app for a module's many stateless cases (parametrized bad-input tables)."""
    with serve_app() as c:
        yield c


@pytest.fixture
def echo_translator() -> EchoTranslator:
    return EchoTranslator()
