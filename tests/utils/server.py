"""Waiting for a real ``mtgate serve`` process to become ready (the tests that start one on a loopback port)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable

import pytest


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
