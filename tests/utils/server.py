"""A real ``mtgate serve`` process on a loopback port, for the tests that need the whole server: ``start_server``
(port 0, the URL read from its log, ready before it returns) and ``wait_until_ready`` for the tests that start the
server their own way (a README command, an installed image, ``batch-score --server``'s target)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def wait_until_ready(url: str, process: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float,
                     describe: Callable[[], str] = lambda: "") -> float:
    """Poll ``GET {url}/v2/health/ready`` until it answers 200; return the seconds it took.

    Fails the test, with ``describe()`` (e.g. the server's log tail), if the process exits first or ``timeout``
    seconds pass.
    """
    started = time.monotonic()
    while True:
        if process.poll() is not None:
            pytest.fail(f"mtgate serve exited with {process.returncode}: {describe()}")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        if time.monotonic() - started > timeout:
            pytest.fail(f"mtgate serve not ready after {timeout:.0f} s: {describe()}")
        time.sleep(0.1)


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    url: str = ""
    log: list[str] = field(default_factory=list)
    batching: str = "request"

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")

    @property
    def grpc_address(self) -> str:
        """host:port of the gRPC server (started with ``--grpc-port``), from its start-up log line."""
        found = [line.rsplit("mtgate gRPC on ", 1)[1].strip() for line in self.log if "mtgate gRPC on " in line]
        assert found, "no gRPC server in the log:\n" + "".join(self.log)
        return found[0]

    def stop(self, timeout: float = 20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def start_server(package: Path | None, *flags: str, env: dict[str, str] | None = None,
                 timeout: float = 90) -> ServerProcess:
    """Start ``mtgate serve`` on port 0 (with ``-m package`` unless None) and wait until it reports ready."""
    model = ["-m", str(package)] if package is not None else []
    cmd = [sys.executable, "-m", "serving.commands.main", "serve", *model, "--port", "0", "--threads", "1", *flags]
    process = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    server = ServerProcess(process)
    found = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            server.log.append(line)
            if "mtgate serving on " in line and not found.is_set():
                server.url = line.rsplit("mtgate serving on ", 1)[1].strip()
                found.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found.wait(0.1):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise AssertionError("server did not start:\n" + "".join(server.log))
    try:
        wait_until_ready(server.url, process, max(1.0, deadline - time.monotonic()), lambda: "\n" + "".join(server.log))
    except BaseException:
        server.stop()
        raise
    return server
