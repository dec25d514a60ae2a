"""The shadow pair log (``--shadow-log LOG``): one JSON object per compared pair, appended as a whole line.

Each line goes to the file in one ``os.write`` on a descriptor opened with ``O_APPEND`` (no user-space buffer to
flush), so a process killed at any moment (SIGKILL) leaves only whole lines. Beyond ``max_bytes`` the file is rotated
as logrotate does (``PATH`` -> ``PATH.1`` -> ... -> ``PATH.N``, the oldest deleted): at most ``max_files + 1`` files,
each at most ``max_bytes`` (plus one line). Used from the shadow worker thread only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def text_hash(text: str, salt: bytes) -> str:
    """What ``--shadow-redact`` writes instead of a text: its HMAC-SHA256 keyed with ``salt``
    (``shadow_redact_salt``, or a random one per server). Unsalted, a hash of a short or common sentence is found by
    hashing guesses; salted, equal texts still hash alike within one server's log (or across the replicas given
    the same salt), so agreement can be counted without the texts."""
    return "hmac-sha256:" + hmac.new(salt, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


class PairLog:
    """An append-only JSONL file rotated by size."""

    def __init__(self, path: Path, max_bytes: int, max_files: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.max_files = max_files
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "replace")
        if self._size and self._size + len(line) > self.max_bytes:
            self._rotate()
        view = memoryview(line)
        while view:  # a regular file takes it in one write; loop only if the kernel ever says otherwise
            written = os.write(self._fd, view)
            view = view[written:]
        self._size += len(line)

    def _rotate(self) -> None:
        os.close(self._fd)
        oldest = self.path.with_name(f"{self.path.name}.{self.max_files}")
        oldest.unlink(missing_ok=True)
        for n in range(self.max_files - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                older.rename(self.path.with_name(f"{self.path.name}.{n + 1}"))
        self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        self._fd = self._open()
        self._size = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
