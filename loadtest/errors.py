"""What goes wrong in a load run, and the log excerpt its message quotes."""

from __future__ import annotations

from pathlib import Path


class LoadTestError(Exception):
    """A run could not be carried out (server did not start, Locust failed): exit code 2."""


def log_tail(path: Path, lines: int = 5) -> str:
    """The last ``lines`` lines of a log file on one line (for error messages)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"
