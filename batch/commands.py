"""The ``mtgate`` commands of this package, registered in ``pyproject.toml`` (entry points ``mtgate.commands``) and
discovered by the dispatcher (``serving.commands.registry``). ``batch-score`` is also a console script of its own."""

from __future__ import annotations

from serving.commands.registry import Command

COMMANDS = [
    Command("batch-score", "batch.cli", "translate and score a TFRecord, JSONL or text file", "batch", rank=5),
]
