"""Fixtures of the batch-score tests: small tmpfs mounts for full-disk and read-only tests.

``mount_tmpfs`` mounts a tmpfs of a given size (optionally read-only); it skips the test, saying why, where the mount
is not allowed (not root, no CAP_SYS_ADMIN).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``mount_tmpfs(name, size_kb, read_only=False)`` -> a fresh tmpfs under ``tmp_path``; unmounted afterwards."""
    mounted: list[Path] = []

    def mount(name: str, size_kb: int, read_only: bool = False) -> Path:
        point = tmp_path / name
        point.mkdir()
        options = f"size={size_kb}k" + (",ro" if read_only else "")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): needs root")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
