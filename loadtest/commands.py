"""The ``mtgate`` commands of this package, registered in ``pyproject.toml`` (entry points ``mtgate.commands``) and
discovered by the dispatcher (``serving.commands.registry``). Nothing else is imported here."""

from __future__ import annotations

from serving.commands.registry import Command

COMMANDS = [
    Command("loadtest", "loadtest.cli", "run Locust against a server and gate on latency targets", "loadtest", rank=6),
    Command("validate", "loadtest.validate.command", "parity + quality + latency + cost -> PROMOTE or REJECT", "loadtest",
            rank=7),
    Command("sweep", "loadtest.sweep.command", "measure serving configurations; the cheapest that meets every target",
            "loadtest", rank=8),
]
