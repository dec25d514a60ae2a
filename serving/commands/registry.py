"""Which commands ``mtgate`` has, and what each needs: the serving install's own, and those other packages register.

A command is a module with ``add_arguments(parser)`` and ``run(args)``. The serving install declares its own below
(:data:`SERVING_COMMANDS`); a package above ``serving`` (``converters``, ``batch``, ``loadtest``) declares its
commands in a small module of its own (``<package>/commands.py``: a ``COMMANDS`` list of :class:`Command`, nothing
else imported) and registers that list as an entry point of the group :data:`ENTRY_POINT_GROUP` in
``pyproject.toml``. The dispatcher (``serving.commands.main``) discovers them through the installed distribution's
metadata, so ``serving`` never names a package above it, not even as a string (``tests/test_import_contract.py``).

A command outside the plain install (which serves) needs its extra (:data:`EXTRAS`); without it, it answers with one
line naming the extra to install (:func:`missing_extra`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

ENTRY_POINT_GROUP = "mtgate.commands"


@dataclass(frozen=True)
class Command:
    """One ``mtgate`` subcommand.

    Attributes:
        name: what follows ``mtgate``.
        module: the module with ``add_arguments(parser)`` and ``run(args)``, imported only when the command runs.
        help: the one line ``mtgate --help`` shows.
        extra: the ``pyproject.toml`` extra it needs beyond the plain install (None: none).
        rank: its place in ``mtgate --help``'s list (the order a model goes through them).
    """

    name: str
    module: str
    help: str
    extra: str | None = None
    rank: int = 100


SERVING_COMMANDS: tuple[Command, ...] = (
    Command("translate", "serving.commands.translate", "translate arguments or stdin lines", rank=2),
    Command("score", "serving.commands.score", "score given translations: the model's log-likelihood of each, per "
            "token and in total", rank=3),
    Command("serve", "serving.commands.serve", "run the HTTP server", rank=4),
    Command("export-triton", "serving.commands.export_triton", "write a Triton model repository for a package",
            rank=9),
)

# extra (pyproject.toml [project.optional-dependencies]) -> the top-level modules its distributions provide
EXTRAS: dict[str, tuple[str, ...]] = {
    "convert": ("onnx", "nncf", "safetensors", "threadpoolctl", "yaml", "sacrebleu"),
    "batch": ("google_crc32c", "sacrebleu", "tritonclient", "geventhttpclient", "tensorboardX"),
    "ray": ("ray", "pyarrow"),
    "grpc": ("grpc", "tritonclient"),
    "shadow": ("sacrebleu",),
    "loadtest": ("locust", "tritonclient", "geventhttpclient", "yaml", "sacrebleu", "matplotlib", "tensorboardX"),
}


def registered_commands() -> list[Command]:
    """The commands other packages register (entry points of :data:`ENTRY_POINT_GROUP`), in no set order."""
    from importlib.metadata import entry_points  # some 20 ms: only when a command outside serving is asked for

    found: list[Command] = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            commands = entry.load()
        except ImportError:  # a package registered by the distribution but not in this install: not offered
            continue
        found.extend(command for command in commands if isinstance(command, Command))
    return found


def all_commands() -> list[Command]:
    """Every command, in ``mtgate --help``'s order: the serving install's and the registered ones."""
    return sorted([*SERVING_COMMANDS, *registered_commands()], key=lambda command: (command.rank, command.name))


def missing_extra(extra: str) -> str | None:
    """None when the modules of ``extra`` are installed, else one line that says what to install."""
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (f"needs the {extra} extra (not installed: {', '.join(missing)}): pip install 'mtgate[{extra}]' "
            f"(in a checkout: pip install -e '.[{extra}]')")
